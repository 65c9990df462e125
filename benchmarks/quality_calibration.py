"""Calibration table of the exact per-position distribution test (docs/quality-calibration.md).

Simulated campaigns (pytest_osprey/judgement/quality/exact_power.py: a Zipf-like target over
128 tokens, tokens within a sample dependent on the token before, position classes as a
speculating engine makes them) judged by the real test (judgement/quality/exact.py):

* false alarms on honest samples at alpha 0.01 and 0.05, for several served samplings,
  both target families and top-K widths;
* power by budget (prompts x samples x tokens, top-20 logprobs) against each planted fault;
* the temperature shift each budget detects with 80% power (the preflight figure).

    python benchmarks/quality_calibration.py --replicates 400 --power-replicates 200

Rates carry their binomial standard error; timings are wall and CPU seconds beside the load
average (the machine is shared).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_osprey.judgement.quality.exact import Served  # noqa: E402
from pytest_osprey.judgement.quality.exact_power import (  # noqa: E402
    FAULTS,
    VOCAB,
    Budget,
    detectable_temperature_shift,
    power_against,
)

HONEST = [
    ("T 0.8", Served(0.8), "tiny", 20),
    ("T 0.8", Served(0.8), "chat", 20),
    ("T 0.8, full vocabulary", Served(0.8), "tiny", VOCAB),
    ("T 0.8, top-p 0.9", Served(0.8, top_p=0.9), "tiny", 20),
    ("T 0.8, top-k 10, min-p 0.05", Served(0.8, top_k=10, min_p=0.05), "tiny", 20),
    ("T 0.8, penalties 0.5/0.5", Served(0.8, frequency_penalty=0.5, presence_penalty=0.5),
     "tiny", 20),
    ("T 1.3, top-p 0.9", Served(1.3, top_p=0.9), "chat", 10),
]


def rate(p: float, n: int) -> str:
    return f"{p:.3f} ± {math.sqrt(max(p * (1 - p), 1 / n) / n):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=400, help="per false-alarm cell")
    parser.add_argument("--power-replicates", type=int, default=200, help="per power cell")
    parser.add_argument("--budgets", default="4x8x24,8x8x24,16x8x24")
    parser.add_argument("--family", default="tiny", choices=("tiny", "chat"))
    args = parser.parse_args()
    n = args.replicates
    budgets = [Budget(*(int(x) for x in b.split("x"))) for b in args.budgets.split(",")]
    wall, cpu = time.perf_counter(), time.process_time()
    print(f"# exact test calibration: {n} replicates per false-alarm cell, "
          f"{args.power_replicates} per power cell; load average {os.getloadavg()[0]:.1f}")
    print("\n## False alarms on honest samples (budget 4x8x24)\n")
    print("| served | family | top-K | alpha 0.01 | alpha 0.05 |")
    print("|---|---|---|---|---|")
    for name, served, family, k in HONEST:
        budget = Budget(4, 8, 24, k)
        cells = [rate(power_against(None, budget, served, a, family=family, replicates=n,
                                    seed=101), n) for a in (0.01, 0.05)]
        print(f"| {name} | {family} | {k} | {cells[0]} | {cells[1]} |")
    print(f"\n## Power at alpha 0.01 by budget (family {args.family}, served T 0.8, "
          "top-20 logprobs)\n")
    print("| fault | " + " | ".join(b.words() for b in budgets) + " |")
    print("|---|" + "---|" * len(budgets))
    rows = [(f, 0.1) for f in FAULTS] + [("hotter", 0.2), ("colder", 0.2)]
    for fault, shift in rows:
        label = f"{fault} {shift:g}" if fault in ("hotter", "colder") else fault
        m = args.power_replicates
        cells = [rate(power_against(fault, b, Served(0.8), 0.01, family=args.family,
                                    shift=shift, replicates=m, seed=202), m) for b in budgets]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\n## Temperature shift detected with 80% power (analytic lower bound, alpha 0.01)\n")
    print("| budget | tiny | chat |")
    print("|---|---|---|")
    for b in budgets:
        cells = [f"{detectable_temperature_shift(b, Served(0.8), family=f):g}"
                 for f in ("tiny", "chat")]
        print(f"| {b.words()} | " + " | ".join(cells) + " |")
    print(f"\nwall {time.perf_counter() - wall:.0f} s, CPU {time.process_time() - cpu:.0f} s, "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
