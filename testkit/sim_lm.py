"""Synthetic language models for the statistics' simulations (seeded, numpy only).

``MarkovLM``: an order-1 Markov chain over 1024 tokens whose rows are Zipf-shaped (random token
ranks per row, exponent drawn per row; token 0 ends the sequence). "Chat-like" rows (exponents
1.5-4.0) have a mean next-token entropy of about 1 nat, as chat-tuned LLMs sampled at
temperature 1 do (most tokens nearly certain, some forks); "flat" rows (0.5-1.0, about 6 nats)
mimic a barely trained tiny target, where nearly every sampled token is unique. Temperature and
top-p act on the rows as an engine applies them to logits.
"""

from __future__ import annotations

import numpy as np

CHAT_LIKE = (1.5, 4.0)  # Zipf exponents: mean next-token entropy about 1 nat
FLAT = (0.5, 1.0)  # about 6 nats, like the tiny target
Samples = dict[str, list[list[int]]]


class MarkovLM:
    """Order-1 Markov chain with Zipf-shaped rows; token 0 is end-of-sequence."""

    def __init__(self, exponents: tuple[float, float], seed: int, vocab: int = 1024) -> None:
        rng = np.random.default_rng(seed)
        self.vocab = vocab
        ranks = rng.permuted(np.tile(np.arange(1.0, vocab + 1), (vocab, 1)), axis=1)
        self.logits = -rng.uniform(*exponents, size=(vocab, 1)) * np.log(ranks)
        self.starts = rng.integers(1, vocab, size=64)  # each prompt's "previous token"

    def entropy(self) -> float:
        p = np.exp(self.logits)
        p /= p.sum(axis=1, keepdims=True)
        return float(-(p * np.log(p)).sum(axis=1).mean())

    def sampler(self, temperature: float = 1.0, top_p: float = 1.0) -> np.ndarray:
        return _flat_cdf(self.logits, temperature, top_p)

    def draw(self, cdf: np.ndarray, prompts: int, n: int, k: int, rng: np.random.Generator,
             ) -> Samples:
        state = np.repeat(self.starts[:prompts], n)
        toks = np.empty((state.size, k), dtype=np.int64)
        for j in range(k):
            state = _search(cdf, state, rng, self.vocab)
            toks[:, j] = state
        return _as_samples(toks.reshape(prompts, n, k), eos=0)


def _flat_cdf(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """Row-wise CDFs of softmax(logits / T) after nucleus truncation, as one sorted array."""
    z = logits / temperature
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    if top_p < 1:
        order = np.argsort(-p, axis=-1)
        s = np.take_along_axis(p, order, axis=-1)
        kept = np.where(np.cumsum(s, axis=-1) - s < top_p, s, 0.0)
        p = np.zeros_like(p)
        np.put_along_axis(p, order, kept, axis=-1)
        p /= p.sum(axis=-1, keepdims=True)
    c = np.cumsum(p.reshape(-1, p.shape[-1]), axis=1)
    c[:, -1] = 1.0
    return (c + np.arange(c.shape[0])[:, None]).ravel()  # row r's CDF lives in [r, r+1]


def _search(cdf: np.ndarray, rows: np.ndarray, rng: np.random.Generator, vocab: int,
            ) -> np.ndarray:
    drawn = np.searchsorted(cdf, rows + rng.random(rows.shape)) - rows * vocab
    return np.asarray(np.minimum(drawn, vocab - 1))


def _as_samples(toks: np.ndarray, eos: int) -> Samples:
    out: Samples = {}
    for i, rows in enumerate(toks.tolist()):
        out[f"p{i:02d}"] = [r[: r.index(eos) + 1] if eos in r else r for r in rows]
    return out
