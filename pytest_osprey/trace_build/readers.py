"""Reading what a product already has into one shape: OpenAI-style chat logs (JSONL with
``messages``, and the logged completion when present), ShareGPT conversations (a JSON array,
or JSONL), plain prompt JSONL (this project's trace format among them) and CSV.

A malformed source (not JSON, not CSV, a record of the wrong shape) is a :class:`SourceError`
naming the file and line; a well-formed record that cannot become a trace prompt (a tool
call, an image, no user turn) is dropped with its reason, which the summary counts.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .inputs import InputError, read_text

FORMATS = ("auto", "openai", "sharegpt", "jsonl", "csv")

# ShareGPT speakers -> chat roles.
_SPEAKERS = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
             "assistant": "assistant", "bard": "assistant", "bing": "assistant",
             "system": "system"}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# A source file is read whole (the sample needs every record); a wrong file is caught first.
MAX_SOURCE_BYTES = 2 * 2**30
#: Characters one JSON record may hold, as parsed (a bigger one is refused).
MAX_RECORD_CHARS = 64 * 2**20


class SourceError(ValueError):
    """A source file is malformed; the message names the file and line."""


@dataclass
class Fields:
    """Which key (JSON, dotted for nesting) or column (CSV) holds what."""

    text: str = "prompt"
    domain: str | None = None
    completion: str | None = None
    reference: str | None = None


@dataclass
class Record:
    """One source record that can become a trace prompt."""

    file: str
    line: int
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    completion: str | None = None
    completion_tokens: int | None = None
    """The logged ``usage.completion_tokens``: the serving tokenizer's count, for all
    ``choices`` together."""
    choices: int = 1
    """Completions the logged request asked for (``n``) or the response holds."""
    expect_redacted: bool = False
    """The reference answer or ``expect`` had personal data masked: no check is made."""
    domain: str | None = None
    reference: str | None = None
    expect: dict[str, Any] | None = None
    max_new_tokens: int | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def content(self) -> str:
        """The text that is this prompt (system turns left out: a product's shared system
        prompt does not tell prompts apart)."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(m["content"] for m in self.messages or () if m["role"] != "system")


@dataclass(frozen=True)
class Dropped:
    """A record left out, and why."""

    where: str
    reason: str


class _Drop(Exception):
    """Internal: this record is well formed but cannot be a prompt."""


class _Bad(Exception):
    """Internal: this record is malformed."""


