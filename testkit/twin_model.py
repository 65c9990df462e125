"""The serving twin's time model: a GPU server's schedule, spent in virtual or real seconds.

One scheduler (:class:`Scheduler`) serves both the HTTP twin (testkit/serving_twin.py), which
sleeps each step's cost, and :func:`true_speedup`, which adds the costs up in virtual time:
what the twin serves and what it claims as its truth are the same schedule.

Schedule (SGLang's default): continuous batching with a cap on running requests (48 on a
speculative server, SGLang 0.5.23's default there); waiting requests are admitted by a
prefill batch, which runs before the next decode step (prefill first, no mixed batches).

Costs of one step, in seconds (``Costs``):

* target forward: ``a + b * tokens`` - the tokens in the batch: prompt tokens for a prefill,
  one per request for a plain decode step, ``draft_tokens`` (steps + 1) per request for a
  verify step;
* drafting (speculative only): ``steps * (e + d * requests)`` per decode step - a fixed cost
  per draft forward (a small model at small batch is launch-bound) plus ``d`` per drafted
  token; a prefill also runs the draft over the prompt (``e + d * prompt tokens``).

Acceptance: per verify step, position i of the chain is accepted with probability ``p_i``
given positions < i were (the profile); the step commits the accepted drafts plus one bonus
token (truncated at max_new_tokens). SGLang's counters follow: ``spec_verify_ct`` decode steps,
``spec_correct_drafts_histogram[i]`` steps that accepted exactly i drafts.

Fit (:func:`fit_eagle3`), to published figures:

* EAGLE-3 paper (Li et al. 2025, SGLang table): Llama-3.1-8B on one H100, 158.34 -> 373.25
  tokens/s at batch 1 (2.36x) and 1.38x at batch 64;
* Osprey paper: accept length 3.18 for EAGLE-3 and 3.69 for Osprey on Qwen3-8B at (steps,
  topk, draft tokens) = (5, 1, 6). The EAGLE-3 speed table does not state its accept length;
  the twin takes 3.18 at (5, 1, 6) for it (an assumption, stated here).

With the draft's per-token cost fixed at ``b / 8`` (one decoder layer and a reduced
vocabulary head next to the target's per-token cost), the three figures give ``a``, ``b``
and ``e`` exactly (a 3x3 linear system). The Osprey-like drafter keeps the target costs and
doubles the draft costs (a 2-layer backbone against EAGLE-3's single layer; an assumption:
the Osprey paper's speed figures are not used), and its profile averages 3.69.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np
from scipy.optimize import brentq

PLAIN_TOKENS_S = 158.34  # EAGLE-3 paper, SGLang, Llama-3.1-8B, H100, batch 1
EAGLE3_TOKENS_S = 373.25
EAGLE3_SPEEDUP_64 = 1.38
EAGLE3_ACCEPT = 3.18  # Osprey paper, (5, 1, 6)
OSPREY_ACCEPT = 3.69
STEPS = 5
DRAFT_PER_TOKEN = 1 / 8  # d = b / 8
PROFILE_DECAY = 0.9  # p_i = alpha * decay**(i - 1): later positions are accepted less often
SPEC_CAP = 48  # SGLang 0.5.23: a speculative server runs at most 48 requests by default
PLAIN_CAP = 256  # a plain server: its pool's size (a cap the tests do not reach)


@dataclass(frozen=True)
class Costs:
    """Seconds per step (see the module's docstring)."""

    a: float
    b: float
    e: float = 0.0
    d: float = 0.0


@dataclass(frozen=True)
class Profile:
    """One served condition: its costs, cap and acceptance (empty: no speculation)."""

    name: str
    costs: Costs
    cap: int
    accept: tuple[float, ...] = ()  # p_i, i = 1..steps (conditional on i - 1 accepted)

    @property
    def steps(self) -> int:
        return len(self.accept)

    @property
    def accept_length(self) -> float:
        """Expected tokens per verify step (bonus included), before truncation."""
        return 1.0 + float(np.sum(np.cumprod(self.accept))) if self.accept else 1.0

    def prefill_s(self, prompt_tokens: int) -> float:
        c = self.costs
        spent = c.a + c.b * prompt_tokens
        return spent + (c.e + c.d * prompt_tokens if self.steps else 0.0)

    def decode_s(self, requests: int) -> float:
        c = self.costs
        if not self.steps:
            return c.a + c.b * requests
        return (c.a + c.b * (self.steps + 1) * requests
                + self.steps * (c.e + c.d * requests))

    def nominal_tokens_s(self, batch: int) -> float:
        """Steady decode throughput at ``batch`` running requests (tokens/s)."""
        return batch * self.accept_length / self.decode_s(batch)

    def scaled(self, factor: float) -> Profile:
        """Every cost times ``factor`` (ratios, hence speedups, unchanged)."""
        c = self.costs
        return replace(self, costs=Costs(c.a * factor, c.b * factor, c.e * factor,
                                         c.d * factor))


def chain_profile(mean: float, steps: int = STEPS, decay: float = PROFILE_DECAY
                  ) -> tuple[float, ...]:
    """Per-position acceptance ``alpha * decay**(i-1)`` whose accept length is ``mean``."""

    def length(alpha: float) -> float:
        rates = alpha * decay ** np.arange(steps)
        return 1.0 + float(np.sum(np.cumprod(rates))) - mean

    alpha = brentq(length, 1e-9, 1.0 / decay ** (steps - 1) if decay < 1 else 1.0)
    rates = alpha * decay ** np.arange(steps)
    if rates.max() > 1.0:
        raise ValueError(f"accept length {mean} is out of reach with decay {decay}")
    return tuple(float(r) for r in rates)


@cache
def fit_eagle3() -> Costs:
    """a, b, e from the three EAGLE-3/Osprey figures, d = b * DRAFT_PER_TOKEN."""
    k, tau, rho = STEPS, EAGLE3_ACCEPT, DRAFT_PER_TOKEN
    # Unknowns (a, b, e). Plain batch 1: a + b = 1/158.34.
    # EAGLE-3 batch 1: a + (k+1) b + k e + k rho b = tau / 373.25.
    # Batch 64: tau * (a + 64 b) = 1.38 * (a + 64 (k+1) b + k e + 64 k rho b).
    s = EAGLE3_SPEEDUP_64
    m = np.array([
        [1.0, 1.0, 0.0],
        [1.0, (k + 1) + k * rho, k],
        [tau - s, tau * 64 - s * 64 * ((k + 1) + k * rho), -s * k],
    ])
    rhs = np.array([1.0 / PLAIN_TOKENS_S, tau / EAGLE3_TOKENS_S, 0.0])
    a, b, e = np.linalg.solve(m, rhs)
    if min(a, b, e) <= 0:
        raise ValueError(f"the published figures give a non-physical fit: a={a}, b={b}, e={e}")
    return Costs(a=float(a), b=float(b), e=float(e), d=float(b * rho))


def profile(name: str, time_scale: float = 1.0) -> Profile:
    """``plain``, ``eagle3-like`` or ``osprey-like``, every cost times ``time_scale``."""
    c = fit_eagle3()
    if name == "plain":
        p = Profile("plain", Costs(c.a, c.b), PLAIN_CAP)
    elif name == "eagle3-like":
        p = Profile(name, c, SPEC_CAP, chain_profile(EAGLE3_ACCEPT))
    elif name == "osprey-like":
        p = Profile(name, Costs(c.a, c.b, 2 * c.e, 2 * c.d), SPEC_CAP,
                    chain_profile(OSPREY_ACCEPT))
    else:
        raise ValueError(f"profile: {name!r} is not one of plain, eagle3-like, osprey-like")
    return p.scaled(time_scale) if time_scale != 1.0 else p


PROFILES = ("plain", "eagle3-like", "osprey-like")


# --------------------------------------------------------------------------- scheduler


@dataclass
class Request:
    """One request's progress and SGLang counters."""

    rid: str
    prompt_tokens: int
    max_new: int
    out: int = 0
    verify_ct: int = 0
    histogram: list[int] = field(default_factory=list)  # steps that accepted exactly i drafts
    cancelled: bool = False

    @property
    def done(self) -> bool:
        return self.out >= self.max_new or self.cancelled


class Scheduler:
    """Continuous batching: :meth:`step` picks the next batch, advances every request in it
    and returns the step's cost with each request's new tokens (committed when the cost has
    been spent: the caller sleeps or adds it up)."""

    def __init__(self, prof: Profile, seed: int = 0) -> None:
        self.profile = prof
        self.rng = random.Random(seed)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, req: Request) -> None:
        req.histogram = [0] * (self.profile.steps + 1) if self.profile.steps else []
        self.waiting.append(req)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def _drafts_accepted(self) -> int:
        n = 0
        for p in self.profile.accept:
            if self.rng.random() >= p:
                break
            n += 1
        return n

    def step(self) -> tuple[float, list[tuple[Request, int]]]:
        self.running = [r for r in self.running if not r.done]
        while self.waiting and self.waiting[0].cancelled:
            self.waiting.popleft()
        room = self.profile.cap - len(self.running)
        if self.waiting and room > 0:
            batch: list[Request] = []
            while self.waiting and len(batch) < room:
                req = self.waiting.popleft()
                if not req.cancelled:
                    batch.append(req)
            cost = self.profile.prefill_s(sum(r.prompt_tokens for r in batch))
            for req in batch:
                req.out = 1  # the prefill's token
            self.running += batch
            return cost, [(r, 1) for r in batch]
        if not self.running:
            return 0.0, []
        cost = self.profile.decode_s(len(self.running))
        out = []
        for req in self.running:
            if self.profile.steps:
                accepted = self._drafts_accepted()
                req.verify_ct += 1
                req.histogram[accepted] += 1
                n = min(accepted + 1, req.max_new - req.out)
            else:
                n = 1
            req.out += n
            out.append((req, n))
        return cost, out


