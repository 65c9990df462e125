"""Evaluating gates: the one table of gate kinds (each kind's family and evaluator), from
preflight.json or a saved campaign (so a campaign can be re-judged). What the gates are is
planned in :mod:`.plan`; each evaluator lives with the question it answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ...results.preflight_file import Preflight
from ..cost.gates import judge_break_even, judge_cost
from ..quality.gates import (
    judge_acceptance,
    judge_correctness,
    judge_distribution,
    judge_greedy_identity,
    judge_sampling_params,
)
from ..service.completed import judge_completed
from ..service.consistency import judge_boot_consistency
from ..service.fairness import judge_fairness
from ..service.goodput import judge_goodput
from ..service.latency import judge_latency
from ..service.memory import judge_memory
from ..speed.gate import judge_speedup
from .kinds import Family, GateKind
from .preflight import judge_artifact, judge_command_line, pins_rechecked
from .result import GateResult
from .spec import GateSpec

Evaluator = Callable[[GateSpec, Pilot, SavedCampaign], GateResult]
PreflightEvaluator = Callable[[GateSpec, Preflight], GateResult]


@dataclass(frozen=True)
class Kind:
    """One kind's family and evaluator: from the saved campaign, or (preflight) from
    preflight.json alone."""

    family: Family
    judge: Evaluator | None = None
    judge_preflight: PreflightEvaluator | None = None


KINDS: dict[GateKind, Kind] = {
    GateKind.COMMAND_LINE: Kind(Family.PREFLIGHT, judge_preflight=judge_command_line),
    GateKind.ARTIFACT: Kind(Family.PREFLIGHT, judge_preflight=judge_artifact),
    GateKind.COMPLETED: Kind(Family.SERVICE, judge_completed),
    GateKind.BOOT_CONSISTENCY: Kind(Family.SERVICE, judge_boot_consistency),
    GateKind.FAIRNESS: Kind(Family.SERVICE, judge_fairness),
    GateKind.MEMORY: Kind(Family.SERVICE, judge_memory),
    GateKind.LATENCY: Kind(Family.SERVICE, judge_latency),
    GateKind.GOODPUT: Kind(Family.SERVICE, judge_goodput),
    GateKind.GREEDY_IDENTITY: Kind(Family.QUALITY, judge_greedy_identity),
    GateKind.CORRECTNESS: Kind(Family.QUALITY, judge_correctness),
    GateKind.DISTRIBUTION: Kind(Family.QUALITY, judge_distribution),
    GateKind.SAMPLING_PARAMS: Kind(Family.QUALITY, judge_sampling_params),
    GateKind.ACCEPTANCE: Kind(Family.QUALITY, judge_acceptance),
    GateKind.SPEEDUP: Kind(Family.SPEED, judge_speedup),
    GateKind.COST: Kind(Family.COST, judge_cost),
    GateKind.BREAK_EVEN: Kind(Family.COST, judge_break_even),
}
assert set(KINDS) == set(GateKind), "every gate kind needs its family and evaluator"

PREFLIGHT = frozenset(k for k, v in KINDS.items() if v.family is Family.PREFLIGHT)
"""Kinds judged before (and without) any boot: they judge no measurement."""


def evaluate(
    spec: GateSpec, pilot: Pilot, data: SavedCampaign | None, preflight: Preflight
) -> GateResult:
    """One gate's result. Preflight gates need no campaign (``data`` may be None)."""
    kind = KINDS[spec.kind]
    if kind.judge_preflight is not None:
        result = kind.judge_preflight(spec, preflight)
        if data is not None and spec.kind == GateKind.ARTIFACT:
            return pins_rechecked(result, data.meta.conditions.get(spec.condition))
        return result
    assert data is not None and kind.judge is not None
    err = data.condition_error(spec.condition)
    # Which condition did not run travels as data: the verdict says that, not what the
    # missing measurements would have meant.
    if err:
        return GateResult(spec, "fail", f"{spec.condition} did not run: {err}",
                          details={"not_run": spec.condition, "error": err})
    if spec.reference:
        ref_err = data.condition_error(spec.reference)
        if ref_err:
            return GateResult(spec, "fail", f"reference {spec.reference} did not run: {ref_err}",
                              details={"not_run": spec.reference, "error": ref_err})
    return kind.judge(spec, pilot, data)
