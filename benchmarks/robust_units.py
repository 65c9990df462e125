"""Whether a robust location gains power where a few long time units carry the speed test's
variance: the 50-prompt design at x32 (2 blocks a pass, 4 passes: 8 time units), under the
low-load noise families (``testkit/speed_sim.py``, ``low_load_models``) and the reference
noise, by simulated campaigns through the real replay planner.

Each campaign's paired log-ratios (reference over candidate, per prompt and time unit) are
reduced to one mean per time unit; the tests, one-sided at alpha 0.025 against a threshold
of 1.0:

* ``t``: the unit means' one-sample t (df = units - 1), the gate's unit part;
* ``flip-mean``, ``flip-huber``, ``flip-trim``: the exact sign-flip test (all 2^8 signs) of
  the mean, of a Huber M-estimate (c 1.345, MAD scale) and of the mean without the largest
  and the smallest unit;
* ``wilcoxon``: the signed-rank test of the unit means;
* ``winsor2``, ``winsor3``: the t of unit means after each cell's residual from a two-way
  (prompt, unit) fit is clipped at 2 or 3 robust SDs (a stall inside a stretch as an
  outlying cell).

Printed: false KEEP at a true 1.0 / power at a true 1.3x per test and family.

    python benchmarks/robust_units.py                 # about 1 minute on 2 shared cores
    python benchmarks/robust_units.py --sims 500 --power-sims 200
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testkit

from testkit.speed_sim import REFERENCE_NOISE, Campaigns, Design, low_load_models, simulate

Array = npt.NDArray[np.float64]
ALPHA = 0.025
DESIGN = Design(prompts=50, levels=(("high", 32),), primary="high", passes=4)


def cells(c: Campaigns) -> tuple[Array, npt.NDArray[np.int64]]:
    """Paired log-ratios (campaigns, passes, prompts) and each cell's time unit."""
    diff = np.log(c.reference["high"]) - np.log(c.candidate["high"])
    return diff[:, 0], c.units["high"][:, 0]


def unit_means(x: Array, unit: npt.NDArray[np.int64]) -> Array:
    out = np.zeros((x.shape[0], int(unit.max()) + 1))
    for j in range(out.shape[1]):
        mask = unit == j
        out[:, j] = (x * mask).sum((1, 2)) / mask.sum((1, 2))
    return out


def winsorised(diff: Array, unit: npt.NDArray[np.int64], k: float) -> Array:
    """``diff`` with each cell's residual from the two-way (prompt, unit) fit clipped at
    ``k`` robust SDs."""
    res = diff - diff.mean(1, keepdims=True)
    b = unit_means(res, unit)
    e = res - np.take_along_axis(b, unit.reshape(unit.shape[0], -1), 1).reshape(unit.shape)
    s = 1.4826 * np.median(np.abs(e).reshape(e.shape[0], -1), 1)[:, None, None]
    return np.asarray(diff - e + np.clip(e, -k * s, k * s))


def huber(x: Array, c: float = 1.345, steps: int = 30) -> Array:
    mu = np.median(x, axis=-1, keepdims=True)
    scale = 1.4826 * np.median(np.abs(x - mu), axis=-1, keepdims=True) + 1e-12
    for _ in range(steps):
        r = (x - mu) / scale
        w = np.where(np.abs(r) <= c, 1.0, c / np.maximum(np.abs(r), 1e-12))
        mu = (w * x).sum(-1, keepdims=True) / w.sum(-1, keepdims=True)
    return np.asarray(mu[..., 0])


def trimmed(x: Array) -> Array:
    return np.asarray(np.sort(x, axis=-1)[..., 1:-1].mean(-1))


def flip_p(x: Array, stat: Callable[[Array], Array]) -> Array:
    signs = np.array(list(itertools.product([1.0, -1.0], repeat=x.shape[1])))
    observed = stat(x)
    return np.array([(stat(signs * row) >= obs - 1e-12).mean()
                     for row, obs in zip(x, observed, strict=True)])


def t_p(x: Array) -> Array:
    n = x.shape[1]
    t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n))
    return np.asarray(stats.t.sf(t, n - 1))


def p_values(c: Campaigns) -> dict[str, Array]:
    diff, unit = cells(c)
    means = unit_means(diff, unit)
    return {"t": t_p(means), "flip-mean": flip_p(means, lambda y: y.mean(-1)),
            "flip-huber": flip_p(means, huber), "flip-trim": flip_p(means, trimmed),
            "wilcoxon": stats.wilcoxon(means, axis=1, alternative="greater").pvalue,
            "winsor2": t_p(unit_means(winsorised(diff, unit, 2.0), unit)),
            "winsor3": t_p(unit_means(winsorised(diff, unit, 3.0), unit))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=2000, help="campaigns per false-KEEP cell")
    ap.add_argument("--power-sims", type=int, default=600, help="campaigns per power cell")
    args = ap.parse_args()
    start = time.perf_counter()
    models = {**low_load_models(), "reference": REFERENCE_NOISE}
    names = list(p_values(simulate(DESIGN, REFERENCE_NOISE, 1.0, 4, seed=0)))
    print(f"50 prompts, x32, 4 passes (8 time units): false KEEP at 1.0 ({args.sims} "
          f"campaigns) / power at 1.3x ({args.power_sims})\n")
    print("| noise | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for k, (name, noise) in enumerate(models.items()):
        null = p_values(simulate(DESIGN, noise, 1.0, args.sims, seed=100 + k))
        alt = p_values(simulate(DESIGN, noise, 1.3, args.power_sims, seed=200 + k))
        print(f"| {name} | " + " | ".join(
            f"{np.mean(null[t] <= ALPHA):.4f} / {np.mean(alt[t] <= ALPHA):.3f}"
            for t in names) + " |", flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s wall, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
