"""Coverage of the crossover interval in simulated campaigns with noise shared in time.

Campaigns through the real replay planner under each noise model of ``testkit/speed_sim.py``
(levels x1 ... x16 interleaved within each pass), a true speedup falling with concurrency
through the threshold at a known ``c*``, each level judged by the speed gate's batched
statistics and the crossover estimated from them (``testkit/crossover_sim.py``). Printed, as
Markdown: per noise model the share of campaigns whose interval holds c*, its Monte-Carlo
s.e., the status shares and the median estimate.

    python benchmarks/crossover_coverage.py                  # ~2 min on 2 shared cores
    python benchmarks/crossover_coverage.py --sims 200 --prompts 21
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testkit.crossover_sim import CONFIDENCE, THRESHOLD, coverage, sweep_design
from testkit.speed_sim import BOOT_NOISE, noise_models


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=1000)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--top", type=int, default=16, help="highest level (x1, x2, ... x top)")
    ap.add_argument("--crossing", type=float, default=6.0)
    ap.add_argument("--slope", type=float, default=-0.17, help="d log S / d log c")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    design = sweep_design(args.top, args.prompts, args.passes)
    levels = design.levels
    t0 = time.monotonic()
    print(f"{args.sims} campaigns per noise model: {args.prompts} prompts, levels "
          f"x1..x{levels[-1][1]} "
          f"interleaved, {args.passes} passes, blocks of the level's concurrency; true "
          f"speedup {THRESHOLD}x at x{args.crossing:g}, slope {args.slope} per unit log c; "
          f"nominal {CONFIDENCE:.0%}\n")
    print("| noise | coverage | s.e. | crosses | pays everywhere | pays nowhere | "
          "not estimable | median estimate |")
    print("|---|---|---|---|---|---|---|---|")
    names = [*noise_models(), BOOT_NOISE.name]
    for i, name in enumerate(names):
        d = design if name != BOOT_NOISE.name else replace(design, boots=2)
        r = coverage(d, name, args.crossing, args.slope, args.sims, args.seed + i)
        se = math.sqrt(CONFIDENCE * (1 - CONFIDENCE) / args.sims)
        st = r.statuses
        print(f"| {name}{' (2 boots)' if d.boots == 2 else ''} | {r.coverage:.3f} | "
              f"{se:.3f} | {st['crosses']:.2f} | {st['pays_everywhere']:.2f} | "
              f"{st['pays_nowhere']:.2f} | {st['not_estimable']:.2f} | {r.median:.1f} |")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    print(f"\n{time.monotonic() - t0:.0f} s; load average {load:.2f}")


if __name__ == "__main__":
    main()
