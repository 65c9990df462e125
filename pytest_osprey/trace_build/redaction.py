"""Redaction: personal data masked in every text before anything is written.

Built-in patterns mask API keys, e-mail addresses, card numbers and phone numbers; a hook
(any callable ``str -> str``, named ``package.module:function``) runs first, for what only
the product knows (customer names, account numbers). Only counts per pattern are reported,
never what was masked.
"""

from __future__ import annotations

import importlib
import re
from collections import Counter
from collections.abc import Callable, Sequence

Hook = Callable[[str], str]



def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def _card(match: re.Match[str]) -> bool:
    digits = re.sub(r"\D", "", match.group())
    return 13 <= len(digits) <= 19 and _luhn(digits)


def _national(match: re.Match[str]) -> bool:
    # A trunk-prefixed national number has 9 to 12 digits; fewer is a date or a time.
    return 9 <= sum(ch.isdigit() for ch in match.group()) <= 12


def _international_00(match: re.Match[str]) -> bool:
    # "00", a country code and a national number: E.164's 15 digits at most, 9 at least.
    return 11 <= sum(ch.isdigit() for ch in match.group()) <= 17


def _aws_secret(match: re.Match[str]) -> bool:
    # 40 characters of base64 mixing cases and digits: not a hex digest, not a word.
    text = match.group()
    return (any(c.isupper() for c in text) and any(c.islower() for c in text)
            and any(c.isdigit() for c in text))


#: Built-in patterns, in the order they run: (pattern, placeholder, a check every match
#: must pass to be masked). Every pattern is linear: bounded repeats, no nested ones.
PATTERNS: dict[str, tuple[re.Pattern[str], str, Callable[[re.Match[str]], bool] | None]] = {
    "api_key": (re.compile(
        r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{30,}"
        r"|github_pat_[A-Za-z0-9_]{30,}|xox[abprs]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}"
        r"|AIza[0-9A-Za-z_-]{35}|hf_[A-Za-z0-9]{30,}|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"
        r"|glpat-[A-Za-z0-9_-]{20,}"
        r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"
        r"|(?i:\bbearer\s+)[A-Za-z0-9._~+/-]{20,}=*"
        r"|(?i:aws_secret_access_key\s*[=:]\s*)[\"']?[A-Za-z0-9/+]{40}\b"), "<API_KEY>", None),
    # An AWS secret access key on its own: 40 base64 characters, mixed case and digits.
    "aws_secret": (re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"),
                   "<API_KEY>", _aws_secret),
    # Local part and domain in any script (an accented domain too).
    "email": (re.compile(r"(?<![\w.%+-])[\w.%+-]{1,64}@[^\W_](?:[\w-]{0,62}\.){1,8}"
                         r"[^\W\d_]{2,63}\b"), "<EMAIL>", None),
    # Card numbers: 13 to 19 digits, spaces or dashes between, passing the Luhn check. Never
    # after a "+": that is an international phone number (+4915112345678), left to "phone".
    "card": (re.compile(r"(?<![\w+-])\d(?:[ -]?\d){12,18}(?![\w-])"), "<CARD>", _card),
    # International (+44 20 7946 0958), North American ((555) 123-4567, 555-123-4567),
    # national trunk-prefixed with separators (070-123 45 67, 020 7946 0958,
    # 06 12 34 56 78), and bare ten-digit numbers of those plans (0701234567, 5551234567):
    # amounts, dates, ids and Unix times (ten digits from 1) are left alone.
    "phone": (re.compile(
        r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}(?!\w)"
        r"|(?<![\w-])\(?\d{3}\)?[ .-]\d{3}[ .-]\d{4}(?![\w-])"
        r"|(?<![\w.,-])(?:0\d{9}|[2-9]\d{9})(?![\w.,-])"), "<PHONE>", None),
    # Trunk-prefixed national numbers: the rest in groups (070-123 45 67), or in one group of
    # 5 to 8 digits, as German and British numbers are written (030 12345678,
    # 0151 12345678, 07700 900123, 089/1234567).
    "national_phone": (re.compile(
        r"(?<![\w+.,/:-])\(?0\d{1,4}\)?(?:(?:[ .-]\d{2,4}){2,4}|[ /-]\d{5,8})"
        r"(?![\w.,/:-]|-\d)"), "<PHONE>", _national),
    # International with the 00 dialling prefix in place of "+" (0044 20 7946 0958,
    # 0044 (0)20 7946 0958, 0049 30 12345678): written with separators, the number after
    # the country code not starting with 0 (an IBAN's digit groups do), 11 to 17 digits.
    "intl_00_phone": (re.compile(
        r"(?<![\w+.,/:-])00[1-9]\d{0,2}[ .-](?:\(0\)[ .-]?)?[1-9]\d{0,3}(?:[ .-]\d{1,8}){1,4}"
        r"(?![\w.,/:-]|-\d)"), "<PHONE>", _international_00),
}
#: What ``--redact`` names: a name covers the patterns that start with it.
GROUPS = {"api_key": ("api_key", "aws_secret"), "email": ("email",), "card": ("card",),
          "phone": ("phone", "national_phone", "intl_00_phone")}


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

    def __init__(self, patterns: Sequence[str] = tuple(GROUPS), hook: Hook | None = None,
                 hook_name: str | None = None) -> None:
        unknown = [p for p in patterns if p not in GROUPS]
        if unknown:
            raise RedactionError(f"--redact: unknown pattern {unknown[0]!r}; the patterns are "
                                 f"{', '.join(GROUPS)} (or none)")
        self.patterns = [p for name in patterns for p in GROUPS[name]]
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
            pattern, placeholder, keep = PATTERNS[name]
            masked = 0

            def mask(match: re.Match[str], placeholder: str = placeholder,
                     keep: Callable[[re.Match[str]], bool] | None = keep) -> str:
                nonlocal masked
                if keep is not None and not keep(match):
                    return match.group()
                masked += 1
                return placeholder

            text = pattern.sub(mask, text)
            group = next(g for g, members in GROUPS.items() if name in members)
            self.counts[group] += masked
        return text
