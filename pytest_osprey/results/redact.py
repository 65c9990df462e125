"""Secret values scrubbed from everything the plugin writes or prints.

The pilot names its secrets only by environment variable (``api_key_env``); their values
are registered here when a run starts or an engine reads its key, and every writer (records,
campaign.json, summary.json, reports, logs, the terminal) passes its text through
:func:`scrub`. A server that echoes the Authorization header in an error body, or logs its
own arguments, then leaves ``***`` where the key was.

Process-wide on purpose: a secret known anywhere must be hidden everywhere, including text
built far from where the key was read.
"""

from __future__ import annotations

import html
import json
import math
import threading
from typing import Any, TypeVar
from urllib.parse import quote

from .packed import Packed

MASK = "***"

_LOCK = threading.Lock()
_VALUES: set[str] = set()
_FORMS: tuple[str, ...] = ()  # every written form of every value, longest first

T = TypeVar("T")


def _forms(value: str) -> set[str]:
    """The value as it may appear once written: raw, JSON-escaped, HTML-escaped, URL-quoted."""
    out = {value, html.escape(value), html.escape(value, quote=False), quote(value, safe="")}
    for ascii_only in (True, False):
        out.add(json.dumps(value, ensure_ascii=ascii_only)[1:-1])
    return {f for f in out if f}


def register(*values: str | None) -> None:
    """Scrub these values from now on (empty values are ignored)."""
    global _FORMS
    new = {v for v in values if v and v not in _VALUES}
    if not new:
        return
    with _LOCK:
        _VALUES.update(new)
        forms: set[str] = set()
        for v in _VALUES:
            forms |= _forms(v)
        _FORMS = tuple(sorted(forms, key=len, reverse=True))


def reset() -> None:
    """Forget every registered secret (a test's clean slate; a run never needs it)."""
    global _FORMS
    with _LOCK:
        _VALUES.clear()
        _FORMS = ()


def scrub(text: str) -> str:
    """``text`` with every registered secret (in any written form) replaced by ``***``."""
    forms = _FORMS
    if not forms or not text:
        return text
    for form in forms:
        if form in text:
            text = text.replace(form, MASK)
    return text


def scrub_bytes(data: bytes) -> bytes:
    """:func:`scrub` for raw output (a server's log lines)."""
    forms = _FORMS
    if not forms:
        return data
    for form in forms:
        raw = form.encode("utf-8", "surrogatepass")
        if raw in data:
            data = data.replace(raw, MASK.encode())
    return data


def scrub_obj(obj: T) -> T:
    """A JSON-like value with every string in it (keys too) scrubbed; structure unchanged."""
    if not _FORMS:
        return obj
    return _walk(obj, set())  # type: ignore[no-any-return]


def json_ready(obj: T) -> T:
    """``obj`` as it may be written: every string scrubbed (see :func:`scrub_obj`) and every
    non-finite float (NaN, inf) as null, which strict JSON parsers accept and readers take for
    "not measured" rather than for a value."""
    return _walk(obj, set(), finite=True)  # type: ignore[no-any-return]


def _walk(obj: Any, open_: set[int], finite: bool = False) -> Any:
    if isinstance(obj, str):
        return scrub(obj) if _FORMS else obj
    if finite and isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Packed):  # a record's per-token values, written as the list they are
        obj = obj.tolist()
    if not isinstance(obj, dict | list | tuple):
        return obj
    if id(obj) in open_:  # as json.dumps would say
        raise ValueError("Circular reference detected")
    open_.add(id(obj))
    try:
        if isinstance(obj, dict):
            return {(scrub(k) if isinstance(k, str) and _FORMS else k): _walk(v, open_, finite)
                    for k, v in obj.items()}
        items = [_walk(v, open_, finite) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    finally:
        open_.discard(id(obj))
