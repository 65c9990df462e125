"""The base of every section summary.json carries: frozen, extra keys kept (a newer file
still reads), and each field's docstring its description in the JSON Schema."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Sheet(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True)
