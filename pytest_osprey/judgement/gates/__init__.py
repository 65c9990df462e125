"""What the gates are: their kinds, what each compares (spec), what judging one gives
(result) and the plan of a pilot's gates. Which evaluator judges each kind is in
:mod:`.evaluate`, imported on its own (it reaches every question's evaluators)."""

from .kinds import Family, GateKind
from .plan import plan_gates
from .result import Evidence, GateResult, Outcome, Verdict
from .spec import GateSpec

__all__ = ["Evidence", "Family", "GateKind", "GateResult", "GateSpec", "Outcome", "Verdict",
           "plan_gates"]
