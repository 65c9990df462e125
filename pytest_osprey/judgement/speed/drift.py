"""Drift: each condition against itself between passes and boots (pure numpy/scipy).

A pass that ran slower for every condition cancels in the speedup, yet the speedup measured
then mixes two states of the machine; a pass that ran slower for one condition alone biases
the speedup. The check compares every pass instance (boot x pass) of a series (one condition
at one load level) with the series' other instances, paired by prompt - each series on its own
and all pooled - and flags an unstable environment when one instance is off by more than a
tolerance with significance. The speed gate then judges the paired comparison without each
instance that changed (the drift-adjusted speedup, ``speed_test``): a verdict stands only if
it also holds there. A change both conditions shared cancels in the pairs and leaves the
verdict standing; one that hit one condition alone and bought the verdict does not.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..stats.core import FloatArray
from .data import IntArray
from .variance import PARZEN_MEAN, PARZEN_SQUARE, parzen

CHANGE_SHARE = 1.0
"""A pair's ratio counts as changed in an instance when it moved by more than this share of
the tolerance (robustly: the median over prompts) ..."""
CHANGE_SHARE_LONG = 0.25
"""... and this share where a time unit holds :data:`LONG_UNIT` prompts or more."""
LONG_UNIT = 8
DRIFT_REACH = 4
"""Units the paired-ratio test's serial sum reaches over at x1 (the variance's shortest
reach): one pass of 21 units keeps ~10 effective clusters."""


@dataclass(frozen=True)
class Drift:
    """Each condition against itself between passes/boots ("instances"), paired by prompt.

    The environment's stability: a pass that ran slower for every condition cancels in the
    speedup, yet the speedup measured then mixes two machines' states; one that ran slower
    for one condition alone biases it. The series compared are the conditions of the
    comparison, each against itself (never one condition against another), tested one by one
    (a change of one condition) and pooled (a change of all, with twice the data).

    ``estimate``: the largest change of one instance against the others, as a ratio (1.3:
    that pass ran 30% slower), in ``series`` (a condition's name, or "" for all pooled): the
    median over prompts of its log latency minus the median of the prompt's other instances
    (robust to stalls); CI at ``confidence`` by resampling clusters. ``p_value``: a rank test
    that the instance runs like the others (per prompt, the instance's rank among the
    prompt's instances, averaged per cluster - block within a series - and t-tested over
    clusters; Bonferroni over instances and over the tests: each series and the pool).
    ``unstable`` when the change is both material (beyond ``tolerance``) and significant at
    ``alpha``. ``bias_bound``: how far the change could have moved the speedup (ratio, >= 1):
    the largest change of one instance of the reference against the same instance of the
    candidate, paired by prompt (a change both share cancels; one that hit one condition alone
    does not). A speedup averages its instances, so this is twice the most one instance can
    move it with two instances, more with more; with one series, its own largest change.
    Descriptive: the speed gate judges drift by the paired comparison without each instance
    in ``changed``: those where one condition of a (reference, candidate) pair changed and the
    other did not, or where the pair's ratio moved against its other instances (the same rank
    test; with two instances both, as a contrast of two cannot tell which one moved), see
    ``speed_test``.
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
    bias_bound: float = 1.0
    series: str = ""
    changed: tuple[tuple[int, int], ...] = ()  # (boot, pass) of every instance that changed


@dataclass(frozen=True)
class DriftBatch:
    """The drift tests of campaigns stacked on a leading axis S. Tests ("families") F: 0 pools
    every series, 1.. are the series one by one; R instances."""

    unstable: npt.NDArray[np.bool_]  # (S,)
    log_change: FloatArray  # (F,S,R) robust change of each instance
    p_value: FloatArray  # (F,S,R) Bonferroni-adjusted (instances and tests)
    fired: npt.NDArray[np.bool_]  # (F,S)
    log_bias_bound: FloatArray  # (S,) see ``Drift.bias_bound``
    changed: npt.NDArray[np.bool_]  # (S,R) instances where the comparison changed: _changed
    ratio_changed: npt.NDArray[np.bool_]  # (S,R) of those, where a pair's ratio moved


