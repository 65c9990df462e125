"""Speed statistics on hand-made data: layout, estimates, the deciding tests, drift, early
stopping, advice and percentile bounds (pytest_osprey.judgement.speed and friends)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.judgement.service.latency_bound import BoundError, latency_bound
from pytest_osprey.judgement.speed import variance
from pytest_osprey.judgement.speed.advice import advise
from pytest_osprey.judgement.speed.drift import Drift, drift_check
from pytest_osprey.judgement.speed.sequential import (
    decide,
    sequential_look,
    sequential_plan,
    spending_bounds,
)
from pytest_osprey.judgement.speed.speedup import (
    PairedLatencies,
    Request,
    SpeedError,
    collect,
    drift_adjusted,
    speed_batch,
    speed_test,
)

BLOCKS = np.repeat(np.arange(5), [5, 4, 4, 4, 4]).astype(np.int64)  # 21 prompts at concurrency 4
IDS = tuple(f"p{i:02d}" for i in range(21))


def campaign(
    speedup: float, noise: float = 0.2, boots: int = 1, passes: int = 2, seed: int = 0,
    gains: np.ndarray | None = None,
) -> PairedLatencies:
    rng = np.random.default_rng(seed)
    base = np.exp(rng.normal(0.0, 0.6, 21))
    gain = np.full(21, speedup) if gains is None else gains
    ref = base * np.exp(noise * rng.standard_normal((boots, passes, 21)))
    cand = base / gain * np.exp(noise * rng.standard_normal((boots, passes, 21)))
    return PairedLatencies(ref, cand, BLOCKS, IDS)


# --------------------------------------------------------------------------- layout


def test_collect_builds_the_boot_pass_prompt_layout() -> None:
    reqs = [Request(c, pid, lat, ok, boot, p, blk, 0)
            for c, lat, ok in (("base", 2.0, True), ("cand", 1.0, True))
            for boot in (0, 1) for p in (0, 1) for pid, blk in (("a", 0), ("b", 1))]
    reqs.append(Request("other", "a", 9.0, True, 0, 0, 0, 0))  # ignored
    reqs[0] = Request("base", "a", None, False, 0, 0, 0, 0)  # failed: missing
    data = collect(reqs, "base", "cand")
    assert data.reference.shape == data.candidate.shape == (2, 2, 2)
    assert data.prompt_ids == ("a", "b")
    assert math.isnan(data.reference[0, 0, 0])
    assert np.nansum(data.reference) == 2.0 * 7 and np.nansum(data.candidate) == 8.0
    assert data.blocks.tolist() == [0, 1]


def test_collect_combines_copies_and_numbers_time_units() -> None:
    """A block that cycled the trace holds a prompt twice: one cell, the copies' geometric
    mean; time units are (boot, pass, block), whatever the block's index means per pass."""
    rows = [("base", "a", 1.0, 0, 0), ("base", "a", 4.0, 0, 0), ("cand", "a", 1.0, 0, 0),
            ("base", "b", 3.0, 0, 1), ("cand", "b", 1.5, 0, 1), ("base", "a", 2.0, 1, 1),
            ("cand", "a", 2.0, 1, 1)]  # (condition, prompt, latency, pass, block)
    reqs = [Request(c, pid, lat, True, 0, p, blk, i) for i, (c, pid, lat, p, blk) in
            enumerate(rows)]
    data = collect(reqs, "base", "cand")
    assert data.reference[0, 0, 0] == pytest.approx(2.0)  # sqrt(1 * 4)
    assert data.time_units.tolist() == [[[0, 1], [2, -1]]]  # b did not run in pass 2
    assert data.blocks.tolist() == [0, 1]  # first-pass blocks (the drift check's clusters)


def test_collect_refuses_inconsistent_records() -> None:
    one = Request("base", "a", 1.0, True, 0, 0, 0, 0)
    with pytest.raises(SpeedError, match="blocks"):
        collect([one, Request("cand", "a", 1.0, True, 0, 0, 3, 1)], "base", "cand")
    with pytest.raises(SpeedError, match="no request"):
        collect([one], "x", "y")
    with pytest.raises(SpeedError, match="> 0"):
        PairedLatencies(np.full((1, 1, 2), -1.0), np.ones((1, 1, 2)), np.zeros(2, np.int64),
                        ("a", "b"))


