"""Speed verdicts at low load under noise a unit-clustered test reads as independent draws
(seeded, small: benchmarks/low_load_calibration.py runs the same at full size).

* per-server stalls: one condition's server slowed for 2-8 consecutive requests (at x1 that
  is as many consecutive time units);
* smooth drift of +-25% shared by both conditions, with stalls and heavy-tailed (Pareto)
  stretch shocks;
* a planted stall the scan must name, and stall-free noise it must leave alone.

Rates are judged by exact binomial tests at the 0.1% level, as in test_speed_simulation.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from pytest_osprey.judgement.speed.data import Request, collect
from pytest_osprey.judgement.speed.drift import drift_batch, drift_check
from pytest_osprey.judgement.speed.speedup import PairedLatencies, speed_batch, speed_test
from pytest_osprey.judgement.speed.stalls import stall_scan
from testkit.speed_sim import (
    KEEP,
    Campaigns,
    Design,
    fixed_outcomes,
    low_load_models,
    noise_models,
    simulate,
)

SIG = 0.001
ALPHA = 0.025
LOW = low_load_models()
X1 = Design(prompts=21, levels=(("low", 1),), primary="low", passes=4)
X4 = replace(X1, levels=(("low", 4),))


def assert_rate_at_most(hits: int, n: int, rate: float, what: str) -> None:
    p = stats.binomtest(hits, n, rate, alternative="greater").pvalue
    assert p > SIG, f"{what}: {hits}/{n} = {hits / n:.4f} is significantly above {rate}"


def assert_rate_at_least(hits: int, n: int, rate: float, what: str) -> None:
    p = stats.binomtest(hits, n, rate, alternative="less").pvalue
    assert p > SIG, f"{what}: {hits}/{n} = {hits / n:.4f} is significantly below {rate}"


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize(("model", "design"), [
    ("stalls5%", X1), ("stalls10%", X1), ("mixture", X1), ("stalls5%", X4), ("stalls10%", X4),
])
def test_false_keep_at_the_threshold_under_per_server_stalls(model: str, design: Design) -> None:
    """A true 1.0x against a 1.0x minimum: unit-clustered, a stall spanning several units
    is several independent draws (false keep ~15% at x1); the serial term counts it once
    (prewhitened: unprewhitened, 10% stalls at x4 gave 3.35% at 4000 campaigns)."""
    n = 600
    c = simulate(design, LOW[model], 1.0, n, seed=11 + len(model))
    keeps = int(np.sum(fixed_outcomes(c, 1.0) == KEEP))
    assert_rate_at_most(keeps, n, ALPHA, f"false keep, {model}, x{design.levels[0][1]}")


def test_the_serial_variance_matches_the_spread_of_the_estimate_under_stalls() -> None:
    """The variance's mean over campaigns against the estimates' own variance: within 25%
    (unit-clustered it is a quarter of it at x1)."""
    c = simulate(X1, LOW["stalls5%"], 1.0, 1500, seed=5)
    b = speed_batch(c.reference["low"], c.candidate["low"], c.units["low"], "per_prompt")
    ratio = float(np.var(b.log_estimate) / np.mean(b.var))
    assert 0.8 < ratio < 1.25, ratio
    assert np.all(b.serial > 0) and np.all(b.df < 20)  # on at x1, df from its clusters


def test_power_at_1_5x_under_shared_drift_and_stalls() -> None:
    """+-25% drift shared by both conditions, stalls and Pareto shocks: the drift check
    fires, but the drift cancels in the pairs; judged on the paired comparison a 1.5x
    drafter is kept (judged on the baseline alone: ~40%)."""
    n = 300
    c = simulate(X1, LOW["mixture"], 1.5, n, seed=23)
    keeps = int(np.sum(fixed_outcomes(c, 1.0) == KEEP))
    assert_rate_at_least(keeps, n, 0.7, "power at 1.5x, mixture at x1")


def test_shared_drift_alone_does_not_withhold_a_verdict() -> None:
    n = 300
    c = simulate(X1, LOW["drift25%"], 1.5, n, seed=29)
    assert_rate_at_least(int(np.sum(fixed_outcomes(c, 1.0) == KEEP)), n, 0.95,
                         "power at 1.5x under +-25% shared drift")


@pytest.mark.parametrize("model", ["independent", "reference", "mixed", "heavy-t3"])
def test_the_stall_scan_rarely_fires_without_stalls(model: str) -> None:
    n = 600
    noise = noise_models()[model]
    c = simulate(X1, noise, 1.0, n, seed=31 + len(model))
    found = stall_scan(c.reference["low"], c.candidate["low"], c.units["low"]).found
    assert_rate_at_most(int(found.sum()), n, 0.03, f"stall alarm on {model}")


def test_the_stall_scan_names_a_planted_stall() -> None:
    """Six consecutive requests of the candidate 2.5x slower (x1: six consecutive units):
    found, on the right side, overlapping the planted run, its size near 2.5x."""
    n = 200
    c = simulate(X1, noise_models()["independent"], 1.2, n, seed=37)
    ref, cand, units = c.reference["low"], c.candidate["low"].copy(), c.units["low"]
    rng = np.random.default_rng(3)
    start = rng.integers(0, 84 - 6, n)
    hit = (units >= start[:, None, None, None]) & (units < start[:, None, None, None] + 6)
    cand[hit] *= 2.5
    scan = stall_scan(ref, cand, units)
    assert_rate_at_least(int(scan.found.sum()), n, 0.9, "planted stall found")
    ok = scan.found
    overlap = (scan.first[ok] < start[ok] + 6) & (scan.first[ok] + scan.length[ok] > start[ok])
    assert np.all(scan.side[ok] == 1) and overlap.mean() > 0.95
    assert np.median(scan.size[ok]) == pytest.approx(2.5, rel=0.2)


def test_speed_test_reports_the_stall_it_finds() -> None:
    c = simulate(X1, noise_models()["independent"], 1.2, 1, seed=41)
    ref, cand = c.reference["low"][0], c.candidate["low"][0]
    units = c.units["low"][0]
    ref = np.where((units >= 30) & (units < 36), ref * 2.5, ref)
    data = PairedLatencies(ref, cand, c.blocks["low"], tuple(f"p{i}" for i in range(21)),
                           units)
    res = speed_test(data)
    assert res.stall is not None and res.stall.side == "reference"
    assert res.stall.first_unit <= 36 and res.stall.last_unit >= 31  # 1-based
    assert res.stall.passes[0] == (1, 2)  # units 30-35: the second pass of 21 units each
    assert "base stalled" in res.stall.text("base", "cand")
    assert res.serial_clusters > 0


def test_the_scan_measures_a_long_stall_whole() -> None:
    """A stall of 20 consecutive requests of the candidate (x1: 20 units) is found by its
    most marked 2-8 units and then extended over its slow neighbours: the extent named is
    the planted one, not the 8 units the scan tries."""
    n = 200
    c = simulate(X1, noise_models()["independent"], 1.2, n, seed=43)
    ref, cand, units = c.reference["low"], c.candidate["low"].copy(), c.units["low"]
    start = np.random.default_rng(5).integers(0, 84 - 20, n)
    hit = (units >= start[:, None, None, None]) & (units < start[:, None, None, None] + 20)
    cand[hit] *= 2.0
    scan = stall_scan(ref, cand, units)
    ok = scan.found
    assert_rate_at_least(int(ok.sum()), n, 0.9, "planted 20-unit stall found")
    assert 17 <= np.median(scan.length[ok]) <= 23
    inside = (scan.first[ok] >= start[ok] - 2) & (scan.first[ok] + scan.length[ok]
                                                  <= start[ok] + 22)
    assert inside.mean() > 0.9
    assert np.median(scan.size[ok]) == pytest.approx(2.0, rel=0.15)


@pytest.mark.parametrize(("length", "outlasts"), [(6, False), (20, True)])
def test_a_stall_longer_than_the_serial_reach_is_said_to_narrow_the_interval(
        length: int, outlasts: bool) -> None:
    c = simulate(X1, noise_models()["independent"], 1.2, 1, seed=47)
    ref, cand = c.reference["low"][0], c.candidate["low"][0]
    units = c.units["low"][0]
    ref = np.where((units >= 30) & (units < 30 + length), ref * 2.5, ref)
    data = PairedLatencies(ref, cand, c.blocks["low"], tuple(f"p{i}" for i in range(21)),
                           units)
    res = speed_test(data)
    assert res.stall is not None and res.stall.reach == 11  # 10 requests at x1, 84 units
    assert res.stall.outlasts_reach is outlasts
    assert abs(res.stall.units - length) <= 2
    text = res.stall.text("base", "cand")
    if outlasts:
        assert "longer than the 11 units the serial term reaches" in text
        assert "interval may be too narrow" in text
    else:
        assert "counted once by the serial term" in text


def test_collect_numbers_time_units_in_the_order_they_ran() -> None:
    """A pass replays its blocks in a shuffled order: the units follow the stretches."""
    reqs = [Request(cond, pid, 1.0, True, 0, p, blk, stretch)
            for p, order in ((0, (1, 0)), (1, (0, 1)))
            for k, blk in enumerate(order)
            for cond, s in (("base", 0), ("cand", 1))
            for pid in (("a",) if blk == 0 else ("b",))
            for stretch in (p * 4 + k * 2 + s,)]
    data = collect(reqs, "base", "cand")
    units = data.time_units[0]  # (passes, prompts a, b)
    assert units[0].tolist() == [1, 0]  # pass 1 ran block 1 (prompt b) first
    assert units[1].tolist() == [2, 3]


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_stall_across_passes_does_not_fire_the_drift_rule_on_shared_drift() -> None:
    """Drift shared by both conditions: the drift check fires, yet no pass changed the
    comparison, so the keep stands with the paired comparison shown."""
    c = simulate(X1, LOW["drift25%"], 1.5, 40, seed=43)
    kept = 0
    for s in range(40):
        ref, cand = c.reference["low"][s], c.candidate["low"][s]
        units = c.units["low"][s]
        drift = drift_check([(ref, units), (cand, units)])
        data = PairedLatencies(ref, cand, c.blocks["low"], tuple(f"p{i}" for i in range(21)),
                               units)
        res = speed_test(data, drift=drift)
        if drift is not None and drift.unstable:
            assert res.drift_adjusted is not None
        kept += res.outcome == "pass"
    assert kept >= 36


def ratio_flags(c: Campaigns) -> npt.NDArray[np.bool_]:
    """Per campaign: did the paired-ratio drift test alone flag some pass (x1 design)."""
    series = [(c.reference["low"], c.units["low"]), (c.candidate["low"], c.units["low"])]
    return np.asarray(drift_batch(series).ratio_changed.any(axis=1))


def test_the_paired_ratio_drift_test_counts_a_stall_once_at_x1() -> None:
    """Stalls of either server move the ratio of consecutive x1 units together: read as
    independent units, the ratio test alone flagged a pass in ~36% of campaigns at 10% stall
    onset (true 1.0x); read as a time series, ~16%."""
    n = 300
    c = simulate(X1, LOW["stalls10%"], 1.0, n, seed=71)
    assert_rate_at_most(int(ratio_flags(c).sum()), n, 0.25, "ratio test flags stalls")


def test_the_paired_ratio_drift_test_still_catches_a_pass_slowed_for_one_condition() -> None:
    n = 200
    noise = replace(noise_models()["independent"], pass_slowdown=(0.3, 0.7),
                    slowdown_reference_only=True)
    c = simulate(X1, noise, 1.0, n, seed=73)
    assert_rate_at_least(int(ratio_flags(c).sum()), n, 0.9, "ratio test catches a pass")
