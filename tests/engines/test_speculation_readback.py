"""The speculation the engine really ran, read back after its boot, and the records' acceptance
reconciled with the engine's own counters per stretch (docs/acceptance.md).

Planted faults through the scripted fake server: a server whose resolved steps differ from the
pilot's, one that adapts its depth, one whose counters disagree with what its responses said.
Shapes from tests/fixtures/speculation (recorded from SGLang 0.5.23 on CPU where marked so,
hand-written from the documented newer names elsewhere).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.campaign.runner import Campaign
from pytest_osprey.engines.base import BootSpec, GenerationRequest
from pytest_osprey.engines.endpoint.engine import EndpointEngine
from pytest_osprey.engines.sglang.engine import SGLangClient, SGLangEngine
from pytest_osprey.engines.speculation import (
    SGLANG_METRICS,
    VLLM_METRICS,
    sglang_ran,
    spec_counters_of,
    vllm_ran,
)
from pytest_osprey.engines.vllm.engine import OpenAIClient, VLLMEngine
from pytest_osprey.judgement.gates.kinds import GateKind
from pytest_osprey.judgement.gates.spec import GateSpec
from pytest_osprey.judgement.quality.acceptance import accept_length, reconcile
from pytest_osprey.judgement.service.fairness import judge_fairness
from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.pilot.trace import load_trace
from pytest_osprey.results.campaign_file import ScheduleEntry
from pytest_osprey.results.records import RequestRecord
from testkit.endpoint_pilot import sglang_routes, write_endpoint_pilot
from testkit.factories import ROOT, make_pilot, make_record, saved_campaign
from testkit.fake_engine import sglang_events
from testkit.fake_server import Reply, ScriptedServer

FIX = ROOT / "tests" / "fixtures" / "speculation"
RECORDED = FIX / "sglang-0.5.23-cpu-standalone"
NEWER = FIX / "sglang-newer-handwritten"
VLLM = FIX / "vllm-handwritten"
FAIRNESS = GateSpec(GateKind.FAIRNESS, "cand")


def recorded_info(**changes: Any) -> dict[str, Any]:
    info: dict[str, Any] = json.loads((RECORDED / "server_info.json").read_text())
    return info | changes


def sglang_pilot(**speculation: Any) -> Pilot:
    spec = {"algorithm": "STANDALONE", "num_steps": 3, "eagle_topk": 1, **speculation}
    return make_pilot({"base": {"role": "baseline"},
                       "cand": {"role": "candidate", "drafter": "/m/d", "speculation": spec}},
                      target={"model": "/m/target", "engine": "sglang"})


def sglang_facts(p: Pilot, info: dict[str, Any], env: dict[str, str] | None = None
                 ) -> dict[str, Any]:
    """The fingerprint facts of an SGLang engine whose server answers ``info``."""
    routes = {("GET", "/server_info"): Reply(json_body=info)}
    with ScriptedServer(routes=routes) as srv:
        engine = SGLangEngine(p, "cand", BootSpec("cand", log_dir=Path(".")))
        engine.client = SGLangClient(srv.url, "cand")
        engine.spec_env = env or {}
        facts = engine.served_facts()
    return facts


def entry(stretch: int, before: dict[str, float] | None, after: dict[str, float] | None,
          condition: str = "cand") -> ScheduleEntry:
    return ScheduleEntry(block=0, condition=condition, load="low", mode="greedy", started=0.0,
                         stretch=stretch, spec_counters=before, spec_counters_end=after)


def judged(p: Pilot, facts: dict[str, Any], schedule: Sequence[ScheduleEntry] = (),
           records: list[Any] | None = None) -> Any:
    records = records if records is not None else [make_record(c, "p0") for c in ("base", "cand")]
    data = saved_campaign(records, conditions={
        "base": {"fingerprint": {"engine": "sglang"}},
        "cand": {"fingerprint": {"engine": "sglang", **facts}}},
        schedule=[e.model_dump() for e in schedule])
    return judge_fairness(FAIRNESS, p, data)


# ------------------------------------------------------------------ read back


def test_the_recorded_sglang_server_info_reads_back_what_it_resolved() -> None:
    ran = sglang_ran(recorded_info())
    assert (ran.algorithm, ran.num_steps, ran.eagle_topk, ran.num_draft_tokens) == (
        "STANDALONE", 3, 1, 4)
    assert ran.adaptive is False
    assert ran.overlap is False  # 0.5.23 on CPU: the overlap scheduler is off


def test_newer_sglang_names_auto_spec_and_spec_v2_are_read() -> None:
    ran = sglang_ran(json.loads((NEWER / "server_info.json").read_text()))
    assert ran.adaptive is True  # auto_spec, although speculative_adaptive says false
    assert ran.overlap is True
    # Spec v2 off by its environment variable: no overlap with speculation.
    info = recorded_info(disable_overlap_schedule=False)
    assert sglang_ran(info, {"SGLANG_ENABLE_SPEC_V2": "0"}).overlap is False
    assert sglang_ran(info, {"SGLANG_ENABLE_SPEC_V2": "1"}).overlap is True


def test_matching_settings_pass_fairness_and_are_recorded() -> None:
    p = sglang_pilot()
    facts = sglang_facts(p, recorded_info())
    assert facts["speculation"]["asked"]["num_steps"] == 3
    assert facts["speculation"]["ran"]["num_draft_tokens"] == 4
    res = judged(p, facts)
    assert res.outcome == "pass", res.summary
    assert res.details["speculation"]["cand"]["ran"]["source"] == "/server_info"


def test_resolved_steps_other_than_the_pilots_fail_fairness_naming_them() -> None:
    p = sglang_pilot(num_steps=5)
    facts = sglang_facts(p, recorded_info())  # the server resolved 3 steps, 4 draft tokens
    res = judged(p, facts)
    assert res.outcome == "fail"
    assert "cand: engine ran num_steps 3, pilot says 5" in res.details["differences"]
    assert "cand: engine ran num_draft_tokens 4, pilot says 6" in res.details["differences"]


def test_adaptive_depth_fails_unless_the_pilot_allows_it_then_is_reported_per_stretch() -> None:
    info = recorded_info(speculative_adaptive=True)
    schedule = [entry(0, {"num_steps": 3}, {"num_steps": 2, "verify_steps": 4}),
                entry(1, {"num_steps": 2}, {"num_steps": 1})]
    strict = sglang_pilot()
    res = judged(strict, sglang_facts(strict, info), schedule)
    assert res.outcome == "fail"
    assert any("adapts its speculation depth" in d for d in res.details["differences"])
    assert any("num_steps 2 in stretch 0" in d for d in res.details["differences"])
    allowed = sglang_pilot(adaptive=True)
    res = judged(allowed, sglang_facts(allowed, info), schedule)
    assert res.outcome == "pass", res.summary
    assert [(d["stretch"], d["num_steps"]) for d in res.details["depth_per_stretch"]] == [
        (0, [2.0, 3.0]), (1, [1.0, 2.0])]


def test_a_depth_gauge_off_the_pilots_fails_even_where_server_info_is_silent() -> None:
    """A newer server may adapt under a name this reader does not know: the gauge shows it."""
    p = sglang_pilot()
    gauges = spec_counters_of((NEWER / "metrics_end.txt").read_text(), SGLANG_METRICS)
    res = judged(p, sglang_facts(p, recorded_info()), [entry(7, None, gauges)])
    assert "cand: engine ran num_steps 2 in stretch 7 (load 'low'), pilot says 3" in \
        res.details["differences"]


def test_vllm_k_by_batch_size_is_adaptive_depth() -> None:
    info = json.loads((VLLM / "server_info.json").read_text())
    p = make_pilot({"base": {"role": "baseline"},
                    "cand": {"role": "candidate", "drafter": "/m/d",
                             "speculation": {"num_draft_tokens": 4}}},
                   target={"model": "/m/target", "engine": "vllm"})
    routes = {("GET", "/server_info?config_format=json"): Reply(json_body=info)}
    with ScriptedServer(routes=routes) as srv:
        engine = VLLMEngine(p, "cand", BootSpec("cand", log_dir=Path(".")))
        engine.client = OpenAIClient(srv.url, "cand", "m")
        facts = engine.served_facts()
    assert facts["speculation"]["ran"]["k_by_batch_size"] == [[1, 8, 4], [9, 32, 2], [33, 256, 1]]
    res = judged(p, {"speculation": facts["speculation"]})
    assert res.outcome == "fail"
    assert any("K by batch size" in d for d in res.details["differences"])
    ran = vllm_ran({"vllm_config": {"speculative_config": {"method": "ngram",
                                                           "num_speculative_tokens": 3,
                                                           "prompt_lookup_max": 5}}})
    assert (ran.algorithm, ran.num_draft_tokens, ran.num_steps, ran.adaptive) == (
        "ngram", 3, 5, False)


# ------------------------------------------------------------------ reconciled


def test_the_recorded_sglang_counters_reconcile_with_its_responses() -> None:
    """Recorded: two greedy requests on a real SGLang 0.5.23 STANDALONE server, /metrics read
    before and after. Σ spec_verify_ct and Σ completion_tokens equal the counters' growth."""
    metas = json.loads((RECORDED / "meta_info.json").read_text())
    before = spec_counters_of((RECORDED / "metrics_before.txt").read_text(), SGLANG_METRICS)
    after = spec_counters_of((RECORDED / "metrics_after.txt").read_text(), SGLANG_METRICS)
    records = [make_record("cand", f"p{i}", stretch=0, spec_verify_ct=m["spec_verify_ct"],
                           output_ids=list(range(m["completion_tokens"])))
               for i, m in enumerate(metas)]
    found = reconcile([entry(0, before, after)], records)
    assert {r.counter: (r.records, r.engine) for r in found} == {
        "verify_steps": (20, 20.0), "output_tokens": (64, 64.0)}
    assert not any(r.mismatch for r in found)


