"""The held-out check: do the trace's prompts appear in a drafter's adaptation data?

A drafter adapted on data that contains a trace prompt shows an inflated accept length on
exactly that prompt, so the speed it is judged by is not the speed it will serve with. Each
prompt's text (its user and assistant turns: a product's shared system prompt is not the
prompt) is normalised (trace_build.inputs: NFKC, invisible characters removed, case folded,
lookalike letters read as Latin) and cut into word n-gram shingles. The adaptation data is
streamed record by record, in its own format: a JSON document's records (the elements of an
array, pretty-printed or not, or one value a line; string values with escapes decoded, keys
left out), a CSV row (quoted newlines included), or plain text read as one running text. A
prompt overlaps when, within one record, a stretch of about twice its length holds at least
``containment`` of its shingles (1.0: the prompt appears verbatim).

Data that cannot be read as text (a compression it does not open, bytes that do not
decode, binary, token ids, a FIFO or device) raises InputError: the check fails saying so,
never "no overlap". Memory holds the trace's index and one record at a time, never the
adaptation data (benchmarks/held_out.py).
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..pilot.schema import Pilot
from ..pilot.selection import drawn_trace, trace_draw
from ..pilot.trace import Prompt, TraceError, load_trace
from ..results.preflight_file import CheckEntry
from ..trace_build.inputs import (
    MAX_RECORD_CHARS,
    InputError,
    json_values,
    lines,
    pieces,
    regular_file,
    text_chunks,
    words,
)

#: Ids named in a check's detail line; all of them are in its data.
SHOWN_IDS = 10
#: Decompressed bytes read from one adaptation file at most.
MAX_DATA_BYTES = 256 * 2**30
#: A file whose words are nearly all numbers is token ids, not text: the check cannot
#: compare it (the prompts would have to be tokenized the same way).
NUMERIC_SHARE = 0.9
_COMPRESSED = (".gz", ".gzip", ".xz", ".bz2", ".zip")
_DIGITS = re.compile(r"\d+")

__all__ = ["InputError", "Match", "Overlap", "held_out_check", "prompt_text", "scan",
           "shingles", "words"]


def prompt_text(prompt: Prompt) -> str:
    """What of a trace prompt is matched: its text, or its non-system turns."""
    if prompt.prompt is not None:
        return prompt.prompt
    return "\n".join(m["content"] for m in prompt.messages or () if m["role"] != "system")


def shingles(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
    """Word n-grams of ``tokens``; a text shorter than ``n`` words is one shingle of itself."""
    if len(tokens) < n:
        return {tuple(tokens)} if tokens else set()
    return set(zip(*(tokens[i:] for i in range(n)), strict=False))


@dataclass(frozen=True)
class Match:
    """A trace prompt's closest record in the adaptation data."""

    id: str
    containment: float
    file: str
    line: int


@dataclass
class Overlap:
    """What the scan found: per prompt its best record (prompts with no shared shingle are
    absent), and how much was read."""

    best: dict[str, Match] = field(default_factory=dict)
    lines: int = 0
    """Records read (lines of plain text)."""
    files: int = 0

    def overlapping(self, containment: float) -> list[Match]:
        return [m for m in self.best.values() if m.containment >= containment]


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*")
                      if not p.is_dir() and not p.name.startswith("."))
    return [path]


def _strings(value: Any, out: list[str]) -> int:
    """Collect ``value``'s strings into ``out``; returns how many numbers it holds."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        return sum(_strings(v, out) for v in value.values())
    elif isinstance(value, list):
        return sum(_strings(v, out) for v in value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        return 1
    return 0


def line_text(line: str) -> str:
    """A JSON line's string values (escapes decoded, keys left out), else the line itself."""
    if line.lstrip()[:1] in "{[":
        try:
            found: list[str] = []
            _strings(json.loads(line), found)
            return "\n".join(found)
        except (ValueError, RecursionError):
            pass
    return line


