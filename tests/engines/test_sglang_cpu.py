"""A real SGLang 0.5.23 server on CPU, through the project's engine and over raw HTTP.

One plain server (speculation off) is booted for the whole module, streaming cumulatively as
SGLang does by default (the engine boots its servers with --incremental-streaming-output; an
endpoint may not have it): the client must read both. The speculative servers
(tests/engines/test_sglang_cpu_spec.py) stream incrementally. Needs ``OSPREY_SGLANG_PYTHON`` (see
testkit/sglang_cpu.py).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pytest_osprey.engines.base import GenerationRequest, GenerationResult
from pytest_osprey.engines.sglang import engine as sglang_module
from pytest_osprey.engines.sglang.engine import SGLangEngine
from testkit.sglang_cpu import (
    MAX_TOKENS,
    MODELS,
    NEEDS_SGLANG,
    PROMPTS,
    base_url,
    booted,
    generate,
    group_alive,
    pilot,
    still_alive,
    stream_chunks,
)

pytestmark = [
    pytest.mark.engine,
    NEEDS_SGLANG,
    pytest.mark.skipif(
        not (MODELS / "tiny-target").is_dir(),
        reason=f"tiny models not found under {MODELS} (set OSPREY_TINY_MODELS)",
    ),
]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangEngine]:
    """The module's one plain server, stopped and checked gone after the module's last test,
    whichever that is (no test stops it, so none depends on running before another)."""
    with pytest.MonkeyPatch.context() as mp:
        # SGLang's default streaming, as an endpoint may serve it: the flag's slot in the
        # command line repeats --enable-metrics instead.
        mp.setattr(sglang_module, "INCREMENTAL", "--enable-metrics")
        with booted(pilot(), "baseline", tmp_path_factory.mktemp("sglang-plain")) as engine:
            assert engine.server is not None
            pids, pgid = engine.server.pids(), engine.server.pid
            yield engine
    # Stopped by booted(): the launcher, its scheduler and detokenizer, and their group.
    assert pgid is not None and len(pids) >= 2, "launcher plus scheduler and detokenizer"
    assert not still_alive(pids), still_alive(pids)
    assert not group_alive(pgid), "a process of the server's group outlived it"


def request(i: int, n: int = MAX_TOKENS, **kw: Any) -> GenerationRequest:
    kw.setdefault("timeout_s", 300)
    return GenerationRequest(f"p{i}", PROMPTS[i % len(PROMPTS)], n, **kw)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def one_by_one(engine: SGLangEngine, n: int = MAX_TOKENS) -> list[GenerationResult]:
    return [await engine.generate(request(i, n)) for i in range(len(PROMPTS))]


async def together(engine: SGLangEngine, n: int = MAX_TOKENS) -> list[GenerationResult]:
    return list(await asyncio.gather(*(engine.generate(request(i, n)) for i in range(8))))


def test_argv_and_fingerprint(plain: SGLangEngine, record_property: Any) -> None:
    argv = plain.argv
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert argv[argv.index("--model-path") + 1] == str(MODELS / "tiny-target")
    assert "--speculative-algorithm" not in argv
    fp = plain.fingerprint()
    assert fp["engine"] == "sglang" and fp["version"] == "0.5.23"
    assert fp["dtype"] == "float32" and fp["args"]["device"] == "cpu"
    assert isinstance(fp["kv_capacity_tokens"], int) and fp["kv_capacity_tokens"] > 0
    assert fp["boot_s"] > 0 and fp["pids"], fp
    # Resolved at boot: the model's context (null in the server args), the running cap.
    assert fp["context_length"] == 1024
    assert isinstance(fp["max_running_requests"], int) and fp["max_running_requests"] > 48
    assert fp["streaming"] == "cumulative" and fp["sampling_seed"] == sglang_module.SEED_IGNORED
    assert fp["chat_template"] == "none" or fp["chat_template"].startswith("sha256:")
    record_property("boot_s", round(fp["boot_s"], 1))


def test_readiness_endpoints_answer(plain: SGLangEngine) -> None:
    with httpx.Client(base_url=base_url(plain), timeout=60) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/health_generate").status_code == 200
        info = client.get("/server_info").json()
        assert info["speculative_algorithm"] is None and info["device"] == "cpu"
        assert client.get("/get_model_info").json()["model_path"].endswith("tiny-target")


def test_greedy_is_deterministic_alone_and_under_load(plain: SGLangEngine,
                                                      record_property: Any) -> None:  # fmt: skip
    t0 = time.perf_counter()
    alone = run(one_by_one(plain))
    wall = time.perf_counter() - t0
    again = run(one_by_one(plain))
    loaded = run(together(plain))
    for res in alone + again + loaded:
        assert res.ok, res.error
        assert len(res.output_ids) == MAX_TOKENS and res.output_text
        assert len(res.itl_s) == len(res.output_ids) - 1
        assert res.ttft_s is not None and res.e2e_s is not None and res.ttft_s <= res.e2e_s
        assert res.top2_margin is not None and len(res.top2_margin) == MAX_TOKENS
        assert res.spec_verify_ct is None and res.accept_length is None  # nothing drafted
    ids = [r.output_ids for r in alone]
    assert [r.output_ids for r in again] == ids
    assert [r.output_ids for r in loaded] == ids + ids  # 8 requests, the 4 prompts twice
    # The native API gives the same tokens without streaming.
    assert generate(plain, PROMPTS[0])["output_ids"] == ids[0]
    record_property("tokens_per_s_c1", round(len(PROMPTS) * MAX_TOKENS / wall, 1))


def test_cumulative_stream_resends_everything_so_far(plain: SGLangEngine) -> None:
    chunks = stream_chunks(plain, PROMPTS[1])
    assert len(chunks) >= 2
    last = chunks[-1]
    assert len(last["output_ids"]) == last["meta_info"]["completion_tokens"] == MAX_TOKENS
    for before, after in itertools.pairwise(chunks):
        # Each chunk repeats the previous one's ids, text and logprob rows, then extends them.
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
        assert after["text"].startswith(before["text"])
        rows = after["meta_info"]["output_top_logprobs"]
        assert rows[: len(before["meta_info"]["output_top_logprobs"])] == (
            before["meta_info"]["output_top_logprobs"]
        )
    assert all(len(row) == 2 for row in last["meta_info"]["output_top_logprobs"])
    assert last["meta_info"]["finish_reason"]["type"] == "length"


def test_flush_resets_the_cache_when_idle(plain: SGLangEngine) -> None:
    first = generate(plain, PROMPTS[2])
    warm = generate(plain, PROMPTS[2])
    assert warm["meta_info"]["cached_tokens"] > 0  # the prompt hit the radix cache
    plain.flush()
    cold = generate(plain, PROMPTS[2])
    assert cold["meta_info"]["cached_tokens"] == 0
    assert cold["output_ids"] == first["output_ids"]


def test_timeout_gives_a_failed_result_and_the_server_serves_on(plain: SGLangEngine) -> None:
    res = run(plain.generate(request(0, n=512, timeout_s=0.3)))
    assert not res.ok and res.error and "timeout" in res.error.lower()
    after = run(plain.generate(request(1)))
    assert after.ok and len(after.output_ids) == MAX_TOKENS


def test_abort_mid_stream_frees_the_server(plain: SGLangEngine) -> None:
    """Cancelling a streamed request closes its connection; SGLang must abort it at once.
    /flush_cache refuses (400) while any request runs, which tells busy from idle."""
    rate_probe = run(plain.generate(request(0)))
    assert rate_probe.ok and rate_probe.e2e_s
    long_n = 1000  # the tiny target's context is 1024 tokens
    full_s = long_n * rate_probe.e2e_s / len(rate_probe.output_ids)  # to finish, unaborted

    async def abort_one() -> tuple[float, GenerationResult]:
        async with httpx.AsyncClient(base_url=base_url(plain), timeout=30) as client:

            async def busy() -> bool:
                return (await client.post("/flush_cache")).status_code == 400

            task = asyncio.create_task(plain.generate(request(3, n=long_n)))
            deadline = time.monotonic() + 60
            while not await busy():
                assert time.monotonic() < deadline, "the long request never started"
                await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            t0 = time.monotonic()
            while await busy():
                assert time.monotonic() - t0 < full_s, "the aborted request ran to its end"
                await asyncio.sleep(0.1)
            idle_after = time.monotonic() - t0
        return idle_after, await plain.generate(request(0))

    idle_after, after = run(abort_one())
    assert idle_after < min(10.0, full_s / 2), (idle_after, full_s)
    assert after.ok and after.output_ids == rate_probe.output_ids


def test_a_request_the_server_aborts_is_a_failure(plain: SGLangEngine) -> None:
    """An abort (here an admin's /abort_request) ends the stream like a finish, with
    finish_reason abort: the request did not complete."""

    async def aborted() -> GenerationResult:
        task = asyncio.create_task(plain.generate(request(3, n=900)))
        async with httpx.AsyncClient(base_url=base_url(plain), timeout=30) as client:
            while (await client.post("/flush_cache")).status_code != 400:  # not running yet
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
            assert (await client.post("/abort_request", json={"abort_all": True})).is_success
        return await task

    res = run(aborted())
    assert not res.ok and res.error is not None
    assert res.error.startswith("aborted by the server"), res.error
    after = run(plain.generate(request(0)))
    assert after.ok and len(after.output_ids) == MAX_TOKENS


def test_the_server_runs_as_a_process_group(plain: SGLangEngine) -> None:
    """What the fixture's teardown checks gone: the launcher's group of several processes."""
    assert plain.server is not None and plain.server.pid is not None
    pids = plain.server.pids()
    assert len(pids) >= 2 and still_alive(pids) == pids, pids
    assert group_alive(plain.server.pid), "the launcher leads a process group"
