"""The embedded engine's continuous batch against transformers' batch-1 generate(): the same
greedy tokens and the same drafts accepted with sequences joining and leaving mid-flight,
sampling parameters kept per sequence, stop strings, cancellation, and speculative sampling
that still draws from the target's distribution (a verifier that skips rejection is caught)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_osprey.engines.base import BootSpec, GenerationRequest
from testkit import tiny_models
from testkit.factories import TINY_DRAFTER, TINY_TARGET, make_pilot

torch = tiny_models.need()
pytestmark = pytest.mark.slow  # boots the tiny models

from pytest_osprey.engines.embedded import batching  # noqa: E402
from pytest_osprey.engines.embedded.engine import TransformersEngine  # noqa: E402
from pytest_osprey.engines.embedded.generation_hooks import LogitBias, OpenAIPenalties  # noqa: E402
from testkit import draft_loop  # noqa: E402

PROMPTS = [
    "def read_config(path):\n",
    "The license grants you the right to",
    "<|user|>\nHow do I sort a dictionary by value in Python?<|end|>\n<|assistant|>\n",
    "import numpy as np\n\ndef normalise(x):\n",
    "Patient presents with",
    "SELECT name FROM",
]
TOKENS = [40, 24, 33, 40, 17, 29]  # different lengths: sequences leave the batch at different steps


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    with tiny_models.one_thread():
        yield


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, TransformersEngine]]:
    pilot = make_pilot(
        target={"model": str(TINY_TARGET), "context_length": 1024, "dtype": "float32",
                "threads": 1},
        conditions={"baseline": {"role": "baseline"},
                    "drafted": {"role": "candidate", "drafter": str(TINY_DRAFTER),
                                "speculation": {"algorithm": "assisted", "num_draft_tokens": 4}}},
        trace={"files": ["prompts/pilot.jsonl"]},
    )  # fmt: skip
    logs = tmp_path_factory.mktemp("batching")
    out = {n: TransformersEngine(pilot, n, BootSpec(n, logs)) for n in pilot.conditions}
    try:
        for e in out.values():
            e.start()
        yield out
    finally:
        for e in out.values():
            e.stop()


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """transformers' batch-1 greedy generate, plain and assisted (with the engine's draft
    loop), and its number of target forwards per assisted request."""
    tok = tiny_models.tokenizer()
    target, drafter = tiny_models.load(TINY_TARGET), tiny_models.load(TINY_DRAFTER)
    assert draft_loop.attach(target, drafter, 4)
    plain, assisted, forwards = [], [], []
    calls: list[int] = []
    handle = target.register_forward_hook(lambda *_: calls.append(1))
    try:
        with torch.inference_mode():
            for prompt, n in zip(PROMPTS, TOKENS, strict=True):
                enc = tok(prompt, return_tensors="pt")
                cut = enc["input_ids"].shape[1]
                kw = {"max_new_tokens": n, "do_sample": False, "pad_token_id": tok.pad_token_id}
                plain.append(target.generate(**enc, **kw)[0, cut:].tolist())
                calls.clear()
                assisted.append(target.generate(**enc, **kw, assistant_model=drafter)[0, cut:]
                                .tolist())
                forwards.append(len(calls))
    finally:
        handle.remove()
    return {"tok": tok, "target": target, "plain": plain, "assisted": assisted,
            "forwards": forwards}


async def _staggered(engine: TransformersEngine, requests: list[GenerationRequest],
                     gap_s: float = 0.0) -> list[Any]:
    """All requests in flight together; with ``gap_s``, the later half joins mid-flight."""
    async def late(i: int, r: GenerationRequest) -> Any:
        if i >= len(requests) // 2:
            await asyncio.sleep(gap_s)
        return await engine.generate(r)

    return list(await asyncio.gather(*(late(i, r) for i, r in enumerate(requests))))


@pytest.mark.parametrize("condition", ["baseline", "drafted"])
def test_greedy_is_batch_1_greedy_at_x1_and_in_a_changing_batch(
        engines: dict[str, TransformersEngine], reference: dict[str, Any], condition: str) -> None:
    engine = engines[condition]
    requests = [GenerationRequest(f"p{i}", p, n)
                for i, (p, n) in enumerate(zip(PROMPTS, TOKENS, strict=True))]
    one = [asyncio.run(engine.generate(r)) for r in requests]
    assert engine._batcher is not None
    engine._batcher.largest = 0
    many = asyncio.run(_staggered(engine, requests, gap_s=0.15))
    assert engine._batcher.largest >= 4  # really decoded together
    for i, (a, b) in enumerate(zip(one, many, strict=True)):
        assert a.ok and b.ok, (a.error, b.error)
        assert a.output_ids == b.output_ids == reference["plain"][i], i
        # A chat the target answers in fewer tokens ends at its end-of-text token.
        ended = "length" if len(b.output_ids) == TOKENS[i] else "stop"
        assert b.finish_reason == ended and len(b.itl_s) == len(b.output_ids) - 1
        assert b.top2_ids is not None and [t[0] for t in b.top2_ids] == b.output_ids
        if condition == "drafted":
            # The drafts accepted are assisted generation's: as many verify steps, alone or
            # in a batch, and the acceptance per position adds up to the tokens drafted.
            assert a.output_ids == reference["assisted"][i]
            assert a.spec_verify_ct == b.spec_verify_ct == reference["forwards"][i], i
            assert b.spec_accepted_per_position == a.spec_accepted_per_position
        else:
            assert b.spec_verify_ct == len(b.output_ids) and b.spec_drafts is None
    if condition == "drafted":
        # Drafts really accepted: tokens per verify step over the batch (a prompt of its own
        # may accept little; the pooled figure is the drafter's).
        steps = sum(b.spec_verify_ct for b in many)
        assert sum(len(b.output_ids) for b in many) / steps > 1.5


def test_sampling_parameters_stay_with_their_sequence(
        engines: dict[str, TransformersEngine], reference: dict[str, Any]) -> None:
    """Each sequence of a batch keeps its own penalties, bias and minimum length: as
    transformers' generate() applies them alone, whoever shares the batch."""
    tok, target = reference["tok"], reference["target"]
    settings: list[dict[str, Any]] = [
        {"repetition_penalty": 1.3}, {"frequency_penalty": 0.8, "presence_penalty": 0.5},
        {"logit_bias": {int(reference["plain"][2][1]): -100.0}}, {"min_new_tokens": 30}, {}, {},
    ]
    requests = [GenerationRequest(f"p{i}", p, 30, **s)
                for i, (p, s) in enumerate(zip(PROMPTS, settings, strict=True))]
    want = []
    with torch.inference_mode():
        for r in requests:
            enc = tok(r.prompt, return_tensors="pt")
            n = enc["input_ids"].shape[1]
            procs: list[Any] = []
            if r.frequency_penalty or r.presence_penalty:
                procs.append(OpenAIPenalties(n, r.frequency_penalty, r.presence_penalty))
            if r.logit_bias:
                procs.append(LogitBias(dict(r.logit_bias)))
            kw: dict[str, Any] = {"logits_processor": procs} if procs else {}
            if r.repetition_penalty != 1.0:
                kw["repetition_penalty"] = r.repetition_penalty
            if r.min_new_tokens:
                kw["min_new_tokens"] = r.min_new_tokens
            out = target.generate(**enc, max_new_tokens=30, do_sample=False,
                                  pad_token_id=tok.pad_token_id, **kw)
            want.append(out[0, n:].tolist())
    assert want[0] != reference["plain"][0][:30]  # the penalty changes something to check
    for name, engine in engines.items():
        got = asyncio.run(_staggered(engine, requests))
        for i, res in enumerate(got):
            assert res.ok, res.error
            assert res.output_ids == want[i], (name, i, settings[i])


