"""A commented pilot file from a stack's answers (engine, target, drafters, serving sampling,
concurrency, trace): the text ``python -m pytest_osprey init`` writes.

The text is loaded through the pilot loader before it is written, so a file that lands on disk
is one ``run`` accepts; an existing file is never replaced without ``force``."""

from __future__ import annotations

import json
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .base import ConfigError
from .loading import load_pilot
from .schema import Pilot

SERVER_ENGINES = ("sglang", "vllm")
ENGINES = ("sglang", "vllm", "endpoint", "transformers")
SERVED_LEVEL = "served"
_PLAIN = re.compile(r"^[A-Za-z_./][A-Za-z0-9_./-]*$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


@dataclass(frozen=True)
class DrafterAnswer:
    """One drafter condition: where it is (a folder, or an endpoint's URL), its role, and the
    speculation settings chosen for it with the reasons, said in the file as comments."""

    name: str
    source: str
    role: Literal["current", "candidate"] = "candidate"
    speculation: dict[str, Any] | None = None
    why: tuple[str, ...] = ()
    engine_version: str | None = None


@dataclass(frozen=True)
class Answers:
    """Everything a pilot for one stack is written from."""

    engine: str
    target: str
    drafters: tuple[DrafterAnswer, ...]
    trace: str
    """The trace file as the pilot names it (relative to the pilot's folder, or absolute)."""
    temperature: float
    concurrency: int
    top_p: float = 1.0
    name: str = "pilot"
    dtype: str = "bfloat16"
    python: str | None = None
    baseline_url: str | None = None
    protocol: str = "openai"
    header: tuple[str, ...] = ()
    """Comment lines opening the file (how it was written, what the engine said)."""
    target_notes: tuple[str, ...] = ()
    """Comment lines above the target's keys (the engine's defaults)."""
    file: str = "pilot.yaml"
    """The pilot's file name, for the commands its header gives."""


def scalar(value: Any) -> str:
    """``value`` as a YAML scalar the loader reads back as the same type."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"{value:g}" if isinstance(value, float) else str(value)
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text)  # a JSON string is a YAML double-quoted scalar


def flow(mapping: dict[str, Any], start: int = 0) -> str:
    """A flow mapping, broken after a comma (indented under its first key) where a line would
    pass 96 characters from column ``start``."""
    lines = ["{"]
    for i, (k, v) in enumerate(mapping.items()):
        item = f"{k}: {scalar(v)}" + ("," if i < len(mapping) - 1 else "}")
        gap = "" if lines[-1] == "{" else " "
        column = start if len(lines) == 1 else 0
        if column + len(lines[-1] + gap + item) > 96:
            lines.append(" " * (start + 1) + item)
        else:
            lines[-1] += gap + item
    return "\n".join(lines)


def _comments(lines: tuple[str, ...] | list[str], indent: str = "") -> list[str]:
    """Comment lines, wrapped; a line break in a value never ends the comment."""
    out: list[str] = []
    for line in lines:
        out += textwrap.wrap(" ".join(line.split()), width=96 - len(indent),
                             initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ",
                             break_on_hyphens=False) or [f"{indent}#"]
    return out


def _target(a: Answers) -> list[str]:
    out = ["target:", f"  engine: {a.engine}"]
    out += _comments(a.target_notes, "  ")
    if a.engine == "endpoint":
        out += ["  # The model the servers serve (name sent to an OpenAI-style server; a local",
                "  # folder also gives the chat template and tokenizer).",
                f"  model: {scalar(a.target)}"]
        return out
    out += [f"  model: {scalar(a.target)}", f"  dtype: {a.dtype}"]
    if a.engine == "transformers":
        return [*out, "  device: cpu"]
    if a.python:
        out += ["  # The engine's own Python (its venv); $VARS expand when the pilot is read.",
                f"  python: {scalar(a.python)}"]
    else:
        out += ["  # No python: this interpreter runs the engine. Name the engine's venv Python",
                "  # here (python: /opt/venv/bin/python) if it lives elsewhere."]
    out += ["  # Servers boot one at a time (order: sequential below); a large target takes",
            "  # minutes to load.", "  boot_timeout_s: 1800"]
    return out


def _conditions(a: Answers) -> list[str]:
    out = ["conditions:", "  baseline:",
           "    role: baseline            # speculation off: the kill switch, always kept"]
    if a.engine == "endpoint":
        out.append(f"    endpoint: {flow({'url': a.baseline_url, 'protocol': a.protocol})}")
    for d in a.drafters:
        out += [f"  {d.name}:", f"    role: {d.role}"]
        if d.role == "current":
            out[-1] += "             # the drafter serving today: candidates must beat it too"
        if a.engine == "endpoint":
            out += _comments(d.why, "    ")
            out.append(f"    endpoint: {flow({'url': d.source, 'protocol': a.protocol})}")
            continue
        out.append(f"    drafter: {scalar(d.source)}")
        out += _comments(d.why, "    ")
        if d.speculation is not None:
            out.append(f"    speculation: {flow(d.speculation, len('    speculation: '))}")
        if d.engine_version:
            out += ["    # The engine version asked at init: fairness holds every condition to it.",
                    f"    pins: {flow({'engine_version': d.engine_version})}"]
    return out


def _sampling(a: Answers) -> list[str]:
    serving = {"temperature": a.temperature} | ({"top_p": a.top_p} if a.top_p != 1.0 else {})
    if a.temperature > 0:
        why = ["Timed at the sampling the service uses (a drafter's edge falls with",
               "temperature); at T > 0 the distribution check runs too (sampled outputs",
               "against the target's own distribution), and a greedy pass beside it feeds",
               "identity."]
    else:
        why = ["The service decodes greedily: speed is timed greedy and identity compares",
               "every condition's greedy output with the baseline's token for token."]
    return ["sampling:", *_comments(why, "  "), f"  serving: {flow(serving)}"]


def _load(a: Answers) -> list[str]:
    levels: dict[str, Any] = {"low": 1}
    if a.concurrency > 1:
        levels[SERVED_LEVEL] = a.concurrency
    out = ["load:",
           "  # Alone (x1: the drafter's best case) and at the concurrency the service runs",
           "  # (batching leaves less idle compute for drafting; the primary level decides)."]
    if a.engine == "sglang" and a.concurrency > 48:
        out += ["  # SGLang runs at most 48 requests at once on a speculative server by default:",
                "  # give every condition the same --max-running-requests (target.engine_args)."]
    out.append(f"  levels: {flow(levels)}")
    if a.engine in SERVER_ENGINES:
        out += ["  # One server up at a time (one GPU); two boots per condition so a per-boot",
                "  # offset is told from the drafter's effect.",
                "  order: sequential", "  boots_per_condition: 2"]
    else:
        out += ["  order: interleaved        # blocks alternate between conditions"]
    out += ["  passes: 4                  # early stopping looks after each pass"]
    return out


def pilot_text(a: Answers) -> str:
    """The pilot file for ``a``, every section with a comment on why it is set so."""
    header = [*a.header,
              "Reference for every key: docs/pilot-reference.md (or `python -m pytest_osprey "
              "schema`).",
              f"Check it, booting nothing: python -m pytest_osprey run {a.file} --dry-run",
              f"Then measure and judge: python -m pytest_osprey run {a.file}"]
    out = _comments(header)
    out.append(f"name: {scalar(a.name)}")
    out += _target(a)
    out += _conditions(a)
    out += ["trace:", f"  files: [{scalar(a.trace)}]"]
    out += _sampling(a)
    out += _load(a)
    primary = SERVED_LEVEL if a.concurrency > 1 else "low"
    out += ["limits:",
            "  # Faster than speculation off (and than the current drafter), with 95% confidence.",
            "  speedup_min: 1.0",
            "decision:", f"  primary_load: {primary}",
            "report:", f"  title: {scalar(f'{a.name}: drafters against speculation off')}"]
    return "\n".join(out) + "\n"


def write_pilot(text: str, out: Path, *, force: bool = False) -> Pilot:
    """Validate ``text`` as the pilot file ``out`` (paths resolved from its folder; a drafter
    missing here is the dry run's to report) and write it; :class:`ConfigError` names ``out``
    and the field at fault, or that ``out`` exists and ``force`` was not given."""
    if out.exists() and not force:
        raise ConfigError(f"{out}: already exists; --force replaces it")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Validated in place (relative paths resolve from the pilot's own folder) under a
    # temporary name, then moved: a file that fails validation is never left behind.
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, "utf-8")
        try:
            pilot = load_pilot(tmp, absent_drafters=True)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(str(tmp), str(out))) from None
        if force:
            os.replace(tmp, out)
        else:
            try:
                with out.open("x", encoding="utf-8") as fh:  # no-replace, even if it appeared
                    fh.write(text)
            except FileExistsError:
                raise ConfigError(f"{out}: already exists; --force replaces it") from None
    finally:
        tmp.unlink(missing_ok=True)
    return pilot
