"""Prompt traces: read and validate JSONL prompt files, select subsets, hash the content,
render a prompt as the text an engine is sent.

A trace is the fixed list of prompts every engine condition replays. Each line of a trace
file is one JSON object (see ``prompts/README.md`` for the format). Every problem is
reported as a :class:`TraceError` whose message names the file and the 1-based line, e.g.
``prompts/x.jsonl:7: duplicate id 'code-03' (first at line 2)``.

The trace hash (:attr:`Trace.sha256`) covers only the content of the prompts, in trace
order: it does not change with file names, whitespace, key order or blank lines, and it
changes whenever a prompt, its settings or its expectation changes.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CONTENT_FIELDS",
    "EXPECT_FORMS",
    "MAX_NEW_TOKENS_LIMIT",
    "ROLES",
    "Prompt",
    "Trace",
    "TraceError",
    "canonical_json",
    "check_expect",
    "load_trace",
    "render_prompt",
    "trace_hash",
]

#: The fields of a prompt line, in documentation order; also the fields the hash covers.
CONTENT_FIELDS: tuple[str, ...] = (
    "id",
    "domain",
    "slice",
    "prompt",
    "messages",
    "max_new_tokens",
    "expect",
)
#: Chat roles a message may have.
ROLES: tuple[str, ...] = ("system", "user", "assistant")
#: Upper bound on ``max_new_tokens``; anything above is taken for a mistake.
MAX_NEW_TOKENS_LIMIT = 1_000_000
#: Slice of a prompt that names none.
DEFAULT_SLICE = "core"
#: Longest id, domain or slice name accepted.
MAX_NAME_LENGTH = 200

#: ``expect`` forms: type -> (required fields, optional fields), ``type`` itself excluded.
EXPECT_FORMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "exact": (("value",), ()),
    "contains": (("value",), ("case_sensitive",)),
    "regex": (("pattern",), ()),
    "number": (("value",), ("tolerance",)),
    "json_schema": (("schema",), ()),
    "python": (("function",), ()),
}

_MESSAGE_KEYS: tuple[str, ...] = ("role", "content")
_FUNCTION_RE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class TraceError(ValueError):
    """A trace file or a trace selection is invalid; the message names the file and line."""


@dataclass(frozen=True)
class Prompt:
    """One prompt of a trace, as loaded and validated.

    Exactly one of ``prompt`` (plain text) and ``messages`` (a chat) is set. ``file`` and
    ``line`` say where it was read; they are not part of the content or the trace hash.
    """

    id: str
    domain: str
    slice: str
    prompt: str | None
    messages: tuple[Mapping[str, str], ...] | None = field(hash=False)
    max_new_tokens: int | None
    expect: Mapping[str, Any] | None = field(hash=False)
    file: str
    line: int

    @property
    def where(self) -> str:
        """``file:line`` of this prompt, for messages."""
        return f"{self.file}:{self.line}"

    def content(self) -> dict[str, Any]:
        """The content fields as plain JSON data; absent optional fields are left out.

        This is exactly what the trace hash covers, and it is itself a valid trace line.
        """
        out: dict[str, Any] = {"id": self.id, "domain": self.domain, "slice": self.slice}
        if self.prompt is not None:
            out["prompt"] = self.prompt
        if self.messages is not None:
            out["messages"] = [dict(m) for m in self.messages]
        if self.max_new_tokens is not None:
            out["max_new_tokens"] = self.max_new_tokens
        if self.expect is not None:
            out["expect"] = _plain(self.expect)
        return out


def _plain(value: Any) -> Any:
    """A deep copy of JSON-like data with mappings as dicts and sequences as lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def canonical_json(data: Any) -> str:
    """Canonical JSON text: sorted keys, compact separators, UTF-8 characters kept."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def trace_hash(prompts: Sequence[Prompt]) -> str:
    """SHA-256 (hex) of the prompts' canonical content lines, in order.

    Equal to ``sha256sum`` of a file holding, for each prompt, ``canonical_json(content)``
    followed by ``"\\n"``.
    """
    digest = hashlib.sha256()
    for prompt in prompts:
        digest.update(canonical_json(prompt.content()).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def _quote_list(items: Sequence[str]) -> str:
    return ", ".join(repr(i) for i in items)


@dataclass(frozen=True)
class Trace:
    """An ordered, validated list of prompts with its content hash."""

    prompts: tuple[Prompt, ...]
    sha256: str
    files: tuple[str, ...]

    @classmethod
    def from_prompts(cls, prompts: Sequence[Prompt], files: Sequence[str] = ()) -> Trace:
        """Build a trace from prompts, computing the hash."""
        return cls(prompts=tuple(prompts), sha256=trace_hash(prompts), files=tuple(files))

    def __len__(self) -> int:
        return len(self.prompts)

    def __iter__(self) -> Iterator[Prompt]:
        return iter(self.prompts)

    @property
    def ids(self) -> list[str]:
        """Prompt ids in trace order."""
        return [p.id for p in self.prompts]

    def by_id(self) -> dict[str, Prompt]:
        """Prompt id -> prompt, in trace order."""
        return {p.id: p for p in self.prompts}

    def slices(self) -> dict[str, list[str]]:
        """Slice name -> prompt ids, slices in order of first appearance."""
        out: dict[str, list[str]] = {}
        for p in self.prompts:
            out.setdefault(p.slice, []).append(p.id)
        return out

    def _source(self) -> str:
        return ", ".join(self.files) if self.files else "trace"

    def subset(
        self,
        ids: Sequence[str] | None = None,
        slices: Sequence[str] | None = None,
        limit_per_slice: int | None = None,
        limit: int | None = None,
    ) -> Trace:
        """A deterministic selection of this trace, in trace order, with its own hash.

        Filters apply in this order: ``ids`` and ``slices`` (a prompt must match both when
        both are given), then the first ``limit_per_slice`` prompts of each slice, then the
        first ``limit`` prompts overall (a pilot's ``trace.limit`` and ``limit_per_slice``
        are seeded stratified draws instead: pilot/draw.py). Unknown ids or slices, a limit
        below 1 and a selection that leaves no prompt raise :class:`TraceError`.
        """
        src = self._source()
        if isinstance(ids, str) or isinstance(slices, str):
            raise TraceError(f"{src}: subset ids and slices must be lists of names, not a string")
        selected = list(self.prompts)
        if ids is not None:
            known = {p.id for p in self.prompts}
            unknown = [i for i in dict.fromkeys(ids) if i not in known]
            if unknown:
                raise TraceError(f"{src}: unknown prompt ids: {_quote_list(unknown)}")
            wanted = set(ids)
            selected = [p for p in selected if p.id in wanted]
        if slices is not None:
            known_slices = list(self.slices())
            unknown = [s for s in dict.fromkeys(slices) if s not in known_slices]
            if unknown:
                raise TraceError(
                    f"{src}: unknown slices: {_quote_list(unknown)} "
                    f"(the trace has {_quote_list(known_slices)})"
                )
            wanted_slices = set(slices)
            selected = [p for p in selected if p.slice in wanted_slices]
        for name, value in (("limit_per_slice", limit_per_slice), ("limit", limit)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise TraceError(f"{src}: {name} must be a positive integer, got {value!r}")
        if limit_per_slice is not None:
            seen: dict[str, int] = {}
            kept: list[Prompt] = []
            for p in selected:
                seen[p.slice] = seen.get(p.slice, 0) + 1
                if seen[p.slice] <= limit_per_slice:
                    kept.append(p)
            selected = kept
        if limit is not None:
            selected = selected[:limit]
        if not selected:
            raise TraceError(f"{src}: the subset selects no prompts")
        used = {p.file for p in selected}
        return Trace.from_prompts(selected, [f for f in self.files if f in used])


# --------------------------------------------------------------------------- reading


class _LineError(Exception):
    """Internal: a problem on the current line, before the file:line prefix is added."""


def _did_you_mean(name: str, allowed: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(allowed), n=1, cutoff=0.6)
    if not close and len(name) >= 3:  # abbreviations: 'tol' -> 'tolerance'
        close = [a for a in allowed if a.startswith(name.lower())][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_keys(obj: Mapping[str, Any], allowed: Sequence[str], what: str) -> None:
    for key in obj:
        if key not in allowed:
            raise _LineError(
                f"unknown key {key!r} in {what}{_did_you_mean(key, allowed)}; "
                f"allowed: {', '.join(allowed)}"
            )


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _name(obj: Mapping[str, Any], key: str, *, default: str | None = None) -> str:
    """A required (or defaulted) short name: id, domain, slice."""
    value = obj.get(key)
    if value is None:
        if default is not None:
            return default
        raise _LineError(f"missing {key!r}")
    if not isinstance(value, str):
        raise _LineError(f"{key!r} must be a string, got {_type_name(value)}")
    if not value.strip():
        raise _LineError(f"{key!r} must not be empty")
    if value != value.strip() or _CONTROL_RE.search(value):
        raise _LineError(
            f"{key!r} must not have surrounding whitespace or control characters: {value!r}"
        )
    if len(value) > MAX_NAME_LENGTH:
        raise _LineError(f"{key!r} is longer than {MAX_NAME_LENGTH} characters")
    return value


def _messages(value: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list):
        raise _LineError(f"'messages' must be an array of objects, got {_type_name(value)}")
    if not value:
        raise _LineError("'messages' must not be empty")
    out: list[dict[str, str]] = []
    for i, msg in enumerate(value):
        what = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise _LineError(f"{what} must be an object, got {_type_name(msg)}")
        _check_keys(msg, _MESSAGE_KEYS, what)
        for key in _MESSAGE_KEYS:
            if key not in msg:
                raise _LineError(f"{what} has no {key!r}")
        role, content = msg["role"], msg["content"]
        if role not in ROLES:
            raise _LineError(
                f"{what}.role {role!r} is not one of {', '.join(ROLES)}"
                + (_did_you_mean(role, ROLES) if isinstance(role, str) else "")
            )
        if not isinstance(content, str):
            raise _LineError(f"{what}.content must be a string, got {_type_name(content)}")
        if not content.strip():
            raise _LineError(f"{what}.content must not be empty")
        out.append({"role": role, "content": content})
    return tuple(out)


def _max_new_tokens(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _LineError(f"'max_new_tokens' must be a positive integer, got {value!r}")
    if value < 1:
        raise _LineError(f"'max_new_tokens' must be a positive integer, got {value}")
    if value > MAX_NEW_TOKENS_LIMIT:
        raise _LineError(
            f"'max_new_tokens' {value} is absurdly large (limit {MAX_NEW_TOKENS_LIMIT:,})"
        )
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _expect(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _LineError(f"'expect' must be an object, got {_type_name(value)}")
    forms = list(EXPECT_FORMS)
    kind = value.get("type")
    if kind is None:
        raise _LineError(f"'expect' has no 'type' (one of {', '.join(forms)})")
    if not isinstance(kind, str) or kind not in EXPECT_FORMS:  # a list or mapping: unhashable
        hint = _did_you_mean(kind, forms) if isinstance(kind, str) else ""
        raise _LineError(f"expect.type {kind!r} is not one of {', '.join(forms)}{hint}")
    required, optional = EXPECT_FORMS[kind]
    _check_keys(value, ("type", *required, *optional), f"expect of type {kind!r}")
    for key in required:
        if key not in value:
            raise _LineError(f"expect of type {kind!r} needs {key!r}")
    if kind in ("exact", "contains"):
        if not isinstance(value["value"], str):
            raise _LineError(
                f"expect.value must be a string for {kind!r}, got {_type_name(value['value'])}"
            )
        if kind == "contains" and not value["value"]:
            raise _LineError("expect.value must not be empty for 'contains'")
        cs = value.get("case_sensitive")
        if cs is not None and not isinstance(cs, bool):
            raise _LineError(f"expect.case_sensitive must be true or false, got {cs!r}")
    elif kind == "regex":
        pattern = value["pattern"]
        if not isinstance(pattern, str) or not pattern:
            raise _LineError("expect.pattern must be a non-empty string")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _LineError(f"expect.pattern does not compile: {exc}") from None
    elif kind == "number":
        if not _is_number(value["value"]):
            raise _LineError(f"expect.value must be a finite number, got {value['value']!r}")
        tol = value.get("tolerance")
        if tol is not None and (not _is_number(tol) or tol < 0):
            raise _LineError(f"expect.tolerance must be a number >= 0, got {tol!r}")
    elif kind == "json_schema":
        if not isinstance(value["schema"], dict):
            raise _LineError(f"expect.schema must be an object, got {_type_name(value['schema'])}")
    elif kind == "python":
        func = value["function"]
        if not isinstance(func, str) or not _FUNCTION_RE.fullmatch(func):
            raise _LineError(
                f"expect.function must look like 'package.module:function', got {func!r}"
            )
    return dict(value)


def check_expect(value: Any) -> dict[str, Any] | None:
    """An ``expect`` object validated as a trace line's is; a :class:`TraceError` says why."""
    try:
        return _expect(value)
    except _LineError as exc:
        raise TraceError(str(exc)) from None


