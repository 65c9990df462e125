"""Scoring sampled outputs by the target: position classes from the engine's verify steps,
scores.jsonl as saved and read, and the SGLang / vLLM scoring calls against fake servers that
answer as their documentation describes."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_osprey.engines.base import EngineError
from pytest_osprey.engines.sglang.engine import SGLangClient
from pytest_osprey.engines.vllm.engine import OpenAIClient
from pytest_osprey.results.records import Measurement, RecordsError
from pytest_osprey.results.scores import (
    ScoredPosition,
    ScoreLine,
    ScoreWriter,
    classes_of,
    position_classes,
    read_scores,
)
from testkit.factories import ROOT
from testkit.fake_server import Reply, ScriptedServer, sglang_routes

# ------------------------------------------------------------------- position classes


def _record(accepts: list[int] | None, drafts: list[int] | None, n: int) -> Measurement:
    return Measurement(ok=True, output_ids=list(range(n)), spec_step_accepts=accepts,
                       spec_step_drafts=drafts)


def test_position_classes_follow_the_verify_steps() -> None:
    # Step 1 checks 4 drafts (drafted from the prompt), accepts 2, resamples the 3rd;
    # step 2 accepts all 4 and adds a bonus; step 3 rejects its first draft; step 4 has one
    # draft left to check and accepts it, then its bonus.
    rec = _record([2, 4, 0, 1], [4, 4, 4, 1], 11)
    assert position_classes(rec) == ["drafted", "drafted", "drafted",
                                     "drafted", "drafted", "drafted", "drafted", "bonus",
                                     "drafted",
                                     "drafted", "bonus"]


def test_a_first_step_without_drafts_is_the_first_token_and_later_ones_are_bonus() -> None:
    # No draft checked at the first step (no budget left to draft): the target's own token.
    assert position_classes(_record([0, 0], [0, 0], 2)) == ["first", "bonus"]
    assert position_classes(_record([0, 3], [0, 3], 5)) == ["first", "drafted", "drafted",
                                                           "drafted", "bonus"]


def test_an_output_cut_inside_a_step_keeps_its_positions_classes() -> None:
    # End of sequence at the 2nd accepted draft of step 2: the rest of that step is not output.
    assert position_classes(_record([1, 3], [4, 4], 4)) == ["drafted", "drafted", "drafted",
                                                           "drafted"]


@pytest.mark.parametrize(("accepts", "drafts", "n"), [
    (None, None, 5),  # the engine does not say (SGLang, vLLM)
    ([1, 2], [4], 5),  # lists of different lengths
    ([5], [4], 5),  # more accepted than checked
    ([0], [4], 3),  # steps that do not cover the output
])
def test_an_unknown_or_unreadable_split_is_first_then_later(
        accepts: list[int] | None, drafts: list[int] | None, n: int) -> None:
    rec = _record(accepts, drafts, n)
    assert position_classes(rec) is None
    assert classes_of(rec) == ["first"] + ["later"] * (n - 1)


# ------------------------------------------------------------------- scores.jsonl


def _line(condition: str, index: int, run_id: str | None = "r1",
          vocab: int | None = 32000) -> ScoreLine:
    positions = tuple(ScoredPosition(7 + t, -0.123456 - t, (7 + t, 3), (-0.123456 - t, -2.5))
                      for t in range(3))
    return ScoreLine(condition, "p0", index, "base", positions, ("first", "drafted", "bonus"),
                     run_id, vocab)


def test_scores_round_trip_rounded_to_four_decimals(tmp_path: Path) -> None:
    path = tmp_path / "scores.jsonl"
    writer = ScoreWriter(path)
    writer.write([_line("base", 0), _line("cand", 1, vocab=None)])
    writer.write([_line("cand", 2, run_id="older")])
    writer.close()
    back = read_scores(path, "r1")
    assert [(s.condition, s.sample_index) for s in back] == [("base", 0), ("cand", 1)]
    first = back[1].positions[1]
    assert first.token == 8 and first.top_ids == (8, 3)
    assert first.logprob == round(-1.123456, 4) and first.top_logprobs == (-1.1235, -2.5)
    assert back[1].classes == ("first", "drafted", "bonus") and back[1].scorer == "base"
    assert (back[0].vocab, back[1].vocab) == (32000, None)
    assert len(read_scores(path)) == 3


def test_a_torn_last_line_is_skipped_and_a_bad_line_named(tmp_path: Path) -> None:
    path = tmp_path / "scores.jsonl"
    path.write_text(_line("base", 0).to_json() + "\n" + '{"condition": "ca', encoding="utf-8")
    assert len(read_scores(path)) == 1
    bad = json.loads(_line("base", 1).to_json()) | {"classes": ["first", "drafted", "weird"]}
    path.write_text(json.dumps(bad) + "\n" + _line("base", 0).to_json() + "\n", "utf-8")
    with pytest.raises(RecordsError, match=r"scores.jsonl:1: .*unknown position class"):
        read_scores(path)
    short = json.loads(_line("base", 1).to_json()) | {"logprobs": [-1.0]}
    path.write_text(json.dumps(short) + "\n", "utf-8")
    with pytest.raises(RecordsError, match=r"scores.jsonl:1: .*different lengths"):
        read_scores(path)


def test_a_folder_without_scores_reads_as_not_scored(tmp_path: Path) -> None:
    assert read_scores(tmp_path / "scores.jsonl") == []


# ------------------------------------------------------------------- servers' scoring

V = 12
PROMPT = [5, 1, 9]
OUTPUTS = [[3, 0, 11, 2], [7]]


def _truth(context: list[int]) -> np.ndarray:
    """The fake target's raw log-probabilities after ``context`` (any fixed function)."""
    rng = np.random.default_rng(sum((i + 1) * t for i, t in enumerate(context)))
    logits = rng.normal(0, 2, V)
    return logits - np.logaddexp.reduce(logits)


