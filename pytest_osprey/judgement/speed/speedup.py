"""Speed statistics that count the time structure of a campaign (pure numpy/scipy).

Design (see :mod:`pytest_osprey.campaign.schedule`): prompts are grouped into blocks; within
a boot, every pass replays each block once per condition as short adjacent stretches. Noise
shared in time (stretch shocks, correlated noise within a stretch, stalls hitting every
request in flight) therefore stays inside one **cluster** = one block within one boot, with
all its passes. The deciding test of each metric is a cluster-robust t-test of its log
speedup against ``log(threshold)``:

* ``per_prompt``: the mean over prompts of the per-prompt log ratio (mean log reference
  latency minus mean log candidate latency over passes) - a geometric-mean speedup that
  counts every prompt equally;
* ``total_time``: the log ratio of summed latencies (per prompt, its mean latency over
  passes) - the GPU time saved, where long prompts weigh more.

Each metric is written as a sum of per-cluster influence values (exact for ``per_prompt``,
first-order for the ratio of sums); their CR1 variance with ``df = clusters - 1`` is the
cluster-robust covariance of an intercept-only regression (statsmodels' ``cov_type="cluster"``
gives the same number). With b >= 2 boots per condition, clusters are crossed blocks x boots:
a between-boot component is estimated by the method of moments from the two-way table of
influence values and added, with Satterthwaite degrees of freedom. With one boot a persistent
per-boot offset cannot be told from the drafter's effect: the result says so.

Arrays here are batched: a leading axis runs over independent campaigns, so the simulation
(``testkit/speed_sim.py``) runs thousands of campaigns through the very same code.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..stats.core import FloatArray, StatOutcome
from .data import (
    IntArray,
    PairedLatencies,
    Request,
    SpeedError,
    collect,
    onehot,
)
from .drift import Drift

__all__ = ["METRICS", "FloatArray", "IntArray", "Metric", "PairedLatencies", "Request",
           "SpeedError", "SpeedResult", "collect", "speed_test"]

Metric = Literal["per_prompt", "total_time"]
HeldBack = Literal["one_block", "unstable_environment"]
METRICS: tuple[Metric, ...] = ("per_prompt", "total_time")
DEFAULT_METRIC: Metric = "per_prompt"

_LOG_TOL = 1e-9  # a bound this close to the threshold is not beyond it
DF_QUANTILE = 0.25  # boots: df evaluated at the boot mean square / its chi2 lower quartile


# --------------------------------------------------------------------------- batch core


@dataclass(frozen=True)
class Batch:
    """Per-campaign arrays (leading axis: campaigns) of one metric's log estimate.

    ``var``: variance of the log estimate, blocks (boots averaged, CR1) plus the between-boot
    component ``boot_var`` (0 with one boot), with ``df``. ``between`` and ``within`` are
    variance components per cluster in the estimate's units: stable block-to-block variation
    and the variation of one pass between passes (for advice and the time share).
    """

    log_estimate: FloatArray
    var: FloatArray
    df: FloatArray
    boot_var: FloatArray
    between: FloatArray
    within: FloatArray
    clusters: FloatArray
    boots: int
    passes: FloatArray  # mean passes per cluster with data


def _nanmean(x: FloatArray, axis: int) -> FloatArray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices stay NaN
        return np.asarray(np.nanmean(x, axis=axis), dtype=np.float64)


@dataclass(frozen=True)
class _Cells:
    """Cell (boot x block) sums: per_prompt: (sum of log ratios, prompt count); total_time:
    (sum of reference means, sum of candidate means). ``*_p``: the same per pass."""

    first: FloatArray  # (S,B,K)
    second: FloatArray
    first_p: FloatArray  # (S,B,P,K)
    second_p: FloatArray
    present: npt.NDArray[np.bool_]  # (S,K): the block has paired data in some boot
    cells: FloatArray  # (S,): boots x present blocks


def _cells(ref: FloatArray, cand: FloatArray, per_block: FloatArray, metric: Metric) -> _Cells:
    mean_ref, mean_cand = _nanmean(ref, 2), _nanmean(cand, 2)  # (S,B,n) over passes
    ok = np.isfinite(mean_ref) & np.isfinite(mean_cand)
    ok_p = np.isfinite(ref) & np.isfinite(cand)
    count = ok.astype(np.float64) @ per_block
    present = count.sum(axis=1) > 0
    cells = np.maximum(present.sum(axis=1), 1) * ref.shape[1]
    if metric == "per_prompt":
        la, lb = np.log(ref), np.log(cand)
        d = np.where(ok, _nanmean(la, 2) - _nanmean(lb, 2), 0.0)
        return _Cells(d @ per_block, count, np.where(ok_p, la - lb, 0.0) @ per_block,
                      ok_p.astype(np.float64) @ per_block, present, cells)
    return _Cells(np.where(ok, mean_ref, 0.0) @ per_block,
                  np.where(ok, mean_cand, 0.0) @ per_block,
                  np.where(ok_p, ref, 0.0) @ per_block, np.where(ok_p, cand, 0.0) @ per_block,
                  present, cells)


def _mean_variance(
    values: FloatArray, present: npt.NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Variance of the grand mean of centred cell values ``(S, boots, blocks)``.

    Returns (var, df, boot_var, between-block variance of block means). Blocks: CR1 over the
    block means (boots averaged), df = blocks - 1. Boots (b >= 2): two-way method of moments
    - boot means' variance minus the interaction mean square / blocks estimates the
    between-boot component (truncated at 0), added with Satterthwaite degrees of freedom
    (evaluated at an upper value of the boot component, see below).
    """
    from scipy import stats

    n_boots = values.shape[1]
    k = np.maximum(present.sum(axis=1).astype(np.float64), 2.0)
    row = values.mean(axis=1)  # (S,K)
    between_rows = (row**2).sum(axis=1) / (k - 1)
    var_blocks = between_rows / k
    df = k - 1
    boot_var = np.zeros_like(var_blocks)
    if n_boots >= 2:
        col = values.sum(axis=2) / k[:, None]  # (S,B)
        q_b = (col**2).sum(axis=1) / (n_boots - 1)
        resid = np.where(present[:, None, :], values - row[:, None, :] - col[:, :, None], 0.0)
        ms_r = (resid**2).sum(axis=(1, 2)) / ((k - 1) * (n_boots - 1))
        boot_var = np.maximum(q_b - ms_r / k, 0.0) / n_boots
        # Degrees of freedom at a plausible upper value of the boot mean square (its lower
        # quartile chi-square point), not at its estimate: with 2-3 boots that estimate
        # falls far below its mean often, and Satterthwaite's df computed from such a draw
        # is large exactly when the boots happened to agree (false keep 5% at a nominal
        # 2.5%, 2 boots, 5% boot offsets, 50 prompts).
        q_hi = q_b * (n_boots - 1) / float(stats.chi2.ppf(DF_QUANTILE, n_boots - 1))
        boot_hi = np.maximum(q_hi - ms_r / k, 0.0) / n_boots
        terms = (var_blocks**2 / (k - 1) + (q_hi / n_boots) ** 2 / (n_boots - 1)
                 + (ms_r / (k * n_boots)) ** 2 / ((k - 1) * (n_boots - 1)))
        with np.errstate(invalid="ignore", divide="ignore"):
            satt = (var_blocks + boot_hi) ** 2 / terms
        df = np.where(boot_hi > 0, np.clip(np.nan_to_num(satt, nan=1.0), 1.0, k - 1), k - 1)
    return var_blocks + boot_var, df, boot_var, between_rows


