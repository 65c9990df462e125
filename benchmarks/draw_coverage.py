"""Which prompts and domains a pilot's sampled and parameters passes draw, over many seeds.

For each pass: the domains the pilot's own seed draws, how often each domain (and the
unusual slice) is drawn across seeds, and a chi-square test of every prompt's draw count
within its stratum against equal rates (a draw that favoured the head of the file fails it).

    python benchmarks/draw_coverage.py [--pilot pilot.yaml] [--seeds 2000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_osprey.pilot.draw import draw_prompts  # noqa: E402
from pytest_osprey.pilot.loading import load_pilot  # noqa: E402
from pytest_osprey.pilot.selection import pass_draws, select_trace  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pilot", type=Path, default=ROOT / "pilot.yaml")
    ap.add_argument("--seeds", type=int, default=2000)
    args = ap.parse_args()
    os.chdir(args.pilot.parent)
    pilot = load_pilot(args.pilot.name)
    trace, _ = select_trace(pilot, args.pilot.name)
    prompts, unusual = trace.prompts, pilot.trace.unusual_slice
    t0 = time.perf_counter()
    for purpose, draw in pass_draws(pilot, prompts).items():
        budget = draw.budget
        print(f"{purpose}: {len(draw.prompts)} of {len(prompts)} prompts at seed {draw.seed}: "
              f"{', '.join(draw.ids)}; domains {', '.join(draw.domains)}")
        hits: Counter[str] = Counter()
        domains: Counter[str] = Counter()
        with_unusual = 0
        for seed in range(args.seeds):
            d = draw_prompts(prompts, budget, seed, purpose, unusual)
            hits.update(d.ids)
            domains.update(d.domains)
            with_unusual += any(p.slice == unusual for p in d.prompts)
        shares = ", ".join(f"{k} {v / args.seeds:.2f}" for k, v in sorted(domains.items()))
        print(f"  over {args.seeds} seeds, each domain drawn in: {shares}; the unusual slice "
              f"in {with_unusual / args.seeds:.3f} of draws")
        by_stratum: dict[tuple[str, str], list[int]] = {}
        for p in prompts:
            by_stratum.setdefault((p.slice, p.domain), []).append(hits[p.id])
        worst = min(float(stats.chisquare(np.array(c, dtype=float)).pvalue)
                    for c in by_stratum.values() if len(c) > 1 and sum(c))
        print(f"  prompts of a stratum drawn alike: smallest chi-square p over "
              f"{len(by_stratum)} strata {worst:.3f}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{time.perf_counter() - t0:.1f} s wall at load average {load:.1f}")


if __name__ == "__main__":
    main()
