"""Preflight, before anything boots: command lines and drafter artifacts."""

from __future__ import annotations

import pytest

from pytest_osprey.judgement import GateKind, GateResult
from pytest_osprey.pilot import Pilot
from pytest_osprey.pytest_adapter import assert_gate


@pytest.mark.osprey(kind=GateKind.COMMAND_LINE)
def test_command_line(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """The engine's command line for the condition builds (and parses, where it can)."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind=GateKind.ARTIFACT)
def test_artifact(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Architecture, vocabulary/tokenizer, hidden size, weights and pins of the drafter."""
    assert_gate(osprey_gate_result, osprey_config)
