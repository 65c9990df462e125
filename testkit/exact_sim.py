"""Scored samples from known distributions, honest or with a planted sampler fault, for the
exact per-position test (pytest_osprey/judgement/quality/exact.py).

The draws come from :func:`pytest_osprey.judgement.quality.exact_power.simulate` (a Zipf-like
target whose tokens within a sample depend on the token before, position classes as a
speculating engine makes them, faults at the speculative positions); this module turns them
into the ``ScoredSample`` lists a campaign saves, so tests run the public ``exact_test``.
"""

from __future__ import annotations

from pytest_osprey.judgement.quality.exact import (
    POSITION_CLASSES,
    PositionClass,
    ScoredSample,
    ScoredToken,
    Served,
)
from pytest_osprey.judgement.quality.exact_power import Budget, Draws, simulate


def to_samples(draws: Draws, replicate: int = 0, *, split_known: bool = True
               ) -> list[ScoredSample]:
    """The ScoredSamples of one replicate campaign of ``draws`` (``split_known=False``: every
    position after the first labelled ``later``, as where the engine gives totals only)."""
    out: list[ScoredSample] = []
    seen: dict[int, int] = {}
    for row in range(draws.tokens.shape[0]):
        if draws.replicate[row] != replicate:
            continue
        tokens = []
        for j in range(draws.tokens.shape[1]):
            klass: PositionClass = POSITION_CLASSES[int(draws.klass[row, j])]
            if not split_known and klass != "first":
                klass = "later"
            tokens.append(ScoredToken(
                token=int(draws.tokens[row, j]), logprob=float(draws.drawn_logprob[row, j]),
                top_ids=tuple(int(i) for i in draws.top_ids[row, j]),
                top_logprobs=tuple(float(x) for x in draws.top_logprobs[row, j]), klass=klass))
        prompt = int(draws.prompt[row])
        seen[prompt] = seen.get(prompt, -1) + 1
        out.append(ScoredSample(f"p{prompt:02d}", seen[prompt], tuple(tokens)))
    return out


def scored_samples(budget: Budget, served: Served, fault: str | None = None, *, seed: int = 0,
                   family: str = "tiny", shift: float = 0.1, split_known: bool = True
                   ) -> list[ScoredSample]:
    """One simulated campaign's ScoredSamples (``fault``: one of exact_power.FAULTS)."""
    draws = simulate(budget, served, fault, seed=seed, family=family, shift=shift)
    return to_samples(draws, split_known=split_known)