def _sglang_answer(body: dict[str, Any]) -> Reply:
    ids, start, k = body["input_ids"], body["logprob_start_len"], body["top_logprobs_num"]
    own, tops = [], []
    for t in range(start, len(ids)):
        if t == start:  # as SGLang 0.5.23 answers: no logprob at the start position itself
            own.append([None, ids[t], None])
            tops.append(None)
            continue
        lp = _truth(ids[:t])
        order = np.argsort(-lp)[:k]
        own.append([float(lp[ids[t]]), ids[t], None])
        tops.append([[float(lp[i]), int(i), None] for i in order])
    return Reply(json_body={"text": "", "meta_info": {
        "prompt_tokens": len(ids), "completion_tokens": 0,
        "input_token_logprobs": own, "input_top_logprobs": tops}})


def _vllm_answer(body: dict[str, Any]) -> Reply:
    ids, k = body["prompt"], body["prompt_logprobs"]
    per: list[Any] = [None]
    for t in range(1, len(ids)):
        lp = _truth(ids[:t])
        order = list(np.argsort(-lp))
        entry = {str(i): {"logprob": float(lp[i]), "rank": order.index(i) + 1,
                          "decoded_token": f"<{i}>"} for i in order[:k]}
        entry[str(ids[t])] = {"logprob": float(lp[ids[t]]), "rank": order.index(ids[t]) + 1,
                              "decoded_token": f"<{ids[t]}>"}
        per.append(entry)
    return Reply(json_body={"choices": [{"text": "", "prompt_logprobs": per,
                                         "finish_reason": "length"}]})


def _check(scored: list[list[ScoredPosition]], k: int) -> None:
    assert [len(s) for s in scored] == [len(o) for o in OUTPUTS]
    for output, positions in zip(OUTPUTS, scored, strict=True):
        for t, (token, pos) in enumerate(zip(output, positions, strict=True)):
            lp = _truth(PROMPT + output[:t])
            assert pos.token == token
            assert math.isclose(pos.logprob, lp[token], abs_tol=1e-9)
            assert list(pos.top_ids) == list(np.argsort(-lp)[:k])
            assert np.allclose(pos.top_logprobs, np.sort(lp)[::-1][:k])


def test_sglang_scores_from_input_logprobs_as_documented() -> None:
    with ScriptedServer(sglang_routes(_sglang_answer)) as server:
        client = SGLangClient(server.url, "base")
        scored = asyncio.run(client.score(PROMPT, OUTPUTS, 4))
        bodies = server.bodies("/generate")
    _check(scored, 4)
    assert bodies[0]["input_ids"] == PROMPT + OUTPUTS[0]
    assert bodies[0]["logprob_start_len"] == len(PROMPT) - 1
    assert bodies[0]["return_logprob"] is True and bodies[0]["top_logprobs_num"] == 4
    assert bodies[0]["sampling_params"]["max_new_tokens"] == 0


def test_vllm_scores_from_prompt_logprobs_as_documented() -> None:
    routes = {("POST", "/v1/completions"): _vllm_answer}
    with ScriptedServer(routes) as server:  # type: ignore[arg-type]
        client = OpenAIClient(server.url, "base", "served-model")
        scored = asyncio.run(client.score(PROMPT, OUTPUTS, 3))
        bodies = server.bodies("/v1/completions")
    _check(scored, 3)
    assert bodies[0]["prompt"] == PROMPT + OUTPUTS[0] and bodies[0]["prompt_logprobs"] == 3
    assert bodies[0]["max_tokens"] == 1 and bodies[0]["echo"] is True
    assert bodies[0]["model"] == "served-model"


def test_a_server_that_returns_no_logprobs_cannot_score() -> None:
    plain = Reply(json_body={"text": "", "meta_info": {"prompt_tokens": 7}})
    with (ScriptedServer(sglang_routes(plain)) as server,
          pytest.raises(EngineError, match=r"base: scoring at /generate: no input_token")):
        asyncio.run(SGLangClient(server.url, "base").score(PROMPT, OUTPUTS, 4))
    refused = Reply(status=400, json_body={"error": "prompt_logprobs not allowed"})
    with (ScriptedServer({("POST", "/v1/completions"): refused}) as server,
          pytest.raises(EngineError, match=r"answered HTTP 400")):
        asyncio.run(OpenAIClient(server.url, "cand", "m").score(PROMPT, OUTPUTS, 4))