def speed_batch(
    reference: FloatArray, candidate: FloatArray, blocks: IntArray, metric: Metric
) -> Batch:
    """Log estimate, its cluster-robust variance and variance components, per campaign.

    ``reference``/``candidate``: latencies ``(campaigns, boots, passes, prompts)``, NaN for
    missing. Values per cell are influence values of the log estimate (exact for
    ``per_prompt``, first order for ``total_time``), so ``var`` is the usual CR1 variance.
    """
    if metric not in METRICS:
        raise SpeedError(f"metric must be one of {METRICS}, got {metric!r}")
    c = _cells(reference, candidate, onehot(blocks), metric)
    cells = c.cells[:, None, None]
    if metric == "per_prompt":
        total = np.maximum(c.second.sum(axis=(1, 2)), 1.0)
        est = c.first.sum(axis=(1, 2)) / total
        unit = (total / c.cells)[:, None, None]  # mean prompts per cell
        psi = (c.first - c.second * est[:, None, None]) / unit
        psi_p = (c.first_p - c.second_p * est[:, None, None, None]) / unit[..., None]
        psi_p = np.where(c.second_p > 0, psi_p, np.nan)
    else:
        ta, tb = c.first.sum(axis=(1, 2)), c.second.sum(axis=(1, 2))
        with np.errstate(divide="ignore", invalid="ignore"):
            est = np.log(ta / tb)
        sa = cells / np.where(ta > 0, ta, 1.0)[:, None, None]
        sb = cells / np.where(tb > 0, tb, 1.0)[:, None, None]
        psi = c.first * sa - c.second * sb
        psi_p = c.first_p * sa[..., None] - c.second_p * sb[..., None]
        psi_p = np.where(c.second_p > 0, psi_p, np.nan)
    var, df, boot_var, between_rows = _mean_variance(psi, c.present)
    dev = psi_p - _nanmean(psi_p, 2)[:, :, None, :]
    n_p = np.isfinite(psi_p).sum(axis=2)  # (S,B,K)
    dof_w = np.maximum(n_p - 1, 0).sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        within = np.where(dof_w > 0, np.nansum(dev**2, axis=(1, 2, 3)) / dof_w, np.nan)
    mean_passes = _nanmean(np.where(n_p > 0, n_p, np.nan).reshape(n_p.shape[0], -1), 1)
    n_boots = reference.shape[1]
    between = np.maximum(between_rows - np.nan_to_num(within / (mean_passes * n_boots)), 0.0)
    clusters = c.present.sum(axis=1).astype(np.float64)
    return Batch(est, var, df, boot_var, between, within, clusters, n_boots, mean_passes)


