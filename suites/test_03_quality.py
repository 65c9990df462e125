"""Quality: a drafter must not change what users get, and nothing but the drafter may differ."""

from __future__ import annotations

import pytest

from pytest_osprey.judgement import GateKind, GateResult
from pytest_osprey.pilot import Pilot
from pytest_osprey.pytest_adapter import assert_gate


@pytest.mark.osprey(kind=GateKind.FAIRNESS)
def test_fairness(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Engine, version, device, precision, context, sampling and trace held fixed."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind=GateKind.GREEDY_IDENTITY)
def test_greedy_identity(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Greedy outputs match the baseline token for token; flips onto the baseline's runner-up
    at a near-tie no more often than the baseline's own rerun shows."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind=GateKind.CORRECTNESS)
def test_correctness(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """No answer the baseline got right newly wrong (exact binomial loss rule)."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind=GateKind.DISTRIBUTION)
def test_sampled_distribution(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Sampled outputs distributed as the baseline's (stratified permutation MMD test)."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind=GateKind.SAMPLING_PARAMS)
def test_sampling_params(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Penalties, stop strings, token limits, logit bias and constraints honoured as by the
    baseline."""
    assert_gate(osprey_gate_result, osprey_config)


@pytest.mark.osprey(kind=GateKind.ACCEPTANCE)
def test_acceptance(osprey_gate_result: GateResult, osprey_config: Pilot) -> None:
    """Per-position acceptance has not collapsed (reported beside the verdict, not gating)."""
    assert_gate(osprey_gate_result, osprey_config)