def test_fillers_count_and_cancelled_ones_leave_the_engine_a_bound() -> None:
    """A completed filler's steps are in the engine's count and in the sum; a filler cancelled
    once the measured requests ended took steps no record reports, so there the engine may
    exceed the records but never fall short; a failed measured request leaves its stretch
    out."""
    def rec(stretch: int, steps: int | None, *, filler: bool = False,
            ok: bool = True) -> RequestRecord:  # fmt: skip
        return make_record("cand", f"p{stretch}-{steps}-{filler}", stretch=stretch, ok=ok,
                           filler=filler, spec_verify_ct=steps,
                           output_ids=list(range(steps or 0)) if ok else None)

    records = [rec(0, 5), rec(0, 7, filler=True),                   # all completed: 12
               rec(1, 5), rec(1, None, filler=True, ok=False),      # a filler cancelled
               rec(2, 5), rec(2, None, filler=True, ok=False),
               rec(3, 5), rec(3, None, ok=False)]                   # a measured one failed
    schedule = [entry(0, {"verify_steps": 0.0}, {"verify_steps": 12.0}),
                entry(1, {"verify_steps": 12.0}, {"verify_steps": 20.0}),  # 8: 3 by the cancel
                entry(2, {"verify_steps": 20.0}, {"verify_steps": 24.0}),  # 4 < 5: impossible
                entry(3, {"verify_steps": 24.0}, {"verify_steps": 40.0})]
    found = {r.stretch: r for r in reconcile(schedule, records) if r.counter == "verify_steps"}
    assert set(found) == {0, 1, 2}
    assert (found[0].records, found[0].exact, found[0].mismatch) == (12, True, False)
    assert (found[1].records, found[1].exact, found[1].mismatch) == (5, False, False)
    assert found[2].mismatch and "at least, with cancelled fillers" in found[2].text()


