"""PROTOCOL tests of the OpenAI-style (vLLM) client, /metrics counters and command line."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.engines.base import BootSpec, EngineError, GenerationRequest
from pytest_osprey.engines.endpoint.engine import EndpointEngine
from pytest_osprey.engines.vllm import engine as vl
from pytest_osprey.pilot.schema import Pilot
from testkit.factories import make_pilot
from testkit.fake_server import Reply, ScriptedServer


def pilot(**conditions: Any) -> Pilot:
    """The baseline and ``conditions`` on a vLLM target."""
    return make_pilot({"base": {"role": "baseline"}, **conditions},
                      target={"engine": "vllm", "context_length": 512})


def req(**kw: Any) -> GenerationRequest:
    return GenerationRequest(**{"prompt_id": "p", "prompt": "Hi", "max_new_tokens": 4, **kw})


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def choice(
    text: str, ids: list[int], tops: list[dict[str, float]] | None, finish: Any = None
) -> dict[str, Any]:
    logprobs = None
    if tops is not None:
        logprobs = {"tokens": [f"token_id:{i}" for i in ids], "top_logprobs": tops}
    return {"choices": [{"index": 0, "text": text, "token_ids": ids, "logprobs": logprobs,
                         "finish_reason": finish}]}  # fmt: skip


T = [{"token_id:7": -0.1, "token_id:3": -2.0}, {"token_id:8": -0.5, "token_id:4": -0.7},
     {"token_id:9": -0.2, "token_id:5": -1.2, "token_id:6": -3.0},
     {"token_id:10": -0.3, "token_id:2": -0.4}]  # fmt: skip
USAGE = {
    "choices": [],
    "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    "metrics": {"speculative_decoding": {"mean_acceptance_length": 2.5, "num_spec_steps": 2,
                                         "num_accepted_draft_tokens": 3, "num_draft_tokens": 4,
                                         "draft_acceptance_rate": 0.75,
                                         "acceptance_histogram": [0, 1, 1], "num_spec_tokens": 2}},
}  # fmt: skip


def stream(usage: dict[str, Any] = USAGE) -> list[tuple[float, Any]]:
    return [
        (0.05, choice("a", [7], T[:1])),
        (0.3, choice("bcd", [8, 9, 10], T[1:], "length")),
        (0, usage),
    ]


def metrics_text(drafts: float, accepted: float) -> str:
    return (
        "# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.\n"
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}\n'
        "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {drafts * 4}\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}\n'
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0\n'
    )


# --------------------------------------------------------------------------- streaming


def test_protocol_openai_stream_ids_margins_and_per_request_spec() -> None:
    with ScriptedServer() as srv:
        srv.routes[("POST", "/v1/completions")] = Reply(events=stream())
        res = run(vl.OpenAIClient(srv.url, "c", "osprey-target").generate(req()))
    assert res.ok, res.error
    assert res.output_ids == [7, 8, 9, 10]
    assert res.output_text == "abcd"
    assert res.prompt_tokens == 3
    assert res.finish_reason == "length"
    assert res.top2_margin == pytest.approx([1.9, 0.2, 1.0, 0.1])
    assert res.accept_length == 2.5 and res.spec_verify_ct == 2
    assert len(res.itl_s) == 3 and res.itl_s[0] == res.itl_s[1] == res.itl_s[2]
    assert sum(res.itl_s) >= 0.25
    assert res.ttft_s is not None and res.ttft_s >= 0.04


def test_protocol_openai_request_body() -> None:
    client = vl.OpenAIClient("http://x", "c", "osprey-target")
    body = client.body(req(temperature=0.8, top_p=0.95, seed=5))
    assert body["model"] == "osprey-target" and body["prompt"] == "Hi"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 4 and body["temperature"] == 0.8 and body["top_p"] == 0.95
    assert body["seed"] == 5 and body["logprobs"] == 2 and body["return_token_ids"] is True
    plain = client.body(req(want_margins=False))
    assert "seed" not in plain and "logprobs" not in plain


def test_protocol_openai_without_token_ids_counts_logprob_tokens() -> None:
    events = [
        (0, {"choices": [{"index": 0, "text": "ab", "finish_reason": None,
                          "logprobs": {"tokens": ["a", "b"], "top_logprobs": T[:2]}}]}),
        (0, {"choices": [{"index": 0, "text": "cd", "finish_reason": "stop",
                          "logprobs": {"tokens": ["c", "d"], "top_logprobs": T[2:]}}]}),
        (0, {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}),
    ]  # fmt: skip
    with ScriptedServer() as srv:
        srv.routes[("POST", "/v1/completions")] = Reply(events=events)
        res = run(vl.OpenAIClient(srv.url, "c", "m").generate(req()))
    assert res.ok, res.error
    assert res.output_ids == []  # not given: never guessed
    assert res.output_text == "abcd" and len(res.itl_s) == 3
    assert res.accept_length is None and res.finish_reason == "stop"


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        (Reply(500, json_body={"object": "error", "message": "boom"}), "HTTP 500"),
        (Reply(events=[(0, "{bad")]), "malformed JSON"),
        (Reply(events=[(0, choice("a", [1], None))], done=False), "truncated"),
        (Reply(events=[(0, {"object": "error", "message": "bad seed"})]), "bad seed"),
    ],
)
def test_protocol_openai_failures_become_failed_results(reply: Reply, needle: str) -> None:
    with ScriptedServer() as srv:
        srv.routes[("POST", "/v1/completions")] = reply
        res = run(vl.OpenAIClient(srv.url, "c", "m").generate(req()))
    assert not res.ok and res.error is not None and needle in res.error


def test_protocol_openai_timeout_is_a_failed_result() -> None:
    with ScriptedServer() as srv:
        srv.routes[("POST", "/v1/completions")] = Reply(events=stream(), delay=3)
        res = run(vl.OpenAIClient(srv.url, "c", "m").generate(req(timeout_s=0.3)))
    assert not res.ok and res.error is not None and "timed out" in res.error


# --------------------------------------------------------------------------- /metrics


def test_protocol_openai_metrics_counters_parse() -> None:
    text = metrics_text(10, 25) + 'vllm:spec_decode_num_drafts_total{engine="1"} 5\n'
    counters = vl.counters_from(text)
    assert counters == {"drafts": 15.0, "draft_tokens": 40.0, "accepted": 25.0}
    assert vl.kv_capacity_from(text) == 1600
    assert vl.counters_from("# nothing here\n") == {}
    assert vl.accept_from({"drafts": 10, "accepted": 20}, {"drafts": 14, "accepted": 30}) == 3.5
    assert vl.accept_from({"drafts": 10, "accepted": 20}, {"drafts": 10, "accepted": 20}) is None


def _engine_on(url: str) -> vl.VLLMEngine:
    p = pilot(cand={"role": "candidate", "drafter": "/m/d"})
    engine = vl.VLLMEngine(p, "cand", BootSpec("cand", log_dir=Path(".")))
    engine.client = vl.OpenAIClient(url, "cand", vl.SERVED_NAME)
    return engine


def test_protocol_openai_accept_length_from_metrics_when_alone() -> None:
    no_spec = {k: v for k, v in USAGE.items() if k != "metrics"}
    with ScriptedServer() as srv:
        srv.routes[("GET", "/metrics")] = [
            Reply(text=metrics_text(0, 0)),  # engine start
            Reply(text=metrics_text(10, 20)),  # before the request
            Reply(text=metrics_text(12, 25)),  # after it: 1 + 5/2
            Reply(text=metrics_text(20, 35)),
        ]
        srv.routes[("POST", "/v1/completions")] = Reply(events=stream(no_spec))
        engine = _engine_on(srv.url)
        engine._at_start = engine.client.counters_sync()  # type: ignore[union-attr]
        res = run(engine.generate(req()))
        assert res.ok and res.accept_length == pytest.approx(3.5)
        # Pooled over the engine's life: 1 + 35/20.
        assert engine.pooled_accept_length() == pytest.approx(2.75)


def test_protocol_openai_overlapping_requests_get_no_per_request_accept() -> None:
    no_spec = {k: v for k, v in USAGE.items() if k != "metrics"}
    with ScriptedServer() as srv:
        srv.routes[("GET", "/metrics")] = Reply(text=metrics_text(10, 20))
        srv.routes[("POST", "/v1/completions")] = Reply(events=stream(no_spec))
        engine = _engine_on(srv.url)

        async def both() -> list[Any]:
            return list(await asyncio.gather(engine.generate(req()), engine.generate(req())))

        results = run(both())
    assert all(r.ok and r.accept_length is None for r in results)
    assert engine._in_flight == 0


def test_protocol_openai_per_request_metrics_win_over_counters() -> None:
    with ScriptedServer() as srv:
        srv.routes[("GET", "/metrics")] = Reply(text=metrics_text(10, 20))
        srv.routes[("POST", "/v1/completions")] = Reply(events=stream())
        engine = _engine_on(srv.url)
        assert run(engine.generate(req())).accept_length == 2.5
        run(engine.generate(req()))
    # Once per-request metrics are seen, /metrics is no longer polled around requests.
    assert len([s for s in srv.seen if s.path == "/metrics"]) == 1


def test_protocol_openai_fingerprint() -> None:
    with ScriptedServer() as srv:
        srv.routes[("GET", "/version")] = Reply(json_body={"version": "0.32.0"})
        srv.routes[("GET", "/v1/models")] = Reply(
            json_body={"data": [{"id": "osprey-target", "max_model_len": 512}]}
        )
        srv.routes[("GET", "/metrics")] = Reply(text=metrics_text(1, 1))
        fp = vl.OpenAIClient(srv.url, "c", "m").fingerprint()
    assert fp == {
        "engine": "vllm",
        "version": "0.32.0",
        "context_length": 512,
        "kv_capacity_tokens": 1600,
    }


# --------------------------------------------------------------------------- prefix cache


@pytest.mark.parametrize(("replies", "flushed"), [
    ([Reply(json_body={"success": True})], True),
    # success false while blocks are still held: retried until it is true
    ([Reply(json_body={"success": False}), Reply(json_body={"success": True})], True),
    ([Reply(404, json_body={"detail": "Not Found"})], False),  # no dev mode: no route
    ([Reply(200, text="ok")], False),  # an answer that does not say success
])  # fmt: skip
def test_protocol_openai_only_a_successful_reset_counts_as_a_flush(
    replies: list[Reply], flushed: bool
) -> None:
    with ScriptedServer() as srv:
        srv.routes[("POST", "/reset_prefix_cache")] = replies
        engine = _engine_on(srv.url)
        if flushed:
            engine.flush()
        else:
            with pytest.raises(EngineError, match="passes would share the prefix cache"):
                engine.flush()


@pytest.mark.slow  # over a second on 2 busy cores
def test_protocol_openai_a_reset_that_never_succeeds_gives_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vl, "FLUSH_RETRY_S", 0.6)
    with ScriptedServer() as srv:
        srv.routes[("POST", "/reset_prefix_cache")] = Reply(json_body={"success": False})
        with pytest.raises(EngineError, match=r"for 0.6 s: passes would share"):
            _engine_on(srv.url).flush()
    assert len(srv.bodies("/reset_prefix_cache")) >= 2


def test_vllm_prefix_cache_flushed_on_loopback_else_off() -> None:
    """/reset_prefix_cache needs VLLM_SERVER_DEV_MODE, whose other endpoints must not face a
    network: beyond loopback the prefix cache is turned off instead of flushed."""
    local = pilot()
    assert "--no-enable-prefix-caching" not in vl.vllm_argv(local, "base", 8000)
    assert vl.VLLMEngine(local, "base", BootSpec("base", Path("."))).dev_mode
    wide = local.model_copy(update={"target": local.target.model_copy(
        update={"host": "0.0.0.0"})})
    assert "--no-enable-prefix-caching" in vl.vllm_argv(wide, "base", 8000)
    engine = vl.VLLMEngine(wide, "base", BootSpec("base", Path(".")))
    assert not engine.dev_mode
    engine.client = vl.OpenAIClient("http://127.0.0.1:9", "base", vl.SERVED_NAME)
    engine.flush()  # nothing to flush, nothing sent
    assert engine.fingerprint()["prefix_cache"] == vl.PREFIX_OFF
    assert [vl.loopback(h) for h in ("127.0.0.1", "::1", "localhost", "10.0.0.2", "box")] == [
        True, True, True, False, False]


def test_protocol_openai_an_aborted_request_is_a_failure() -> None:
    events = [(0, choice("a", [7], None)), (0, choice("b", [8], None, finish="abort"))]
    with ScriptedServer() as srv:
        srv.routes[("POST", "/v1/completions")] = Reply(events=events)
        res = run(vl.OpenAIClient(srv.url, "c", "m").generate(req(want_margins=False)))
    assert not res.ok and res.error == "aborted by the server (finish_reason abort)"
    assert res.ttft_s is not None


# --------------------------------------------------------------------------- endpoint


def _endpoint_pilot(url: str, key_env: str | None) -> Pilot:
    ep = {"url": url, "protocol": "openai", "api_key_env": key_env, "model": "served"}
    return pilot(ep={"role": "candidate", "endpoint": ep})


def test_protocol_openai_endpoint_uses_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSPREY_TEST_KEY", "k-123")
    with ScriptedServer() as srv:
        srv.routes[("GET", "/health")] = Reply(200)
        srv.routes[("POST", "/v1/completions")] = Reply(events=stream())
        engine = EndpointEngine(_endpoint_pilot(srv.url, "OSPREY_TEST_KEY"), "ep",
                                BootSpec("ep", log_dir=Path(".")))  # fmt: skip
        engine.start()
        res = run(engine.generate(req()))
        fp = engine.fingerprint()
        engine.stop()
    assert res.ok
    assert all(s.headers.get("Authorization") == "Bearer k-123" for s in srv.seen)
    assert srv.bodies("/v1/completions")[0]["model"] == "served"
    assert "k-123" not in json.dumps(fp)
    assert engine.memory_mb() is None


def test_protocol_openai_endpoint_missing_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OSPREY_NO_SUCH_KEY", raising=False)
    engine = EndpointEngine(_endpoint_pilot("http://127.0.0.1:9", "OSPREY_NO_SUCH_KEY"), "ep",
                            BootSpec("ep", log_dir=Path(".")))  # fmt: skip
    with pytest.raises(EngineError, match="OSPREY_NO_SUCH_KEY"):
        engine.start()


# --------------------------------------------------------------------------- argv


def test_vllm_argv_baseline_has_no_speculation() -> None:
    argv = vl.vllm_argv(pilot(), "base", 8001)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--speculative-config" not in argv
    assert argv[argv.index("--max-model-len") + 1] == "512"
    assert argv[argv.index("--served-model-name") + 1] == vl.SERVED_NAME
    assert "--api-key" not in argv


def test_vllm_argv_speculative_config() -> None:
    p = pilot(cand={"role": "candidate", "drafter": "/m/d", "speculation": {"num_draft_tokens": 3}})
    argv = vl.vllm_argv(p, "cand", 1)
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"method": "draft_model", "model": "/m/d", "num_speculative_tokens": 3}
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    older = vl.vllm_argv(p, "cand", 1, per_request_metrics=False)
    assert "--per-request-spec-decode-metrics" not in older
    p = pilot(cand={"role": "candidate", "speculation": {"algorithm": "ngram", "num_steps": 3}})
    config = vl.speculative_config(p, "cand")
    assert config["prompt_lookup_max"] == 3 and config["prompt_lookup_min"] == 2
    assert "model" not in config


def test_vllm_installed_version_without_vllm_is_none() -> None:
    assert vl.installed_version(sys.executable, dict(os.environ)) is None
    assert vl.installed_version("/no/such/python", {}) is None


def test_vllm_argv_bad_method_lists_valid_values() -> None:
    p = pilot(
        cand={"role": "candidate", "drafter": "/m/d", "speculation": {"algorithm": "medusa2"}}
    )
    with pytest.raises(EngineError) as exc:
        vl.vllm_argv(p, "cand", 1)
    for valid in vl.METHODS:
        assert valid in str(exc.value)


def test_protocol_openai_serving_sampling_reaches_the_server() -> None:
    """top-k, min-p, ignore-EOS and the seed of a timed request at a serving sampling are sent
    under vLLM's names (recorded shape: the scripted server's received body)."""
    with ScriptedServer() as srv:
        srv.routes[("POST", "/v1/completions")] = Reply(events=stream())
        res = run(vl.OpenAIClient(srv.url, "c", "osprey-target").generate(req(
            temperature=0.7, top_p=0.95, top_k=40, min_p=0.05, ignore_eos=True, seed=9,
            want_margins=False)))
        (body,) = srv.bodies("/v1/completions")
    assert res.ok, res.error
    assert {k: body[k] for k in ("temperature", "top_p", "top_k", "min_p", "ignore_eos",
                                 "seed")} == {"temperature": 0.7, "top_p": 0.95, "top_k": 40,
                                              "min_p": 0.05, "ignore_eos": True, "seed": 9}
    plain = vl.OpenAIClient("http://x", "c", "m").body(req())
    assert not {"top_k", "min_p", "ignore_eos"} & set(plain)  # defaults: nothing sent
