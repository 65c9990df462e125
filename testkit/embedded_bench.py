"""The command line and engines the embedded-engine benchmarks share: the tiny models, the
shipped trace, the baseline and drafters as conditions, each condition's engine started."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pytest_osprey.engines import BootSpec
from pytest_osprey.engines.embedded.engine import TransformersEngine
from pytest_osprey.pilot.schema import Condition, Pilot, Speculation, Target, TraceSpec

from .factories import TINY_MODELS

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "prompts" / "pilot.jsonl"


def parser(doc: str | None, *, prompts: int, threads: int | None) -> argparse.ArgumentParser:
    """--models, --trace, --prompts, --tokens, --k and --threads, with this benchmark's
    defaults for how many prompts and torch threads (None: torch's own)."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    ap.add_argument("--models", type=Path, default=TINY_MODELS)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--prompts", type=int, default=prompts)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4, help="draft tokens per verify step")
    ap.add_argument("--threads", type=int, default=threads,
                    help="torch threads (default: %(default)s; None: torch's)")
    return ap


def conditions(args: argparse.Namespace, *drafters: str,
               more: dict[str, Path] | None = None) -> dict[str, Condition]:
    """The baseline, then each of ``drafters`` (folders under --models) and ``more`` (name:
    folder) as a candidate drafting ``--k`` tokens."""
    spec = Speculation(algorithm="assisted", num_draft_tokens=args.k)
    out = {"baseline": Condition(role="baseline")}
    folders = {d: args.models / d for d in drafters} | (more or {})
    for name, folder in folders.items():
        out[name] = Condition(role="candidate", drafter=folder, speculation=spec)
    return out


def start(args: argparse.Namespace, conds: dict[str, Condition],
          logs: Path = Path("/tmp")) -> dict[str, TransformersEngine]:
    """One started engine per condition, on the tiny target with --threads torch threads."""
    pilot = Pilot(
        target=Target(model=str(args.models / "tiny-target"), context_length=1024,
                      threads=args.threads),
        conditions=conds,
        trace=TraceSpec(files=[args.trace]),
    )
    engines: dict[str, Any] = {}
    for name in pilot.conditions:
        engines[name] = TransformersEngine(pilot, name, BootSpec(name, logs))
        engines[name].start()
    return engines
