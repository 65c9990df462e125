"""Cost per successful request and break-even: exact arithmetic on hand-built records."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_osprey.judgement.cost.pricing import (
    NO_SAVINGS,
    break_even,
    cost_summary,
    cost_table,
    setup_cost,
)
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.results.records import RequestRecord
from testkit.factories import make_pilot, make_record, saved_campaign


def cost_pilot(**cost: Any) -> Pilot:
    """The prices and setup costs the expected figures below are worked out from."""
    return make_pilot(
        conditions={"baseline": {"role": "baseline"},
                    "current": {"role": "current", "drafter": "d0"},
                    "cand": {"role": "candidate", "drafter": "d1"}},
        load={"levels": {"low": 1, "busy": 4}},
        cost={"device_hour_price": 3.6, "devices_per_server": 2, "currency": "EUR",
              "setup": {"cand": {"pretraining": 10, "adaptation": 2, "idle_device_hours": 5}},
              **cost},
    )  # fmt: skip


def rec(
    condition: str, block: int, start: float, e2e: float, ok: bool = True, load: str = "low"
) -> RequestRecord:
    """A request of ``condition`` from ``start`` to ``start + e2e`` (seconds), 10 tokens."""
    return make_record(condition, f"p{start}", block=block, load=load, ok=ok, e2e_s=e2e,
                       started_at=start, output_tokens=10 if ok else None)


# baseline: blocks of 0..4 s and 100..104 s -> 8 busy seconds, 4 ok -> 1800 requests/hour.
BASE = [rec("baseline", 0, 0, 2), rec("baseline", 0, 2, 2),
        rec("baseline", 1, 100, 3), rec("baseline", 1, 103, 1)]
# cand: 0..2 s and 100..102 s -> 4 busy seconds, 4 ok -> 3600 requests/hour.
CAND = [rec("cand", 0, 0, 1), rec("cand", 0, 1, 1), rec("cand", 1, 100, 1), rec("cand", 1, 101, 1)]


def test_adaptation_in_device_hours_is_priced_once_per_device_hour() -> None:
    """24 device-hours of adaptation at 3.6 a device-hour is 86.4, whatever devices a
    server holds (idle hours are whole servers: 5 h x 3.6 x 2 = 36)."""
    pilot = make_pilot(
        conditions={"baseline": {"role": "baseline"}, "cand": {"role": "candidate",
                                                               "drafter": "d1"}},
        cost={"device_hour_price": 3.6, "devices_per_server": 2,
              "setup": {"cand": {"adaptation": 1, "adaptation_device_hours": 24,
                                 "idle_device_hours": 5}}},
    )  # fmt: skip
    assert setup_cost(pilot, "cand") == pytest.approx(1 + 86.4 + 36.0)


def test_cost_per_request_exact() -> None:
    pilot = cost_pilot()
    table = {(c.condition, c.load): c for c in cost_table(pilot, saved_campaign(BASE + CAND))}
    assert len(table) == 6  # 3 conditions x 2 load levels
    base, cand = table["baseline", "low"], table["cand", "low"]
    assert base.hourly_cost == pytest.approx(7.2)
    assert base.busy_s == pytest.approx(8.0)
    assert base.requests_per_hour == pytest.approx(1800.0)
    assert base.cost_per_request == pytest.approx(0.004)
    assert cand.requests_per_hour == pytest.approx(3600.0)
    assert cand.cost_per_request == pytest.approx(0.002)
    assert cand.currency == "EUR" and cand.concurrency == 1 and (cand.ok, cand.total) == (4, 4)
    # Setup: 10 + 2 + 5 idle hours * 3.6 * 2 devices; a condition without setup costs nothing.
    assert cand.setup_cost == pytest.approx(48.0)
    assert setup_cost(pilot, "baseline") == 0.0


def test_failed_requests_count_in_busy_time_not_in_successes() -> None:
    # A failed request from 2 to 6 s stretches block 0 to 6 s; 2 ok in 6 s -> 1200/hour.
    recs = [rec("cand", 0, 0, 1), rec("cand", 0, 1, 1), rec("cand", 0, 2, 4, ok=False)]
    (cost,) = [c for c in cost_table(cost_pilot(), saved_campaign(recs))
               if c.condition == "cand" and c.load == "low"]
    assert (cost.ok, cost.total) == (2, 3)
    assert cost.busy_s == pytest.approx(6.0)
    assert cost.requests_per_hour == pytest.approx(1200.0)
    assert cost.cost_per_request == pytest.approx(7.2 / 1200)


def test_break_even_requests_and_days() -> None:
    pilot = cost_pilot(expected_requests_per_day=1000)
    be = break_even(pilot, saved_campaign(BASE + CAND), "cand", "baseline", "low")
    assert be.savings_per_request == pytest.approx(0.002)
    assert be.setup_cost == pytest.approx(48.0)
    assert be.requests == pytest.approx(24_000)
    assert be.days == pytest.approx(24.0)
    assert be.reason is None


def test_break_even_without_expected_traffic_has_no_days() -> None:
    be = break_even(cost_pilot(), saved_campaign(BASE + CAND), "cand", "baseline", "low")
    assert be.requests == pytest.approx(24_000)
    assert be.days is None
    assert be.reason is not None and "expected_requests_per_day" in be.reason
    zero = break_even(cost_pilot(expected_requests_per_day=0), saved_campaign(BASE + CAND),
                      "cand", "baseline", "low")
    assert zero.requests == pytest.approx(24_000) and zero.days is None


@pytest.mark.parametrize(
    ("cand", "savings"),
    [
        # Same busy time as the baseline: savings exactly 0.
        ([rec("cand", 0, 0, 2), rec("cand", 0, 2, 2), rec("cand", 1, 100, 4),
          rec("cand", 1, 104, 0)], 0.0),
        # Slower than the baseline: 16 busy seconds for 4 -> 0.008 per request.
        ([rec("cand", 0, 0, 4), rec("cand", 0, 4, 4), rec("cand", 1, 100, 4),
          rec("cand", 1, 104, 4)], -0.004),
    ],
    ids=["zero", "negative"],
)
def test_no_break_even_when_savings_not_positive(cand: list[RequestRecord], savings: float) -> None:
    be = break_even(cost_pilot(expected_requests_per_day=1000), saved_campaign(BASE + cand),
                    "cand", "baseline", "low")
    assert be.savings_per_request == pytest.approx(savings, abs=1e-12)
    assert be.requests is None and be.days is None
    assert be.reason == NO_SAVINGS


def test_zero_successes_have_no_cost_and_no_break_even() -> None:
    failed = [rec("cand", 0, 0, 1, ok=False), rec("cand", 0, 1, 1, ok=False)]
    data = saved_campaign(BASE + failed)
    table = {(c.condition, c.load): c for c in cost_table(cost_pilot(), data)}
    cost = table["cand", "low"]
    assert cost.ok == 0 and cost.busy_s == pytest.approx(2.0)
    assert cost.requests_per_hour is None and cost.cost_per_request is None
    be = break_even(cost_pilot(), data, "cand", "baseline", "low")
    assert be.savings_per_request is None and be.requests is None
    assert be.reason is not None and "cand" in be.reason and "baseline" not in be.reason
    # A level with no records at all: nothing measured, nothing priced.
    empty = table["cand", "busy"]
    assert empty.total == 0 and empty.busy_s is None and empty.cost_per_request is None


def test_cost_summary_is_json_shaped() -> None:
    summary = cost_summary(cost_pilot(expected_requests_per_day=1000),
                           saved_campaign(BASE + CAND)).model_dump()
    assert summary["currency"] == "EUR" and summary["primary_load"] == "busy"
    assert len(summary["table"]) == 6
    # Primary load "busy" has no records: both references report why there is no break-even.
    assert [(b["candidate"], b["reference"]) for b in summary["break_even"]] == [
        ("cand", "baseline"), ("cand", "current")]
    assert all(b["requests"] is None for b in summary["break_even"])


def test_break_even_is_gated_against_the_drafter_being_replaced() -> None:
    """Planted: a candidate twice the baseline's speed, but no faster than the current drafter.
    Against the baseline its setup cost is repaid in days; against the current drafter there
    are no savings to repay it with, and that gate fails, naming the current drafter."""
    from pytest_osprey.judgement.cost.gates import judge_break_even
    from pytest_osprey.judgement.gates.kinds import GateKind
    from pytest_osprey.judgement.gates.plan import plan_gates

    pilot = cost_pilot(expected_requests_per_day=10_000)
    pilot = pilot.model_copy(update={"limits": pilot.limits.model_copy(update={
        "cost": pilot.limits.cost.model_copy(update={"max_break_even_days": 30})})})
    pilot = pilot.model_copy(update={"load": pilot.load.model_copy(update={
        "levels": {"low": 1}})})
    current = [rec("current", r.block, r.started_at or 0.0, r.e2e_s or 0.0) for r in CAND]
    data = saved_campaign(BASE + CAND + current)
    specs = [s for s in plan_gates(pilot, list(pilot.conditions))
             if s.kind == GateKind.BREAK_EVEN]
    assert [(s.condition, s.reference) for s in specs] == [("cand", "baseline"),
                                                          ("cand", "current")]
    vs_base, vs_current = (judge_break_even(s, pilot, data) for s in specs)
    assert vs_base.outcome == "pass" and vs_base.estimate == pytest.approx(48 / 0.002 / 10_000)
    assert vs_current.outcome == "fail"
    assert vs_current.details["reason"] == NO_SAVINGS
    assert "against current" in vs_current.summary
