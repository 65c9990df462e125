"""The distribution a service should have sampled from, rebuilt from the target's top-K.

The data a campaign saves for the exact per-position test (:mod:`.exact`): each sampled token
with the target's raw (T=1) top-K log-probabilities where it was drawn (:class:`ScoredToken`,
:class:`ScoredSample`) and the sampling the service applies (:class:`Served`). From them,
:func:`positions_from` builds :class:`Positions` arrays and :func:`served_support` the served
weights of the top-K, the support the served top-k / top-p / min-p keep (the largest, and the
core kept whatever the tail beyond K holds), the tail's weight bounds, and whether each draw
lies outside the served support. The tail treatment is described in :mod:`.exact`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..stats.core import FloatArray, StatsError

PositionClass = Literal["first", "drafted", "bonus", "later"]
POSITION_CLASSES: tuple[PositionClass, ...] = ("first", "drafted", "bonus", "later")
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
TRUNCATIONS = ("temperature 0", "top-k", "top-p", "min-p", "probability 0")


@dataclass(frozen=True)
class ScoredToken:
    """One sampled token and the target's raw distribution where it was drawn."""

    token: int
    logprob: float  # the target's raw log-probability (T=1, untruncated) of ``token``
    top_ids: tuple[int, ...]  # the target's top-K token ids, most likely first
    top_logprobs: tuple[float, ...]  # their raw log-probabilities (K may be the whole vocab)
    klass: PositionClass
    # Additive logit offsets the service applies here beyond Served's frequency/presence
    # penalties (a repetition penalty or logit bias, computed by the caller): for ``token``
    # and for each of ``top_ids`` (empty: none).
    logit_offset: float = 0.0
    top_offsets: tuple[float, ...] = ()


@dataclass(frozen=True)
class ScoredSample:
    """One sampled continuation of one prompt, every token scored."""

    prompt_id: str
    sample_index: int
    tokens: tuple[ScoredToken, ...]


