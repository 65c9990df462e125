"""The measured latency series as pytest-benchmark benchmarks.

Each condition and load level's completion latencies (and TTFTs) become one benchmark whose
rounds are the recorded requests, so ``--benchmark-json``, ``--benchmark-autosave`` and
``pytest-benchmark compare`` work on a pilot's measurements. Nothing is re-timed: the
benchmark's timer replays the recorded values (``pedantic`` with one round per request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..pilot.schema import Pilot
from ..results.folder import SavedCampaign

METRICS = ("e2e", "ttft")


@dataclass(frozen=True)
class SeriesSpec:
    condition: str
    load: str
    metric: str  # e2e (completion latency) | ttft (time to first token)

    @property
    def id(self) -> str:
        return f"{self.condition}-{self.load}-{self.metric}"

    @property
    def group(self) -> str:
        # Grouped by load level and metric: one table row per condition, side by side.
        return f"osprey {self.load} {self.metric}"


def series_specs(pilot: Pilot, conditions: Sequence[str]) -> list[SeriesSpec]:
    return [
        SeriesSpec(c, level, m)
        for level in pilot.load.levels
        for m in METRICS
        for c in conditions
    ]


def series_values(data: SavedCampaign, spec: SeriesSpec) -> list[float]:
    """The spec's recorded values (seconds), successful greedy requests, in record order."""
    out: list[float] = []
    for r in data.of(spec.condition, spec.load):
        value = r.e2e_s if spec.metric == "e2e" else r.ttft_s
        if r.ok and value is not None:
            out.append(value)
    return out


class ReplayClock:
    """A pytest-benchmark timer that replays recorded durations.

    The benchmark calls the timer, then :meth:`step`, then the timer again; :meth:`step`
    advances the clock by the next recorded value, so each round measures exactly one.
    """

    __name__ = "recorded_latency"  # what pytest-benchmark names the timer in its JSON

    def __init__(self) -> None:
        self._now = 0.0
        self._values: list[float] = []

    def load(self, values: Sequence[float]) -> None:
        self._values = list(reversed(values))

    @property
    def remaining(self) -> int:
        return len(self._values)

    def step(self) -> None:
        self._now += self._values.pop()

    def __call__(self) -> float:
        return self._now
