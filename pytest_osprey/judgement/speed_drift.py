"""Drift: each condition against itself between passes and boots (pure numpy/scipy).

A pass that ran slower for every condition cancels in the speedup, yet the speedup measured
then mixes two states of the machine. The check compares every pass instance (boot x pass)
of a series (one condition at one load level) with the series' other instances, paired by
prompt, and flags an unstable environment when one instance is off by more than a tolerance
with significance; the speed gate then refuses to KEEP (see ``speed.speed_test``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .speed import FloatArray, IntArray, _onehot


@dataclass(frozen=True)
class Drift:
    """Each condition against itself between passes/boots ("instances"), paired by prompt.

    The environment's stability: a pass that ran slower for every condition cancels in the
    speedup, yet the speedup measured then mixes two machines' states. The series compared
    are the baseline's (and, for power, the other conditions' of the comparison: each
    against itself, never one condition against another).

    ``estimate``: the largest change of one instance against the others, as a ratio (1.3:
    that pass ran 30% slower): the median over prompts and series of its log latency minus
    the median of the prompt's other instances (robust to stalls); CI at ``confidence`` by
    resampling clusters. ``p_value``: a rank test that the instance runs like the others
    (per prompt, the instance's rank among the prompt's instances, averaged per cluster -
    block within a series - and t-tested over clusters; Bonferroni over instances).
    ``unstable`` when the change is both material (beyond ``tolerance``) and significant at
    ``alpha``.
    """

    estimate: float
    ci_low: float
    ci_high: float
    p_value: float
    instance: tuple[int, int]  # (boot, pass) of the largest change
    tolerance: float
    alpha: float
    unstable: bool
    reason: str


def _drift_parts(
    levels: Sequence[tuple[FloatArray, IntArray]]
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(per-prompt robust contrasts (S,R,N), cluster mean centred ranks (S,R,G), cluster
    sizes (S,G)) over all levels; prompts lacking an instance are left out (NaN / 0)."""
    contrasts: list[FloatArray] = []
    ranks: list[FloatArray] = []
    sizes: list[FloatArray] = []
    for lat, blocks in levels:
        y = np.log(lat).reshape(lat.shape[0], -1, lat.shape[-1])  # (S,R,n)
        y = y[:, np.isfinite(y).any(axis=(0, 2)), :]  # instances not run (yet) drop out
        n_inst = y.shape[1]
        if n_inst < 2:
            continue
        full: npt.NDArray[np.bool_] = np.asarray(np.isfinite(y).all(axis=1))  # (S,n)
        filled = np.where(full[:, None, :], y, 0.0)
        others = np.stack([np.median(np.delete(filled, r, axis=1), axis=1)
                           for r in range(n_inst)], axis=1)
        contrasts.append(np.where(full[:, None, :], filled - others, np.nan))
        rank = filled.argsort(axis=1).argsort(axis=1) - (n_inst - 1) / 2
        onehot = _onehot(blocks)
        count = full.astype(np.float64) @ onehot  # (S,K)
        with np.errstate(invalid="ignore", divide="ignore"):
            ranks.append(np.where(full[:, None, :], rank, 0.0) @ onehot / count[:, None, :])
        sizes.append(count)
    return (np.concatenate(contrasts, axis=2), np.concatenate(ranks, axis=2),
            np.concatenate(sizes, axis=1))


