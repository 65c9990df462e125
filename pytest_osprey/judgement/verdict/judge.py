"""Judge a saved campaign: evaluate every planned gate, then the verdicts and the figures.

KEEP needs every gating gate of a candidate to pass: an intersection-union test, whose false
KEEP rate is at most alpha with no adjustment across gates (an adjustment would only let one
gate's p-value veto another's pass)."""

from __future__ import annotations

from dataclasses import dataclass

from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ...results.preflight_file import Preflight
from ..figures.measured import Figures, all_figures
from ..gates.evaluate import evaluate
from ..gates.kinds import GateKind
from ..gates.result import GateResult
from ..gates.spec import GateSpec
from .verdicts import CandidateVerdict, verdicts


@dataclass(frozen=True)
class Judgement:
    results: dict[tuple[GateKind, str], GateResult]
    verdicts: list[CandidateVerdict]
    figures: list[Figures]

    def result(self, spec: GateSpec) -> GateResult:
        return self.results[(spec.kind, spec.id)]


def judge(
    pilot: Pilot, specs: list[GateSpec], data: SavedCampaign, preflight: Preflight
) -> Judgement:
    results = {(s.kind, s.id): evaluate(s, pilot, data, preflight) for s in specs}
    return Judgement(results, verdicts(pilot, list(results.values())), all_figures(data, pilot))
