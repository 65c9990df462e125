"""PROTOCOL tests of the SGLang client and command line against an in-test HTTP server."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.engines.base import EngineError, GenerationRequest
from pytest_osprey.engines.endpoint.engine import EndpointEngine
from pytest_osprey.engines.sglang import engine as sg
from pytest_osprey.pilot.schema import Pilot
from testkit.factories import ROOT, make_pilot
from testkit.fake_engine import sglang_events
from testkit.fake_server import Reply, ScriptedServer

FIXTURES = ROOT / "tests" / "fixtures" / "sglang-0.5.23-cpu"


def pilot(**conditions: Any) -> Pilot:
    """The baseline and ``conditions`` on an SGLang target."""
    return make_pilot({"base": {"role": "baseline"}, **conditions},
                      target={"engine": "sglang", "dtype": "bfloat16"})


def req(**kw: Any) -> GenerationRequest:
    return GenerationRequest(**{"prompt_id": "p", "prompt": "Hi", "max_new_tokens": 4, **kw})


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def meta(done: int, **kw: Any) -> dict[str, Any]:
    return {"prompt_tokens": 3, "completion_tokens": done, "finish_reason": None, **kw}


def top(a: float, b: float) -> list[list[Any]]:
    return [[a, 1, None], [b, 2, None]]


TOPS = [top(-0.1, -2.0), top(-0.5, -0.7), top(-0.2, -1.2), top(-0.3, -0.4)]
FINAL = meta(
    4,
    finish_reason={"type": "length", "length": 4},
    spec_verify_ct=2,
    spec_accept_length=2.0,
    output_top_logprobs=TOPS,
)


def cumulative_events() -> list[tuple[float, Any]]:
    return [
        (
            0.05,
            {"text": "a", "output_ids": [7], "meta_info": meta(1, output_top_logprobs=TOPS[:1])},
        ),
        (0.3, {"text": "abcd", "output_ids": [7, 8, 9, 10], "meta_info": FINAL}),
    ]


# --------------------------------------------------------------------------- streaming


def test_protocol_sglang_cumulative_stream_multi_token_chunk() -> None:
    with ScriptedServer() as srv:
        srv.routes[("POST", "/generate")] = Reply(events=cumulative_events())
        res = run(sg.SGLangClient(srv.url, "c").generate(req()))
    assert res.ok, res.error
    assert res.output_ids == [7, 8, 9, 10]
    assert res.output_text == "abcd"
    assert res.prompt_tokens == 3
    assert res.finish_reason == "length"
    assert res.spec_verify_ct == 2
    assert res.accept_length == pytest.approx(2.0)  # completion_tokens / spec_verify_ct
    assert res.top2_margin == pytest.approx([1.9, 0.2, 1.0, 0.1])
    # One ITL entry per token after the first; the 3-token chunk shares its gap evenly.
    assert len(res.itl_s) == 3
    assert res.itl_s[0] == res.itl_s[1] == res.itl_s[2]
    assert sum(res.itl_s) >= 0.25
    assert res.ttft_s is not None and 0.04 <= res.ttft_s < res.e2e_s


def test_protocol_sglang_incremental_stream() -> None:
    events = [
        (0, {"text": "a", "output_ids": [7], "meta_info": meta(1)}),
        (0, {"text": "b", "output_ids": [8], "meta_info": meta(2)}),
        (0, {"text": "cd", "output_ids": [9, 10], "meta_info": meta(4, finish_reason="stop")}),
    ]
    with ScriptedServer() as srv:
        srv.routes[("POST", "/generate")] = Reply(events=events)
        res = run(sg.SGLangClient(srv.url, "c").generate(req(want_margins=False)))
    assert res.ok, res.error
    assert res.output_ids == [7, 8, 9, 10]
    assert res.output_text == "abcd"
    assert len(res.itl_s) == 3
    assert res.finish_reason == "stop"
    assert res.accept_length is None and res.spec_verify_ct is None  # no speculation ran
    assert res.top2_margin is None


@pytest.mark.parametrize("speculates", [False, True])
@pytest.mark.parametrize("margins", [False, True])
def test_protocol_sglang_incremental_and_cumulative_streams_read_alike(
    margins: bool, speculates: bool
) -> None:
    """The same answer streamed both ways (chunks shaped as a real 0.5.23 server's) gives
    the same result: deltas are appended, cumulative chunks replace what came before."""
    n = 7
    body = sg.SGLangClient("http://x", "c").body(req(max_new_tokens=n, want_margins=margins))
    results = []
    for incremental in (True, False):
        events = sglang_events(body, n, incremental=incremental, speculates=speculates)
        with ScriptedServer() as srv:
            srv.routes[("POST", "/generate")] = Reply(events=[(0.01, e) for e in events])
            results.append(run(sg.SGLangClient(srv.url, "c").generate(
                req(max_new_tokens=n, want_margins=margins))))
    inc, cum = results
    assert inc.ok and cum.ok, (inc.error, cum.error)
    assert inc.output_ids == cum.output_ids == [100 + i for i in range(n)]
    assert inc.output_text == cum.output_text == "".join(f"t{i} " for i in range(n))
    assert len(inc.itl_s) == len(cum.itl_s) == n - 1
    assert inc.top2_margin == cum.top2_margin
    if margins:
        top = [row for e in events for row in e["meta_info"]["output_top_logprobs"]][-n:]
        assert inc.top2_margin == pytest.approx([a[0] - b[0] for a, b in top])
    else:
        assert inc.top2_margin is None
    assert inc.spec_verify_ct == cum.spec_verify_ct == ((n + 1) // 2 if speculates else None)
    assert inc.accept_length == cum.accept_length


def test_protocol_sglang_an_aborted_request_is_a_failure() -> None:
    """SGLang ends an aborted request's stream like a finished one, finish_reason abort."""
    events = sglang_events({}, 9, incremental=True, speculates=False, abort_after=2)
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    with ScriptedServer() as srv:
        srv.routes[("POST", "/generate")] = Reply(events=[(0, e) for e in events])
        res = run(sg.SGLangClient(srv.url, "c").generate(req(max_new_tokens=9)))
    assert not res.ok
    assert res.error == "aborted by the server: Aborted"
    assert res.ttft_s is not None and len(res.itl_s) == 4  # what was timed is kept


def test_protocol_sglang_request_body() -> None:
    client = sg.SGLangClient("http://x", "c")
    body = client.body(req(temperature=0.7, top_p=0.9, seed=11))
    assert body["stream"] is True and body["text"] == "Hi"
    assert body["sampling_params"] == {
        "max_new_tokens": 4,
        "temperature": 0.7,
        "top_p": 0.9,
        "sampling_seed": 11,
    }
    assert body["return_logprob"] is True and body["top_logprobs_num"] == 2
    plain = client.body(req(want_margins=False))
    assert "sampling_seed" not in plain["sampling_params"]
    assert "return_logprob" not in plain


def test_protocol_sglang_api_key_sent_as_bearer() -> None:
    with ScriptedServer() as srv:
        srv.routes[("POST", "/generate")] = Reply(events=cumulative_events())
        run(sg.SGLangClient(srv.url, "c", api_key="s3cret").generate(req()))
    assert srv.seen[0].headers["Authorization"] == "Bearer s3cret"


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        (Reply(500, text="boom"), "HTTP 500"),
        (Reply(events=[(0, "{not json")]), "malformed JSON"),
        (Reply(events=[(0, {"text": "a", "output_ids": [1], "meta_info": meta(1)})], done=False),
         "truncated"),
        (Reply(events=[(0, {"error": {"message": "out of memory"}})]), "out of memory"),
        (Reply(events=[(0, "[1, 2]")]), "not a JSON object"),
    ],
)  # fmt: skip
def test_protocol_sglang_failures_become_failed_results(reply: Reply, needle: str) -> None:
    with ScriptedServer() as srv:
        srv.routes[("POST", "/generate")] = reply
        res = run(sg.SGLangClient(srv.url, "c").generate(req()))
    assert not res.ok
    assert res.error is not None and needle in res.error


