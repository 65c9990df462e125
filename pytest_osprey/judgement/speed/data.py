"""The speed statistics' input: requests arranged in the design's layout
(boots x passes x prompts per side, each cell's time unit)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..stats.core import FloatArray

IntArray = npt.NDArray[np.int64]


class SpeedError(ValueError):
    """Data the speed statistics cannot judge (no pairs, bad latencies, wrong shapes)."""



@dataclass(frozen=True)
class Request:
    """One recorded request, as the speed statistics need it (one load level)."""

    condition: str
    prompt_id: str
    latency_s: float | None
    ok: bool
    boot: int
    pass_index: int
    block: int
    stretch: int
    start_s: float = 0.0


@dataclass(frozen=True)
class PairedLatencies:
    """One level's latencies in the design's layout: ``(boots, passes, prompts)`` per side.

    NaN marks a request that failed or did not run (yet); a cell holding several copies of
    a prompt (a stretch that cycled the trace) holds their geometric mean. ``units`` gives
    each cell's time unit (one block in one pass of one boot: the stretches of both
    conditions that replayed it), dense from 0 in the order the units ran (the variance's
    serial term reads them as a time series); by default ``(boot, pass, blocks[i])``, the
    layout of fixed blocks. ``blocks[i]`` is prompt i's block in its first pass (the drift
    check's clusters).
    """

    reference: FloatArray
    candidate: FloatArray
    blocks: IntArray
    prompt_ids: tuple[str, ...]
    units: IntArray | None = None

    def __post_init__(self) -> None:
        if self.reference.shape != self.candidate.shape or self.reference.ndim != 3:
            raise SpeedError(f"reference {self.reference.shape} and candidate "
                             f"{self.candidate.shape} must share a (boots, passes, prompts) shape")
        if self.blocks.shape != (self.reference.shape[2],):
            raise SpeedError("blocks must give one block index per prompt")
        for side in (self.reference, self.candidate):
            bad = np.isfinite(side) & ~(side > 0)
            if bad.any() or np.isinf(side).any():
                raise SpeedError("latencies must be finite and > 0 seconds (NaN: missing)")
        if self.units is None:
            object.__setattr__(self, "units", fixed_units(self.reference.shape, self.blocks))
        elif self.units.shape != self.reference.shape:
            raise SpeedError("units must give one time unit per (boot, pass, prompt) cell")

    @property
    def time_units(self) -> IntArray:
        """``units``, always set (the dataclass fills the default in)."""
        assert self.units is not None
        return self.units

    def upto(self, max_pass: int | None = None, max_boot: int | None = None) -> PairedLatencies:
        """The data an interim look sees: passes < ``max_pass`` and boots < ``max_boot``."""
        ref, cand = self.reference.copy(), self.candidate.copy()
        if max_pass is not None:
            ref[:, max_pass:, :] = np.nan
            cand[:, max_pass:, :] = np.nan
        if max_boot is not None:
            ref, cand = ref[:max_boot], cand[:max_boot]
        units = self.time_units[:max_boot] if max_boot is not None else self.time_units
        return PairedLatencies(ref, cand, self.blocks, self.prompt_ids, units)


def fixed_units(shape: tuple[int, ...], blocks: IntArray) -> IntArray:
    """Time units of a fixed-block layout: one per (boot, pass, block)."""
    boots, passes, _ = shape
    k = int(blocks.max()) + 1 if blocks.size else 1
    bp = np.arange(boots * passes, dtype=np.int64).reshape(boots, passes, 1)
    return np.asarray(bp * k + blocks[None, None, :], dtype=np.int64)


def collect(requests: Iterable[Request], reference: str, candidate: str) -> PairedLatencies:
    """Arrange one level's requests of two conditions into :class:`PairedLatencies`.

    Failed requests count as missing (the completion gate judges failures). Several copies
    of a prompt in one (boot, pass) - a block that cycled the trace - are combined into one
    cell by the mean of their logs; they must share a block (the plan keeps a prompt's copies
    in one block per pass). A cell's time unit is its (boot, pass, block).
    """
    rows = [r for r in requests if r.condition in (reference, candidate)]
    if not rows:
        raise SpeedError(f"no request of {reference!r} or {candidate!r}")
    ids = sorted({r.prompt_id for r in rows})
    index = {pid: i for i, pid in enumerate(ids)}
    boots = max(r.boot for r in rows) + 1
    passes = max(r.pass_index for r in rows) + 1
    shape = (boots, passes, len(ids))
    logs = {c: np.zeros(shape) for c in (reference, candidate)}
    counts = {c: np.zeros(shape) for c in (reference, candidate)}
    block_at = np.full(shape, -1, dtype=np.int64)
    first: dict[int, tuple[int, int, int]] = {}
    for r in rows:
        i = index[r.prompt_id]
        cell = (r.boot, r.pass_index, i)
        if block_at[cell] not in (-1, r.block):
            raise SpeedError(f"prompt {r.prompt_id!r} appears in blocks {block_at[cell]} and "
                             f"{r.block} in boot {r.boot}, pass {r.pass_index}")
        block_at[cell] = r.block
        first[i] = min(first.get(i, (r.boot, r.pass_index, r.block)),
                       (r.boot, r.pass_index, r.block))
        if r.ok and r.latency_s is not None:
            if not (r.latency_s > 0 and math.isfinite(r.latency_s)):
                raise SpeedError(f"{r.condition}: latency {r.latency_s} of prompt "
                                 f"{r.prompt_id!r} is not a positive number of seconds")
            logs[r.condition][cell] += math.log(r.latency_s)
            counts[r.condition][cell] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {c: np.where(counts[c] > 0, np.exp(logs[c] / counts[c]), np.nan) for c in logs}
    _, dense_blocks = np.unique([first[i][2] for i in range(len(ids))], return_inverse=True)
    # Time units: (boot, pass, block), numbered densely in the order they ran (their first
    # stretch, then start time: a pass replays its blocks in a shuffled order, and the serial
    # term of the variance reads the units as a time series); cells that never ran get -1.
    width = int(block_at.max()) + 1
    keys = np.where(block_at >= 0, (np.arange(boots * passes).reshape(boots, passes, 1)
                                    * width + block_at), -1)
    ran: dict[int, tuple[int, float]] = {}
    for r in rows:
        key = (r.boot * passes + r.pass_index) * width + r.block
        ran[key] = min(ran.get(key, (r.stretch, r.start_s)), (r.stretch, r.start_s))
    known = np.unique(keys[keys >= 0])
    order = sorted(known.tolist(), key=lambda k: (ran.get(k, (0, 0.0)), k))
    rank = np.empty(known.size, dtype=np.int64)
    rank[np.searchsorted(known, order)] = np.arange(known.size)
    units = np.where(keys >= 0, rank[np.searchsorted(known, np.maximum(keys, 0))],
                     -1).astype(np.int64)
    return PairedLatencies(out[reference], out[candidate],
                           np.asarray(dense_blocks, dtype=np.int64), tuple(ids), units)
