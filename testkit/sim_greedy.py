"""Simulated greedy campaigns for the near-tie rule (seeded, numpy only).

A prompt's reference greedy path has, at each position, the reference's top-1 minus top-2
logprob margin m_j >= 0 (drawn from a margin model). Another run of a condition flips
position j onto the runner-up when:

* **numerics**: its logits differ from the reference run's by noise, so the margin it sees is
  m_j + delta_j with delta_j ~ N(0, sigma^2), and it flips where that is < 0. The noise is
  not independent: part of it (``shared``) is one draw per run, shared by every position
  (a batch composition or kernel choice that shifts a whole request), the rest per position;
* **relaxed acceptance** (a lossy verify rule): the drafter proposes the runner-up with
  probability ``propose`` and the verifier accepts it whenever m_j <= tau; numerics as above.

Only the first flip is observable (the outputs continue from different prefixes after it).
Records carry margins and top-2 ids as the engines record them, so the real gate judges them.

Margin models: ``chat_like``: a fork position (20 %) has margin ~ Exp(mean 1 nat), a confident
one ~ Exp(mean 6 nats): P(m <= 0.05) is about 1.6 %, as in chat-tuned LLMs' greedy paths;
``empirical(values)``: resampled from measured margins (a real target's greedy paths).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pytest_osprey.results.records import RequestRecord
from testkit.factories import make_record

MarginModel = Callable[[np.random.Generator, int], np.ndarray]


def chat_like(rng: np.random.Generator, n: int) -> np.ndarray:
    fork = rng.random(n) < 0.2
    return np.where(fork, rng.exponential(1.0, n), rng.exponential(6.0, n))


def empirical(values: np.ndarray) -> MarginModel:
    pool = np.asarray(values, dtype=np.float64)
    return lambda rng, n: rng.choice(pool, size=n)


@dataclass(frozen=True)
class Run:
    """How a run of a condition reproduces the reference's greedy path."""

    sigma: float = 0.0  # numerics noise on the margin (nats)
    shared: float = 0.5  # share of the noise variance drawn once per run
    tau: float = 0.0  # relaxed acceptance threshold (0: exact verification)
    propose: float = 0.5  # P(the drafter proposes the runner-up)

    def first_flip(self, margins: np.ndarray, rng: np.random.Generator) -> int | None:
        n = margins.size
        noise = np.zeros(n)
        if self.sigma > 0:
            noise = self.sigma * (np.sqrt(self.shared) * rng.normal()
                                  + np.sqrt(1 - self.shared) * rng.normal(size=n))
        flips = margins + noise < 0
        if self.tau > 0:
            flips |= (margins <= self.tau) & (rng.random(n) < self.propose)
        hit = np.flatnonzero(flips)
        return int(hit[0]) if hit.size else None


HARMLESS = Run(sigma=0.01)  # the engine's own batch-to-batch numerics, as the control's


def _record(cond: str, pid: str, load: str, block: int, ids: list[int], margins: np.ndarray,
            top2: list[list[int]] | None) -> RequestRecord:
    return make_record(
        cond, pid, measured=False, run_id="sim", block=block, load=load, ok=True,
        output_ids=ids, output_text=" ".join(map(str, ids)), started_at=float(block),
        top2_margin=[float(m) for m in margins] if top2 is not None else None, top2_ids=top2,
    )


def campaign(
    rng: np.random.Generator, margins: MarginModel, candidate: Run, control: Run = HARMLESS,
    prompts: int = 21, tokens: int = 48, loads: tuple[str, ...] = ("low", "concurrent"),
    blocks: int = 2,
) -> list[RequestRecord]:
    """Baseline and candidate records of every block at every level (the shipped pilot:
    21 prompts, 48 tokens, 2 levels, 2 blocks); the baseline's block 0 is the reference.

    Token ids: position j's top-1 is 2j+10, its runner-up 2j+11; after a flip the run goes on
    with ids no path shares (its continuation is another text).
    """
    out: list[RequestRecord] = []
    for p in range(prompts):
        pid = f"p{p:02d}"
        m = margins(rng, tokens)  # one greedy path per prompt, replayed at every level
        for load in loads:
            top1 = [2 * j + 10 for j in range(tokens)]
            top2 = [[2 * j + 10, 2 * j + 11] for j in range(tokens)]
            out.append(_record("base", pid, load, 0, top1, m, top2))
            runs = [("base", b, control) for b in range(1, blocks)]
            runs += [("cand", b, candidate) for b in range(blocks)]
            for cond, block, run in runs:
                j = run.first_flip(m, rng)
                ids = list(top1)
                if j is not None:
                    ids = top1[:j] + [top2[j][1]] + [100_000 + k for k in range(tokens - j - 1)]
                # Only the reference's margins and ids are judged; the other run's are not used.
                out.append(_record(cond, pid, load, block, ids, m, top2))
    return out