def test_protocol_sglang_timeout_is_a_failed_result() -> None:
    with ScriptedServer() as srv:
        srv.routes[("POST", "/generate")] = Reply(events=cumulative_events(), delay=3)
        res = run(sg.SGLangClient(srv.url, "c").generate(req(timeout_s=0.3)))
    assert not res.ok and res.error is not None and "timed out" in res.error
    assert res.e2e_s is not None and res.e2e_s < 2


def test_protocol_sglang_connection_refused_is_a_failed_result() -> None:
    with ScriptedServer() as srv:
        url = srv.url
    res = run(sg.SGLangClient(url, "c").generate(req(timeout_s=5)))
    assert not res.ok and res.error is not None and "Connect" in res.error


# --------------------------------------------------------------------------- control


@pytest.mark.slow  # over a second on 2 busy cores
def test_protocol_sglang_flush_retries_while_busy() -> None:
    with ScriptedServer() as srv:
        srv.routes[("POST", "/flush_cache")] = [Reply(400, text="busy"), Reply(400), Reply(200)]
        sg.SGLangClient(srv.url, "c").flush()
    assert len(srv.bodies("/flush_cache")) == 3


@pytest.mark.slow  # over a second on 2 busy cores
def test_protocol_sglang_flush_gives_up_when_always_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sg, "FLUSH_RETRY_S", 0.6)
    with ScriptedServer() as srv:
        srv.routes[("POST", "/flush_cache")] = Reply(400, text="not idle")
        with pytest.raises(EngineError, match="busy"):
            sg.SGLangClient(srv.url, "c").flush()


