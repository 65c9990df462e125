"""What judging a gate gives: its outcome, how much that outcome says, the figures behind it,
and the structured ``details`` that reports and the diagnosis read (never the summary)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..stats.core import StatOutcome
from .spec import GateSpec

Outcome = StatOutcome | Literal["skip"]
Verdict = Literal["KEEP", "DROP", "INCONCLUSIVE"]
Evidence = Literal["tested", "underpowered", "not_evaluable"]
"""How much a gate's outcome says: ``tested``: the gate could have failed, and would have
with the power its kind states; ``underpowered``: it could fail, but the data were too few
to catch the effect its kind is sized for (a pass says little); ``not_evaluable``: it could
not have failed at all (nothing at risk, or a budget that cannot reach its level)."""


@dataclass(frozen=True)
class GateResult:
    """Immutable: a changed outcome (a withheld verdict) is a new result."""

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
            object.__setattr__(self, "evidence", "not_evaluable")

    @property
    def gist(self) -> str:
        """The summary's first line; a first line that only introduces a list ("...:") takes
        the list with it, joined on one line, so that a reason never stops at the colon."""
        lines = [x.strip() for x in self.summary.splitlines() if x.strip()]
        if not lines:
            return ""
        if len(lines) > 1 and lines[0].endswith(":"):
            return lines[0] + " " + "; ".join(lines[1:])
        return lines[0]

    @property
    def label(self) -> str:
        """The outcome as shown everywhere: ``pass``, or ``pass (underpowered)`` when the
        gate could hardly (or not at all) have failed."""
        if self.evidence == "tested" or self.outcome == "skip":
            return self.outcome
        return f"{self.outcome} ({self.evidence.replace('_', ' ')})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.spec.kind.value,
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
