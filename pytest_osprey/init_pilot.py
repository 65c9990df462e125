"""``python -m pytest_osprey init``: a commented pilot for the user's stack, from flags (CI) or
prompts (a terminal), with what the engine can tell asked of it: a drafter's architecture from
its config (EAGLE-3, Osprey, a plain causal LM) sets its speculation, SGLang's version and
``ServerArgs`` defaults are asked of its own Python, an endpoint is asked what it serves.

The text is written by :mod:`pytest_osprey.pilot.writer` (validated before it is written);
the CLI then dry-runs it as ``run --dry-run`` does."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engines.kinds import kind_of
from .pilot.base import ConfigError
from .pilot.schema import Pilot
from .pilot.writer import ENGINES, Answers, DrafterAnswer, pilot_text, write_pilot
from .preflight.artifact import draft_layout, family

Ask = Callable[[str], str]


class InitError(ConfigError):
    """A value missing or wrong: one line naming the flag or file (exit 4)."""


@dataclass
class Written:
    path: Path
    pilot: Pilot
    lines: list[str] = field(default_factory=list)
    """What was asked and found (the engine's answers, a built trace), then the file."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", metavar="ENGINE",
                   help="sglang, vllm, transformers, or the URL of the baseline's running "
                        "server (an endpoint stack)")
    p.add_argument("--target", metavar="MODEL", help="The target: a folder or a model id")
    p.add_argument("--drafter", action="append", default=[], metavar="NAME=PATH",
                   help="A drafter: its folder (an endpoint stack: its server's URL); "
                        "repeatable. With two or more, the first is the one serving today "
                        "(role current) unless --current says otherwise")
    p.add_argument("--current", metavar="NAME",
                   help="The drafter serving today (none: every drafter is a candidate)")
    p.add_argument("--temperature", type=float, metavar="T",
                   help="The service's sampling temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=None, metavar="P",
                   help="The service's top-p (default 1.0)")
    p.add_argument("--concurrency", type=int, metavar="N",
                   help="Requests the service has in flight (load levels x1 and N)")
    p.add_argument("--trace", metavar="FILE", help="The prompt trace (JSONL)")
    p.add_argument("--trace-source", action="append", default=[], metavar="SOURCE",
                   help="Build the trace from these logs (`trace build`; repeatable)")
    p.add_argument("--trace-out", metavar="FILE",
                   help="Where a built trace goes (default: OUT's name with -trace.jsonl)")
    p.add_argument("--python", metavar="PATH",
                   help="The engine's Python (default: $OSPREY_SGLANG_PYTHON or "
                        "$OSPREY_VLLM_PYTHON if set, else this one)")
    p.add_argument("--protocol", choices=("openai", "sglang"), default="openai",
                   help="An endpoint stack's protocol (default openai)")
    p.add_argument("--dtype", metavar="DTYPE",
                   help="Precision (default: the target's config, else bfloat16)")
    p.add_argument("--name", metavar="NAME", help="Pilot name (default: from the target)")
    p.add_argument("--out", default="pilot.yaml", metavar="FILE",
                   help="The pilot to write (default pilot.yaml)")
    p.add_argument("--force", action="store_true", help="Replace an existing pilot (and trace)")
    p.add_argument("--no-dry-run", action="store_true", help="Write the pilot only")


# --------------------------------------------------------------------------- answers


def _prompt(ask: Ask, text: str) -> str:
    try:
        return ask(text).strip()
    except EOFError:
        return ""


