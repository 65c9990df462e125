"""Judge a saved campaign: evaluate every planned gate, then the verdicts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .campaign import CampaignData
from .config import Pilot
from .decision import CandidateVerdict, GateResult, GateSpec, evaluate, verdicts
from .report.figures import Figures, all_figures


@dataclass
class Judgement:
    results: dict[tuple[str, str], GateResult]
    verdicts: list[CandidateVerdict]
    figures: list[Figures]

    def result(self, spec: GateSpec) -> GateResult:
        return self.results[(spec.kind, spec.id)]


def judge(
    pilot: Pilot, specs: list[GateSpec], data: CampaignData, preflight: dict[str, Any]
) -> Judgement:
    results = {(s.kind, s.id): evaluate(s, pilot, data, preflight) for s in specs}
    return Judgement(results, verdicts(pilot, list(results.values())), all_figures(data))
