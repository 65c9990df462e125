"""The cost gates: cost per successful request against its limit, and the days until a
candidate's setup cost is recovered."""

from __future__ import annotations

from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ..gates.result import GateResult
from ..gates.spec import GateSpec
from .pricing import break_even, condition_cost


def judge_cost(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.load is not None
    limit = pilot.limits.cost.max_cost_per_request
    assert limit is not None
    c = condition_cost(pilot, data, spec.condition, spec.load)
    cur = pilot.cost.currency
    if c.cost_per_request is None:
        return GateResult(spec, "fail", f"no successful request at {spec.load}: cost unknown")
    ok = c.cost_per_request <= limit
    return GateResult(
        spec, "pass" if ok else "fail",
        f"cost per successful request {c.cost_per_request:.6f} {cur} (limit {limit:g} {cur}) "
        f"at {c.requests_per_hour:.0f} requests/h",
        estimate=c.cost_per_request, threshold=limit, details=c.model_dump(),
    )


def judge_break_even(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.load is not None and spec.reference is not None
    limit = pilot.limits.cost.max_break_even_days
    assert limit is not None
    be = break_even(pilot, data, spec.condition, spec.reference, spec.load)
    against = "" if spec.reference == pilot.baseline else f" against {spec.reference}"
    if be.days is None:
        reason = str(be.reason).removeprefix("no break-even: ")
        return GateResult(spec, "fail", f"no break-even{against}: {reason}", threshold=limit,
                          details=be.model_dump())
    ok = be.days <= limit
    return GateResult(
        spec, "pass" if ok else "fail",
        f"setup cost recovered{against} after {be.requests:,.0f} requests = {be.days:.1f} days "
        f"at the expected traffic (limit {limit:g} days)",
        estimate=be.days, threshold=limit, details=be.model_dump(),
    )
