"""Pure statistics for the gate: paired speed, latency limits, equivalence, multiplicity.

Everything here is a function of numpy arrays (no pytest, no I/O). Conventions:

* Outcomes are three-valued: ``"pass"``, ``"fail"`` or ``"inconclusive"``.
* Two-sided intervals at ``confidence`` have one-sided error ``(1 - confidence) / 2`` per side:
  a KEEP judged on the lower bound of a 95% interval is a one-sided test at 2.5%.
* Bad input raises :class:`StatsError` (a ``ValueError``) with a message naming the problem.

The group-sequential design lives in :mod:`pytest_osprey.stats_sequential`.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import optimize, special, stats

Outcome = Literal["pass", "fail", "inconclusive"]
FloatArray = npt.NDArray[np.float64]

# Largest "more pairs needed" we report: beyond it the observed effect is too close to the
# threshold for any realistic campaign to settle the question.
MAX_PAIRS = 100_000


class StatsError(ValueError):
    """Input the statistics cannot judge (empty, NaN, non-positive latency, too few prompts)."""


# --------------------------------------------------------------------------- validation


def _array(values: Sequence[float], what: str) -> FloatArray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise StatsError(f"{what}: values must be numbers ({exc})") from None
    if arr.ndim != 1:
        raise StatsError(f"{what}: expected a flat sequence of numbers, got shape {arr.shape}")
    if arr.size == 0:
        raise StatsError(f"{what}: no values")
    if not np.all(np.isfinite(arr)):
        raise StatsError(f"{what}: values must be finite, got {arr[~np.isfinite(arr)][0]}")
    return arr


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


def _unit(value: float, name: str) -> None:
    if not 0.0 < value < 1.0:
        raise StatsError(f"{name} must lie strictly between 0 and 1, got {value}")


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
    and its SD are the truth (:func:`required_pairs`); :data:`MAX_PAIRS` caps it.
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
    outcome: Outcome
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


def _outcome(low: float, high: float, log_limit: float) -> Outcome:
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
    _unit(confidence, "confidence")
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


def required_pairs(
    log_ratio_sd: float, effect: float, threshold: float, alpha: float = 0.025, power: float = 0.8
) -> int:
    """Prompts needed so a one-sided test of mean log-ratio > log(threshold) has ``power``.

    ``effect`` is the true speedup, ``log_ratio_sd`` the SD of per-prompt log-ratios (after
    pooling repetitions). Uses t quantiles (not z), so small answers are not optimistic;
    capped at :data:`MAX_PAIRS`.
    """
    if not log_ratio_sd >= 0 or not math.isfinite(log_ratio_sd):
        raise StatsError(f"log_ratio_sd must be finite and >= 0, got {log_ratio_sd}")
    if not (effect > 0 and threshold > 0):
        raise StatsError(f"effect and threshold must be positive, got {effect}, {threshold}")
    if effect <= threshold:
        raise StatsError(f"effect {effect} must exceed threshold {threshold} to be detectable")
    _unit(alpha, "alpha")
    _unit(power, "power")
    return _pairs_for(log_ratio_sd, math.log(effect / threshold), alpha, power)


# --------------------------------------------------------------------------- latency limits


@dataclass(frozen=True)
class BoundResult:
    """Order-statistic confidence bound on a quantile, judged against a limit."""

    estimate: float
    bound: float
    limit: float
    confidence: float
    n: int
    outcome: Outcome


def percentile_upper_bound(
    samples: Sequence[float], q: float, limit: float, confidence: float = 0.95
) -> BoundResult:
    """Distribution-free upper confidence bound on the ``q``-quantile, e.g. p95 latency.

    The bound is the smallest order statistic X_(k) with P(X_(k) >= quantile) =
    P(Binomial(n, q) <= k-1) >= confidence (exact for continuous data, conservative with
    ties). "pass" if bound <= limit; "fail" if the matching lower bound exceeds the limit;
    otherwise "inconclusive". Too few samples for a finite bound give ``bound=inf``.
    """
    x = np.sort(_array(samples, "samples"))
    if math.isnan(limit):
        raise StatsError("limit must be a number, got nan")
    _unit(q, "q")
    _unit(confidence, "confidence")
    n = x.size
    k = np.arange(1, n + 1)
    upper_ok = np.flatnonzero(stats.binom.cdf(k - 1, n, q) >= confidence)
    bound = float(x[upper_ok[0]]) if upper_ok.size else math.inf
    lower_ok = np.flatnonzero(stats.binom.sf(k - 1, n, q) >= confidence)
    lower = float(x[lower_ok[-1]]) if lower_ok.size else -math.inf
    outcome: Outcome = "inconclusive"
    if bound <= limit:
        outcome = "pass"
    elif lower > limit:
        outcome = "fail"
    return BoundResult(float(np.quantile(x, q)), bound, limit, confidence, n, outcome)


# --------------------------------------------------------------------------- equivalence


@dataclass(frozen=True)
class EquivalenceResult:
    """An equivalence / non-inferiority judgement on a paired difference (candidate - ref)."""

    estimate: float
    ci_low: float
    ci_high: float
    margin: float
    p_value: float
    outcome: Outcome
    n: int


def tost_paired(
    reference: Sequence[float], candidate: Sequence[float], margin: float, alpha: float = 0.05
) -> EquivalenceResult:
    """Paired t TOST: is the mean of ``candidate - reference`` within ``(-margin, margin)``?

    "pass" when the (1 - 2 alpha) t-interval lies inside the margins (equivalently, both
    one-sided tests reject at alpha; ``p_value`` is the larger of their p-values), "fail"
    when the interval lies entirely outside, else "inconclusive". With zero variance (all
    differences equal) the interval collapses to the point and the p-value is 0 or 1.
    """
    ref = _array(reference, "reference")
    cand = _array(candidate, "candidate")
    if ref.size != cand.size:
        raise StatsError(f"paired samples differ in length: {ref.size} vs {cand.size}")
    if ref.size < 2:
        raise StatsError("need at least 2 pairs for a t-interval, got 1")
    if not margin > 0 or not math.isfinite(margin):
        raise StatsError(f"margin must be positive and finite, got {margin}")
    _unit(alpha, "alpha")
    d = cand - ref
    n = d.size
    mean, se = float(d.mean()), float(d.std(ddof=1)) / math.sqrt(n)
    if se == 0.0:
        low = high = mean
        p = 0.0 if abs(mean) < margin else 1.0
    else:
        half = float(stats.t.ppf(1 - alpha, n - 1)) * se
        low, high = mean - half, mean + half
        p_lower = float(stats.t.sf((mean + margin) / se, n - 1))  # H0: mean <= -margin
        p_upper = float(stats.t.cdf((mean - margin) / se, n - 1))  # H0: mean >= +margin
        p = max(p_lower, p_upper)
    outcome: Outcome = "inconclusive"
    if -margin < low and high < margin:
        outcome = "pass"
    elif low >= margin or high <= -margin:
        outcome = "fail"
    return EquivalenceResult(mean, low, high, margin, p, outcome, n)


def _tango_z(n: int, gains: npt.ArrayLike, losses: npt.ArrayLike, delta0: float) -> FloatArray:
    """Tango's score statistic for H0: p_gain - p_loss = delta0 (vectorised over cells).

    The variance uses the MLE restricted to the null, q = p_loss solving
    2n q^2 - B q - C = 0 (derived from the trinomial likelihood), so the statistic stays
    finite with zero discordant pairs, where the Wald statistic breaks down.
    """
    x, y = np.asarray(gains, dtype=np.float64), np.asarray(losses, dtype=np.float64)
    z = n - x - y
    b = x * (1 - delta0) + y * (1 - 3 * delta0) - 2 * z * delta0
    c = y * delta0 * (1 - delta0)
    q = (b + np.sqrt(np.maximum(b * b + 8 * n * c, 0.0))) / (4 * n)
    var = np.maximum(2 * q + delta0 - delta0 * delta0, 0.0) * n
    num = x - y - n * delta0
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(var > 0, num / np.sqrt(var), np.sign(num) * np.inf)
    return np.asarray(np.where(num == 0, 0.0, out), dtype=np.float64)


_EXACT_MAX_N = 300  # exact enumeration is O(n^2) cells; beyond this the score test is accurate


@functools.lru_cache(maxsize=4096)
def _exact_noninferiority_p(n: int, gains: int, losses: int, margin: float) -> float:
    """Exact unconditional p-value of H0: p_gain - p_loss <= -margin (sup over nuisance)."""
    z_obs = float(_tango_z(n, gains, losses, -margin))
    if n > _EXACT_MAX_N:
        return float(stats.norm.sf(z_obs))
    x, y = np.triu_indices(n + 1)  # all (x, y) with x + y <= n, via y' = y + x
    x, y = x.copy(), (y - x).copy()
    keep = _tango_z(n, x, y, -margin) >= z_obs - 1e-9
    x, y = x[keep], y[keep]
    log_coef = special.gammaln(n + 1) - special.gammaln(x + 1) - special.gammaln(y + 1)
    log_coef -= special.gammaln(n - x - y + 1)

    def tail(q: FloatArray) -> FloatArray:  # null boundary: p_loss = q, p_gain = q - margin
        q = q[:, None]
        p_gain, p_same = np.maximum(q - margin, 0.0), np.maximum(1 - 2 * q + margin, 0.0)
        logp = log_coef + special.xlogy(x, p_gain) + special.xlogy(y, q)
        logp = logp + special.xlogy(n - x - y, p_same)
        return np.asarray(np.exp(logp).sum(axis=1), dtype=np.float64)

    lo, hi = margin, (1 + margin) / 2
    grid = np.linspace(lo, hi, 201)
    values = tail(grid)
    best = int(np.argmax(values))
    # Polish the grid maximum so the sup is not underestimated (that would be liberal).
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
    res = optimize.minimize_scalar(
        lambda q: -float(tail(np.array([q]))[0]), bounds=(a, b), method="bounded"
    )
    return float(min(1.0, max(values[best], -float(res.fun))))


@functools.lru_cache(maxsize=4096)
def _tango_ci(n: int, gains: int, losses: int, alpha: float) -> tuple[float, float]:
    """Tango's score interval for p_gain - p_loss at level 1 - 2 alpha (root-finding)."""
    z = float(stats.norm.ppf(1 - alpha))
    est = (gains - losses) / n
    eps = 1e-9

    def root(target: float, a: float, b: float, edge: float) -> float:
        def f(d0: float) -> float:
            return float(_tango_z(n, gains, losses, d0)) - target

        if a >= b or f(a) * f(b) > 0:
            return edge
        return float(optimize.brentq(f, a, b, xtol=1e-10))

    return root(z, -1 + eps, est, -1.0), root(-z, est, 1 - eps, 1.0)