@dataclass(frozen=True)
class _Series:
    contrasts: FloatArray  # (S,R,n) per-prompt robust contrasts
    ranks: FloatArray  # (S,R,K) per instance, cluster mean centred ranks
    sizes: FloatArray  # (S,R,K) per instance, cluster sizes
    units: IntArray  # (S,R,n) each prompt's cluster in each instance


def within_machines(series: Sequence[FloatArray], machines: IntArray) -> list[FloatArray]:
    """The conditions' latencies ``(..., boots, passes, prompts)`` at one level with each
    machine's offset taken out: ``machines[p]`` is the machine (shard) that ran pass p. Per
    prompt, a machine's mean log latency over its passes and over every condition alike is
    replaced by the prompt's mean over all machines. A slower box is no change of the
    environment during the campaign (pairs never cross machines, so it cancels in the
    speedup); what stays is each pass against the others, and anything that hit one condition
    alone on a machine, which does not cancel."""
    logs = [np.log(lat) for lat in series]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a prompt no machine ran: NaN stays
        stacked = np.stack(logs)  # (conditions, ..., boots, passes, prompts)
        axes = (0, -3, -2)
        overall = np.nanmedian(stacked, axis=axes, keepdims=True)[0]
        shift = np.zeros_like(stacked[0])
        for m in np.unique(machines):
            on = machines == m
            # The median over the machine's cells: one pass that ran slow for one condition
            # (a bias the check is there to catch) barely moves it.
            level = np.nanmedian(stacked[..., on, :], axis=axes, keepdims=True)[0]
            shift[..., on, :] = np.broadcast_to(level - overall, shift[..., on, :].shape)
    return [np.asarray(np.exp(y - shift), dtype=np.float64) for y in logs]


def instance_units(units: IntArray, campaigns: int, instances: int) -> IntArray:
    """``units`` as cluster ids per campaign and instance ``(S, R, n)``, from a ``(prompts,)``
    layout (fixed blocks: the same clusters in every instance), ``(boots, passes, prompts)``
    (each instance's own time units: blocks re-drawn every pass) or that per campaign
    ``(S, boots, passes, prompts)``."""
    if units.ndim == 1:
        return np.broadcast_to(units, (campaigns, instances, units.size))
    if units.ndim == 3:
        units = units[None]
    return np.broadcast_to(units.reshape(units.shape[0], -1, units.shape[-1]),
                           (campaigns, instances, units.shape[-1]))


def _series(levels: Sequence[tuple[FloatArray, IntArray]]) -> list[_Series | None]:
    """Per series: its contrasts, ranks and cluster sizes (None with fewer than two
    instances); prompts lacking an instance are left out (NaN / 0). An instance's ranks are
    clustered by its own time units: a stretch that ran slow moves the ranks of the prompts
    it held in that instance together."""
    out: list[_Series | None] = []
    for lat, blocks in levels:
        y = np.log(lat).reshape(lat.shape[0], -1, lat.shape[-1])  # (S,R,n)
        n_s, n_r, _ = y.shape
        ran = np.isfinite(y).any(axis=(0, 2))  # instances not run (yet) drop out
        y = y[:, ran, :]
        # A cell that did not run has no unit (-1); its prompt is left out below.
        units = np.maximum(instance_units(blocks, n_s, n_r)[:, ran, :], 0)
        n_inst = y.shape[1]
        if n_inst < 2:
            out.append(None)
            continue
        full: npt.NDArray[np.bool_] = np.asarray(np.isfinite(y).all(axis=1))  # (S,n)
        filled = np.where(full[:, None, :], y, 0.0)
        others = np.stack([np.median(np.delete(filled, r, axis=1), axis=1)
                           for r in range(n_inst)], axis=1)
        rank = filled.argsort(axis=1).argsort(axis=1) - (n_inst - 1) / 2
        # Per (campaign, instance, cluster) sums by one bincount over flattened ids.
        k = int(units.max()) + 1
        flat = ((np.arange(n_s)[:, None, None] * n_inst + np.arange(n_inst)[None, :, None]) * k
                + units).ravel()
        mask = np.broadcast_to(full[:, None, :], units.shape)
        size = n_s * n_inst * k
        count = np.asarray(np.bincount(flat, weights=mask.ravel().astype(np.float64),
                                       minlength=size), dtype=np.float64).reshape(n_s, n_inst, k)
        total = np.bincount(flat, weights=np.where(mask, rank, 0.0).ravel(), minlength=size)
        with np.errstate(invalid="ignore", divide="ignore"):
            ranks = total.reshape(n_s, n_inst, k) / count
        out.append(_Series(np.where(full[:, None, :], filled - others, np.nan), ranks, count,
                           np.asarray(units)))
    return out


