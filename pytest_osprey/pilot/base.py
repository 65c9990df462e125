"""What every part of the pilot schema shares: strict models and the user-facing error."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class ConfigError(ValueError):
    """A pilot-file problem, worded for the user: ``file:line: dotted.field: message``."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
