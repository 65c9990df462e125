"""Calibration of the speed gate on sharded pilots, by simulated campaigns.

N machines each replay a disjoint share of one seeded plan's passes (pass p on machine
p mod N, every condition on every machine: ``shards/plan.py``); the merged records are
judged as one campaign. Each machine adds an offset to every condition alike (a slower or
faster box) and an interaction with the drafter (its gain differs there), on top of the
time-correlated noise of ``testkit/speed_sim.py``. The verdict names the machines that ran:
the planted speedup is their mean (interactions centred over them).

Printed, as Markdown (docs/sharding.md holds a run):

1. false KEEP at a true speedup equal to the threshold (1.0) at 1, 2, 4 and 8 shards, fixed
   design per_prompt / total_time, the drift veto on, with '!' above alpha + 2 s.e.;
2. power (KEEP rate) at a true 1.08x (``POWER_AT``) against 1.0 at N shards of ``passes``
   passes each, beside one machine running all N x ``passes`` passes (the same data on one
   machine).

    python benchmarks/shard_calibration.py                 # ~10 min on 2 shared cores
    python benchmarks/shard_calibration.py --sims 400      # a quick look
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testkit

from testkit.speed_sim import KEEP, REFERENCE_NOISE, Design, Noise, fixed_outcomes, simulate

ALPHA = 0.025
SHARDS = (1, 2, 4, 8)
PROMPTS, CONCURRENCY, PASSES_PER_SHARD, POWER_AT = 50, 4, 2, 1.08


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / n)


def design(shards: int, passes: int) -> Design:
    return Design(prompts=PROMPTS, levels=((f"x{CONCURRENCY}", CONCURRENCY),),
                  primary=f"x{CONCURRENCY}", passes=passes, shards=shards)


def noise_rows() -> list[Noise]:
    ref = REFERENCE_NOISE
    return [
        replace(ref, name="reference, machines alike"),
        replace(ref, name="offsets 10%", machine_sd=0.10),
        replace(ref, name="offsets 10% + interaction 5%", machine_sd=0.10,
                machine_interaction_sd=0.05),
        replace(ref, name="offsets 30% + interaction 10%", machine_sd=0.30,
                machine_interaction_sd=0.10),
    ]


def keep_rates(noise: Noise, d: Design, speedup: float, sims: int,
               seed: int) -> tuple[float, float]:
    camp = simulate(d, noise, speedup, sims, seed, pool_size=64)
    return (float(np.mean(fixed_outcomes(camp, 1.0) == KEEP)),
            float(np.mean(fixed_outcomes(camp, 1.0, "total_time") == KEEP)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--power-sims", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=20261202)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print(f"Generated with `python benchmarks/shard_calibration.py --sims {args.sims} "
          f"--power-sims {args.power_sims}`; start: {load()}\n")
    limit = ALPHA + 2 * se(ALPHA, args.sims)
    head = " | ".join(f"{n} shard{'s' if n > 1 else ''}" for n in SHARDS)
    print(f"False KEEP at a true speedup = threshold = 1.0 ({PROMPTS} prompts at x{CONCURRENCY}, "
          f"{PASSES_PER_SHARD} passes per shard; fixed per_prompt / total_time, drift veto on), "
          f"{args.sims} campaigns per cell, alpha {ALPHA}; '!' marks a cell above alpha + 2 "
          f"s.e. = {limit:.4f}\n")
    print(f"| noise | {head} |\n|---|" + "---|" * len(SHARDS))
    for i, noise in enumerate(noise_rows()):
        cells = []
        for j, n in enumerate(SHARDS):
            rates = keep_rates(noise, design(n, PASSES_PER_SHARD * n), 1.0, args.sims,
                               args.seed + 100 * i + j)
            cells.append(" / ".join(f"{r:.4f}" + ("!" if r > limit else "") for r in rates))
        print(f"| {noise.name} | " + " | ".join(cells) + " |")
    print(f"\nPower: KEEP rate (fixed per_prompt) at a true {POWER_AT}x against 1.0: N shards of "
          f"{PASSES_PER_SHARD} passes each against one machine running all {PASSES_PER_SHARD}N "
          f"passes, {args.power_sims} campaigns per cell, MC s.e. at 0.5 "
          f"{se(0.5, args.power_sims):.3f}\n")
    print("| noise | N | N shards | one machine, N x the data |\n|---|---:|---:|---:|")
    for i, noise in enumerate(noise_rows()):
        for j, n in enumerate(SHARDS[1:]):
            seed = args.seed + 5000 + 100 * i + j
            sharded = keep_rates(noise, design(n, PASSES_PER_SHARD * n), POWER_AT,
                                 args.power_sims, seed)[0]
            alone = keep_rates(noise, design(1, PASSES_PER_SHARD * n), POWER_AT,
                               args.power_sims, seed)[0]
            print(f"| {noise.name} | {n} | {sharded:.3f} | {alone:.3f} |")
    print(f"\n({time.perf_counter() - t0:.0f} s; end: {load()})")


if __name__ == "__main__":
    main()
