"""A condition's held-out check (pilot.yaml ``conditions.<name>.held_out``): the drafter's
adaptation data, against which every trace prompt is checked before any boot."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .base import MAX_COUNT, PathText, Strict


class HeldOut(Strict):
    """The trace's prompts checked against the drafter's adaptation data (docs/traces.md)."""

    adaptation_data: PathText
    """The drafter's adaptation data: a file, or a folder of files: JSON (arrays, lines),
    CSV or text, compressed or not (gzip, xz, bzip2, zip: recognised by content). Every
    trace prompt is looked for in it, exact and near copies (artifact gate); data that
    cannot be read as text fails the check."""
    max_overlap: Annotated[int, Field(ge=0, le=MAX_COUNT)] = 0
    """Trace prompts that may appear in the adaptation data before the artifact gate fails
    (0: any overlap fails)."""
    containment: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.5
    """A prompt appears in the data when one record holds at least this share of its word
    n-grams (1: verbatim; 0.5 catches a copy with about one word in ten changed)."""
    ngram: Annotated[int, Field(ge=2, le=16)] = 5
    """Words per shingle; a prompt shorter than this is matched as a whole."""