def _bools(values: Sequence[bool], what: str) -> npt.NDArray[np.bool_]:
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.size == 0:
        raise StatsError(f"{what}: expected a non-empty flat sequence of booleans")
    if arr.dtype != np.bool_ and not np.isin(arr, (0, 1)).all():
        raise StatsError(f"{what}: values must be booleans (or 0/1)")
    return arr.astype(bool)


def mcnemar_noninferiority(
    reference_pass: Sequence[bool],
    candidate_pass: Sequence[bool],
    margin: float,
    alpha: float = 0.05,
) -> EquivalenceResult:
    """Paired pass/fail non-inferiority: H0 p_cand - p_ref <= -margin vs H1 > -margin.

    ``p_value`` is an exact unconditional test: the trinomial of (gain, loss, concordant)
    pairs, ordered by Tango's score statistic, maximised over the nuisance discordance rate on
    the null boundary. Above n = 300 it is the asymptotic score test (approximate; it can be
    slightly liberal when discordant pairs are very rare). Classic McNemar (conditioning on
    discordant pairs) is exact only for margin 0, and with a margin it could never pass a
    candidate with no discordant pairs. The interval is Tango's score CI at 1 - 2 alpha.
    ``estimate`` is p_cand - p_ref. "pass" when p_value <= alpha, "fail" when
    ci_high < -margin, else "inconclusive".
    """
    ref = _bools(reference_pass, "reference_pass")
    cand = _bools(candidate_pass, "candidate_pass")
    if ref.size != cand.size:
        raise StatsError(f"paired samples differ in length: {ref.size} vs {cand.size}")
    if not 0 <= margin < 1:
        raise StatsError(f"margin must lie in [0, 1), got {margin}")
    _unit(alpha, "alpha")
    n = int(ref.size)
    gains = int(np.sum(cand & ~ref))  # candidate passes where reference failed
    losses = int(np.sum(ref & ~cand))
    p = _exact_noninferiority_p(n, gains, losses, margin)
    low, high = _tango_ci(n, gains, losses, alpha)
    outcome: Outcome = "inconclusive"
    if p <= alpha:
        outcome = "pass"
    elif high < -margin:
        outcome = "fail"
    return EquivalenceResult((gains - losses) / n, low, high, margin, p, outcome, n)


