"""scores.jsonl: every sampled token of the sampled pass and of the sampled probes, scored by
the target.

One JSON object per sample (a condition's sampled-pass record, or a sampled probe's, which
names its ``probe``): its condition, prompt id and sample index, who scored it, and per
output position the token, the target's raw (T=1, unprocessed) log-probability of it, the
target's top-K ids and log-probabilities there, and the position's class
(:func:`position_classes`). Floats are rounded to 4 decimals. A results folder without the
file has no scores (an endpoint that returns no logprobs, or an older run); the distribution
gate then falls back to its two-sample check.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, get_args

from .records import Measurement, RecordsError

SCORES_FILE = "scores.jsonl"
PositionClass = Literal["first", "drafted", "bonus", "later"]
_CLASSES: tuple[str, ...] = get_args(PositionClass)
_DIGITS = 4


@dataclass(frozen=True)
class ScoredPosition:
    """The target's raw distribution at one output position, and the token emitted there."""

    token: int
    logprob: float  # raw log-probability (T=1, no processors) of ``token``
    top_ids: tuple[int, ...]  # the target's top-K ids, most likely first
    top_logprobs: tuple[float, ...]  # their raw log-probabilities


def position_classes(record: Measurement) -> list[PositionClass] | None:
    """Each output position's class, from the engine's per-step record; None where the
    engine does not say which positions were drafted (then position 1 is ``first`` and
    positions 2+ are ``later``: :func:`classes_of`).

    Each verify step emits its ``m`` accepted drafts ("drafted"), then one token of its own:
    "drafted" where it was resampled at a rejected draft (``m`` < drafts checked), "bonus"
    where every checked draft was accepted, and "first" for the very first step when it
    checked no draft (the prefill's own token). The first step usually checks drafts drafted
    from the prompt, so the first output token can be a drafted one."""
    accepts, drafts = record.spec_step_accepts, record.spec_step_drafts
    if accepts is None or drafts is None or len(accepts) != len(drafts):
        return None
    out: list[PositionClass] = []
    for step, (m, checked) in enumerate(zip(accepts, drafts, strict=True)):
        if not 0 <= m <= checked:
            return None
        out += ["drafted"] * m
        if m < checked:
            out.append("drafted")
        else:
            out.append("first" if step == 0 and checked == 0 else "bonus")
    n = len(record.output_ids)
    if len(out) < n:  # the steps do not cover the output: the record cannot be read
        return None
    return out[:n]  # the last step's tokens may be cut (end of sequence, a stop, the length)


def classes_of(record: Measurement) -> list[PositionClass]:
    """:func:`position_classes`, or first + later where the split is unknown."""
    known = position_classes(record)
    if known is not None:
        return known
    n = len(record.output_ids)
    first: list[PositionClass] = ["first"]
    later: list[PositionClass] = ["later"]
    return first + later * (n - 1) if n else []


@dataclass(frozen=True)
class ScoreLine:
    """One sample's scores, as scores.jsonl holds it."""

    condition: str
    prompt_id: str
    sample_index: int
    scorer: str  # the condition whose engine scored it (the baseline)
    positions: tuple[ScoredPosition, ...]
    classes: tuple[PositionClass, ...]
    run_id: str | None = None
    vocab: int | None = None  # the scorer's vocabulary size, where it knows it (the tail's bound)
    probe: str | None = None  # a sampled probe's sample (params pass); None: the sampled pass

    def to_json(self) -> str:
        def r(x: float) -> float:
            return round(float(x), _DIGITS)

        data: dict[str, Any] = {
            "run_id": self.run_id, "condition": self.condition, "prompt_id": self.prompt_id,
            "sample_index": self.sample_index, "scorer": self.scorer,
            "tokens": [p.token for p in self.positions],
            "logprobs": [r(p.logprob) for p in self.positions],
            "top_ids": [list(p.top_ids) for p in self.positions],
            "top_logprobs": [[r(x) for x in p.top_logprobs] for p in self.positions],
            "classes": list(self.classes),
        }
        if self.vocab is not None:
            data["vocab"] = self.vocab
        if self.probe is not None:
            data["probe"] = self.probe
        return json.dumps(data, ensure_ascii=False, allow_nan=False)

    @classmethod
    def from_json(cls, data: Any, where: str) -> ScoreLine:
        """One line's object; a RecordsError naming ``where`` (file:line) when malformed."""
        try:
            tokens, logprobs = data["tokens"], data["logprobs"]
            top_ids, top_lps, classes = data["top_ids"], data["top_logprobs"], data["classes"]
            n = len(tokens)
            if not all(len(x) == n for x in (logprobs, top_ids, top_lps, classes)):
                raise ValueError("per-position lists of different lengths")
            bad = [c for c in classes if c not in _CLASSES]
            if bad:
                raise ValueError(f"unknown position class {bad[0]!r}")
            positions = tuple(
                ScoredPosition(int(t), float(lp), tuple(int(i) for i in ids),
                               tuple(float(x) for x in lps))
                for t, lp, ids, lps in zip(tokens, logprobs, top_ids, top_lps, strict=True))
            if any(len(p.top_ids) != len(p.top_logprobs) for p in positions):
                raise ValueError("top_ids and top_logprobs of different lengths")
            vocab, probe = data.get("vocab"), data.get("probe")
            return cls(str(data["condition"]), str(data["prompt_id"]),
                       int(data["sample_index"]), str(data.get("scorer", "")), positions,
                       tuple(classes), data.get("run_id"),
                       None if vocab is None else int(vocab),
                       None if probe is None else str(probe))
        except (KeyError, TypeError, ValueError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise RecordsError(f"{where}: not a score line ({what})") from None


class ScoreWriter:
    """Appends score lines; each flushed as written, so a crash loses nothing done."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[str] | None = None

    def write(self, lines: Sequence[ScoreLine]) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        for line in lines:
            self._fh.write(line.to_json() + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_scores(path: Path, run_id: str | None = None) -> list[ScoreLine]:
    """scores.jsonl's lines (of ``run_id`` where given); [] where the file is absent. A torn
    last line (a crash mid-write) is skipped; any other bad line is an error naming it."""
    if not path.exists():
        return []
    if not path.is_file():
        raise RecordsError(f"{path}: not a regular file")
    out: list[ScoreLine] = []
    raw_lines = path.read_bytes().splitlines(keepends=True)
    for n, raw in enumerate(raw_lines, 1):
        torn = n == len(raw_lines) and not raw.endswith(b"\n")
        try:
            data = json.loads(raw.decode("utf-8")) if raw.strip() else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            if torn:
                break
            raise RecordsError(f"{path}:{n}: not valid JSON") from None
        if data is None:
            continue
        if not isinstance(data, dict):
            raise RecordsError(f"{path}:{n}: not a score line")
        line = ScoreLine.from_json(data, f"{path}:{n}")
        if run_id is None or line.run_id in (None, run_id):
            out.append(line)
    return out


def by_condition(lines: Sequence[ScoreLine]) -> Iterator[tuple[str, list[ScoreLine]]]:
    """Lines grouped by condition, in first-seen order."""
    groups: dict[str, list[ScoreLine]] = {}
    for line in lines:
        groups.setdefault(line.condition, []).append(line)
    yield from groups.items()
