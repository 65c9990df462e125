"""Judge a saved campaign: evaluate every planned gate, then the verdicts and the figures."""

from __future__ import annotations

from dataclasses import dataclass

from ..pilot.schema import Pilot
from ..results.folder import SavedCampaign
from ..results.preflight_file import Preflight
from .figures import Figures, all_figures
from .gates import GateResult, GateSpec, evaluate
from .stats import holm
from .verdicts import CandidateVerdict, verdicts


@dataclass
class Judgement:
    results: dict[tuple[str, str], GateResult]
    verdicts: list[CandidateVerdict]
    figures: list[Figures]

    def result(self, spec: GateSpec) -> GateResult:
        return self.results[(spec.kind, spec.id)]


# Gates whose pass is a rejected null hypothesis (evidence of speed): the claims whose
# family-wise error Holm controls, per candidate. The quality gates' p-values test for harm
# (a small p fails them), so their passes are not such claims.
HOLM_KINDS = ("speedup",)


def apply_holm(pilot: Pilot, results: list[GateResult]) -> None:
    """Holm over each candidate's gating claims: a pass whose adjusted p-value exceeds the
    one-sided alpha becomes inconclusive (the evidence is not strong enough for all claims)."""
    alpha = (1 - pilot.decision.confidence) / 2
    for cand in pilot.candidates:
        family = [g for g in results if g.spec.condition == cand and g.spec.gating
                  and g.spec.kind in HOLM_KINDS and g.p_value is not None]
        if len(family) < 2:
            continue
        for g, adj in zip(family, holm([g.p_value for g in family if g.p_value is not None]),
                          strict=True):
            g.details["p_holm"] = adj
            if g.outcome == "pass" and adj > alpha:
                g.outcome = "inconclusive"
                g.summary += (f"; Holm-adjusted p={adj:.3g} over {len(family)} claims "
                              f"> {alpha:g}")


def judge(
    pilot: Pilot, specs: list[GateSpec], data: SavedCampaign, preflight: Preflight
) -> Judgement:
    results = {(s.kind, s.id): evaluate(s, pilot, data, preflight) for s in specs}
    apply_holm(pilot, list(results.values()))
    return Judgement(results, verdicts(pilot, list(results.values())), all_figures(data, pilot))
