"""The public results format: one JSON object per request in records.jsonl, append-only.

A record is what the engine measured (:class:`Measurement`, the engines' return type) plus
where and how the request ran. Both are declared once: a record is built from the engine's
measurement by :meth:`RequestRecord.from_measurement`, never copied field by field.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any, Literal, get_type_hints

from pydantic import ConfigDict, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from .packed import Packed, pack
from .redact import json_ready

SCHEMA = 2  # 2: block is the replay plan's block; repetition the pass; boot, stretch
Mode = Literal["greedy", "serving", "sampled", "params"]
"""greedy: timed at temperature 0, or (when the pilot serves sampled) the untimed greedy pass
that identity and correctness read; serving: timed at the pilot's serving sampling; sampled:
the distribution pass; params: the sampling-parameters pass."""


@dataclass
class Measurement:
    """What one request measured. Times are seconds on a monotonic clock, from submission."""

    ok: bool
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: Sequence[float] = field(default_factory=list)
    """A list as measured; once read from records.jsonl, a list-alike held packed
    (results/packed.py)."""
    prompt_tokens: int | None = None
    output_ids: Sequence[int] = field(default_factory=list)
    output_text: str = ""
    top2_margin: list[float] | None = None
    """Per output position: logprob of top-1 minus top-2, where the engine gives it."""
    top2_ids: list[list[int]] | None = None
    """Per output position: the top-1 and top-2 token ids (beside top2_margin), where the
    engine gives them: a greedy divergence is a near-tie only onto the runner-up."""
    spec_verify_ct: int | None = None
    accept_length: float | None = None
    spec_drafts: int | None = None
    """Verify steps that checked drafted tokens (for per-position acceptance)."""
    spec_accepted_per_position: list[int] | None = None
    """Per draft position j: how many of those steps accepted the j-th drafted token, where
    the engine tells (j-th rate = accepted[j] / spec_drafts)."""
    spec_accepted: int | None = None
    """Accepted drafts in all, as the engine counts them beside its histogram (SGLang's
    ``spec_num_correct_drafts``): the accepted count where no histogram came, checked against
    the histogram's sum where one did (docs/acceptance.md)."""
    spec_proposed: int | None = None
    """Drafts proposed in all, as the engine counts them (SGLang's
    ``spec_num_proposed_drafts``)."""
    finish_reason: str | None = None
    spec_step_accepts: list[int] | None = None
    """Per verify step, in order, how many drafted tokens it accepted, where the engine tells
    (the embedded engine does). With :attr:`spec_step_drafts` the output's positions follow
    (results/scores.py ``position_classes``): per step its accepted drafts, then the one token
    the step adds: a resample at a drafted position where a draft was rejected, else a bonus
    token (or the first token, where the first step checked no draft)."""
    spec_step_drafts: list[int] | None = None
    """Per verify step, in order, how many drafts it checked (beside spec_step_accepts)."""

    @classmethod
    def failure(cls, error: str, **kw: Any) -> Measurement:
        return cls(ok=False, error=error, **kw)


_MEASURED = tuple(f.name for f in fields(Measurement))

IMPOSSIBLE = "impossible server value"
_SHOWN = 40  # characters of an impossible value kept in its error


def impossible(name: str, value: Any, why: str) -> str:
    """The error of a request whose server reported ``name=value``, which cannot be."""
    shown = repr(value)
    if len(shown) > _SHOWN:
        shown = shown[:_SHOWN] + "..."
    return f"{IMPOSSIBLE}: {name}={shown} ({why})"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    """A number that is not NaN or infinite (an int is, however large)."""
    return _number(value) and (isinstance(value, int) or math.isfinite(value))


# Integers (a token id counts as one).
_COUNTS = frozenset({"prompt_tokens", "spec_verify_ct", "spec_drafts", "output_ids",
                     "spec_step_accepts", "spec_step_drafts",
                     "spec_accepted_per_position", "spec_accepted", "spec_proposed"})


