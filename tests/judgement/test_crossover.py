"""The crossover (where the speedup falls to the threshold as concurrency grows), validated by
simulation against a known curve: per-level estimates drawn around it, with errors
independent and correlated between levels (shared prompts and boots, noise shared in time),
and the interval's coverage of the known crossing held to the nominal rate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.judgement.gates.kinds import GateKind
from pytest_osprey.judgement.gates.result import GateResult
from pytest_osprey.judgement.gates.spec import GateSpec
from pytest_osprey.judgement.speed.crossover import (
    Crossover,
    LevelSpeedup,
    crossover,
    levels_from_gates,
)
from testkit import crossover_sim

LEVELS = (1, 2, 4, 8, 16, 32, 64, 128)
THRESHOLD = 1.3
CONFIDENCE = 0.95


def _covariance(k: int, se: float, shared: float, kind: str) -> np.ndarray:
    idx = np.arange(k)
    if kind == "ar":  # levels in time order: nearer levels share more of the drift
        rho = shared ** np.abs(idx[:, None] - idx[None, :])
    else:  # one shared factor: the same prompts and boots at every level
        rho = np.where(idx[:, None] == idx[None, :], 1.0, shared)
    return np.asarray(rho * se * se, dtype=np.float64)


def _campaigns(n: int, crossing: float, *, seed: int, se: float = 0.06, slope: float = -0.12,
               curve: float = 0.0, shared: float = 0.0, kind: str = "factor",
               df: float = math.inf, levels: tuple[int, ...] = LEVELS,
               told_shared: float | None = None) -> list[Crossover]:
    """``n`` crossovers from per-level estimates around log S(x) = log thr + slope (x - x*)
    + curve (x - x*)^2, x = log2(c); with finite ``df`` each level's standard error is
    itself estimated (chi-square), as a gate's is."""
    rng = np.random.default_rng(seed)
    x = np.log2(levels)
    xs = math.log2(crossing)
    truth = math.log(THRESHOLD) + slope * (x - xs) + curve * (x - xs) ** 2
    chol = np.linalg.cholesky(_covariance(len(levels), se, shared, kind))
    out = []
    for _ in range(n):
        y = truth + chol @ rng.standard_normal(len(levels))
        if math.isfinite(df):
            s = se * np.sqrt(rng.chisquare(df, len(levels)) / df)
            q = float(stats.t.ppf(0.975, df))
        else:
            s, q = np.full(len(levels), se), 1.959963984540054
        out.append(crossover([
            LevelSpeedup(f"c{c}", c, math.exp(v), math.exp(v - q * si), math.exp(v + q * si),
                         df, shared if told_shared is None else told_shared)
            for c, v, si in zip(levels, y, s, strict=True)], THRESHOLD, CONFIDENCE))
    return out


def _coverage(results: list[Crossover], crossing: float) -> float:
    hits = [(r.ci_low is None or r.ci_low <= crossing)
            and (r.ci_high is None or crossing <= r.ci_high) for r in results]
    return float(np.mean(hits))


def _near_nominal(coverage: float, n: int) -> None:
    se = math.sqrt(CONFIDENCE * (1 - CONFIDENCE) / n)
    assert abs(coverage - CONFIDENCE) <= 3 * se, f"coverage {coverage:.3f}"


N = 1500


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize(("shared", "kind"), [(0.0, "factor"), (0.6, "factor"),
                                                (0.9, "factor"), (0.7, "ar")])
def test_interval_covers_known_crossing(shared: float, kind: str) -> None:
    results = _campaigns(N, 12.0, seed=11, shared=shared, kind=kind)
    _near_nominal(_coverage(results, 12.0), N)
    points = [r.concurrency for r in results if r.concurrency is not None]
    assert len(points) > 0.95 * N
    assert 10 < float(np.median(points)) < 14.5  # the estimate centres on the truth


@pytest.mark.slow  # over a second on 2 busy cores
def test_curved_truth_and_estimated_errors() -> None:
    # Speedup falling faster at high concurrency; each level's SE estimated on 9 df.
    results = _campaigns(N, 24.0, seed=12, curve=-0.03, df=9.0, shared=0.5)
    _near_nominal(_coverage(results, 24.0), N)


@pytest.mark.slow  # over a second on 2 busy cores
def test_crossing_at_a_tested_level_and_steep_fall() -> None:
    _near_nominal(_coverage(_campaigns(N, 8.0, seed=13, slope=-0.3, shared=0.3), 8.0), N)


@pytest.mark.slow  # over a second on 2 busy cores
def test_ignoring_the_shared_share_misstates_the_interval() -> None:
    # The covariance matters: with levels sharing 90% of their error, an interval that
    # treats them as independent is too narrow between levels (the check has teeth).
    told = _coverage(_campaigns(N, 12.0, seed=14, shared=0.9), 12.0)
    ignored = _coverage(_campaigns(N, 12.0, seed=14, shared=0.9, told_shared=0.0), 12.0)
    assert ignored < told - 0.01