@dataclass(frozen=True)
class Served:
    """The sampling the service applies (the distribution the samples should follow).

    Penalties follow the OpenAI convention: a token's logit loses ``frequency_penalty`` per
    earlier occurrence in the sample and ``presence_penalty`` once it occurred. A repetition
    penalty multiplies raw logits (not log-probabilities): the caller supplies it as per-token
    ``logit_offset``/``top_offsets`` and sets ``repetition_penalty`` so the test knows."""

    temperature: float
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def words(self) -> str:
        """The served settings, briefly ("T 0.8, top-p 0.9")."""
        parts = [f"T {self.temperature:g}"]
        if self.top_k is not None:
            parts.append(f"top-k {self.top_k}")
        if self.top_p < 1:
            parts.append(f"top-p {self.top_p:g}")
        if self.min_p > 0:
            parts.append(f"min-p {self.min_p:g}")
        for name, value, neutral in (("frequency penalty", self.frequency_penalty, 0.0),
                                     ("presence penalty", self.presence_penalty, 0.0),
                                     ("repetition penalty", self.repetition_penalty, 1.0)):
            if value != neutral:
                parts.append(f"{name} {value:g}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Positions:
    """Scored positions as arrays, rows sorted by served logit (most likely first).

    ``logits``: raw log-probabilities (T=1) of each row's top-K plus the service's offsets
    (penalties), ``-inf`` padding; ``drawn``: the drawn token's column, -1 beyond the top-K;
    ``drawn_logit``: its raw log-probability plus offset; ``tail``: the raw mass beyond the
    top-K; ``floor``: the K-th raw log-probability (every tail token lies at or below it);
    ``tail_tokens``: how many tokens the tail holds (0: unknown); ``klass``: index into
    POSITION_CLASSES; ``tail_down``/``tail_up``: offsets may lower / raise tail tokens (beyond
    the frequency/presence penalties of the ``tail_penalised`` earlier tokens, each at most
    as likely as the K-th);
    ``offsets``: the offsets ``logits`` include (to judge whether penalties were applied)."""

    logits: FloatArray
    drawn: IntArray
    drawn_logit: FloatArray
    tail: FloatArray
    floor: FloatArray
    tail_tokens: IntArray
    klass: IntArray
    tail_down: BoolArray
    tail_up: BoolArray
    tail_penalised: IntArray  # distinct earlier tokens of the sample beyond the top-K
    offsets: FloatArray  # (n, K) the offsets included in ``logits`` (penalties)


# --------------------------------------------------------------------------- input


def _penalties(tokens: Sequence[ScoredToken], served: Served
               ) -> tuple[list[list[float]], list[float], list[int]]:
    """Frequency/presence offsets of each token's top ids and of the drawn token, from the
    sample's earlier tokens; and how many distinct earlier tokens lie beyond the top-K (the
    tail tokens the penalties may lower)."""
    counts: dict[int, int] = {}
    f, p = served.frequency_penalty, served.presence_penalty
    tops: list[list[float]] = []
    drawn: list[float] = []
    beyond: list[int] = []
    for t in tokens:
        tops.append([-(f * counts[i] + p) if i in counts else 0.0 for i in t.top_ids])
        drawn.append(-(f * counts[t.token] + p) if t.token in counts else 0.0)
        beyond.append(len(counts) - sum(i in counts for i in t.top_ids))
        counts[t.token] = counts.get(t.token, 0) + 1
    return tops, drawn, beyond


def positions_from(samples: Sequence[ScoredSample], served: Served, vocab: int | None = None
                   ) -> Positions:
    """The arrays :func:`judge_positions` judges; StatsError names a malformed token."""
    rows: list[ScoredToken] = []
    pen_top: list[list[float]] = []
    pen_drawn: list[float] = []
    pen_beyond: list[int] = []
    penalised = served.frequency_penalty != 0 or served.presence_penalty != 0
    for s in samples:
        for j, t in enumerate(s.tokens):
            where = f"sample {s.prompt_id}#{s.sample_index} token {j}"
            if len(t.top_ids) != len(t.top_logprobs) or not t.top_ids:
                raise StatsError(f"{where}: top_ids and top_logprobs must be non-empty and of "
                                 f"equal length ({len(t.top_ids)} vs {len(t.top_logprobs)})")
            if t.top_offsets and len(t.top_offsets) != len(t.top_ids):
                raise StatsError(f"{where}: top_offsets must match top_ids in length")
            if t.klass not in POSITION_CLASSES:
                raise StatsError(f"{where}: klass must be one of {POSITION_CLASSES}, got "
                                 f"{t.klass!r}")
        rows.extend(s.tokens)
        if penalised:
            a, b, c = _penalties(s.tokens, served)
            pen_top.extend(a)
            pen_drawn.extend(b)
            pen_beyond.extend(c)
    if not rows:
        raise StatsError("no scored tokens to judge")
    if served.repetition_penalty != 1 and not any(t.top_offsets for t in rows):
        raise StatsError("a repetition penalty acts on raw logits: supply it as per-token "
                         "logit offsets (ScoredToken.top_offsets)")
    n, k = len(rows), max(len(t.top_ids) for t in rows)
    raw = np.full((n, k), -np.inf)
    ids = np.full((n, k), -1, dtype=np.int64)
    off = np.zeros((n, k))
    for i, t in enumerate(rows):
        width = len(t.top_ids)
        raw[i, :width] = t.top_logprobs
        ids[i, :width] = t.top_ids
        if t.top_offsets:
            off[i, :width] = t.top_offsets
    caller = off[np.isfinite(raw)]
    down = bool(served.repetition_penalty != 1 or (caller < 0).any())
    up = bool(served.frequency_penalty < 0 or served.presence_penalty < 0 or (caller > 0).any()
              or any(t.logit_offset > 0 for t in rows))
    if penalised:
        for i, o in enumerate(pen_top):
            off[i, : len(o)] += o
    if np.isnan(raw).any() or (raw > 1e-6).any():
        raise StatsError("top_logprobs must be log-probabilities (finite, <= 0)")
    token = np.array([t.token for t in rows], dtype=np.int64)
    if any(math.isnan(t.logprob) or t.logprob > 1e-6 for t in rows):
        raise StatsError("a token's logprob must be a log-probability (<= 0, -inf allowed)")
    drawn_logit = np.array([t.logprob + t.logit_offset for t in rows])
    if penalised:
        drawn_logit += np.asarray(pen_drawn)
    width = np.isfinite(raw).sum(axis=1)
    mass = np.exp(raw).sum(axis=1)
    if (mass > 1.01).any():
        i = int(np.argmax(mass))
        raise StatsError(f"token {i}: top_logprobs sum to probability {mass[i]:.3f} > 1: not raw "
                         "(temperature 1) log-probabilities")
    tail = np.clip(1.0 - mass, 0.0, 1.0)
    if vocab is not None:
        if vocab < k:
            raise StatsError(f"vocab {vocab} is smaller than the top-K width {k}")
        tail[width >= vocab] = 0.0
    tail_tokens = (np.maximum(vocab - width, 0) if vocab is not None
                   else np.zeros(n, dtype=np.int64)).astype(np.int64)
    floor = np.where(np.isfinite(raw), raw, np.inf).min(axis=1)
    logits = raw + off
    order = np.argsort(-logits, axis=1, kind="stable")
    logits = np.take_along_axis(logits, order, axis=1)
    off = np.take_along_axis(off, order, axis=1)
    ids = np.take_along_axis(ids, order, axis=1)
    hit = ids == token[:, None]
    drawn = np.where(hit.any(axis=1), hit.argmax(axis=1), -1).astype(np.int64)
    known = drawn >= 0
    drawn_logit[known] = logits[known, drawn[known]]
    klass = np.array([POSITION_CLASSES.index(t.klass) for t in rows], dtype=np.int64)
    beyond = np.asarray(pen_beyond if penalised else np.zeros(n), dtype=np.int64)
    return Positions(logits, drawn, drawn_logit, tail, floor, tail_tokens, klass,
                     np.full(n, down), np.full(n, up), beyond,
                     np.where(np.isfinite(logits), off, 0.0))


# --------------------------------------------------------------------------- served q


@dataclass(frozen=True)
class Support:
    """Per row (:func:`served_support`): the served weights of the top-K (relative to the
    top one), which of them and whether the tail the served support keeps, the tail's weight
    bounds, and each draw's status."""

    w: FloatArray  # tempered weights exp((l - l_max) / T), 0 outside the support
    keep: BoolArray
    tail_kept: BoolArray
    tail_lo: FloatArray
    tail_hi: FloatArray
    out: IntArray  # -1: inside; else the index in TRUNCATIONS that excludes the draw
    boundary: BoolArray  # outside the exact support, by less than the tolerance
    core: BoolArray  # (n, K) top-K tokens kept whatever the unknown tail holds


def served_support(pos: Positions, served: Served, tol: float) -> Support:
    lg = pos.logits
    n, k = lg.shape
    valid = np.isfinite(lg)
    top = lg[:, 0]
    d = lg - top[:, None]  # <= 0, -inf padding
    dx = pos.drawn_logit - top
    out = np.full(n, -1, dtype=np.int64)
    if served.temperature == 0:  # greedy: the most likely token (and its ties) only
        keep = valid & (d >= 0)
        w = keep.astype(np.float64)
        tail_kept = np.zeros(n, dtype=bool)
        zero = np.zeros(n)
        out[dx + tol < 0] = 0
        known = pos.drawn >= 0
        inside = np.where(known, keep[np.arange(n), np.maximum(pos.drawn, 0)], False)
        return Support(w, keep, tail_kept, zero, zero, out, (out < 0) & ~inside, keep)
    a = 1.0 / served.temperature
    with np.errstate(invalid="ignore"):
        w = np.where(valid, np.exp(a * d), 0.0)
    m = pos.tail
    has_tail = m > 0
    safe_m = np.where(has_tail, m, 1.0)
    # Tail weight bounds on the same scale (module docstring): each tail token's raw
    # probability p_j <= exp(floor), sum p_j = m. Penalties only lower the tokens they hit,
    # so the upper bounds hold; the lower ones count only the mass they cannot have hit.
    free = np.clip(m - pos.tail_penalised * np.exp(pos.floor), 0.0, None)
    safe_free = np.where(free > 0, free, 1.0)
    edge = (a - 1.0) * pos.floor - a * top
    nt = np.maximum(pos.tail_tokens, 1).astype(np.float64)
    spread = np.where(pos.tail_tokens > 0, (1 - a) * np.log(nt) - a * top, np.inf)
    if a >= 1:
        hi = np.exp(np.log(safe_m) + edge)
        lo = np.where((pos.tail_tokens > 0) & (free > 0),
                      np.exp(spread + a * np.log(safe_free)), 0.0)
    else:
        lo = np.where(free > 0, np.exp(np.log(safe_free) + edge), 0.0)
        hi = np.exp(spread + a * np.log(safe_m))
    lo = np.where(has_tail & ~pos.tail_down, lo, 0.0)
    hi = np.where(has_tail, np.where(pos.tail_up, np.inf, hi), 0.0)
    rank = np.arange(k)[None, :]
    width = valid.sum(axis=1)
    # top-k
    if served.top_k is not None:
        keep_k = valid & (rank < served.top_k)
        tail_k = has_tail & (served.top_k > width)
        out_k = (valid & (lg > pos.drawn_logit[:, None] + tol)).sum(axis=1) >= served.top_k
    else:
        keep_k, tail_k, out_k = valid.copy(), has_tail.copy(), np.zeros(n, dtype=bool)
    # top-p, over the top-k survivors, normalised with the tail at its upper bound (the
    # largest support).
    wk = np.where(keep_k, w, 0.0)
    known_mass = wk.sum(axis=1)
    with np.errstate(invalid="ignore"):
        z_hi = known_mass + np.where(tail_k, hi, 0.0)
    core_p = np.ones((n, k), dtype=bool)
    if served.top_p < 1:
        before = np.cumsum(wk, axis=1) - wk
        keep_p = before < served.top_p * z_hi[:, None]
        # The cut moves with the unknown tail mass: the top-K tokens kept whatever the tail
        # holds (normalised with the tail at its lower bound) are the core the conditional
        # statistics use; the others may or may not have been kept.
        low = lo * np.clip((served.top_k or 0) - width, 0, None) / nt \
            if served.top_k is not None else lo
        z_lo = known_mass + np.where(tail_k, low, 0.0)
        core_p = before < served.top_p * z_lo[:, None]
        tail_p = known_mass < served.top_p * z_hi
        above = np.where(keep_k & (lg > pos.drawn_logit[:, None] + tol), w, 0.0).sum(axis=1)
        out_p = above >= served.top_p * z_hi
    else:
        keep_p, tail_p, out_p = np.ones((n, k), dtype=bool), np.ones(n, dtype=bool), \
            np.zeros(n, dtype=bool)
    # min-p: relative to the most likely token, so normalisation-free.
    if served.min_p > 0:
        cut = math.log(served.min_p)
        with np.errstate(invalid="ignore"):
            keep_m = a * d >= cut
        tail_m = pos.tail_up | (a * (pos.floor - top) >= cut)
        out_m = a * (dx + tol) < cut
    else:
        keep_m, tail_m, out_m = np.ones((n, k), dtype=bool), np.ones(n, dtype=bool), \
            np.zeros(n, dtype=bool)
    keep = keep_k & keep_p & keep_m
    tail_kept = tail_k & tail_p & tail_m
    partial = (served.top_k is not None) or served.top_p < 1 or served.min_p > 0
    if partial:
        lo = np.zeros(n)  # a truncation may cut into the tail: no lower bound
    impossible = pos.drawn_logit == -np.inf  # the target itself gives it probability 0
    for index, hit in ((4, impossible), (3, out_m), (2, out_p), (1, out_k)):
        # the first in serving order wins
        out[hit] = index
    known = pos.drawn >= 0
    inside = np.where(known, keep[np.arange(n), np.maximum(pos.drawn, 0)], tail_kept)
    w = np.where(keep, w, 0.0)
    return Support(w, keep, tail_kept, lo, np.where(tail_kept, hi, 0.0), out,
                   (out < 0) & ~inside, keep & core_p)


__all__ = ["POSITION_CLASSES", "TRUNCATIONS", "PositionClass", "Positions", "ScoredSample",
           "ScoredToken", "Served", "Support", "positions_from", "served_support"]
