"""Judgement: saved results and the pilot's limits in, gates and verdicts out.

Pure: imports neither pytest nor any engine (a test checks it from the source). The numerics
below it (stats, sequential, distribution, correctness) know nothing of gates.
"""

from .gates import GateResult, GateSpec, plan_gates
from .judge import Judgement, judge
from .verdicts import CandidateVerdict

__all__ = ["CandidateVerdict", "GateResult", "GateSpec", "Judgement", "judge", "plan_gates"]