def deciding_t(
    reference: FloatArray,
    candidate: FloatArray,
    blocks: IntArray,
    metric: Metric,
    log_threshold: float | FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """(t, df) of each campaign's deciding test of log speedup against ``log_threshold``.

    ``per_prompt``: (estimate - log threshold) / its cluster-robust SE. ``total_time``:
    Fieller's test of H0 sum(ref) = r0 sum(cand), r0 = the threshold: the cell values
    ``ref - r0 * cand`` are linear, so their mean's cluster t-test carries no delta-method
    error (with a handful of blocks and skewed prompt lengths the log-ratio's linearised or
    jackknife t ran at ~3% false keep for a nominal 2.5%).
    """
    if metric == "per_prompt":
        b = speed_batch(reference, candidate, blocks, metric)
        shift = b.log_estimate - log_threshold
        var, df = b.var, b.df
    else:
        c = _cells(reference, candidate, onehot(blocks), metric)
        r0 = np.exp(np.broadcast_to(np.asarray(log_threshold, dtype=np.float64),
                                    c.cells.shape))[:, None, None]
        tb = c.second.sum(axis=(1, 2))[:, None, None]
        phi = (c.first - r0 * c.second) * c.cells[:, None, None] / (r0 * np.where(
            tb > 0, tb, 1.0))
        shift = phi.sum(axis=(1, 2)) / c.cells
        centred = np.where(c.present[:, None, :], phi - shift[:, None, None], 0.0)
        var, df, _, _ = _mean_variance(centred, c.present)
    se = np.sqrt(var)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, shift / np.where(se > 0, se, 1.0), np.sign(shift) * np.inf)
    return t, df


def p_value(t: FloatArray, df: FloatArray) -> FloatArray:
    """One-sided p of a t statistic: P(T >= t)."""
    from scipy import special

    return np.asarray(special.stdtr(np.maximum(df, 1e-9), -t), dtype=np.float64)


