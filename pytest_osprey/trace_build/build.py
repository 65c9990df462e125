"""``trace build``: a trace in this project's format from what a product already has.

Read the sources, mask personal data, give each record a domain and a slice, collapse
near-duplicates, draw a seeded sample stratified by domain, set each prompt's output budget
from its logged completion, carry reference answers over as ``expect`` checks, then write
the trace and its summary (``NAME.summary.json`` beside it). Nothing is written until all
of it succeeded, and an existing trace is replaced only when asked (``force``).

Only the trace format's fields are written: a source's ids, users, timestamps and other
columns never reach the trace or the summary (which names records by file and line).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import regex

from ..pilot.trace import (
    MAX_NAME_LENGTH,
    MAX_NEW_TOKENS_LIMIT,
    TraceError,
    check_expect,
    load_trace,
)
from ..results.files import write_json_atomic, write_text_atomic
from .dedupe import near_duplicates
from .readers import Dropped, Fields, Record, read_sources
from .redaction import Redactor
from .sampling import Stratum, interleaved, stratified_sample

#: Characters per token of the estimate used without a tokenizer (English text, BPE).
CHARS_PER_TOKEN = 4
UNUSUAL = "unusual"
CORE = "core"
QUANTILES = (5, 25, 50, 75, 95)
#: Dropped records named per reason in the summary.
SHOWN_DROPS = 5
#: The longest one --domain-rule or --unusual-rule may take on one prompt: a pattern that
#: backtracks without end is stopped and named, not waited on.
RULE_SECONDS = 1.0


class BuildError(ValueError):
    """The build cannot go on; the message is one line naming what is wrong."""


class Rule:
    """A user's pattern (``re`` syntax), searched with a time bound per text."""

    def __init__(self, pattern: str, flag: str) -> None:
        self.pattern, self.flag = pattern, flag
        try:
            self.compiled = regex.compile(pattern)
        except (regex.error, re.error) as exc:
            raise BuildError(f"{flag} {pattern!r}: does not compile: {exc}") from None

    def search(self, text: str) -> bool:
        try:
            return self.compiled.search(text, timeout=RULE_SECONDS) is not None
        except TimeoutError:
            raise BuildError(f"{self.flag} {self.pattern!r}: took over {RULE_SECONDS:g} s on "
                             "one prompt (a pattern that backtracks); simplify it") from None


@dataclass
class BuildOptions:
    sources: list[Path]
    out: Path
    size: int = 50
    seed: int = 0
    fmt: str = "auto"
    fields: Fields = field(default_factory=Fields)
    domain_rules: list[tuple[str, Rule]] = field(default_factory=list)
    """(domain, pattern): the first whose pattern the prompt's text matches names it."""
    default_domain: str = "general"
    unusual_domains: list[str] = field(default_factory=list)
    unusual_rule: Rule | None = None
    unusual_share: float | None = None
    tokenizer: str | None = None
    max_new_tokens_cap: int = 1024
    near_duplicate: float = 0.8
    redactor: Redactor = field(default_factory=Redactor)
    force: bool = False


@dataclass
class Built:
    trace: Path
    summary_path: Path
    summary: dict[str, Any]


def parse_rule(text: str) -> tuple[str, Rule]:
    """``DOMAIN=REGEX`` as given to ``--domain-rule``."""
    domain, sep, pattern = text.partition("=")
    if not sep or not domain.strip() or not pattern:
        raise BuildError(f"--domain-rule {text!r}: give it as DOMAIN=REGEX")
    return domain.strip(), compile_pattern(pattern, "--domain-rule")


def compile_pattern(pattern: str, flag: str) -> Rule:
    return Rule(pattern, flag)


def _counter(tokenizer: str | None) -> Callable[[str], int]:
    if tokenizer is None:
        return lambda text: max(1, math.ceil(len(text) / CHARS_PER_TOKEN))
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    except Exception as exc:  # any loader failure is the user's path or files
        raise BuildError(f"--tokenizer {tokenizer}: cannot load: "
                         f"{' '.join(str(exc).split())[:200]}") from None
    return lambda text: max(1, len(tok(text, add_special_tokens=False)["input_ids"]))