def drift_batch(
    levels: Sequence[tuple[FloatArray, IntArray]], tolerance: float = 0.20, alpha: float = 0.01
) -> tuple[npt.NDArray[np.bool_], FloatArray, FloatArray, IntArray]:
    """(unstable, robust log change per instance (S,R), Bonferroni p per instance (S,R),
    index of the largest change) for campaigns stacked on a leading axis.

    ``levels``: per series (a condition at a load level), its latencies ``(S, boots, passes,
    prompts)`` and the prompts' blocks; clusters are the blocks of each series.
    """
    from scipy import special

    if not any(np.isfinite(lat).any(axis=(0, 3)).sum() >= 2 for lat, _ in levels):
        n = levels[0][0].shape[0]  # fewer than two instances anywhere: nothing to compare
        return (np.zeros(n, dtype=bool), np.full((n, 1), np.nan), np.ones((n, 1)),
                np.zeros(n, dtype=np.int64))
    contrasts, ranks, sizes = _drift_parts(levels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a prompt-less series stays NaN
        est = np.nanmedian(contrasts, axis=2)
    present = sizes > 0  # (S,G)
    g = present.sum(axis=1).astype(np.float64)[:, None]  # (S,1)
    u = np.where(present[:, None, :], ranks, 0.0)
    mean = u.sum(axis=2) / np.maximum(g, 1)
    var = np.where(present[:, None, :], (u - mean[..., None]) ** 2, 0.0).sum(axis=2)
    se = np.sqrt(var / np.maximum(g - 1, 1) / np.maximum(g, 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(se > 0, np.abs(mean) / np.where(se > 0, se, 1.0), np.inf)
    n_inst = est.shape[1]
    contrasts_n = 1 if n_inst == 2 else n_inst  # two instances: one contrast, seen twice
    p = np.minimum(2 * special.stdtr(np.maximum(g - 1, 1), -t) * contrasts_n, 1.0)
    p = np.where(np.isnan(est), 1.0, p)
    material = np.abs(np.nan_to_num(est)) > math.log1p(tolerance)
    unstable = np.asarray((material & (p <= alpha)).any(axis=1), dtype=bool)
    worst = np.asarray(np.argmax(np.abs(np.nan_to_num(est)), axis=1), dtype=np.int64)
    return unstable, np.asarray(est, dtype=np.float64), np.asarray(p, dtype=np.float64), worst


def drift_check(
    levels: Sequence[tuple[FloatArray, IntArray]],
    tolerance: float = 0.20,
    alpha: float = 0.01,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Drift | None:
    """Drift over one campaign; None with a single pass instance (nothing to compare).

    ``levels``: per series - the baseline at each load level, and preferably every other
    condition of the comparison too (each against itself: twice the data, so a pass slowed
    30-70% is caught) - its ``(boots, passes, prompts)`` latencies and blocks.

    ``tolerance`` 20%: a pass that runs >20% off the others is material (smaller, slow drift
    cancels between adjacent stretches and is only reported: at 10% a slow drift of +-14%
    vetoed nearly every keep). ``alpha`` 1%: false
    alarms on stable noise are rare (measured in tests/test_speed_simulation.py).
    """
    batched = [(lat[None], blocks) for lat, blocks in levels]
    n_inst = levels[0][0].shape[0] * levels[0][0].shape[1]
    if n_inst < 2:
        return None
    unstable, est, p, worst = drift_batch(batched, tolerance, alpha)
    r = int(worst[0])
    e = float(est[0, r])
    if not math.isfinite(e):
        return None
    contrasts, _, _ = _drift_parts(batched)
    low, high = _cluster_bootstrap_median(contrasts[0, r], levels, confidence, resamples, seed)
    passes = levels[0][0].shape[1]
    boot, pass_index = divmod(r, passes)
    reason = ""
    if unstable[0]:
        reason = (f"the baseline ran {math.exp(e) - 1:+.0%} in boot {boot + 1} pass "
                  f"{pass_index + 1} against its other passes (p={float(p[0, r]):.2g}; "
                  f"tolerance {tolerance:.0%})")
    return Drift(math.exp(e), math.exp(low), math.exp(high), float(p[0, r]),
                 (boot, pass_index), tolerance, alpha, bool(unstable[0]), reason)


def _cluster_bootstrap_median(
    values: FloatArray,
    levels: Sequence[tuple[FloatArray, IntArray]],
    confidence: float,
    resamples: int,
    seed: int,
) -> tuple[float, float]:
    """Percentile interval of the median of ``values`` (prompts of all levels, in order),
    resampling clusters (blocks within a level) with replacement."""
    ids, offset = [], 0
    for k, (_, blocks) in enumerate(levels):
        ids.append(blocks + offset)
        offset += int(blocks.max()) + 1
        del k
    cluster = np.concatenate(ids)
    keep = np.isfinite(values)
    values, cluster = values[keep], cluster[keep]
    labels = np.unique(cluster)
    members = [values[cluster == c] for c in labels]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, labels.size, (resamples, labels.size))
    meds = np.array([np.median(np.concatenate([members[j] for j in row])) for row in picks])
    tail = (1 - confidence) / 2
    return float(np.quantile(meds, tail)), float(np.quantile(meds, 1 - tail))
