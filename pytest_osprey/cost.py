"""Cost per successful request and break-even traffic, from measured throughput.

Pure arithmetic over the records (greedy pass only, as the speed gates):

* serving cost per hour = ``device_hour_price * devices_per_server``;
* successful requests per hour at a load level = ok requests / busy wall time of that level's
  requests (each block's span from first start to last finish, summed over blocks: the gaps
  between blocks are not load), failed requests included in the busy time since they hold
  the server too;
* cost per successful request = hourly cost / successful requests per hour (None: no success);
* setup cost of a condition = pretraining + adaptation
  + idle_device_hours * device_hour_price * devices_per_server;
* break-even requests = candidate setup / (cost_ref - cost_cand) when that saving is > 0; if
  savings are zero or negative there is no cost break-even (the pilot card's rule);
  break-even days = break-even requests / expected_requests_per_day, when given.

Memory: nothing here reads or prices memory; peak memory is gated by ``limits.memory``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .campaign import CampaignData
from .config import Pilot
from .records import RequestRecord
from .report.figures import _wall

SECONDS_PER_HOUR = 3600.0
NO_SAVINGS = "no break-even: savings <= 0"


@dataclass(frozen=True)
class ConditionCost:
    """Serving cost of one condition at one load level."""

    condition: str
    load: str
    concurrency: int
    ok: int
    total: int
    busy_s: float | None  # summed per-block busy span of the level's requests
    requests_per_hour: float | None  # successful requests per busy hour
    hourly_cost: float  # device_hour_price * devices_per_server
    cost_per_request: float | None  # per successful request; None when none succeeded
    setup_cost: float
    currency: str
    load_label: str = ""  # x4 (closed loop) or Poisson 2/s (open loop)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BreakEven:
    """When a candidate's setup cost is paid back by its per-request savings."""

    candidate: str
    reference: str
    load: str
    currency: str
    setup_cost: float
    cost_reference: float | None
    cost_candidate: float | None
    savings_per_request: float | None  # cost_reference - cost_candidate
    requests: float | None  # setup / savings, when savings > 0
    days: float | None  # requests / expected_requests_per_day, when that is given (> 0)
    reason: str | None  # why there is no break-even (requests is None), or a note on days

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def hourly_cost(pilot: Pilot) -> float:
    return pilot.cost.device_hour_price * pilot.cost.devices_per_server


def setup_cost(pilot: Pilot, condition: str) -> float:
    setup = pilot.cost.setup.get(condition)
    if setup is None:
        return 0.0
    return setup.pretraining + setup.adaptation + setup.idle_device_hours * hourly_cost(pilot)


def busy_seconds(records: list[RequestRecord]) -> float | None:
    """Busy wall time of these requests (per block, first start to last finish, summed)."""
    timed = [r for r in records if r.started_at is not None and r.e2e_s is not None]
    return _wall(timed)


def condition_cost(pilot: Pilot, data: CampaignData, condition: str, load: str) -> ConditionCost:
    recs = data.of(condition, load)
    ok = sum(r.ok for r in recs)
    busy = busy_seconds(recs)
    per_hour = ok / (busy / SECONDS_PER_HOUR) if busy and ok else None
    hourly = hourly_cost(pilot)
    return ConditionCost(
        condition=condition,
        load=load,
        concurrency=(pilot.load.concurrency(load) if load in pilot.load.levels
                     else recs[0].concurrency if recs else 0),
        ok=ok,
        total=len(recs),
        busy_s=busy,
        requests_per_hour=per_hour,
        hourly_cost=hourly,
        cost_per_request=hourly / per_hour if per_hour else None,
        setup_cost=setup_cost(pilot, condition),
        currency=pilot.cost.currency,
        load_label=pilot.load.label(load) if load in pilot.load.levels else "",
    )


def cost_table(pilot: Pilot, data: CampaignData) -> list[ConditionCost]:
    """Every condition at every load level, in the pilot's order."""
    return [
        condition_cost(pilot, data, condition, load)
        for condition in pilot.conditions
        for load in pilot.load.levels
    ]


def break_even(
    pilot: Pilot, data: CampaignData, candidate: str, reference: str, load: str
) -> BreakEven:
    ref = condition_cost(pilot, data, reference, load).cost_per_request
    cand = condition_cost(pilot, data, candidate, load).cost_per_request
    setup = setup_cost(pilot, candidate)
    savings = ref - cand if ref is not None and cand is not None else None
    requests: float | None = None
    days: float | None = None
    if savings is None:
        missing = [n for n, c in ((reference, ref), (candidate, cand)) if c is None]
        reason: str | None = (
            f"no break-even: no cost per request for {', '.join(missing)} at load {load} "
            "(no successful request)"
        )
    elif savings <= 0:
        reason = NO_SAVINGS
    else:
        requests = setup / savings
        per_day = pilot.cost.expected_requests_per_day
        if per_day is None:
            reason = "days unknown: cost.expected_requests_per_day not given"
        elif per_day == 0:
            reason = "no break-even in days: cost.expected_requests_per_day is 0"
        else:
            days = requests / per_day
            reason = None
    return BreakEven(
        candidate=candidate,
        reference=reference,
        load=load,
        currency=pilot.cost.currency,
        setup_cost=setup,
        cost_reference=ref,
        cost_candidate=cand,
        savings_per_request=savings,
        requests=requests,
        days=days,
        reason=reason,
    )


def break_evens(pilot: Pilot, data: CampaignData, load: str | None = None) -> list[BreakEven]:
    """Each candidate against each of its references, at ``load`` (default: the primary)."""
    level = load or pilot.primary_load
    return [
        break_even(pilot, data, cand, ref, level)
        for cand in pilot.candidates
        for ref in pilot.references(cand)
    ]


def cost_summary(pilot: Pilot, data: CampaignData) -> dict[str, Any]:
    """The ``cost`` section of summary.json (what the HTML report's cost table reads)."""
    limits = pilot.limits.cost
    return {
        "currency": pilot.cost.currency,
        "device_hour_price": pilot.cost.device_hour_price,
        "devices_per_server": pilot.cost.devices_per_server,
        "expected_requests_per_day": pilot.cost.expected_requests_per_day,
        "primary_load": pilot.primary_load,
        "limits": {
            "max_cost_per_request": limits.max_cost_per_request,
            "max_break_even_days": limits.max_break_even_days,
        },
        "table": [c.as_dict() for c in cost_table(pilot, data)],
        "break_even": [b.as_dict() for b in break_evens(pilot, data)],
    }
