"""Power and false-alarm rate of the sampled-distribution check on real samples of a target.

A pool of real sampled continuations (benchmarks/sample_pool.py: the pilot's own sampled
prompts, rendered as the engines render them, at temperatures 0.8 and 1.0) is drawn from
without replacement: a self-vs-self pilot takes two disjoint sets of samples at 0.8 (an exact
null: the pool's empirical distribution on both sides), a 1.0-vs-0.8 pilot one set at each.
Each pilot has the budget of the pilot file (``sampling.sampled``: prompts, samples per
prompt, max_new_tokens), unless given on the command line; the check runs as the gate runs
it (alpha ``limits.quality.distribution_alpha``).

    python benchmarks/sample_pool.py --out /tmp/pool.npz
    python benchmarks/distribution_power.py --pool /tmp/pool.npz --pilots 1000

Prints one row per budget: power against temperature 1.0 -> 0.8, the false-alarm rate, each
with its exact 95% (Clopper-Pearson) interval.

``--against collapsed:K`` replaces the 1.0 side by a collapsed engine: each prompt's candidate
samples are drawn (with replacement) from K of the pool's sequences at the reference
temperature, disjoint from the reference's: output that lost its spread, as an engine that
verifies drafts greedily at temperature > 0 gives (1-3 distinct outputs in 8 where the
target gives 8). The pool then needs only the reference temperature.

    python benchmarks/sample_pool.py --out /tmp/pool.npz --temperatures 0.8 --samples 32
    python benchmarks/distribution_power.py --pool /tmp/pool.npz --against collapsed:2 \
        --budgets 4x8x24,8x8x24
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_osprey.judgement.quality.distribution import distribution_check  # noqa: E402
from pytest_osprey.pilot.loading import load_pilot  # noqa: E402

PAD = -2


def _rows(block: np.ndarray, tokens: int) -> list[list[int]]:
    out = []
    for row in block[:, :tokens].tolist():
        out.append(row[: row.index(PAD)] if PAD in row else row)
    return out


def draw(pool: np.ndarray, t_ref: int, t_cand: int, prompts: int, samples: int, tokens: int,
         rng: np.random.Generator) -> tuple[dict[str, list[list[int]]], ...]:
    """One pilot: disjoint samples per prompt (same temperature) or one set at each."""
    ref: dict[str, list[list[int]]] = {}
    cand: dict[str, list[list[int]]] = {}
    for p in range(prompts):
        pick = rng.permutation(pool.shape[2])
        ref[f"p{p}"] = _rows(pool[t_ref, p, pick[:samples]], tokens)
        cand[f"p{p}"] = _rows(pool[t_cand, p, pick[samples: 2 * samples]], tokens)
    return ref, cand


def collapsed(pool: np.ndarray, t_ref: int, prompts: int, samples: int, tokens: int,
              distinct: int, rng: np.random.Generator) -> tuple[dict[str, list[list[int]]], ...]:
    """One pilot against a collapsed engine: ``distinct`` sequences per prompt, resampled."""
    ref: dict[str, list[list[int]]] = {}
    cand: dict[str, list[list[int]]] = {}
    for p in range(prompts):
        pick = rng.permutation(pool.shape[2])
        ref[f"p{p}"] = _rows(pool[t_ref, p, pick[:samples]], tokens)
        few = _rows(pool[t_ref, p, pick[samples: samples + distinct]], tokens)
        cand[f"p{p}"] = [few[i] for i in rng.integers(0, distinct, samples)]
    return ref, cand


def interval(hits: int, n: int) -> str:
    ci = stats.binomtest(hits, n).proportion_ci(0.95, method="exact")
    return f"{hits / n:.3f} [{ci.low:.3f}, {ci.high:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", type=Path, required=True)
    parser.add_argument("--pilot", type=Path, default=ROOT / "pilot.yaml")
    parser.add_argument("--pilots", type=int, default=1000)
    parser.add_argument("--budgets", default="",
                        help="PxSxT,... (prompts x samples per side x tokens); default: the "
                        "pilot file's")
    parser.add_argument("--against", default="1.0",
                        help="the lossy side: 1.0 (temperature) or collapsed:K (K distinct "
                        "outputs per prompt)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data = np.load(args.pool)
    pool, meta = data["pool"], json.loads(str(data["meta"]))
    temps = [float(t) for t in meta["temperatures"]]
    pilot = load_pilot(args.pilot)
    sampled = pilot.sampling.sampled
    alpha = pilot.limits.quality.distribution_alpha
    t_ref = temps.index(sampled.temperature)
    distinct = int(args.against.split(":")[1]) if args.against.startswith("collapsed:") else 0
    t_cand = t_ref if distinct else temps.index(float(args.against))
    lossy = f"collapsed to {distinct} outputs" if distinct else f"T {temps[t_cand]} vs 0.8"
    budgets = [tuple(int(v) for v in b.split("x")) for b in args.budgets.split(",") if b] or [
        (sampled.prompts or pool.shape[1], sampled.samples_per_prompt,
         sampled.max_new_tokens or pool.shape[3])]
    print(f"pool: {meta['model']}, prompts {', '.join(meta['prompts'])}, "
          f"{pool.shape[2]} samples x {pool.shape[3]} tokens per prompt and temperature")
    print(f"alpha {alpha:g}, {args.pilots} pilots per cell, reference T={temps[t_ref]}\n")
    print(f"| prompts x samples x tokens | power, {lossy} | false alarms (0.8 vs 0.8) |")
    print("|---|---|---|")
    rng = np.random.default_rng(args.seed)
    for prompts, samples, tokens in budgets:
        if prompts > pool.shape[1] or 2 * samples > pool.shape[2] or tokens > pool.shape[3]:
            print(f"| {prompts} x {samples} x {tokens} | pool too small | |")
            continue
        t0 = time.perf_counter()
        hits = alarms = 0
        for i in range(args.pilots):
            ref, cand = (collapsed(pool, t_ref, prompts, samples, tokens, distinct, rng)
                         if distinct else draw(pool, t_ref, t_cand, prompts, samples, tokens,
                                               rng))
            hits += distribution_check(ref, cand, alpha=alpha, seed=i).outcome == "fail"
            ref, cand = draw(pool, t_ref, t_ref, prompts, samples, tokens, rng)
            alarms += distribution_check(ref, cand, alpha=alpha, seed=i).outcome == "fail"
        print(f"| {prompts} x {samples} x {tokens} | {interval(hits, args.pilots)} | "
              f"{interval(alarms, args.pilots)} |  ({time.perf_counter() - t0:.0f} s)",
              flush=True)


if __name__ == "__main__":
    main()
