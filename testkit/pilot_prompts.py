"""The prompts a pilot replays, in its trace subset's order (the benchmarks sample them)."""

from __future__ import annotations

from pathlib import Path

from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.trace import load_trace


def pilot_prompts(pilot_path: Path, count: int) -> list[tuple[str, object]]:
    """The first ``count`` prompts of the pilot's trace subset (the sampled pass's order)."""
    pilot = load_pilot(pilot_path)
    spec = pilot.trace
    files = [f if f.is_absolute() else pilot_path.parent / f for f in spec.files]
    trace = load_trace(files).subset(ids=spec.ids, slices=spec.slices,
                                     limit_per_slice=spec.limit_per_slice, limit=spec.limit)
    return [(p.id, p) for p in trace.prompts[:count]]
