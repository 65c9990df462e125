"""The reported accept length (one definition), each record checked against its own counts,
SGLang's accepted-draft totals, vLLM's mean K per stretch, and a raw vLLM response parsed
(docs/acceptance.md).

Recorded shapes from tests/fixtures/speculation (SGLang 0.5.23 and vLLM 0.32 on CPU); planted
faults: a histogram read one position off, a record with more tokens than its steps allow, an
engine total that disagrees with its histogram, a K that changed between stretches.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from pytest_osprey.engines.base import GenerationRequest
from pytest_osprey.engines.sglang.engine import SGLangClient
from pytest_osprey.engines.speculation import VLLM_METRICS, spec_counters_of
from pytest_osprey.engines.vllm.engine import OpenAIClient
from pytest_osprey.judgement.figures.measured import accept_lengths
from pytest_osprey.judgement.gates.kinds import GateKind
from pytest_osprey.judgement.gates.spec import GateSpec
from pytest_osprey.judgement.quality.acceptance import (
    accept_length,
    depth_per_stretch,
    reconcile,
    self_checks,
)
from pytest_osprey.judgement.service.fairness import judge_fairness
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.results.campaign_file import ScheduleEntry
from pytest_osprey.results.records import RequestRecord
from testkit.endpoint_pilot import sglang_routes
from testkit.factories import ROOT, make_pilot, make_record, saved_campaign
from testkit.fake_server import Reply, ScriptedServer

FIX = ROOT / "tests" / "fixtures" / "speculation"
SGLANG = FIX / "sglang-0.5.23-cpu-standalone"
OLDER = FIX / "sglang-newer-handwritten" / "meta_info_older_names.json"
VLLM = FIX / "vllm-0.32-cpu-draft-model"
RAW = FIX / "vllm-0.32-cpu-raw-response"
FAIRNESS = GateSpec(GateKind.FAIRNESS, "cand")


def sglang_parsed(meta: dict[str, Any]) -> RequestRecord:
    """One /generate answer with ``meta`` read by the SGLang client, as a record."""
    ids = list(range(meta["completion_tokens"]))
    routes = sglang_routes(Reply(events=[(0.0, {"text": "x", "output_ids": ids,
                                                "meta_info": meta})]))
    with ScriptedServer(routes=routes) as srv:
        res = asyncio.run(SGLangClient(srv.url, "cand").generate(
            GenerationRequest("p", "hi", len(ids), want_margins=False)))
    assert res.ok, res.error
    fields = {k: v for k, v in vars(res).items() if k != "ok"}
    return make_record("cand", meta.get("id", "p0"), stretch=0,
                       output_tokens=len(res.output_ids), **fields)


def sglang_recorded() -> list[RequestRecord]:
    return [sglang_parsed(m) for m in json.loads((SGLANG / "meta_info.json").read_text())]


def vllm_recorded() -> list[RequestRecord]:
    return [make_record("cand", f"p{i}", stretch=0, spec_verify_ct=r["spec_verify_ct"],
                        spec_drafts=r["spec_drafts"],
                        spec_accepted_per_position=r["spec_accepted_per_position"],
                        output_ids=list(range(r["output_tokens"])))
            for i, r in enumerate(json.loads((VLLM / "results.json").read_text()))]


def entry(stretch: int, before: dict[str, float] | None, after: dict[str, float] | None,
          load: str = "low") -> ScheduleEntry:
    return ScheduleEntry(block=0, condition="cand", load=load, mode="greedy", started=0.0,
                         stretch=stretch, spec_counters=before, spec_counters_end=after)


def judged(p: Pilot, records: list[RequestRecord], facts: dict[str, Any] | None = None,
           schedule: list[ScheduleEntry] | None = None, engine: str = "sglang") -> Any:
    records = records or [make_record("cand", "p0")]
    base = [make_record("base", pid) for pid in dict.fromkeys(r.prompt_id for r in records)]
    data = saved_campaign([*base, *records], conditions={
        "base": {"fingerprint": {"engine": engine}},
        "cand": {"fingerprint": {"engine": engine, **(facts or {})}}},
        schedule=[e.model_dump() for e in schedule or []])
    return judge_fairness(FAIRNESS, p, data)


def plain_pilot(engine: str = "sglang", **speculation: Any) -> Pilot:
    cand: dict[str, Any] = {"role": "candidate", "drafter": "/m/d"}
    if speculation:
        cand["speculation"] = speculation
    return make_pilot({"base": {"role": "baseline"}, "cand": cand},
                      target={"model": "/m/target", "engine": engine})


# ------------------------------------------------------------------ the one definition


def test_accept_length_is_tokens_per_verify_step_pooled_and_per_request() -> None:
    """Simulated requests, known truth: each verify step commits its accepted drafts and the
    bonus token, the prefill one more; the figure is tokens / steps, pooled and per request,
    and exceeds 1 + accepted / steps by exactly 1 / steps (no stop here)."""
    rng = np.random.default_rng(3)
    records, truth = [], []
    for i in range(40):
        steps = int(rng.integers(1, 30))
        accepted = int(rng.binomial(3 * steps, 0.6))
        tokens = 1 + steps + accepted
        truth.append((tokens, steps, accepted))
        records.append(make_record("cand", f"p{i}", spec_verify_ct=steps,
                                   output_ids=[1] * tokens))
    records += [make_record("cand", "failed", ok=False, spec_verify_ct=5),
                make_record("cand", "no-steps", output_ids=[1] * 9)]
    got = accept_length(records)
    assert got is not None and got.requests == 40
    assert got.pooled == pytest.approx(sum(t for t, _, _ in truth) / sum(s for _, s, _ in truth))
    assert got.per_request_mean == pytest.approx(np.mean([t / s for t, s, _ in truth]))
    assert [t / s - (1 + a / s) for t, s, a in truth] == pytest.approx(
        [1 / s for _, s, _ in truth])
    # Every report's figure is this one.
    assert accept_lengths(records) == (got.pooled, got.per_request_mean)
    # Only an engine's own accept length: the steps it implies (tokens / accept length).
    implied = accept_length([make_record("cand", "q", accept_length=2.5, output_ids=[1] * 10)])
    assert implied is not None and (implied.pooled, implied.verify_steps) == (2.5, 4.0)
    assert accept_length(records[40:]) is None


def test_the_recorded_sglang_figure_is_its_spec_accept_length() -> None:
    """SGLang 0.5.23: spec_accept_length = completion_tokens / spec_verify_ct, the reported
    figure per request; 1 + accepted / steps is 1/8 lower for the stop-free first request."""
    metas = json.loads((SGLANG / "meta_info.json").read_text())
    records = sglang_recorded()
    got = accept_length(records)
    assert got is not None
    assert got.per_request_mean == pytest.approx(np.mean([m["spec_accept_length"]
                                                          for m in metas]))
    assert got.pooled == pytest.approx(64 / 20)
    first = records[0]
    assert 32 / 8 - (1 + sum(first.spec_accepted_per_position or []) / 8) == pytest.approx(1 / 8)


# ------------------------------------------------------------ each record against itself


def test_the_recorded_records_agree_with_themselves() -> None:
    """SGLang: 32 = 8 steps + 23 accepted + the prefill's token; 32 of 12 + 21 + 1 (a stop cut
    2). vLLM: 32 of 7 + 27 + 1 and of 11 + 23 + 1 (cut 3 each)."""
    sglang = self_checks(sglang_recorded())
    tokens = [(c.value, c.low, c.high) for c in sglang if c.check == "output_tokens"]
    assert tokens == [(32, 28, 32), (32, 30, 34)]
    assert [(c.value, c.low) for c in sglang if c.check == "accepted"] == [(23, 23), (21, 21)]
    vllm = self_checks(vllm_recorded())
    assert [(c.value, c.low, c.high) for c in vllm] == [(32, 30, 35), (32, 30, 35)]
    assert not any(c.mismatch for c in sglang + vllm)


def test_a_histogram_read_one_position_off_is_flagged_naming_the_request() -> None:
    metas = json.loads((SGLANG / "meta_info.json").read_text())
    off = dict(metas[0], spec_correct_drafts_histogram=[0, 1, 7, 0])  # shifted by one
    records = [sglang_parsed(off), sglang_parsed(metas[1])]
    res = judged(plain_pilot(), records)
    assert res.outcome == "pass"  # flagged, not failed: the conditions ran alike
    wrong = res.details["record_mismatches"]
    assert [(w["prompt_id"], w["check"]) for w in wrong] == [
        (metas[0]["id"], "accepted"), (metas[0]["id"], "output_tokens")]
    assert res.details["records_checked"] == 4
    assert f"cand request {metas[0]['id']} (load 'low', greedy, boot 0, stretch 0): " \
           "output_tokens 32, its verify steps and accepted drafts allow 20-24" in res.summary


def test_more_tokens_than_the_steps_allow_is_flagged_unless_the_drafter_may_skip() -> None:
    """40 tokens of 8 steps that accepted 23 drafts: 8 too many for any stop. An n-gram
    drafter may propose nothing in a step vLLM then does not count: checked from below only."""
    rec = make_record("cand", "p7", spec_verify_ct=8, spec_drafts=8,
                      spec_accepted_per_position=[8, 8, 7], output_ids=[1] * 40)
    res = judged(plain_pilot(), [rec])
    assert "output_tokens 40, its verify steps and accepted drafts allow 28-32" in res.summary
    ngram = {"speculation": {"asked": {}, "ran": {"algorithm": "ngram"}}}
    res = judged(plain_pilot("vllm"), [rec], ngram, engine="vllm")
    assert "flagged" not in res.summary and not res.details["record_mismatches"]
    short = make_record("cand", "p8", spec_verify_ct=8, spec_drafts=8,
                        spec_accepted_per_position=[8, 8, 7], output_ids=[1] * 20)
    res = judged(plain_pilot("vllm"), [short], ngram, engine="vllm")
    assert "output_tokens 20, its verify steps and accepted drafts allow >= 28" in res.summary


def test_many_disagreeing_records_are_named_up_to_five_then_counted() -> None:
    recs = [make_record("cand", f"p{i}", spec_verify_ct=8, spec_drafts=8,
                        spec_accepted_per_position=[8, 8, 7], output_ids=[1] * 40)
            for i in range(8)]
    res = judged(plain_pilot(), recs)
    flags = [f for f in res.details["flags"] if "acceptance not reconciled" in f]
    assert len(flags) == 6 and "3 more record(s)" in flags[-1]
    assert len(res.details["record_mismatches"]) == 8


# ------------------------------------------------------- SGLang's accepted-draft totals


def test_sglang_accepted_draft_totals_are_read_in_both_spellings() -> None:
    a, b = sglang_recorded()  # 0.5.23: spec_num_correct_drafts / spec_num_proposed_drafts
    assert (a.spec_accepted, a.spec_proposed, b.spec_accepted, b.spec_proposed) == (
        23, 24, 21, 36)
    older = sglang_parsed(json.loads(OLDER.read_text()))  # spec_accepted_drafts / _proposed_
    assert (older.spec_accepted, older.spec_proposed) == (22, 36)
    assert older.spec_accepted == sum(older.spec_accepted_per_position or [])
    assert not any(c.mismatch for c in self_checks([older]))


def test_the_total_stands_in_for_a_missing_histogram() -> None:
    """Without the histogram the engine's total is the accepted count: reconciled with the
    engine's counters and checked against the record's tokens (3 positions: 24 / 8)."""
    metas = json.loads((SGLANG / "meta_info.json").read_text())
    bare = [sglang_parsed({k: v for k, v in m.items() if k != "spec_correct_drafts_histogram"})
            for m in metas]
    assert all(r.spec_accepted_per_position is None for r in bare)
    found = reconcile([entry(0, {"accepted": 4.0}, {"accepted": 48.0})], bare)
    assert [(r.counter, r.records, r.engine, r.mismatch) for r in found] == [
        ("accepted", 44, 44.0, False)]
    checks = self_checks(bare)
    assert [(c.check, c.low, c.high) for c in checks] == [
        ("output_tokens", 28, 32), ("output_tokens", 30, 34)]
    assert not any(c.mismatch for c in checks)


def test_a_total_that_disagrees_with_the_histogram_is_flagged() -> None:
    meta = dict(json.loads(OLDER.read_text()), spec_accepted_drafts=20)  # histogram: 22
    res = judged(plain_pilot(), [sglang_parsed(meta)])
    assert res.outcome == "pass"
    assert "20 accepted drafts by the engine's total, 22 by its histogram" in res.summary


# ------------------------------------------------------------------ vLLM K per stretch


def vllm_facts() -> dict[str, Any]:
    """A vLLM server whose read-back config says K is fixed at 4 (nothing adapts there)."""
    return {"speculation": {"asked": {"algorithm": "draft_model", "num_draft_tokens": 4},
                            "ran": {"algorithm": "draft_model", "num_draft_tokens": 4,
                                    "adaptive": False}}}


def test_vllm_k_per_stretch_from_the_counters_fails_a_fixed_depth_pilot() -> None:
    """Planted: K 4 in stretch 0 (40 draft tokens over 10 steps), 2 in stretch 1 (40 over
    20), recorded-shape counters; the server's config is silent about it."""
    schedule = [entry(0, {"verify_steps": 0.0, "draft_tokens": 0.0, "accepted": 0.0},
                      {"verify_steps": 10.0, "draft_tokens": 40.0, "accepted": 25.0}),
                entry(1, {"verify_steps": 10.0, "draft_tokens": 40.0, "accepted": 25.0},
                      {"verify_steps": 30.0, "draft_tokens": 80.0, "accepted": 40.0}, "high")]
    strict = plain_pilot("vllm", num_draft_tokens=4)
    res = judged(strict, [], vllm_facts(), schedule, "vllm")
    assert res.outcome == "fail"
    assert res.details["differences"] == [
        "cand: engine drafted 2.00 tokens per verify step in stretch 1 (load 'high'), "
        "pilot says num_draft_tokens 4"]
    allowed = plain_pilot("vllm", num_draft_tokens=4, adaptive=True)
    res = judged(allowed, [], vllm_facts(), schedule, "vllm")
    assert res.outcome == "pass", res.summary
    assert [(d["stretch"], d["mean_k"]) for d in res.details["depth_per_stretch"]] == [
        (0, 4.0), (1, 2.0)]


