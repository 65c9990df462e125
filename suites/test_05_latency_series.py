"""Latency series for pytest-benchmark: each condition and load level's recorded completion
latencies and TTFTs as a benchmark, so ``--benchmark-json`` and ``pytest-benchmark compare``
work on the pilot's measurements (nothing is re-timed)."""

from __future__ import annotations

import statistics

import pytest

from pytest_osprey.report.series import ReplayClock, SeriesSpec, series_values
from pytest_osprey.results import SavedCampaign

REPLAY = ReplayClock()


@pytest.mark.osprey(kind="series")
@pytest.mark.benchmark(timer=REPLAY, disable_gc=False, warmup=False)
def test_latency_series(
    osprey_series: SeriesSpec, osprey_campaign: SavedCampaign, request: pytest.FixtureRequest
) -> None:
    """The recorded series, replayed into pytest-benchmark one request per round."""
    values = series_values(osprey_campaign, osprey_series)
    if not values:
        pytest.skip(f"{osprey_series.condition} at load {osprey_series.load}: "
                    "no successful request recorded")
    try:
        benchmark = request.getfixturevalue("benchmark")
    except pytest.FixtureLookupError:
        pytest.skip("pytest-benchmark is not active (installed? not disabled by -p no:benchmark?)")
    benchmark.group = osprey_series.group
    benchmark.extra_info.update(
        condition=osprey_series.condition, load=osprey_series.load,
        metric=osprey_series.metric, unit="s", run_id=osprey_campaign.meta.run_id,
        trace_hash=osprey_campaign.meta.trace_hash,
    )  # fmt: skip
    REPLAY.load(values)
    benchmark.pedantic(REPLAY.step, rounds=len(values), iterations=1, warmup_rounds=0)
    if benchmark.disabled:  # --benchmark-disable: one call, nothing recorded
        return
    assert REPLAY.remaining == 0, "every recorded value went into the benchmark"
    stats = benchmark.stats.stats
    assert stats.rounds == len(values)
    assert stats.median == pytest.approx(statistics.median(values), rel=1e-9, abs=1e-12)
