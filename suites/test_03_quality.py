"""Quality: a drafter must not change what users get, and nothing but the drafter may differ."""

from __future__ import annotations

import pytest

from pytest_osprey.judgement import GateResult
from pytest_osprey.pilot import Pilot
from pytest_osprey.pytest_adapter import assert_gate


@pytest.mark.osprey(kind="fairness")
def test_fairness(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Engine, version, device, precision, context, sampling and trace held fixed."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind="greedy_identity")
def test_greedy_identity(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Greedy outputs match the baseline token for token, near-ties (by margin) apart."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind="correctness")
def test_correctness(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Pass rate of the prompts' expect checks non-inferior to the baseline (exact McNemar)."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind="distribution")
def test_sampled_distribution(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Sampled outputs distributed as the baseline's (per-position tokens and lengths)."""
    assert_gate(osprey_gate_result, osprey_config)