def complete(args: argparse.Namespace, ask: Ask | None) -> None:
    """Fill what the flags left out by asking (a terminal), or fail naming the flags."""
    missing = [flag for flag, value in (
        ("--engine", args.engine), ("--target", args.target), ("--drafter", args.drafter),
        ("--temperature", args.temperature), ("--concurrency", args.concurrency),
        ("--trace", args.trace or args.trace_source)) if value in (None, [], "")]
    if not missing:
        return
    if ask is None:
        raise InitError(f"init: missing {', '.join(missing)} (no terminal to ask; "
                        "`init --help` lists the flags)")
    if args.engine is None:
        args.engine = _until(ask, "Engine (sglang, vllm, transformers, or the baseline "
                             "server's URL): ", lambda text: _engine(text) and text)
    if args.target is None:
        args.target = _prompt(ask, "Target model (folder or model id): ")
    if not args.drafter:
        while entry := _prompt(ask, "Drafter NAME=PATH (empty line: done): "):
            args.drafter.append(entry)
    if len(args.drafter) > 1 and args.current is None:
        first = _split(args.drafter[0], 0)[0]
        args.current = _prompt(ask, f"Drafter serving today [{first}; none: all are "
                                    "candidates]: ") or None
    if args.temperature is None:
        args.temperature = _until(ask, "Serving temperature (0: greedy): ",
                                  lambda text: _number(text, "--temperature", float))
        if args.top_p is None and args.temperature > 0:
            args.top_p = _until(ask, "Serving top-p [1.0]: ",
                                lambda text: _number(text or "1.0", "--top-p", float))
    if args.concurrency is None:
        args.concurrency = _until(ask, "Requests in flight at the service: ",
                                  lambda text: _number(text, "--concurrency", int))
    if not (args.trace or args.trace_source):
        said = _prompt(ask, "Trace file (JSONL), or `build LOG...` to build one from logs: ")
        if said.startswith("build "):
            args.trace_source = said.split()[1:]
        else:
            args.trace = said or None


def _until(ask: Ask, question: str, read: Callable[[str], Any], tries: int = 3) -> Any:
    """An answer ``read`` accepts, asked again (saying why) after a wrong one."""
    for _ in range(tries - 1):
        try:
            return read(_prompt(ask, question))
        except InitError as exc:
            question = f"({exc}) {question}"
    return read(_prompt(ask, question))


def _number(text: str, flag: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise InitError(f"{flag}: {text!r} is not a{'n integer' if kind is int else ' number'}"
                        ) from None


def _split(entry: str, i: int) -> tuple[str, str]:
    """``NAME=PATH`` (a bare path is named after its last part)."""
    name, sep, source = entry.partition("=")
    if not sep or "://" in name:
        source = entry
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(entry.rstrip("/")).name).strip("-.")
        name = name or f"drafter{i + 1}"
    if not name or not source:
        raise InitError(f"--drafter {entry!r}: expected NAME=PATH")
    return name, source


def _written_path(text: str, folder: Path) -> str:
    """A local path as the pilot names it (relative to its folder, leading ./ so a server
    engine reads a folder, not a model id); anything else as given."""
    path = Path(os.path.expanduser(text))
    if not path.exists():
        return text
    full = path.resolve()
    rel = os.path.relpath(full, folder.resolve())
    if rel.startswith(os.path.join(os.pardir, os.pardir)):
        return str(full)  # far from the pilot: absolute reads better than ../../..
    return rel if rel.startswith(".") else f"./{rel}"


def _config(folder: str) -> tuple[dict[str, Any] | None, str | None]:
    path = Path(os.path.expanduser(folder)) / "config.json"
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, f"{path} not readable here ({type(exc).__name__})"
    return (data, None) if isinstance(data, dict) else (None, f"{path} is not a JSON object")


