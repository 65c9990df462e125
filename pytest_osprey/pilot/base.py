"""What every part of the pilot schema shares: strict models, bounded types and the
user-facing error.

Strict: a count is an integer written as one (``blocks: true`` or ``blocks: '2'`` is an error,
not 1 or 2), a number a number, a name a string. Bounded: every count, size, duration and
amount has a ceiling, so a typo of a few digits is an error before anything runs, never an
hour of work or a memory blow-up.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema

# Ceilings: generous for any real pilot, small enough that a slip of the keyboard is caught.
MAX_COUNT = 1_000_000
"""Prompts, tokens, samples, divergences..."""
MAX_SECONDS = 7 * 24 * 3600.0
"""Timeouts and latency limits: a week."""
MAX_AMOUNT = 1e15
"""Money, memory (MiB), traffic."""
MAX_RATIO = 1_000.0
"""Speedups."""
MAX_TEXT = 4096
"""Free text: model ids, arguments, environment values, titles."""
MAX_ITEMS = 256
"""List and mapping entries: engine arguments, environment, conditions, load levels."""

PositiveFloat = Annotated[float, Field(gt=0, le=MAX_AMOUNT, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
Amount = Annotated[float, Field(ge=0, le=MAX_AMOUNT, allow_inf_nan=False)]
Ratio = Annotated[float, Field(gt=0, le=MAX_RATIO, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
ShortText = Annotated[str, StringConstraints(max_length=200)]
# A path as written in YAML (a string): strict models want a Path object, so this one
# field type is lax on purpose.
PathText = Annotated[Path, Field(strict=False)]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")]
"""An environment variable's name."""

_SLUG = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_slug(value: str) -> str:
    """A name that becomes a file or folder name: letters, digits, ``-_.``, at most 64
    characters, not ``.`` or ``..`` (so it can never leave the folder it is put in)."""
    if not _SLUG.fullmatch(value) or value in (".", ".."):
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise ValueError(f"{shown!r} is not a safe name: use 1 to 64 letters, digits, '-', "
                         "'_' or '.' (not '.' or '..'); it names the results folder")
    return value


Slug = Annotated[str, StringConstraints(max_length=64), AfterValidator(check_slug),
                 WithJsonSchema({"type": "string", "pattern": r"^[A-Za-z0-9_.-]{1,64}$"})]


class ConfigError(ValueError):
    """A pilot-file problem, worded for the user: ``file:line: dotted.field: message``."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True,
                              strict=True)
