"""Greedy identity: near-ties only onto the reference's runner-up, judged as a rate against
the reference's own rerun (testkit/sim_greedy.py simulates campaigns with known truth)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.judgement import GateSpec, evaluate
from pytest_osprey.judgement.quality.identity import (
    Stratum,
    classify,
    first_divergence,
    garwood,
    greedy_identity,
    relabel_p,
)
from pytest_osprey.results.preflight_file import Preflight
from pytest_osprey.results.records import RequestRecord
from testkit.factories import make_pilot, make_record, saved_campaign
from testkit.sim_greedy import HARMLESS, Run, campaign, chat_like

SIG = 0.001


def rec(cond: str, ids: list[int], *, block: int = 0, load: str = "low", pid: str = "p",
        margins: list[float] | None = None, top2: list[list[int]] | None = None,
        ) -> RequestRecord:
    return make_record(cond, pid, measured=False, block=block, load=load, ok=True,
                       output_ids=ids, top2_margin=margins, top2_ids=top2,
                       started_at=float(block))


def _split(records: list[RequestRecord]) -> tuple[list[RequestRecord], list[RequestRecord]]:
    return ([r for r in records if r.condition == "base"],
            [r for r in records if r.condition == "cand"])


# --------------------------------------------------------------------------- classification


def test_a_near_tie_is_a_flip_onto_the_runner_up_within_epsilon() -> None:
    ref = rec("base", [1, 2, 3], margins=[2.0, 0.01, 1.0], top2=[[1, 9], [2, 7], [3, 8]])
    assert first_divergence(ref.output_ids, [1, 7, 4]) == 1
    onto_runner_up = classify(ref, rec("cand", [1, 7, 4]), 1, 0.05)
    assert onto_runner_up.near_tie and onto_runner_up.runner_up == 7
    elsewhere = classify(ref, rec("cand", [1, 5, 4]), 1, 0.05)  # tied margin, third token
    assert not elsewhere.near_tie and elsewhere.margin == pytest.approx(0.01)
    confident = classify(ref, rec("cand", [1, 2, 8]), 2, 0.05)  # the runner-up, margin 1.0
    assert not confident.near_tie
    unknown = rec("base", [1, 2, 3], margins=[2.0, 0.01, 1.0])  # no top-2 ids recorded
    assert not classify(unknown, rec("cand", [1, 7, 4]), 1, 0.05).near_tie


def test_relabelling_p_value_is_exact() -> None:
    """Brute force over every joint relabelling of small strata."""
    strata = [Stratum("a", (0,), (1, 2)), Stratum("b", (1,), (0, 1)), Stratum("c", (0,), (1,)),
              Stratum("d", (), (3,))]
    used = [s for s in strata if s.control and s.candidate]
    observed = sum(len(s.control) * sum(s.candidate) - len(s.candidate) * sum(s.control)
                   for s in used)
    choices = []
    for s in used:
        slots = [*s.control, *s.candidate]
        a, b = len(s.control), len(s.candidate)
        choices.append([a * (sum(slots) - sum(slots[i] for i in c)) - b * sum(slots[i] for i in c)
                        for c in itertools.combinations(range(a + b), a)])
    joint = [sum(v) for v in itertools.product(*choices)]
    expected = sum(v >= observed for v in joint) / len(joint)
    assert relabel_p(strata) == pytest.approx(expected)
    assert relabel_p([Stratum("a", (0,), (0,))]) == 1.0


def test_garwood_bounds() -> None:
    low, high = garwood(0, 1000, 0.95)
    assert low == 0 and high == pytest.approx(3.689 / 1000, rel=1e-3)
    low, high = garwood(5, 100, 0.95)
    assert low < 0.05 < high


# --------------------------------------------------------------------------- behaviour


def test_identical_outputs_pass_and_a_genuine_change_is_named() -> None:
    m, top2 = [1.0] * 4, [[1, 9], [2, 9], [3, 9], [4, 9]]
    base = [rec("base", [1, 2, 3, 4], block=b, margins=m, top2=top2) for b in (0, 1)]
    res = greedy_identity(base, [rec("cand", [1, 2, 3, 4], block=b) for b in (0, 1)], 0.05)
    assert res.test.outcome == "pass" and res.identical == res.compared == 2
    assert res.control is not None and res.control.compared == 1
    res = greedy_identity(base, [rec("cand", [1, 2, 5, 4])], 0.05)
    assert [d.position for d in res.genuine] == [2]


def test_without_a_control_the_fixed_rate_is_the_tolerance() -> None:
    m, top2 = [0.01] * 10, [[j, 100 + j] for j in range(10)]
    base = [rec("base", list(range(10)), pid=f"p{i}", margins=m, top2=top2) for i in range(3)]
    flipped = [rec("cand", [0, 101, 7], pid=f"p{i}") for i in range(3)]
    res = greedy_identity(base, flipped, 0.05, max_near_tie_rate=0.5)
    assert res.control is None and res.test.method == "fixed" and res.test.outcome == "pass"
    res = greedy_identity(base, flipped, 0.05, max_near_tie_rate=0.01)
    assert res.test.outcome == "fail" and len(res.near_ties) == 3


# --------------------------------------------------------------------------- simulation


def _fails(candidate: Run, tokens: int, runs: int, seed: int, prompts: int = 21) -> int:
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(runs):
        res = greedy_identity(*_split(campaign(rng, chat_like, candidate, tokens=tokens,
                                               prompts=prompts)), 0.05)
        fails += res.test.outcome == "fail" or bool(res.genuine)
    return fails


def test_relaxed_acceptance_fails_at_48_tokens() -> None:
    """A verify rule accepting the runner-up within 0.05 nats: every flip it causes is a
    near-tie, only too many. Shipped pilot shape (21 prompts x 48 tokens, 2 levels, 2 blocks),
    chat-like margins: failed >= 90 % of the time (measured 0.97 over 200)."""
    runs = 40
    hits = _fails(Run(sigma=0.01, tau=0.05), 48, runs, seed=3)
    assert hits / runs >= 0.9, f"{hits}/{runs}"


@pytest.mark.slow  # over a second on 2 busy cores
def test_harmless_numerics_pass_at_256_tokens() -> None:
    """The candidate's numerics vary as the reference's own do (noise partly shared within a
    run, so flips are not independent): false failures stay within alpha = 2.5 %."""
    runs = 30
    hits = _fails(HARMLESS, 256, runs, seed=4)
    assert stats.binomtest(hits, runs, 0.025, alternative="greater").pvalue > SIG, hits


def test_the_gate_says_what_it_compared_and_one_limit() -> None:
    """One untimed greedy pass at one level is named as such (not "every pass and load"),
    and without a control the sentence holds the candidate to one stated limit."""
    recs = [make_record(c, f"p{i}", output_ids=[1, 2, 3], top2_ids=[[1, 9], [2, 9], [3, 9]],
                        top2_margin=[1.0, 1.0, 1.0])
            for c in ("baseline", "cand") for i in range(3)]
    pilot = make_pilot({"baseline": {"role": "baseline"}, "cand": {"role": "candidate"}})
    res = evaluate(GateSpec("greedy_identity", "cand", reference="baseline"), pilot,
                   saved_campaign(recs, baseline="baseline", candidates=["cand"]), Preflight())
    assert res.outcome == "pass", res.summary
    assert "3/3 identical outputs (greedy, 3 prompts x 1 pass at load low)" in res.summary
    assert "every prompt, pass and load" not in res.summary
    assert "the fixed limit 0.20%/token (no identical-condition control" in res.summary
