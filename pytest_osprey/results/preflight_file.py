"""preflight.json: what was checked before anything booted (command lines, drafter artifacts)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .files import write_json_atomic


class CheckEntry(BaseModel):
    """One artifact check."""

    model_config = ConfigDict(extra="allow")
    name: str
    ok: bool
    detail: str = ""


class ArtifactEntry(BaseModel):
    """A condition's drafter artifact check."""

    model_config = ConfigDict(extra="allow")
    ok: bool
    checks: list[CheckEntry] = Field(default_factory=list)


class CommandLineEntry(BaseModel):
    """A condition's engine command line and what the engine's own parser said of it."""

    model_config = ConfigDict(extra="allow")
    condition: str
    ok: bool
    lines: list[str] = Field(default_factory=list)
    environment: str | None = None
    """A launched engine's environment: the variables the pilot sets and how many of this
    process's were withheld as possible credentials (names only, never values)."""


class Preflight(BaseModel):
    """preflight.json."""

    model_config = ConfigDict(extra="allow")
    artifacts: dict[str, ArtifactEntry] = Field(default_factory=dict)
    command_lines: dict[str, CommandLineEntry] = Field(default_factory=dict)

    def failed(self) -> dict[str, str]:
        """Condition -> why it must not boot (a failed artifact or command-line check)."""
        out: dict[str, str] = {}
        for name, art in self.artifacts.items():
            if not art.ok:
                out[name] = "artifact check failed"
        for name, cmd in self.command_lines.items():
            if not cmd.ok:
                out.setdefault(name, "command line check failed")
        return out

    def save(self, directory: Path) -> None:
        write_json_atomic(directory / "preflight.json", self.model_dump(mode="json"))


def read_preflight(path: Path) -> Preflight | None:
    """preflight.json at ``path``, or None when there is none; unreadable is a ValueError."""
    if not path.is_file():
        return None
    try:
        return Preflight.model_validate(json.loads(path.read_text("utf-8")))
    except (ValueError, ValidationError, OSError) as exc:
        raise ValueError(f"{path}: not a preflight file: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ValueError(f"{path}: not a preflight file: JSON nested too deeply") from None