def test_the_recorded_vllm_counters_give_k_4() -> None:
    for folder in (VLLM, RAW):
        before = spec_counters_of((folder / "metrics_before.txt").read_text(), VLLM_METRICS)
        after = spec_counters_of((folder / "metrics_after.txt").read_text(), VLLM_METRICS)
        depths = depth_per_stretch([entry(0, before, after)])
        assert [d["mean_k"] for d in depths] == [4.0]
        res = judged(plain_pilot("vllm", num_draft_tokens=4), [], vllm_facts(),
                     [entry(0, before, after)], "vllm")
        assert res.outcome == "pass", res.summary


# ------------------------------------------------------- a raw vLLM response, parsed


def vllm_parsed(reply: Reply, max_tokens: int) -> RequestRecord:
    with ScriptedServer(routes={("POST", "/v1/completions"): reply}) as srv:
        res = asyncio.run(OpenAIClient(srv.url, "cand", "osprey-target").generate(
            GenerationRequest("p", "x", max_tokens, want_margins=False)))
    assert res.ok, res.error
    fields = {k: v for k, v in vars(res).items() if k != "ok"}
    return make_record("cand", "p", stretch=0, output_tokens=len(res.output_ids), **fields)


def test_the_recorded_raw_vllm_responses_parse_and_reconcile() -> None:
    """Recorded from vLLM CPU 0.32 (K = 4): the streamed body as sent, byte for byte, and the
    non-streamed body (its ``metrics.speculative_decoding`` the usage chunk's) as one chunk."""
    sse = (RAW / "response_streamed.txt").read_text()
    streamed = vllm_parsed(Reply(text=sse, content_type="text/event-stream"), 24)
    spec = json.loads(sse.split("data: ")[-2])["metrics"]["speculative_decoding"]
    assert (streamed.spec_verify_ct, streamed.spec_drafts) == (spec["num_spec_steps"], 7)
    assert streamed.spec_accepted_per_position == [5, 5, 4, 4]
    assert sum(streamed.spec_accepted_per_position) == spec["num_accepted_draft_tokens"]
    assert streamed.accept_length == spec["mean_acceptance_length"]
    assert len(streamed.output_ids) == 24 and streamed.finish_reason == "length"
    body = json.loads((RAW / "response_plain.json").read_text())
    plain = vllm_parsed(Reply(events=[(0.0, body)]), 24)
    assert (plain.spec_verify_ct, plain.spec_accepted_per_position) == (5, [5, 5, 5, 4])
    assert plain.output_ids == body["choices"][0]["token_ids"]
    # 24 of 5 steps + 19 accepted + 1 (cut 1), 24 of 7 + 18 + 1 (cut 2).
    checks = self_checks([plain, streamed])
    assert [(c.value, c.low, c.high) for c in checks] == [(24, 20, 25), (24, 21, 26)]
    before = spec_counters_of((RAW / "metrics_before.txt").read_text(), VLLM_METRICS)
    after = spec_counters_of((RAW / "metrics_after.txt").read_text(), VLLM_METRICS)
    found = {r.counter: (r.records, r.engine)
             for r in reconcile([entry(0, before, after)], [plain, streamed])}
    assert found == {"verify_steps": (12, 12.0), "accepted": (37, 37.0)}
    got = accept_length([plain, streamed])
    assert got is not None and got.pooled == pytest.approx(48 / 12)
