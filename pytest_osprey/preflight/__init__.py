"""Preflight: what is checked before anything boots (each condition's engine command line, each
drafter's artifact). Boots nothing; its result is saved as preflight.json."""

from __future__ import annotations

from dataclasses import asdict

from ..pilot.schema import Pilot
from ..results.preflight_file import ArtifactEntry, CheckEntry, CommandLineEntry, Preflight
from .artifact import check_all
from .command_lines import check_command_lines


def run_preflight(pilot: Pilot, conditions: list[str]) -> Preflight:
    """Check every condition's command line and every drafter artifact of ``conditions``."""
    artifacts = check_all(pilot, conditions)
    commands = check_command_lines(pilot, conditions)
    return Preflight(
        artifacts={
            name: ArtifactEntry(ok=rep.ok, checks=[CheckEntry(**asdict(c)) for c in rep.checks])
            for name, rep in artifacts.items()
        },
        command_lines={name: CommandLineEntry(**asdict(c)) for name, c in commands.items()},
    )


__all__ = ["run_preflight"]
