"""Per-position acceptance: what the engines report, pooling, collapse detection (simulated
with per-request variation), the reported gate and the comparison with an earlier campaign."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from pytest_osprey.engines.base import GenerationRequest, acceptance_from_histogram
from pytest_osprey.engines.sglang import engine as sg
from pytest_osprey.engines.vllm import engine as vl
from pytest_osprey.judgement import GateSpec, evaluate, plan_gates
from pytest_osprey.judgement.history import Previous, acceptance_findings
from pytest_osprey.judgement.quality.acceptance import PositionRates, collapses, pooled
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.results.folder import SavedCampaign
from pytest_osprey.results.preflight_file import Preflight
from pytest_osprey.results.records import RequestRecord
from testkit.factories import make_pilot, make_record
from testkit.fake_server import Reply, ScriptedServer

HEALTHY = (0.95, 0.84, 0.70)  # per-position acceptance of a good drafter (conditional chain)


def test_histograms_as_the_engines_send_them() -> None:
    # SGLang 0.5.23 CPU, STANDALONE, 3 drafts per step: spec_verify_ct 13,
    # spec_num_correct_drafts 19, spec_correct_drafts_histogram [0, 10, 0, 3].
    steps, accepted = acceptance_from_histogram([0, 10, 0, 3]) or (0, [])
    assert steps == 13 and accepted == [13, 3, 3] and sum(accepted) == 19
    assert acceptance_from_histogram([1]) is None
    assert acceptance_from_histogram("x") is None
    assert acceptance_from_histogram([1, -1]) is None


def test_sglang_stream_records_per_position_acceptance() -> None:
    final = {"prompt_tokens": 3, "completion_tokens": 4, "finish_reason": {"type": "length"},
             "spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 1, 1]}
    with ScriptedServer() as srv:
        srv.routes[("POST", "/generate")] = Reply(events=[
            (0, {"text": "abcd", "output_ids": [1, 2, 3, 4], "meta_info": final})])
        res = asyncio.run(sg.SGLangClient(srv.url, "c").generate(
            GenerationRequest("p", "x", 4, want_margins=False)))
    assert res.ok and res.spec_drafts == 2 and res.spec_accepted_per_position == [2, 1]


def test_vllm_per_request_histogram_and_per_position_counters() -> None:
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1},
             "metrics": {"speculative_decoding": {"num_spec_steps": 2,
                                                  "mean_acceptance_length": 2.5,
                                                  "acceptance_histogram": [0, 1, 1]}}}
    with ScriptedServer() as srv:
        srv.routes[("POST", "/v1/completions")] = Reply(events=[
            (0, {"choices": [{"index": 0, "text": "a", "token_ids": [7],
                              "finish_reason": "length"}]}), (0, usage)])
        res = asyncio.run(vl.OpenAIClient(srv.url, "c", "m").generate(
            GenerationRequest("p", "x", 1, want_margins=False)))
    assert res.spec_drafts == 2 and res.spec_accepted_per_position == [2, 1]
    page = ('vllm:spec_decode_num_drafts_total{engine="0"} 10\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 9\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 6\n')
    after = vl.counters_from(page)
    assert after["pos0"] == 9 and after["pos1"] == 6
    assert vl.acceptance_from({"drafts": 4, "pos0": 4, "pos1": 2}, after) == (6, [5, 4])
    assert vl.acceptance_from({"drafts": 4}, {"drafts": 9}) is None  # no per-position export


# --------------------------------------------------------------------------- collapse


def _records(rng: np.random.Generator, cond: str, load: str, rates: tuple[float, ...],
             n: int = 20, steps: int = 12, spread: float = 0.1) -> list[RequestRecord]:
    """Requests whose acceptance varies between them (a per-request shift of the rates: the
    steps of one request are not independent trials). ``rates``: P(position j accepted); a
    step accepts position j only after j - 1, with probability rates[j] / rates[j - 1]."""
    chain = [r / p if p > 0 else 0.0 for r, p in zip(rates, (1.0, *rates), strict=False)]
    out = []
    for i in range(n):
        shift = rng.normal(0, spread)
        accepted = [0] * len(rates)
        for _ in range(steps):
            for j, r in enumerate(chain):
                if rng.random() >= min(1.0, max(0.0, r + shift)):
                    break
                accepted[j] += 1
        out.append(make_record(
            cond, f"p{i}", measured=False, load=load, ok=True, output_ids=[1] * 20,
            spec_drafts=steps, spec_accepted_per_position=accepted))
    return out


def test_a_collapse_is_found_with_its_positions_and_noise_is_not() -> None:
    rng = np.random.default_rng(8)
    healthy = pooled(_records(rng, "c", "low", HEALTHY))
    assert healthy is not None and healthy.drafts == 240 and healthy.requests == 20
    broken = pooled(_records(rng, "c", "concurrent", (0.05, 0.02, 0.0)))
    assert broken is not None
    found = collapses(broken, healthy, 0.5, 0.025)
    assert [c.position for c in found] == [0, 1, 2]
    # Self against self, 200 times, with the per-request variation: flagged at most rarely.
    false = sum(bool(collapses(pooled(_records(rng, "c", "a", HEALTHY)),  # type: ignore[arg-type]
                               pooled(_records(rng, "c", "b", HEALTHY)),  # type: ignore[arg-type]
                               0.5, 0.025)) for _ in range(200))
    assert false <= 2, false
    # A mild drop (0.95 -> 0.80) is no collapse.
    mild = pooled(_records(rng, "c", "x", (0.80, 0.70, 0.55)))
    assert mild is not None and not collapses(mild, healthy, 0.5, 0.025)


def _pilot() -> Pilot:
    return make_pilot(
        target={"model": "m"}, trace={"files": ["t.jsonl"]},
        conditions={"base": {"role": "baseline"},
                    "cur": {"role": "current", "drafter": "/d/1"},
                    "cand": {"role": "candidate", "drafter": "/d/2"}},
        load={"levels": {"low": 1, "concurrent": 4}})


def test_the_reported_gate_flags_a_collapse_under_batching() -> None:
    pilot = _pilot()
    specs = [s for s in plan_gates(pilot, list(pilot.conditions)) if s.kind == "acceptance"]
    assert {(s.condition, s.reference, s.gating) for s in specs} == {
        ("cur", None, False), ("cand", "cur", False)}
    rng = np.random.default_rng(9)
    recs = (_records(rng, "cur", "low", HEALTHY) + _records(rng, "cur", "concurrent", HEALTHY)
            + _records(rng, "cand", "low", HEALTHY)
            + _records(rng, "cand", "concurrent", (0.04, 0.0, 0.0)))
    data = SavedCampaign(Path("."), {"conditions": {c: {} for c in pilot.conditions}}, recs)
    res = evaluate(GateSpec("acceptance", "cand", reference="cur", gating=False), pilot, data,
                   Preflight())
    assert res.outcome == "fail" and "at load concurrent against load low" in res.summary
    assert "position 1" in res.summary and "against cur" in res.summary
    ok = evaluate(GateSpec("acceptance", "cur", gating=False), pilot, data, Preflight())
    assert ok.outcome == "pass", ok.summary
    none = SavedCampaign(Path("."), {"conditions": {"cur": {}}}, [])
    assert evaluate(GateSpec("acceptance", "cur", gating=False), pilot, none,
                    Preflight()).outcome == "skip"


def test_an_earlier_campaign_shows_the_collapse_of_the_same_drafter() -> None:
    pilot = _pilot()
    rng = np.random.default_rng(10)
    meta: dict[str, Any] = {"conditions": {"cand": {}}}
    before = SavedCampaign(Path("."), meta, _records(rng, "cand", "low", HEALTHY))
    now = SavedCampaign(Path("."), meta, _records(rng, "cand", "low", (0.1, 0.0, 0.0)))
    (finding,) = acceptance_findings(pilot, now, Previous(Path("."), {}, before), "cand", "low")
    assert finding.regression and finding.check == "acceptance"
    assert "collapsed at position 1" in finding.text
    (same,) = acceptance_findings(pilot, before, Previous(Path("."), {}, before), "cand", "low")
    assert not same.regression
    assert PositionRates(0, (), 0).rates == []
