"""Traces built from a product's own traffic: readers, redaction, near-duplicate collapse,
stratified sampling and the build itself (``python -m pytest_osprey trace build``)."""

from __future__ import annotations

from .build import BuildError, BuildOptions, Built, build, summary_lines
from .readers import FORMATS, Fields, SourceError
from .redaction import GROUPS, PATTERNS, RedactionError, Redactor, load_hook

__all__ = ["FORMATS", "GROUPS", "PATTERNS", "BuildError", "BuildOptions", "Built", "Fields",
           "RedactionError", "Redactor", "SourceError", "build", "load_hook", "summary_lines"]
