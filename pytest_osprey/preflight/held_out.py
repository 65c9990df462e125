"""The held-out check: do the trace's prompts appear in a drafter's adaptation data?

A drafter adapted on data that contains a trace prompt shows an inflated accept length on
exactly that prompt, so the speed it is judged by is not the speed it will serve with. Each
prompt's text (its user and assistant turns: a product's shared system prompt is not the
prompt) is cut into word n-gram shingles; the adaptation data is streamed line by line and
each line's shingles are looked up in that small index. A prompt overlaps when one line
contains at least ``containment`` of its shingles (1.0: the prompt appears verbatim).

Memory holds the trace's index and one line at a time, never the adaptation data: a
million chat lines take about a minute of CPU time and 53 MiB (benchmarks/held_out.py).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..pilot.schema import Pilot
from ..pilot.trace import Prompt, TraceError, load_trace
from ..results.preflight_file import CheckEntry

_WORD = re.compile(r"\w+")
#: Ids named in a check's detail line; all of them are in its data.
SHOWN_IDS = 10


def words(text: str) -> list[str]:
    """The lowercased words of ``text`` (punctuation and layout ignored)."""
    return _WORD.findall(text.lower())


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
    """A trace prompt's closest line in the adaptation data."""

    id: str
    containment: float
    file: str
    line: int


@dataclass
class Overlap:
    """What the scan found: per prompt its best line (prompts with no shared shingle are
    absent), and how much was read."""

    best: dict[str, Match] = field(default_factory=dict)
    lines: int = 0
    files: int = 0

    def overlapping(self, containment: float) -> list[Match]:
        return [m for m in self.best.values() if m.containment >= containment]


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    return [path]


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return path.open("r", encoding="utf-8", errors="replace")


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, out)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)


def line_text(line: str) -> str:
    """A JSON line's string values (escapes decoded, keys left out), else the line itself."""
    if line[:1] in "{[":
        try:
            found: list[str] = []
            _strings(json.loads(line), found)
            return "\n".join(found)
        except (ValueError, RecursionError):
            pass
    return line


def scan(prompts: Iterable[tuple[str, str]], data: Path, ngram: int = 5) -> Overlap:
    """Stream ``data`` (a file or a folder of files; ``.gz`` read as gzip) against the
    ``(id, text)`` prompts. Raises OSError when the data cannot be read."""
    index: dict[tuple[str, ...], list[int]] = {}
    ids: list[str] = []
    sizes: list[int] = []
    lengths: set[int] = set()
    for pid, text in prompts:
        grams = shingles(words(text), ngram)
        if not grams:
            continue
        for g in grams:
            index.setdefault(g, []).append(len(ids))
            lengths.add(len(g))
        ids.append(pid)
        sizes.append(len(grams))
    result = Overlap()
    best = [0.0] * len(ids)
    where: list[tuple[str, int]] = [("", 0)] * len(ids)
    keys = index.keys()
    for path in _files(data):
        result.files += 1
        lineno = 0
        with _open(path) as fh:
            for lineno, raw in enumerate(fh, start=1):
                tokens = words(line_text(raw))
                hits: set[tuple[str, ...]] = set()
                for k in lengths:
                    if len(tokens) >= k:
                        hits |= keys & shingles(tokens, k)
                if hits:
                    counts: dict[int, int] = {}
                    for g in hits:
                        for i in index[g]:
                            counts[i] = counts.get(i, 0) + 1
                    for i, c in counts.items():
                        share = c / sizes[i]
                        if share > best[i]:
                            best[i], where[i] = share, (str(path), lineno)
        result.lines += lineno
    for i, pid in enumerate(ids):
        if best[i] > 0:
            result.best[pid] = Match(pid, round(best[i], 4), *where[i])
    return result


NAME = "held out"


def _trace_prompts(pilot: Pilot) -> list[Prompt]:
    spec = pilot.trace
    trace = load_trace([os.fspath(f) for f in spec.files])
    return list(trace.subset(ids=spec.ids, slices=spec.slices,
                             limit_per_slice=spec.limit_per_slice, limit=spec.limit).prompts)


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
        prompts = _trace_prompts(pilot)
        found = scan(((p.id, prompt_text(p)) for p in prompts), data, spec.ngram)
    except TraceError as exc:
        return check(False, f"trace not readable: {exc}")
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
