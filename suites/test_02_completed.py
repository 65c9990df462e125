"""Completed requests, and boots alike: every condition answers the whole trace at every load
level, the same way on each of its boots."""

from __future__ import annotations

import pytest

from pytest_osprey.judgement import GateKind, GateResult
from pytest_osprey.pilot import Pilot
from pytest_osprey.pytest_adapter import assert_gate


@pytest.mark.osprey(kind=GateKind.COMPLETED)
def test_completed(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """The fraction of requests that completed meets limits.min_completed_fraction."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind=GateKind.BOOT_CONSISTENCY)
def test_boots_alike(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """With several boots per condition: each boot serves like the others (greedy outputs,
    accept length)."""
    assert_gate(osprey_gate_result, osprey_config)
