"""Redaction: personal data masked in every text before anything is written.

Built-in patterns mask e-mail addresses, phone numbers and API keys; a hook (any callable
``str -> str``, named ``package.module:function``) runs first, for what only the product
knows (customer names, account numbers). Only counts per pattern are reported, never what
was masked.
"""

from __future__ import annotations

import importlib
import re
from collections import Counter
from collections.abc import Callable, Sequence

Hook = Callable[[str], str]

#: Built-in patterns, in the order they run, each with the placeholder it leaves.
PATTERNS: dict[str, tuple[re.Pattern[str], str]] = {
    "api_key": (re.compile(
        r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{30,}"
        r"|github_pat_[A-Za-z0-9_]{30,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
        r"|AIza[0-9A-Za-z_-]{35}|hf_[A-Za-z0-9]{30,})\b"
        r"|(?i:\bbearer\s+)[A-Za-z0-9._~+/-]{20,}=*"), "<API_KEY>"),
    "email": (re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b"), "<EMAIL>"),
    # International (+44 20 7946 0958) or North American ((555) 123-4567, 555-123-4567)
    # numbers: separators required, so amounts, dates and ids are left alone.
    "phone": (re.compile(
        r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}(?!\w)"
        r"|(?<![\w-])\(?\d{3}\)?[ .-]\d{3}[ .-]\d{4}(?![\w-])"), "<PHONE>"),
}


class RedactionError(ValueError):
    """The redaction hook cannot be loaded or misbehaves."""


def load_hook(spec: str) -> Hook:
    """The callable ``package.module:function`` names."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise RedactionError(f"--redact-hook {spec!r}: give it as package.module:function")
    try:
        obj: object = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except ImportError as exc:
        raise RedactionError(f"--redact-hook {spec!r}: cannot import {module!r}: {exc}") from None
    except AttributeError:
        raise RedactionError(f"--redact-hook {spec!r}: {module!r} has no {name!r}") from None
    if not callable(obj):
        raise RedactionError(f"--redact-hook {spec!r}: not callable")
    return obj


class Redactor:
    """Masks text with the hook, then the chosen built-in patterns; counts what it masked."""

    def __init__(self, patterns: Sequence[str] = tuple(PATTERNS), hook: Hook | None = None,
                 hook_name: str | None = None) -> None:
        unknown = [p for p in patterns if p not in PATTERNS]
        if unknown:
            raise RedactionError(f"--redact: unknown pattern {unknown[0]!r}; the patterns are "
                                 f"{', '.join(PATTERNS)} (or none)")
        self.patterns = list(patterns)
        self.hook = hook
        self.hook_name = hook_name
        self.counts: Counter[str] = Counter()

    def __call__(self, text: str) -> str:
        if self.hook is not None:
            try:
                out = self.hook(text)
            except Exception as exc:
                raise RedactionError(f"redaction hook {self.hook_name} failed: "
                                     f"{type(exc).__name__}: {exc}") from None
            if not isinstance(out, str):
                raise RedactionError(f"redaction hook {self.hook_name} returned "
                                     f"{type(out).__name__}, not str")
            if out != text:
                self.counts["hook"] += 1
            text = out
        for name in self.patterns:
            pattern, placeholder = PATTERNS[name]
            text, n = pattern.subn(placeholder, text)
            self.counts[name] += n
        return text
