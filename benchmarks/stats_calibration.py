"""Calibration of the speed gate: fixed vs group-sequential designs, by simulation.

For each true speedup and prompt count, simulates pilots from ``LatencyModel`` (heavy-tailed
latencies, see its docstring) and prints, for the fixed design (all blocks, then
``paired_speedup``) and the sequential design (O'Brien-Fleming looks after every block,
without and with the futility rule): the keep rate (false-keep rate when the true speedup
equals the threshold, power otherwise) and the mean number of requests used. A second table
gives the prompts needed for 80% / 90% power (``required_pairs``).

    python benchmarks/stats_calibration.py            # ~1 minute on 2 cores
    python benchmarks/stats_calibration.py --sims 4000 --prompts 10 20 40 80
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np

from pytest_osprey.judgement.sequential import (
    LatencyModel,
    SequentialPlan,
    as_blocks,
    obrien_fleming_plan,
    sequential_speedup,
)
from pytest_osprey.judgement.stats import FloatArray, paired_speedup, required_pairs


@dataclass(frozen=True)
class Cell:
    keep: float
    requests: float


def _mapping(latencies: FloatArray) -> dict[str, list[float]]:
    return {f"p{i}": row.tolist() for i, row in enumerate(latencies)}


def fixed_design(ref: FloatArray, cand: FloatArray, threshold: float) -> Cell:
    keeps = sum(
        paired_speedup(_mapping(r), _mapping(c), threshold=threshold, seed=i).outcome == "pass"
        for i, (r, c) in enumerate(zip(ref, cand, strict=True))
    )
    return Cell(keeps / len(ref), 2.0 * ref[0].size)


def sequential_design(
    ref: FloatArray,
    cand: FloatArray,
    threshold: float,
    plan: SequentialPlan,
    reps_per_block: int,
    futility: float | None,
) -> Cell:
    keeps, blocks_used = 0, 0
    for r, c in zip(ref, cand, strict=True):
        ref_b, cand_b = as_blocks(r, reps_per_block), as_blocks(c, reps_per_block)
        for look in range(1, plan.looks + 1):
            dec = sequential_speedup(ref_b[:look], cand_b[:look], threshold, plan, futility)
            if dec.decision != "continue":
                break
        keeps += dec.decision == "keep"
        blocks_used += look
    per_block = 2.0 * ref.shape[1] * reps_per_block
    return Cell(keeps / len(ref), per_block * blocks_used / len(ref))


def calibration_table(args: argparse.Namespace, model: LatencyModel) -> list[str]:
    plan = obrien_fleming_plan(args.looks, alpha=(1 - args.confidence) / 2)
    futility = args.futility
    lines = [
        f"| speedup | prompts | fixed keep | fixed req | seq keep | seq req | "
        f"seq+fut({futility:g}) keep | seq+fut req |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rng = np.random.default_rng(args.seed)
    for speedup in args.speedups:
        for n_prompts in args.prompts:
            n_reps = args.looks * args.reps_per_block
            ref, cand = model.sample(rng, args.sims, n_prompts, n_reps, speedup)
            fixed = fixed_design(ref, cand, args.threshold)
            seq = sequential_design(ref, cand, args.threshold, plan, args.reps_per_block, None)
            fut = sequential_design(ref, cand, args.threshold, plan, args.reps_per_block, futility)
            lines.append(
                f"| {speedup:.2f} | {n_prompts} | {fixed.keep:.3f} | {fixed.requests:.0f} | "
                f"{seq.keep:.3f} | {seq.requests:.0f} | {fut.keep:.3f} | {fut.requests:.0f} |"
            )
    return lines


def sample_size_table(args: argparse.Namespace, model: LatencyModel) -> list[str]:
    reps = args.looks * args.reps_per_block
    sd = model.log_ratio_sd(reps)
    alpha = (1 - args.confidence) / 2
    lines = [
        f"SD of a prompt's pooled log-ratio with {reps} reps: {sd:.3f}",
        "",
        "| true speedup | prompts for 80% power | prompts for 90% power |",
        "|---:|---:|---:|",
    ]
    for effect in args.effects:
        n80 = required_pairs(sd, effect, args.threshold, alpha=alpha, power=0.8)
        n90 = required_pairs(sd, effect, args.threshold, alpha=alpha, power=0.9)
        lines.append(f"| {effect:.2f} | {n80} | {n90} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=400, help="Pilots per cell")
    parser.add_argument("--speedups", type=float, nargs="+", default=[1.0, 1.1, 1.2, 1.3])
    parser.add_argument("--prompts", type=int, nargs="+", default=[10, 20, 40])
    parser.add_argument("--looks", type=int, default=4, help="Blocks (= looks) per campaign")
    parser.add_argument("--reps-per-block", type=int, default=1)
    parser.add_argument("--threshold", type=float, default=1.0)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--futility", type=float, default=1.3, help="Futility speedup F")
    parser.add_argument("--effects", type=float, nargs="+", default=[1.05, 1.1, 1.2, 1.3])
    parser.add_argument("--seed", type=int, default=20240501)
    args = parser.parse_args()

    model = LatencyModel()
    start = time.perf_counter()
    alpha = (1 - args.confidence) / 2
    se = math.sqrt(alpha * (1 - alpha) / args.sims)
    print(f"Latency model: {model}")
    print(
        f"Threshold {args.threshold}, one-sided alpha {alpha:g} (MC s.e. at alpha: {se:.4f}), "
        f"{args.looks} blocks x {args.reps_per_block} rep(s) per prompt, {args.sims} pilots/cell; "
        "'req' = mean requests (both conditions)"
    )
    print()
    print("\n".join(calibration_table(args, model)))
    print()
    print("\n".join(sample_size_table(args, model)))
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
