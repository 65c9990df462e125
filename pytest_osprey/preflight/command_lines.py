"""``--osprey-dry-run``: build every condition's command line and check it, booting nothing;
and the API key each condition needs is where the pilot says (its variable set, not empty)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..engines.base import EngineError
from ..engines.environment import withheld
from ..pilot.schema import Pilot
from .artifact import target_weights_problem

if TYPE_CHECKING:
    from ..engines.sglang.check import Verdict

KEY_FILE_SHOWN = "<temporary 0600 file holding the API key>"
_SERVERS = ("sglang", "vllm")


def key_variable(pilot: Pilot, condition: str) -> tuple[str, str] | None:
    """(pilot field, variable name) of the API key ``condition`` needs, if any."""
    cond = pilot.conditions[condition]
    if cond.endpoint is not None:
        var = cond.endpoint.api_key_env
        return (f"conditions.{condition}.endpoint.api_key_env", var) if var else None
    if pilot.target.engine in _SERVERS and pilot.target.api_key_env:
        return ("target.api_key_env", pilot.target.api_key_env)
    return None


def missing_key(pilot: Pilot, condition: str) -> str | None:
    """Why ``condition``'s API key is not there, or None (the environment its engine gets:
    this process's, then target.env, then the condition's env)."""
    needed = key_variable(pilot, condition)
    if needed is None:
        return None
    field_name, var = needed
    env = {**os.environ, **pilot.target.env, **pilot.conditions[condition].env}
    if env.get(var):
        return None
    state = "is empty" if var in env else "is not set"
    return (f"{field_name}: environment variable {var} {state}; it must hold the API key "
            f"(export {var}=... before the run)")


@dataclass
class CommandCheck:
    condition: str
    ok: bool
    lines: list[str] = field(default_factory=list)
    environment: str | None = None  # a launched engine's: what the pilot sets, what is withheld


def environment_line(pilot: Pilot, condition: str) -> str:
    """What a launched engine's environment holds: the variables the pilot sets (names only)
    and how many of this process's are withheld as possible credentials."""
    layers = (pilot.target.env, pilot.conditions[condition].env)
    sets = sorted({k for layer in layers for k in layer})
    held = withheld(*layers)
    shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
    return (f"environment: the pilot sets {', '.join(sets) if sets else 'nothing'}; "
            + (f"{len(held)} variable(s) of this process withheld ({shown})" if held
               else "no variable of this process withheld"))


def check_command_lines(pilot: Pilot, conditions: list[str]) -> dict[str, CommandCheck]:
    """Per condition: its (masked) command line, and what the engine's own parser said."""
    engine = pilot.target.engine
    out = {c: CommandCheck(c, True) for c in conditions}
    verdicts: dict[str, Verdict] = {}
    if engine == "sglang":
        from ..engines.sglang.check import dry_run_check

        verdicts = dry_run_check(pilot)
    weights = target_weights_problem(pilot)
    for name in conditions:
        check = out[name]
        cond = pilot.conditions[name]
        if weights and cond.endpoint is None:
            check.ok = False
            check.lines.append(weights)
        key_problem = missing_key(pilot, name)
        if key_problem:
            check.ok = False
            check.lines.append(key_problem)
        try:
            if cond.endpoint is not None:
                check.lines.append(f"endpoint {cond.endpoint.url} ({cond.endpoint.protocol}): "
                                   "nothing is launched")
            elif engine == "sglang":
                from ..engines.sglang.check import seed_note
                from ..engines.sglang.engine import sglang_argv

                key_file = KEY_FILE_SHOWN if pilot.target.api_key_env else None
                argv = sglang_argv(pilot, name, pilot.target.port or 30000, key_file=key_file)
                check.lines.append(shlex.join(argv))
                check.environment = environment_line(pilot, name)
                verdict = verdicts.get(name)
                if verdict is not None:
                    check.ok = check.ok and verdict.ok
                    check.lines += verdict.lines
                note = seed_note(pilot, argv)
                if note:
                    check.lines.append(note)
            elif engine == "vllm":
                from ..engines.vllm.engine import vllm_argv

                check.lines.append(shlex.join(vllm_argv(pilot, name, pilot.target.port or 8000)))
                check.environment = environment_line(pilot, name)
            else:
                from ..engines.embedded.engine import TransformersEngine

                TransformersEngine.validate(pilot, name)
                check.lines.append("embedded transformers engine: no command line to launch")
        except EngineError as exc:
            check.ok = False
            check.lines.append(str(exc))
    return out