# --------------------------------------------------------------------------- the truth


def closed_loop_e2e(prof: Profile, concurrency: int, prompt_tokens: int, output_tokens: int,
                    repeats: int, seed: int = 0) -> list[float]:
    """Completion latencies (s) of ``concurrency`` requests sent together, each finished one
    replaced at once by a filler until all of them are done (the runner's closed-loop
    stretch), over ``repeats`` stretches, in virtual time."""
    out: list[float] = []
    for rep in range(repeats):
        sched = Scheduler(prof, seed=seed * 100_003 + rep)
        measured = [Request(f"m{i}", prompt_tokens, output_tokens) for i in range(concurrency)]
        for req in measured:
            sched.add(req)
        now, left, fillers = 0.0, set(range(concurrency)), 0
        index = {id(r): i for i, r in enumerate(measured)}
        ends: list[float] = [math.nan] * concurrency
        while left:
            cost, moved = sched.step()
            now += cost
            for req, _ in moved:
                if req.done:
                    i = index.get(id(req))
                    if i is not None and i in left:
                        left.discard(i)
                        ends[i] = now
                    if left:  # a lane freed: its next request arrives at once
                        fillers += 1
                        sched.add(Request(f"f{fillers}", prompt_tokens, output_tokens))
        out += ends
    return out


