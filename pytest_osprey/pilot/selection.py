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
from .draw import Draw, draw_prompts, limited
from .loading import where_in_pilot
from .schema import Pilot
from .trace import Prompt, Trace, TraceError, load_trace


def _hint(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _names(names: Sequence[str], n: int = 8) -> str:
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f" ... ({len(names)} in all)" if len(names) > n else "")


def selected_trace(pilot: Pilot, pilot_path: str | os.PathLike[str]) -> Trace:
    """The prompts the pilot selects; :class:`TraceError` for a trace file's problem,
    :class:`ConfigError` (naming the pilot's line) for a selection's."""
    return select_trace(pilot, pilot_path)[0]


def trace_draw(pilot: Pilot, trace: Trace) -> Draw | None:
    """``trace.limit`` / ``limit_per_slice`` as a seeded stratified draw (the pilot's
    ``sampling.seed``) from ``trace``, already cut to ``trace.ids`` and ``trace.slices``;
    None when the pilot sets neither limit."""
    spec = pilot.trace
    if spec.limit is None and spec.limit_per_slice is None:
        return None
    return limited(trace.prompts, spec.limit_per_slice, spec.limit, pilot.sampling.seed,
                   spec.unusual_slice)


def drawn_trace(trace: Trace, draw: Draw | None) -> Trace:
    """``trace`` cut to ``draw``'s prompts (in trace order), with its own hash."""
    if draw is None or len(draw.prompts) == len(trace.prompts):
        return trace
    used = {p.file for p in draw.prompts}
    return Trace.from_prompts(draw.prompts, [f for f in trace.files if f in used])


def pass_draws(pilot: Pilot, prompts: Sequence[Prompt]) -> dict[str, Draw]:
    """The prompts of the sampled and sampling-parameters passes (those enabled), each a
    seeded stratified draw from the campaign's ``prompts``."""
    sampling, unusual = pilot.sampling, pilot.trace.unusual_slice
    out: dict[str, Draw] = {}
    if sampling.sampled.enabled:
        out["sampled"] = draw_prompts(prompts, sampling.sampled.prompts, sampling.seed,
                                      "sampled", unusual)
    if sampling.params.enabled:
        out["params"] = draw_prompts(prompts, sampling.params.prompts, sampling.seed,
                                     "params", unusual)
    return out


def select_trace(pilot: Pilot,
                 pilot_path: str | os.PathLike[str]) -> tuple[Trace, Draw | None]:
    """:func:`selected_trace` with the draw that made it (None without a limit)."""
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
        chosen = trace.subset(ids=spec.ids, slices=spec.slices)
    except TraceError as exc:
        raise ConfigError(f"{where_in_pilot(pilot_path, ('trace',))}: {exc}") from None
    draw = trace_draw(pilot, chosen)
    return drawn_trace(chosen, draw), draw