def _name(value: str | None, default: str) -> str:
    """A domain as the trace accepts it: one line, trimmed, bounded."""
    text = " ".join((value or "").split())[:MAX_NAME_LENGTH]
    return text or default


def _slug(text: str) -> str:
    return re.sub(r"[^\w.-]+", "-", text).strip("-").lower() or "prompt"


def _redact(rec: Record, redact: Redactor) -> None:
    if rec.prompt is not None:
        rec.prompt = redact(rec.prompt)
    for m in rec.messages or ():
        m["content"] = redact(m["content"])
    if rec.domain is not None:  # a domain field may hold an address: it names ids too
        rec.domain = redact(rec.domain)
    # A reference masked would make a check no output can pass ("contains <EMAIL>"): it is
    # dropped, and counted, instead.
    if rec.reference is not None:
        masked = redact(rec.reference)
        if masked != rec.reference:
            rec.reference, rec.expect_redacted = None, True
    if rec.expect is not None:
        masked_expect = {k: redact(v) if isinstance(v, str) and k != "type" else v
                         for k, v in rec.expect.items()}
        if masked_expect != rec.expect:
            rec.expect, rec.expect_redacted = None, True


def _check_paths(opts: BuildOptions, summary_path: Path) -> None:
    """Outputs that are not directories, never an input, and replaced only with force."""
    sources = {os.path.realpath(p) for p in opts.sources}
    for path in (opts.out, summary_path):
        if os.path.realpath(path) in sources:
            raise BuildError(f"--out {opts.out}: {path} is one of the sources; the trace never "
                             "replaces its input")
        if path.exists() and not path.is_file():
            raise BuildError(f"--out {opts.out}: {path} is not a regular file")
        if path.exists() and not opts.force:
            raise BuildError(f"{path}: already exists; give --force to replace it")


def _domain(rec: Record, opts: BuildOptions) -> str:
    if rec.domain is not None:
        return _name(rec.domain, opts.default_domain)
    text = rec.content()
    for domain, pattern in opts.domain_rules:
        if pattern.search(text):
            return _name(domain, opts.default_domain)
    return opts.default_domain


def _expect(rec: Record) -> dict[str, Any] | None:
    if rec.expect is not None:
        try:
            return check_expect(rec.expect)
        except TraceError as exc:
            raise BuildError(f"{rec.where}: {exc}") from None
    if rec.reference is None:
        return None
    try:
        value = float(rec.reference.replace(",", ""))
    except ValueError:
        return {"type": "contains", "value": rec.reference, "case_sensitive": False}
    if not math.isfinite(value):
        return {"type": "contains", "value": rec.reference, "case_sensitive": False}
    number: int | float = int(value) if value.is_integer() and abs(value) < 2**53 else value
    return {"type": "number", "value": number, "tolerance": 0}


def _quantiles(values: Sequence[int]) -> dict[str, float] | None:
    if not values:
        return None
    arr = np.asarray(values, dtype=float)
    out = {f"p{q}": float(np.percentile(arr, q)) for q in QUANTILES}
    return {**out, "max": float(arr.max()), "mean": round(float(arr.mean()), 1)}


def _drops(dropped: Sequence[Dropped]) -> list[dict[str, Any]]:
    by: dict[str, list[str]] = {}
    for d in dropped:
        by.setdefault(d.reason, []).append(d.where)
    return [{"reason": r, "count": len(w), "first": w[:SHOWN_DROPS]}
            for r, w in sorted(by.items(), key=lambda kv: -len(kv[1]))]


