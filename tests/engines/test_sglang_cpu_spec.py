"""Speculative decoding through a real SGLang 0.5.23 on CPU, with the project's pure-torch
sgl_kernel: every configuration must serve the plain server's greedy tokens exactly.

Servers are booted one at a time: each module fixture boots one configuration, measures it,
stops it and hands back what it saw. Needs ``OSPREY_SGLANG_PYTHON``
(see testkit/sglang_cpu.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.engines.base import BootSpec, GenerationRequest, GenerationResult
from pytest_osprey.engines.embedded.engine import TransformersEngine
from pytest_osprey.pilot.schema import Pilot
from testkit.factories import make_pilot
from testkit.sglang_cpu import (
    EAGLE3,
    MAX_TOKENS,
    MODELS,
    NEEDS_SGLANG,
    PROMPTS,
    SPEC_ARGS,
    booted,
    generate,
    pilot,
    standalone,
    still_alive,
    stream_chunks,
)

pytestmark = [
    pytest.mark.engine,
    NEEDS_SGLANG,
    pytest.mark.skipif(
        not (MODELS / "tiny-target").is_dir() or not (MODELS / "tiny-drafter").is_dir(),
        reason=f"tiny models not found under {MODELS} (set OSPREY_TINY_MODELS)",
    ),
]

STEPS = 3  # drafts per verify step in a chain (topk 1)


@dataclass
class Served:
    """What one server configuration did, measured before it was stopped."""

    results: list[GenerationResult]
    meta: list[dict[str, Any]]  # non-streamed /generate meta_info per prompt
    ids: list[list[int]]  # the same, output ids
    fingerprint: dict[str, Any]
    tokens_per_s: float
    left_alive: set[int]
    chunks: list[dict[str, Any]] = field(default_factory=list)
    counters: tuple[dict[str, float], dict[str, float]] = ({}, {})  # around the streamed run


def serve(p: Pilot, condition: str, log_dir: Path, *, stream_one: bool = False) -> Served:
    with booted(p, condition, log_dir) as engine:
        assert engine.server is not None
        pids = engine.server.pids()

        async def one_by_one() -> list[GenerationResult]:
            reqs = [GenerationRequest(f"p{i}", t, MAX_TOKENS, timeout_s=300)
                    for i, t in enumerate(PROMPTS)]  # fmt: skip
            return [await engine.generate(r) for r in reqs]

        before = engine.spec_counters()
        t0 = time.perf_counter()
        results = asyncio.run(one_by_one())
        wall = time.perf_counter() - t0
        after = engine.spec_counters()
        raw = [generate(engine, t) for t in PROMPTS]
        chunks = stream_chunks(engine, PROMPTS[1]) if stream_one else []
        fp = engine.fingerprint()
    return Served(
        results=results,
        meta=[r["meta_info"] for r in raw],
        ids=[r["output_ids"] for r in raw],
        fingerprint=fp,
        tokens_per_s=sum(len(r.output_ids) for r in results) / wall,
        left_alive=still_alive(pids),
        chunks=chunks,
        counters=(before, after),
    )


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Served:
    """The plain server, streaming incrementally as the engine boots it (the other module
    streams cumulatively): the greedy reference for every speculative configuration."""
    return serve(pilot(), "baseline", tmp_path_factory.mktemp("plain-inc"), stream_one=True)


def spec_fixture(condition: dict[str, Any], name: str) -> Any:
    @pytest.fixture(scope="module", name=name)
    def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
        return serve(pilot(condition), "cond", tmp_path_factory.mktemp(name))

    return served


chain_fixture = spec_fixture(standalone(1, STEPS), "chain")
tree_fixture = spec_fixture(standalone(2, STEPS), "tree")
ngram_fixture = spec_fixture(
    {"speculation": {"algorithm": "NGRAM", "num_draft_tokens": STEPS + 1},
     "engine_args": SPEC_ARGS}, "ngram")  # fmt: skip


def check_served(s: Served, plain: Served, algorithm: str) -> None:
    """Greedy tokens identical to the plain server's, spec counters consistent, nothing left."""
    assert [r.output_ids for r in s.results] == plain.ids, "streamed greedy tokens differ"
    assert s.ids == plain.ids, "non-streamed greedy tokens differ"
    assert s.fingerprint["args"]["speculative_algorithm"] == algorithm
    assert s.fingerprint["verification"] == "greedy"  # SGLang verifies greedily on CPU
    # SGLang caps a speculative server's running requests (fairness compares it).
    assert s.fingerprint["max_running_requests"] == 48
    assert s.fingerprint["streaming"] == "incremental"
    # Read back: the server resolved the settings the pilot pinned, and does not adapt them.
    spec = s.fingerprint["speculation"]
    for name in ("algorithm", "num_steps", "eagle_topk", "num_draft_tokens"):
        if spec["asked"][name] is not None:
            assert spec["ran"][name] == spec["asked"][name], (name, spec)
    assert spec["ran"]["adaptive"] is False
    # Reconciled: the streamed requests' verify steps and tokens are what the engine counted.
    before, after = s.counters
    grew = {k: after[k] - before.get(k, 0.0) for k in ("verify_steps", "output_tokens")}
    assert grew == {"verify_steps": sum(r.spec_verify_ct or 0 for r in s.results),
                    "output_tokens": sum(len(r.output_ids) for r in s.results)}, (before, after)
    for res in s.results:
        assert res.ok, res.error
        assert res.spec_verify_ct and res.accept_length and res.accept_length >= 1.0
    for meta in s.meta:
        verify = meta["spec_verify_ct"]
        assert meta["completion_tokens"] == MAX_TOKENS and verify > 0
        assert meta["spec_accept_length"] == pytest.approx(MAX_TOKENS / verify)
        hist = meta["spec_correct_drafts_histogram"]
        assert sum(hist) == verify, "one histogram entry per verify step"
        assert sum(i * c for i, c in enumerate(hist)) == meta["spec_num_correct_drafts"]
        assert meta["spec_num_correct_drafts"] <= meta["spec_num_proposed_drafts"]
    assert not s.left_alive, s.left_alive


