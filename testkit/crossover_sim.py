"""Crossovers of simulated campaigns with a known crossing, for the tests and
``benchmarks/crossover_coverage.py``.

Campaigns are drawn through the real replay planner (:mod:`testkit.speed_sim`: blocks,
stretches, counterbalanced order, boots; closed-loop levels interleaved within each pass, so
drift, boot offsets and the prompts are common to the levels) at a true speedup that falls
with concurrency, ``S(c) = threshold * (c / c*)^slope``. Each level is judged by the speed
gate's own batched statistics (per-prompt log speedup, cluster-robust variance and df, time
share); the crossover is estimated from those per-level results as the reports do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from pytest_osprey.judgement.speed.crossover import LevelSpeedup, crossover, shared_share
from pytest_osprey.judgement.speed.speedup import speed_batch
from testkit.speed_sim import BOOT_NOISE, Design, noise_models, simulate

THRESHOLD = 1.3
CONFIDENCE = 0.95


def sweep_design(top: int, prompts: int = 50, passes: int = 4, boots: int = 1) -> Design:
    """Levels x1, x2, x4, ... x``top``, the highest primary."""
    levels = tuple((f"c{2**k}", 2**k) for k in range(int(math.log2(top)) + 1))
    return Design(prompts=prompts, levels=levels, primary=levels[-1][0], passes=passes,
                  boots=boots)


@dataclass(frozen=True)
class Coverage:
    coverage: float
    statuses: dict[str, float]
    median: float


def coverage(design: Design, noise_name: str, crossing: float, slope: float, sims: int,
             seed: int) -> Coverage:
    """Share of ``sims`` campaigns whose crossover interval holds ``crossing``."""
    noise = {**noise_models(), BOOT_NOISE.name: BOOT_NOISE}[noise_name]
    camp = simulate(design, noise, 1.0, sims, seed)
    per_level = []
    for name, c in design.levels:
        truth = THRESHOLD * (c / crossing) ** slope
        cand = camp.candidate[name] / truth  # the planted speedup at this level
        b = speed_batch(camp.reference[name], cand, camp.units[name], "per_prompt")
        se = np.sqrt(b.var)
        q = special.stdtrit(np.maximum(b.df, 1e-9), 1 - (1 - CONFIDENCE) / 2)
        share = shared_share(b.between, b.clusters, b.boot_var, b.var)
        per_level.append((name, c, b.log_estimate, se, q, b.df, share))
    hits = 0
    status = dict.fromkeys(("crosses", "pays_everywhere", "pays_nowhere", "not_estimable"), 0)
    points = []
    for s in range(sims):
        levels = [LevelSpeedup(name, c, math.exp(est[s]), math.exp(est[s] - q[s] * se[s]),
                               math.exp(est[s] + q[s] * se[s]), float(df[s]),
                               float(share[s]))
                  for name, c, est, se, q, df, share in per_level]
        r = crossover(levels, THRESHOLD, CONFIDENCE)
        status[r.status] += 1
        hits += (r.ci_low is None or r.ci_low <= crossing) and \
            (r.ci_high is None or crossing <= r.ci_high)
        if r.concurrency is not None:
            points.append(r.concurrency)
    return Coverage(hits / sims, {k: v / sims for k, v in status.items()},
                    float(np.median(points)) if points else math.nan)