def build(opts: BuildOptions) -> Built:
    """Build the trace ``opts`` describe; raises BuildError (and readers.SourceError,
    redaction.RedactionError) with a one-line message, having written nothing."""
    if opts.size < 1:
        raise BuildError(f"--size {opts.size}: needs at least 1")
    if not 1 <= opts.max_new_tokens_cap <= MAX_NEW_TOKENS_LIMIT:
        raise BuildError(f"--max-new-tokens-cap {opts.max_new_tokens_cap}: from 1 to "
                         f"{MAX_NEW_TOKENS_LIMIT:,}")
    if not 0 < opts.near_duplicate <= 1:
        raise BuildError(f"--near-duplicate {opts.near_duplicate:g}: above 0, at most 1")
    if _name(opts.default_domain, "") != opts.default_domain:
        raise BuildError(f"--default-domain {opts.default_domain!r}: a non-empty name without "
                         f"surrounding or repeated whitespace, at most {MAX_NAME_LENGTH} "
                         "characters")
    if not opts.out.name or opts.out.name in (".", "..") or opts.out.is_dir():
        raise BuildError(f"--out {opts.out}: is a directory; name the trace file to write")
    summary_path = opts.out.with_name(opts.out.stem + ".summary.json")
    _check_paths(opts, summary_path)
    count = _counter(opts.tokenizer)
    records, dropped, formats = read_sources(opts.sources, opts.fmt, opts.fields)
    read = len(records) + len(dropped)
    for rec in records:
        _redact(rec, opts.redactor)
    dups = near_duplicates([r.content() for r in records], opts.near_duplicate)
    for i, kept in sorted(dups.items()):
        dropped.append(Dropped(f"{records[i].where} (of {records[kept].where})",
                               "near-duplicate"))
    pool = [r for i, r in enumerate(records) if i not in dups]
    if not pool:
        raise BuildError(f"no usable prompt in {', '.join(map(str, opts.sources))} "
                         f"({read} records read, all dropped)")
    unusual = set(opts.unusual_domains)
    strata: dict[Stratum, list[int]] = {}
    for i, rec in enumerate(pool):
        domain = _domain(rec, opts)
        odd = domain in unusual or bool(opts.unusual_rule and opts.unusual_rule.search(
            rec.content()))
        strata.setdefault((UNUSUAL if odd else CORE, domain), []).append(i)
    drawn = stratified_sample(strata, opts.size, opts.seed,
                              [k for k in strata if k[0] == UNUSUAL], opts.unusual_share)
    lines: list[str] = []
    inputs: list[int] = []
    outputs: list[int] = []
    budgets: Counter[str] = Counter()
    expects: Counter[str] = Counter()
    # Written interleaved (domains round-robin, slices mixed), never grouped: a reader that
    # takes the head of the file still sees every domain.
    order = [(s, d, i) for (s, d), i in interleaved(drawn, opts.seed)]
    # Ids number a domain across both slices (and domains that slug alike), so none repeats.
    per_slug = Counter(_slug(d) for _, d, _ in order)
    numbered: Counter[str] = Counter()
    for slice_, domain, i in order:
        rec = pool[i]
        slug = _slug(domain)
        numbered[slug] += 1
        width = max(2, len(str(per_slug[slug])))
        line: dict[str, Any] = {"id": f"{slug}-{numbered[slug]:0{width}d}",
                                "domain": domain, "slice": slice_}
        if rec.prompt is not None:
            line["prompt"] = rec.prompt
        else:
            line["messages"] = rec.messages
        inputs.append(count("\n".join([rec.prompt] if rec.prompt is not None else
                                      [m["content"] for m in rec.messages or ()])))
        # The server's own count (usage) is the target's tokenizer's; the estimate is not.
        # With n > 1 choices, usage counts them all: the kept choice's own text is counted
        # instead, or, without its text, the total divided by n (said in the summary).
        usage = rec.completion_tokens if opts.tokenizer is None or not rec.completion else None
        per_choice = rec.choices > 1 and usage is not None
        if per_choice and rec.completion:
            usage = None
        elif per_choice and usage is not None:
            usage = max(1, round(usage / rec.choices))
        if rec.completion or usage:
            tokens = usage or count(rec.completion or "")
            line["max_new_tokens"] = min(tokens, opts.max_new_tokens_cap)
            budgets["capped" if tokens > opts.max_new_tokens_cap else
                    "from usage / n" if usage and per_choice else
                    "from usage" if usage else "from completion"] += 1
        elif rec.max_new_tokens is not None:
            line["max_new_tokens"] = min(rec.max_new_tokens, opts.max_new_tokens_cap)
            budgets["carried"] += 1
        else:
            budgets["pilot default"] += 1
        if "max_new_tokens" in line:
            outputs.append(line["max_new_tokens"])
        expect = _expect(rec)
        if expect is not None:
            line["expect"] = expect
            expects["carried" if rec.expect is not None else "from reference"] += 1
        elif rec.expect_redacted:
            expects["dropped: redacted"] += 1
        lines.append(json.dumps(line, ensure_ascii=False))
    text = "".join(ln + "\n" for ln in lines)
    total = len(pool)
    summary: dict[str, Any] = {
        "trace": str(opts.out),
        "sources": [{"file": f, "format": k} for f, k in formats.items()],
        "seed": opts.seed,
        "size": opts.size,
        "prompts": len(lines),
        "tokenizer": opts.tokenizer or f"estimate: 1 token per {CHARS_PER_TOKEN} characters",
        "records": {"read": read, "dropped": len(dropped), "eligible": total},
        "strata": [{"slice": s, "domain": d, "eligible": len(strata[(s, d)]),
                    "eligible_share": round(len(strata[(s, d)]) / total, 4),
                    "sampled": len(drawn[(s, d)]),
                    "sampled_share": round(len(drawn[(s, d)]) / max(1, len(lines)), 4)}
                   for s, d in sorted(strata, key=lambda k: (k[0] == UNUSUAL, k))],
        "slices": dict(Counter(s for s, d in drawn for _ in drawn[(s, d)])),
        "input_tokens": _quantiles(inputs),
        "max_new_tokens": _quantiles(outputs),
        "budgets": dict(budgets),
        "max_new_tokens_cap": opts.max_new_tokens_cap,
        "expect": dict(expects),
        "dropped": _drops(dropped),
        "redacted": {k: v for k, v in opts.redactor.counts.items() if v},
    }
    # The trace is checked as the pilot will load it before it replaces anything.
    probe = opts.out.with_name(f".{opts.out.name}.check")
    try:
        write_text_atomic(probe, text)
        summary["sha256"] = load_trace([probe]).sha256
    except TraceError as exc:
        raise BuildError(f"the built trace does not load: {exc}") from None
    except OSError as exc:
        raise BuildError(f"{opts.out}: cannot write: {exc.strerror or exc}") from None
    finally:
        probe.unlink(missing_ok=True)
    try:
        write_json_atomic(summary_path, summary)
        write_text_atomic(opts.out, text)
    except OSError as exc:
        raise BuildError(f"{opts.out}: cannot write: {exc.strerror or exc}") from None
    return Built(opts.out, summary_path, summary)


