"""Unit tests of pytest_osprey.stats: known values, edge cases and error messages."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.judgement.speed.across_runs import MAX_PAIRS, paired_speedup, prompt_log_ratios
from pytest_osprey.judgement.stats.core import StatsError
from pytest_osprey.judgement.stats.noninferiority import mcnemar_noninferiority

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


# --------------------------------------------------------------------------- percentile bound


# --------------------------------------------------------------------------- TOST


# --------------------------------------------------------------------------- McNemar


def _pairs(both: int, gains: int, losses: int, neither: int) -> tuple[list[bool], list[bool]]:
    ref = [True] * both + [False] * gains + [True] * losses + [False] * neither
    cand = [True] * both + [True] * gains + [False] * losses + [False] * neither
    return ref, cand


def test_mcnemar_no_discordant_pairs_is_non_inferior() -> None:
    res = mcnemar_noninferiority(*_pairs(90, 0, 0, 10), margin=0.05)
    assert res.outcome == "pass" and res.estimate == 0.0 and res.p_value < 0.05
    few = mcnemar_noninferiority(*_pairs(9, 0, 0, 1), margin=0.05)
    assert few.outcome == "inconclusive"  # 10 pairs cannot rule out a 5% loss


def test_mcnemar_clear_loss_fails() -> None:
    res = mcnemar_noninferiority(*_pairs(60, 2, 25, 13), margin=0.05)
    assert res.estimate == pytest.approx(-0.23)
    assert res.outcome == "fail" and res.ci_high < -0.05


def _brute_force_p(n: int, gains: int, losses: int, margin: float) -> float:
    """Independent exact unconditional p-value: explicit loops, Wald-free Tango ordering."""
    from pytest_osprey.judgement.stats.noninferiority import tango_z

    z_obs = float(tango_z(n, gains, losses, -margin))
    cells = [(x, y) for x in range(n + 1) for y in range(n + 1 - x)]
    region = [c for c in cells if float(tango_z(n, c[0], c[1], -margin)) >= z_obs - 1e-9]
    best = 0.0
    for q in np.linspace(margin, (1 + margin) / 2, 401):
        p_gain, p_loss, p_same = max(q - margin, 0.0), q, max(1 - 2 * q + margin, 0.0)
        total = sum(
            math.comb(n, x) * math.comb(n - x, y) * p_gain**x * p_loss**y * p_same ** (n - x - y)
            for x, y in region
        )
        best = max(best, total)
    return best


@pytest.mark.parametrize(("n", "gains", "losses", "margin"), [(12, 1, 2, 0.1), (15, 0, 0, 0.2)])
def test_mcnemar_exact_p_matches_brute_force(
    n: int, gains: int, losses: int, margin: float
) -> None:
    ref, cand = _pairs(n - gains - losses, gains, losses, 0)
    res = mcnemar_noninferiority(ref, cand, margin=margin)
    brute = _brute_force_p(n, gains, losses, margin)  # a grid maximum: at most the sup
    assert brute - 1e-9 <= res.p_value <= brute + 1e-3


def test_mcnemar_margin_zero_close_to_classic() -> None:
    """With margin 0 the exact unconditional test is at least as powerful as exact McNemar."""
    res = mcnemar_noninferiority(*_pairs(30, 8, 1, 1), margin=0.0)
    classic = stats.binomtest(8, 9, 0.5, alternative="greater").pvalue
    assert res.p_value <= classic and res.outcome == "pass"


def test_mcnemar_ci_endpoints_invert_the_score_test() -> None:
    from pytest_osprey.judgement.stats.noninferiority import tango_z

    res = mcnemar_noninferiority(*_pairs(40, 3, 9, 8), margin=0.1, alpha=0.05)
    z = stats.norm.ppf(0.95)
    assert res.ci_low < res.estimate < res.ci_high
    assert float(tango_z(60, 3, 9, res.ci_low)) == pytest.approx(z, abs=1e-6)
    assert float(tango_z(60, 3, 9, res.ci_high)) == pytest.approx(-z, abs=1e-6)


def test_mcnemar_errors() -> None:
    with pytest.raises(StatsError, match="differ in length"):
        mcnemar_noninferiority([True], [True, False], 0.1)
    with pytest.raises(StatsError, match="non-empty"):
        mcnemar_noninferiority([], [], 0.1)
    with pytest.raises(StatsError, match="margin"):
        mcnemar_noninferiority([True], [True], 1.0)
    with pytest.raises(StatsError, match="booleans"):
        mcnemar_noninferiority([0.5], [1], 0.1)  # type: ignore[list-item]
