"""A results folder as saved: campaign.json, records.jsonl and the trace they replayed.

This is what judgement reads; it knows nothing of how the campaign was measured.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..pilot.trace import Prompt, TraceError, load_trace
from .campaign_file import CampaignFile, read_campaign_file
from .records import (
    Measurement,
    RecordsError,
    RequestRecord,
    impossible_value,
    read_records,
    timed_mode,
)
from .scores import SCORES_FILE, ScoreLine, read_scores


@dataclass
class SavedCampaign:
    """A campaign as saved: what the gates judge.

    ``records`` are the judged requests only: fillers (sent to keep a level's load steady)
    are moved to ``fillers`` on construction, so that no gate, figure or report that reads
    ``records`` can count them. Only the in-flight load reads both (:attr:`sent`).

    :meth:`of` and :meth:`at` read an index of ``records`` built on first use and rebuilt
    when the list is replaced or grows: a record is replaced by a new list, not in place."""

    directory: Path
    meta: CampaignFile
    records: list[RequestRecord]
    prompts: dict[str, Prompt] | None = None  # the trace, where it can be read (correctness)
    fillers: list[RequestRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what reading the folder had to mend
    scores: list[ScoreLine] = field(default_factory=list)  # scores.jsonl (none: not scored)
    _index: _Index | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.meta, Mapping):  # a plain dict (tests, older callers)
            self.meta = CampaignFile.model_validate(dict(self.meta))
        if any(r.filler for r in self.records):
            self.fillers = [*self.fillers, *(r for r in self.records if r.filler)]
            self.records = [r for r in self.records if not r.filler]

    @property
    def sent(self) -> list[RequestRecord]:
        """Every request sent, fillers included (what was in flight at the engine)."""
        return [*self.records, *self.fillers]

    @property
    def timed_mode(self) -> str:
        """The mode of the timed records (speed, latency, load, cost): "serving" where the
        campaign timed at a sampled serving setting, else "greedy"."""
        return self._indexed().timed_mode

    def of(
        self, condition: str, load: str | None = None, mode: str | None = None
    ) -> list[RequestRecord]:
        """A condition's records (at ``load``) of ``mode``, by default the timed ones."""
        index = self._indexed()
        found = index.groups.get((condition, load, mode or index.timed_mode), ())
        return list(found)  # a fresh list, as a filter gives: the caller may change it

    def at(self, load: str, mode: str | None = None, *, any_mode: bool = False
           ) -> list[RequestRecord]:
        """Every condition's records at ``load`` of ``mode`` (by default the timed ones;
        ``any_mode``: of every mode), in the records' order."""
        index = self._indexed()
        key = (None, load, None if any_mode else mode or index.timed_mode)
        return list(index.groups.get(key, ()))

    def _indexed(self) -> _Index:
        """The records grouped once, not filtered per call (the gates, figures and reports
        ask for a condition's records at a level dozens of times: each scanned 10^5
        records). Rebuilt when ``records`` is replaced or grows."""
        if self._index is None or not self._index.covers(self.records):
            self._index = _Index.of(self.records)
        return self._index

    def scores_of(self, condition: str, probe: str | None = None) -> list[ScoreLine]:
        """The condition's sampled-pass outputs (``probe``: that sampled probe's) as the
        target scored them ([]: not scored)."""
        return [s for s in self.scores if s.condition == condition and s.probe == probe]

    def condition_error(self, condition: str) -> str | None:
        return self.meta.condition_error(condition)


_Key = tuple[str | None, str | None, str | None]  # condition, load, mode (None: every one)


@dataclass(frozen=True)
class _Index:
    """``records`` grouped by (condition, load, mode), (condition, None, mode) (every
    load), (None, load, mode) (every condition) and (None, load, None) (every condition and
    mode), each group in the records' order; and their timed mode."""

    records: list[RequestRecord]  # held: the list indexed (its id cannot be reused)
    size: int
    timed_mode: str
    groups: dict[_Key, list[RequestRecord]]

    def covers(self, records: list[RequestRecord]) -> bool:
        return records is self.records and len(records) == self.size

    @classmethod
    def of(cls, records: list[RequestRecord]) -> _Index:
        groups: dict[_Key, list[RequestRecord]] = {}
        for r in records:
            for key in ((r.condition, r.load, r.mode), (r.condition, None, r.mode),
                        (None, r.load, r.mode), (None, r.load, None)):
                groups.setdefault(key, []).append(r)
        return cls(records, len(records), timed_mode(records), groups)


def load_campaign(directory: Path) -> SavedCampaign:
    """Read a saved campaign; errors name the file (CampaignFileError, RecordsError)."""
    meta = read_campaign_file(directory / "campaign.json")
    records_path = directory / "records.jsonl"
    if records_path.exists() and not records_path.is_file():
        raise RecordsError(f"{records_path}: not a regular file (a folder, a pipe or a device)")
    records = list(read_records(records_path)) if records_path.is_file() else []
    if meta.run_id is not None:  # records.jsonl is append-only: earlier runs' records stay
        records = [r for r in records if r.run_id == meta.run_id]
    if meta.status == "complete" and not records:
        state = "missing" if not records_path.exists() else "without a record of this run"
        raise RecordsError(f"{records_path}: {state}, though campaign.json says the campaign "
                           "completed; there is nothing to judge")
    # The same line twice (a copy appended, a merge gone wrong) would count one request twice.
    # Keyed by a digest of the record's repr (every field, exact floats): equal where to_json
    # is, at a tenth of its cost (to_json's scrubbing walk dominated loading 10^5 records),
    # and 16 bytes a record held rather than the whole line.
    unique = list({hashlib.blake2b(repr(r).encode(), digest_size=16).digest(): r
                   for r in records}.values())
    notes = ([f"{records_path}: {len(records) - len(unique)} duplicated record line(s) "
              "collapsed (each request counted once)"] if len(unique) < len(records) else [])
    sound = [_sound(r) for r in unique]
    if bad := sum(a is not b for a, b in zip(sound, unique, strict=True)):
        notes.append(f"{records_path}: {bad} record(s) with an impossible value judged as "
                     "failed requests (the value is not judged)")
    scores = read_scores(directory / SCORES_FILE, meta.run_id)
    return SavedCampaign(directory, meta, sound, saved_trace(meta), notes=notes, scores=scores)


# The most tokens one verify step can commit in any pilot (64 draft tokens + the target's own):
# a saved record does not say its request's bounds, so only what no pilot allows is refused.
_MOST_PER_STEP = 65


def _sound(r: RequestRecord) -> RequestRecord:
    """``r``, or, where it reports what no server can (records.impossible_value: NaN, a
    negative count, an accept length past any draft), the failed request it must be judged
    as: a records.jsonl edited, or written by a version that did not check."""
    why = impossible_value(r, None, _MOST_PER_STEP) if r.ok else None
    if why is None:
        return r
    failed = Measurement.failure(f"{why} (as read from records.jsonl)")
    return replace(r, output_tokens=None,
                   **{f.name: getattr(failed, f.name) for f in fields(Measurement)})


def saved_trace(meta: CampaignFile) -> dict[str, Prompt] | None:
    """The campaign's prompts, if its trace files are still there and unchanged."""
    try:
        trace = load_trace(meta.trace_files)
    except (TraceError, OSError):
        return None
    ids = meta.prompt_ids
    prompts = trace.by_id()
    if not all(i in prompts for i in ids):
        return None
    subset = trace.subset(ids=ids) if ids else trace
    if meta.trace_hash and subset.sha256 != meta.trace_hash:
        return None
    return subset.by_id()


def iter_pairs(
    data: SavedCampaign,
    reference: str,
    candidate: str,
    load: str,
    metric: Callable[[RequestRecord], float | None],
    slice_: str | None = None,
) -> Iterator[tuple[str, list[float], list[float]]]:
    """Per prompt: the metric's values for reference and candidate (ok timed requests)."""
    if reference == candidate:  # a condition is not paired with itself
        return
    ref: dict[str, list[float]] = {}
    cand: dict[str, list[float]] = {}
    for condition, values in ((reference, ref), (candidate, cand)):
        for r in data.of(condition, load):
            if not r.ok or (slice_ is not None and r.slice != slice_):
                continue
            if (value := metric(r)) is not None:
                values.setdefault(r.prompt_id, []).append(value)
    for pid in ref:
        if pid in cand:
            yield pid, ref[pid], cand[pid]


def level_concurrency(value: Any) -> int:
    """A saved level's concurrency: closed loop as is, open loop its cap (0: none)."""
    if isinstance(value, Mapping):
        return int(value.get("max_concurrency") or 0)
    return int(value)
