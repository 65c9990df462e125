"""A seeded random sample, stratified by domain: never the first N of a source; and the
seeded interleaved order it is written in.

A source's order is rarely random (logs by time, evaluation sets by difficulty), so its
first prompts are not its traffic: each domain gets its share of the sample (largest
remainders), drawn at random within the domain. With an ``unusual_share`` the unusual slice
gets that share of the sample, split over its domains the same way.

The sample is written interleaved, not grouped: each stratum's prompts are spread evenly
over the file (a weighted round-robin of the domains, the slices mixed in the same way), so
the head of the trace holds every domain in about its share.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping, Sequence

Stratum = tuple[str, str]
"""(slice, domain)."""


def allocate(sizes: Mapping[Stratum, int], total: int) -> dict[Stratum, int]:
    """``total`` split over the strata in proportion to their ``sizes`` (largest
    remainders; ties by name), never more than a stratum holds."""
    pool = sum(sizes.values())
    if total >= pool:
        return dict(sizes)
    exact = {k: total * n / pool for k, n in sizes.items()}
    out = {k: math.floor(v) for k, v in exact.items()}
    order = sorted(sizes, key=lambda k: (-(exact[k] - out[k]), k))
    for k in order[:total - sum(out.values())]:
        out[k] += 1
    return out


def stratified_sample(strata: Mapping[Stratum, Sequence[int]], total: int, seed: int,
                      unusual: Collection[Stratum] = (), unusual_share: float | None = None
                      ) -> dict[Stratum, list[int]]:
    """Per stratum, the drawn members (in draw order). ``unusual``: the strata of the
    unusual slice, given ``unusual_share`` of the sample when that is set."""
    sizes = {k: len(v) for k, v in strata.items()}
    if unusual_share is None or not unusual or total >= sum(sizes.values()):
        counts = allocate(sizes, total)
    else:
        odd = {k: n for k, n in sizes.items() if k in unusual}
        core = {k: n for k, n in sizes.items() if k not in unusual}
        want = min(round(total * unusual_share), sum(odd.values()))
        want = max(want, total - sum(core.values()))
        counts = {**allocate(odd, want), **allocate(core, total - want)}
    rng = random.Random(seed)
    # One seeded generator, strata in name order: the same source and seed, the same trace.
    return {k: rng.sample(list(strata[k]), counts[k]) for k in sorted(strata)}


def interleaved(drawn: Mapping[Stratum, Sequence[int]], seed: int) -> list[tuple[Stratum, int]]:
    """The drawn members in a seeded interleaved order: stratum k's j-th member (of n_k) is
    placed at (j + u_k) / n_k, u_k a seeded offset in [0, 1), ties at random. Equal strata
    go round-robin in a seeded order; a larger one comes up proportionally more often."""
    rng = random.Random(f"order:{seed}")
    keyed: list[tuple[float, float, Stratum, int]] = []
    for k in sorted(drawn):
        members, offset = drawn[k], rng.random()
        keyed += [((j + offset) / len(members), rng.random(), k, m)
                  for j, m in enumerate(members)]
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [(k, m) for _, _, k, m in keyed]
