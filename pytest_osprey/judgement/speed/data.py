"""The speed statistics' input: requests arranged in the design's layout
(boots x passes x prompts per side, each prompt's block)."""

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

    NaN marks a request that failed or did not run (yet). ``blocks[i]`` is prompt i's block.
    """

    reference: FloatArray
    candidate: FloatArray
    blocks: IntArray
    prompt_ids: tuple[str, ...]

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

    def upto(self, max_pass: int | None = None, max_boot: int | None = None) -> PairedLatencies:
        """The data an interim look sees: passes < ``max_pass`` and boots < ``max_boot``."""
        ref, cand = self.reference.copy(), self.candidate.copy()
        if max_pass is not None:
            ref[:, max_pass:, :] = np.nan
            cand[:, max_pass:, :] = np.nan
        if max_boot is not None:
            ref, cand = ref[:max_boot], cand[:max_boot]
        return PairedLatencies(ref, cand, self.blocks, self.prompt_ids)


def collect(requests: Iterable[Request], reference: str, candidate: str) -> PairedLatencies:
    """Arrange one level's requests of two conditions into :class:`PairedLatencies`.

    Failed requests count as missing (the completion gate judges failures). A prompt's block
    must be the same in every request (blocks are fixed per level by the plan).
    """
    rows = [r for r in requests if r.condition in (reference, candidate)]
    if not rows:
        raise SpeedError(f"no request of {reference!r} or {candidate!r}")
    ids = sorted({r.prompt_id for r in rows})
    index = {pid: i for i, pid in enumerate(ids)}
    boots = max(r.boot for r in rows) + 1
    passes = max(r.pass_index for r in rows) + 1
    out = {c: np.full((boots, passes, len(ids)), np.nan) for c in (reference, candidate)}
    blocks = np.full(len(ids), -1, dtype=np.int64)
    for r in rows:
        i = index[r.prompt_id]
        if blocks[i] not in (-1, r.block):
            raise SpeedError(f"prompt {r.prompt_id!r} appears in blocks {blocks[i]} and {r.block}")
        blocks[i] = r.block
        if r.ok and r.latency_s is not None:
            cell = out[r.condition][r.boot, r.pass_index, i]
            if not math.isnan(cell):
                raise SpeedError(f"{r.condition}: two requests for prompt {r.prompt_id!r} in "
                                 f"boot {r.boot}, pass {r.pass_index}")
            out[r.condition][r.boot, r.pass_index, i] = r.latency_s
    _, dense = np.unique(blocks, return_inverse=True)
    return PairedLatencies(out[reference], out[candidate], dense.astype(np.int64), tuple(ids))


def onehot(blocks: IntArray) -> FloatArray:
    """Each request's block as a one-hot row (requests x blocks): per-block sums by one
    matrix product."""
    out = np.zeros((blocks.size, int(blocks.max()) + 1))
    out[np.arange(blocks.size), blocks] = 1.0
    return out
