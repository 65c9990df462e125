"""Unit tests of pytest_osprey.stats: known values, edge cases and error messages."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.judgement.sequential import (
    SequentialPlan,
    obf_spending,
    obrien_fleming_plan,
    sequential_speedup,
)
from pytest_osprey.judgement.stats import (
    MAX_PAIRS,
    StatsError,
    holm,
    paired_speedup,
    percentile_upper_bound,
    prompt_log_ratios,
    required_pairs,
)

# --------------------------------------------------------------------------- paired speedup


def _pilot(
    speedups: list[float], reps: int = 2, jitter: float = 0.05, seed: int = 0
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Reference/candidate latencies where prompt i is sped up by speedups[i] (plus noise)."""
    rng = np.random.default_rng(seed)
    ref, cand = {}, {}
    for i, s in enumerate(speedups):
        base = float(rng.lognormal(0.5, 0.6))
        ref[f"p{i}"] = (base * rng.lognormal(0, jitter, reps)).tolist()
        cand[f"p{i}"] = (base / s * rng.lognormal(0, jitter, reps)).tolist()
    return ref, cand


def test_clear_speedup_passes_and_is_geometric_mean() -> None:
    ref, cand = _pilot([1.8, 2.0, 2.2, 1.9, 2.1, 2.0, 1.95, 2.05])
    res = paired_speedup(ref, cand, threshold=1.5)
    _, d, _ = prompt_log_ratios(ref, cand)
    assert res.estimate == pytest.approx(math.exp(d.mean()))
    assert res.outcome == "pass"
    assert res.ci_low > 1.5 and res.ci_low <= res.estimate <= res.ci_high
    assert res.more_pairs_needed is None
    assert res.n_prompts == 8 and res.n_pairs == 16
    assert res.method.startswith(("BCa bootstrap", "percentile bootstrap"))
    # 8 positive differences: the exact one-sided signed-rank p-value is 1/2^8.
    assert res.p_value == pytest.approx(1 / 2**8)


def test_clear_slowdown_fails() -> None:
    ref, cand = _pilot([0.7, 0.75, 0.8, 0.72, 0.78, 0.74])
    res = paired_speedup(ref, cand, threshold=1.0)
    assert res.outcome == "fail" and res.ci_high < 1.0
    assert res.p_value > 0.9


def test_straddling_ci_is_inconclusive_with_more_pairs() -> None:
    ref, cand = _pilot([1.3, 0.8, 1.2, 0.95, 1.25, 0.9], jitter=0.2)
    res = paired_speedup(ref, cand, threshold=1.0)
    assert res.outcome == "inconclusive"
    assert res.more_pairs_needed is not None and res.more_pairs_needed >= 1


def test_more_pairs_needed_settles_the_question() -> None:
    """Replicating the observed prompts ~more_pairs_needed times over gives a verdict."""
    ref, cand = _pilot([1.25, 0.95, 1.2, 1.0, 1.3, 0.98, 1.15, 1.05], jitter=0.1)
    res = paired_speedup(ref, cand, threshold=1.0)
    assert res.outcome == "inconclusive" and res.more_pairs_needed is not None
    copies = math.ceil((res.n_prompts + res.more_pairs_needed) / res.n_prompts)
    big_ref = {f"{k}-{c}": v for k, v in ref.items() for c in range(copies)}
    big_cand = {f"{k}-{c}": v for k, v in cand.items() for c in range(copies)}
    assert paired_speedup(big_ref, big_cand, threshold=1.0).outcome == "pass"


def test_only_common_prompts_are_paired_and_order_is_irrelevant() -> None:
    ref, cand = _pilot([1.5, 1.4, 1.6, 1.5])
    ref_extra = {**ref, "only-ref": [9.0]}
    cand_extra = {"only-cand": [1.0], **dict(reversed(list(cand.items())))}
    assert paired_speedup(ref_extra, cand_extra) == paired_speedup(ref, cand)


def test_unequal_repetitions_are_pooled_per_prompt() -> None:
    ref = {"a": [2.0, 8.0], "b": [3.0]}
    cand = {"a": [2.0], "b": [1.0, 1.0, 1.0]}
    ids, d, n_pairs = prompt_log_ratios(ref, cand)
    assert ids == ["a", "b"] and n_pairs == 2
    np.testing.assert_allclose(d, [math.log(4.0) - math.log(2.0), math.log(3.0)])


