"""Hypothesis properties of pytest_osprey.stats (derandomised, modest example counts)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_osprey.judgement.speed.across_runs import SpeedupResult, paired_speedup
from pytest_osprey.judgement.stats.core import StatsError
from pytest_osprey.judgement.stats.noninferiority import mcnemar_noninferiority

FAST = settings(max_examples=30, deadline=None, derandomize=True)
Pilot = tuple[dict[str, list[float]], dict[str, list[float]]]

# Tied values are drawn often on purpose: identical latencies are common in coarse timers.
latency = st.one_of(
    st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.25, 0.5, 1.0, 2.0]),
)


@st.composite
def pilots(draw: st.DrawFn, min_prompts: int = 2, max_prompts: int = 8) -> Pilot:
    n = draw(st.integers(min_prompts, max_prompts))
    reps = st.lists(latency, min_size=1, max_size=3)
    ref = {f"p{i}": draw(reps) for i in range(n)}
    cand = {f"p{i}": draw(reps) for i in range(n)}
    return ref, cand


RANK = {"fail": 0, "inconclusive": 1, "pass": 2}


def _log_ci(res: SpeedupResult) -> tuple[float, float]:
    return math.log(res.ci_low), math.log(res.ci_high)


@FAST
@given(pilots(), st.integers(0, 2**16))
def test_swapping_conditions_inverts_speedup_and_ci(pilot: Pilot, seed: int) -> None:
    ref, cand = pilot
    fwd = paired_speedup(ref, cand, seed=seed)
    back = paired_speedup(cand, ref, seed=seed)
    assert back.estimate == pytest.approx(1 / fwd.estimate, rel=1e-9)
    low, high = _log_ci(fwd)
    b_low, b_high = _log_ci(back)
    # Same resamples, negated data: BCa mirrors up to its tie handling; allow a quarter width.
    tol = 0.25 * (high - low) + 1e-9
    assert abs(b_low + high) <= tol and abs(b_high + low) <= tol


@FAST
@given(pilots(), st.sampled_from([1e-3, 0.37, 3.0, 1e3]), st.floats(0.5, 2.0))
def test_scaling_all_latencies_changes_nothing(
    pilot: Pilot, scale: float, threshold: float
) -> None:
    ref, cand = pilot
    base = paired_speedup(ref, cand, threshold=threshold)
    scaled = paired_speedup(
        {k: [x * scale for x in v] for k, v in ref.items()},
        {k: [x * scale for x in v] for k, v in cand.items()},
        threshold=threshold,
    )
    assert scaled.estimate == pytest.approx(base.estimate, rel=1e-9)
    assert scaled.ci_low == pytest.approx(base.ci_low, rel=1e-6)
    assert scaled.ci_high == pytest.approx(base.ci_high, rel=1e-6)
    assert scaled.p_value == pytest.approx(base.p_value, abs=1e-9)
    assert scaled.outcome == base.outcome


@FAST
@given(pilots())
def test_ci_contains_estimate_and_fields_are_sane(pilot: Pilot) -> None:
    res = paired_speedup(*pilot)
    assert 0 < res.ci_low <= res.estimate <= res.ci_high < math.inf
    assert 0.0 <= res.p_value <= 1.0
    assert (res.more_pairs_needed is None) == (res.outcome != "inconclusive")
    assert res.n_prompts == len(pilot[0]) and res.n_pairs >= res.n_prompts


@FAST
@given(pilots(), st.lists(st.floats(0.1, 10.0), min_size=2, max_size=6))
def test_outcome_is_monotone_in_threshold(pilot: Pilot, thresholds: list[float]) -> None:
    ranks = [RANK[paired_speedup(*pilot, threshold=t).outcome] for t in sorted(thresholds)]
    assert ranks == sorted(ranks, reverse=True)


@FAST
@given(
    st.integers(2, 6),
    st.sampled_from([0.5, 1.0, 3.0]),
    st.sampled_from([0.5, 1.0, 3.0]),
    st.floats(0.5, 2.0),
)
def test_all_equal_values_do_not_crash(n: int, r: float, c: float, threshold: float) -> None:
    res = paired_speedup(
        {f"p{i}": [r, r] for i in range(n)}, {f"p{i}": [c] for i in range(n)}, threshold
    )
    assert res.estimate == pytest.approx(r / c)
    assert res.ci_low == pytest.approx(r / c) and res.ci_high == pytest.approx(r / c)
    expected = "pass" if r / c > threshold * (1 + 1e-9) else "fail"
    if math.isclose(r / c, threshold, rel_tol=1e-9):
        expected = "inconclusive"
    assert res.outcome == expected


@FAST
@given(
    pilots(),
    st.sampled_from([math.nan, 0.0, -1.0, math.inf, -math.inf]),
    st.booleans(),
    st.data(),
)
def test_bad_latency_anywhere_raises(
    pilot: Pilot, bad: float, in_ref: bool, data: st.DataObject
) -> None:
    ref, cand = pilot
    target = ref if in_ref else cand
    key = data.draw(st.sampled_from(sorted(target)))
    target[key] = [*target[key], bad]
    with pytest.raises(StatsError, match=rf"\['{key}'\]: latencies must be finite and > 0"):
        paired_speedup(ref, cand)


@FAST
@given(pilots(min_prompts=1, max_prompts=1))
def test_single_prompt_raises(pilot: Pilot) -> None:
    with pytest.raises(StatsError, match="at least 2 paired prompts"):
        paired_speedup(*pilot)


@FAST
@given(pilots(), st.booleans())
def test_empty_repetitions_raise(pilot: Pilot, in_ref: bool) -> None:
    ref, cand = pilot
    (ref if in_ref else cand)["p0"] = []
    with pytest.raises(StatsError, match=r"\['p0'\]: no latencies"):
        paired_speedup(ref, cand)


# --------------------------------------------------------------------------- other functions


@FAST
@given(
    st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=40),
    st.sampled_from([0.0, 0.05, 0.2]),
)
def test_mcnemar_is_sane_on_any_pairs(pairs: list[tuple[bool, bool]], margin: float) -> None:
    ref, cand = [a for a, _ in pairs], [b for _, b in pairs]
    res = mcnemar_noninferiority(ref, cand, margin)
    assert -1.0 <= res.ci_low <= res.estimate <= res.ci_high <= 1.0
    assert 0.0 <= res.p_value <= 1.0
    # Turning a loss into a gain can only help the candidate.
    if (True, False) in pairs:
        i = pairs.index((True, False))
        better = mcnemar_noninferiority(ref, [*cand[:i], True, *cand[i + 1 :]], margin)
        assert better.p_value <= res.p_value + 1e-9
