"""Seeded, stratified draws of a trace's prompts: never the head of the file.

A trace's order is rarely random (a hand-written file grouped by domain, a log by time), so
every pass that uses part of the trace draws that part across the whole of it:
``trace.limit`` and ``trace.limit_per_slice`` (the campaign's prompts), the sampled pass
(``sampling.sampled.prompts``) and the sampling-parameters pass (``sampling.params.prompts``).

A stratum is a (slice, domain) pair. Allocation is proportional to the strata's sizes with
every stratum represented while the budget allows (strata whose share rounds below one get
one, the rest is split by largest remainders, ties broken at random); the unusual slice gets
at least one prompt wherever it is present. A budget below the number of strata keeps one
prompt of the unusual slice and draws the other strata at random, weighted by size. Within
a stratum the prompts are drawn uniformly at random. Everything follows from the seed
(``sampling.seed``), the pass's name and the prompts: the same trace and seed give the same
draw on every machine, and different passes draw independently.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .trace import Prompt

Stratum = tuple[str, str]
"""(slice, domain)."""

ALL = "all"
PROPORTIONAL = "proportional"
FEWER_THAN_STRATA = "fewer than strata"


@dataclass(frozen=True)
class StratumCount:
    slice: str
    domain: str
    available: int
    drawn: int


@dataclass(frozen=True)
class Draw:
    """Which prompts a pass uses, and why."""

    purpose: str
    """The pass: ``trace`` (trace.limit / limit_per_slice), ``sampled`` or ``params``."""
    seed: int
    budget: int | None
    """The prompts asked for (None: all of them)."""
    population: int
    """Prompts the draw chose from."""
    prompts: tuple[Prompt, ...]
    """The drawn prompts, in trace order."""
    strata: tuple[StratumCount, ...]
    allocation: str
    """``all`` (the budget covers the population), ``proportional`` (every stratum
    represented, the rest in proportion) or ``fewer than strata``."""

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.prompts]

    @property
    def domains(self) -> list[str]:
        """The domains drawn, in order of first appearance in the trace."""
        return list(dict.fromkeys(p.domain for p in self.prompts))

    @property
    def reason(self) -> str:
        n, total, k = len(self.prompts), self.population, len(self.strata)
        if self.allocation == ALL:
            return f"all {total} prompts (the budget, {self.budget or total}, covers them)"
        why = (f"seeded draw (seed {self.seed}) of {n} of {total} prompts, stratified by slice "
               f"and domain ({k} strata)")
        if self.allocation == PROPORTIONAL:
            return why + ": every stratum represented, the rest in proportion to its size"
        return why + (": fewer prompts than strata, so the unusual slice keeps one and the "
                      "other strata are drawn at random, weighted by size")

    def facts(self) -> dict[str, Any]:
        """campaign.json's record of this draw (``draws.<purpose>``)."""
        return {"purpose": self.purpose, "seed": self.seed, "budget": self.budget,
                "population": self.population, "drawn": len(self.prompts),
                "allocation": self.allocation, "reason": self.reason,
                "strata": [{"slice": s.slice, "domain": s.domain, "available": s.available,
                            "drawn": s.drawn} for s in self.strata],
                "prompt_ids": self.ids}


def _rng(seed: int, purpose: str) -> random.Random:
    # A string seed is hashed (SHA-512) by random.Random: stable across runs and machines.
    return random.Random(f"draw:{purpose}:{seed}")


def _largest_remainder(sizes: Mapping[Stratum, int], total: int,
                       rng: random.Random) -> dict[Stratum, int]:
    """``total`` (at least one per stratum, at most their sum) split in proportion to
    ``sizes``, every stratum getting at least one; ties at random."""
    fixed: dict[Stratum, int] = {}
    rest = dict(sizes)
    budget = total
    while True:  # a stratum whose share is below one gets one; the rest share what is left
        pool = sum(rest.values())
        small = [k for k, n in rest.items() if budget * n / pool < 1]
        if not small:
            break
        for k in small:
            fixed[k] = 1
            del rest[k]
        budget -= len(small)
        if not rest:
            return fixed
    pool = sum(rest.values())
    exact = {k: budget * n / pool for k, n in rest.items()}
    out = {k: min(rest[k], math.floor(v)) for k, v in exact.items()}
    ties = {k: rng.random() for k in sorted(rest)}
    order = sorted(rest, key=lambda k: (-(exact[k] - out[k]), ties[k]))
    left = budget - sum(out.values())
    for k in order:  # one more each, largest remainder first, never over a stratum's size
        if left and out[k] < rest[k]:
            out[k] += 1
            left -= 1
    return {**fixed, **out}


