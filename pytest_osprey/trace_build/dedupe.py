"""Near-duplicate collapse: prompts whose word sets are nearly the same count once.

Two prompts are near-duplicates when the Jaccard similarity of their sets of words
(lowercased, punctuation ignored) is at least the threshold: a word changed, added or
dropped, or the same words in another order (a shuffled copy), all stay above it. Candidate
pairs come from MinHash signatures banded for locality-sensitive hashing, so a pool of many
thousand records is not compared pair by pair; every candidate pair is then checked exactly.
The first record of each group (in source order) is kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from ..preflight.held_out import words

_PRIME = (1 << 61) - 1
PERMUTATIONS = 64
BANDS = 32  # 2 rows a band: pairs from Jaccard 0.2 up are nearly always candidates


def _word_hashes(tokens: set[str]) -> np.ndarray:
    # A stable hash (Python's is salted per process).
    return np.array([int.from_bytes(hashlib.blake2b(t.encode(), digest_size=7).digest(), "big")
                     for t in tokens], dtype=np.uint64)


def _signatures(sets: Sequence[set[str]]) -> np.ndarray:
    rng = np.random.default_rng(0)  # fixed: a pool collapses alike whatever the sample's seed
    a = rng.integers(1, 1 << 31, PERMUTATIONS, dtype=np.uint64)
    b = rng.integers(0, 1 << 31, PERMUTATIONS, dtype=np.uint64)
    out = np.zeros((len(sets), PERMUTATIONS), dtype=np.uint64)
    for i, s in enumerate(sets):
        if s:
            h = _word_hashes(s)[:, None] % np.uint64(1 << 31)
            out[i] = ((h * a + b) % np.uint64(_PRIME)).min(axis=0)
    return out


def jaccard(a: set[str], b: set[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def near_duplicates(texts: Sequence[str], threshold: float) -> dict[int, int]:
    """Index of each text that duplicates an earlier one -> the index of the kept one."""
    sets = [set(words(t)) for t in texts]
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    sigs = _signatures(sets)
    rows = PERMUTATIONS // BANDS
    for band in range(BANDS):
        buckets: dict[bytes, list[int]] = {}
        for i in range(len(texts)):
            if sets[i]:
                buckets.setdefault(sigs[i, band * rows:(band + 1) * rows].tobytes(), []).append(i)
        for members in buckets.values():
            kept: list[int] = []  # a bucket's distinct texts so far
            for j in members:
                for k in kept:
                    if jaccard(sets[k], sets[j]) >= threshold:
                        rk, rj = root(k), root(j)
                        parent[max(rk, rj)] = min(rk, rj)
                        break
                else:
                    kept.append(j)
    # Exact copies of an empty word set (all punctuation) collapse too.
    empty: dict[str, int] = {}
    for i, t in enumerate(texts):
        if not sets[i]:
            parent[i] = empty.setdefault(t.strip(), i)
    return {i: root(i) for i in range(len(texts)) if root(i) != i}