class _Matcher:
    """The trace's shingle index, and per prompt the window of hits in the current record."""

    def __init__(self, prompts: Iterable[tuple[str, str]], ngram: int) -> None:
        self.index: dict[tuple[str, ...], list[int]] = {}
        self.ids: list[str] = []
        self.sizes: list[int] = []
        self.spans: list[int] = []
        for pid, text in prompts:
            tokens = words(text)
            grams = shingles(tokens, ngram)
            if not grams:
                continue
            for g in grams:
                self.index.setdefault(g, []).append(len(self.ids))
            self.ids.append(pid)
            self.sizes.append(len(grams))
            # A copy counts within about twice the prompt's length: an edited or embedded
            # copy fits, shingles scattered over a long text do not add up.
            self.spans.append(2 * len(tokens) + ngram)
        self.lengths = sorted({len(g) for g in self.index})
        self.best = [0.0] * len(self.ids)
        self.where: list[tuple[str, int]] = [("", 0)] * len(self.ids)
        self.words = 0
        self.numbers = 0
        self.json_numbers = 0
        """Words that are numbers, and JSON numbers: token ids when nearly all are."""
        self.new_record()

    def count_numbers(self, n: int) -> None:
        self.numbers += n
        self.json_numbers += n

    def new_record(self) -> None:
        self.pos = 0
        self.tail: list[str] = []
        self.hits: dict[int, deque[tuple[int, tuple[str, ...]]]] = {}
        self.counts: dict[int, Counter[tuple[str, ...]]] = {}

    def feed(self, text: str, file: str, line: int) -> None:
        """More of the current record's text."""
        new = words(text)
        if not new:
            return
        self.words += len(new)
        self.numbers += sum(1 for w in new if _DIGITS.fullmatch(w))
        tokens = self.tail + new
        base = self.pos - len(self.tail)
        index = self.index
        for k in self.lengths:
            if len(tokens) < k:
                continue
            grams = zip(*(tokens[i:] for i in range(k)), strict=False)
            # Only grams ending in the new words: the tail's were looked up already.
            skip = max(0, len(self.tail) - k + 1)
            for j, g in enumerate(grams):
                if j >= skip and g in index:
                    self._hit(base + j, g, file, line)
        self.pos += len(new)
        self.tail = tokens[-(self.lengths[-1] - 1):] if self.lengths[-1] > 1 else []

    def _hit(self, at: int, gram: tuple[str, ...], file: str, line: int) -> None:
        for i in self.index[gram]:
            hits = self.hits.setdefault(i, deque())
            counts = self.counts.setdefault(i, Counter())
            hits.append((at, gram))
            counts[gram] += 1
            while hits[0][0] < at - self.spans[i]:
                _, old = hits.popleft()
                counts[old] -= 1
                if not counts[old]:
                    del counts[old]
            share = len(counts) / self.sizes[i]
            if share > self.best[i]:
                self.best[i], self.where[i] = share, (file, line)


def _kind(path: Path, head: str) -> str:
    name = path.name.lower()
    for ext in _COMPRESSED:
        name = name.removesuffix(ext)
    if name.endswith((".csv", ".tsv")):
        return "csv"
    start = head.lstrip("\ufeff \t\r\n")[:1]
    if start == "[":
        return "json"
    if start == "{":
        first = head.lstrip().split("\n", 1)[0]
        try:
            json.loads(first)
        except (ValueError, RecursionError):
            return "json"  # a pretty-printed object (or several): read as a JSON stream
    return "lines"


def _records(path: Path, matcher: _Matcher) -> int:
    """Stream one file into ``matcher``; returns the records (or text lines) read."""
    chunks = text_chunks(path, MAX_DATA_BYTES)
    head = next(chunks, "")
    kind = _kind(path, head)
    stream = _prepend(head, chunks)
    file = str(path)
    count = 0
    if kind == "json":
        for line, obj in json_values(stream, path):
            found: list[str] = []
            matcher.count_numbers(_strings(obj, found))
            matcher.new_record()
            matcher.feed("\n".join(found), file, line)
            count += 1
    elif kind == "csv":
        dialect = "excel-tab" if ".tsv" in path.name.lower() else "excel"
        limit = csv.field_size_limit()
        csv.field_size_limit(MAX_RECORD_CHARS)
        try:
            reader = csv.reader(lines(stream, path), dialect)
            for row in reader:
                matcher.new_record()
                matcher.feed("\n".join(row), file, reader.line_num)
                count += 1
        except csv.Error as exc:
            raise InputError(f"{path}:{reader.line_num}: invalid CSV: {exc}") from None
        finally:
            csv.field_size_limit(limit)
    else:
        # Lines: a JSON line is a record of its own (its strings); other lines are one
        # running text, so a multi-line prompt copied into a text file is matched whole.
        matcher.new_record()
        running = True
        for first, piece in pieces(stream):
            parts = piece.split("\n")
            for k, raw in enumerate(parts):
                if raw.lstrip()[:1] in ("{", "[") and (k < len(parts) - 1 or
                                                       piece.endswith("\n")):
                    found = []
                    try:
                        matcher.count_numbers(_strings(json.loads(raw), found))
                    except (ValueError, RecursionError):
                        pass
                    else:
                        matcher.new_record()
                        matcher.feed("\n".join(found), file, first + k)
                        running = False
                        continue
                if not running:
                    matcher.new_record()
                    running = True
                matcher.feed(raw, file, first + k)
            count = first + len(parts) - 1 - piece.endswith("\n")
    return count