def _parse_prompt(obj: Any, file: str, line: int) -> Prompt:
    if not isinstance(obj, dict):
        raise _LineError(f"each line must be a JSON object, got {_type_name(obj)}")
    _check_keys(obj, CONTENT_FIELDS, "prompt")
    pid = _name(obj, "id")
    domain = _name(obj, "domain")
    slice_ = _name(obj, "slice", default=DEFAULT_SLICE)
    text, messages = obj.get("prompt"), obj.get("messages")
    if text is not None and messages is not None:
        raise _LineError(f"prompt {pid!r} has both 'prompt' and 'messages'; give exactly one")
    if text is None and messages is None:
        raise _LineError(f"prompt {pid!r} has neither 'prompt' nor 'messages'; give exactly one")
    if text is not None:
        if not isinstance(text, str):
            raise _LineError(f"'prompt' must be a string, got {_type_name(text)}")
        if not text.strip():
            raise _LineError("'prompt' must not be empty")
    return Prompt(
        id=pid,
        domain=domain,
        slice=slice_,
        prompt=text,
        messages=_messages(messages) if messages is not None else None,
        max_new_tokens=_max_new_tokens(obj.get("max_new_tokens")),
        expect=_expect(obj.get("expect")),
        file=file,
        line=line,
    )


def _reject_constant(name: str) -> Any:
    raise _LineError(f"{name} is not valid JSON")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, val in pairs:
        if key in out:
            raise _LineError(f"duplicate key {key!r} in a JSON object")
        out[key] = val
    return out