# --------------------------------------------------------------------------- estimates


def test_estimates_are_the_geometric_mean_and_the_ratio_of_sums() -> None:
    rng = np.random.default_rng(1)
    data = campaign(1.0, gains=np.exp(rng.normal(0.2, 0.3, 21)))
    res = speed_test(data)
    per_prompt = np.log(data.reference).mean(axis=(0, 1)) - np.log(data.candidate).mean(
        axis=(0, 1))
    assert res.per_prompt.estimate == pytest.approx(math.exp(per_prompt.mean()))
    total = data.reference.mean(axis=(0, 1)).sum() / data.candidate.mean(axis=(0, 1)).sum()
    assert res.total_time.estimate == pytest.approx(total)


def test_noiseless_speedup_is_decided_both_ways() -> None:
    data = campaign(1.25, noise=0.0)
    keep = speed_test(data, threshold=1.1)
    assert keep.outcome == "pass" and keep.per_prompt.estimate == pytest.approx(1.25)
    assert keep.per_prompt.p_value < 1e-12
    drop = speed_test(data, threshold=1.5)
    assert drop.outcome == "fail"


def test_total_time_gate_catches_a_drafter_that_raises_gpu_time() -> None:
    """Twenty short prompts 1.5x faster, one long prompt (half the work) 2x slower."""
    rng = np.random.default_rng(2)
    base = np.ones(21)
    base[0] = 25.0
    gains = np.full(21, 1.5)
    gains[0] = 0.5
    noise = np.exp(0.05 * rng.standard_normal((2, 1, 2, 21)))
    data = PairedLatencies(base * noise[0], base / gains * noise[1], BLOCKS, IDS)
    per = speed_test(data, metric="per_prompt")
    total = speed_test(data, metric="total_time")
    assert per.per_prompt.estimate > 1.3 and per.outcome == "pass"
    assert total.total_time.estimate < 1.0 and total.outcome != "pass"


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("seed", [3, 5, 8])
def test_variance_is_statsmodels_two_way_cluster_robust_covariance(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The observations (pass x prompt log ratios) regressed on a constant, clustered by
    prompt and by time unit (blocks drawn afresh every pass): statsmodels' two-way
    covariance, floored at the larger one-way one; df = min(prompts, units) - 1. (The serial
    term over time windows, which small units would switch on, is off here; its own tests
    are in test_speed_low_load.py.)"""
    sm = pytest.importorskip("statsmodels.api")
    monkeypatch.setattr(variance, "SERIAL_BELOW", 0)
    rng = np.random.default_rng(seed)
    passes = 3
    data = campaign(1.1, passes=passes, seed=seed, gains=np.exp(rng.normal(0.1, 0.2, 21)))
    # Each pass: the 21 prompts re-dealt into 5 blocks; a shock per (pass, block) unit.
    units = np.stack([rng.permutation(BLOCKS) + 5 * p for p in range(passes)])[None]
    shock = np.exp(0.1 * rng.standard_normal(5 * passes))[units]
    ref = data.reference * shock
    batch = speed_batch(ref[None], data.candidate[None], units, "per_prompt")
    d = (np.log(ref) - np.log(data.candidate)).ravel()
    prompt = np.tile(np.arange(21), passes)
    x = np.ones((d.size, 1))

    def cov(groups: np.ndarray) -> float:
        fit = sm.OLS(d, x).fit(cov_type="cluster", cov_kwds={"groups": groups})
        return float(fit.cov_params()[0, 0])

    two = cov(np.column_stack([prompt, units.ravel()]))
    one_way = max(cov(prompt), cov(units.ravel()))
    assert batch.log_estimate[0] == pytest.approx(d.mean())
    assert batch.var[0] == pytest.approx(max(two, one_way))
    assert batch.df[0] == 14  # min(21 prompts, 15 time units) - 1


@pytest.mark.parametrize("metric", ["per_prompt", "total_time"])
def test_the_p_value_is_the_deciding_tests_own(metric: str) -> None:
    """At a threshold equal to the lower bound the one-sided p is alpha: the interval and the
    p-value come from one test (keep <=> p <= alpha <=> lower bound > threshold)."""
    data = campaign(1.15, seed=4)
    res = speed_test(data, metric=metric)  # type: ignore[arg-type]
    gate = res.gating
    at_low = speed_test(data, threshold=gate.ci_low, metric=metric)  # type: ignore[arg-type]
    assert at_low.gating.p_value == pytest.approx(0.025, abs=2e-3)
    for thr in (gate.ci_low * 0.98, gate.ci_low * 1.02):
        r = speed_test(data, threshold=thr, metric=metric)  # type: ignore[arg-type]
        assert (r.gating.outcome == "pass") == (r.gating.p_value <= 0.025)


def test_one_boot_is_flagged_confounded_and_boots_add_a_component() -> None:
    one = speed_test(campaign(1.1))
    assert one.boot_confounded and "cannot be told" in one.confounding
    rng = np.random.default_rng(5)
    data = campaign(1.1, boots=4, seed=5)
    offsets = np.exp(0.3 * rng.standard_normal((4, 1, 1)))  # a large offset per boot
    shifted = PairedLatencies(data.reference * offsets, data.candidate, BLOCKS, IDS)
    two = speed_test(shifted)
    plain = speed_test(data)
    assert not two.boot_confounded and two.n_boots == 4
    assert two.components.boot_var > 0 and two.components.boot_share > 0.5
    assert two.gating.se_log > 2 * plain.gating.se_log
    assert two.gating.df < 4


def test_components_split_prompt_variation_from_pass_noise() -> None:
    rng = np.random.default_rng(6)
    stable = campaign(1.0, noise=0.01, gains=np.exp(rng.normal(0, 0.4, 21)))
    noisy = campaign(1.0, noise=0.4, seed=6)
    assert speed_test(stable).components.time_share < 0.2
    assert speed_test(noisy).components.time_share > 0.8


def test_too_few_prompts_or_bad_arguments_are_refused() -> None:
    data = campaign(1.1)
    one = PairedLatencies(data.reference[..., :1], data.candidate[..., :1], BLOCKS[:1], IDS[:1])
    with pytest.raises(SpeedError, match="too few"):
        speed_test(one)
    with pytest.raises(SpeedError):
        speed_test(data, threshold=0.0)
    with pytest.raises(SpeedError):
        speed_test(data, metric="median")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- drift


def slowed(data: PairedLatencies, factor: float, everyone: bool = True) -> PairedLatencies:
    """``data`` with its second pass slowed by ``factor`` (for the reference alone: a bias)."""
    slow = np.array([1.0, factor])[None, :, None]
    return PairedLatencies(data.reference * slow, data.candidate * (slow if everyone else 1.0),
                           BLOCKS, IDS)


def drift_of(data: PairedLatencies) -> Drift:
    drift = drift_check([(data.reference, BLOCKS), (data.candidate, BLOCKS)])
    assert drift is not None
    return drift


def test_a_pass_slowed_for_everyone_is_caught_noted_and_cancels() -> None:
    data = campaign(1.2, noise=0.05, passes=2, seed=7)
    shifted = slowed(data, 1.4)
    drift = drift_of(shifted)
    assert drift.unstable and drift.series == ""  # every condition: the pooled test names none
    assert drift.estimate == pytest.approx(1.4, rel=0.1) or drift.estimate == pytest.approx(
        1 / 1.4, rel=0.1)
    assert drift.ci_low <= drift.estimate <= drift.ci_high
    assert drift.bias_bound < 1.1  # both conditions slowed alike: the ratio is untouched
    assert drift.changed == ()  # nor did the paired ratio move in any pass
    res = speed_test(shifted, drift=drift)
    assert res.outcome == "pass" and not res.reason
    assert res.drift_adjusted == res.gating
    assert any(n.startswith("unstable environment: every condition ran")
               and "the comparison stands" in n for n in res.notes)
    calm = drift_of(data)
    assert not calm.unstable and speed_test(data, drift=calm).outcome == "pass"


def test_a_pass_slowed_for_the_reference_alone_cannot_buy_a_keep(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the baseline slowed in one pass: the speedup is biased upward, by half the change
    with two passes. (The serial term already widens the interval here - a whole pass off
    moves its units together - so it is switched off to test the drift rule alone.) No real
    speedup: the interval clears 1.0 on the bias alone; the ratio moved in both passes (two
    cannot tell which), and without either the keep does not hold: held back, named."""
    monkeypatch.setattr(variance, "SERIAL_BELOW", 0)
    biased = slowed(campaign(1.0, noise=0.05, passes=2, seed=8), 1.6, everyone=False)
    drift = drift_check([(biased.reference, BLOCKS), (biased.candidate, BLOCKS)],
                        names=("base", "cand"))
    assert drift is not None and drift.unstable and drift.series == "base"
    assert drift.bias_bound == pytest.approx(1.6, rel=0.15)
    assert drift.changed == ((0, 0), (0, 1))
    res = speed_test(biased, drift=drift)
    assert res.gating.outcome == "pass"  # the bias alone clears the threshold
    assert res.outcome == "inconclusive" and res.held_back == "unstable_environment"
    assert res.reason.startswith("unstable environment: base ran +6")  # +60% in pass 2
    assert "the keep does not hold on the drift-adjusted speedup" in res.reason
    assert res.drift_adjusted is not None and res.drift_adjusted.outcome != "pass"
    # The serial term on its own does not keep it either.
    monkeypatch.setattr(variance, "SERIAL_BELOW", 8)
    assert speed_test(biased).outcome != "pass"


def test_a_keep_whose_margin_dwarfs_the_bias_stands_with_a_note(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(variance, "SERIAL_BELOW", 0)  # the drift rule alone
    shifted = slowed(campaign(2.0, noise=0.05, passes=2, seed=7), 1.3, everyone=False)
    drift = drift_of(shifted)
    assert drift.unstable and drift.bias_bound == pytest.approx(1.3, rel=0.1)
    res = speed_test(shifted, drift=drift)
    assert res.outcome == "pass" and not res.reason
    assert res.drift_adjusted is not None and res.drift_adjusted.ci_low > 1.0
    assert any("the verdict holds on the drift-adjusted speedup" in n for n in res.notes)
    # The same campaign against a minimum only the change could clear is held back.
    near = speed_test(shifted, threshold=2.0, drift=drift)
    assert near.gating.outcome == "pass" and near.outcome == "inconclusive"


def test_a_drop_is_held_to_the_same_drift_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidate alone slowed in one pass: the speedup is biased down. A drafter at the
    threshold looks confidently slower on the bias alone; the drop must not stand."""
    monkeypatch.setattr(variance, "SERIAL_BELOW", 0)
    data = campaign(1.0, noise=0.05, passes=2, seed=8)
    slow = np.array([1.0, 1.6])[None, :, None]
    biased = PairedLatencies(data.reference, data.candidate * slow, BLOCKS, IDS)
    drift = drift_of(biased)
    assert drift.unstable and drift.changed
    assert speed_test(biased).outcome == "fail"  # without the drift rule: a drop
    res = speed_test(biased, drift=drift)
    assert res.outcome == "inconclusive" and "the drop does not hold" in res.reason


def test_drift_needs_two_pass_instances() -> None:
    data = campaign(1.0, passes=1)
    assert drift_check([(data.reference, BLOCKS)]) is None


# --------------------------------------------------------------------------- early stopping


def test_boundaries_match_published_obrien_fleming_values() -> None:
    info = [0.25, 0.5, 0.75, 1.0]
    spent = [2 * stats.norm.sf(stats.norm.isf(0.0125) / math.sqrt(t)) for t in info]
    assert spending_bounds(info, spent) == pytest.approx([4.333, 2.963, 2.359, 2.014], abs=2e-3)
    assert sequential_plan(1).keep == pytest.approx((1.959964,), abs=1e-5)


def test_plan_spends_alpha_and_stops_only_where_it_cannot_settle() -> None:
    plan = sequential_plan(4, futility_power=0.2)
    assert list(plan.keep) == sorted(plan.keep, reverse=True)  # strict early, lenient late
    assert plan.stop[-1] == 0.0 and all(s > 0 for s in plan.stop[:-1])
    z = np.array([3.5, 0.2, -3.5, 1.5, -2.6])
    assert decide(z, plan, 1).tolist() == [2, 1, 0, -1, -1]
    assert decide(z, plan, 4).tolist() == [2, 1, 0, 1, 0]  # the last look always decides
    assert sequential_plan(4, futility_power=0.0).stop == (0.0,) * 4


def test_sequential_look_on_real_data() -> None:
    plan = sequential_plan(2)
    strong = campaign(2.0, noise=0.05, seed=8)
    look = sequential_look(strong.upto(max_pass=1), plan, 1)
    assert look.decision == "keep" and "KEEP at look 1/2" in look.summary()
    null = campaign(1.0, noise=0.2, seed=9)
    assert sequential_look(null, plan, 2).decision in ("inconclusive", "drop", "keep")
    with pytest.raises(SpeedError):
        sequential_look(null, plan, 3)


# --------------------------------------------------------------------------- advice


def test_advice_only_for_inconclusive_results_and_prefers_the_cheaper_option() -> None:
    assert advise(speed_test(campaign(2.0, noise=0.05))) is None
    res = speed_test(campaign(1.15, noise=0.3, seed=10))
    assert res.outcome == "inconclusive"
    a = advise(res, levels=2)
    assert a is not None
    lo, mid, hi = a.more_prompts
    assert mid is not None and lo is not None and lo <= mid
    assert hi is None or mid <= hi
    assert a.speedups[0] >= a.speedups[1] >= a.speedups[2]
    assert a.better in ("prompts", "passes") and a.better in a.text


# --------------------------------------------------------------------------- latency bound


def test_percentile_bound_verdicts() -> None:
    rng = np.random.default_rng(11)
    values = np.exp(rng.normal(0, 0.3, (60, 2)))
    units = np.repeat(np.arange(60), 2)
    b = latency_bound(values.ravel(), units, 0.9, limit=10.0)
    assert b.outcome == "pass" and b.estimate <= b.bound < 10.0
    assert latency_bound(values.ravel(), units, 0.9, limit=0.5).outcome == "fail"
    assert b.n_units == 60 and 60 <= b.effective_n <= 120


def test_percentile_bound_counts_prompts_not_repetitions() -> None:
    """21 prompts each replayed 4 times alike: 21 units cannot bound a p90 at 95%, 84
    independent requests could (0.9^84 < 0.05); the bound must say it cannot."""
    base = np.exp(np.random.default_rng(12).normal(0, 0.6, 21))
    values = np.repeat(base, 4)
    b = latency_bound(values, np.repeat(np.arange(21), 4), 0.9, limit=100.0)
    assert math.isinf(b.bound) and b.outcome == "inconclusive"
    assert b.effective_n < 22


def test_percentile_bound_refuses_bad_input() -> None:
    with pytest.raises(BoundError):
        latency_bound([], [], 0.9, 1.0)
    with pytest.raises(BoundError):
        latency_bound([1.0, math.nan], [0, 1], 0.9, 1.0)
    with pytest.raises(BoundError):
        latency_bound([1.0, 2.0], [0, 1], 1.5, 1.0)


def test_a_look_without_degrees_of_freedom_decides_nothing() -> None:
    """The first pass of a level whose one block holds the whole trace is one time unit:
    its test has no df, so the look neither keeps nor stops for futility; it continues
    (inconclusive at the last look)."""
    plan = sequential_plan(4)
    z = np.array([0.0, 9.0, -9.0])
    assert decide(z, plan, 1).tolist() == [1, 2, 0]  # with df: futility stop, keep, drop
    assert decide(z, plan, 1, np.zeros(3)).tolist() == [-1, -1, -1]
    assert decide(z, plan, 4, np.zeros(3)).tolist() == [1, 1, 1]
    assert decide(z, plan, 1, np.full(3, 7.0)).tolist() == [1, 2, 0]


def test_futility_reads_the_trend_on_the_t_scale() -> None:
    """A t of 0.86 on one df has z = 0.60, under the first look's stop (|t| < 0.68 for 4
    looks): read from z the campaign stopped, read from t it continues; with many df t and z
    agree and it stops. ``t_from_z`` inverts the p-value mapping of the deciding t-test."""
    from pytest_osprey.judgement.speed.sequential import t_from_z, z_from_p
    from pytest_osprey.judgement.speed.speedup import p_value

    plan = sequential_plan(4)
    t = np.array([0.86, -0.86, 0.5])
    z = z_from_p(p_value(t, np.ones(3)))
    assert z[0] < plan.stop[0] < t[0]
    assert t_from_z(z, np.ones(3)) == pytest.approx(t, abs=1e-9)
    assert t_from_z(z, None) is z
    assert decide(z, plan, 1).tolist() == [1, 1, 1]  # z alone: all under the stop
    assert decide(z, plan, 1, np.ones(3)).tolist() == [-1, -1, 1]
    assert decide(np.array([0.6]), plan, 1, np.array([200.0])).tolist() == [1]


def test_records_of_a_cycled_x32_campaign_give_a_usable_interval() -> None:
    """Records laid out as the runner writes them from the plan (x32 on 50 prompts, 4 passes:
    two blocks of 32 a pass, repeats included), judged from the records: the copies become
    cells, 8 time units give df 7 and a finite interval around a true 1.3x (fixed blocks
    had one block, df 0)."""
    from pytest_osprey.campaign.schedule import plan_facts, plan_replay
    from pytest_osprey.judgement.speed.gate import paired
    from testkit.factories import make_record, saved_campaign

    ids = [f"p{i:02d}" for i in range(50)]
    plan = plan_replay(ids, ["base", "cand"], {"x32": 32}, passes=4, seed=1)
    rng = np.random.default_rng(9)
    base = dict(zip(ids, np.exp(rng.normal(0.0, 0.5, 50)), strict=True))
    records = []
    for s in plan.stretches:
        shock = math.exp(0.05 * rng.standard_normal())  # shared by the stretch
        factor = 1.0 if s.condition == "base" else 1 / 1.3
        for pid in s.prompt_ids:  # (the runner also records each occurrence's ``copy``)
            e2e = float(base[pid] * factor * shock * math.exp(0.1 * rng.standard_normal()))
            records.append(make_record(s.condition, pid, block=s.block, repetition=s.pass_index,
                                       load="x32", concurrency=32, boot=s.boot,
                                       stretch=s.index, e2e_s=e2e))
    assert len(records) == 2 * 4 * 64
    data = paired(saved_campaign(records, plan=plan_facts(plan)), "base", "cand", "x32")
    res = speed_test(data, threshold=1.0)
    assert res.n_prompts == 50 and res.n_time_units == 8 and res.gating.df == 7
    assert 1.0 < res.gating.ci_low < 1.3 < res.gating.ci_high < 1.6
    assert res.outcome == "pass"


def test_drift_adjusted_survives_a_left_out_boot_that_leaves_no_degree_of_freedom() -> None:
    """Two boots of one pass, one block: leaving either out leaves one boot, an interval of
    [0, inf]. The widest is that one (an interim look of a six-boot plan met it and the
    campaign stopped on a math domain error)."""
    rng = np.random.default_rng(1)
    base = np.exp(rng.normal(0, 0.3, (2, 1, 8)))
    cand = base / 2.0 * np.exp(rng.normal(0, 0.05, (2, 1, 8)))
    data = PairedLatencies(base, cand, np.zeros(8, dtype=np.int64),
                           tuple(f"p{i}" for i in range(8)))
    res = drift_adjusted(data, ((0, 0), (1, 0)), "per_prompt", math.log(1.2), 0.025,
                         "inconclusive")
    assert res is not None and res.ci_low == 0.0 and math.isinf(res.ci_high)
    assert res.outcome == "inconclusive"
