"""Quality: a drafter must not change what users get."""

from __future__ import annotations

import pytest

from pytest_osprey.config import Pilot
from pytest_osprey.decision import GateResult
from pytest_osprey.fixtures import assert_gate


@pytest.mark.osprey(kind="greedy_identity")
def test_greedy_identity(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Greedy outputs match the baseline token for token, near-ties (by margin) apart."""
    assert_gate(osprey_gate_result, osprey_config)
