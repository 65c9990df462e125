"""Atomic file writes: readers never see half a file, a failed write leaves the old one, and
no registered secret reaches the disk (see redact)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .redact import json_ready, scrub


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a temporary file and rename, so readers never see half a file."""
    # Scrubbed value by value: a secret replaced in the serialized text could cut into the
    # JSON's own syntax (a quote, a comma).
    text = json.dumps(json_ready(data), indent=2, ensure_ascii=False, default=str,
                      allow_nan=False) + "\n"
    _write_atomic(path, text)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (secrets scrubbed) to a temporary file of its own (two writers never
    share one), flush it to disk, then rename it over ``path``; on any failure the old file
    stays and the temporary one is removed."""
    _write_atomic(path, scrub(text))


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