def drafter_answer(engine: str, name: str, source: str, role: str, folder: Path,
                   version: str | None = None) -> DrafterAnswer:
    """One drafter's condition, its speculation chosen from its architecture."""
    engine_kind = kind_of(engine)
    if not engine_kind.launches:
        return DrafterAnswer(name, source, "current" if role == "current" else "candidate",
                             why=("Its server speculates as it was launched to; the campaign "
                                  "reads what it reports.",))
    config, unread = _config(source)
    kind = family(config) if config is not None else "causal-lm"
    layout = draft_layout(config) if config is not None else None
    advice = engine_kind.draft_advice(layout, kind)
    why = [f"{unread}: taken for a plain causal-LM drafter; check the algorithm.",
           ] if unread else []
    why += advice.why
    spec: dict[str, Any] = {
        "algorithm": engine_kind.head_algorithms.get(kind, engine_kind.plain_algorithm),
        **advice.spec}
    if engine_kind.server:
        spec["adaptive"] = False
    return DrafterAnswer(name, _written_path(source, folder),
                         "current" if role == "current" else "candidate", spec,
                         (" ".join(why),) if why else (), version)


def _probe(url: str, protocol: str) -> str:
    """What an endpoint answers (its models), or that it cannot be reached: a line."""
    import httpx

    path = "/v1/models" if protocol == "openai" else "/server_info"
    try:
        reply = httpx.get(url.rstrip("/") + path, timeout=5.0)
        reply.raise_for_status()
        data = reply.json()
    except (httpx.HTTPError, ValueError) as exc:
        said = " ".join(str(exc).split())[:120]
        return f"{url}: not reachable now ({type(exc).__name__}: {said})"
    if protocol == "openai" and isinstance(data, dict) and isinstance(data.get("data"), list):
        ids = [str(m.get("id")) for m in data["data"] if isinstance(m, dict)]
        return f"{url}: serves {', '.join(ids[:4]) or 'no model'}"
    model = data.get("model_path") if isinstance(data, dict) else None
    return f"{url}: answers{f' (model {model})' if model else ''}"


# --------------------------------------------------------------------------- the pilot


def _engine(text: str | None) -> tuple[str, str | None]:
    """(engine, the baseline's URL for an endpoint stack)."""
    given = (text or "").strip()
    if given.startswith(("http://", "https://")):
        return "endpoint", given
    if given not in ENGINES or not kind_of(given).launches:  # an endpoint is given by URL
        raise InitError(f"--engine {given!r}: sglang, vllm, transformers, or the baseline "
                        "server's URL (http://host:port) for an endpoint stack")
    return given, None


def _python(engine: str, given: str | None) -> tuple[str | None, str]:
    """(target.python as written, the interpreter to ask now)."""
    if given:
        local = Path(os.path.expanduser(given))
        written = str(local.resolve()) if os.sep in given and local.exists() else given
        return written, os.path.expandvars(written)
    var = kind_of(engine).python_variable
    if var and os.environ.get(var):
        return f"${{{var}}}", os.environ[var]
    return None, sys.executable


def _roles(names: list[str], current: str | None) -> list[str]:
    if current is not None and current.lower() == "none":
        return ["candidate"] * len(names)
    if current is not None and current not in names:
        raise InitError(f"--current {current!r}: not a drafter (the drafters: "
                        f"{', '.join(names)})")
    if len(names) < 2:
        if current is not None:
            raise InitError(f"--current {current!r}: a drafter serving today needs a "
                            "candidate beside it (give another --drafter)")
        return ["candidate"]
    chosen = current or names[0]
    return ["current" if n == chosen else "candidate" for n in names]


def _trace(args: argparse.Namespace, out: Path, target: str) -> tuple[str, list[str]]:
    """The trace as the pilot names it, and what building it said."""
    if args.trace:
        if not Path(args.trace).is_file():
            raise InitError(f"--trace {args.trace}: no such file")
        return _written_path(args.trace, out.parent), []
    from .trace_build import (
        BuildError,
        BuildOptions,
        RedactionError,
        SourceError,
        build,
        summary_lines,
    )

    dest = Path(args.trace_out) if args.trace_out else out.with_name(f"{out.stem}-trace.jsonl")
    tokenizer = target if Path(target).is_dir() else None
    try:
        built = build(BuildOptions(sources=[Path(s) for s in args.trace_source], out=dest,
                                   tokenizer=tokenizer, force=args.force))
    except (BuildError, SourceError, RedactionError) as exc:
        raise InitError(str(exc)) from None
    return _written_path(str(built.trace), out.parent), summary_lines(built)


