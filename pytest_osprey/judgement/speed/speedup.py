"""Speed statistics that count the time structure of a campaign (pure numpy/scipy).

Design (see :mod:`pytest_osprey.campaign.schedule`): every pass splits the prompts afresh
into blocks of the level's concurrency; the conditions replay each block as adjacent short
stretches. Noise shared in time (stretch shocks, correlated noise within a stretch, stalls
hitting every request in flight) therefore stays inside one **time unit** = one block in
one pass of one boot, and a prompt's stable effect recurs in every pass. The deciding test
of each metric is a t-test of its log speedup against ``log(threshold)`` with a variance
clustered two ways, by prompt and by time unit (Cameron, Gelbach & Miller), and
``df = min(prompts, time units) - 1``. At low load (units of fewer than 8 requests of a
condition) the time dimension is a serial term instead: the units in the order they ran as
a time series (Parzen HAC, fixed-b), so a stall of one server spanning several units counts
once; its effective clusters stand for the units in df (:func:`_serial`):

* ``per_prompt``: the mean over prompts of the per-prompt log ratio (per pass, reference
  minus candidate log latency, averaged over passes) - a geometric-mean speedup that counts
  every prompt equally;
* ``total_time``: the log ratio of summed latencies (per prompt, its mean latency over
  passes) - the GPU time saved, where long prompts weigh more.

Each metric is written as a sum of influence values of (boot, pass, prompt) observations
(exact for ``per_prompt``, first-order for the ratio of sums). With b >= 2 boots per
condition a between-boot component is estimated by the method of moments from the two-way
(boot x prompt) table of influence values and added, with Satterthwaite degrees of freedom.
With one boot a persistent per-boot offset cannot be told from the drafter's effect: the
result says so. docs/speed-calibration.md gives the design's reasons and its calibration.

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
from .data import IntArray, PairedLatencies, Request, SpeedError, collect
from .drift import Drift
from .stalls import Stall, detect_stall
from .variance import serial_reach, two_way

__all__ = ["METRICS", "FloatArray", "IntArray", "Metric", "PairedLatencies", "Request",
           "SpeedError", "SpeedResult", "Stall", "collect", "speed_test"]

Metric = Literal["per_prompt", "total_time"]
HeldBack = Literal["one_block", "unstable_environment"]
METRICS: tuple[Metric, ...] = ("per_prompt", "total_time")
DEFAULT_METRIC: Metric = "per_prompt"

_LOG_TOL = 1e-9  # a bound this close to the threshold is not beyond it


# --------------------------------------------------------------------------- batch core


@dataclass(frozen=True)
class Batch:
    """Per-campaign arrays (leading axis: campaigns) of one metric's log estimate.

    ``var``: variance of the log estimate, clustered by prompt and by time unit (two-way,
    boots averaged) plus the between-boot component ``boot_var`` (0 with one boot), with
    ``df``. ``between`` and ``within`` are variance components per prompt in the estimate's
    units: stable prompt-to-prompt variation and the variation of one pass between passes
    (for advice and the time share). ``clusters``: prompts with data.
    """

    log_estimate: FloatArray
    var: FloatArray
    df: FloatArray
    boot_var: FloatArray
    between: FloatArray
    within: FloatArray
    clusters: FloatArray
    boots: int
    passes: FloatArray  # mean passes per (boot, prompt) with data
    units: FloatArray  # time units with data
    serial: FloatArray  # effective time clusters of the serial term (0: not active)


def _nanmean(x: FloatArray, axis: int) -> FloatArray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices stay NaN
        return np.asarray(np.nanmean(x, axis=axis), dtype=np.float64)


def _influence(
    ref: FloatArray, cand: FloatArray, metric: Metric
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_], FloatArray, FloatArray]:
    """(log estimate (S,), influence values (S,B,P,n), paired mask, observation weights,
    per-observation shares of the metric's sums) of each campaign.

    An observation is one (boot, pass, prompt) cell with both conditions. Every (boot,
    prompt) with data weighs alike, its passes share that weight (``w``, summing to 1).
    ``per_prompt``: the weighted mean of log ratios; ``total_time``: the log ratio of the
    summed per-(boot, prompt) mean latencies (``shares`` = (reference, candidate) parts).
    The influence values sum to 0 and, to first order, to the estimate's error.
    """
    ok = np.isfinite(ref) & np.isfinite(cand)
    n_p = ok.sum(axis=2, keepdims=True).astype(np.float64)  # (S,B,1,n) passes per cell
    n_cells = np.maximum((n_p > 0).sum(axis=(1, 2, 3)), 1).astype(np.float64)
    w = np.where(ok, 1.0 / (n_cells[:, None, None, None] * np.maximum(n_p, 1.0)), 0.0)
    if metric == "per_prompt":
        with np.errstate(invalid="ignore", divide="ignore"):
            d = np.where(ok, np.log(ref) - np.log(cand), 0.0)
        est = (w * d).sum(axis=(1, 2, 3))
        psi = w * (d - est[:, None, None, None])
        return est, psi, ok, w, np.stack([w * d, w])
    a = np.where(ok, ref, 0.0) / np.maximum(n_p, 1.0)
    c = np.where(ok, cand, 0.0) / np.maximum(n_p, 1.0)
    ta, tb = a.sum(axis=(1, 2, 3)), c.sum(axis=(1, 2, 3))
    with np.errstate(divide="ignore", invalid="ignore"):
        est = np.log(ta / tb)
        psi = (a / np.where(ta > 0, ta, 1.0)[:, None, None, None]
               - c / np.where(tb > 0, tb, 1.0)[:, None, None, None])
    return est, psi, ok, w, np.stack([a, c])


def speed_batch(
    reference: FloatArray, candidate: FloatArray, units: IntArray, metric: Metric
) -> Batch:
    """Log estimate, its two-way cluster-robust variance and variance components, per
    campaign.

    ``reference``/``candidate``: latencies ``(campaigns, boots, passes, prompts)``, NaN for
    missing; ``units``: each cell's time unit, broadcastable to that shape.
    """
    if metric not in METRICS:
        raise SpeedError(f"metric must be one of {METRICS}, got {metric!r}")
    est, psi, ok, w, _ = _influence(reference, candidate, metric)
    v = two_way(psi, ok, units)
    # Pass-to-pass variation of one observation, in the units of a prompt's mean value.
    with np.errstate(invalid="ignore", divide="ignore"):
        x = np.where(ok, psi / np.where(w > 0, w, 1.0), np.nan)  # (S,B,P,n)
    dev = x - _nanmean(x, 2)[:, :, None, :]
    n_p = ok.sum(axis=2)  # (S,B,n)
    dof_w = np.maximum(n_p - 1, 0).sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        within = np.where(dof_w > 0, np.nansum(dev**2, axis=(1, 2, 3)) / dof_w, np.nan)
    mean_passes = _nanmean(np.where(n_p > 0, n_p, np.nan).reshape(n_p.shape[0], -1), 1)
    n_boots = reference.shape[1]
    between = np.maximum(v.between_rows - np.nan_to_num(within / (mean_passes * n_boots)), 0.0)
    return Batch(est, v.var, v.df, v.boot_var, between, within, v.prompts, n_boots,
                 mean_passes, v.units, v.serial)


def deciding_t(
    reference: FloatArray,
    candidate: FloatArray,
    units: IntArray,
    metric: Metric,
    log_threshold: float | FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """(t, df) of each campaign's deciding test of log speedup against ``log_threshold``.

    ``per_prompt``: (estimate - log threshold) / its two-way cluster-robust SE.
    ``total_time``: Fieller's test of H0 sum(ref) = r0 sum(cand), r0 = the threshold: the
    observation values ``ref - r0 * cand`` are linear, so their sum's cluster t-test carries
    no delta-method error (with few clusters and skewed prompt lengths the log-ratio's
    linearised or jackknife t ran at ~3% false keep for a nominal 2.5%).
    """
    if metric == "per_prompt":
        b = speed_batch(reference, candidate, units, metric)
        shift = b.log_estimate - log_threshold
        var, df = b.var, b.df
    else:
        _, _, ok, w, (a, c) = _influence(reference, candidate, metric)
        r0 = np.exp(np.broadcast_to(np.asarray(log_threshold, dtype=np.float64),
                                    a.shape[:1]))[:, None, None, None]
        tb = c.sum(axis=(1, 2, 3))[:, None, None, None]
        phi = (a - r0 * c) / (r0 * np.where(tb > 0, tb, 1.0))
        shift = phi.sum(axis=(1, 2, 3))
        v = two_way(np.where(ok, phi - shift[:, None, None, None] * w, 0.0), ok, units)
        var, df = v.var, v.df
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
    b = speed_batch(ref, cand, data.time_units, metric)
    est, se = float(b.log_estimate[0]), math.sqrt(float(b.var[0]))
    if not (se > 0 and b.df[0] > 0):
        return -math.inf, math.inf
    if metric == "per_prompt":
        half = float(special.stdtrit(float(b.df[0]), 1 - alpha)) * se
        return est - half, est + half

    def excess(log_r: float, sign: float) -> float:
        t, df = deciding_t(ref, cand, data.time_units, metric, log_r)
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


# --------------------------------------------------------------------------- stalls


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

    ``time_share``: share due to variation of a prompt between passes (request noise,
    shocks, drift); the rest of the prompt part is stable prompt-to-prompt variation, which
    only more prompts reduce. ``boot_share``: share of the between-boot component (0 with one
    boot, where it cannot be estimated). ``clusters``: prompts with data; ``time_units``:
    (boot, pass, block) units with data (they grow with passes).
    """

    between: float
    within: float
    boot_var: float
    time_share: float
    boot_share: float
    clusters: int
    passes: float
    boots: int
    time_units: int = 0


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
    held_back: HeldBack | None = None  # why no verdict despite the interval, as ``reason`` says
    n_time_units: int = 0  # (boot, pass, block) units; n_clusters = min(prompts, these)
    # With an unstable environment: the gating metric without the pass instance that changed
    # (``drift_adjusted``); a verdict must hold on it too.
    drift_adjusted: MetricResult | None = None
    serial_clusters: float = 0.0  # the serial term's effective time clusters (0: off)
    stall: Stall | None = None


def _metric_result(
    data: PairedLatencies, batch: Batch, metric: Metric, log_thr: float, alpha: float
) -> MetricResult:
    t, df = deciding_t(data.reference[None], data.candidate[None], data.time_units, metric,
                       log_thr)
    lo, hi = confidence_bounds(data, metric, alpha)
    outcome: StatOutcome = "inconclusive"
    if lo > log_thr + _LOG_TOL:
        outcome = "pass"
    elif hi < log_thr - _LOG_TOL:
        outcome = "fail"
    return MetricResult(metric, math.exp(float(batch.log_estimate[0])), math.exp(lo),
                        math.exp(hi), float(p_value(t, df)[0]), float(t[0]), float(df[0]),
                        math.sqrt(float(batch.var[0])), outcome)


def without(data: PairedLatencies, boot: int, pass_index: int) -> PairedLatencies:
    """``data`` without one pass instance (its cells missing)."""
    ref, cand = data.reference.copy(), data.candidate.copy()
    ref[boot, pass_index] = np.nan
    cand[boot, pass_index] = np.nan
    return PairedLatencies(ref, cand, data.blocks, data.prompt_ids, data.time_units)


def drift_adjusted(
    data: PairedLatencies, changed: tuple[tuple[int, int], ...], metric: Metric,
    log_thr: float, alpha: float, outcome: StatOutcome,
) -> MetricResult | None:
    """The gating metric without each instance in ``changed`` (boot, pass), the one least
    favourable to ``outcome`` (lowest lower bound for a keep, highest upper bound for a
    drop, else the widest): a change of the environment that hit one condition in an
    instance cannot have bought a verdict that also holds without that instance. None when
    leaving an instance out leaves fewer than two paired prompts."""
    out: list[MetricResult] = []
    for boot, pass_index in changed:
        rest = without(data, boot, pass_index)
        if int((np.isfinite(rest.reference) & np.isfinite(rest.candidate)).any(
                axis=(0, 1)).sum()) < 2:
            return None
        batch = speed_batch(rest.reference[None], rest.candidate[None], rest.time_units,
                            metric)
        out.append(_metric_result(rest, batch, metric, log_thr, alpha))
    if not out:
        return None
    if outcome == "pass":
        return min(out, key=lambda m: m.ci_low)
    if outcome == "fail":
        return max(out, key=lambda m: m.ci_high)
    # Widest by ratio; an interval reaching 0 (a pass left out leaves no degree of freedom)
    # is infinitely wide.
    return max(out, key=lambda m: m.ci_high / m.ci_low if m.ci_low > 0 else math.inf)


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
        time_units=int(batch.units[0]),
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
    lower confidence bound exceeds ``threshold``; "fail" (DROP) when its upper bound is below
    it. When ``drift`` says the environment was unstable, either verdict must also hold on the
    drift-adjusted speedup (:func:`drift_adjusted`: the paired comparison without each pass
    instance that changed, so a change that hit one condition cannot buy the verdict);
    otherwise it turns "inconclusive" with that reason. A run of one condition's requests
    that ran markedly slower than its pairs is named (``stall``); the serial term of the
    variance counts it.
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
    batches = {m: speed_batch(ref, cand, data.time_units, m) for m in METRICS}
    results = {m: _metric_result(data, batches[m], m, log_thr, alpha) for m in METRICS}
    gate = results[metric]
    n_units = int(batches[metric].units[0])
    n_clusters = min(int(batches[metric].clusters[0]), n_units)
    boots = data.reference.shape[0]
    outcome, reason = gate.outcome, ""
    held_back: HeldBack | None = None
    adjusted: MetricResult | None = None
    notes: list[str] = []
    if n_clusters < 2:
        outcome, reason = ("inconclusive", "one time unit (one block in one pass): no "
                           "variation between units to judge by")
        held_back = "one_block"
    elif drift is not None and drift.unstable and not drift.changed:
        adjusted = gate  # a change both conditions shared: the pairs did not move
        notes.append(f"unstable environment: {drift.reason}; the paired ratio did not change "
                     f"between passes, so the comparison stands")
    elif drift is not None and drift.unstable:
        adjusted = drift_adjusted(data, drift.changed, metric, log_thr, alpha, outcome)
        shown = "no pass left to judge by" if adjusted is None else (
            f"drift-adjusted speedup {adjusted.estimate:.2f}x [{adjusted.ci_low:.2f}, "
            f"{adjusted.ci_high:.2f}] (without the pass that changed) against "
            f"{threshold:.2f}x")
        if outcome in ("pass", "fail") and (adjusted is None or adjusted.outcome != outcome):
            verdict = "keep" if outcome == "pass" else "drop"
            outcome, held_back = "inconclusive", "unstable_environment"
            reason = (f"unstable environment: {drift.reason}; the {verdict} does not hold on "
                      f"the {shown}")
        elif outcome in ("pass", "fail"):
            notes.append(f"unstable environment: {drift.reason}; the verdict holds on the "
                         f"{shown}")
        else:
            notes.append(f"unstable environment: {drift.reason}; {shown}")
    if boots == 1:
        notes.append(CONFOUNDED)
    eff = float(batches[metric].serial[0])
    return SpeedResult(
        outcome=outcome, reason=reason, metric=metric, gating=gate,
        per_prompt=results["per_prompt"], total_time=results["total_time"],
        threshold=threshold, confidence=confidence, n_prompts=n_prompts,
        n_clusters=n_clusters, n_boots=boots, n_passes=data.reference.shape[1],
        boot_confounded=boots == 1, confounding=CONFOUNDED if boots == 1 else "",
        components=_components(batches[metric]), drift=drift, notes=tuple(notes),
        held_back=held_back, n_time_units=n_units, drift_adjusted=adjusted,
        serial_clusters=eff, stall=detect_stall(data, serial_reach(eff, n_units)),
    )
