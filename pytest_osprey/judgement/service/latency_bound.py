"""Confidence bounds on a latency percentile, clustered by prompt and by time unit.

The population is the trace's kind of prompts, each replayed a few times: the percentile is
that of a request drawn by first drawing a prompt, then one of its runs. Repetitions of a
prompt are not independent draws (a slow prompt is slow every time), so the order statistics
of all requests pooled overstate the information: the pooled 95% bound on p90 fell below
the true p90 in 6.5% (21 prompts x 2), 7.5% (50 x 2) and 15% (21 x 4) of simulated pilots.

Here the CDF at x is estimated with every unit weighted equally, ``F(x) = mean_i F_i(x)``,
its variance with the unit as the cluster, and the Clopper-Pearson bound is taken with the
effective sample size ``F (1 - F) / var`` (Korn & Graubard's interval for clustered
proportions, with their degrees-of-freedom correction). Where a unit-level variance cannot
be estimated (F = 0 or 1, e.g. every run below x) the design effect measured at the
empirical percentile is used. The bound on the percentile is the smallest x whose lower
bound on F(x) reaches q: one-sided at ``confidence``. Distribution-free in the latencies;
what it assumes is that units are independent (pass the block as the unit where requests
in flight together share stalls).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..stats.core import FloatArray, StatOutcome

IntArray = npt.NDArray[np.int64]


class BoundError(ValueError):
    """Values the bound cannot use (none, not finite, mismatched units)."""


@dataclass(frozen=True)
class LatencyBound:
    """A percentile's estimate, one-sided confidence bounds, and the verdict against a limit.

    ``bound`` (upper) is inf when the units cannot bound the percentile at this confidence
    (e.g. p90 from fewer than ~29 independent units); ``lower`` is -inf likewise.
    """

    estimate: float
    bound: float
    lower: float
    limit: float
    q: float
    confidence: float
    n_units: int
    n: int
    effective_n: float
    outcome: StatOutcome


def _cdf_parts(
    x: FloatArray, values: FloatArray, prompt: IntArray, time: IntArray | None
) -> tuple[FloatArray, FloatArray]:
    """(F(x), variance of F(x)) at each point of ``x`` (sorted): requests weighted so that
    every prompt counts equally, the variance clustered by prompt and, given ``time`` (each
    request's time unit), two-way by prompt and time unit (Cameron, Gelbach & Miller: prompt
    + time - their intersection, never below either one-way part)."""
    counts = np.bincount(prompt)
    w = 1.0 / (counts[prompt] * counts.size)  # (n,)
    at = np.searchsorted(x, values, side="left")  # first x >= the value: z_i(x) = 1 from there
    f: FloatArray = np.cumsum(np.bincount(at, weights=w, minlength=x.size + 1)[: x.size],
                              dtype=np.float64)

    def clustered(ids: IntArray) -> FloatArray:
        dense = np.unique(ids, return_inverse=True)[1]
        g = int(dense.max()) + 1
        if g < 2:
            return np.zeros(x.size)
        # Per cluster: S_g(x) = its weight at or below x; resid_g = S_g - F(x) W_g.
        steps = np.zeros((x.size + 1, g))
        np.add.at(steps, (at, dense), w)
        below = np.cumsum(steps, axis=0)[: x.size]
        resid = below - f[:, None] * np.bincount(dense, weights=w)[None, :]
        return np.asarray((resid ** 2).sum(axis=1) * g / (g - 1))

    var = clustered(prompt)
    if time is not None:
        by_time = clustered(time)
        both = clustered(prompt * (int(time.max()) + 1) + time)
        var = np.maximum(var + by_time - both, np.maximum(var, by_time))
    return f, var


def latency_bound(
    values: Sequence[float],
    units: Sequence[Hashable],
    q: float,
    limit: float,
    confidence: float = 0.95,
    time_units: Sequence[Hashable] | None = None,
) -> LatencyBound:
    """Bound the ``q``-quantile of latencies (``values``, one per request, grouped by
    ``units``: prompt ids, or blocks) and judge it against ``limit``. ``time_units`` (each
    request's stretch of time: boot, pass, block) clusters the variance two-way, so that a
    stall shared by the requests in flight together counts once however the prompts were
    grouped; the independent units are then the fewer of prompts and time units.

    "pass" when the upper bound <= limit; "fail" when the lower bound >= limit (the
    percentile is confidently above it); else "inconclusive".
    """
    from scipy import special, stats

    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0 or len(units) != arr.size:
        raise BoundError("need one unit per value and at least one value")
    if time_units is not None and len(time_units) != arr.size:
        raise BoundError("need one time unit per value")
    if not np.isfinite(arr).all():
        raise BoundError("latencies must be finite")
    if not (0 < q < 1 and 0.5 < confidence < 1) or math.isnan(limit):
        raise BoundError(f"q in (0, 1), confidence in (0.5, 1) and a limit, got {q}, "
                         f"{confidence}, {limit}")
    prompt = _dense(units)
    time = _dense(time_units) if time_units is not None else None
    n_units = int(prompt.max()) + 1
    if time is not None:
        n_units = min(n_units, int(time.max()) + 1)
    n = arr.size
    xs = np.unique(arr)
    f, _ = _cdf_parts(xs, arr, prompt, time)
    estimate = float(xs[min(int(np.searchsorted(f, q, side="left")), xs.size - 1)])
    alpha = 1 - confidence
    if n_units < 2:
        return LatencyBound(estimate, math.inf, -math.inf, limit, q, confidence, n_units, n,
                            1.0, "inconclusive")
    # One design effect for all x: the largest measured at empirical quantiles around q.
    # A per-x estimate from a few units is noisy, and an underestimate (too large an
    # effective size) is what makes a bound undercover.
    probes = np.quantile(arr, [max(q - 0.2, 0.05), max(q - 0.1, 0.05), q,
                               min(q + 0.05, 0.99)])
    f_p, var_p = _cdf_parts(probes, arr, prompt, time)
    srs = f_p * (1 - f_p) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(srs > 0, var_p / srs, np.nan)
    ceiling = n / n_units  # all runs of a unit alike: one observation per unit
    deff = float(np.clip(np.nanmax(ratios), 1.0, ceiling)) if np.isfinite(ratios).any() \
        else ceiling
    n_eff = np.full(xs.shape, n / deff)
    # Korn-Graubard: shrink the effective size by (z / t_{units-1})^2 at the one-sided level.
    n_eff = n_eff * (float(special.ndtri(1 - alpha)) / float(
        special.stdtrit(n_units - 1, 1 - alpha))) ** 2
    hits = n_eff * f
    low_f = np.where(hits > 0, stats.beta.ppf(alpha, hits, n_eff - hits + 1), 0.0)
    high_f = np.where(hits < n_eff, stats.beta.ppf(1 - alpha, hits + 1, n_eff - hits), 1.0)
    ok_upper = np.flatnonzero(low_f >= q)
    bound = float(xs[ok_upper[0]]) if ok_upper.size else math.inf
    ok_lower = np.flatnonzero(high_f < q)
    lower = float(xs[ok_lower[-1]]) if ok_lower.size else -math.inf
    outcome: StatOutcome = "inconclusive"
    if bound <= limit:
        outcome = "pass"
    elif lower >= limit:
        outcome = "fail"
    at = min(int(np.searchsorted(xs, estimate)), xs.size - 1)
    return LatencyBound(estimate, bound, lower, limit, q, confidence, n_units, n,
                        float(n_eff[at]), outcome)


def _dense(ids: Sequence[Hashable]) -> IntArray:
    """Labels as dense integers 0..k-1, in order of first appearance."""
    seen: dict[Hashable, int] = {}
    return np.asarray([seen.setdefault(u, len(seen)) for u in ids], dtype=np.int64)
