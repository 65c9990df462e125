"""What a gate is (GateSpec, planned from the pilot) and what judging it gives (GateResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["pass", "fail", "inconclusive", "skip"]
Verdict = Literal["KEEP", "DROP", "INCONCLUSIVE"]
Evidence = Literal["tested", "underpowered", "not_evaluable"]
"""How much a gate's outcome says: ``tested``: the gate could have failed, and would have
with the power its kind states; ``underpowered``: it could fail, but the data were too few
to catch the effect its kind is sized for (a pass says little); ``not_evaluable``: it could
not have failed at all (nothing at risk, or a budget that cannot reach its level)."""


@dataclass(frozen=True)
class GateSpec:
    kind: str  # artifact | completed | greedy_identity | speedup | latency ...
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
    evidence: Evidence = "tested"

    def __post_init__(self) -> None:
        if self.outcome == "skip":  # not applicable: nothing was tested
            self.evidence = "not_evaluable"

    @property
    def label(self) -> str:
        """The outcome as shown everywhere: ``pass``, or ``pass (underpowered)`` when the
        gate could hardly (or not at all) have failed."""
        if self.evidence == "tested" or self.outcome == "skip":
            return self.outcome
        return f"{self.outcome} ({self.evidence.replace('_', ' ')})"

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
            "evidence": self.evidence,
            "summary": self.summary,
            "estimate": self.estimate,
            "ci": [self.ci_low, self.ci_high] if self.ci_low is not None else None,
            "threshold": self.threshold,
            "p_value": self.p_value,
            "details": self.details,
        }
