"""Cost per successful request and break-even traffic, from measured throughput.

Pure arithmetic over the records (greedy pass only, as the speed gates):

* serving cost per hour = ``device_hour_price * devices_per_server``;
* successful requests per hour at a load level = ok requests / busy wall time of that level's
  requests (each block's span from first start to last finish, summed over blocks: the gaps
  between blocks are not load), failed requests included in the busy time since they hold
  the server too;
* cost per successful request = hourly cost / successful requests per hour (None: no success);
* setup cost of a condition = pretraining + adaptation
  + adaptation_device_hours * device_hour_price
  + idle_device_hours * device_hour_price * devices_per_server;
* break-even requests = candidate setup / (cost_ref - cost_cand) when that saving is > 0; if
  savings are zero or negative there is no cost break-even (the pilot card's rule);
  break-even days = break-even requests / expected_requests_per_day, when given.

Memory: nothing here reads or prices memory; peak memory is gated by ``limits.memory``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ...results.records import RequestRecord
from ..sheet import Sheet

SECONDS_PER_HOUR = 3600.0
NO_SAVINGS = "no break-even: savings <= 0"


class ConditionCost(Sheet):
    """Serving cost of one condition at one load level (`cost.table[]`)."""

    condition: str
    """Condition name."""
    load: str
    """Load level name."""
    concurrency: int
    """As in figures: requests in flight (open loop: its cap, 0 when uncapped)."""
    ok: int
    """Successful requests (count)."""
    total: int
    """Requests sent (count)."""
    busy_s: float | None
    """Busy wall time of the level's requests, failed ones included, per block from first
    start to last finish, summed (seconds)."""
    requests_per_hour: float | None
    """Successful requests per busy hour (requests per hour)."""
    hourly_cost: float
    """`device_hour_price * devices_per_server` (currency per hour)."""
    cost_per_request: float | None
    """`hourly_cost / requests_per_hour` (currency per successful request); null when none
    succeeded."""
    setup_cost: float
    """Pretraining + adaptation (its device-hours priced) + idle device hours priced
    (currency)."""
    currency: str
    """Currency code of the amounts."""
    load_label: str = ""
    """As in figures: `x4` (closed loop) or `Poisson 2/s` (open loop)."""


class BreakEven(Sheet):
    """When a candidate's setup cost is paid back by its savings per request
    (`cost.break_even[]`), at the primary load level."""

    candidate: str
    """Candidate condition name."""
    reference: str
    """Condition it saves against."""
    load: str
    """Load level of the costs compared."""
    currency: str
    """Currency code of the amounts."""
    setup_cost: float
    """Candidate's setup cost (currency)."""
    cost_reference: float | None
    """Reference's cost per successful request (currency)."""
    cost_candidate: float | None
    """Candidate's cost per successful request (currency)."""
    savings_per_request: float | None
    """`cost_reference - cost_candidate` (currency per request)."""
    requests: float | None
    """`setup_cost / savings_per_request` when savings are positive (requests)."""
    days: float | None
    """`requests / cost.expected_requests_per_day`, when that is given (days)."""
    reason: str | None
    """Why there is no break-even, or why days are unknown; null when `days` is set."""


class CostLimitsEntry(Sheet):
    """The pilot's cost limits (`cost.limits`)."""

    max_cost_per_request: float | None
    """`limits.cost.max_cost_per_request` (currency per successful request); null: none."""
    max_break_even_days: float | None
    """`limits.cost.max_break_even_days` (days); null: none."""


class CostSection(Sheet):
    """Cost inputs and what they imply (`cost`)."""

    currency: str
    """Currency code of every amount."""
    device_hour_price: float
    """Price of one device for one hour (currency)."""
    devices_per_server: int
    """Devices one serving instance occupies (count)."""
    expected_requests_per_day: float | None
    """Expected traffic (requests per day); null when not given."""
    primary_load: str
    """Load level whose costs decide (`decision.primary_load`)."""
    limits: CostLimitsEntry
    """The cost limits judged."""
    table: list[ConditionCost]
    """Every condition at every load level, in the pilot's order."""
    break_even: list[BreakEven]
    """Each candidate against each of its references."""


def hourly_cost(pilot: Pilot) -> float:
    return pilot.cost.device_hour_price * pilot.cost.devices_per_server


def setup_cost(pilot: Pilot, condition: str) -> float:
    setup = pilot.cost.setup.get(condition)
    if setup is None:
        return 0.0
    # Adaptation is counted in device-hours of training (each priced once); idle hours are
    # whole servers held (devices_per_server of them).
    adapting = setup.adaptation_device_hours * pilot.cost.device_hour_price
    return (setup.pretraining + setup.adaptation + adapting
            + setup.idle_device_hours * hourly_cost(pilot))


def busy_seconds(records: Sequence[RequestRecord]) -> float | None:
    """Busy wall time of these requests: each stretch's span (one condition replaying one
    block, contiguous in time) from first start to last finish, summed: stretches of one
    condition run apart in time, and the gaps between them are not its load."""
    spans: dict[tuple[int, int | None, int], list[tuple[float, float]]] = {}
    for r in records:
        if r.started_at is not None and r.e2e_s is not None:
            key = (r.boot, r.stretch, r.repetition if r.stretch is None else 0)
            spans.setdefault(key, []).append((r.started_at, r.started_at + r.e2e_s))
    if not spans:
        return None
    return sum(max(e for _, e in v) - min(s for s, _ in v) for v in spans.values())


def condition_cost(pilot: Pilot, data: SavedCampaign, condition: str, load: str) -> ConditionCost:
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


def cost_table(pilot: Pilot, data: SavedCampaign) -> list[ConditionCost]:
    """Every condition at every load level, in the pilot's order."""
    return [
        condition_cost(pilot, data, condition, load)
        for condition in pilot.conditions
        for load in pilot.load.levels
    ]


def break_even(
    pilot: Pilot, data: SavedCampaign, candidate: str, reference: str, load: str
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


def break_evens(pilot: Pilot, data: SavedCampaign, load: str | None = None) -> list[BreakEven]:
    """Each candidate against each of its references, at ``load`` (default: the primary)."""
    level = load or pilot.primary_load
    return [
        break_even(pilot, data, cand, ref, level)
        for cand in pilot.candidates
        for ref in pilot.references(cand)
    ]


def cost_summary(pilot: Pilot, data: SavedCampaign) -> CostSection:
    """The ``cost`` section of summary.json (what the HTML report's cost table reads)."""
    limits = pilot.limits.cost
    return CostSection(
        currency=pilot.cost.currency,
        device_hour_price=pilot.cost.device_hour_price,
        devices_per_server=pilot.cost.devices_per_server,
        expected_requests_per_day=pilot.cost.expected_requests_per_day,
        primary_load=pilot.primary_load,
        limits=CostLimitsEntry(max_cost_per_request=limits.max_cost_per_request,
                               max_break_even_days=limits.max_break_even_days),
        table=cost_table(pilot, data),
        break_even=break_evens(pilot, data),
    )