# --------------------------------------------------------------------------- multiplicity


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in input order, monotone and capped at 1."""
    if len(p_values) == 0:
        return []
    p = _array(p_values, "p_values")
    if np.any((p < 0) | (p > 1)):
        raise StatsError(f"p-values must lie in [0, 1], got {p[(p < 0) | (p > 1)][0]}")
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(p[order] * (m - np.arange(m)))
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return [float(v) for v in adjusted]


# --------------------------------------------------------------------------- accept length


def accept_length(tokens: Sequence[int], verify_steps: Sequence[int]) -> tuple[float, float]:
    """Speculative accept length: (pooled sum(tokens)/sum(verify), mean per-request ratio).

    Requests with ``verify_steps == 0`` (no speculation ran) are ignored. The pooled value
    weights long requests more; the per-request mean weights every request equally.
    """
    t = _array(tokens, "tokens")
    v = _array(verify_steps, "verify_steps")
    if t.size != v.size:
        raise StatsError(f"tokens and verify_steps differ in length: {t.size} vs {v.size}")
    if np.any(t < 0) or np.any(v < 0):
        raise StatsError("tokens and verify_steps must be >= 0")
    used = v > 0
    if not used.any():
        raise StatsError("no request has verify_steps > 0: speculation never ran")
    return float(t[used].sum() / v[used].sum()), float(np.mean(t[used] / v[used]))
