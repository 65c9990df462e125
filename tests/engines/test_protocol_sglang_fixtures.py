"""Real SGLang 0.5.23 answers (tests/fixtures/sglang-0.5.23-cpu) as protocol fixtures: each
recorded stream replayed through the client, and the hand-written fakes (the fake server the
process tests boot, the benchmark stub) held to the real shapes."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.engines.base import GenerationRequest
from pytest_osprey.engines.sglang import engine as sg
from testkit.factories import ROOT
from testkit.fake_engine import sglang_events
from testkit.fake_server import Reply, ScriptedServer
from testkit.timed_stream import Payloads

FIXTURES = ROOT / "tests" / "fixtures" / "sglang-0.5.23-cpu"

# What the client reads from a chunk: these must be where the real server puts them.
READ = ("text", "output_ids", "meta_info")
READ_META = ("completion_tokens", "finish_reason", "prompt_tokens")
SPEC_META = ("spec_verify_ct", "spec_accept_length", "spec_accept_rate",
             "spec_num_correct_drafts", "spec_num_proposed_drafts",
             "spec_correct_drafts_histogram")  # fmt: skip


def events(path: Path) -> list[dict[str, Any]]:
    """The JSON chunks of a recorded SSE body (its [DONE] checked)."""
    lines = path.read_text().splitlines()
    assert lines[0].startswith(("HTTP 200", "data: "))
    data = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def answer(path: Path) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(path.read_text().split("\n", 1)[1])
    return body


def replay(chunks: list[dict[str, Any]], n: int, margins: bool = False) -> Any:
    with ScriptedServer() as srv:
        srv.routes[("POST", "/generate")] = Reply(events=[(0.002, c) for c in chunks])
        return asyncio.run(sg.SGLangClient(srv.url, "c").generate(
            GenerationRequest("p", "x", n, want_margins=margins, timeout_s=30)))


STREAMS = sorted(FIXTURES.glob("*/generate_stream*.txt"))


def test_the_fixtures_are_there() -> None:
    assert {p.parent.name for p in STREAMS} >= {
        "cumulative_plain", "cumulative_standalone", "cumulative_standalone_topk2",
        "cumulative_ngram", "incremental_plain", "incremental_standalone"}


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_recorded_stream_reads_as_the_server_meant_it(path: Path) -> None:
    chunks = events(path)
    final = chunks[-1]["meta_info"]
    total = final["completion_tokens"]
    margins = "logprobs" in path.name
    res = replay(chunks, total, margins=margins)
    if final["finish_reason"]["type"] == "abort":
        assert not res.ok and res.error == "aborted by the server: Aborted"
        return
    assert res.ok, res.error
    assert len(res.output_ids) == total and len(res.itl_s) == total - 1
    if path.parent.name.startswith("cumulative"):
        assert res.output_ids == chunks[-1]["output_ids"]
        assert res.output_text == chunks[-1]["text"]
    else:  # deltas, joined
        assert res.output_ids == [i for c in chunks for i in c["output_ids"]]
        assert res.output_text == "".join(c["text"] for c in chunks)
    if margins:
        rows = [r for c in chunks for r in c["meta_info"]["output_top_logprobs"]]
        assert res.top2_margin == pytest.approx([a[0] - b[0] for a, b in rows])
    if "spec_verify_ct" in final:
        assert res.spec_verify_ct == final["spec_verify_ct"]
        assert res.accept_length == pytest.approx(final["spec_accept_length"])
    else:
        assert res.spec_verify_ct is None and res.accept_length is None


def test_greedy_output_is_the_same_streamed_or_not_and_with_or_without_speculation() -> None:
    for kind in ("cumulative_plain", "cumulative_standalone"):
        whole = answer(FIXTURES / kind / "generate.txt")
        streamed = events(FIXTURES / kind / "generate_stream.txt")[-1]
        assert streamed["output_ids"] == whole["output_ids"]
    inc = {kind: [i for c in events(FIXTURES / kind / "generate_stream_logprobs.txt")
                  for i in c["output_ids"]]
           for kind in ("incremental_plain", "incremental_standalone")}
    assert inc["incremental_plain"] == inc["incremental_standalone"]


# --------------------------------------------------------------------------- the fakes


def kinds(value: Any) -> Any:
    """A value's shape: types for scalars, the first item's shape for lists, keys kept."""
    if isinstance(value, dict):
        return {k: kinds(v) for k, v in value.items()}
    if isinstance(value, list):
        return [kinds(value[0])] if value else []
    return "number" if isinstance(value, int | float) and not isinstance(value, bool) else (
        type(value).__name__)


def assert_shaped_like(fake: dict[str, Any], real: dict[str, Any]) -> None:
    """Every field of the fake chunk is in the real one, with the same shape; every field
    the client reads is in both."""
    for key in READ:
        assert key in fake and key in real, key
    for key in READ_META:
        assert key in fake["meta_info"] and key in real["meta_info"], key
    for key, value in fake["meta_info"].items():
        assert key in real["meta_info"], f"the fake sends {key!r}, the real server does not"
        if value is not None and real["meta_info"][key] is not None:
            assert kinds(value) == kinds(real["meta_info"][key]), key
    assert kinds(fake["output_ids"]) == kinds(real["output_ids"])


def test_the_fake_servers_incremental_chunks_are_shaped_as_real_ones() -> None:
    body = {"return_logprob": True, "top_logprobs_num": 2}
    fake = sglang_events(body, 12, incremental=True, speculates=True)
    real = events(FIXTURES / "incremental_standalone" / "generate_stream_logprobs.txt")
    assert_shaped_like(fake[0], real[0])
    assert_shaped_like(fake[-1], real[-1])
    for chunks in (fake, real):
        # Deltas: rows and ids per chunk add up to the completion count.
        assert sum(len(c["output_ids"]) for c in chunks) == chunks[-1]["meta_info"][
            "completion_tokens"]
        assert all(len(c["meta_info"]["output_top_logprobs"]) == len(c["output_ids"])
                   for c in chunks)
        last = chunks[-1]["meta_info"]
        assert set(SPEC_META) <= set(last), "the spec counters ride on the last chunk"
        assert not set(SPEC_META) & set(chunks[0]["meta_info"])
        hist = last["spec_correct_drafts_histogram"]
        assert sum(hist) == last["spec_verify_ct"]
        assert sum(i * c for i, c in enumerate(hist)) == last["spec_num_correct_drafts"]
        assert last["spec_accept_length"] == pytest.approx(
            last["completion_tokens"] / last["spec_verify_ct"])


def test_the_fake_servers_cumulative_and_abort_chunks_are_shaped_as_real_ones() -> None:
    cumulative = sglang_events({}, 8, incremental=False, speculates=True)
    real = events(FIXTURES / "cumulative_standalone" / "generate_stream.txt")
    assert_shaped_like(cumulative[-1], real[-1])
    for chunks in (cumulative, real):
        for before, after in itertools.pairwise(chunks):
            assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
            assert after["text"].startswith(before["text"])
    aborted = sglang_events({}, 8, incremental=True, speculates=False, abort_after=2)
    real_abort = events(FIXTURES / "incremental_plain" / "generate_stream_aborted.txt")
    assert_shaped_like(aborted[-1], real_abort[-1])
    assert kinds(aborted[-1]["meta_info"]["finish_reason"]) == kinds(
        real_abort[-1]["meta_info"]["finish_reason"])


@pytest.mark.parametrize("incremental", [True, False])
def test_the_benchmark_stubs_sglang_chunks_are_shaped_as_real_ones(incremental: bool) -> None:
    body = {"stream": True, "sampling_params": {"max_new_tokens": 6}, "text": "a b",
            "return_logprob": True, "top_logprobs_num": 2}
    ev = Payloads("sglang", 0, 6, 2, body, incremental=incremental)
    chunks = [json.loads(ev.chunk(step, done, 0.01))
              for step, done in enumerate((1, 4, 6))]
    folder = "incremental_plain" if incremental else "cumulative_plain"
    real = events(FIXTURES / folder / ("generate_stream_logprobs.txt" if incremental
                                       else "generate_stream.txt"))
    for fake in (chunks[0], chunks[-1]):
        meta = {k: v for k, v in fake["meta_info"].items()
                if not k.startswith(("spec_", "output_", "input_"))}
        assert_shaped_like({**fake, "meta_info": meta}, real[-1])
    if incremental:
        assert [len(c["output_ids"]) for c in chunks] == [1, 3, 2]
        rows = [r for c in chunks for r in c["meta_info"]["output_top_logprobs"]]
        assert kinds(rows) == kinds(real[0]["meta_info"]["output_top_logprobs"])
        assert len(rows) == 6
    else:
        assert [len(c["output_ids"]) for c in chunks] == [1, 4, 6]
