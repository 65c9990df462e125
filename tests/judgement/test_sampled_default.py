"""The distribution check follows the service: on by default when the timed passes sample
(``sampling.serving.temperature`` > 0), at the serving temperature and top-p, or when the
pilot names a key of the pass; what a pilot names explicitly is kept; the default budget can
fail at the default alpha."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_osprey.judgement.gates.kinds import GateKind
from pytest_osprey.judgement.gates.plan import plan_gates
from pytest_osprey.judgement.quality.gates import sampling_budget_problem
from pytest_osprey.pilot.schema import SAMPLED_PROMPTS, Pilot
from testkit.factories import make_pilot


def pilot(**sampling: Any) -> Pilot:
    return make_pilot(sampling=sampling)


def distribution_planned(p: Pilot) -> bool:
    return any(s.kind == GateKind.DISTRIBUTION for s in plan_gates(p, list(p.conditions)))


def test_a_greedy_service_runs_no_sampled_pass_by_default() -> None:
    p = pilot()
    assert p.sampling.sampled.enabled is False
    assert not distribution_planned(p)


def test_a_sampled_service_is_checked_at_its_own_sampling() -> None:
    p = pilot(serving={"temperature": 0.7, "top_p": 0.9})
    s = p.sampling.sampled
    assert (s.enabled, s.temperature, s.top_p) == (True, 0.7, 0.9)
    assert distribution_planned(p)
    # Resolved once: a pilot saved with the campaign reads back the same.
    again = Pilot.model_validate(p.model_dump(mode="json"))
    assert again.sampling.sampled == s


def test_a_sampled_service_is_checked_with_its_top_k_and_min_p_too() -> None:
    s = pilot(serving={"temperature": 0.7, "top_k": 50, "min_p": 0.05}).sampling.sampled
    assert (s.temperature, s.top_k, s.min_p) == (0.7, 50, 0.05)
    named = pilot(serving={"temperature": 0.7, "top_k": 50}, sampled={"top_k": 20})
    assert named.sampling.sampled.top_k == 20
    assert pilot(sampled={"enabled": True}).sampling.sampled.top_k is None  # greedy service


@pytest.mark.parametrize(("given", "expect"), [
    ({"enabled": False}, (False, 0.7, 0.9)),
    ({"temperature": 1.0}, (True, 1.0, 0.9)),
    ({"top_p": 0.5, "temperature": 0.3}, (True, 0.3, 0.5)),
])
def test_what_the_pilot_names_is_kept(given: dict[str, Any],
                                      expect: tuple[bool, float, float]) -> None:
    s = pilot(serving={"temperature": 0.7, "top_p": 0.9}, sampled=given).sampling.sampled
    assert (s.enabled, s.temperature, s.top_p) == expect


@pytest.mark.parametrize("given", [{"enabled": True}, {"samples_per_prompt": 16}])
def test_a_pass_asked_for_under_a_greedy_service_keeps_its_own_defaults(
        given: dict[str, Any]) -> None:
    s = pilot(sampled=given).sampling.sampled
    assert (s.enabled, s.temperature, s.top_p) == (True, 0.8, 1.0)


def test_the_default_budget_can_fail_at_the_default_alpha() -> None:
    p = pilot(serving={"temperature": 0.8})
    assert p.sampling.sampled.prompts == SAMPLED_PROMPTS
    assert sampling_budget_problem(p, SAMPLED_PROMPTS) is None
    # A planted budget that cannot: 1 sample per prompt is refused, naming the keys.
    weak = pilot(serving={"temperature": 0.8}, sampled={"samples_per_prompt": 1})
    why = sampling_budget_problem(weak, SAMPLED_PROMPTS)
    assert why is not None and "sampling.sampled.samples_per_prompt" in why