def summary_lines(built: Built) -> list[str]:
    """The summary as the terminal shows it."""
    s = built.summary
    rec = s["records"]
    sources = ", ".join(f"{x['file']} [{x['format']}]" for x in s["sources"])
    out = [f"wrote {s['prompts']} prompts to {built.trace} (sha256 {s['sha256'][:12]}), "
           f"seed {s['seed']}, from {rec['eligible']} eligible of {rec['read']} records "
           f"({sources})"]
    out.append(f"{'slice':<10} {'domain':<20} {'eligible':>9} {'share':>7} {'sampled':>8} "
               f"{'share':>7}")
    for row in s["strata"]:
        out.append(f"{row['slice']:<10} {row['domain'][:20]:<20} {row['eligible']:>9} "
                   f"{row['eligible_share']:>7.1%} {row['sampled']:>8} "
                   f"{row['sampled_share']:>7.1%}")
    for key, label in (("input_tokens", "input tokens"), ("max_new_tokens", "max_new_tokens")):
        q = s[key]
        if q:
            out.append(f"{label}: p5 {q['p5']:g}, p50 {q['p50']:g}, p95 {q['p95']:g}, "
                       f"max {q['max']:g}")
    out.append(f"tokens counted by {s['tokenizer']}")
    out.append("budgets: " + (", ".join(f"{v} {k}" for k, v in s["budgets"].items()) or "none")
               + f" (cap {s['max_new_tokens_cap']})")
    if s["expect"]:
        out.append("expect: " + ", ".join(f"{v} {k}" for k, v in s["expect"].items()))
    for d in s["dropped"]:
        out.append(f"dropped {d['count']}: {d['reason']} (e.g. {', '.join(d['first'][:2])})")
    if s["redacted"]:
        out.append("redacted: " + ", ".join(f"{v} {k}" for k, v in s["redacted"].items()))
    out.append(f"summary: {built.summary_path}")
    return out
