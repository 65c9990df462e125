"""The sampling-parameters pass and its gate: probes, checks, and planted faults, the last
through real processes (the fake SGLang server of testkit, with its tiny greedy model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.engines.base import GenerationRequest, unsupported
from pytest_osprey.engines.embedded.engine import SAMPLING_PARAMS as TRANSFORMERS_PARAMS
from pytest_osprey.engines.sglang.engine import SAMPLING_PARAMS as SGLANG_PARAMS
from pytest_osprey.engines.sglang.engine import SGLangClient
from pytest_osprey.engines.vllm.engine import OpenAIClient
from pytest_osprey.judgement import GateSpec, evaluate
from pytest_osprey.pilot.probes import BY_NAME, PLAIN
from pytest_osprey.results.folder import SavedCampaign
from pytest_osprey.results.preflight_file import Preflight
from pytest_osprey.results.records import RequestRecord
from testkit.factories import make_pilot, make_record, write_pilot
from testkit.pilot_run import PilotRun, fake_sglang

# --------------------------------------------------------------------------- probes


def test_probe_settings_are_derived_from_the_plain_output() -> None:
    text, ids = "def add(a, b):\n    return a + b\n", [5, 6, 7, 8]
    stop = BY_NAME["stop"].settings(text, ids, 24)
    assert stop is not None and text.find(stop["stop"][0]) >= len(text) // 3
    assert BY_NAME["logit_bias"].settings(text, ids, 24) == {"logit_bias": {5: -100.0}}
    assert BY_NAME["min_new_tokens"].settings(text, ids, 24) == {"min_new_tokens": 24}
    assert BY_NAME["min_new_tokens"].settings(text, list(range(24)), 24) is None  # no effect


@pytest.mark.parametrize(
    ("probe", "settings", "text", "ids", "wrong"),
    [
        ("stop", {"stop": ["ret"]}, "def add(a, b):\n    ", [1], None),
        ("stop", {"stop": ["ret"]}, "def add(a, b):\n    return", [1], "stop string"),
        ("stop", {"stop": ["ret"]}, "def sub(", [1], "not the plain output"),
        ("max_new_tokens", {"max_new_tokens": 3}, "", [5, 6, 7], None),
        ("max_new_tokens", {"max_new_tokens": 3}, "", [5, 6, 7, 8], "past max_new_tokens"),
        ("min_new_tokens", {"min_new_tokens": 5}, "", [1, 2], "ended after 2"),
        ("logit_bias", {"logit_bias": {"5": -100.0}}, "", [6, 5], "banned"),
        ("json_schema", {}, '"yes"', [1], None),
        ("json_schema", {}, '{"a": 1}', [1], "not one of"),
        ("regex", {}, "no", [1], None),
        ("regex", {}, "maybe", [1], "does not match"),
    ],
)
def test_probe_checks(probe: str, settings: dict[str, Any], text: str, ids: list[int],
                      wrong: str | None) -> None:
    plain = "def add(a, b):\n    return a + b\n"
    got = BY_NAME[probe].check(settings, text, ids, plain, [5, 6, 7, 8, 9])
    assert (got is None) if wrong is None else (got is not None and wrong in got), got


def test_engines_map_every_parameter_or_refuse_it() -> None:
    req = GenerationRequest("p", "x", 8, frequency_penalty=0.5, presence_penalty=0.5,
                            repetition_penalty=1.2, stop=("\n",), min_new_tokens=4,
                            logit_bias={7: -100.0}, json_schema='{"enum": ["yes"]}', regex="a+")
    assert unsupported(req, TRANSFORMERS_PARAMS) == ["json_schema", "regex"]
    assert unsupported(req, SGLANG_PARAMS) == []
    sp = SGLangClient("http://127.0.0.1:1", "c").body(req)["sampling_params"]
    assert sp["frequency_penalty"] == 0.5 and sp["repetition_penalty"] == 1.2
    assert sp["stop"] == ["\n"] and sp["min_new_tokens"] == 4
    assert sp["logit_bias"] == {"7": -100.0} and sp["json_schema"] == '{"enum": ["yes"]}'
    assert sp["regex"] == "a+"
    body = OpenAIClient("http://127.0.0.1:1", "c", "m").body(req)
    assert body["min_tokens"] == 4 and body["logit_bias"] == {"7": -100.0}
    assert body["structured_outputs"] == {"json": {"enum": ["yes"]}, "regex": "a+"}
    assert body["presence_penalty"] == 0.5 and body["stop"] == ["\n"]
    plain = SGLangClient("http://127.0.0.1:1", "c").body(GenerationRequest("p", "x", 8))
    assert set(plain["sampling_params"]) == {"max_new_tokens", "temperature", "top_p"}


# --------------------------------------------------------------------------- the gate


def _rec(cond: str, probe: str, ids: list[int], text: str = "", *, ok: bool = True,
         error: str | None = None, request: dict[str, Any] | None = None) -> RequestRecord:
    return make_record(cond, "p", measured=False, mode="params", ok=ok, error=error,
                       output_ids=ids, output_text=text, probe=probe, request=request)


def _judge(records: list[RequestRecord]) -> Any:
    p = make_pilot(
        target={"model": "m"}, trace={"files": ["t.jsonl"]},
        conditions={"base": {"role": "baseline"}, "cand": {"role": "candidate"}},
        sampling={"params": {"enabled": True}})
    data = SavedCampaign(Path("."), {"conditions": {"base": {}, "cand": {}}}, records)
    return evaluate(GateSpec("sampling_params", "cand", reference="base"), p, data, Preflight())


def test_a_penalty_ignored_by_the_candidate_fails_and_is_named() -> None:
    pen = {"repetition_penalty": 1.3}
    base = [_rec("base", PLAIN, [1, 2, 1, 2]), _rec("base", "repetition_penalty", [1, 2, 3, 4],
                                                      request=pen)]
    good = [_rec("cand", PLAIN, [1, 2, 1, 2]), _rec("cand", "repetition_penalty", [1, 2, 3, 4],
                                                     request=pen)]
    bad = [_rec("cand", PLAIN, [1, 2, 1, 2]), _rec("cand", "repetition_penalty", [1, 2, 1, 2],
                                                    request=pen)]
    res = _judge(base + good)
    assert res.outcome == "pass" and res.evidence == "tested", res.summary
    res = _judge(base + bad)
    assert res.outcome == "fail" and "repetition_penalty" in res.details["broken"], res.summary


def test_probes_that_could_not_fail_are_not_tested() -> None:
    pen = {"frequency_penalty": 1.0}
    same = [_rec(c, PLAIN, [1, 2, 3]) for c in ("base", "cand")]
    same += [_rec(c, "frequency_penalty", [1, 2, 3], request=pen) for c in ("base", "cand")]
    same += [_rec(c, "regex", [], ok=False, error="unsupported by the transformers engine: regex",
                  request={"regex": "(yes|no)"}) for c in ("base", "cand")]
    res = _judge(same)
    assert res.outcome == "skip" and res.evidence == "not_evaluable", res.summary
    assert "changed nothing" in res.details["not_tested"]["frequency_penalty"]
    assert "unsupported" in res.details["not_tested"]["regex"]


def test_broken_constrained_output_fails() -> None:
    schema = {"json_schema": '{"enum": ["yes", "no"]}'}
    recs = [_rec(c, PLAIN, [1]) for c in ("base", "cand")]
    recs += [_rec("base", "json_schema", [3], '"yes"', request=schema),
             _rec("cand", "json_schema", [4, 4, 4], "{{{", request=schema)]
    res = _judge(recs)
    assert res.outcome == "fail" and "not JSON" in res.details["broken"]["json_schema"]


# --------------------------------------------------------------------------- real processes


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One pilot run over the fake SGLang server: the baseline, a drafter condition that
    honours every parameter, and one that drops penalties while speculating."""
    tmp = tmp_path_factory.mktemp("params")
    lm = {"OSPREY_FAKE_LM": "1"}
    data = fake_sglang(tmp / "events", base_env=lm, cand_env=lm, extra_conditions={
        "bad": {"role": "candidate", "speculation": {"algorithm": "NGRAM"},
                "env": {**lm, "OSPREY_FAKE_IGNORE_PENALTIES_WHEN_SPECULATING": "1"}}})
    # Greedy probes only: the fake server's greedy model is what they check.
    data["sampling"] = {"params": {"enabled": True, "prompts": 2, "max_new_tokens": 24,
                                   "samples": 0}}
    data["limits"] = {"speedup_min": 0.01}
    path = write_pilot(tmp, data.pop("conditions"), prompts=2, **data)
    (tmp / "work").mkdir()
    run = PilotRun(tmp / "work", path, tmp / "events", "-rA")
    try:
        rc = run.run(timeout=180)
    finally:
        run.cleanup()
    summary = json.loads((run.results / "summary.json").read_text("utf-8"))
    return {"rc": rc, "summary": summary, "records": run.records(), "output": run.output()}


