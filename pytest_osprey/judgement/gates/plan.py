"""What each test asserts: the gates of a pilot, planned from the pilot alone (so pytest can
collect one test per gate before anything runs)."""

from __future__ import annotations

from ...pilot.schema import Pilot
from .kinds import GateKind as K
from .spec import GateSpec


def plan_gates(pilot: Pilot, conditions: list[str], dry_run: bool = False) -> list[GateSpec]:
    """Every gate of this pilot, in the order the tests run."""
    specs: list[GateSpec] = [GateSpec(K.COMMAND_LINE, c) for c in conditions]
    drafted = [c for c in conditions if pilot.conditions[c].speculates]
    specs += [GateSpec(K.ARTIFACT, c) for c in drafted]
    if dry_run:
        return specs
    for c in conditions:
        specs += [GateSpec(K.COMPLETED, c, load=level) for level in pilot.load.levels]
    if pilot.load.boots_per_condition > 1:
        specs += [GateSpec(K.BOOT_CONSISTENCY, c) for c in conditions]
    base = pilot.baseline
    judged = [c for c in conditions if c != base and pilot.conditions[c].role != "baseline"]
    specs += [GateSpec(K.FAIRNESS, c, reference=base) for c in judged]
    if pilot.sampling.greedy:
        specs += [GateSpec(K.GREEDY_IDENTITY, c, reference=base) for c in judged]
        specs += [GateSpec(K.CORRECTNESS, c, reference=base) for c in judged]
    if pilot.sampling.sampled.enabled:
        specs += [GateSpec(K.DISTRIBUTION, c, reference=base) for c in judged]
    if pilot.sampling.params.enabled:
        specs += [GateSpec(K.SAMPLING_PARAMS, c, reference=base) for c in judged]
    # Reported beside the verdict, never deciding it: speed says what acceptance is worth.
    current = pilot.current if pilot.current in conditions else None
    specs += [GateSpec(K.ACCEPTANCE, c, reference=current if c != current else None,
                       gating=False)
              for c in judged if pilot.conditions[c].speculates]
    for cand in [c for c in judged if pilot.conditions[c].role == "candidate"]:
        for ref in [r for r in pilot.references(cand) if r in conditions]:
            for level in pilot.load.levels:
                primary = level == pilot.primary_load
                specs.append(GateSpec(K.SPEEDUP, cand, reference=ref, load=level, gating=primary))
            unusual = pilot.trace.unusual_slice
            specs.append(GateSpec(
                K.SPEEDUP, cand, reference=ref, load=pilot.primary_load, slice=unusual,
                gating=pilot.decision.gate_unusual_slice,
            ))
        mem = pilot.limits.memory
        if mem.max_peak_mb is not None or mem.max_increase_pct is not None:
            specs.append(GateSpec(K.MEMORY, cand, reference=pilot.baseline))
        cost = pilot.limits.cost
        if cost.max_cost_per_request is not None:
            specs.append(GateSpec(K.COST, cand, load=pilot.primary_load))
        if cost.max_break_even_days is not None:
            # Against the drafter it replaces too: the setup cost is repaid only by what the
            # candidate saves beyond what the current drafter already saves.
            specs += [GateSpec(K.BREAK_EVEN, cand, reference=ref, load=pilot.primary_load)
                      for ref in pilot.references(cand) if ref in conditions]
        for i, lim in enumerate(pilot.limits.latency):
            for level in [lim.load] if lim.load else list(pilot.load.levels):
                specs.append(GateSpec(K.LATENCY, cand, load=level, index=i))
        if pilot.limits.goodput is not None:
            specs += [GateSpec(K.GOODPUT, cand, reference=base, load=level,
                               gating=level == pilot.primary_load)
                      for level in pilot.load.levels]
    return specs