def pooled(metas: list[dict[str, Any]]) -> float:
    """Tokens per verify step after each request's first token (the prefill makes that one
    without a verify step): mean (accepted drafts + 1) over all verify steps."""
    return sum(m["completion_tokens"] - 1 for m in metas) / sum(m["spec_verify_ct"] for m in metas)


def test_plain_incremental_stream_sends_only_new_pieces(plain: Served) -> None:
    chunks = plain.chunks
    assert len(chunks) >= 2
    ids = [t for c in chunks for t in c["output_ids"]]
    assert ids == plain.ids[1]
    assert "".join(c["text"] for c in chunks) == plain.results[1].output_text
    rows = [r for c in chunks for r in c["meta_info"]["output_top_logprobs"]]
    assert len(rows) == MAX_TOKENS and all(len(r) == 2 for r in rows)
    assert all(len(c["output_ids"]) < MAX_TOKENS for c in chunks)
    assert [r.output_ids for r in plain.results] == plain.ids
    assert plain.fingerprint["verification"] is None  # nothing drafted
    assert not plain.left_alive


def test_standalone_chain(chain: Served, plain: Served, record_property: Any) -> None:
    check_served(chain, plain, "STANDALONE")
    for meta in chain.meta:
        # Per-position acceptance: bucket i counts verify steps that accepted i drafts (the
        # list stops at the largest count seen).
        assert len(meta["spec_correct_drafts_histogram"]) <= STEPS + 1
        assert meta["spec_num_proposed_drafts"] == STEPS * meta["spec_verify_ct"]
    record_property("accept_length", round(pooled(chain.meta), 3))
    record_property("tokens_per_s", round(chain.tokens_per_s, 1))
    record_property("plain_tokens_per_s", round(plain.tokens_per_s, 1))
    record_property("boot_s", round(chain.fingerprint["boot_s"], 1))
    record_property("speculation_ran", chain.fingerprint["speculation"]["ran"])
    record_property("counters", chain.counters)


@pytest.fixture(scope="module")
def embedded_accept(tmp_path_factory: pytest.TempPathFactory) -> float:
    """The embedded engine's accept length on the same models, prompts and draft length:
    transformers assisted generation with a fixed ``STEPS`` drafts per verify step."""
    p = make_pilot(
        target={"engine": "transformers", "model": str(MODELS / "tiny-target"),
                "dtype": "float32"},
        conditions={
            "baseline": {"role": "baseline"},
            "cand": {"role": "candidate", "drafter": str(MODELS / "tiny-drafter"),
                     "speculation": {"num_draft_tokens": STEPS}},
        },
        trace={"files": ["unused.jsonl"]},
    )  # fmt: skip
    engine = TransformersEngine(p, "cand", BootSpec("cand", tmp_path_factory.mktemp("emb")))
    engine.start()
    try:

        async def run() -> list[GenerationResult]:
            reqs = [GenerationRequest(f"p{i}", t, MAX_TOKENS) for i, t in enumerate(PROMPTS)]
            return [await engine.generate(r) for r in reqs]

        results = asyncio.run(run())
    finally:
        engine.stop()
    assert all(r.ok and r.spec_verify_ct for r in results)
    # Every target forward of assisted generation verifies (the first one too).
    return sum(len(r.output_ids) for r in results) / sum(r.spec_verify_ct or 0 for r in results)


def test_standalone_chain_accepts_like_the_embedded_engine(
    chain: Served, embedded_accept: float, record_property: Any
) -> None:
    served = pooled(chain.meta)
    record_property("sglang_accept_length", round(served, 3))
    record_property("embedded_accept_length", round(embedded_accept, 3))
    assert served == pytest.approx(embedded_accept, rel=0.10)


def test_standalone_tree_topk2(tree: Served, plain: Served, record_property: Any) -> None:
    check_served(tree, plain, "STANDALONE")
    record_property("accept_length", round(pooled(tree.meta), 3))
    record_property("tokens_per_s", round(tree.tokens_per_s, 1))


def test_ngram(ngram: Served, plain: Served, record_property: Any) -> None:
    check_served(ngram, plain, "NGRAM")
    record_property("accept_length", round(pooled(ngram.meta), 3))
    record_property("tokens_per_s", round(ngram.tokens_per_s, 1))


@pytest.mark.skipif(not EAGLE3.is_dir(), reason=f"no EAGLE-3 drafter at {EAGLE3}")
def test_eagle3(plain: Served, tmp_path: Path, record_property: Any) -> None:
    condition = {
        "drafter": str(EAGLE3),
        "speculation": {"algorithm": "EAGLE3", "num_steps": STEPS, "eagle_topk": 1},
        "engine_args": SPEC_ARGS,
    }
    served = serve(pilot(condition), "cond", tmp_path)
    check_served(served, plain, "EAGLE3")
    record_property("accept_length", round(pooled(served.meta), 3))
    record_property("tokens_per_s", round(served.tokens_per_s, 1))