def test_protocol_sglang_fingerprint_from_server_info_fallback() -> None:
    info = {
        "version": "0.5.23",
        "model_path": "/m/target",
        "dtype": "bfloat16",
        "context_length": 4096,
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 3,
        "api_key": "s3cret",
        "max_total_num_tokens": 123456,
        "internal_states": [{"avg_spec_accept_length": None}],
    }
    with ScriptedServer() as srv:
        srv.routes[("GET", "/server_info")] = Reply(404)
        srv.routes[("GET", "/get_server_info")] = Reply(json_body=info)
        fp = sg.SGLangClient(srv.url, "c").fingerprint()
    assert fp["version"] == "0.5.23"
    assert fp["kv_capacity_tokens"] == 123456
    assert fp["context_length"] == 4096
    assert "avg_spec_accept_length" not in fp  # read at boot it is always empty
    assert fp["args"]["speculative_algorithm"] == "EAGLE3"
    assert "s3cret" not in repr(fp)


def test_protocol_sglang_fingerprint_resolved_facts_of_a_real_server() -> None:
    """From a real 0.5.23 STANDALONE server's /server_info: context length null in the args
    (resolved on /v1/models), 48 running requests at most, incremental streaming, seeds
    ignored outside deterministic inference."""
    info = json.loads((FIXTURES / "incremental_standalone" / "server_info.json").read_text())
    models = json.loads((FIXTURES / "incremental_standalone" / "v1_models.json").read_text())
    assert info["context_length"] is None
    with ScriptedServer() as srv:
        srv.routes[("GET", "/server_info")] = Reply(json_body=info)
        srv.routes[("GET", "/v1/models")] = Reply(json_body=models)
        fp = sg.SGLangClient(srv.url, "c").fingerprint()
    assert fp["context_length"] == 1024
    assert fp["max_running_requests"] == 48
    assert fp["streaming"] == "incremental"
    assert fp["sampling_seed"] == sg.SEED_IGNORED
    assert fp["verification"] == "greedy"
    plain = json.loads((FIXTURES / "incremental_plain" / "server_info.json").read_text())
    with ScriptedServer() as srv:
        srv.routes[("GET", "/server_info")] = Reply(json_body={
            **plain, "incremental_streaming_output": False,
            "enable_deterministic_inference": True})
        fp = sg.SGLangClient(srv.url, "c").fingerprint()
    assert fp["max_running_requests"] > 48  # the plain server: its pool's size
    assert fp["context_length"] is None  # no /v1/models here: not guessed
    assert (fp["streaming"], fp["sampling_seed"]) == ("cumulative", "honoured")


@pytest.mark.parametrize(
    ("info", "verification"),
    [
        ({"speculative_algorithm": None, "device": "cpu"}, None),
        ({"speculative_algorithm": "STANDALONE", "device": "cpu"}, "greedy"),
        ({"speculative_algorithm": "EAGLE3", "device": "cuda"}, "sampled"),
    ],
)
def test_protocol_sglang_fingerprint_says_how_drafts_are_verified(
    info: dict[str, Any], verification: str | None
) -> None:
    with ScriptedServer() as srv:
        srv.routes[("GET", "/server_info")] = Reply(json_body={"version": "0.5.23", **info})
        fp = sg.SGLangClient(srv.url, "c").fingerprint()
    assert fp["verification"] == verification


def test_protocol_sglang_endpoint_503_while_starting() -> None:
    p = pilot(ep={"role": "candidate", "endpoint": {"url": "http://x", "protocol": "sglang"}})
    with ScriptedServer() as srv:
        srv.routes[("GET", "/health")] = Reply(503)
        srv.routes[("GET", "/health_generate")] = Reply(503)
        p2 = p.model_copy(
            update={"conditions": {**p.conditions, "ep": _endpoint(p, srv.url, "sglang")}}
        )
        engine = EndpointEngine(p2, "ep", _boot(Path(".")))
        with pytest.raises(EngineError, match="HTTP 503"):
            engine.start()


def _endpoint(p: Pilot, url: str, protocol: str, key_env: str | None = None) -> Any:
    cond = p.conditions["ep"]
    assert cond.endpoint is not None
    ep = cond.endpoint.model_copy(update={"url": url, "protocol": protocol, "api_key_env": key_env})
    return cond.model_copy(update={"endpoint": ep})


def _boot(log_dir: Path) -> Any:
    from pytest_osprey.engines.base import BootSpec

    return BootSpec("ep", log_dir=log_dir)