def test_throughput_uses_swapped_arguments() -> None:
    """tokens/s ratios equal latency ratios when the arguments are swapped (documented)."""
    ref, cand = _pilot([1.3, 1.2, 1.4, 1.25, 1.35])
    tokens = 128.0
    ref_tps = {k: [tokens / x for x in v] for k, v in ref.items()}
    cand_tps = {k: [tokens / x for x in v] for k, v in cand.items()}
    by_latency = paired_speedup(ref, cand)
    by_throughput = paired_speedup(cand_tps, ref_tps)
    assert by_throughput.estimate == pytest.approx(by_latency.estimate)
    assert by_throughput.outcome == by_latency.outcome


def test_all_equal_log_ratios_fall_back_to_percentile() -> None:
    ref = {f"p{i}": [2.0, 2.0] for i in range(5)}
    cand = {f"p{i}": [1.0, 1.0] for i in range(5)}
    res = paired_speedup(ref, cand, threshold=1.5)
    assert res.method == "percentile bootstrap"
    assert res.estimate == pytest.approx(2.0)
    assert res.ci_low == pytest.approx(2.0) and res.ci_high == pytest.approx(2.0)
    assert res.outcome == "pass"
    at = paired_speedup(ref, cand, threshold=2.0)
    assert at.outcome == "inconclusive" and at.more_pairs_needed == MAX_PAIRS - 5


def test_seed_makes_results_reproducible() -> None:
    ref, cand = _pilot([1.1, 0.9, 1.3, 1.0, 1.2], jitter=0.2)
    assert paired_speedup(ref, cand, seed=3) == paired_speedup(ref, cand, seed=3)


@pytest.mark.parametrize(
    ("ref", "cand", "message"),
    [
        ({}, {"a": [1.0]}, "reference: no prompts"),
        ({"a": [1.0]}, {"b": [1.0]}, "no prompt appears in both"),
        ({"a": [1.0]}, {"a": [1.0]}, "at least 2 paired prompts"),
        ({"a": [1.0], "b": [float("nan")]}, {"a": [1.0], "b": [1.0]}, r"reference\['b'\].*finite"),
        ({"a": [1.0], "b": [0.0]}, {"a": [1.0], "b": [1.0]}, r"> 0 seconds, got 0"),
        ({"a": [1.0], "b": [1.0]}, {"a": [-2.0], "b": [1.0]}, r"candidate\['a'\].*got -2"),
        ({"a": [1.0], "b": []}, {"a": [1.0], "b": [1.0]}, r"reference\['b'\]: no latencies"),
        ({"a": [1.0], "b": ["x"]}, {"a": [1.0], "b": [1.0]}, "must be numbers"),
    ],
)
def test_bad_latencies_raise_clear_errors(
    ref: dict[str, list[float]], cand: dict[str, list[float]], message: str
) -> None:
    with pytest.raises(StatsError, match=message):
        paired_speedup(ref, cand)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold": 0.0}, "threshold"),
        ({"threshold": float("nan")}, "threshold"),
        ({"confidence": 1.0}, "confidence"),
        ({"n_resamples": 10}, "n_resamples"),
    ],
)
def test_bad_parameters_raise(kwargs: dict[str, float], message: str) -> None:
    ref, cand = _pilot([1.1, 1.2])
    with pytest.raises(StatsError, match=message):
        paired_speedup(ref, cand, **kwargs)  # type: ignore[arg-type]


def test_stats_error_is_a_value_error() -> None:
    assert issubclass(StatsError, ValueError)


# --------------------------------------------------------------------------- required pairs


def _t_power(n: int, sd: float, delta: float, alpha: float) -> float:
    crit = stats.t.ppf(1 - alpha, n - 1)
    return float(stats.nct.sf(crit, n - 1, math.sqrt(n) * delta / sd))