def test_older_meta_info_names_give_the_per_position_counts() -> None:
    meta = json.loads((NEWER / "meta_info_older_names.json").read_text())
    chunk = {"text": "x", "output_ids": list(range(32)), "meta_info": meta}
    routes = sglang_routes(Reply(events=[(0.0, chunk)]))
    with ScriptedServer(routes=routes) as srv:
        result = asyncio.run(SGLangClient(srv.url, "cand").generate(
            GenerationRequest("p0", "hi", 32, want_margins=False)))
    assert result.ok, result.error
    assert (result.spec_verify_ct, result.spec_drafts) == (12, 12)
    assert result.spec_accepted_per_position == [10, 8, 4]


def test_vllm_counter_names_are_read_per_position() -> None:
    got = spec_counters_of((VLLM / "metrics_end.txt").read_text(), VLLM_METRICS)
    assert got == {"verify_steps": 50.0, "draft_tokens": 200.0, "accepted": 110.0,
                   "pos0": 45.0, "pos1": 35.0, "pos2": 20.0, "pos3": 10.0}


class CountingSGLang:
    """A speculating SGLang endpoint whose /metrics counts what it served: ``extra_verify``
    more verify steps per request than its responses say (a planted disagreement)."""

    def __init__(self, extra_verify: int = 0) -> None:
        self.verify = self.tokens = 0
        self.extra = extra_verify
        self.lock = threading.Lock()

    def generate(self, body: Any) -> Reply:
        n = int(body["sampling_params"]["max_new_tokens"])
        events = sglang_events(body, n, incremental=True, speculates=True)
        with self.lock:  # counted before the answer, as SGLang counts a finished request
            self.verify += events[-1]["meta_info"]["spec_verify_ct"] + self.extra
            self.tokens += n
        return Reply(events=[(0.001, e) for e in events])

    def metrics(self, _body: Any) -> Reply:
        with self.lock:
            text = ("# TYPE sglang:spec_verify_calls_total counter\n"
                    f"sglang:spec_verify_calls_total{{model_name=\"m\"}} {self.verify}.0\n"
                    "# TYPE sglang:generation_tokens_total counter\n"
                    f"sglang:generation_tokens_total{{model_name=\"m\"}} {self.tokens}.0\n")
        return Reply(text=text, content_type="text/plain; version=0.0.4")


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("extra", [0, 1])
def test_a_campaign_stores_counters_per_stretch_and_flags_a_mismatch(
        tmp_path: Path, extra: int) -> None:
    fake = CountingSGLang(extra)
    routes = sglang_routes(fake.generate) | {("GET", "/metrics"): fake.metrics}
    with ScriptedServer(routes=routes) as srv:
        pilot = load_pilot(write_endpoint_pilot(tmp_path, srv.url, prompts=4))
        data = Campaign(pilot, load_trace(pilot.trace.files), tmp_path / "res",
                        list(pilot.conditions)).run()
    stretches = [e for e in data.meta.schedule if e.mode == "greedy"]
    assert stretches and all(e.spec_counters_end for e in stretches)
    res = judge_fairness(FAIRNESS, pilot, data)
    rows = [r for r in res.details["reconciliation"] if r["counter"] == "verify_steps"]
    assert rows, res.details
    if extra:
        assert all(r["mismatch"] for r in rows)
        assert "acceptance not reconciled" in res.summary
    else:
        assert not any(r["mismatch"] for r in res.details["reconciliation"])
        assert "flagged" not in res.summary