def test_scores_for_another_sequence_are_refused() -> None:
    def shifted(body: dict[str, Any]) -> Reply:
        reply = _sglang_answer(body)
        for entry in reply.json_body["meta_info"]["input_token_logprobs"]:
            entry[1] += 1  # the server scored other tokens than those sent
        return reply

    with (ScriptedServer(sglang_routes(shifted)) as server,
          pytest.raises(EngineError, match=r"where the output has")):
        asyncio.run(SGLangClient(server.url, "base").score(PROMPT, OUTPUTS, 4))


# ------------------------------------------------------------------- the campaign's scoring


class _Engine:
    """A condition whose every sampled output is 3 tokens; ``scores``: how the baseline
    answers a scoring request (None: the engine has no score capability)."""

    def __init__(self, condition: str, calls: list[tuple[str, str, int]]) -> None:
        self.condition = condition
        self.calls = calls

    def start(self) -> None: ...

    async def generate(self, request: Any) -> Measurement:
        return Measurement(ok=True, ttft_s=0.01, e2e_s=0.02, itl_s=[0.005, 0.005],
                           output_ids=[1, 2, 3], output_text="abc", prompt_tokens=4,
                           spec_step_accepts=[2], spec_step_drafts=[2])

    def fingerprint(self) -> dict[str, Any]:
        return {"engine": "fake"}

    def memory_mb(self) -> float | None:
        return None

    def flush(self) -> None: ...

    def stop(self) -> None: ...

    server = None
    tokenizer = None

    def spec_counters(self) -> None:
        return None


class _Scoring(_Engine):
    vocab_size = 50

    async def score(self, prompt: str, outputs: Any, top_k: int) -> list[list[ScoredPosition]]:
        self.calls.append((self.condition, prompt, len(outputs)))
        return [[ScoredPosition(t, -1.0, (t, 0), (-1.0, -2.0)) for t in o] for o in outputs]


class _Refusing(_Engine):
    vocab_size = None

    async def score(self, prompt: str, outputs: Any, top_k: int) -> list[list[ScoredPosition]]:
        raise EngineError(f"{self.condition}: scoring at /generate: no input_token_logprobs")


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("kind", ["scores", "refuses", "cannot"])
def test_interleaved_the_baseline_scores_every_conditions_samples_while_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    from pytest_osprey.campaign import runner
    from pytest_osprey.campaign.runner import Campaign
    from pytest_osprey.pilot.trace import load_trace
    from testkit.factories import make_pilot, write_trace

    calls: list[tuple[str, str, int]] = []
    engine = {"scores": _Scoring, "refuses": _Refusing, "cannot": _Engine}[kind]
    monkeypatch.setattr(runner, "make_engine", lambda p, c, b: engine(c, calls))
    trace = write_trace(tmp_path / "t.jsonl", 2)
    pilot = make_pilot(trace={"files": [str(trace)]},
                       load={"levels": {"low": 1}, "passes": 1, "warmup_requests": 0,
                             "order": "interleaved"},
                       sampling={"sampled": {"enabled": True, "prompts": 2,
                                             "samples_per_prompt": 3}})
    said: list[str] = []
    data = Campaign(pilot, load_trace([trace]), tmp_path / "res", ["base", "cand"],
                    progress=lambda e: said.append(e.line())).run()
    if kind != "scores":
        assert data.scores == [] and not (tmp_path / "res" / "scores.jsonl").exists()
        why = "no input_token_logprobs" if kind == "refuses" else "cannot score outputs"
        assert any("sampled outputs not scored" in s and why in s for s in said), said
        return
    # One scoring request per prompt and condition, all to the baseline's engine.
    assert sorted((c, n) for c, _, n in calls) == [("base", 3)] * 4
    assert len(data.scores_of("base")) == len(data.scores_of("cand")) == 6
    assert all(s.scorer == "base" and s.classes == ("drafted", "drafted", "bonus")
               and s.vocab == 50 for s in data.scores)


def test_sglang_scores_a_recorded_real_answer() -> None:
    """SGLang 0.5.23 on CPU, recorded: its entry at logprob_start_len carries no logprob, so
    the request starts one before the output and every output position is scored."""
    from pytest_osprey.engines.scoring import sglang_scores

    recorded = json.loads((ROOT / "tests" / "fixtures" / "sglang-0.5.23-cpu"
                           / "score_input_logprobs.json").read_text())
    request, answer = recorded["request"], recorded["answer"]
    own = answer["meta_info"]["input_token_logprobs"]
    assert own[0][0] is None  # the start position's own entry, as the server answers it
    n_prompt = request["logprob_start_len"] + 1
    output = request["input_ids"][n_prompt:]
    scored = sglang_scores(answer, output, request["top_logprobs_num"], "baseline")
    assert [p.token for p in scored] == output
    for pos in scored:
        assert pos.logprob < 0 and len(pos.top_ids) == request["top_logprobs_num"]
        assert list(pos.top_logprobs) == sorted(pos.top_logprobs, reverse=True)
        assert pos.logprob <= pos.top_logprobs[0]
