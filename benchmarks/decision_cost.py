"""The cost of a decision at users' scale: GPU-hours per plan and true effect for the
Osprey-against-EAGLE-3 example (examples/pilot-osprey-vs-eagle3.yaml: 50 prompts, x1/x8/x32,
sequential order on one GPU, 3 conditions) with 256-512-token outputs, at the serving twin's
speeds (Llama-3.1-8B on one H100), with the primary-load decision's power and false KEEP from
simulated campaigns (testkit/decision_cost.py says how).

    PYTHONPATH=$PWD python benchmarks/decision_cost.py [--sims 1000] [--null-sims 4000]

Prints one row per plan and effect (effect: the true speedup over the gate's threshold; 1.0
is at the threshold, where every KEEP is a false KEEP), the per-pass seconds the twin gives
each condition and level, and the load average beside the wall time."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testkit

from testkit.decision_cost import EFFECTS, PLANS, Example, evaluate, pass_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sims", type=int, default=1000, help="campaigns per effect > 1")
    parser.add_argument("--null-sims", type=int, default=4000, help="campaigns at effect 1.0")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    t0 = time.perf_counter()
    example = Example()
    print("one pass (s), 50 prompts, 256-512 output tokens:")
    for name in ("plain", "eagle3-like", "osprey-like"):
        cells = ", ".join(f"x{c} {pass_s(name, c, example):.1f}" for _, c in example.levels)
        print(f"  {name}: {cells}")
    print()
    print("| plan | effect | GPU-hours (expected) | GPU-hours (worst) | KEEP | DROP |")
    print("|---|---|---|---|---|---|")
    for plan in PLANS:
        for effect in EFFECTS:
            sims = args.null_sims if effect == 1.0 else args.sims
            row = evaluate(plan, effect, sims, seed=args.seed + int(effect * 100), example=example)
            label = "false KEEP" if effect == 1.0 else "power"
            print(f"| {plan.name} | {effect:.1f} | {row.gpu_hours:.2f} | "
                  f"{row.worst_gpu_hours:.2f} | {row.keep:.3f} ({label}) | {row.drop:.3f} |",
                  flush=True)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n{time.perf_counter() - t0:.0f} s wall, load average {load}")


if __name__ == "__main__":
    main()
