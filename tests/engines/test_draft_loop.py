"""The embedded engine's draft loop (one drafter forward per draft token) against transformers'
own assisted generation: the same drafts, the same greedy output, and speculative sampling that
still draws from the target's distribution; a draft distribution that lies is caught."""

from __future__ import annotations

from typing import Any

import pytest

from testkit import tiny_models
from testkit.factories import TINY_DRAFTER, TINY_TARGET

torch = tiny_models.need()
pytestmark = pytest.mark.slow  # boots the tiny models

from testkit import draft_loop  # noqa: E402

PROMPTS = [
    "def read_config(path):\n",
    "The license grants you the right to",
    "<|user|>\nHow do I sort a dictionary by value in Python?<|end|>\n<|assistant|>\n",
]


@pytest.fixture(scope="module")
def models() -> tuple[Any, Any, Any, Any]:
    """(tokenizer, target with the draft loop, target as transformers ships it, drafter)."""
    tok = tiny_models.tokenizer()
    drafter = tiny_models.load(TINY_DRAFTER)
    gc = drafter.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = 4, "constant"
    gc.assistant_confidence_threshold = 0.0
    looped, stock = tiny_models.load(TINY_TARGET), tiny_models.load(TINY_TARGET)
    assert draft_loop.install(looped, drafter, 4)
    return tok, looped, stock, drafter


def _forwards(model: Any) -> tuple[list[int], Any]:
    calls: list[int] = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    return calls, handle


@pytest.mark.parametrize("prompt", PROMPTS)
def test_same_drafts_and_output_as_assisted_generation(models: Any, prompt: str) -> None:
    tok, looped, stock, drafter = models
    enc = tok(prompt, return_tensors="pt")
    outs, steps = {}, {}
    with torch.inference_mode():
        plain = looped.generate(**enc, max_new_tokens=40, do_sample=False,
                                pad_token_id=tok.pad_token_id)
        for name, model in (("loop", looped), ("stock", stock)):
            calls, handle = _forwards(model)
            try:
                outs[name] = model.generate(**enc, max_new_tokens=40, do_sample=False,
                                            assistant_model=drafter,
                                            pad_token_id=tok.pad_token_id)
            finally:
                handle.remove()
            steps[name] = len(calls)
    assert torch.equal(outs["loop"], plain)  # greedy identity with speculation off
    assert torch.equal(outs["loop"], outs["stock"])
    # The same drafts accepted: as many verify steps as transformers' own drafting needs.
    assert steps["loop"] == steps["stock"] < 40


def _first_token_counts(model: Any, drafter: Any, enc: Any, n: int,
                        seed0: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    with torch.inference_mode():
        for i in range(n):
            torch.manual_seed(seed0 + i)
            out = model.generate(**enc, max_new_tokens=2, do_sample=True, temperature=0.8,
                                 top_k=0, top_p=1.0, assistant_model=drafter,
                                 pad_token_id=0)
            token = int(out[0, enc["input_ids"].shape[1]])
            counts[token] = counts.get(token, 0) + 1
    return counts


def _p_value(counts: dict[int, int], probs: Any) -> float:
    """Chi-square goodness of fit of the first sampled token to the target's distribution,
    tokens expected fewer than 5 times pooled into one class."""
    from scipy.stats import chisquare

    n = sum(counts.values())
    expected = probs * n
    big = [int(t) for t in torch.nonzero(expected >= 5).flatten()]
    obs = [counts.get(t, 0) for t in big]
    exp = [float(expected[t]) for t in big]
    obs.append(n - sum(obs))
    exp.append(n - sum(exp))
    return float(chisquare(obs, exp).pvalue)


class _LyingLoop(draft_loop.DraftLoop):
    """A planted fault: drafts the drafter's argmax while claiming its sampled distribution,
    so speculative sampling's correction is computed against the wrong q."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.sample = False


def test_speculative_sampling_keeps_the_targets_distribution(models: Any) -> None:
    tok, looped, _, drafter = models

    def first(prompt: str) -> tuple[Any, Any, float]:
        """The prompt's encoding, the target's first-token distribution at T 0.8, and its
        total variation from the drafter's."""
        enc = tok(prompt, return_tensors="pt")
        with torch.inference_mode():
            p, q = (torch.softmax(m(**enc).logits[0, -1].float() / 0.8, dim=-1)
                    for m in (looped, drafter))
        return enc, p, float((p - q).abs().sum()) / 2

    # A distribution worth testing (not one sure token), where the drafter disagrees most
    # with the target: what a wrong correction gets wrong.
    enc, probs, _ = max((c for c in map(first, PROMPTS) if float(c[1].max()) < 0.9),
                        key=lambda c: c[2])
    counts = _first_token_counts(looped, drafter, enc, 400, seed0=1000)
    assert _p_value(counts, probs) > 1e-3, counts

    # The same check catches a draft loop whose returned distribution is not what it drew from.
    lying = tiny_models.load(TINY_TARGET)
    original = lying._get_candidate_generator

    def choose(**kwargs: Any) -> Any:
        base = draft_loop._candidate_base()
        cls = type("Lying", (_LyingLoop, base), {})
        return cls(drafter, 4, kwargs["generation_config"], kwargs["logits_processor"])

    lying._get_candidate_generator = choose
    try:
        # More draws than the honest check: the fault's size is the drafter's disagreement.
        bad = _first_token_counts(lying, drafter, enc, 1000, seed0=1000)
    finally:
        lying._get_candidate_generator = original
    assert _p_value(bad, probs) < 1e-3, bad


def test_without_the_hook_drafting_stays_transformers_own() -> None:
    class Bare:
        pass

    assert draft_loop.install(Bare(), object(), 4) is False