def _fewer_than_strata(sizes: Mapping[Stratum, int], total: int, unusual_slice: str,
                       rng: random.Random) -> dict[Stratum, int]:
    """One prompt each for ``total`` strata: one of the unusual slice where present, the
    others drawn without replacement with probability weighted by size."""
    keys = sorted(sizes)
    # Weighted sampling without replacement (Efraimidis-Spirakis keys u^(1/w)).
    score = {k: rng.random() ** (1 / sizes[k]) for k in keys}
    odd = [k for k in keys if k[0] == unusual_slice]
    chosen = [max(odd, key=score.__getitem__)] if odd else []
    others = sorted((k for k in keys if k not in chosen), key=score.__getitem__, reverse=True)
    chosen += others[: total - len(chosen)]
    return {k: 1 if k in chosen else 0 for k in keys}


def draw_prompts(prompts: Sequence[Prompt], budget: int | None, seed: int, purpose: str,
                 unusual_slice: str = "unusual") -> Draw:
    """``budget`` of ``prompts`` (None: all), drawn as the module says."""
    groups: dict[Stratum, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault((p.slice, p.domain), []).append(p)
    sizes = {k: len(v) for k, v in groups.items()}
    rng = _rng(seed, purpose)
    if budget is None or budget >= len(prompts):
        counts, allocation = dict(sizes), ALL
    elif budget >= len(groups):
        counts, allocation = _largest_remainder(sizes, budget, rng), PROPORTIONAL
    else:
        counts, allocation = _fewer_than_strata(sizes, budget, unusual_slice, rng), \
            FEWER_THAN_STRATA
    drawn: set[str] = set()
    for k in sorted(groups):
        drawn.update(p.id for p in rng.sample(groups[k], counts[k]))
    strata = tuple(StratumCount(s, d, sizes[(s, d)], counts[(s, d)]) for s, d in groups)
    return Draw(purpose, seed, budget, len(prompts),
                tuple(p for p in prompts if p.id in drawn), strata, allocation)


def limited(prompts: Sequence[Prompt], limit_per_slice: int | None, limit: int | None,
            seed: int, unusual_slice: str = "unusual") -> Draw:
    """``trace.limit_per_slice`` then ``trace.limit``, each a seeded stratified draw:
    per slice, ``limit_per_slice`` drawn across its domains; then ``limit`` of those. The
    draw returned describes the whole selection (its population: ``prompts``)."""
    kept: Sequence[Prompt] = prompts
    if limit_per_slice is not None:
        by_slice: dict[str, list[Prompt]] = {}
        for p in prompts:
            by_slice.setdefault(p.slice, []).append(p)
        chosen = {p.id for name, ps in by_slice.items()
                  for p in draw_prompts(ps, limit_per_slice, seed, f"trace:{name}",
                                        unusual_slice).prompts}
        kept = [p for p in prompts if p.id in chosen]
    final = draw_prompts(kept, limit, seed, "trace", unusual_slice)
    counts: dict[Stratum, int] = {}
    for p in final.prompts:
        counts[(p.slice, p.domain)] = counts.get((p.slice, p.domain), 0) + 1
    available: dict[Stratum, int] = {}
    for p in prompts:
        available[(p.slice, p.domain)] = available.get((p.slice, p.domain), 0) + 1
    strata = tuple(StratumCount(s, d, n, counts.get((s, d), 0))
                   for (s, d), n in available.items())
    allocation = ALL if len(final.prompts) == len(prompts) else (
        PROPORTIONAL if all(s.drawn for s in strata) else FEWER_THAN_STRATA)
    budget = limit if limit is not None else len(kept)
    return Draw("trace", seed, budget, len(prompts), final.prompts, strata, allocation)
