"""The pilot's prompts: its trace files, with the selection its ``trace:`` section makes.

A problem inside a trace file names that file and line; a selection the trace cannot honour
(an id or slice it does not have, nothing left) names the pilot's own line, where the
mistake is.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence

from .base import ConfigError
from .loading import where_in_pilot
from .schema import Pilot
from .trace import Trace, TraceError, load_trace


def _hint(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _names(names: Sequence[str], n: int = 8) -> str:
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f" ... ({len(names)} in all)" if len(names) > n else "")


def selected_trace(pilot: Pilot, pilot_path: str | os.PathLike[str]) -> Trace:
    """The prompts the pilot selects; :class:`TraceError` for a trace file's problem,
    :class:`ConfigError` (naming the pilot's line) for a selection's."""
    spec = pilot.trace
    trace = load_trace(spec.files)
    files = ", ".join(str(f) for f in spec.files)
    ids = trace.ids
    known = set(ids)
    for i, pid in enumerate(spec.ids or []):
        if pid not in known:
            raise ConfigError(f"{where_in_pilot(pilot_path, ('trace', 'ids', i))}: prompt id "
                              f"{pid!r} is not in the trace ({files}){_hint(pid, ids)}")
    slices = list(trace.slices())
    for i, name in enumerate(spec.slices or []):
        if name not in slices:
            raise ConfigError(f"{where_in_pilot(pilot_path, ('trace', 'slices', i))}: slice "
                              f"{name!r} is not in the trace (it has {_names(slices)})"
                              f"{_hint(name, slices)}")
    try:
        return trace.subset(ids=spec.ids, slices=spec.slices,
                            limit_per_slice=spec.limit_per_slice, limit=spec.limit)
    except TraceError as exc:
        raise ConfigError(f"{where_in_pilot(pilot_path, ('trace',))}: {exc}") from None
