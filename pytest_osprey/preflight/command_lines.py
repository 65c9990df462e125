"""``--osprey-dry-run``: build every condition's command line and check it, booting nothing."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from ..engines.base import EngineError
from ..pilot.schema import Pilot


@dataclass
class CommandCheck:
    condition: str
    ok: bool
    lines: list[str] = field(default_factory=list)


def check_command_lines(pilot: Pilot, conditions: list[str]) -> dict[str, CommandCheck]:
    """Per condition: its (masked) command line, and what the engine's own parser said."""
    engine = pilot.target.engine
    out = {c: CommandCheck(c, True) for c in conditions}
    sglang_lines: list[str] = []
    sglang_error: str | None = None
    if engine == "sglang":
        from ..engines.sglang import dry_run_check

        try:
            sglang_lines = dry_run_check(pilot)
        except EngineError as exc:
            sglang_error = str(exc)
    for name in conditions:
        check = out[name]
        cond = pilot.conditions[name]
        try:
            if cond.endpoint is not None:
                check.lines.append(f"endpoint {cond.endpoint.url} ({cond.endpoint.protocol}): "
                                   "nothing is launched")
            elif engine == "sglang":
                from ..engines.sglang import sglang_argv

                argv = sglang_argv(pilot, name, pilot.target.port or 30000)
                check.lines.append(shlex.join(argv))
                if sglang_error and f"{name!r}" in sglang_error:
                    check.ok = False
                    check.lines.append(sglang_error)
                check.lines += [line for line in sglang_lines
                                if f"{name!r}" in line or "not importable" in line]
            elif engine == "vllm":
                from ..engines.vllm import vllm_argv

                check.lines.append(shlex.join(vllm_argv(pilot, name, pilot.target.port or 8000)))
            else:
                from ..engines.transformers import TransformersEngine

                TransformersEngine.validate(pilot, name)
                check.lines.append("embedded transformers engine: no command line to launch")
        except EngineError as exc:
            check.ok = False
            check.lines.append(str(exc))
    return out
