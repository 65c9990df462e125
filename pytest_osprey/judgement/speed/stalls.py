"""Stalls: a run of one condition's requests much slower than their pairs (a GC pause, a
compaction, a noisy neighbour on one server's cores), found and named, batched over campaigns.
The serial term of :mod:`.variance` keeps the speed test valid under them; this names them."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..stats.core import FloatArray
from .data import IntArray, PairedLatencies

STALL_RUNS = range(2, 9)
"""Run lengths (consecutive time units) the stall scan tries."""
STALL_ALPHA = 0.01
"""A run is named a stall at this Bonferroni-adjusted p (positions x run lengths) ..."""
STALL_MIN = 1.2
"""... and when that condition ran at least this many times slower than its pairs there."""
STALL_CLIP = 2.0
"""Unit scores are winsorised at this many robust SDs before runs are summed."""
STALL_SPREAD = 0.959
"""SD of a standard normal winsorised at :data:`STALL_CLIP`."""
STALL_EXTEND = 1.0
"""A named run is extended over each neighbouring unit that ran at least this many robust
SDs slow on the same side: the scan finds the most marked 2-8 units, a stall can last
longer, and its extent is what the serial term must reach over."""


@dataclass(frozen=True)
class StallBatch:
    """The stall scan of campaigns stacked on a leading axis (see :func:`stall_scan`)."""

    score: FloatArray  # (S,) largest |robust z| of a run
    p_value: FloatArray  # (S,) Bonferroni over positions and run lengths
    side: IntArray  # (S,) 0: the reference ran slow, 1: the candidate
    first: IntArray  # (S,) the run's first time unit (0-based, in the order they ran)
    length: IntArray  # (S,) time units in the run, extended over its slow neighbours
    size: FloatArray  # (S,) how many times slower the slow side ran than its pairs there
    peak: FloatArray  # (S,) the same over the 2-8 units the scan found (what names it)

    @property
    def found(self) -> npt.NDArray[np.bool_]:
        return np.asarray((self.p_value <= STALL_ALPHA) & (self.peak >= STALL_MIN))


def stall_scan(reference: FloatArray, candidate: FloatArray, units: IntArray) -> StallBatch:
    """The run of consecutive time units over which one condition ran most markedly slower
    than its paired neighbours, per campaign ``(S, boots, passes, prompts)``.

    Each cell's paired log ratio less the median of its prompt's other passes (the prompt's
    and the drafter's stable effects out) is averaged per time unit; in the order the units
    ran, the unit values in robust SDs (MAD), winsorised at :data:`STALL_CLIP`, are summed
    over every run of 2-8 units and scaled by a winsorised normal's spread. Shared drift
    cancels in the pairs; a stall of one server does not: it pushes a run of the ratio one
    way. The score's p is Bonferroni over positions and lengths.
    """
    from scipy import stats

    n_sims = reference.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.log(reference) - np.log(candidate)
    flat_d = d.reshape(n_sims, -1, d.shape[-1])  # (S, instances, prompts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # Each cell against its prompt's other instances (not itself: with 4 passes a median
        # that includes the cell would halve its residual).
        others = np.stack([np.nanmedian(np.delete(flat_d, r, axis=1), axis=1)
                           for r in range(flat_d.shape[1])], axis=1)
        resid = (flat_d - others).reshape(d.shape)
    u = np.broadcast_to(units, d.shape)
    ok = np.isfinite(resid) & (u >= 0)
    n_units = int(u.max()) + 1 if u.size else 1
    flat = (np.arange(n_sims)[:, None, None, None] * n_units + u)[ok]
    size = n_sims * n_units
    sums = np.bincount(flat, weights=resid[ok], minlength=size).reshape(n_sims, n_units)
    counts = np.bincount(flat, minlength=size).reshape(n_sims, n_units)
    seen = counts > 0
    order = np.argsort(~seen, axis=1, kind="stable")  # units with data first, in time order
    x = np.take_along_axis(np.where(seen, sums / np.maximum(counts, 1), 0.0), order, axis=1)
    t_len = seen.sum(axis=1)
    live = np.arange(n_units)[None, :] < t_len[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        xm = np.where(live, x, np.nan)
        centre = np.nanmedian(xm, axis=1)
        scale = 1.4826 * np.nanmedian(np.abs(xm - centre[:, None]), axis=1)
    scale = np.where(scale > 0, scale, np.inf)
    # Scores winsorised at STALL_CLIP robust SDs: one slow request (a heavy tail) cannot make
    # a run; most of the run must be slow. Their spread is that of a clipped normal (what
    # the MAD standardises to): estimated from the data it would count the stalls in.
    score = np.where(live, np.clip((x - centre[:, None]) / scale[:, None], -STALL_CLIP,
                                   STALL_CLIP), 0.0)
    spread = np.full(n_sims, STALL_SPREAD)
    cum = np.concatenate([np.zeros((n_sims, 1)), np.cumsum(score, axis=1)], axis=1)
    raw = np.concatenate([np.zeros((n_sims, 1)), np.cumsum(np.where(live, x, 0.0), axis=1)],
                         axis=1)
    best = np.zeros(n_sims)
    first = np.zeros(n_sims, dtype=np.int64)
    length = np.zeros(n_sims, dtype=np.int64)
    mean = np.zeros(n_sims)
    for k in STALL_RUNS:
        if k > n_units:
            break
        run = cum[:, k:] - cum[:, :-k]  # (S, n_units - k + 1): runs starting at t
        fits = (np.arange(run.shape[1])[None, :] + k) <= t_len[:, None]
        z = np.where(fits, np.abs(run) / (spread[:, None] * math.sqrt(k)), 0.0)
        at = z.argmax(axis=1)
        top = z[np.arange(n_sims), at]
        better = top > best
        best = np.where(better, top, best)
        first = np.where(better, at, first)
        length = np.where(better, k, length)
        level = (raw[:, k:] - raw[:, :-k])[np.arange(n_sims), at] / k - centre
        mean = np.where(better, level, mean)
    tests = np.maximum(t_len, 1) * len(STALL_RUNS)
    p = np.minimum(1.0, 2 * tests * stats.norm.sf(best))
    side = np.where(mean >= 0, 0, 1).astype(np.int64)
    first, length = _extent(score * np.where(mean >= 0, 1.0, -1.0)[:, None], first, length,
                            t_len)
    rows = np.arange(n_sims)
    level = (raw[rows, first + length] - raw[rows, first]) / np.maximum(length, 1) - centre
    return StallBatch(best, p, side, first, length, np.exp(np.abs(level)), np.exp(np.abs(mean)))


def _extent(slow: FloatArray, first: IntArray, length: IntArray, t_len: IntArray
            ) -> tuple[IntArray, IntArray]:
    """The run ``[first, first + length)`` grown over each neighbouring unit whose score
    ``slow`` (robust SDs, positive on the stalled side) is at least :data:`STALL_EXTEND`."""
    rows = np.arange(slow.shape[0])
    lo, hi = first.copy(), first + length  # [lo, hi)
    going = np.ones(slow.shape[0], dtype=bool)
    while going.any():
        nxt = np.maximum(lo - 1, 0)
        going &= (lo > 0) & (slow[rows, nxt] >= STALL_EXTEND)
        lo = np.where(going, lo - 1, lo)
    going[:] = True
    while going.any():
        nxt = np.minimum(hi, slow.shape[1] - 1)
        going &= (hi < t_len) & (slow[rows, nxt] >= STALL_EXTEND)
        hi = np.where(going, hi + 1, hi)
    return lo, hi - lo


@dataclass(frozen=True)
class Stall:
    """A run of one condition's requests that ran markedly slower than its paired neighbours
    (a GC pause, a compaction, a noisy neighbour on one server). Named, not removed: the
    variance's serial term counts such a run as one event, not as independent draws.

    ``side``: "reference" or "candidate"; ``first_unit``/``last_unit``: the run's time units
    (1-based, in the order they ran), ``passes``: the (boot, pass) it started and ended in
    (1-based); ``size``: how many times slower that side ran than its pairs there;
    ``score``: the run's robust z; ``p_value``: Bonferroni over the runs scanned;
    ``reach``: the time units the variance's serial term reaches over (None where it is not
    on: units of 8 requests or more).
    """

    side: Literal["reference", "candidate"]
    first_unit: int
    last_unit: int
    passes: tuple[tuple[int, int], tuple[int, int]]
    size: float
    score: float
    p_value: float
    reach: int | None = None

    @property
    def units(self) -> int:
        return self.last_unit - self.first_unit + 1

    @property
    def outlasts_reach(self) -> bool:
        """Longer than the serial term reaches: the variance was calibrated against stalls
        within its reach (2-8 requests at x1); one this long is a few independent events
        counted as more, so the interval may be too narrow."""
        return self.reach is not None and self.units > self.reach

    def text(self, reference: str = "reference", candidate: str = "candidate") -> str:
        who = reference if self.side == "reference" else candidate
        (b0, p0), (b1, p1) = self.passes
        where = f"pass {p0}" if (b0, p0) == (b1, p1) else f"passes {p0}-{p1}"
        if b0 != 1 or b1 != 1:
            where = f"boot {b0} pass {p0} to boot {b1} pass {p1}"
        head = (f"{who} stalled: {self.units} consecutive time units ({where}) ran "
                f"{self.size:.2f}x slower than their pairs (robust z {self.score:.1f}, "
                f"p={self.p_value:.2g})")
        if self.outlasts_reach:
            return (f"{head}; longer than the {self.reach} units the serial term reaches, so "
                    f"the interval may be too narrow: more passes, or a re-run on a steadier "
                    f"machine, would settle it")
        return f"{head}; counted once by the serial term"


def detect_stall(data: PairedLatencies, reach: int | None = None) -> Stall | None:
    """The stall :func:`stall_scan` finds in ``data``, or None; ``reach``: the serial term's
    reach in units (None: not on)."""
    units = data.time_units
    scan = stall_scan(data.reference[None], data.candidate[None], units[None])
    if not scan.found[0]:
        return None
    ran = np.unique(units[units >= 0])
    lo = int(ran[int(scan.first[0])])
    hi = int(ran[int(scan.first[0]) + int(scan.length[0]) - 1])
    cells = [np.argwhere(units == k)[0] for k in (lo, hi)]
    spans = ((int(cells[0][0]) + 1, int(cells[0][1]) + 1),
             (int(cells[1][0]) + 1, int(cells[1][1]) + 1))
    side: Literal["reference", "candidate"] = (
        "reference" if int(scan.side[0]) == 0 else "candidate")
    return Stall(side, int(scan.first[0]) + 1, int(scan.first[0]) + int(scan.length[0]), spans,
                 float(scan.size[0]), float(scan.score[0]), float(scan.p_value[0]), reach)


# --------------------------------------------------------------------------- results
