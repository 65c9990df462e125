"""Preflight: what is checked before anything boots (each condition's engine command line, each
drafter's artifact). Boots nothing; its result is saved as preflight.json."""

from __future__ import annotations

from dataclasses import asdict

from ..pilot.schema import Pilot
from ..results.preflight_file import ArtifactEntry, CheckEntry, CommandLineEntry, Preflight
from .artifact import check_all
from .command_lines import check_command_lines
from .held_out import held_out_check


def run_preflight(pilot: Pilot, conditions: list[str]) -> Preflight:
    """Check every condition's command line and every drafter artifact of ``conditions``."""
    artifacts = check_all(pilot, conditions)
    commands = check_command_lines(pilot, conditions)
    entries = {name: [CheckEntry(**asdict(c)) for c in rep.checks]
               for name, rep in artifacts.items()}
    for name, checks in entries.items():  # the held-out check is one of the artifact's
        if (held_out := held_out_check(pilot, name)) is not None:
            checks.insert(0, held_out)
    return Preflight(
        artifacts={name: ArtifactEntry(ok=all(c.ok for c in checks), checks=checks)
                   for name, checks in entries.items()},
        command_lines={name: CommandLineEntry(**asdict(c)) for name, c in commands.items()},
    )


__all__ = ["run_preflight"]