def _test(parts: Sequence[_Series], serial: bool = False) -> tuple[FloatArray, FloatArray]:
    """(robust log change (S,R), unadjusted two-sided p (S,R)) of the pooled ``parts``;
    ``serial``: units of one request read as a time series (:func:`_serial_sum`)."""
    from scipy import special

    contrasts = np.concatenate([s.contrasts for s in parts], axis=2)
    ranks = np.concatenate([s.ranks for s in parts], axis=2)
    sizes = np.concatenate([s.sizes for s in parts], axis=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a prompt-less series stays NaN
        est = np.nanmedian(contrasts, axis=2)
    present = sizes > 0  # (S,R,G)
    g = present.sum(axis=2).astype(np.float64)  # (S,R)
    u = np.where(present, ranks, 0.0)
    mean = u.sum(axis=2) / np.maximum(g, 1)
    var = np.zeros_like(mean)
    eff = np.zeros_like(mean)  # the clusters' worth of information (df + 1)
    at = 0
    for part in parts:
        width = part.ranks.shape[2]
        sl = slice(at, at + width)
        at += width
        dev = np.where(present[..., sl], u[..., sl] - mean[..., None], 0.0)
        v, e = _serial_sum(dev, present[..., sl], _cells_per_unit(part) if serial else 2.0)
        var += v
        eff += e
    se = np.sqrt(var / np.maximum(g - 1, 1) / np.maximum(g, 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(se > 0, np.abs(mean) / np.where(se > 0, se, 1.0), np.inf)
    p = 2 * special.stdtr(np.maximum(np.minimum(eff, g) - 1, 1), -t)
    return np.asarray(est, dtype=np.float64), np.where(np.isnan(est), 1.0, p)


def _serial_sum(
    dev: FloatArray, present: npt.NDArray[np.bool_], cells: float
) -> tuple[FloatArray, FloatArray]:
    """(sum of squares of one series' centred cluster ranks ``(S,R,K)``, its clusters' worth
    of information), per instance. Where a time unit holds one request of a condition (x1),
    a stall of one server spans several consecutive units and moves their ranks together,
    which a sum of squares reads as independent clusters: the sum is then a Parzen HAC over
    the units in the order they ran, reaching :data:`DRIFT_REACH` units (at most half of
    them), with the fixed-b correction of the variance's serial term; its effective clusters
    ``1 / (0.539 b)`` stand for the units in df. Used by the paired-ratio test only (see
    :func:`_changed`); with several requests a unit (x4: 5-6 units a pass) the plain sum."""
    count = present.sum(axis=2).astype(np.float64)
    plain = (dev**2).sum(axis=2)
    if cells >= 1.5:
        return plain, count
    order = np.argsort(~present, axis=2, kind="stable")  # this instance's units, in time order
    x = np.take_along_axis(dev, order, axis=2)
    span = np.minimum(float(DRIFT_REACH), np.maximum(count / 2, 2.0))
    var = plain.copy()
    for lag in range(1, int(np.ceil(span.max()))):
        var += 2 * parzen(lag / span) * (x[..., lag:] * x[..., :-lag]).sum(axis=2)
    b = np.minimum(span / np.maximum(count, 1.0), 1.0)
    var = np.maximum(var, 0.0) / (1 - PARZEN_MEAN * b)
    return var, np.minimum(1 / (PARZEN_SQUARE * b), count)


def _log_bias(
    every: list[_Series | None], pairs: Sequence[tuple[int, int]], n: int
) -> FloatArray:
    """Per campaign (n,): the largest |median over prompts of the reference's change minus
    the candidate's| of one instance over ``pairs``; without a usable pair, the largest
    |change| of one instance of any one series."""
    usable = [(every[i], every[j]) for i, j in pairs if max(i, j) < len(every)]
    diffs = [a.contrasts - b.contrasts for a, b in usable
             if a is not None and b is not None and a.contrasts.shape == b.contrasts.shape]
    if not diffs:
        diffs = [s.contrasts for s in every if s is not None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an empty pair stays NaN
        meds = [np.abs(np.nan_to_num(np.nanmedian(d, axis=2))).max(axis=1) for d in diffs]
    return np.asarray(np.max(meds, axis=0) if meds else np.zeros(n), dtype=np.float64)


def drift_batch(
    levels: Sequence[tuple[FloatArray, IntArray]], tolerance: float = 0.20, alpha: float = 0.01,
    pairs: Sequence[tuple[int, int]] | None = None,
) -> DriftBatch:
    """The drift tests of campaigns stacked on a leading axis.

    ``levels``: per series (a condition at a load level), its latencies ``(S, boots, passes,
    prompts)`` and its clusters: the prompts' blocks ``(prompts,)``, or each cell's time unit
    ``(boots, passes, prompts)`` (see :func:`instance_units`). A single
    series is tested once (the pool is that series). ``pairs``: (reference, candidate) series
    indices of a comparison, for the bias bound; by default the first two series.
    """
    return _batch(_series(levels), levels[0][0].shape[0], tolerance, alpha, pairs,
                  _paired(levels, pairs))


def _paired(
    levels: Sequence[tuple[FloatArray, IntArray]], pairs: Sequence[tuple[int, int]] | None
) -> list[_Series | None]:
    """Per (reference, candidate) pair of series: the paired ratio as a series of its own
    (reference over candidate latency, per prompt and instance), whose instance changes are
    what moves the speedup."""
    use = [(0, 1)] if pairs is None else pairs
    return _series([(levels[i][0] / levels[j][0], levels[i][1]) for i, j in use
                    if max(i, j) < len(levels) and levels[i][0].shape == levels[j][0].shape])


def _cells_per_unit(one: _Series) -> float:
    """Prompts per time unit of a series (its first campaign's first instance)."""
    units = one.units[0, 0]
    return float(units.size / max(np.unique(units).size, 1))


def _changed(
    every: list[_Series | None], hit: npt.NDArray[np.bool_],
    pairs: Sequence[tuple[int, int]] | None, paired: Sequence[_Series | None], n: int,
    n_inst: int, contrasts_n: int, alpha: float, tolerance: float,
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """(S,R): instances where the comparison changed, and those where a pair's ratio moved
    (the second test alone) - one condition of a pair changed
    there and the other did not (their own tests), or a pair's ratio moved there (the same
    rank test on the ratio, each pair and all pooled, Bonferroni over instances and tests).
    A change both conditions shared does neither. At x1 the ratio test reads a pass's units
    as a time series (:func:`_serial_sum`): stalls of either server, 2-8 requests long, move
    the ratio of consecutive units together; counted as independent they made the ratio
    test alone flag a pass in 36% of campaigns at 10% stall onset (16% read serially). The
    one-condition tests keep unit clustering: a whole pass of one condition slowed (the
    bias this check exists for) moves every unit, and read serially there a reference-only
    slowdown of 30-70% under mixed noise bought 5.3% false keeps (docs/speed-calibration.md)."""
    out = np.zeros((n, n_inst), dtype=bool)
    used = [one for one in paired if one is not None and one.contrasts.shape[1] == n_inst]
    if not used:
        return out, out
    tests = [used] + ([[one] for one in used] if len(used) > 1 else [])
    moved = np.zeros((n, n_inst), dtype=bool)  # the ratio moved by a material amount
    for family in tests:
        e, q = _test(family, serial=True)
        # Where a time unit is a long stretch (>= LONG_UNIT requests), a pair's two
        # stretches lie far apart and a change shared by both conditions does not cancel
        # within it: a smaller move counts.
        long = min(_cells_per_unit(one) for one in family) >= LONG_UNIT
        share = CHANGE_SHARE_LONG if long else CHANGE_SHARE
        material = np.abs(np.nan_to_num(e)) > math.log1p(tolerance) * share
        moved |= material
        out |= material & (np.minimum(q * contrasts_n * len(tests), 1.0) <= alpha)
    ratio = out.copy()
    index = {i: f for f, i in enumerate(i for i, s in enumerate(every) if s is not None)}
    if hit.shape[0] > 1:  # the single-series tests follow the pool (families 1..)
        for i, j in [(0, 1)] if pairs is None else pairs:
            if i in index and j in index:
                out |= (hit[1 + index[i]] ^ hit[1 + index[j]]) & moved
    return out, ratio


def _batch(
    every: list[_Series | None], n: int, tolerance: float, alpha: float,
    pairs: Sequence[tuple[int, int]] | None, paired: Sequence[_Series | None] = (),
) -> DriftBatch:
    parts = [s for s in every if s is not None]
    if not parts:  # fewer than two instances anywhere: nothing to compare
        return DriftBatch(np.zeros(n, dtype=bool), np.full((1, n, 1), np.nan),
                          np.ones((1, n, 1)), np.zeros((1, n), dtype=bool), np.zeros(n),
                          np.zeros((n, 1), dtype=bool), np.zeros((n, 1), dtype=bool))
    families = [parts] + ([[s] for s in parts] if len(parts) > 1 else [])
    tested = [_test(f) for f in families]
    est = np.stack([e for e, _ in tested])  # (F,S,R)
    n_inst = est.shape[2]
    contrasts_n = 1 if n_inst == 2 else n_inst  # two instances: one contrast, seen twice
    p = np.minimum(np.stack([q for _, q in tested]) * contrasts_n * len(families), 1.0)
    material = np.abs(np.nan_to_num(est)) > math.log1p(tolerance)
    hit = material & (p <= alpha)  # (F,S,R)
    fired = np.asarray(hit.any(axis=2), dtype=bool)
    bias = _log_bias(every, [(0, 1)] if pairs is None else pairs, n)
    changed, ratio = _changed(every, hit, pairs, paired, n, n_inst, contrasts_n, alpha,
                              tolerance)
    return DriftBatch(np.asarray(fired.any(axis=0), dtype=bool), est, p, fired, bias,
                      changed, ratio)


def drift_check(
    levels: Sequence[tuple[FloatArray, IntArray]],
    tolerance: float = 0.20,
    alpha: float = 0.01,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    names: Sequence[str] = (),
    pairs: Sequence[tuple[int, int]] | None = None,
) -> Drift | None:
    """Drift over one campaign; None with a single pass instance (nothing to compare).

    ``levels``: per series - the baseline at each load level, and preferably every other
    condition of the comparison too (each against itself) - its ``(boots, passes, prompts)``
    latencies and clusters (blocks, or time units: :func:`instance_units`); ``names``: the
    series' names, for the reason; ``pairs``: (reference, candidate) series of a comparison,
    for the bias bound (the first two by default).

    ``tolerance`` 20%: a pass that runs >20% off the others is material (smaller, slow drift
    cancels between adjacent stretches and is only reported: at 10% a slow drift of +-14%
    vetoed nearly every keep). ``alpha`` 1%: false alarms on stable noise are rare (measured
    in tests/judgement/test_speed_simulation.py).
    """
    n_inst = levels[0][0].shape[0] * levels[0][0].shape[1]
    if n_inst < 2:
        return None
    every = _series([(lat[None], blocks) for lat, blocks in levels])
    present = [i for i, one in enumerate(every) if one is not None]  # the tested series
    if not present:
        return None
    b = _batch(every, 1, tolerance, alpha, pairs,
               _paired([(lat[None], blocks) for lat, blocks in levels], pairs))
    # Report one condition when it alone changed (the largest of those that fired), else
    # the pool: all of them changed, or none.
    size = np.abs(np.nan_to_num(b.log_change[:, 0])).max(axis=1)
    singles = b.fired[1:, 0]
    f = 0
    if b.unstable[0] and singles.any() and not (singles.all() and b.fired[0, 0]):
        f = 1 + int(np.argmax(np.where(singles, size[1:], -1.0)))
    size_r = np.abs(np.nan_to_num(b.log_change[f, 0]))
    r = len(size_r) - 1 - int(np.argmax(size_r[::-1]))  # ties (two passes): the later one
    e = float(b.log_change[f, 0, r])
    if not math.isfinite(e):
        return None
    used = present if f == 0 else [present[f - 1]]
    single = used[0] if len(used) == 1 else None
    who = names[single] if single is not None and single < len(names) else ""
    values = np.concatenate([one.contrasts[0, r] for i in used if (one := every[i])])
    low, high = _cluster_bootstrap_median(
        values, [one.units[0, r] for i in used if (one := every[i])], confidence, resamples,
        seed)
    passes = levels[0][0].shape[1]
    boot, pass_index = divmod(r, passes)
    p_r = float(b.p_value[f, 0, r])
    reason = ""
    if b.unstable[0]:
        subject = who or ("every condition" if single is None else "one condition")
        reason = (f"{subject} ran {math.exp(e) - 1:+.0%} in boot {boot + 1} pass "
                  f"{pass_index + 1} against the other passes (p={p_r:.2g}; "
                  f"tolerance {tolerance:.0%})")
    changed = tuple(divmod(int(i), passes) for i in np.flatnonzero(b.changed[0]))
    return Drift(math.exp(e), math.exp(low), math.exp(high), p_r, (boot, pass_index),
                 tolerance, alpha, bool(b.unstable[0]), reason,
                 math.exp(float(b.log_bias_bound[0])), who, changed)


def _cluster_bootstrap_median(
    values: FloatArray,
    clusters: Sequence[IntArray],
    confidence: float,
    resamples: int,
    seed: int,
) -> tuple[float, float]:
    """Percentile interval of the median of ``values`` (prompts of all levels, in order),
    resampling clusters (each level's time units in the instance) with replacement."""
    ids, offset = [], 0
    for units in clusters:
        ids.append(units + offset)
        offset += int(units.max()) + 1
    cluster = np.concatenate(ids)
    keep = np.isfinite(values)
    values, cluster = values[keep], cluster[keep]
    labels, which = np.unique(cluster, return_inverse=True)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, labels.size, (resamples, labels.size))
    meds = _resampled_medians(values, which, picks)
    tail = (1 - confidence) / 2
    return float(np.quantile(meds, tail)), float(np.quantile(meds, 1 - tail))


def _resampled_medians(values: FloatArray, which: IntArray, picks: IntArray,
                       rows: int = 64) -> FloatArray:
    """Per row of ``picks`` (cluster indices drawn with replacement), the median of the
    values of the clusters drawn, each as often as drawn: exactly np.median of their
    concatenation, as a weighted median over the values sorted once (concatenating per
    resample took most of the judge's time at 10^5 records)."""
    order = np.argsort(values, kind="stable")
    ranked, owner = values[order], which[order]
    out = np.empty(picks.shape[0])
    clusters = int(which.max()) + 1 if which.size else 0
    for k in range(0, picks.shape[0], rows):
        block = picks[k:k + rows]
        # How often each cluster was drawn, hence each value's weight, in rank order.
        n = block.shape[0]
        flat = (np.arange(n)[:, None] * clusters + block).ravel()
        counts = np.bincount(flat, minlength=n * clusters).reshape(n, clusters)
        cum = np.cumsum(counts[:, owner], axis=1)
        total = cum[:, -1]
        lo_rank, hi_rank = (total - 1) // 2, total // 2  # the middle one or two (0-based)
        # Values at or below each middle rank: a search in each (non-decreasing) row.
        lo = np.array([np.searchsorted(c, q, side="right") for c, q in zip(cum, lo_rank,
                                                                            strict=True)])
        hi = np.array([np.searchsorted(c, q, side="right") for c, q in zip(cum, hi_rank,
                                                                            strict=True)])
        out[k:k + rows] = (ranked[lo] + ranked[hi]) / 2
    return out