# A replay trace is prompts, not a corpus: 50-5,000 prompts of up to a context each fit in a
# few MiB. The cap keeps a wrong file (a log, a dump) from costing the judge its memory.
MAX_TRACE_BYTES = 64 * 2**20


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_TRACE_BYTES + 1)
            if len(data) > MAX_TRACE_BYTES:
                raise TraceError(
                    f"{path}: trace file over {MAX_TRACE_BYTES / 2**20:g} MiB; a replay trace "
                    "holds the prompts to replay (sample a few hundred from a large source)")
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file not found") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace file: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise TraceError(
            f"{path}:{line}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at byte column "
            f"{column}); save the file as UTF-8"
        ) from None


def _load_file(path: str) -> list[Prompt]:
    text = _read_text(path)
    prompts: list[Prompt] = []
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        try:
            try:
                obj = json.loads(
                    line,
                    object_pairs_hook=_no_duplicate_keys,
                    parse_constant=_reject_constant,
                )
            except json.JSONDecodeError as exc:
                raise _LineError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
            except RecursionError:
                raise _LineError("invalid JSON: nested too deeply") from None
            prompts.append(_parse_prompt(obj, path, lineno))
        except _LineError as exc:
            raise TraceError(f"{path}:{lineno}: {exc}") from None
    if not prompts:
        raise TraceError(f"{path}: no prompts in file (it is empty or only blank lines)")
    return prompts