def _get(obj: Any, path: str | None) -> Any:
    if path is None:
        return None
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _scalar(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _Bad(f"{what} must be a string or number, got {type(value).__name__}")
    text = str(value).strip()
    return text or None


def _content(value: Any, what: str) -> str:
    """A chat message's text: a string, or OpenAI content parts of type text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict):
                raise _Bad(f"{what} parts must be objects")
            if part.get("type") != "text":
                raise _Drop(f"non-text content ({part.get('type')})")
            if not isinstance(part.get("text"), str):
                raise _Bad(f"{what} text part has no string 'text'")
            parts.append(part["text"])
        return "".join(parts)
    if value is None:
        raise _Drop("a message without content (a tool call)")
    raise _Bad(f"{what} must be a string or a list of parts, got {type(value).__name__}")


def _chat(messages: Any, what: str = "messages") -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise _Bad(f"{what!r} must be a non-empty array")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise _Bad(f"{what}[{i}] must be an object")
        role = msg.get("role")
        if role in ("tool", "function") or msg.get("tool_calls"):
            raise _Drop("tool calls")
        if role not in _ROLES:
            raise _Bad(f"{what}[{i}].role {role!r} is not system, user or assistant")
        text = _content(msg.get("content"), f"{what}[{i}].content")
        if not text.strip():
            raise _Drop("an empty message")
        out.append({"role": _ROLES[role], "content": text})
    return out


def _split_completion(messages: list[dict[str, str]]) -> tuple[list[dict[str, str]], str | None]:
    """A conversation ending in an assistant turn: that turn is the logged completion."""
    if messages[-1]["role"] == "assistant":
        return messages[:-1], messages[-1]["content"]
    return messages, None


def _logged_completion(obj: dict[str, Any], fields: Fields) -> str | None:
    if fields.completion is not None:
        return _scalar(_get(obj, fields.completion), repr(fields.completion))
    for holder in (obj.get("response"), obj):
        choices = holder.get("choices") if isinstance(holder, dict) else None
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            msg = choices[0].get("message")
            text = msg.get("content") if isinstance(msg, dict) else choices[0].get("text")
            if isinstance(text, str):
                return text
    completion = obj.get("completion")
    return completion if isinstance(completion, str) else None


def _openai(obj: Any, rec: Record, fields: Fields) -> None:
    if not isinstance(obj, dict):
        raise _Bad("each line must be a JSON object")
    request: dict[str, Any] = obj["request"] if isinstance(obj.get("request"), dict) else obj
    if "messages" not in request:
        raise _Bad("no 'messages' (an OpenAI chat request log line)")
    messages = _chat(request["messages"])
    logged = _logged_completion(obj, fields)
    if logged is None:
        messages, logged = _split_completion(messages)
    rec.messages, rec.completion = messages, logged
    n = request.get("n")
    for holder in (obj.get("response"), obj):
        choices = holder.get("choices") if isinstance(holder, dict) else None
        if isinstance(choices, list) and choices:
            rec.choices = len(choices)
            break
    if isinstance(n, int) and not isinstance(n, bool) and n > rec.choices:
        rec.choices = n
    for holder in (obj.get("response"), obj):
        usage = holder.get("usage") if isinstance(holder, dict) else None
        used = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(used, int) and not isinstance(used, bool) and used > 0:
            rec.completion_tokens = used
            break


def _sharegpt(obj: Any, rec: Record, fields: Fields) -> None:
    if not isinstance(obj, dict):
        raise _Bad("each conversation must be a JSON object")
    turns = obj.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise _Bad("no 'conversations' array (a ShareGPT record)")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise _Bad(f"conversations[{i}] must be an object")
        speaker = turn.get("from")
        if speaker not in _SPEAKERS:
            raise _Bad(f"conversations[{i}].from {speaker!r} is not human, gpt or system")
        value = turn.get("value")
        if not isinstance(value, str):
            raise _Bad(f"conversations[{i}].value must be a string")
        if not value.strip():
            raise _Drop("an empty turn")
        messages.append({"role": _SPEAKERS[speaker], "content": value})
    # The prompt runs to the last user turn; the reply after it is the logged completion.
    last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last is None:
        raise _Drop("no user turn")
    rec.messages = messages[:last + 1]
    reply = messages[last + 1] if last + 1 < len(messages) else None
    rec.completion = reply["content"] if reply is not None else None


def _plain(obj: Any, rec: Record, fields: Fields) -> None:
    if not isinstance(obj, dict):
        raise _Bad("each line must be a JSON object")
    text = _get(obj, fields.text)
    if text is None and "messages" in obj:
        rec.messages, logged = _split_completion(_chat(obj["messages"]))
        rec.completion = rec.completion or logged
    elif isinstance(text, str):
        if not text.strip():
            raise _Drop("an empty prompt")
        rec.prompt = text
    else:
        raise _Bad(f"no string {fields.text!r} (nor 'messages')")
    if fields.completion is not None:
        rec.completion = _scalar(_get(obj, fields.completion), repr(fields.completion))
    expect = obj.get("expect")
    if expect is not None:
        if not isinstance(expect, dict):
            raise _Bad("'expect' must be an object")
        rec.expect = expect
    budget = obj.get("max_new_tokens")
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise _Bad(f"'max_new_tokens' must be a positive integer, got {budget!r}")
        rec.max_new_tokens = budget


_PARSERS = {"openai": _openai, "sharegpt": _sharegpt, "jsonl": _plain}


def _common(obj: Any, rec: Record, fields: Fields) -> None:
    if isinstance(obj, dict):
        rec.domain = _scalar(_get(obj, fields.domain), repr(fields.domain))
        rec.reference = _scalar(_get(obj, fields.reference), repr(fields.reference))


def _read_bytes(path: Path) -> str:
    """The source as text: a regular file only (a FIFO or device is refused, not waited on),
    decompressed when its first bytes say so, at most MAX_SOURCE_BYTES."""
    try:
        return read_text(path, MAX_SOURCE_BYTES)
    except InputError as exc:
        raise SourceError(str(exc)) from None


def detect(path: Path, text: str) -> str:
    """The format of a source, from its name and first record."""
    if path.suffix.lower() in (".csv", ".tsv"):
        return "csv"
    start = text.lstrip()
    if start.startswith("["):
        return "sharegpt"
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    try:
        obj = json.loads(first)
    except ValueError:
        raise SourceError(f"{path}:1: not JSON Lines, a JSON array or CSV (name a CSV file "
                          "*.csv, or give --format)") from None
    if isinstance(obj, dict) and "conversations" in obj:
        return "sharegpt"
    if isinstance(obj, dict) and ("request" in obj or ("messages" in obj and "id" not in obj
                                                       and "domain" not in obj)):
        return "openai"
    return "jsonl"


def _json_lines(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    for lineno, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            yield lineno, json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SourceError(f"{path}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})"
                              ) from None
        except RecursionError:
            raise SourceError(f"{path}:{lineno}: invalid JSON: nested too deeply") from None


def _json_array(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """Each element of a top-level JSON array, with the line it starts on (lines counted as
    the array is walked: linear, a one-line array of a million elements included)."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    counted, line = 0, 1

    def line_at(at: int) -> int:
        nonlocal counted, line
        line += text.count("\n", counted, at)
        counted = at
        return line

    def fail(at: int, msg: str) -> SourceError:
        return SourceError(f"{path}:{line_at(max(at, counted))}: invalid JSON: {msg}")

    def skip(at: int) -> int:
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
        return at

    pos = skip(pos)
    if pos < len(text) and text[pos] == "]":
        return
    while True:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise fail(exc.pos, exc.msg) from None
        except RecursionError:
            raise fail(pos, "nested too deeply") from None
        if end - pos > MAX_RECORD_CHARS:
            raise fail(pos, f"an element over {MAX_RECORD_CHARS // 2**20} MiB characters")
        yield line_at(pos), obj
        pos = skip(end)
        if pos < len(text) and text[pos] == ",":
            pos = skip(pos + 1)
        elif pos < len(text) and text[pos] == "]":
            if text[pos + 1:].strip():
                raise fail(pos + 1, "extra data after the array")
            return
        else:
            raise fail(pos, "expected ',' or ']' between elements")


def _csv_rows(path: Path, text: str, fields: Fields) -> Iterator[tuple[int, Any]]:
    dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
    reader = csv.reader(text.splitlines(keepends=True), dialect)

    def next_row() -> list[str] | None:
        try:
            return next(reader)
        except StopIteration:
            return None
        except csv.Error as exc:
            raise SourceError(f"{path}:{max(reader.line_num, 1)}: invalid CSV: {exc}") from None

    header = next_row()
    if header is None:
        return
    names = [h.strip() for h in header]
    for flag, col in (("--text-field", fields.text), ("--domain-field", fields.domain),
                      ("--completion-field", fields.completion),
                      ("--reference-field", fields.reference)):
        if col is not None and col not in names:
            raise SourceError(f"{path}:1: no column {col!r} ({flag}); the columns are "
                              f"{', '.join(repr(n) for n in names)}")
    while (row := next_row()) is not None:
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(names):
            raise SourceError(f"{path}:{reader.line_num}: {len(row)} fields, the header has "
                              f"{len(names)}")
        yield reader.line_num, dict(zip(names, row, strict=True))


def read_source(path: Path, fmt: str, fields: Fields
                ) -> tuple[list[Record], list[Dropped], str]:
    """Every record of one source file, what was dropped and the format it was read as;
    raises :class:`SourceError` on malformed input."""
    text = _read_bytes(path)
    if not text.strip():
        raise SourceError(f"{path}: empty source file")
    kind = detect(path, text) if fmt == "auto" else fmt
    rows: Iterator[tuple[int, Any]]
    if kind == "csv":
        rows = _csv_rows(path, text, fields)
    elif text.lstrip().startswith("["):
        rows = _json_array(path, text)
    else:
        rows = _json_lines(path, text)
    parse = _plain if kind == "csv" else _PARSERS[kind]
    records: list[Record] = []
    dropped: list[Dropped] = []
    for lineno, obj in rows:
        rec = Record(str(path), lineno)
        try:
            parse(obj, rec, fields)
            _common(obj, rec, fields)
        except _Bad as exc:
            raise SourceError(f"{rec.where}: {exc}") from None
        except _Drop as exc:
            dropped.append(Dropped(rec.where, str(exc)))
            continue
        records.append(rec)
    return records, dropped, kind


def read_sources(paths: Sequence[Path], fmt: str = "auto", fields: Fields | None = None
                 ) -> tuple[list[Record], list[Dropped], Mapping[str, str]]:
    """Every record of the sources, in order, what was dropped, and each file's format."""
    fields = fields or Fields()
    records: list[Record] = []
    dropped: list[Dropped] = []
    formats: dict[str, str] = {}
    for path in paths:
        recs, drops, formats[str(path)] = read_source(path, fmt, fields)
        records += recs
        dropped += drops
    return records, dropped, formats
