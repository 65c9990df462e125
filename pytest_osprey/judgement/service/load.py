"""What load each measured request actually ran under, from the records alone.

A level named x``c`` claims ``c`` requests in flight. Whether it kept that claim is recomputed
from records.jsonl: every request sent (fillers included) occupies the engine from its
submission (``started_at``) to its end (``started_at + e2e_s``); a measured request's load is
the time-averaged number of requests of the same condition, boot, level and mode in flight
between its first token and its last. A stretch whose batch drains as requests finish shows
up as measured requests averaging well below ``c``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ...results.folder import SavedCampaign
from ...results.records import RequestRecord
from ..stats.core import FloatArray

STEADY_SHARE = 0.95
"""A closed-loop level whose measured requests average below this share of its concurrency
did not run at the load it names."""
TOLERANCE = 0.05  # +-5%: a measured request "at c" within this relative band


@dataclass(frozen=True)
class LevelLoad:
    """The measured in-flight load of one condition at one level (greedy requests)."""

    condition: str
    load: str
    concurrency: int
    """The level's closed-loop concurrency; 0 for an open-loop level."""
    rate: float | None
    """An open-loop level's Poisson rate (requests/s); None for closed loop."""
    measured: int
    """Measured requests whose in-flight load is known (completed, timed)."""
    fillers: int
    """Fillers sent at this level (recorded, never judged)."""
    mean: float | None
    """Time-averaged requests in flight during a measured request's decode, averaged over
    the measured requests; None when the records carry no timings."""
    min: float | None
    within: float | None
    """Share of measured requests within +-5% of the concurrency (closed loop only)."""
    achieved_rate: float | None
    """Requests per second while the level ran, pooled over its stretches: open loop the
    achieved arrival rate, closed loop the measured requests' throughput."""

    @property
    def steady(self) -> bool | None:
        """Whether a closed-loop level kept its load (None: open loop, or no figure)."""
        if self.mean is None or self.concurrency <= 0 or self.rate is not None:
            return None
        return self.mean >= STEADY_SHARE * self.concurrency

    def as_dict(self) -> dict[str, object]:
        return {"condition": self.condition, "load": self.load,
                "concurrency": self.concurrency, "rate": self.rate, "measured": self.measured,
                "fillers": self.fillers, "mean": self.mean, "min": self.min,
                "within": self.within, "achieved_rate": self.achieved_rate}


def _span(r: RequestRecord) -> tuple[float, float] | None:
    if r.started_at is None or r.e2e_s is None:
        return None
    return r.started_at, r.started_at + r.e2e_s


def _decode(r: RequestRecord) -> tuple[float, float] | None:
    """From the request's first token to its last; from submission where no first token is
    recorded, or where the output arrived in one piece (no inter-token gap: the engine decoded
    before it answered, while the request was in flight, and the client saw no decode window,
    only the instant its one chunk arrived)."""
    if not r.ok or r.filler or r.started_at is None or r.e2e_s is None:
        return None
    one_piece = bool(r.itl_s) and not any(gap > 0 for gap in r.itl_s)
    first = r.started_at + (0.0 if one_piece else min(r.ttft_s or 0.0, r.e2e_s))
    return first, r.started_at + r.e2e_s


def _group(r: RequestRecord) -> tuple[str, int, str, str]:
    return r.condition, r.boot, r.load, r.mode


def in_flight(sent: Iterable[RequestRecord]) -> list[tuple[RequestRecord, float]]:
    """Each completed measured request with the time-averaged number of requests in flight
    between its first token and its last (itself included; same condition, boot, level and
    mode; fillers counted). A request whose first token is its last gets the count at that
    instant."""
    groups: dict[tuple[str, int, str, str], list[RequestRecord]] = {}
    for r in sent:
        groups.setdefault(_group(r), []).append(r)
    out: list[tuple[RequestRecord, float]] = []
    for recs in groups.values():
        spans = [s for r in recs if (s := _span(r)) is not None]
        if not spans:
            continue
        starts, ends = (np.sort(np.asarray(v, dtype=float)) for v in zip(*spans, strict=True))
        measured = [(r, d) for r in recs if (d := _decode(r)) is not None]
        if not measured:
            continue
        # Sum over spans of |span ∩ [a, b]| = F(b) - F(a), F(t) the integral of the count in
        # flight up to t: from sorted starts and ends and their prefix sums, O(n log n) (an
        # overlap matrix was O(measured x spans): minutes at 10^5 records). Times from the
        # group's first start, so the prefix sums stay small next to the widths.
        t0 = float(starts[0])
        starts, ends = starts - t0, ends - t0
        a = np.array([d[0] for _, d in measured], dtype=float) - t0
        b = np.array([d[1] for _, d in measured], dtype=float) - t0
        width = b - a
        # A first token that is the last: the others in flight then, and itself (its own
        # span ends at that instant, so the half-open count leaves it out).
        at_instant = (np.searchsorted(starts, a, side="right")
                      - np.searchsorted(ends, a, side="right") + 1.0)
        overlap = _area(starts, ends, b) - _area(starts, ends, a)
        values = np.where(width > 0, overlap / np.where(width > 0, width, 1.0), at_instant)
        out += [(r, float(v)) for (r, _), v in zip(measured, values, strict=True)]
    return out