def true_speedup(candidate: Profile, baseline: Profile, concurrency: int, prompt_tokens: int,
                 output_tokens: int, repeats: int = 200, seed: int = 0) -> float:
    """The per-prompt (geometric-mean) completion-latency speedup a campaign of closed-loop
    stretches at ``concurrency`` estimates, from the schedule itself (virtual time)."""
    def mean_log(prof: Profile) -> float:
        reps = repeats if prof.steps else 1  # a plain schedule draws nothing
        e2e = closed_loop_e2e(prof, concurrency, prompt_tokens, output_tokens, reps, seed)
        return float(np.mean(np.log(e2e)))

    return math.exp(mean_log(baseline) - mean_log(candidate))


def steady_speedup(candidate: Profile, baseline: Profile, concurrency: int) -> float:
    """Decode throughput ratio with ``concurrency`` requests in flight, each server running
    up to its cap (no prefill, no truncation): the closed form beside :func:`true_speedup`."""
    return (candidate.nominal_tokens_s(min(concurrency, candidate.cap))
            / baseline.nominal_tokens_s(min(concurrency, baseline.cap)))


__all__ = ["PROFILES", "Costs", "Profile", "Request", "Scheduler", "chain_profile",
           "closed_loop_e2e", "fit_eagle3", "profile", "steady_speedup",
           "true_speedup"]
