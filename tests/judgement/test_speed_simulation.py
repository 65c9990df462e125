"""Monte-Carlo validation of the speed gate under time-correlated noise (seeded, small).

Campaigns are drawn through the real replay planner by ``testkit/speed_sim.py`` (the
calibration benchmark runs the same at >= 2000 campaigns per cell). Rates are judged with
exact binomial tests at the 0.1% level and means with 3 Monte-Carlo standard errors, so a
failure means the method, not the dice, is off.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.judgement.service.latency_bound import latency_bound
from pytest_osprey.judgement.speed import variance
from pytest_osprey.judgement.speed.advice import advise
from pytest_osprey.judgement.speed.speedup import PairedLatencies, speed_test
from testkit.speed_sim import (
    BOOT_NOISE,
    KEEP,
    REFERENCE_NOISE,
    SHIPPED,
    Design,
    Noise,
    fixed_outcomes,
    noise_models,
    sequential_outcomes,
    simulate,
    unstable,
)

SIG = 0.001
ALPHA = 0.025
MODELS = noise_models()


def assert_rate_at_most(hits: int, n: int, rate: float, what: str) -> None:
    p = stats.binomtest(hits, n, rate, alternative="greater").pvalue
    assert p > SIG, f"{what}: {hits}/{n} = {hits / n:.4f} is significantly above {rate}"


def assert_rate_at_least(hits: int, n: int, rate: float, what: str) -> None:
    p = stats.binomtest(hits, n, rate, alternative="less").pvalue
    assert p > SIG, f"{what}: {hits}/{n} = {hits / n:.4f} is significantly below {rate}"


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize(("model", "metric", "prompts"), [
    ("ar0.3+shock5%", "per_prompt", 21), ("burst4", "per_prompt", 21),
    ("inflight@4", "per_prompt", 21), ("long-memory", "per_prompt", 50),
    ("mixed", "per_prompt", 50), ("reference", "total_time", 21),
    ("ar0.3+shock5%", "total_time", 50),
])
def test_false_keep_at_the_threshold_under_time_correlated_noise(
    model: str, metric: str, prompts: int
) -> None:
    n = 600
    c = simulate(replace(SHIPPED, prompts=prompts), MODELS[model], 1.1, n,
                 seed=sum(map(ord, model)), truth=metric)  # type: ignore[arg-type]
    keeps = int(np.sum(fixed_outcomes(c, 1.1, metric) == KEEP))  # type: ignore[arg-type]
    assert_rate_at_most(keeps, n, ALPHA, f"{model}/{metric}/{prompts}")


@pytest.mark.slow  # over a second on 2 busy cores
def test_boot_offsets_need_two_boots() -> None:
    """One boot: a boot offset is indistinguishable from the drafter (flagged, and false keep
    runs far above alpha). Two boots: the between-boot component holds the level."""
    n = 600
    one = simulate(SHIPPED, BOOT_NOISE, 1.0, n, seed=21)
    assert np.mean(fixed_outcomes(one, 1.0) == KEEP) > 4 * ALPHA
    two = simulate(replace(SHIPPED, boots=2, passes=2, prompts=50), BOOT_NOISE, 1.0, n, seed=22)
    assert_rate_at_most(int(np.sum(fixed_outcomes(two, 1.0) == KEEP)), n, ALPHA, "two boots")


def test_shipped_design_power_at_1_5x() -> None:
    n = 400
    c = simulate(SHIPPED, REFERENCE_NOISE, 1.5, n, seed=31)
    assert_rate_at_least(int(np.sum(fixed_outcomes(c, 1.0) == KEEP)), n, 0.8, "power at 1.5x")


@pytest.mark.slow  # over a second on 2 busy cores
def test_early_stopping_keeps_alpha_and_saves_requests_at_1_2x() -> None:
    n = 600
    null = simulate(SHIPPED, REFERENCE_NOISE, 1.0, n, seed=41)
    code, _ = sequential_outcomes(null, 1.0)
    assert_rate_at_most(int(np.sum(code == KEEP)), n, ALPHA, "sequential false keep")
    faster = simulate(SHIPPED, REFERENCE_NOISE, 1.2, n, seed=42)
    code, used = sequential_outcomes(faster, 1.0)
    share = used / SHIPPED.passes
    # 0.66 of the passes before the serial term (low load: units read as a time series),
    # which costs the early looks at x4 part of their power: 0.74 since.
    assert share.mean() - 3 * share.std() / math.sqrt(n) <= 0.75, f"used {share.mean():.3f}"
    assert np.mean(code == 0) < 0.01  # a faster drafter is (almost) never dropped


@pytest.mark.parametrize("model", ["independent", "ar0.3+shock5%", "burst4", "slow10%x3",
                                   "heavy-t3", "switch"])
def test_drift_check_rarely_fires_on_stable_noise(model: str) -> None:
    n = 400
    c = simulate(SHIPPED, MODELS[model], 1.2, n, seed=51)
    assert_rate_at_most(int(np.sum(unstable(c))), n, 0.01, f"drift alarm on {model}")


# Blocks re-drawn every pass: an instance's ranks are clustered by its own time units.
HIGH = Design(prompts=50, levels=(("low", 1), ("high", 32)), primary="high", passes=4)


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("model", ["independent", "ar0.3+shock5%", "burst4", "inflight@4",
                                   "reference"])
def test_drift_check_rarely_fires_on_stable_noise_at_x32(model: str) -> None:
    n = 300
    c = simulate(HIGH, MODELS[model], 1.2, n, seed=53)
    assert_rate_at_most(int(np.sum(unstable(c))), n, 0.01, f"drift alarm on {model} at x32")


@pytest.mark.parametrize("model", ["independent", "reference"])
def test_drift_check_catches_a_slowed_pass_at_x32(model: str) -> None:
    n = 200
    c = simulate(HIGH, replace(MODELS[model], pass_slowdown=(0.3, 0.7)), 1.2, n, seed=63)
    assert_rate_at_least(int(np.sum(unstable(c))), n, 0.95, f"drift caught on {model} at x32")


@pytest.mark.parametrize("model", ["independent", "reference", "mixed"])
def test_drift_check_catches_a_pass_slowed_30_to_70_percent(model: str) -> None:
    n = 300
    noise = replace(MODELS[model], pass_slowdown=(0.3, 0.7))
    c = simulate(SHIPPED, noise, 1.2, n, seed=61)
    assert_rate_at_least(int(np.sum(unstable(c))), n, 0.95, f"drift caught on {model}")


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize(("model", "passes"), [
    ("independent", 2), ("independent", 4), ("reference", 4), ("mixed", 4),
])
def test_a_pass_slowed_for_the_reference_alone_cannot_buy_a_keep(model: str, passes: int) -> None:
    """A bias, not noise: one pass of the reference alone runs 30-70% slower, so the speedup
    of a drafter that gains nothing is inflated. Unchecked, that buys false keeps far above
    alpha; the drift check must hold them back (the fixed design: a group-sequential look
    taken before the second pass has nothing to compare that pass with)."""
    n = 600
    noise = replace(MODELS[model], pass_slowdown=(0.3, 0.7), slowdown_reference_only=True)
    c = simulate(replace(SHIPPED, passes=passes), noise, 1.0, n, seed=passes + len(model))
    # The fault bites a test that reads the time units as independent (the serial term
    # counts part of it already: a whole pass off moves its units together).
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(variance, "SERIAL_BELOW", 0)
        assert np.mean(fixed_outcomes(c, 1.0, drift=False) == KEEP) > 4 * ALPHA
    keeps = int(np.sum(fixed_outcomes(c, 1.0) == KEEP))
    assert_rate_at_most(keeps, n, ALPHA, f"reference-only slow pass, {model}, {passes} passes")


@pytest.mark.parametrize("model", ["independent", "reference", "mixed"])
def test_a_pass_slowed_for_everyone_does_not_cost_a_clear_keep(model: str) -> None:
    """Every condition 20-40% slower in one pass: the drift check fires, but the change
    cancels in the speedup, so a 1.5x drafter against a 0.6x minimum is still kept."""
    n = 400
    noise = replace(MODELS[model], pass_slowdown=(0.2, 0.4))
    c = simulate(SHIPPED, noise, 1.5, n, seed=81 + len(model))
    assert np.mean(unstable(c)) > 0.5  # the check does fire
    keeps = int(np.sum(fixed_outcomes(c, 0.6) == KEEP))
    assert_rate_at_least(keeps, n, 0.9, f"clear keep under a common slow pass, {model}")


@pytest.mark.slow  # over a second on 2 busy cores
def test_advice_is_right_on_average_at_1_2x() -> None:
    """True need: the fewest prompts giving the fixed design >= 80% power (simulated). The
    median central advice over inconclusive campaigns must be within 2x of it."""
    design = replace(SHIPPED, passes=2)
    need = None
    for prompts in (29, 37, 45, 53, 65):
        c = simulate(replace(design, prompts=prompts), REFERENCE_NOISE, 1.2, 250, seed=prompts)
        if np.mean(fixed_outcomes(c, 1.0, drift=False) == KEEP) >= 0.8:
            need = prompts - design.prompts
            break
    assert need is not None
    c = simulate(design, REFERENCE_NOISE, 1.2, 130, seed=71)
    ids = tuple(f"p{i}" for i in range(design.prompts))
    advice = []
    for i in range(130):
        data = PairedLatencies(c.reference["concurrent"][i], c.candidate["concurrent"][i],
                               c.blocks["concurrent"], ids)
        a = advise(speed_test(data, 1.0), levels=2)
        if a is not None:
            advice.append(a.more_prompts[1] if a.more_prompts[1] is not None else 10**6)
    assert len(advice) > 40
    median = float(np.median(advice))
    assert need / 2 <= median <= 2 * need, f"median advice {median} vs need {need}"


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize(("prompts", "runs"), [(21, 4), (50, 4), (50, 2)])
def test_percentile_bound_covers_with_prompt_effects(prompts: int, runs: int) -> None:
    n = 400
    rng = np.random.default_rng(prompts * 10 + runs)

    def draw(units: int, reps: int) -> np.ndarray:
        return np.exp(0.6 * rng.standard_normal((units, 1))
                      + 0.3 * rng.standard_normal((units, reps)))

    true_p90 = math.exp(stats.norm.ppf(0.9) * math.sqrt(0.6**2 + 0.3**2))
    units = np.repeat(np.arange(prompts), runs)
    misses = sum(latency_bound(draw(prompts, runs).ravel(), units, 0.9, true_p90).bound
                 < true_p90 for _ in range(n))
    assert_rate_at_most(int(misses), n, 0.05, "p90 bound below the true p90")


def test_shock_noise_is_shared_by_a_stretch() -> None:
    """The simulator's shocks really are time-correlated: a block's prompts move together
    between passes (what resampling prompts cannot see, and the cluster variance must)."""
    base = Noise(request_sd=0.01)
    blocks = simulate(SHIPPED, base, 1.0, 2, seed=0).blocks["concurrent"]

    def pass_shift(noise: Noise) -> float:
        lat = np.log(simulate(SHIPPED, noise, 1.0, 200, seed=81).reference["concurrent"])
        first = lat[:, 0, 0, blocks == 0].mean(axis=1)
        second = lat[:, 0, 1, blocks == 0].mean(axis=1)
        return float(np.std(first - second))

    assert pass_shift(base) < 0.02
    assert pass_shift(replace(base, shock_sd=0.2)) == pytest.approx(0.2 * math.sqrt(2), rel=0.2)


# --------------------------------------------------------------------------- any concurrency


def concurrency_design(c: int, passes: int = 4) -> Design:
    """50 prompts at one closed-loop level c (blocks of c, re-drawn every pass)."""
    return Design(prompts=50, levels=((f"x{c}", c),), primary=f"x{c}", passes=passes)


def mc_se(rate: float, n: int) -> float:
    return math.sqrt(rate * (1 - rate) / n)


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("c", [1, 8, 32, 128])
@pytest.mark.parametrize("model", ["ar0.3+shock5%", "inflight@4", "heavy-t3", "mixed"])
def test_false_keep_at_any_concurrency(c: int, model: str) -> None:
    """At a true speedup equal to the threshold, shared-in-time noise included (a stall hits
    every request in flight, x128 cycles the 50-prompt trace): false KEEP of the gate's fixed
    test and of the group-sequential one within alpha + 3 Monte-Carlo s.e. (the benchmark,
    benchmarks/speed_concurrency.py, runs 2000 campaigns per cell against alpha + 2 s.e.)."""
    n = 400
    camp = simulate(concurrency_design(c), MODELS[model], 1.0, n, seed=c * 1000 + len(model),
                    pool_size=32)
    limit = ALPHA + 3 * mc_se(ALPHA, n)
    fixed = float(np.mean(fixed_outcomes(camp, 1.0) == KEEP))
    seq = float(np.mean(sequential_outcomes(camp, 1.0)[0] == KEEP))
    assert fixed <= limit and seq <= limit, (fixed, seq, limit)


def test_power_at_1_3x_on_50_prompts_at_x32() -> None:
    """A true 1.3x, 50 prompts, 4 passes at x32 (two blocks of 32 a pass, 8 time units):
    KEEP in >= 80% of campaigns, fixed and group-sequential, within 3 s.e."""
    n = 300
    camp = simulate(concurrency_design(32), REFERENCE_NOISE, 1.3, n, seed=32, pool_size=32)
    limit = 0.8 - 3 * mc_se(0.8, n)
    assert float(np.mean(fixed_outcomes(camp, 1.0) == KEEP)) >= limit
    assert float(np.mean(sequential_outcomes(camp, 1.0)[0] == KEEP)) >= limit


@pytest.mark.slow  # over a second on 2 busy cores
def test_power_at_1_3x_under_mixed_noise_at_x32_with_early_stopping() -> None:
    """Mixed noise (AR, shocks, bursts, stalls in flight, slow requests, drift), 50 prompts,
    4 passes at x32: early looks have 1, 3 and 5 df. Futility judged on a trend read from z
    stopped a tenth of the campaigns the fixed test keeps (sequential KEEP 0.78 against 0.87
    fixed); read from the look's t statistic it keeps >= 80% at a true 1.3x, while false KEEP
    at a true 1.0 stays <= alpha (binomial tests at the 0.1% level; 4000 campaigns each, so a
    power of 0.78 fails)."""
    n = 4000
    design = concurrency_design(32)
    faster = simulate(design, MODELS["mixed"], 1.3, n, seed=3213, pool_size=64)
    kept = int(np.sum(sequential_outcomes(faster, 1.0)[0] == KEEP))
    assert_rate_at_least(kept, n, 0.80, "sequential power, mixed, x32")
    null = simulate(design, MODELS["mixed"], 1.0, n, seed=3210, pool_size=64)
    false_keep = int(np.sum(sequential_outcomes(null, 1.0)[0] == KEEP))
    assert_rate_at_most(false_keep, n, ALPHA, "sequential false KEEP, mixed, x32")


def test_evidence_grows_with_passes_at_x32() -> None:
    """Blocks re-drawn every pass: time units and df grow with passes (fixed blocks gave
    df = 50 // 32 - 1 = 0 at any number of passes), and the interval narrows."""
    from pytest_osprey.judgement.speed.speedup import speed_batch

    widths, dfs = [], []
    for passes in (2, 4, 8):
        camp = simulate(concurrency_design(32, passes), REFERENCE_NOISE, 1.3, 200, seed=passes,
                        pool_size=16)
        b = speed_batch(camp.reference["x32"], camp.candidate["x32"], camp.units["x32"],
                        "per_prompt")
        dfs.append(set(b.df.tolist()))
        widths.append(float(np.median(stats.t.ppf(0.975, b.df) * np.sqrt(b.var))))
    assert dfs == [{3.0}, {7.0}, {15.0}]  # min(50 prompts, 2 x passes units) - 1
    assert widths[0] > widths[1] > widths[2]
    assert widths[1] < math.log(1.2)  # a usable interval: half-width under 20% at 4 passes


@pytest.mark.slow  # over a second on 2 busy cores
def test_percentile_bound_counts_stalls_shared_in_time_at_x32() -> None:
    """Blocks re-drawn every pass at x32: a stretch shock (sd 0.6) hits 32 prompts at once.
    Clustered by prompt alone the p90 bound undercovers; two-way by prompt and time unit it
    covers. Under the reference noise the two-way bound is finite, where the first pass's
    blocks (2 at x32) carry no information."""
    design = Design(prompts=50, levels=(("low", 1), ("high", 32)), primary="high", passes=4)
    noise = replace(Noise(request_sd=0.10), name="shock60%", shock_sd=0.6)
    true_p90 = float(np.quantile(simulate(design, noise, 1.0, 2000, seed=3)
                                 .reference["high"].ravel(), 0.9))
    c = simulate(design, noise, 1.0, 300, seed=4)
    prompt = np.tile(np.arange(design.prompts), design.passes)
    first_block = np.tile(c.blocks["high"], design.passes)
    by_prompt = two_way = 0
    for lat, units in zip(c.reference["high"], c.units["high"], strict=True):
        values = lat.ravel()
        by_prompt += latency_bound(values, prompt, 0.9, true_p90).bound < true_p90
        two_way += latency_bound(values, prompt, 0.9, true_p90,
                                 time_units=units.ravel()).bound < true_p90
    n = 300
    assert by_prompt / n > 0.10  # the fault bites
    assert_rate_at_most(two_way, n, 0.05, "two-way p90 bound below the true p90")
    usual = simulate(design, REFERENCE_NOISE, 1.0, 50, seed=5)
    finite = [math.isfinite(latency_bound(lat.ravel(), prompt, 0.9, 1.0,
                                          time_units=units.ravel()).bound)
              for lat, units in zip(usual.reference["high"], usual.units["high"], strict=True)]
    blocks = [math.isfinite(latency_bound(lat.ravel(), first_block, 0.9, 1.0).bound)
              for lat in usual.reference["high"]]
    assert np.mean(finite) > 0.9 and np.mean(blocks) < 0.1
