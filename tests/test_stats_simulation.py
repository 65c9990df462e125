"""Monte-Carlo validation: error rates at the null and power at the declared effect.

Every test simulates pilots from ``LatencyModel`` (seeded) and runs the real functions.
Rates are judged with exact binomial tests at the 0.1% level, so a seeded run that fails
means the method, not the dice, is off: "at most alpha" fails only if the observed count is
significantly above alpha; "at least the prediction" only if significantly below.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.judgement.sequential import (
    LatencyModel,
    as_blocks,
    obrien_fleming_plan,
    sequential_speedup,
)
from pytest_osprey.judgement.stats import (
    FloatArray,
    paired_speedup,
    percentile_upper_bound,
    tost_paired,
)

SIG = 0.001  # significance of the Monte-Carlo checks themselves


def assert_rate_at_most(hits: int, n: int, alpha: float, what: str) -> None:
    p = stats.binomtest(hits, n, alpha, alternative="greater").pvalue
    assert p > SIG, f"{what}: {hits}/{n} = {hits / n:.4f} is significantly above {alpha}"


def assert_rate_at_least(hits: int, n: int, target: float, what: str) -> None:
    p = stats.binomtest(hits, n, target, alternative="less").pvalue
    assert p > SIG, f"{what}: {hits}/{n} = {hits / n:.4f} is significantly below {target:.4f}"


def _mapping(latencies: FloatArray) -> dict[str, list[float]]:
    return {f"p{i}": row.tolist() for i, row in enumerate(latencies)}


def _run_fixed(
    model: LatencyModel, speedup: float, threshold: float, n_sims: int, seed: int
) -> dict[str, int]:
    ref, cand = model.sample(np.random.default_rng(seed), n_sims, 20, 2, speedup)
    counts = {"pass": 0, "fail": 0, "inconclusive": 0}
    for i in range(n_sims):
        res = paired_speedup(_mapping(ref[i]), _mapping(cand[i]), threshold=threshold, seed=i)
        counts[res.outcome] += 1
    return counts


# --------------------------------------------------------------------------- paired speedup


def test_paired_speedup_false_pass_at_threshold_heavy_tails() -> None:
    """True speedup == threshold (1.1), 20 prompts x 2 reps, Student-t noise + Pareto stalls."""
    n_sims, alpha = 2000, (1 - 0.95) / 2
    counts = _run_fixed(LatencyModel(), speedup=1.1, threshold=1.1, n_sims=n_sims, seed=101)
    assert_rate_at_most(counts["pass"], n_sims, alpha, "false pass")
    assert_rate_at_most(counts["fail"], n_sims, alpha, "false fail")


def test_paired_speedup_power_at_declared_effect() -> None:
    """Speedup 1.3 vs threshold 1.0, 20 prompts x 2 reps, lognormal noise (log-SD 0.35).

    The analytic prediction is the one-sided t-test's power (noncentral t) with the model's
    true SD of per-prompt log-ratios: sqrt(interaction^2 + 2 * noise^2 / reps).
    """
    model = replace(LatencyModel(), noise_sd=0.35, noise_df=math.inf, spike_prob=0.0)
    sd = math.sqrt(model.interaction_sd**2 + 2 * model.noise_sd**2 / 2)
    n, alpha = 20, 0.025
    predicted = stats.nct.sf(
        stats.t.ppf(1 - alpha, n - 1), n - 1, math.sqrt(n) * math.log(1.3) / sd
    )
    assert 0.8 < predicted < 0.9  # the scenario is informative: neither trivial nor hopeless
    n_sims = 1000
    counts = _run_fixed(model, speedup=1.3, threshold=1.0, n_sims=n_sims, seed=202)
    assert_rate_at_least(counts["pass"], n_sims, predicted, "power")
    assert counts["fail"] == 0


# --------------------------------------------------------------------------- sequential

LOOKS, PROMPTS = 4, 20  # a block replays 20 prompts once per condition


def _run_sequential(
    speedup: float, n_sims: int, seed: int, futility: float | None = None
) -> tuple[int, float, FloatArray]:
    """(keeps, mean blocks used, per-pilot pooled log-ratios for the fixed design)."""
    plan = obrien_fleming_plan(LOOKS, alpha=0.025)
    ref, cand = LatencyModel().sample(np.random.default_rng(seed), n_sims, PROMPTS, LOOKS, speedup)
    keeps, used = 0, 0
    for i in range(n_sims):
        ref_b, cand_b = as_blocks(ref[i], 1), as_blocks(cand[i], 1)
        for look in range(1, LOOKS + 1):
            dec = sequential_speedup(ref_b[:look], cand_b[:look], 1.0, plan, futility)
            if dec.decision != "continue":
                break
        keeps += dec.decision == "keep"
        used += look
    d = np.log(ref).mean(axis=-1) - np.log(cand).mean(axis=-1)
    return keeps, used / n_sims, d


def _fixed_t_passes(d: FloatArray) -> int:
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(d.shape[1]))
    return int(np.sum(t > stats.t.ppf(0.975, d.shape[1] - 1)))


def test_sequential_false_keep_at_threshold() -> None:
    """No futility stop (the worst case for the false-keep rate): keeps <= alpha."""
    n_sims = 1500
    keeps, _, _ = _run_sequential(1.0, n_sims, seed=303)
    assert_rate_at_most(keeps, n_sims, 0.025, "sequential false keep")


def test_sequential_saves_blocks_at_declared_effect() -> None:
    """At speedup 1.3 the sequential design uses <= 0.7x the fixed design's 4 blocks.

    The campaign is sized for speedup ~1.15 (fixed power ~0.75); a clearly better drafter
    should stop early. Power must not fall below the fixed t-test's beyond MC error, and the
    non-binding futility rule (F = 1.3) may cost at most alpha of it.
    """
    n_sims = 800
    keeps, mean_blocks, d = _run_sequential(1.3, n_sims, seed=404)
    fixed_power = _fixed_t_passes(d) / n_sims
    assert mean_blocks <= 0.7 * LOOKS, f"used {mean_blocks:.2f} of {LOOKS} blocks"
    assert_rate_at_least(keeps, n_sims, fixed_power - 0.01, "sequential power")
    keeps_f, blocks_f, _ = _run_sequential(1.3, n_sims, seed=404, futility=1.3)
    assert_rate_at_least(keeps_f, n_sims, fixed_power - 0.025 - 0.01, "power with futility")
    assert blocks_f <= mean_blocks + 1e-9


def test_sequential_futility_saves_blocks_at_null() -> None:
    n_sims = 400
    keeps, blocks_f, _ = _run_sequential(1.0, n_sims, seed=505, futility=1.3)
    assert blocks_f <= 0.8 * LOOKS
    assert_rate_at_most(keeps, n_sims, 0.025, "false keep with futility")


# --------------------------------------------------------------------------- other tests


@pytest.mark.parametrize(("n", "q"), [(60, 0.95), (200, 0.95), (40, 0.5)])
def test_percentile_bound_coverage(n: int, q: float) -> None:
    """Upper bound >= true quantile with probability >= confidence (lognormal data)."""
    n_sims, conf = 2000, 0.95
    x = np.random.default_rng(606).lognormal(0.0, 0.8, (n_sims, n))
    true_q = math.exp(0.8 * stats.norm.ppf(q))
    misses, false_fail = 0, 0
    for row in x:
        res = percentile_upper_bound(row.tolist(), q=q, limit=true_q, confidence=conf)
        misses += res.bound < true_q  # "pass" at a limit equal to the true quantile
        false_fail += res.outcome == "fail"
    assert_rate_at_most(misses, n_sims, 1 - conf, "upper bound below the true quantile")
    assert_rate_at_most(false_fail, n_sims, 1 - conf, "fail when the quantile meets the limit")


@pytest.mark.parametrize("shift_sign", [1.0, -1.0])
def test_tost_size_at_the_margin(shift_sign: float) -> None:
    """True mean difference exactly at +/- margin: declaring equivalence happens <= alpha."""
    n_sims, n, margin, alpha = 2000, 25, 0.2, 0.05
    rng = np.random.default_rng(707)
    ref = rng.normal(5.0, 1.0, (n_sims, n))
    cand = ref + shift_sign * margin + rng.normal(0.0, 0.4, (n_sims, n))
    passes = sum(
        tost_paired(r.tolist(), c.tolist(), margin, alpha).outcome == "pass"
        for r, c in zip(ref, cand, strict=True)
    )
    assert_rate_at_most(passes, n_sims, alpha, "TOST false equivalence")


def test_holm_controls_familywise_error() -> None:
    """5 true nulls among 8 tests: P(any true null rejected at 0.05) <= 0.05."""
    n_sims = 4000
    rng = np.random.default_rng(909)
    from pytest_osprey.judgement.stats import holm

    hits = 0
    for _ in range(n_sims):
        p = np.concatenate([rng.random(5), rng.random(3) * 1e-3])
        hits += any(a <= 0.05 for a in holm(p.tolist())[:5])
    assert_rate_at_most(hits, n_sims, 0.05, "Holm family-wise error")
