"""Near-duplicate collapse: prompts whose word sets are nearly the same count once.

Two prompts are near-duplicates when the Jaccard similarity of their sets of words
(normalised as :func:`inputs.words` does: NFKC, case, invisible characters; punctuation
ignored) is at least the threshold: a word changed, added or dropped, or the same words in
another order (a shuffled copy), all stay above it.

Records are taken in source order; each is dropped as a copy of the first *kept* record it
is within the threshold of, and kept otherwise. So every dropped record is within the
threshold of the one it is counted with: a chain of small edits (A~B, B~C, A not ~C) keeps A
and C, never collapses onto its first link.

Candidates come from MinHash signatures (:data:`PERMUTATIONS` independent 64-bit hash
functions: a stable word hash mixed with a per-function seed by the splitmix64 finaliser)
split into bands for locality-sensitive hashing: a pair is a candidate when several bands
agree. The layout (bands, rows, bands to agree) is chosen from the threshold
(:func:`bands_for`) so that a pair 0.02 above it is a candidate with probability at least
:data:`RECALL` (for the default 0.8: 42 bands of 6 rows, 6 to agree: 0.995 at J 0.82,
0.99995 at 0.86), while pairs well below it, such as prompts that share a long template,
rarely meet (3e-6 at J 0.46). Every candidate is then checked exactly, so nothing below
the threshold is ever collapsed. Time is near-linear in the number of prompts on templated
traffic too (benchmarks/near_duplicates.py).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

import numpy as np
from scipy.stats import binom

from .inputs import words

PERMUTATIONS = 256
#: A pair MARGIN above the threshold is a candidate at least this often.
RECALL = 0.995
MARGIN = 0.02
#: Word hashes handled per block when signing (memory: block x PERMUTATIONS x 8 bytes).
_BLOCK = 1 << 14
_U = np.uint64


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection on 64-bit words whose outputs look independent."""
    z = z + _U(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U(27))) * _U(0x94D049BB133111EB)
    out: np.ndarray = z ^ (z >> _U(31))
    return out


def _word_hash(word: str) -> int:
    # A stable hash (Python's is salted per process): the same pool collapses alike anywhere.
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")


def bands_for(threshold: float) -> tuple[int, int, int]:
    """(bands, rows per band, bands that must agree): of the layouts that make a pair
    :data:`MARGIN` above ``threshold`` a candidate with probability at least :data:`RECALL`,
    the one that makes a pair at 0.6 of it (prompts sharing a long template, say) a
    candidate least often. Requiring several agreeing bands, not one, is what keeps
    templated traffic from turning into every pair compared."""
    high, low = min(1.0, threshold + MARGIN), 0.6 * threshold
    best: tuple[float, int, int, int] | None = None
    for rows in range(1, 17):
        bands = PERMUTATIONS // rows
        for hits in range(1, 7):
            if binom.sf(hits - 1, bands, high ** rows) < RECALL:
                continue
            chance = float(binom.sf(hits - 1, bands, low ** rows))
            if best is None or chance < best[0]:
                best = (chance, bands, rows, hits)
    return (PERMUTATIONS, 1, 1) if best is None else best[1:]


def signatures(sets: Sequence[set[str]]) -> np.ndarray:
    """Each set's MinHash signature, (len(sets), PERMUTATIONS) uint64 (zeros for an empty
    set)."""
    seeds = _mix(np.arange(1, PERMUTATIONS + 1, dtype=_U) * _U(0xD1B54A32D192ED03))
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(w, len(vocab)) for w in s] for s in sets]
    hashes = np.fromiter((_word_hash(w) for w in vocab), dtype=_U, count=len(vocab))
    out = np.zeros((len(sets), PERMUTATIONS), dtype=_U)
    start = 0
    while start < len(sets):
        stop, total = start, 0
        while stop < len(sets) and (total == 0 or total + len(ids[stop]) <= _BLOCK):
            total += len(ids[stop])
            stop += 1
        members = [i for i in range(start, stop) if ids[i]]
        if members:
            flat = np.fromiter((w for i in members for w in ids[i]), dtype=np.int64, count=total)
            offsets = np.cumsum([0] + [len(ids[i]) for i in members[:-1]])
            values = _mix(hashes[flat][:, None] ^ seeds[None, :])
            out[members] = np.minimum.reduceat(values, offsets, axis=0)
        start = stop
    return out


def _band_keys(sigs: np.ndarray, bands: int, rows: int) -> list[list[int]]:
    keys = np.empty((len(sigs), bands), dtype=_U)
    for b in range(bands):
        key = np.full(len(sigs), b, dtype=_U)
        for r in range(b * rows, (b + 1) * rows):
            key = _mix(key ^ sigs[:, r])
        keys[:, b] = key
    out: list[list[int]] = keys.tolist()
    return out


def jaccard(a: set[str], b: set[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def near_duplicates(texts: Sequence[str], threshold: float) -> dict[int, int]:
    """Index of each text that duplicates an earlier kept one -> the index of that one
    (within ``threshold`` of it)."""
    sets = [set(words(t)) for t in texts]
    bands, rows, agree = bands_for(threshold)
    keys = _band_keys(signatures(sets), bands, rows)
    buckets: list[dict[int, list[int]]] = [{} for _ in range(bands)]
    found: dict[int, int] = {}
    empty: dict[str, int] = {}
    for j, s in enumerate(sets):
        if not s:  # all punctuation: exact copies collapse
            first = empty.setdefault(texts[j].strip(), j)
            if first != j:
                found[j] = first
            continue
        met: Counter[int] = Counter()
        for band, key in zip(buckets, keys[j], strict=True):
            members = band.get(key)
            if members:
                met.update(members)
        candidates = sorted(k for k, n in met.items() if n >= agree)
        kept = next((k for k in candidates if jaccard(sets[k], s) >= threshold), None)
        if kept is not None:
            found[j] = kept
            continue
        for band, key in zip(buckets, keys[j], strict=True):
            band.setdefault(key, []).append(j)
    return found
