"""Prompt traces: load and validate JSONL prompt files, select subsets, hash the content.

A trace is the fixed list of prompts every engine condition replays. Each line of a trace
file is one JSON object (see ``prompts/README.md`` for the format). Every problem is
reported as a :class:`TraceError` whose message names the file and the 1-based line, e.g.
``prompts/x.jsonl:7: duplicate id 'code-03' (first at line 2)``.

The trace hash (:attr:`Trace.sha256`) covers only the content of the prompts, in trace
order: it does not change with file names, whitespace, key order or blank lines, and it
changes whenever a prompt, its settings or its expectation changes.
"""

from __future__ import annotations

import hashlib
import json
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
        first ``limit`` prompts overall. Unknown ids or slices, a limit below 1 and a
        selection that leaves no prompt raise :class:`TraceError`.
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


# --------------------------------------------------------------------------- validation


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