def impossible_value(m: Measurement, max_new_tokens: int | None,
                     accept_most: int | None) -> str | None:
    """Why what a server reported for one request cannot be true, or None when it can.

    ``accept_most``: the most tokens one verify step can commit (draft tokens + 1) where the
    condition speculates; None where it does not (an accept length is then absent or 1).
    """
    # Non-finite or negative numbers first: every bound below compares numbers.
    for name in ("ttft_s", "e2e_s", "prompt_tokens", "spec_verify_ct", "accept_length",
                 "spec_drafts", "spec_accepted", "spec_proposed"):
        value = getattr(m, name)
        if value is None:
            continue
        if not _finite(value):
            return impossible(name, value, "not a finite number")
        if value < 0:
            return impossible(name, value, "negative")
        if name in _COUNTS and not isinstance(value, int):
            return impossible(name, value, "not an integer")
    for name in ("itl_s", "top2_margin", "spec_accepted_per_position", "output_ids",
                 "spec_step_accepts", "spec_step_drafts"):
        values = getattr(m, name) or ()
        if isinstance(values, Packed) and not values.unusual(counts=name in _COUNTS):
            continue  # all sound, checked at once (value by value below: which one is not)
        for value in values:
            if not _finite(value):
                return impossible(name, value, "not a finite number")
            if value < 0 and name != "top2_margin":  # a margin's sign is the engine's order
                return impossible(name, value, "negative")
            if name in _COUNTS and not isinstance(value, int):
                return impossible(name, value, "not an integer")
    tokens = len(m.output_ids) or (len(m.itl_s) + 1 if m.itl_s else 0)
    if max_new_tokens is not None and tokens > max_new_tokens:
        return impossible("output_ids", f"{tokens} ids",
                          f"more than max_new_tokens {max_new_tokens}")
    verify = m.spec_verify_ct
    if verify is not None:
        # A lone token may be the prefill's alone; two or more need a verify step.
        if tokens > 1 and verify < 1:
            return impossible("spec_verify_ct", verify, f"no verify step for {tokens} tokens")
        if tokens and verify > tokens:
            return impossible("spec_verify_ct", verify, f"more verify steps than {tokens} tokens")
    accept = m.accept_length
    if accept is not None:
        most = accept_most or 1
        if not 1 <= accept <= most:
            return impossible("accept_length", accept, f"outside [1, {most}]" + (
                "" if accept_most else ": the condition does not speculate"))
    drafts = m.spec_drafts
    for k, accepted in enumerate(m.spec_accepted_per_position or ()):
        if drafts is not None and accepted > drafts:
            return impossible(f"spec_accepted_per_position[{k}]", accepted,
                              f"more than the {drafts} drafting steps")
    if m.spec_accepted is not None and m.spec_proposed is not None \
            and m.spec_accepted > m.spec_proposed:
        return impossible("spec_accepted", m.spec_accepted,
                          f"more than the {m.spec_proposed} drafts proposed")
    if accept_most and len(m.spec_accepted_per_position or ()) > accept_most - 1:
        return impossible("spec_accepted_per_position",
                          f"{len(m.spec_accepted_per_position or ())} positions",
                          f"more than the {accept_most - 1} draft tokens")
    return None


def checked(m: Measurement, max_new_tokens: int | None, accept_most: int | None) -> Measurement:
    """``m`` if what it reports can be true; else a failed request naming the impossible value
    (which is not kept: it must never be judged as fact). The client's own clock readings
    stay when they are sound."""
    if not m.ok:
        return m
    why = impossible_value(m, max_new_tokens, accept_most)
    if why is None:
        return m
    sound = [t for t in (m.ttft_s, m.e2e_s) if t is not None]
    timed = all(_finite(t) and t >= 0 for t in sound)
    return Measurement.failure(why, ttft_s=m.ttft_s if timed else None,
                               e2e_s=m.e2e_s if timed else None)