def _dtype(engine: str, target: str, given: str | None) -> str:
    if given:
        return given
    config, _ = _config(target)
    found = (config or {}).get("torch_dtype") or (config or {}).get("dtype")
    if isinstance(found, str) and found in ("float32", "bfloat16", "float16"):
        return found
    return "float32" if kind_of(engine).in_process or config is not None else "bfloat16"


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(text.rstrip("/")).name).strip("-.")[:64]
    return slug or "pilot"


def init(args: argparse.Namespace, ask: Ask | None = None) -> Written:
    """Gather the answers (flags, then ``ask`` for what they leave out), ask the engine what
    it can, write the pilot: :class:`InitError` (one line) on anything wrong."""
    out = Path(args.out)
    if out.exists() and not args.force:  # before a trace is built for it
        raise InitError(f"{out}: already exists; --force replaces it")
    complete(args, ask)
    if not args.target:
        raise InitError("--target: no target model given")
    if not args.drafter:
        raise InitError("--drafter: at least one drafter is needed (NAME=PATH)")
    if not (args.trace or args.trace_source):
        raise InitError("--trace: no trace given (a file, or --trace-source LOG to build one)")
    top_p = 1.0 if args.top_p is None else args.top_p
    if args.temperature < 0 or not 0 < top_p <= 1:
        raise InitError("--temperature must be 0 or more, --top-p in (0, 1]")
    if args.concurrency < 1:
        raise InitError(f"--concurrency {args.concurrency}: at least 1")
    engine, baseline_url = _engine(args.engine)
    names = [_split(d, i) for i, d in enumerate(args.drafter)]
    if len({n for n, _ in names}) < len(names):
        raise InitError(f"--drafter: names repeat ({', '.join(n for n, _ in names)})")
    roles = _roles([n for n, _ in names], args.current)
    lines: list[str] = []
    python, asked_with = _python(engine, args.python)
    target_notes: list[str] = []
    version = None
    engine_kind = kind_of(engine)
    if engine_kind.facts is not None:
        facts = engine_kind.facts(asked_with)
        lines.append(facts.line())
        target_notes.append(facts.line())
        if facts.asked:
            version = facts.version
            if engine_kind.facts_note:
                target_notes.append(engine_kind.facts_note)
    elif not engine_kind.launches:  # an endpoint stack: its servers are asked
        for url in [baseline_url or "", *(source for _, source in names)]:
            lines.append(_probe(url, args.protocol))
        target_notes += [*lines, "The dry run contacts no endpoint; the campaign checks each "
                         "is up before it starts."]
    drafters = tuple(drafter_answer(engine, n, s, r, out.parent, version)
                     for (n, s), r in zip(names, roles, strict=True))
    trace, built = _trace(args, out, args.target)
    lines += built
    served_by_name = not kind_of(engine).launches and not Path(args.target).is_dir()
    written_target = args.target if served_by_name else _written_path(args.target, out.parent)
    answers = Answers(
        engine=engine, target=written_target, drafters=drafters, trace=trace,
        temperature=args.temperature, top_p=top_p, concurrency=args.concurrency,
        name=args.name or _slug(args.target), dtype=_dtype(engine, args.target, args.dtype),
        python=python, baseline_url=baseline_url, protocol=args.protocol,
        header=(f"A pilot for {args.target} on {engine}: the baseline (speculation off) against "
                f"{', '.join(f'{d.name} ({d.role})' for d in drafters)}.",
                "Written by `python -m pytest_osprey init`; review it like code."),
        target_notes=tuple(target_notes), file=str(out))
    pilot = write_pilot(pilot_text(answers), out, force=args.force)
    lines.append(f"wrote {out}")
    return Written(out, pilot, lines)