def _area(starts: FloatArray, ends: FloatArray, t: FloatArray) -> FloatArray:
    """At each ``t``, the integral up to ``t`` of the number of spans in flight (``starts``
    and ``ends`` sorted): sum of (t - start) over started spans less (t - end) over ended."""
    ks = np.searchsorted(starts, t, side="right")
    ke = np.searchsorted(ends, t, side="right")
    s_sum = np.concatenate(([0.0], np.cumsum(starts)))
    e_sum = np.concatenate(([0.0], np.cumsum(ends)))
    out: FloatArray = (ks * t - s_sum[ks]) - (ke * t - e_sum[ke])
    return out


def _achieved_rate(recs: Sequence[RequestRecord], open_loop: bool) -> float | None:
    """Requests per second, pooled over the level's stretches (never the idle time between
    them). Open loop: the arrival rate, (arrivals - 1) / the span of their start times.
    Closed loop: the measured requests' throughput, measured requests / the span from the
    stretch's first start to its last measured end."""
    by_stretch: dict[tuple[int, int | None], list[RequestRecord]] = {}
    for r in recs:
        if r.started_at is not None:
            by_stretch.setdefault((r.boot, r.stretch), []).append(r)
    count = span = 0.0
    for rs in by_stretch.values():
        first = min(r.started_at or 0.0 for r in rs)
        if open_loop:
            count += len(rs) - 1
            span += max(r.started_at or 0.0 for r in rs) - first
            continue
        ends = [_span(r) for r in rs if not r.filler]
        done = [e[1] for e in ends if e is not None]
        if done:
            count += len(done)
            span += max(done) - first
    return count / span if count and span > 0 else None


def level_loads(data: SavedCampaign, mode: str | None = None) -> list[LevelLoad]:
    """The measured in-flight load of every condition at every level, from records alone
    (of ``mode``, by default the timed records)."""
    mode = mode or data.timed_mode
    sent = [r for r in data.sent if r.mode == mode]
    figures: dict[tuple[str, str], list[float]] = {}
    for r, value in in_flight(sent):
        figures.setdefault((r.condition, r.load), []).append(value)
    by_level: dict[tuple[str, str], list[RequestRecord]] = {}
    for r in sent:  # grouped once, in the records' order (not filtered per level)
        by_level.setdefault((r.condition, r.load), []).append(r)
    out = []
    for cond in dict.fromkeys([*data.meta.conditions, *(r.condition for r in sent)]):
        for level in dict.fromkeys([*data.meta.load_levels, *(r.load for r in sent)]):
            recs = by_level.get((cond, level), [])
            if not recs:
                continue
            rate = next((r.rate for r in recs if r.rate is not None), None)
            closed = 0 if rate is not None else max(r.concurrency for r in recs)
            values = figures.get((cond, level), [])
            within = (float(np.mean([abs(v - closed) <= TOLERANCE * closed for v in values]))
                      if values and closed else None)
            out.append(LevelLoad(
                condition=cond, load=level, concurrency=closed,
                rate=float(rate) if rate is not None else None, measured=len(values),
                fillers=sum(r.filler for r in recs),
                mean=float(np.mean(values)) if values else None,
                min=float(np.min(values)) if values else None, within=within,
                achieved_rate=_achieved_rate(recs, rate is not None)))
    return out


def drained(loads: Iterable[LevelLoad], conditions: Iterable[str] | None = None) -> list[str]:
    """A fairness difference for each closed-loop level that ran below 0.95 of its load."""
    names = set(conditions) if conditions is not None else None
    out = []
    for lv in loads:
        if lv.steady is not False or (names is not None and lv.condition not in names):
            continue
        assert lv.mean is not None and lv.min is not None
        out.append(
            f"load {lv.load!r}: {lv.condition}'s measured requests ran with {lv.mean:.2f} "
            f"requests in flight on average (min {lv.min:.2f}), below "
            f"{STEADY_SHARE:g} x {lv.concurrency}: the level did not hold the load it names "
            "(a stretch that drains as its requests finish)")
    return out
