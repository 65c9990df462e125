"""Paired speed statistics for run-to-run comparisons (history), where the requests of two
runs are independent: a per-prompt geometric-mean speedup with a bootstrap interval.

Everything here is a function of numpy arrays (no pytest, no I/O); conventions and errors are
those of :mod:`..stats.core`. The speed gates' time-aware statistics are in :mod:`.speedup`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import special, stats

from ..stats.core import FloatArray, StatOutcome, StatsError, check_unit

# Largest "more pairs needed" we report: beyond it the observed effect is too close to the
# threshold for any realistic campaign to settle the question.
MAX_PAIRS = 100_000


# --------------------------------------------------------------------------- validation


def _log_means(
    mapping: Mapping[str, Sequence[float]], ids: list[str], name: str
) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """Mean log latency per prompt, validating everything in one vectorised pass."""
    arrays = []
    for pid in ids:
        try:
            arrays.append(np.asarray(mapping[pid], dtype=np.float64).ravel())
        except (TypeError, ValueError) as exc:
            raise StatsError(f"{name}[{pid!r}]: latencies must be numbers ({exc})") from None
    sizes = np.array([a.size for a in arrays], dtype=np.int64)
    if (sizes == 0).any():
        pid = ids[int(np.argmin(sizes))]
        raise StatsError(f"{name}[{pid!r}]: no latencies (drop the prompt or record failures)")
    flat = np.concatenate(arrays)
    bad = ~(flat > 0) | ~np.isfinite(flat)  # NaN fails "> 0" too
    if bad.any():
        at = int(np.argmax(bad))
        pid = ids[int(np.searchsorted(np.cumsum(sizes), at, side="right"))]
        raise StatsError(
            f"{name}[{pid!r}]: latencies must be finite and > 0 seconds, got {flat[at]}"
        )
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    return np.add.reduceat(np.log(flat), starts) / sizes, sizes


def prompt_log_ratios(
    reference: Mapping[str, Sequence[float]], candidate: Mapping[str, Sequence[float]]
) -> tuple[list[str], FloatArray, int]:
    """Per-prompt log speedups ``mean(log ref) - mean(log cand)`` over prompts in both.

    Returns (sorted prompt ids, log-ratios, number of paired observations). Sorting the ids
    makes results independent of mapping order. Log-ratios are rounded to 1e-12 so that
    exact ties (identical latencies) survive float noise, e.g. after rescaling.
    """
    for name, mapping in (("reference", reference), ("candidate", candidate)):
        if not mapping:
            raise StatsError(f"{name}: no prompts")
    ids = sorted(set(reference) & set(candidate))
    if not ids:
        raise StatsError("no prompt appears in both reference and candidate: nothing to pair")
    ref, ref_n = _log_means(reference, ids, "reference")
    cand, cand_n = _log_means(candidate, ids, "candidate")
    ratios = ref - cand
    n_pairs = int(np.minimum(ref_n, cand_n).sum())
    return ids, np.round(ratios, 12), n_pairs


# --------------------------------------------------------------------------- paired speedup


@dataclass(frozen=True)
class SpeedupResult:
    """Geometric-mean speedup reference/candidate over prompts (>1: candidate faster).

    ``more_pairs_needed`` (inconclusive only): further paired prompts, each with as many
    repetitions as now, for 80% power to settle the question if the observed mean log-ratio
    and its SD are the truth; :data:`MAX_PAIRS` caps it.
    ``n_pairs`` counts paired observations: per prompt, the smaller repetition count.
    """

    estimate: float
    ci_low: float
    ci_high: float
    p_value: float
    n_prompts: int
    n_pairs: int
    threshold: float
    confidence: float
    outcome: StatOutcome
    more_pairs_needed: int | None
    method: str


def _bootstrap_mean(
    d: FloatArray, level: float, n_resamples: int, seed: int, method: str
) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate BCa warns; we detect and fall back
        res = stats.bootstrap(
            (d,),
            np.mean,
            confidence_level=level,
            n_resamples=n_resamples,
            method=method,
            rng=np.random.default_rng(seed),
            vectorized=True,
        )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _mean_ci(
    d: FloatArray, confidence: float, n_resamples: int, seed: int
) -> tuple[float, float, str]:
    """CI of the mean log-ratio: BCa (percentile when BCa is degenerate), t-guarded.

    BCa is degenerate (NaN) when all log-ratios are equal, and can exclude the point estimate
    at tiny n; both fall back to the percentile interval. The result is then widened where
    needed to contain the Student-t interval: with tens of prompts and heavy-tailed latencies
    every bootstrap interval (BCa, percentile, bootstrap-t; also when expanded to t width)
    reads an outlier as skew and undercovers on the other side: one-sided error ~3.4% at a
    nominal 2.5% for 20 prompts. The t-interval is robust there, and the bootstrap still
    widens a side where the log-ratios are truly skewed.
    """
    mean = float(d.mean())
    method = "BCa bootstrap"
    low, high = _bootstrap_mean(d, confidence, n_resamples, seed, "BCa")
    if not (np.isfinite(low) and np.isfinite(high) and low <= mean <= high):
        method = "percentile bootstrap"
        low, high = _bootstrap_mean(d, confidence, n_resamples, seed, "percentile")
    t_q = float(special.stdtrit(d.size - 1, 0.5 + confidence / 2))
    half = t_q * float(d.std(ddof=1)) / math.sqrt(d.size)
    if mean - half < low or mean + half > high:
        method += ", widened to the t-interval"
    return min(low, mean - half), max(high, mean + half), method


def _signed_rank_p(x: FloatArray) -> float:
    """One-sided Wilcoxon signed-rank p-value for H1: median(x) > 0."""
    if not np.any(x != 0):
        return 1.0  # nothing but ties with the threshold: no evidence for H1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small-sample normal-approximation notes
        return float(stats.wilcoxon(x, alternative="greater").pvalue)


# Log-ratios are rounded to 1e-12; a bound this close to the threshold is not beyond it.
_LOG_TOL = 1e-9


def _outcome(low: float, high: float, log_limit: float) -> StatOutcome:
    """Three-way verdict of a log-scale interval against a log-scale limit."""
    if low > log_limit + _LOG_TOL:
        return "pass"
    if high < log_limit - _LOG_TOL:
        return "fail"
    return "inconclusive"


def paired_speedup(
    reference: Mapping[str, Sequence[float]],
    candidate: Mapping[str, Sequence[float]],
    threshold: float = 1.0,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> SpeedupResult:
    """Paired, per-prompt speedup of ``candidate`` over ``reference`` with a bootstrap CI.

    ``reference``/``candidate`` map prompt id -> latencies (seconds, > 0) of its repetitions;
    only prompts in both are used. Per prompt the log-ratio is ``mean(log ref) -
    mean(log cand)``; the estimate is the exponentiated mean over prompts (a geometric mean).
    The CI is a two-sided bootstrap over prompts at ``confidence`` (BCa; see :func:`_mean_ci`
    for the fallback and the t guard), so "pass" (``ci_low > threshold``) is a one-sided test
    at ``(1 - confidence) / 2``; "fail" is ``ci_high < threshold``. ``p_value`` is a one-sided
    Wilcoxon signed-rank test of the log-ratios against ``log(threshold)`` (H1: faster).

    For throughput (tokens/s, larger is better) pass the arguments swapped: the ratio
    candidate/reference of tokens/s is reference/candidate of its reciprocal.
    """
    if not threshold > 0 or not math.isfinite(threshold):
        raise StatsError(f"threshold must be a positive speedup, got {threshold}")
    check_unit(confidence, "confidence")
    if n_resamples < 100:
        raise StatsError(f"n_resamples must be >= 100, got {n_resamples}")
    ids, d, n_pairs = prompt_log_ratios(reference, candidate)
    if d.size < 2:
        raise StatsError(
            f"need at least 2 paired prompts for a confidence interval over prompts, got 1 "
            f"({ids[0]!r}); add prompts to the trace"
        )
    low, high, method = _mean_ci(d, confidence, n_resamples, seed)
    log_thr = math.log(threshold)
    excess = np.round(d - log_thr, 12)  # exact ties with the threshold stay ties
    outcome = _outcome(low, high, log_thr)
    more = None
    if outcome == "inconclusive":
        delta = abs(float(excess.mean()))
        delta = 0.0 if delta < _LOG_TOL else delta
        total = _pairs_for(float(d.std(ddof=1)), delta, (1 - confidence) / 2, 0.8)
        more = max(total - d.size, 1)
    return SpeedupResult(
        estimate=math.exp(float(d.mean())),
        ci_low=math.exp(low),
        ci_high=math.exp(high),
        p_value=_signed_rank_p(excess),
        n_prompts=int(d.size),
        n_pairs=n_pairs,
        threshold=threshold,
        confidence=confidence,
        outcome=outcome,
        more_pairs_needed=more,
        method=method,
    )


def _pairs_for(sd: float, delta: float, alpha: float, power: float) -> int:
    """Smallest n with a one-sided t-test of mean > 0 reaching ``power`` at true mean delta."""
    if sd == 0.0:
        return 2 if delta > 0 else MAX_PAIRS
    if delta <= 0:
        return MAX_PAIRS
    z = float(special.ndtri(1 - alpha) + special.ndtri(power)) * sd / delta
    n = max(2, math.ceil(z * z))
    # The normal formula undercounts at small n; step up with t quantiles until it holds.
    while n < MAX_PAIRS:
        t_sum = float(special.stdtrit(n - 1, 1 - alpha) + special.stdtrit(n - 1, power))
        if math.sqrt(n) * delta / sd >= t_sum:
            return n
        n += 1
    return MAX_PAIRS
