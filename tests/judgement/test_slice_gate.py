"""The unusual-slice speed gate on a trace without unusual prompts: not run, with that
reason, and never listed among the gates that could not have failed."""

from __future__ import annotations

from pytest_osprey.judgement import GateResult, GateSpec
from pytest_osprey.judgement.speed.gate import judge_speedup
from pytest_osprey.judgement.verdict.verdicts import CandidateVerdict, verdicts
from testkit.factories import make_pilot, paired_campaign, saved_campaign


def _judge(slices: dict[int, str], gating: bool) -> tuple[GateResult, list[CandidateVerdict]]:
    pilot = make_pilot(load={"levels": {"low": 1}})
    records = paired_campaign({"base": 1.0, "cand": 0.5}, prompts=12, passes=2,
                              fields=lambda _c, i, _p: {"slice": slices.get(i, "core")})
    data = saved_campaign(records)
    spec = GateSpec("speedup", "cand", reference="base", load="low", slice="unusual",
                    gating=gating)
    result = judge_speedup(spec, pilot, data)
    return result, verdicts(pilot, [result])


def test_a_trace_without_the_slice_does_not_run_the_gate() -> None:
    result, judged = _judge({}, gating=True)
    assert result.outcome == "skip"
    assert result.summary == "not run: the trace has no unusual-slice prompts"
    assert "no request of" not in result.summary
    assert result.details == {"not_run": "the trace has no unusual-slice prompts"}
    # Not a gate that could have failed silently: the verdict does not list it as unproven.
    assert judged[0].unproven == []


def test_a_trace_with_the_slice_judges_it() -> None:
    result, judged = _judge({i: "unusual" for i in range(6)}, gating=True)
    assert result.outcome == "pass", result.summary
    assert result.details["n_prompts"] == 6
    assert judged[0].verdict == "KEEP"
