"""The fidelity benchmark's pieces: the scripted stub's streams parse through our clients
(multi-token chunks, ids, text, request numbers), and fidelity.py reads the vLLM driver's
output. Nothing here asserts a duration: timing is the benchmark's business."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.engines.base import GenerationRequest, GenerationResult
from pytest_osprey.engines.sglang.engine import SGLangClient
from pytest_osprey.engines.vllm.engine import OpenAIClient
from testkit import stream_fidelity as fid
from testkit import timed_stream as stub
from testkit.fake_server import Reply, ScriptedServer

FAST = stub.Schedule(ttft_s=0.005, gap_s=0.002, chunks=(1, 3, 2), jitter=0.2, seed=3)
TOKENS = 10  # chunks of 1, 3, 2, 1, 3


def req(tokens: int = TOKENS) -> GenerationRequest:
    return GenerationRequest("p", "a short prompt", tokens, want_margins=False, timeout_s=30)


def clients(url: str) -> dict[str, SGLangClient | OpenAIClient]:
    return {"sglang": SGLangClient(url, "c"), "openai": OpenAIClient(url, "c", "stub")}


def test_schedule_cycles_chunk_sizes_and_cuts_the_last() -> None:
    plan = FAST.plan(0, TOKENS)
    assert [size for _, size in plan] == [1, 3, 2, 1, 3]
    offsets = [at for at, _ in plan]
    assert offsets == sorted(offsets) and offsets[0] > 0
    assert FAST.plan(0, TOKENS) == plan and FAST.plan(1, TOKENS) != plan  # seeded per request
    assert [size for _, size in FAST.plan(0, 5)] == [1, 3, 1]
    assert stub.Schedule(jitter=0.0).plan(0, 4) == [(0.040, 1), (0.060, 3)]


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_stub_stream_parses_through_our_client(api: str) -> None:
    with stub.serve_in_thread(FAST) as server:
        client = clients(f"http://127.0.0.1:{server.port}")[api]
        res = asyncio.run(client.generate(req()))
        log = server.entries()
    assert res.ok, res.error
    assert res.output_ids == stub.expected_ids(TOKENS)
    assert res.output_text == stub.expected_text(0, TOKENS)
    assert stub.request_number(res.output_text) == 0
    assert len(res.itl_s) == TOKENS - 1  # one entry per token after the first
    # Chunks of 1, 3, 2, ... tokens: each chunk's gap is split evenly over its tokens.
    assert res.itl_s[0] == res.itl_s[1] == res.itl_s[2] and res.itl_s[3] == res.itl_s[4]
    assert res.finish_reason == "length" and res.prompt_tokens == 3
    assert res.spec_verify_ct == 5 and res.accept_length == pytest.approx(TOKENS / 5)
    (entry,) = log
    assert entry["n"] == 0 and entry["api"] == api and entry["complete"]
    assert entry["tokens"] == TOKENS and len(entry["t_write"]) == 5
    assert entry["t_recv"] < entry["t_write"][0] <= entry["t_end"]


def test_stub_numbers_concurrent_requests_and_clients_keep_connections() -> None:
    async def burst(cs: dict[str, SGLangClient | OpenAIClient]) -> list[GenerationResult]:
        first = await asyncio.gather(*(c.generate(req()) for c in cs.values() for _ in range(3)))
        again = [await c.generate(req(4)) for c in cs.values()]  # reuses a kept-alive one
        return [*first, *again]

    with stub.serve_in_thread(FAST) as server:
        results = asyncio.run(burst(clients(f"http://127.0.0.1:{server.port}")))
        log = {e["n"]: e for e in server.entries()}
        connections = server.connections
    assert all(r.ok for r in results), [r.error for r in results]
    numbers = [stub.request_number(r.output_text) for r in results]
    assert sorted(n for n in numbers if n is not None) == list(range(8))
    for r, n in zip(results, numbers, strict=True):
        assert n is not None and log[n]["complete"]
        assert r.output_ids == stub.expected_ids(log[n]["tokens"])
        assert r.output_text == stub.expected_text(n, log[n]["tokens"])
    assert {e["api"] for e in log.values()} == {"sglang", "openai"}
    assert connections == 6  # the last two requests went on connections already open


def test_client_keeps_the_base_urls_path_and_reads_close_delimited_streams() -> None:
    # The scripted server answers HTTP/1.0 (the body ends when it closes the connection).
    events = [(0, {"text": "ab", "output_ids": [1, 2], "meta_info": {"completion_tokens": 2}})]
    with ScriptedServer() as srv:
        srv.routes[("POST", "/prefix/generate")] = Reply(events=events)
        results = asyncio.run(_twice(SGLangClient(f"{srv.url}/prefix", "c")))
    assert all(r.ok and r.output_ids == [1, 2] for r in results), [r.error for r in results]
    assert [s.path for s in srv.seen] == ["/prefix/generate"] * 2


async def _twice(client: SGLangClient) -> list[GenerationResult]:
    return [await client.generate(req(2)) for _ in range(2)]


def test_fidelity_splits_per_token_itl_back_into_chunk_gaps() -> None:
    # Chunks of 1, 3, 2 tokens, gaps 0.03 and 0.02 s: split evenly over their tokens.
    per_token = fid.Outcome(ok=True, itl_s=[0.01, 0.01, 0.01, 0.01, 0.01])
    assert fid._chunk_gaps(per_token, [1, 3, 2], per_token=True) == pytest.approx([0.03, 0.02])
    first_big = fid.Outcome(ok=True, itl_s=[0.0, 0.0, 0.005, 0.005])
    assert fid._chunk_gaps(first_big, [3, 2], per_token=True) == pytest.approx([0.01])
    assert fid._chunk_gaps(per_token, [1, 3], per_token=True) is None  # does not fit
    per_chunk = fid.Outcome(ok=True, itl_s=[0.03, 0.02])
    assert fid._chunk_gaps(per_chunk, [1, 3, 2], per_token=False) == [0.03, 0.02]


def _fake_log() -> dict[int, dict[str, Any]]:
    # Request 7: received at 100.0 s, chunks (1, 3) scheduled at +40 and +60 ms, written at
    # +41 and +62 ms.
    return {
        7: {
            "n": 7, "api": "openai", "t_recv": 100.0, "tokens": 4,
            "plan": [[0.040, 1], [0.060, 3]], "t_write": [100.041, 100.062],
            "t_end": 100.063, "complete": True, "backlogged": 0,
        }
    }  # fmt: skip


def test_fidelity_reads_the_vllm_driver_output(tmp_path: Path) -> None:
    text = stub.expected_text(7, 4)
    good = {"success": True, "error": "", "ttft": 0.0425, "itl": [0.0205],
            "generated_text": text, "output_tokens": 4, "start_time": 99.9995}  # fmt: skip
    bad = {"success": False, "error": "Traceback...\nClientConnectorError: refused",
           "ttft": 0.0, "itl": [], "generated_text": "", "output_tokens": 0,
           "start_time": 100.5}  # fmt: skip
    wrong = {**good, "generated_text": stub.expected_text(8, 4)}  # no such request
    out = tmp_path / "vllm.json"
    out.write_text(json.dumps({"vllm_version": "0.32.0", "levels": [
        {"concurrency": 2, "requests": 3, "cpu_s": 0.004, "wall_s": 0.1,
         "results": [good, bad, wrong]},
    ]}))  # fmt: skip
    runs, version = fid.read_vllm_output(out)
    assert version == "0.32.0"
    (run,) = runs
    assert run.client == "vllm-bench" and run.api == "openai" and not run.itl_per_token
    assert run.concurrency == 2 and len(run.outcomes) == 3
    row = fid.analyse(run, _fake_log())
    assert row["requests"] == 3 and row["errors"] == 2
    assert any(k.startswith("failed: ClientConnectorError") for k in row["problems"])
    assert row["problems"]["output matches no request"] == 1
    # TTFT 42.5 ms against 41 ms from receipt (1.5 ms) and 40 ms scheduled (2.5 ms).
    assert row["ttft_err_vs_stub_ms"]["p50"] == pytest.approx(1.5)
    assert row["ttft_err_vs_script_ms"]["p50"] == pytest.approx(2.5)
    # One chunk gap: 20.5 ms against 21 ms written and 20 ms scheduled.
    assert row["itl_err_vs_stub_ms"]["p50"] == pytest.approx(0.5)
    assert row["itl_err_vs_script_ms"]["p50"] == pytest.approx(0.5)
    assert row["send_lag_ms"]["p50"] == pytest.approx(0.5)
    assert row["cpu_ms_per_chunk"] == pytest.approx(4 / 2)  # 4 ms over the 2 chunks matched
    table = fid.table([row])
    assert "| vllm-bench | 2 | 3 | 2 | 1.500 / 1.50 |" in table


def test_fidelity_flags_wrong_ids_and_counts() -> None:
    text = stub.expected_text(7, 4)
    ok = fid.Outcome(ok=True, ttft_s=0.0425, itl_s=[0.007, 0.007, 0.007], text=text,
                     tokens=4, ids=stub.expected_ids(4))  # fmt: skip
    wrong_ids = fid.Outcome(**{**ok.__dict__, "ids": [1, 2, 3, 4]})
    short = fid.Outcome(**{**ok.__dict__, "tokens": 3})
    run = fid.ClientRun("osprey-openai", "openai", 1, True, 0.0, 0.0, [ok, wrong_ids, short])
    row = fid.analyse(run, _fake_log())
    assert row["problems"] == {"wrong token ids": 1, "wrong token count": 1}


def test_fidelity_stub_subprocess_serves_and_logs() -> None:
    server = fid.Stub(FAST)
    try:
        res = asyncio.run(OpenAIClient(server.url, "c", "stub").generate(req(3)))
        with urllib.request.urlopen(f"{server.url}/health", timeout=10) as r:
            assert r.status == 200
        log = server.log()
    finally:
        server.close()
    assert res.ok, res.error
    assert list(log) == [0] and log[0]["api"] == "openai" and log[0]["complete"]
    run = fid.ClientRun(
        "osprey-openai", "openai", 1, True, 0.001, 0.1,
        [fid.Outcome(ok=True, ttft_s=res.ttft_s, itl_s=res.itl_s, text=res.output_text,
                     tokens=len(res.output_ids), ids=res.output_ids)],
    )  # fmt: skip
    row = fid.analyse(run, log)
    assert row["errors"] == 0 and row["chunks"] == 2