def _prepend(first: str, rest: Iterator[str]) -> Iterator[str]:
    if first:
        yield first
    yield from rest


def scan(prompts: Iterable[tuple[str, str]], data: Path, ngram: int = 5) -> Overlap:
    """Stream ``data`` (a file or a folder of files, compressed ones recognised by their
    first bytes) against the ``(id, text)`` prompts. Raises InputError, naming the file,
    when any of it cannot be read as text."""
    matcher = _Matcher(prompts, ngram)
    result = Overlap()
    for path in _files(data):
        regular_file(path)
        result.files += 1
        before = (matcher.words, matcher.numbers)
        json_numbers = matcher.json_numbers
        result.lines += _records(path, matcher)
        read = matcher.words - before[0] + matcher.json_numbers - json_numbers
        if not read:
            raise InputError(f"{path}: holds no text to compare")
        if matcher.numbers - before[1] >= NUMERIC_SHARE * read:
            raise InputError(f"{path}: nearly all numbers (token ids?), not text; the check "
                             "compares text, so give the data as text")
    for i, pid in enumerate(matcher.ids):
        if matcher.best[i] > 0:
            result.best[pid] = Match(pid, round(matcher.best[i], 4), *matcher.where[i])
    return result


NAME = "held out"


def trace_prompts(pilot: Pilot) -> list[Prompt]:
    spec = pilot.trace
    trace = load_trace([os.fspath(f) for f in spec.files]).subset(ids=spec.ids,
                                                                  slices=spec.slices)
    # The same seeded draw as the campaign's (trace.limit), so the check sees its prompts.
    return list(drawn_trace(trace, trace_draw(pilot, trace)).prompts)


def held_out_check(pilot: Pilot, name: str) -> CheckEntry | None:
    """Condition ``name``'s held-out check, or None when it has none. Beside ``name``,
    ``ok`` and ``detail`` it records as data ``overlapping`` (the ids found, in trace
    order), ``matches`` (per id its containment, file and line) and ``prompts`` (checked)."""
    spec = pilot.conditions[name].held_out
    if spec is None:
        return None
    data = Path(spec.adaptation_data)

    def check(ok: bool, detail: str, **found: Any) -> CheckEntry:
        return CheckEntry.model_validate({"name": NAME, "ok": ok, "detail": detail,
                                          "overlapping": [], **found})

    if not data.exists():
        return check(False, f"adaptation data {data}: not found on this machine, so the trace "
                     "was not checked against it")
    try:
        prompts = trace_prompts(pilot)
        found = scan(((p.id, prompt_text(p)) for p in prompts), data, spec.ngram)
    except TraceError as exc:
        return check(False, f"trace not readable: {exc}")
    except InputError as exc:
        return check(False, f"adaptation data {exc}; the trace was not checked against it")
    except OSError as exc:
        return check(False, f"adaptation data {data}: cannot read: {exc.strerror or exc}")
    order = {p.id: i for i, p in enumerate(prompts)}
    hits = sorted(found.overlapping(spec.containment), key=lambda m: order[m.id])
    ids = [m.id for m in hits]
    shown = ", ".join(ids[:SHOWN_IDS]) + (f", ... ({len(ids)} in all)"
                                          if len(ids) > SHOWN_IDS else "")
    read = f"{found.lines:,} lines in {found.files} file(s)"
    if ids:
        detail = (f"{len(ids)} of {len(prompts)} prompts appear in {name}'s adaptation data "
                  f"(ids {shown}; {read}; allowed: {spec.max_overlap})")
    else:
        detail = (f"none of {len(prompts)} prompts appears in {name}'s adaptation data "
                  f"({read}; containment >= {spec.containment:g} of {spec.ngram}-grams)")
    return check(len(ids) <= spec.max_overlap, detail, overlapping=ids, prompts=len(prompts),
                 matches=[{"id": m.id, "containment": m.containment, "file": m.file,
                           "line": m.line} for m in hits])
