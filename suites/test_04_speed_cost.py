"""Speed, latency, memory and cost: paired speedups with CIs, latency, memory and cost limits."""

from __future__ import annotations

import pytest

from pytest_osprey.judgement import GateKind, GateResult
from pytest_osprey.pilot import Pilot
from pytest_osprey.pytest_adapter import assert_gate


@pytest.mark.osprey(kind=GateKind.SPEEDUP)
def test_speedup(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Completion-latency speedup vs each reference: CI lower bound above the minimum."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind=GateKind.LATENCY)
def test_latency(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Upper confidence bound of the configured latency percentile within its limit."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind=GateKind.COST)
def test_cost(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Cost per successful request at the primary load within limits.cost."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind=GateKind.BREAK_EVEN)
def test_break_even(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Setup cost recovered by the savings per request within limits.cost.max_break_even_days."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind=GateKind.MEMORY)
def test_memory(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Peak memory within limits.memory (absolute, and increase over the baseline)."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind=GateKind.GOODPUT)
def test_goodput(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Share of requests meeting limits.goodput's targets non-inferior to the baseline's."""
    assert_gate(osprey_gate_result, osprey_config)