@pytest.mark.parametrize(("sd", "effect"), [(0.4, 1.3), (0.3, 1.1), (0.1, 1.02), (1.0, 2.0)])
def test_required_pairs_reaches_power(sd: float, effect: float) -> None:
    n = required_pairs(sd, effect, threshold=1.0)
    delta = math.log(effect)
    assert _t_power(n, sd, delta, 0.025) >= 0.79
    assert _t_power(n - 2, sd, delta, 0.025) < 0.8 or n <= 3
    normal = ((stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * sd / delta) ** 2
    assert normal <= n <= normal + 4


def test_required_pairs_edge_cases() -> None:
    assert required_pairs(0.0, 1.1, 1.0) == 2
    assert required_pairs(0.4, 1.3, 1.0) > required_pairs(0.4, 1.5, 1.0)
    assert required_pairs(0.4, 1.3, 1.0, power=0.9) > required_pairs(0.4, 1.3, 1.0)
    assert required_pairs(5.0, 1.0001, 1.0) == MAX_PAIRS
    with pytest.raises(StatsError, match="must exceed threshold"):
        required_pairs(0.4, 1.0, 1.1)
    with pytest.raises(StatsError, match="log_ratio_sd"):
        required_pairs(-1.0, 1.3, 1.0)


# --------------------------------------------------------------------------- percentile bound


def test_percentile_bound_rule_of_59() -> None:
    """The max of 59 samples bounds the p95 with 95% confidence (1 - 0.95^59 >= 0.95); 58 don't."""
    res = percentile_upper_bound(list(range(1, 60)), q=0.95, limit=100.0)
    assert res.bound == 59 and res.outcome == "pass" and res.n == 59
    small = percentile_upper_bound(list(range(1, 59)), q=0.95, limit=100.0)
    assert small.bound == math.inf and small.outcome == "inconclusive"


def test_percentile_bound_order_statistic_matches_binomial() -> None:
    x = np.random.default_rng(1).lognormal(0, 0.5, 200)
    res = percentile_upper_bound(x.tolist(), q=0.9, limit=10.0, confidence=0.95)
    k = int(stats.binom.ppf(0.95, 200, 0.9)) + 1  # smallest k with cdf(k-1) >= 0.95
    assert res.bound == np.sort(x)[k - 1]
    assert res.estimate == pytest.approx(np.quantile(x, 0.9))
    assert res.bound >= res.estimate


def test_percentile_bound_outcomes() -> None:
    x = np.random.default_rng(2).lognormal(0, 0.3, 300).tolist()
    assert percentile_upper_bound(x, 0.95, limit=100.0).outcome == "pass"
    assert percentile_upper_bound(x, 0.95, limit=0.5).outcome == "fail"
    p95 = float(np.quantile(x, 0.95))
    assert percentile_upper_bound(x, 0.95, limit=p95).outcome == "inconclusive"


def test_percentile_bound_errors() -> None:
    with pytest.raises(StatsError, match="no values"):
        percentile_upper_bound([], 0.95, 1.0)
    with pytest.raises(StatsError, match="finite"):
        percentile_upper_bound([1.0, float("nan")], 0.95, 1.0)
    with pytest.raises(StatsError, match="q must lie"):
        percentile_upper_bound([1.0, 2.0], 1.0, 1.0)


# --------------------------------------------------------------------------- TOST


# --------------------------------------------------------------------------- Holm


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        ([0.01, 0.04, 0.03, 0.005], [0.03, 0.06, 0.06, 0.02]),
        ([0.5, 0.6], [1.0, 1.0]),
        ([0.02], [0.02]),
        ([0.01, 0.01, 0.5], [0.03, 0.03, 0.5]),
        # Monotonicity: the step-down maximum carries 0.04*3 over the smaller 0.045*2.
        ([0.04, 0.045, 0.001], [0.08, 0.08, 0.003]),
        ([], []),
    ],
)
def test_holm_known_examples(p: list[float], expected: list[float]) -> None:
    assert holm(p) == pytest.approx(expected)


def test_holm_rejects_bad_p_values() -> None:
    with pytest.raises(StatsError, match=r"\[0, 1\]"):
        holm([0.1, 1.5])
    with pytest.raises(StatsError, match="finite"):
        holm([float("nan")])


# --------------------------------------------------------------------------- sequential


def test_obrien_fleming_matches_published_boundaries() -> None:
    """gsDesign sfLDOF, k=5, one-sided alpha 0.025 (Jennison & Turnbull Table 2.x)."""
    plan = obrien_fleming_plan(5, alpha=0.025)
    np.testing.assert_allclose(plan.boundaries, [4.8769, 3.3569, 2.6803, 2.2898, 2.0310], atol=2e-4)
    assert plan.information == pytest.approx((0.2, 0.4, 0.6, 0.8, 1.0))
    assert obrien_fleming_plan(1).boundaries == pytest.approx((stats.norm.isf(0.025),))


