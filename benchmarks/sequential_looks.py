"""Where the group-sequential speed gate stops, look by look, against the fixed test.

For one noise model and concurrency (50 prompts, 4 passes, looks after each pass, as in
``benchmarks/speed_concurrency.py``), simulated campaigns are judged look by look as
``testkit.speed_sim.sequential_outcomes`` judges them, and every stop is classified:
keep, drop, inconclusive for futility (and how many of those the fixed test on all four
passes would have kept), a keep or drop withheld by the drift rule (the campaign
continues), and
inconclusive at the last look. The power a sequential design loses against the fixed test
is the sum of the futility stops and vetoes that the fixed test keeps, less the keeps it
makes that the fixed test does not.

    python benchmarks/sequential_looks.py --noise mixed --level 32 --speedup 1.3
    python benchmarks/sequential_looks.py --noise mixed --level 32 --speedup 1.0 --sims 4000
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testkit

from pytest_osprey.judgement.speed.sequential import decide, sequential_plan
from testkit.speed_sim import (
    INCONCLUSIVE,
    KEEP,
    Design,
    drift_withheld,
    fixed_outcomes,
    looks_of,
    noise_models,
    simulate,
    z_scores,
)

ALPHA = 0.025
PROMPTS, PASSES = 50, 4


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def breakdown(noise: str, level: int, speedup: float, sims: int, seed: int) -> list[str]:
    from scipy import stats

    models = noise_models()
    if noise not in models:
        raise SystemExit(f"--noise: unknown model {noise!r} (one of {', '.join(models)})")
    design = Design(prompts=PROMPTS, levels=((f"x{level}", level),), primary=f"x{level}",
                    passes=PASSES)
    camp = simulate(design, models[noise], speedup, sims, seed, pool_size=64)
    fixed_keep = fixed_outcomes(camp, 1.0) == KEEP
    looks = looks_of(design)
    plan = sequential_plan(looks, ALPHA)
    crit = float(stats.norm.isf(ALPHA))
    code = np.full(sims, -1, dtype=np.int64)
    lines = [f"{noise}, x{level}, true {speedup}x against 1.0, {sims} campaigns: share of all "
             f"campaigns (fixed test KEEP {np.mean(fixed_keep):.3f})", "",
             "| look | median df | live | keep | drop | futility stop (fixed keeps) "
             "| drift veto (fixed keeps) | inconclusive at the end |",
             "|---:|---:|---:|---:|---:|---|---|---:|"]
    for look in range(1, looks + 1):
        (z,), df = z_scores(camp, design.primary, "per_prompt", [0.0], look)
        raw = decide(z, plan, look, df)
        # The gate's rule: with an unstable environment a keep or drop must also hold on the
        # drift-adjusted speedup (without each pass that changed the comparison).
        vetoed = drift_withheld(camp, raw, 1.0, "per_prompt", crit, look)
        now = raw.copy()
        now[vetoed] = INCONCLUSIVE if look == looks else -1
        live = code == -1
        futile = live & (raw == INCONCLUSIVE) & (look < looks)
        veto = live & vetoed
        lines.append(
            f"| {look} | {np.median(df[live]) if live.any() else math.nan:.0f} | "
            f"{live.mean():.3f} | {np.mean(live & (now == KEEP)):.3f} | "
            f"{np.mean(live & (now == 0)):.3f} | {futile.mean():.3f} "
            f"({np.mean(futile & fixed_keep):.3f}) | {veto.mean():.3f} "
            f"({np.mean(veto & fixed_keep):.3f}) | "
            f"{np.mean(live & (now == INCONCLUSIVE) & (look == looks)):.3f} |")
        fresh = live & (now != -1)
        code[fresh] = now[fresh]
    seq_keep = code == KEEP
    lines += ["", f"sequential KEEP {np.mean(seq_keep):.3f}; kept by the fixed test only "
              f"{np.mean(fixed_keep & ~seq_keep):.3f}, by the sequential design only "
              f"{np.mean(seq_keep & ~fixed_keep):.3f}"]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--noise", default="mixed")
    ap.add_argument("--level", type=int, default=32)
    ap.add_argument("--speedup", type=float, default=1.3)
    ap.add_argument("--sims", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=20261251)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print("\n".join(breakdown(args.noise, args.level, args.speedup, args.sims, args.seed)))
    print(f"\n({time.perf_counter() - t0:.0f} s; {load()})")


if __name__ == "__main__":
    main()
