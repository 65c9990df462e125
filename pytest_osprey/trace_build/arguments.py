"""``trace build``'s command-line flags (the command itself is in ``__main__``)."""

from __future__ import annotations

import argparse


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text}: a share from 0 to 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from . import FORMATS, GROUPS

    sub = parser.add_subparsers(dest="trace_command", required=True, metavar="COMMAND")
    b = sub.add_parser("build", help="A trace from request logs, conversation dumps, prompt "
                       "JSONL or CSV (docs/traces.md)",
                       description="Build a trace: a seeded sample stratified by domain, "
                       "near-duplicates collapsed, budgets from logged completions, personal "
                       "data masked; the summary is written beside it (docs/traces.md).")
    b.add_argument("sources", nargs="+", metavar="SOURCE", help="Source files, read in order")
    b.add_argument("--out", required=True, metavar="FILE", help="The trace to write (JSONL)")
    b.add_argument("--format", choices=FORMATS, default="auto",
                   help="openai (chat JSONL), sharegpt (JSON or JSONL), jsonl (plain prompts), "
                        "csv; auto: by name and first record (default)")
    b.add_argument("--size", type=int, default=50, help="Prompts to sample (default 50)")
    b.add_argument("--seed", type=int, default=0, help="Sampling seed (default 0)")
    b.add_argument("--text-field", default="prompt", metavar="NAME",
                   help="jsonl/csv: key or column of the prompt text (default prompt)")
    b.add_argument("--domain-field", metavar="NAME", help="Key or column naming the domain")
    b.add_argument("--completion-field", metavar="NAME",
                   help="Key or column of the logged completion (openai logs: found as "
                        "response.choices, or the last assistant turn)")
    b.add_argument("--reference-field", metavar="NAME",
                   help="Key or column of a reference answer, carried over as an expect check")
    b.add_argument("--domain-rule", action="append", default=[], metavar="DOMAIN=REGEX",
                   help="A prompt whose text matches REGEX is in DOMAIN (repeatable; the first "
                        "match wins; a --domain-field value comes first)")
    b.add_argument("--default-domain", default="general", metavar="NAME",
                   help="Domain of a prompt no field or rule names (default general)")
    b.add_argument("--unusual-domains", metavar="A,B", help="Domains of the unusual slice")
    b.add_argument("--unusual-rule", metavar="REGEX",
                   help="A prompt whose text matches REGEX is in the unusual slice")
    b.add_argument("--unusual-share", type=_share, metavar="F",
                   help="Share of the sample drawn from the unusual slice (default: its share "
                        "of the source)")
    b.add_argument("--tokenizer", metavar="PATH",
                   help="The target's tokenizer folder, to count tokens (default: an estimate, "
                        "1 token per 4 characters)")
    b.add_argument("--max-new-tokens-cap", type=int, default=1024, metavar="N",
                   help="Cap on a budget taken from a completion (default 1024)")
    b.add_argument("--near-duplicate", type=_share, default=0.8, metavar="J",
                   help="Word-set Jaccard from which two prompts count once (default 0.8)")
    b.add_argument("--redact", default=",".join(GROUPS), metavar="A,B",
                   help=f"Built-in patterns to mask ({', '.join(GROUPS)}; default all; none)")
    b.add_argument("--redact-hook", metavar="MODULE:FUNCTION",
                   help="A callable str -> str run on every text first")
    b.add_argument("--force", action="store_true", help="Replace an existing trace")