@dataclass(kw_only=True)
class RequestRecord(Measurement):
    """One replayed request: the engine's measurement and its context. Field names are the
    public format (DESIGN.md)."""

    run_id: str
    condition: str
    block: int
    """The replay plan's block of this prompt at this load level (schema 1: the pass)."""
    repetition: int
    """The pass over the trace (0-based) within the boot."""
    load: str
    concurrency: int
    prompt_id: str
    slice: str
    domain: str
    mode: Mode
    sample_index: int
    output_tokens: int | None = None
    started_at: float | None = None
    correct: bool | None = None
    rate: float | None = None  # open-loop level: Poisson arrival rate (requests/s)
    dispatch_lag_s: float | None = None  # open loop: sent this late after its arrival time
    boot: int = 0
    """Which boot of the condition served it (0-based)."""
    shard: int | None = None
    """The shard (1-based) of a sharded plan whose machine ran it, set when shards are
    merged (in a shard's own folder, campaign.json's ``shard`` says it); null: one machine."""
    stretch: int | None = None
    """The replay plan's stretch: one condition replaying one block, contiguous in time."""
    filler: bool = False
    """Sent only to keep a closed-loop level's load steady while the stretch's last measured
    requests finish: recorded (the in-flight load is recomputed from records), never judged.
    A filler still running when the stretch's measured requests have all finished is
    cancelled and recorded as failed."""
    copy: int = 0
    """Which occurrence of its prompt this is within its stretch (a stretch that repeats a
    prompt: the trace cycled to reach the level's concurrency)."""
    temperature: float | None = None
    """The sampling the request was sent with (None: a record from before it was kept)."""
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    probe: str | None = None  # params pass: which sampling-parameter probe ("plain": none)
    request: dict[str, Any] | None = None  # params pass: the non-default parameters sent
    schema: int = SCHEMA

    @classmethod
    def from_measurement(cls, measured: Measurement, **context: Any) -> RequestRecord:
        """The record of ``measured`` in its ``context`` (every non-measured field)."""
        values = {name: getattr(measured, name) for name in _MEASURED}
        if "output_tokens" not in context:
            values["output_tokens"] = len(measured.output_ids) if measured.ok else None
        return cls(**values, **context)

    def to_json(self) -> str:
        """The record's line in records.jsonl (secrets scrubbed: an echoed key in an error
        body or an output never reaches the file)."""
        return json.dumps(json_ready(asdict(self)), ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        # Field names once, not per line (a 10^5-line records.jsonl is read line by line).
        known = _RECORD_FIELDS if cls is RequestRecord else {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def tokens_per_s(self) -> float | None:
        if not self.ok or not self.e2e_s or not self.output_tokens:
            return None
        return self.output_tokens / self.e2e_s

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or not self.output_tokens:
            return None
        if self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


_RECORD_FIELDS = frozenset(f.name for f in fields(RequestRecord))


def timed_mode(records: Iterable[RequestRecord]) -> Mode:
    """The mode of the records that time speed: "serving" where the campaign timed at a
    sampled serving setting, else "greedy" (the greedy passes are then the timed ones)."""
    return "serving" if any(r.mode == "serving" for r in records) else "greedy"


class RecordWriter:
    """Appends records as they complete; each line is flushed so a crash loses nothing done."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_tail(path)
        self._fh: IO[str] | None = path.open("a", encoding="utf-8")
        self.count = 0

    def write(self, record: RequestRecord) -> None:
        if self._fh is None:
            raise RuntimeError(f"{self.path}: writer is closed")
        self._fh.write(record.to_json() + "\n")
        self._fh.flush()
        self.count += 1

    def sync(self) -> None:
        """Force to disk (at block ends: cheap enough, and survives a power cut)."""
        if self._fh is not None:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self.sync()
            self._fh.close()
            self._fh = None

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drop_torn_tail(path: Path) -> None:
    """Cut a line torn by a crash mid-write, so appending does not glue a record to it."""
    try:
        with path.open("rb+") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size == 0:
                return
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return
            fh.seek(0)
            data = fh.read()
            start = data.rfind(b"\n") + 1
            try:  # torn just before its newline: the record is whole, keep it
                json.loads(data[start:])
                fh.write(b"\n")
            except ValueError:
                fh.truncate(start)
    except FileNotFoundError:
        return


class RecordsError(ValueError):
    """A records file that cannot be read; names the file and line."""


# Per-token lists held packed once read (results/packed.py): what a record's size grows with.
_PACKED = ("itl_s", "output_ids")
# Text fields whose values recur across records (each line's parse makes new strings): one
# string per distinct value.
_SHARED = ("run_id", "condition", "load", "slice", "domain", "mode", "prompt_id",
           "finish_reason", "probe", "output_text")


def read_records(path: Path) -> Iterator[RequestRecord]:
    """Read records.jsonl; a torn last line (crash mid-write) is skipped, others are errors.

    Line by line (the file is never held whole), per-token lists packed, recurring strings
    shared: what is read is the same, in a fraction of the memory."""
    shared: dict[str, str] = {}
    with path.open("rb") as fh:  # bytes: a torn write may also cut a UTF-8 sequence
        for n, raw in enumerate(fh, 1):
            record = _read_line(path, n, raw, shared)
            if record is False:
                return
            if record is not None:
                yield record


def _read_line(path: Path, n: int, raw: bytes, shared: dict[str, str]
               ) -> RequestRecord | Literal[False] | None:
    """Line ``n``'s record; None for a blank line, False for a torn last line (the only one
    that can lack its newline)."""
    torn = not raw.endswith(b"\n")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if torn:
            return False
        raise RecordsError(f"{path}:{n}: not valid UTF-8: {exc.reason}") from None
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        if torn:
            return False
        raise RecordsError(f"{path}:{n}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise RecordsError(f"{path}:{n}: not a request record (JSON nested too deeply)"
                           ) from None
    if not isinstance(data, dict) or "condition" not in data:
        raise RecordsError(f"{path}:{n}: not a request record")
    if "\\u" in line and not _writable(data):
        raise RecordsError(f"{path}:{n}: holds a lone UTF-16 surrogate (\\ud800-\\udfff), "
                           "not text")
    schema = data.get("schema", SCHEMA)
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise RecordsError(f"{path}:{n}: records schema {schema!r} is not an integer")
    if schema > SCHEMA:
        raise RecordsError(
            f"{path}:{n}: records schema {schema} is newer than this version "
            f"reads ({SCHEMA}); upgrade pytest-osprey"
        )
    try:
        record = RequestRecord.from_dict(data)
    except TypeError as exc:  # a required field is missing
        raise RecordsError(f"{path}:{n}: not a request record: {exc}") from None
    if wrong := _wrong_type(data):
        raise RecordsError(f"{path}:{n}: not a request record: {wrong}")
    for name in _PACKED:
        setattr(record, name, pack(getattr(record, name)))
    for name in _SHARED:
        if isinstance(value := getattr(record, name), str):
            setattr(record, name, shared.setdefault(value, value))
    return record


def _writable(data: Any) -> bool:
    """Whether ``data`` can be written as UTF-8 again (an escaped lone surrogate cannot)."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@functools.cache
def _record_types() -> TypeAdapter[Any]:
    """The record's declared field types, checked strictly (no "1.5" read as a number): a
    record of wrong types is refused where it is read, not met as a crash in a gate."""
    hints = get_type_hints(RequestRecord)
    shape = TypedDict("RecordFields", {f.name: hints[f.name]  # type: ignore[misc]
                                       for f in fields(RequestRecord)}, total=False)
    shape.__pydantic_config__ = ConfigDict(strict=True)  # type: ignore[attr-defined]
    return TypeAdapter(shape)


def _wrong_type(data: dict[str, Any]) -> str | None:
    """The first field of ``data`` whose value is not of its declared type, in words."""
    try:
        _record_types().validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}"
    return None