def confidence_bounds(
    data: PairedLatencies, metric: Metric, alpha: float
) -> tuple[float, float]:
    """Log-scale bounds of the deciding test inverted: the thresholds it would not reject.

    ``per_prompt``: estimate -+ t quantile x SE. ``total_time``: Fieller's interval, found
    by bisection on the threshold (the t statistic falls as the threshold rises).
    """
    from scipy import special

    ref, cand = data.reference[None], data.candidate[None]
    b = speed_batch(ref, cand, data.blocks, metric)
    est, se = float(b.log_estimate[0]), math.sqrt(float(b.var[0]))
    if metric == "per_prompt":
        half = float(special.stdtrit(max(float(b.df[0]), 1e-9), 1 - alpha)) * se
        return est - half, est + half

    if data.reference.shape[0] == 1:  # one boot: Fieller's interval in closed form
        return _fieller(data, float(b.df[0]), alpha)

    def excess(log_r: float, sign: float) -> float:
        t, df = deciding_t(ref, cand, data.blocks, metric, log_r)
        return sign * float(t[0]) - float(special.stdtrit(max(float(df[0]), 1e-9), 1 - alpha))

    span = 40 * se + 1.0
    out = []
    for sign, far in ((1.0, est - span), (-1.0, est + span)):
        if excess(far, sign) <= 0:  # never rejected out there: unbounded on this side
            out.append(-math.inf if sign > 0 else math.inf)
            continue
        near = est
        for _ in range(40):
            mid = (near + far) / 2
            near, far = (mid, far) if excess(mid, sign) <= 0 else (near, mid)
        out.append((near + far) / 2)
    return out[0], out[1]


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class MetricResult:
    """One metric's deciding test: a cluster-robust t-test of log speedup vs log threshold.

    ``p_value`` is that test's one-sided p (H1: faster than the threshold); "pass" is
    ``p_value <= (1 - confidence) / 2``, the same event as ``ci_low > threshold``.
    """

    metric: Metric
    estimate: float
    ci_low: float
    ci_high: float
    p_value: float
    t: float
    df: float
    se_log: float
    outcome: StatOutcome


@dataclass(frozen=True)
class Components:
    """Where the speedup's uncertainty comes from (variance of the log estimate).

    ``time_share``: share due to variation between passes within a block and boot (request
    noise, shocks, drift); the rest of the block part is stable prompt-to-prompt variation,
    which only more prompts reduce. ``boot_share``: share of the between-boot component
    (0 with one boot, where it cannot be estimated).
    """

    between: float
    within: float
    boot_var: float
    time_share: float
    boot_share: float
    clusters: int
    passes: float
    boots: int


@dataclass(frozen=True)
class SpeedResult:
    """The speed gate's result: both metrics, the gating one, and why the outcome is what it is."""

    outcome: StatOutcome
    reason: str
    metric: Metric
    gating: MetricResult
    per_prompt: MetricResult
    total_time: MetricResult
    threshold: float
    confidence: float
    n_prompts: int
    n_clusters: int
    n_boots: int
    n_passes: int
    boot_confounded: bool
    confounding: str
    components: Components
    drift: Drift | None
    notes: tuple[str, ...] = field(default_factory=tuple)
    held_back: HeldBack | None = None  # why not KEEP despite the interval, as ``reason`` says


def _fieller(data: PairedLatencies, df: float, alpha: float) -> tuple[float, float]:
    """Log bounds {r: |t(r)| <= t_q} for block sums A_k, B_k: the roots of
    (mean A - r mean B)^2 = (t_q^2 / K) var(A - r B), a quadratic in r."""
    from scipy import special

    c = _cells(data.reference[None], data.candidate[None], onehot(data.blocks), "total_time")
    keep = c.present[0]
    a, b = c.first[0, 0, keep], c.second[0, 0, keep]
    k = a.size
    q = float(special.stdtrit(max(df, 1e-9), 1 - alpha)) ** 2 / k
    cov = np.cov(np.stack([a, b]), ddof=1)
    qa = b.mean() ** 2 - q * cov[1, 1]
    qb = -2 * (a.mean() * b.mean() - q * cov[0, 1])
    qc = a.mean() ** 2 - q * cov[0, 0]
    disc = qb * qb - 4 * qa * qc
    if qa <= 0 or disc < 0:  # the candidate's total is not bounded away from 0
        return -math.inf, math.inf
    root = math.sqrt(disc)
    lo, hi = (-qb - root) / (2 * qa), (-qb + root) / (2 * qa)
    return (math.log(lo) if lo > 0 else -math.inf), math.log(hi)


def _metric_result(
    data: PairedLatencies, batch: Batch, metric: Metric, log_thr: float, alpha: float
) -> MetricResult:
    t, df = deciding_t(data.reference[None], data.candidate[None], data.blocks, metric, log_thr)
    lo, hi = confidence_bounds(data, metric, alpha)
    outcome: StatOutcome = "inconclusive"
    if lo > log_thr + _LOG_TOL:
        outcome = "pass"
    elif hi < log_thr - _LOG_TOL:
        outcome = "fail"
    return MetricResult(metric, math.exp(float(batch.log_estimate[0])), math.exp(lo),
                        math.exp(hi), float(p_value(t, df)[0]), float(t[0]), float(df[0]),
                        math.sqrt(float(batch.var[0])), outcome)