# --------------------------------------------------------------------------- argv


def test_sglang_argv_baseline_has_no_speculation() -> None:
    argv = sg.sglang_argv(pilot(), "base", 30001)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert not [a for a in argv if a.startswith("--speculative")]
    assert argv[argv.index("--port") + 1] == "30001"
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert "--enable-metrics" in argv
    assert "--incremental-streaming-output" in argv  # chunks carry only what is new


def test_sglang_argv_topk1_consistency() -> None:
    p = pilot(cand={"role": "candidate", "drafter": "/m/d",
                    "speculation": {"algorithm": "eagle3", "num_steps": 3}})  # fmt: skip
    argv = sg.sglang_argv(p, "cand", 1)
    assert argv[argv.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert argv[argv.index("--speculative-num-steps") + 1] == "3"
    assert argv[argv.index("--speculative-eagle-topk") + 1] == "1"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "/m/d"
    # Only draft tokens given: steps follow from them.
    p = pilot(cand={"role": "candidate", "drafter": "/m/d", "speculation": {"num_draft_tokens": 6}})
    argv = sg.sglang_argv(p, "cand", 1)
    assert argv[argv.index("--speculative-num-steps") + 1] == "5"
    assert argv[argv.index("--speculative-algorithm") + 1] == "STANDALONE"
    # Both given and inconsistent: refused up front.
    p = pilot(cand={"role": "candidate", "drafter": "/m/d",
                    "speculation": {"num_steps": 3, "num_draft_tokens": 8}})  # fmt: skip
    with pytest.raises(EngineError, match=r"num_steps \+ 1"):
        sg.sglang_argv(p, "cand", 1)


def test_sglang_argv_bad_algorithm_lists_valid_values() -> None:
    p = pilot(cand={"role": "candidate", "drafter": "/m/d", "speculation": {"algorithm": "BOGUS"}})
    with pytest.raises(EngineError) as exc:
        sg.sglang_argv(p, "cand", 1)
    for valid in sg.ALGORITHMS:
        assert valid in str(exc.value)


def test_sglang_argv_ngram_and_missing_drafter() -> None:
    p = pilot(cand={"role": "candidate", "speculation": {"algorithm": "NGRAM"}})
    argv = sg.sglang_argv(p, "cand", 1)
    assert "--speculative-draft-model-path" not in argv
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
    p = pilot(cand={"role": "candidate", "speculation": {"algorithm": "EAGLE"}})
    with pytest.raises(EngineError, match="needs a drafter"):
        sg.sglang_argv(p, "cand", 1)


def test_sglang_argv_carries_a_key_file_never_the_key_and_engine_args_last() -> None:
    p = pilot()
    p = p.model_copy(
        update={"target": p.target.model_copy(update={"engine_args": ["--log-level", "debug"]})}
    )
    key = sg.KeyFile("s3cret-key")
    try:
        argv = sg.sglang_argv(p, "base", 1, key_file=key.path)
        assert "--api-key" not in argv and not any("s3cret" in a for a in argv)
        assert argv[argv.index("--config") + 1] == key.path
        assert json.loads(Path(key.path).read_text()) == {"api-key": "s3cret-key"}
        assert os.stat(key.path).st_mode & 0o777 == 0o600
        assert os.stat(key.folder).st_mode & 0o777 == 0o700
        assert argv[-2:] == ["--log-level", "debug"]
    finally:
        key.remove()
    assert not os.path.exists(key.folder)


def test_sglang_argv_refuses_a_second_config_file() -> None:
    p = pilot()
    p = p.model_copy(
        update={"target": p.target.model_copy(update={"engine_args": ["--config", "my.yaml"]})}
    )
    assert sg.sglang_argv(p, "base", 1)[-2:] == ["--config", "my.yaml"]  # no key: fine
    with pytest.raises(EngineError, match="SGLang reads one config file"):
        sg.sglang_argv(p, "base", 1, key_file="/k.yaml")


def test_protocol_sglang_serving_sampling_reaches_the_server() -> None:
    """top-k, min-p, ignore-EOS and the seed go into sampling_params under SGLang's names."""
    with ScriptedServer() as srv:
        srv.routes[("POST", "/generate")] = Reply(events=cumulative_events())
        res = run(sg.SGLangClient(srv.url, "c").generate(req(
            temperature=0.7, top_p=0.95, top_k=40, min_p=0.05, ignore_eos=True, seed=9,
            want_margins=False)))
        (body,) = srv.bodies("/generate")
    assert res.ok, res.error
    assert body["sampling_params"] == {"max_new_tokens": 4, "temperature": 0.7, "top_p": 0.95,
                                       "top_k": 40, "min_p": 0.05, "ignore_eos": True,
                                       "sampling_seed": 9}
