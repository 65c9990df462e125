"""The prompts a pilot replays, in its trace subset's order (the benchmarks sample them)."""

from __future__ import annotations

from pathlib import Path

from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.selection import drawn_trace, pass_draws, trace_draw
from pytest_osprey.pilot.trace import load_trace


def pilot_prompts(pilot_path: Path, count: int) -> list[tuple[str, object]]:
    """``count`` prompts of the pilot's trace subset: the sampled pass's seeded draw (its
    ``sampling.sampled.prompts`` set to ``count``)."""
    pilot = load_pilot(pilot_path)
    spec = pilot.trace
    files = [f if f.is_absolute() else pilot_path.parent / f for f in spec.files]
    trace = load_trace(files).subset(ids=spec.ids, slices=spec.slices)
    trace = drawn_trace(trace, trace_draw(pilot, trace))
    sampling = pilot.sampling.model_copy(update={"sampled": pilot.sampling.sampled.model_copy(
        update={"enabled": True, "prompts": count})})
    drawn = pass_draws(pilot.model_copy(update={"sampling": sampling}), trace.prompts)
    return [(p.id, p) for p in drawn["sampled"].prompts]