def _components(batch: Batch) -> Components:
    var = float(batch.var[0])
    within = float(batch.within[0]) if np.isfinite(batch.within[0]) else 0.0
    passes = float(batch.passes[0]) if np.isfinite(batch.passes[0]) else 1.0
    k = max(float(batch.clusters[0]), 1.0)
    time_part = within / (passes * batch.boots) / k
    return Components(
        between=float(batch.between[0]), within=within, boot_var=float(batch.boot_var[0]),
        time_share=min(1.0, time_part / var) if var > 0 else 0.0,
        boot_share=float(batch.boot_var[0]) / var if var > 0 else 0.0,
        clusters=int(batch.clusters[0]), passes=passes, boots=batch.boots,
    )


CONFOUNDED = ("one boot per condition: a persistent offset of a boot (placement, clocks, "
              "allocator state) cannot be told from the drafter's effect; "
              "boots_per_condition >= 2 estimates it")


def speed_test(
    data: PairedLatencies,
    threshold: float = 1.0,
    confidence: float = 0.95,
    metric: Metric = DEFAULT_METRIC,
    drift: Drift | None = None,
) -> SpeedResult:
    """Judge the candidate's speedup over the reference at one load level.

    Both metrics are computed; ``metric`` gates. "pass" (KEEP) when the gating metric's
    lower confidence bound exceeds ``threshold`` - unless ``drift`` says the environment was
    unstable by enough to account for that margin (``Drift.vetoes``), which turns it into
    "inconclusive" with that reason; a smaller instability is a note. "fail" (DROP) when its upper
    bound is below ``threshold``: the candidate is confidently slower than required.
    """
    if not (threshold > 0 and math.isfinite(threshold)):
        raise SpeedError(f"threshold must be a positive speedup, got {threshold}")
    if not 0.5 < confidence < 1:
        raise SpeedError(f"confidence must lie in (0.5, 1), got {confidence}")
    if metric not in METRICS:
        raise SpeedError(f"metric must be one of {METRICS}, got {metric!r}")
    ref, cand = data.reference[None], data.candidate[None]
    paired = np.isfinite(_nanmean(ref, 2)) & np.isfinite(_nanmean(cand, 2))
    n_prompts = int(paired.any(axis=1).sum())
    if n_prompts < 2:
        raise SpeedError(f"{n_prompts} paired prompt(s): too few to judge speed")
    alpha = (1 - confidence) / 2
    log_thr = math.log(threshold)
    batches = {m: speed_batch(ref, cand, data.blocks, m) for m in METRICS}
    results = {m: _metric_result(data, batches[m], m, log_thr, alpha) for m in METRICS}
    gate = results[metric]
    n_clusters = int(batches[metric].clusters[0])
    boots = data.reference.shape[0]
    outcome, reason = gate.outcome, ""
    held_back: HeldBack | None = None
    notes: list[str] = []
    if n_clusters < 2:
        outcome, reason = "inconclusive", "one block: no between-block variance to judge by"
        held_back = "one_block"
    elif outcome == "pass" and drift is not None and drift.unstable:
        margin = f"{gate.ci_low:.2f}x against {threshold:.2f}x needed"
        if drift.vetoes(gate.ci_low, threshold):
            outcome, held_back = "inconclusive", "unstable_environment"
            reason = (f"unstable environment: {drift.reason}; a change that size could "
                      f"move the speedup by {drift.bias_bound:.2f}x, more than its margin "
                      f"(lower bound {margin})")
        else:
            notes.append(f"unstable environment: {drift.reason}; the keep holds even if that "
                         f"moved the speedup by {drift.bias_bound:.2f}x (lower bound {margin})")
    if boots == 1:
        notes.append(CONFOUNDED)
    return SpeedResult(
        outcome=outcome, reason=reason, metric=metric, gating=gate,
        per_prompt=results["per_prompt"], total_time=results["total_time"],
        threshold=threshold, confidence=confidence, n_prompts=n_prompts,
        n_clusters=n_clusters, n_boots=boots, n_passes=data.reference.shape[1],
        boot_confounded=boots == 1, confounding=CONFOUNDED if boots == 1 else "",
        components=_components(batches[metric]), drift=drift, notes=tuple(notes),
        held_back=held_back,
    )
