"""Judge a saved campaign: every planned gate, the verdicts, and everything a report shows of
them (diagnoses, stability, cost, goodput, per-domain and per-machine figures, speedups), so
that no reader finishes the judgement itself.

KEEP needs every gating gate of a candidate to pass: an intersection-union test, whose false
KEEP rate is at most alpha with no adjustment across gates (an adjustment would only let one
gate's p-value veto another's pass)."""

from __future__ import annotations

from dataclasses import dataclass

from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ...results.preflight_file import Preflight
from ..cost.pricing import CostSection, cost_summary
from ..figures.analyses import DomainRow, all_domain_rows, held_out_overlaps
from ..figures.measured import Figures, all_figures
from ..figures.speedups import Cell, speedup_cells, with_speedups
from ..gates.evaluate import evaluate
from ..gates.kinds import GateKind
from ..gates.result import GateResult
from ..gates.spec import GateSpec
from ..quality.acceptance import per_position_acceptance
from ..service.goodput import GoodputSection, goodput_section
from ..speed.gate import machine_speedups
from ..speed.stability import Stability, stability
from .diagnosis import Diagnosis, diagnose_all
from .partial import Withheld, withhold
from .verdicts import CandidateVerdict, verdicts


@dataclass(frozen=True)
class Judgement:
    """A campaign judged: what decides (gates, verdicts) and what explains it."""

    results: dict[tuple[GateKind, str], GateResult]
    verdicts: list[CandidateVerdict]
    figures: list[Figures]
    """Per condition and load level, each with its speedup over the baseline where judged."""
    diagnoses: list[Diagnosis]
    """One per verdict, in the same order: headline, reasons, next step."""
    speedups: dict[tuple[str, str], Cell]
    """(condition, load) -> the whole-trace speedup over the baseline and its interval."""
    stability: Stability
    cost: CostSection
    goodput: GoodputSection | None
    domains: list[DomainRow]
    """Per domain at the primary load."""
    acceptance: dict[str, list[float]]
    """Per drafting condition, the acceptance rate at each draft position."""
    machine_speedups: list[dict[str, float | None]]
    """Per merged machine (shard, in order), each candidate's speedup there alone."""

    def result(self, spec: GateSpec) -> GateResult:
        return self.results[(spec.kind, spec.id)]


def judge(pilot: Pilot, specs: list[GateSpec], data: SavedCampaign, preflight: Preflight,
          withheld: Withheld | None = None) -> Judgement:
    """Every gate in ``specs`` judged on ``data``; ``withheld``: the campaign is partial, and
    the verdicts it names say so and decide nothing."""
    results = {(s.kind, s.id): evaluate(s, pilot, data, preflight) for s in specs}
    decided = verdicts(pilot, list(results.values()))
    if withheld is not None:
        results, decided = withhold(results, decided, withheld)
    judged = list(results.values())
    figures = all_figures(data, pilot)
    meta = data.meta
    cells = speedup_cells(judged, meta.baseline)
    acceptance = {c: shares for c in meta.conditions
                  if (shares := per_position_acceptance(data.of(c))) is not None}
    return Judgement(
        results=results, verdicts=decided, figures=with_speedups(figures, cells),
        diagnoses=diagnose_all(pilot, decided, judged, figures, data),
        speedups=cells, stability=stability(data), cost=cost_summary(pilot, data),
        goodput=goodput_section(pilot, data),
        domains=all_domain_rows(data, pilot.primary_load, held_out_overlaps(judged)),
        acceptance=acceptance,
        machine_speedups=machine_speedups(pilot, data, [v.candidate for v in decided])
        if meta.merged else [])
