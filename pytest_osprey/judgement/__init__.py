"""Judgement: saved results and the pilot's limits in, gates and verdicts out.

Pure: imports neither pytest nor any engine (a test checks it from the source). Organised by
the question each part answers: ``gates`` (what a gate is, the table of kinds), ``stats``
(general numerics, which know nothing of gates), ``service``, ``quality``, ``speed`` and
``cost`` (each question's statistics and gates), ``verdict`` (judge, verdicts, withheld
verdicts, diagnosis), ``figures`` and ``history`` (a run against the previous one).
"""

from .cost.pricing import BreakEven, ConditionCost, CostLimitsEntry, CostSection, cost_summary
from .figures.analyses import DomainRow, all_domain_rows, held_out_overlaps
from .figures.measured import Figures, all_figures
from .figures.speedups import Cell, speedup_cells
from .gates.evaluate import PREFLIGHT, evaluate
from .gates.kinds import Family, GateKind
from .gates.plan import plan_gates
from .gates.result import Evidence, GateResult, Outcome, Verdict
from .gates.spec import GateSpec
from .history import Comparison, Finding, HistoryError, Previous, compare, open_previous
from .quality.acceptance import per_position_acceptance
from .quality.distribution import END, records_to_samples
from .quality.gates import sampling_budget_problem, sampling_budget_sees
from .service.goodput import GoodputRow, GoodputSection, goodput_section
from .speed.design_power import SpeedSees, design_sees
from .speed.gate import candidate_looks, look_at, machine_speedups
from .speed.stability import BlockDrift, BlockLoad, Stability, stability
from .verdict.diagnosis import Diagnosis, Reason, Speed, diagnose_all
from .verdict.judge import Judgement, judge
from .verdict.partial import Withheld
from .verdict.verdicts import CandidateVerdict

__all__ = [
    "END",
    "PREFLIGHT",
    "BlockDrift",
    "BlockLoad",
    "BreakEven",
    "CandidateVerdict",
    "Cell",
    "Comparison",
    "ConditionCost",
    "CostLimitsEntry",
    "CostSection",
    "Diagnosis",
    "DomainRow",
    "Evidence",
    "Family",
    "Figures",
    "Finding",
    "GateKind",
    "GateResult",
    "GateSpec",
    "GoodputRow",
    "GoodputSection",
    "HistoryError",
    "Judgement",
    "Outcome",
    "Previous",
    "Reason",
    "Speed",
    "SpeedSees",
    "Stability",
    "Verdict",
    "Withheld",
    "all_domain_rows",
    "all_figures",
    "candidate_looks",
    "compare",
    "cost_summary",
    "design_sees",
    "diagnose_all",
    "evaluate",
    "goodput_section",
    "held_out_overlaps",
    "judge",
    "look_at",
    "machine_speedups",
    "open_previous",
    "per_position_acceptance",
    "plan_gates",
    "records_to_samples",
    "sampling_budget_problem",
    "sampling_budget_sees",
    "speedup_cells",
    "stability",
]
