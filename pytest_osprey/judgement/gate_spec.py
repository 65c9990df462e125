"""What each test asserts: the gates of a pilot, planned from the pilot alone (so pytest can
collect one test per gate before anything runs), and the shape of a judged gate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..pilot.schema import Pilot

Outcome = Literal["pass", "fail", "inconclusive", "skip"]
Verdict = Literal["KEEP", "DROP", "INCONCLUSIVE"]


@dataclass(frozen=True)
class GateSpec:
    kind: str  # artifact | completed | greedy_identity | speedup | latency
    condition: str
    reference: str | None = None
    load: str | None = None
    slice: str | None = None
    index: int | None = None  # which latency limit
    gating: bool = True  # False: reported, never decides the verdict

    @property
    def id(self) -> str:
        parts = [self.condition]
        if self.reference:
            parts.append(f"vs-{self.reference}")
        if self.load:
            parts.append(self.load)
        if self.slice:
            parts.append(self.slice)
        if self.index is not None:
            parts.append(f"limit{self.index}")
        return "-".join(parts)


@dataclass
class GateResult:
    spec: GateSpec
    outcome: Outcome
    summary: str
    estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    threshold: float | None = None
    p_value: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.spec.kind,
            "id": self.spec.id,
            "condition": self.spec.condition,
            "reference": self.spec.reference,
            "load": self.spec.load,
            "slice": self.spec.slice,
            "gating": self.spec.gating,
            "outcome": self.outcome,
            "summary": self.summary,
            "estimate": self.estimate,
            "ci": [self.ci_low, self.ci_high] if self.ci_low is not None else None,
            "threshold": self.threshold,
            "p_value": self.p_value,
            "details": self.details,
        }


PREFLIGHT = ("command_line", "artifact")  # judged before (and without) any boot


def plan_gates(pilot: Pilot, conditions: list[str], dry_run: bool = False) -> list[GateSpec]:
    """Every gate of this pilot, in the order the tests run."""
    specs: list[GateSpec] = [GateSpec("command_line", c) for c in conditions]
    drafted = [c for c in conditions if pilot.conditions[c].speculates]
    specs += [GateSpec("artifact", c) for c in drafted]
    if dry_run:
        return specs
    for c in conditions:
        specs += [GateSpec("completed", c, load=level) for level in pilot.load.levels]
    if pilot.load.boots_per_condition > 1:
        specs += [GateSpec("boot_consistency", c) for c in conditions]
    base = pilot.baseline
    judged = [c for c in conditions if c != base and pilot.conditions[c].role != "baseline"]
    specs += [GateSpec("fairness", c, reference=base) for c in judged]
    if pilot.sampling.greedy:
        specs += [GateSpec("greedy_identity", c, reference=base) for c in judged]
        specs += [GateSpec("correctness", c, reference=base) for c in judged]
    if pilot.sampling.sampled.enabled:
        specs += [GateSpec("distribution", c, reference=base) for c in judged]
    for cand in [c for c in judged if pilot.conditions[c].role == "candidate"]:
        for ref in [r for r in pilot.references(cand) if r in conditions]:
            for level in pilot.load.levels:
                primary = level == pilot.primary_load
                specs.append(GateSpec("speedup", cand, reference=ref, load=level, gating=primary))
            unusual = pilot.trace.unusual_slice
            specs.append(GateSpec(
                "speedup", cand, reference=ref, load=pilot.primary_load, slice=unusual,
                gating=pilot.decision.gate_unusual_slice,
            ))
        mem = pilot.limits.memory
        if mem.max_peak_mb is not None or mem.max_increase_pct is not None:
            specs.append(GateSpec("memory", cand, reference=pilot.baseline))
        cost = pilot.limits.cost
        if cost.max_cost_per_request is not None:
            specs.append(GateSpec("cost", cand, load=pilot.primary_load))
        if cost.max_break_even_days is not None:
            specs.append(GateSpec("break_even", cand, reference=pilot.baseline,
                                  load=pilot.primary_load))
        for i, lim in enumerate(pilot.limits.latency):
            for level in [lim.load] if lim.load else list(pilot.load.levels):
                specs.append(GateSpec("latency", cand, load=level, index=i))
        if pilot.limits.goodput is not None:
            specs += [GateSpec("goodput", cand, reference=base, load=level,
                               gating=level == pilot.primary_load)
                      for level in pilot.load.levels]
    return specs