@pytest.mark.parametrize("looks", [2, 4])
def test_boundaries_spend_alpha_as_planned(looks: int) -> None:
    """Cumulative H0 crossing probability (Genz MVN integration) equals the spent alpha."""
    plan = obrien_fleming_plan(looks, alpha=0.025)
    t = np.asarray(plan.information)
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    for k in range(1, looks + 1):
        mvn = stats.multivariate_normal(np.zeros(k), cov[:k, :k])
        below = mvn.cdf(np.asarray(plan.boundaries[:k]), rng=np.random.default_rng(0))
        assert 1 - below == pytest.approx(obf_spending(t[k - 1], 0.025), abs=2e-5)


def _blocks(
    speedup: float, n_blocks: int, n_prompts: int = 10, noise: float = 0.1
) -> tuple[list[dict[str, list[float]]], list[dict[str, list[float]]]]:
    rng = np.random.default_rng(5)
    ref_b, cand_b = [], []
    for _ in range(n_blocks):
        ref_b.append(
            {f"p{i}": [float(rng.lognormal(0, noise)) * (1 + i)] for i in range(n_prompts)}
        )
        cand_b.append(
            {
                f"p{i}": [float(rng.lognormal(0, noise)) * (1 + i) / speedup]
                for i in range(n_prompts)
            }
        )
    return ref_b, cand_b


def test_sequential_keeps_a_clear_speedup_early() -> None:
    plan = obrien_fleming_plan(4)
    ref_b, cand_b = _blocks(1.5, 1)
    dec = sequential_speedup(ref_b, cand_b, threshold=1.0, plan=plan)
    assert dec.decision == "keep" and dec.look == 1 and dec.z >= dec.boundary
    assert dec.estimate == pytest.approx(1.5, rel=0.1)


def test_sequential_continues_then_drops_at_the_final_look() -> None:
    plan = obrien_fleming_plan(3)
    ref_b, cand_b = _blocks(1.0, 3, noise=0.3)
    assert sequential_speedup(ref_b[:1], cand_b[:1], 1.0, plan).decision == "continue"
    assert sequential_speedup(ref_b, cand_b, 1.0, plan).decision == "drop"


def test_sequential_futility_drops_early() -> None:
    plan = obrien_fleming_plan(4)
    ref_b, cand_b = _blocks(0.7, 2)
    assert sequential_speedup(ref_b, cand_b, 1.0, plan).decision == "continue"
    dec = sequential_speedup(ref_b, cand_b, 1.0, plan, futility_threshold=1.2)
    assert dec.decision == "drop" and dec.look == 2


def test_sequential_pools_blocks_per_prompt() -> None:
    plan = obrien_fleming_plan(2)
    ref_b, cand_b = _blocks(1.2, 2, noise=0.2)
    pooled_ref = {k: ref_b[0][k] + ref_b[1][k] for k in ref_b[0]}
    pooled_cand = {k: cand_b[0][k] + cand_b[1][k] for k in cand_b[0]}
    dec = sequential_speedup(ref_b, cand_b, 1.0, plan)
    assert dec.estimate == pytest.approx(paired_speedup(pooled_ref, pooled_cand).estimate)


def test_sequential_errors() -> None:
    plan = obrien_fleming_plan(2)
    ref_b, cand_b = _blocks(1.2, 3)
    with pytest.raises(StatsError, match=r"plan has looks 1\.\.2"):
        sequential_speedup(ref_b, cand_b, 1.0, plan)
    with pytest.raises(StatsError, match="blocks"):
        sequential_speedup(ref_b[:2], cand_b[:1], 1.0, plan)
    with pytest.raises(StatsError, match="futility_threshold"):
        sequential_speedup(ref_b[:1], cand_b[:1], 1.0, plan, futility_threshold=-1.0)
    with pytest.raises(StatsError, match="looks"):
        obrien_fleming_plan(0)
    with pytest.raises(StatsError, match="alpha"):
        obrien_fleming_plan(3, alpha=0.6)
    assert isinstance(plan, SequentialPlan)


# --------------------------------------------------------------------------- accept length

