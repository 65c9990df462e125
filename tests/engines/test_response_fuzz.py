"""Hypothesis: whatever a server streams back (numbers of any size or sign, NaN and
infinities, wrong types, malformed chunks), the client's parsing and the check of the answer
against its request give either a sound record or a failed one with a one-line error: never
an unhandled exception, never a NaN, an infinity or an impossible value in a record."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_osprey.engines.base import GenerationRequest
from pytest_osprey.engines.sglang.engine import SGLangClient
from pytest_osprey.engines.vllm.engine import OpenAIClient
from pytest_osprey.results.records import Measurement, checked, impossible_value
from testkit.fake_server import OnRequest, Reply, ScriptedServer, Seen

FUZZ = settings(max_examples=100, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
ASKED = 8  # max_new_tokens of every request
ACCEPT_MOST = 5  # 4 draft tokens

numbers = st.one_of(
    st.integers(min_value=-3, max_value=12), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, 2, 4, 1e5, 1e9]),
)
hostile = st.one_of(numbers, st.none(), st.booleans(), st.text(max_size=8),
                    st.lists(numbers, max_size=10))
ids = st.one_of(st.lists(st.integers(min_value=-2, max_value=50), max_size=12),
                st.lists(hostile, max_size=4), hostile)
SGLANG_META = ["completion_tokens", "prompt_tokens", "spec_verify_ct", "spec_accept_length",
               "spec_correct_drafts_histogram", "finish_reason", "output_top_logprobs"]
sglang_chunk = st.one_of(
    st.fixed_dictionaries({"text": st.one_of(st.text(max_size=6), hostile), "output_ids": ids,
                           "meta_info": st.dictionaries(st.sampled_from(SGLANG_META), hostile,
                                                        max_size=6)}),
    st.text(max_size=20),  # not JSON, or JSON that is not an object
)
SPEC = ["num_spec_steps", "mean_acceptance_length", "acceptance_histogram"]
openai_chunk = st.one_of(
    st.fixed_dictionaries({
        "choices": st.lists(st.fixed_dictionaries({
            "text": st.one_of(st.text(max_size=6), hostile), "token_ids": ids,
            "finish_reason": st.one_of(st.none(), st.sampled_from(["length", "stop", "abort"])),
        }), max_size=1),
        "usage": st.dictionaries(st.sampled_from(["completion_tokens", "prompt_tokens"]),
                                 hostile, max_size=2),
        "metrics": st.fixed_dictionaries({"speculative_decoding": st.dictionaries(
            st.sampled_from(SPEC), hostile, max_size=3)}),
    }),
    st.text(max_size=20),
)


class Hostile:
    """One server (and one client of each protocol) for every example; each example sets
    the answer the server plays."""

    def __init__(self, srv: ScriptedServer) -> None:
        self.playing = Reply(events=[])
        self.sglang = SGLangClient(srv.url, "cand")
        self.openai = OpenAIClient(srv.url, "cand", "m")

    def answer(self, seen: Seen) -> Reply:
        return self.playing


@pytest.fixture(scope="module")
def server() -> Iterator[Hostile]:
    srv = ScriptedServer()
    hostile = Hostile(srv)
    srv.routes.update({("POST", "/generate"): OnRequest(hostile.answer),
                       ("POST", "/v1/completions"): OnRequest(hostile.answer)})
    with srv:
        yield hostile


def _payload(chunk: Any) -> str:
    # As a server that writes NaN and Infinity (Python's json does) would send them.
    return chunk if isinstance(chunk, str) else json.dumps(chunk)


def _numbers(value: Any) -> Iterator[float]:
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _numbers(v)


def _sound_or_failed(res: Measurement) -> None:
    if res.ok:
        assert impossible_value(res, ASKED, ACCEPT_MOST) is None
        assert len(res.output_ids) <= ASKED
        assert all(math.isfinite(v) for v in _numbers(asdict(res)))
        json.dumps(asdict(res), allow_nan=False)
    else:
        assert isinstance(res.error, str) and res.error
        assert "\n" not in res.error and len(res.error) <= 1100, res.error
        assert res.accept_length is None or math.isfinite(res.accept_length)


def _request() -> GenerationRequest:
    return GenerationRequest(prompt_id="p", prompt="hi", max_new_tokens=ASKED,
                             want_margins=True, timeout_s=10.0)


@FUZZ
@given(chunks=st.lists(sglang_chunk, min_size=1, max_size=3), done=st.booleans())
def test_any_sglang_stream_gives_a_sound_or_a_failed_record(
    server: Hostile, chunks: list[Any], done: bool
) -> None:
    server.playing = Reply(events=[(0, _payload(c)) for c in chunks], done=done)
    res = asyncio.run(server.sglang.generate(_request()))
    _sound_or_failed(checked(res, ASKED, ACCEPT_MOST))


@pytest.mark.slow  # over a second on 2 busy cores
@FUZZ
@given(chunks=st.lists(openai_chunk, min_size=1, max_size=3), done=st.booleans())
def test_any_openai_stream_gives_a_sound_or_a_failed_record(
    server: Hostile, chunks: list[Any], done: bool
) -> None:
    server.playing = Reply(events=[(0, _payload(c)) for c in chunks], done=done)
    res = asyncio.run(server.openai.generate(_request()))
    _sound_or_failed(checked(res, ASKED, ACCEPT_MOST))
