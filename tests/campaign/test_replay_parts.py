"""The pieces a stretch's replay is built from: each request's sampling and seed, the copy
a cycled prompt is, and the progress clock the ETA reads."""

from __future__ import annotations

import time

import pytest

from pytest_osprey.campaign.events import ProgressClock
from pytest_osprey.campaign.requests import (
    occurrences,
    replay_request,
    sample_seed,
    serving_seed,
)
from pytest_osprey.pilot.trace import Prompt
from testkit.factories import make_pilot


def _prompt(pid: str, max_new_tokens: int | None = None) -> Prompt:
    return Prompt(id=pid, domain="chat", slice="s", prompt=f"say {pid}", messages=None,
                  max_new_tokens=max_new_tokens, expect=None, file="t.jsonl", line=1)


def test_a_greedy_request_is_deterministic_and_asks_margins_only_when_told() -> None:
    pilot = make_pilot()
    req = replay_request(pilot, "greedy", "cand", _prompt("p1", 7), "TEXT", 0,
                         want_margins=True, boot=0, pass_index=0)
    assert (req.prompt, req.max_new_tokens, req.temperature, req.top_p, req.seed) == \
        ("TEXT", 7, 0.0, 1.0, None)
    assert req.want_margins and req.timeout_s == pilot.load.request_timeout_s
    assert not replay_request(pilot, "greedy", "cand", _prompt("p1"), "T", 0,
                              want_margins=False, boot=0, pass_index=0).want_margins


def test_a_sampled_request_is_seeded_per_condition_prompt_and_sample() -> None:
    pilot = make_pilot()
    sampled = pilot.sampling.sampled
    req = replay_request(pilot, "sampled", "cand", _prompt("p1"), "T", 3,
                         want_margins=False, boot=1, pass_index=2)
    assert req.temperature == sampled.temperature and req.top_p == sampled.top_p
    assert req.seed == sample_seed(pilot.sampling.seed, "cand", "p1", 3)


def test_a_serving_request_shares_its_seed_across_conditions() -> None:
    pilot = make_pilot()
    a, b = (replay_request(pilot, "serving", c, _prompt("p1"), "T", 0, want_margins=True,
                           boot=1, pass_index=2, copy=1) for c in ("base", "cand"))
    assert a == b and not a.want_margins
    assert a.seed == serving_seed(pilot.sampling.seed, "p1", 1, 2, 1)
    assert a.ignore_eos == pilot.sampling.serving.fixed_length


def test_occurrences_count_a_prompt_cycled_within_a_stretch() -> None:
    p, q = _prompt("p"), _prompt("q")
    assert occurrences([(p, 0), (q, 0), (p, 0), (p, 1), (p, 0)]) == [0, 0, 1, 0, 2]


def test_the_clock_restarts_per_pass_and_clocks_a_timed_pass_from_its_start() -> None:
    clock = ProgressClock()
    assert [clock.tick(("greedy:a", 0, 0)) for _ in range(3)] == [1, 2, 3]
    assert clock.tick(("timed", 0, 0)) == 1  # another pass: counted afresh
    clock.begin(0, 1)
    time.sleep(0.02)
    clock.tick(("timed", 0, 1))
    untimed, timed = clock.elapsed(0, 1, timed=False), clock.elapsed(0, 1, timed=True)
    assert timed >= 0.02  # from begin(), not from the tick
    assert untimed < timed  # an untimed pass: from its first request's end
    assert len(clock.begun) == 1 and clock.pass_s == {}


@pytest.mark.parametrize("mode", ["greedy", "sampled", "serving"])
def test_a_request_is_built_with_the_timeout_of_the_pilot(mode: str) -> None:
    pilot = make_pilot(load={"request_timeout_s": 42})
    req = replay_request(pilot, mode, "c", _prompt("p"), "T", 0,  # type: ignore[arg-type]
                         want_margins=False, boot=0, pass_index=0)
    assert req.timeout_s == 42