def _gate(summary: dict[str, Any], kind: str, gid: str) -> dict[str, Any]:
    return next(g for g in summary["gates"] if g["kind"] == kind and g["id"] == gid)


@pytest.mark.slow  # over a second on 2 busy cores
def test_penalties_ignored_only_when_speculating_fail_the_gate(fake_run: dict[str, Any]) -> None:
    bad = _gate(fake_run["summary"], "sampling_params", "bad-vs-baseline")
    assert bad["outcome"] == "fail", bad["summary"]
    assert set(bad["details"]["broken"]) == {"frequency_penalty", "presence_penalty",
                                             "repetition_penalty"}, bad["details"]
    good = _gate(fake_run["summary"], "sampling_params", "cand-vs-baseline")
    assert good["outcome"] == "pass" and good["evidence"] == "tested", good["summary"]
    for name in ("frequency_penalty", "presence_penalty", "repetition_penalty", "max_new_tokens",
                 "min_new_tokens", "logit_bias", "json_schema", "regex"):
        assert name in good["details"]["honoured"], good["details"]
    verdicts = {v["candidate"]: v["verdict"] for v in fake_run["summary"]["verdicts"]}
    assert verdicts["bad"] == "DROP", fake_run["output"][-2000:]
    params = [r for r in fake_run["records"] if r["mode"] == "params"]
    assert {r["probe"] for r in params} >= {PLAIN, "repetition_penalty", "json_schema"}


def test_fake_engine_acceptance_is_recorded_per_position(fake_run: dict[str, Any]) -> None:
    greedy = [r for r in fake_run["records"] if r["condition"] == "cand" and r["mode"] == "params"
              and r["ok"] and r["spec_drafts"]]
    assert greedy and all(r["spec_accepted_per_position"][:2] == [r["spec_drafts"]] * 2
                          and r["spec_accepted_per_position"][2] == 0 for r in greedy)