def test_endpoint_engine_reads_counters(tmp_path: Path) -> None:
    fake = CountingSGLang()
    fake.verify, fake.tokens = 7, 9
    routes = sglang_routes(fake.generate) | {("GET", "/metrics"): fake.metrics}
    with ScriptedServer(routes=routes) as srv:
        p = load_pilot(write_endpoint_pilot(tmp_path, srv.url))
        engine = EndpointEngine(p, "cand", BootSpec("cand", log_dir=tmp_path))
        engine.sglang = SGLangClient(srv.url, "cand")
        assert engine.spec_counters() == {"verify_steps": 7.0, "output_tokens": 9.0}


def test_the_recorded_vllm_config_and_counters_reconcile() -> None:
    """Recorded: a real vLLM CPU 0.32 server, K = 4 drafted by the tiny drafter; two greedy
    requests' per-request stats against the /metrics counters' growth."""
    rec = FIX / "vllm-0.32-cpu-draft-model"
    ran = vllm_ran(json.loads((rec / "server_info.json").read_text()))
    assert (ran.algorithm, ran.num_draft_tokens, ran.num_steps, ran.adaptive) == (
        "draft_model", 4, None, False)
    before = spec_counters_of((rec / "metrics_before.txt").read_text(), VLLM_METRICS)
    after = spec_counters_of((rec / "metrics_after.txt").read_text(), VLLM_METRICS)
    records = [make_record("cand", f"p{i}", stretch=0, spec_verify_ct=r["spec_verify_ct"],
                           spec_drafts=r["spec_drafts"],
                           spec_accepted_per_position=r["spec_accepted_per_position"],
                           output_ids=list(range(r["output_tokens"])))
               for i, r in enumerate(json.loads((rec / "results.json").read_text()))]
    found = {r.counter: (r.records, r.engine) for r in reconcile([entry(0, before, after)],
                                                                 records)}
    assert found == {"verify_steps": (18, 18.0), "accepted": (50, 50.0)}
    # The one definition: 64 tokens / 18 steps pooled. vLLM's own per-request figure is
    # 1 + accepted / steps: the stop cut 3 tokens from each last step, so it reads more.
    got = accept_length(records)
    assert got is not None and got.pooled == pytest.approx(64 / 18)
    stated = [r["accept_length"] for r in json.loads((rec / "results.json").read_text())]
    assert stated == pytest.approx([1 + 27 / 7, 1 + 23 / 11])
    assert got.per_request_mean == pytest.approx((32 / 7 + 32 / 11) / 2)
    assert [s - (r.output_tokens or 0) / (r.spec_verify_ct or 1)
            for s, r in zip(stated, records, strict=True)] == pytest.approx([2 / 7, 2 / 11])
