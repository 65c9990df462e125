"""Completed requests: every condition answers the whole trace at every load level."""

from __future__ import annotations

import pytest

from pytest_osprey.judgement import GateResult
from pytest_osprey.pilot import Pilot
from pytest_osprey.pytest_adapter import assert_gate


@pytest.mark.osprey(kind="completed")
def test_completed(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """The fraction of requests that completed meets limits.min_completed_fraction."""
    assert_gate(osprey_gate_result, osprey_config)