def load_trace(paths: Sequence[str | os.PathLike[str]]) -> Trace:
    """Load, validate and concatenate trace files, in the order given.

    Ids must be unique across all files. Raises :class:`TraceError` on any problem.
    """
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    files = [os.fspath(p) for p in paths]
    if not files:
        raise TraceError("load_trace: no trace files given")
    prompts: list[Prompt] = []
    first: dict[str, Prompt] = {}
    for path in files:
        for prompt in _load_file(path):
            prev = first.get(prompt.id)
            if prev is not None:
                where = f"line {prev.line}" if prev.file == prompt.file else prev.where
                raise TraceError(f"{prompt.where}: duplicate id {prompt.id!r} (first at {where})")
            first[prompt.id] = prompt
            prompts.append(prompt)
    return Trace.from_prompts(prompts, list(dict.fromkeys(files)))


# --------------------------------------------------------------------------- rendering


def render_prompt(prompt: Prompt, tokenizer: Any | None = None) -> str:
    """The text to send to an engine for ``prompt``.

    A plain prompt is returned as is. A chat is rendered with the tokenizer's chat template
    when it has one (``apply_chat_template(..., tokenize=False, add_generation_prompt=True)``),
    else with a deterministic ``System: ...\\nUser: ...\\nAssistant:`` layout.

    Engines tokenize the text they are sent with special tokens, so a template's leading
    BOS is dropped where the tokenizer adds one itself: the model then sees one BOS, as a
    chat deployment serves it (chat endpoints tokenize the rendered template without
    special tokens), not two.
    """
    if prompt.prompt is not None:
        return prompt.prompt
    if prompt.messages is None:
        raise ValueError(f"{prompt.where}: prompt {prompt.id!r} has neither prompt nor messages")
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt.messages]
    if (
        tokenizer is not None
        and getattr(tokenizer, "chat_template", None)
        and callable(getattr(tokenizer, "apply_chat_template", None))
    ):
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        if not isinstance(rendered, str):
            raise TypeError(
                f"{prompt.where}: apply_chat_template returned {type(rendered).__name__}, "
                "expected str"
            )
        bos = getattr(tokenizer, "bos_token", None)
        if isinstance(bos, str) and bos and rendered.startswith(bos) and _adds_bos(tokenizer):
            rendered = rendered[len(bos):]
        return rendered
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    lines.append("Assistant:")
    return "\n".join(lines)


def _adds_bos(tokenizer: Any) -> bool:
    """Whether encoding text with the tokenizer's defaults puts its BOS token first."""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None:
        return False
    try:
        ids = tokenizer("x")["input_ids"]
    except Exception:  # a tokenizer that cannot encode here: keep the template's text
        return False
    return bool(ids) and ids[0] == bos_id