def test_crossing_beyond_the_tested_range_is_not_extrapolated() -> None:
    beyond = _campaigns(400, 1000.0, seed=15, slope=-0.05, se=0.03)
    assert np.mean([r.status == "pays_everywhere" for r in beyond]) > 0.9
    assert all(r.concurrency is None and r.ci_high is None for r in beyond
               if r.status == "pays_everywhere")
    assert _coverage(beyond, 1000.0) >= CONFIDENCE - 3 * math.sqrt(0.0475 / 400)
    below = _campaigns(400, 0.25, seed=16, slope=-0.1, se=0.03)
    assert np.mean([r.status == "pays_nowhere" for r in below]) > 0.9
    assert all(r.ci_low is None for r in below if r.status == "pays_nowhere")
    text = next(r for r in beyond if r.status == "pays_everywhere").text()
    assert text.startswith("speculation pays at every level tested (>= x128)")
    assert next(r for r in below if r.status == "pays_nowhere").text().startswith(
        "speculation pays at no level tested (<= x1)")


def _level(c: int, est: float, half: float = 1.08) -> LevelSpeedup:
    return LevelSpeedup(f"c{c}", c, est, est / half, est * half)


def test_crossing_reads_as_a_line() -> None:
    got = crossover([_level(1, 1.9), _level(4, 1.6), _level(16, 1.2), _level(64, 0.9)],
                    THRESHOLD)
    assert got.status == "crosses" and got.concurrency is not None
    assert 8 < got.concurrency < 16
    assert got.ci_low is not None and got.ci_high is not None
    assert got.ci_low < got.concurrency < got.ci_high
    assert got.text().startswith(f"speculation pays up to about x{got.concurrency:.0f} [")
    d = got.as_dict()
    assert d["status"] == "crosses" and d["levels"] == ["c1", "c4", "c16", "c64"]
    assert d["ci"] == [got.ci_low, got.ci_high] and d["concurrency"] == got.concurrency


def test_not_estimable_says_why() -> None:
    two = crossover([_level(1, 1.9), _level(8, 1.1)], THRESHOLD)
    assert two.status == "not_estimable" and "3 or more" in two.reason and two.ci_low is None
    rising = crossover([_level(1, 1.1), _level(4, 1.3), _level(16, 1.6)], THRESHOLD)
    assert rising.status == "not_estimable" and "rises" in rising.reason
    unbounded = crossover([_level(1, 1.9), _level(4, 1.5),
                           LevelSpeedup("c16", 16, 1.2, 0.0, math.inf)], THRESHOLD)
    assert unbounded.status == "not_estimable" and "c16" in unbounded.reason
    assert "2 closed-loop level(s) judged (x1, x4)" in unbounded.reason
    # With three others left, a level without an interval is left out, and said to be.
    rest = crossover([_level(1, 1.9), _level(4, 1.5), _level(16, 1.2),
                      LevelSpeedup("c32", 32, 1.1, 1.1, 1.1)], THRESHOLD)
    assert rest.status == "crosses" and rest.levels == ("c1", "c4", "c16")
    assert rest.reason == "left out (no finite speedup interval): c32"
    twice = crossover([_level(4, 1.9), LevelSpeedup("other", 4, 1.5, 1.4, 1.6), _level(8, 1.2)],
                      THRESHOLD)
    assert twice.status == "not_estimable" and twice.reason == "levels c4 and other share x4"
    with pytest.raises(ValueError, match="out of range"):
        crossover([_level(4, 1.9)], 0.0)


def test_levels_from_gates_reads_the_gate_results() -> None:
    def gate(load: str, est: float, slice_: str | None = None) -> GateResult:
        spec = GateSpec(GateKind.SPEEDUP, "cand", reference="base", load=load, slice=slice_)
        return GateResult(spec, "pass", "", est, est / 1.1, est * 1.1, THRESHOLD,
                          details={"metric": "per_prompt", "per_prompt": {"df": 7.0},
                                   "time_share": 0.4, "shared_share": 0.75})

    gates = [gate("c1", 1.8), gate("c4", 1.5), gate("c4", 1.0, "unusual"), gate("poisson", 1.2),
             gate("c16", 1.1)]
    levels = levels_from_gates(gates, {"c1": 1, "c4": 4, "c16": 16})
    assert [(lv.level, lv.concurrency, lv.df, lv.shared_share) for lv in levels] == [
        ("c1", 1, 7.0, 0.75), ("c4", 4, 7.0, 0.75), ("c16", 16, 7.0, 0.75)]
    assert crossover(levels, THRESHOLD).status == "crosses"


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize(("noise", "boots"), [("ar0.3+shock5%", 1), ("inflight@4", 1),
                                              ("drift", 1), ("boot5%", 2)])
def test_campaigns_with_noise_shared_in_time_cover_the_crossing(noise: str, boots: int) -> None:
    # Through the replay planner: levels x1..x16 interleaved in each pass (drift, boots and
    # prompts common to them), each level judged by the speed gate's own statistics.
    sims = 400
    got = crossover_sim.coverage(crossover_sim.sweep_design(16, boots=boots), noise, 6.0,
                                 -0.17, sims, seed=21)
    _near_nominal(got.coverage, sims)
    assert got.statuses["crosses"] > 0.95 and 5.0 < got.median < 7.0
