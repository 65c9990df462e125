"""``--osprey-dry-run``: build every condition's command line and check it, booting nothing;
and the API key each condition needs is where the pilot says (its variable set, not empty)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..engines.base import EngineError
from ..engines.environment import withheld
from ..engines.kinds import DryRunVerdict, target_kind
from ..pilot.schema import Pilot
from .artifact import target_weights_problem


def key_variable(pilot: Pilot, condition: str) -> tuple[str, str] | None:
    """(pilot field, variable name) of the API key ``condition`` needs, if any."""
    cond = pilot.conditions[condition]
    if cond.endpoint is not None:
        var = cond.endpoint.api_key_env
        return (f"conditions.{condition}.endpoint.api_key_env", var) if var else None
    if target_kind(pilot).server and pilot.target.api_key_env:
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
    kind = target_kind(pilot)
    out = {c: CommandCheck(c, True) for c in conditions}
    verdicts: Mapping[str, DryRunVerdict] = {}
    if kind.dry_run is not None:
        verdicts = kind.dry_run(pilot)
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
                continue
            line = kind.command_line(pilot, name, verdicts)
            check.ok = check.ok and line.ok
            check.lines += line.lines
            if line.launched:
                check.environment = environment_line(pilot, name)
        except EngineError as exc:
            check.ok = False
            check.lines.append(str(exc))
    return out