def test_stop_strings_in_a_batch(engines: dict[str, TransformersEngine],
                                 reference: dict[str, Any]) -> None:
    tok = reference["tok"]
    stops = []
    for ids in reference["plain"]:
        text = tok.decode(ids, skip_special_tokens=True)
        words = text.split()
        stops.append(next((w for w in words[len(words) // 3:] if len(w) >= 3), None))
    cases = [(i, s) for i, s in enumerate(stops) if s is not None]
    assert len(cases) >= 3
    requests = [GenerationRequest(f"p{i}", PROMPTS[i], TOKENS[i], stop=(s,)) for i, s in cases]
    for name, engine in engines.items():
        got = asyncio.run(_staggered(engine, requests))
        for (i, stop), res in zip(cases, got, strict=True):
            free = tok.decode(reference["plain"][i], skip_special_tokens=True)
            assert res.ok and res.finish_reason == "stop", (name, res.error)
            assert res.output_text == free[: free.find(stop)], (name, i)
            # The tokens end with the one that completes the stop string, drafts past it dropped.
            assert res.output_ids == reference["plain"][i][: len(res.output_ids)]
            assert stop in tok.decode(res.output_ids, skip_special_tokens=True)
            assert stop not in tok.decode(res.output_ids[:-1], skip_special_tokens=True)


def test_a_cancelled_request_leaves_the_batch_and_the_others_finish(
        engines: dict[str, TransformersEngine], reference: dict[str, Any]) -> None:
    engine = engines["drafted"]

    async def run() -> list[Any]:
        tasks = [asyncio.ensure_future(engine.generate(GenerationRequest(f"p{i}", p, n)))
                 for i, (p, n) in enumerate(zip(PROMPTS, TOKENS, strict=True))]
        await asyncio.sleep(0.1)
        tasks[0].cancel()
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    got = asyncio.run(run())
    assert isinstance(got[0], asyncio.CancelledError)
    for i, res in enumerate(got[1:], start=1):
        assert res.ok and res.output_ids == reference["plain"][i], i


def _second_tokens(engine: TransformersEngine, prompt: str, n: int) -> dict[int, int]:
    requests = [GenerationRequest(f"s{i}", prompt, 6, temperature=0.8, seed=1000 + i,
                                  want_margins=False) for i in range(n)]
    counts: dict[int, int] = {}
    assert engine._batcher is not None
    engine._batcher.largest = 0
    for res in asyncio.run(_staggered(engine, requests)):
        assert res.ok, res.error
        counts[res.output_ids[1]] = counts.get(res.output_ids[1], 0) + 1
    assert engine._batcher.largest >= 64
    return counts


def _p_value(counts: dict[int, int], probs: Any) -> float:
    """Chi-square goodness of fit to ``probs``, tokens expected fewer than 5 times pooled."""
    from scipy.stats import chisquare

    n = sum(counts.values())
    expected = probs * n
    big = [int(t) for t in torch.nonzero(expected >= 5).flatten()]
    obs = [counts.get(t, 0) for t in big]
    exp = [float(expected[t]) for t in big]
    obs.append(n - sum(obs))
    exp.append(n - sum(exp))
    return float(chisquare(obs, exp).pvalue)


def test_speculative_sampling_in_a_batch_keeps_the_targets_distribution(
        engines: dict[str, TransformersEngine], reference: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The second token of sampled requests decoded together, the first forced by a bias and
    the prefill left undrafted, so that every second token comes from drafts made and verified
    over the batch: drawn from the target's distribution."""
    tok, target = reference["tok"], reference["target"]

    def second(i: int) -> tuple[str, int, Any]:
        """PROMPTS[i], its greedy first token, the target's distribution after it."""
        first = reference["plain"][i][0]
        with torch.inference_mode():
            ids = tok(PROMPTS[i], return_tensors="pt")["input_ids"]
            logits = target(input_ids=torch.cat([ids, torch.tensor([[first]])], dim=1)).logits
        return PROMPTS[i], first, torch.softmax(logits[0, -1].float() / 0.8, dim=-1)

    # The first prompt whose second token is a distribution worth testing, not one sure token.
    prompt, first, probs = next(c for c in map(second, range(len(PROMPTS)))
                                if float(c[2].max()) < 0.9)
    engine = engines["drafted"]

    def first_forced(self: TransformersEngine, request: GenerationRequest,
                     n_prompt: int) -> list[Any]:
        return [lambda ids, scores: scores if ids.shape[1] > n_prompt else torch.where(
            torch.arange(scores.shape[-1]) == first, scores + 1e4, scores)]

    draft = batching.Batcher._draft

    def none_at_prefill(self: batching.Batcher, flights: list[Any],
                        drafter: Any) -> list[batching.Drafts]:
        if all(not f.ids for f in flights):
            return [batching.Drafts() for _ in flights]
        return draft(self, flights, drafter)

    monkeypatch.setattr(TransformersEngine, "_processors", first_forced)
    monkeypatch.setattr(batching.Batcher, "_draft", none_at_prefill)
    assert _p_value(_second_tokens(engine, prompt, 400), probs) > 1e-3

    # A verifier that accepts every draft (no rejection) samples the drafter instead: caught.
    verify = batching.Batcher._verify

    def accept_all(self: batching.Batcher, f: Any, d: Any, raw: Any) -> tuple[int, int]:
        m, token = verify(self, f, d, raw)
        return (len(d.tokens), int(raw[len(d.tokens)].argmax())) if d.tokens else (m, token)

    monkeypatch.setattr(batching.Batcher, "_verify", accept_all)
    assert _p_value(_second_tokens(engine, prompt, 400), probs) < 1e-3


def test_the_cache_appends_in_place_until_its_room_is_full() -> None:
    from pytest_osprey.engines.embedded.kv_rows import growing_layer

    layer = growing_layer()()
    k = torch.randn(2, 4, 5, 8)
    layer.update(k, k + 1)
    room = layer.keys.data_ptr()
    for _ in range(10):  # 55 columns: within the first room of 64
        layer.update(k, k + 1)
    assert layer.keys.data_ptr() == room and layer.keys.shape == (2, 4, 55, 8)
    assert torch.equal(layer.keys[:, :, 50:], k) and torch.equal(layer.values[:, :, :5], k + 1)
    layer.update(torch.zeros(2, 4, 20, 8), torch.zeros(2, 4, 20, 8))  # past it: a new room
    assert layer.keys.shape[-2] == 75 and torch.equal(layer.keys[:, :, :5], k)
    layer.keys = layer.keys[:1].clone()  # rows left: the next update adopts the new tensor
    layer.values = layer.values[:1].clone()
    layer.update(k[:1], k[:1])
    assert layer.keys.shape == (1, 4, 80, 8) and torch.equal(layer.keys[:, :, 75:], k[:1])
