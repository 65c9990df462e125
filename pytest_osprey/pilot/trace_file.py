"""Reading trace files: JSONL prompt lines validated one by one, every problem a
:class:`TraceError` naming the file and the 1-based line."""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .trace import (
    _CONTROL_RE,
    _FUNCTION_RE,
    _MESSAGE_KEYS,
    CONTENT_FIELDS,
    DEFAULT_SLICE,
    EXPECT_FORMS,
    MAX_NAME_LENGTH,
    MAX_NEW_TOKENS_LIMIT,
    ROLES,
    Prompt,
    Trace,
    TraceError,
)


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
    if kind not in EXPECT_FORMS:
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


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
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
