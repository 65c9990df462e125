"""Paired pass/fail non-inferiority: exact unconditional tests and Tango's score interval.

Pure functions of boolean arrays; bad input raises :class:`StatsError`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import optimize, special, stats

from .core import FloatArray, StatOutcome, StatsError, check_unit


@dataclass(frozen=True)
class EquivalenceResult:
    """An equivalence / non-inferiority judgement on a paired difference (candidate - ref)."""

    estimate: float
    ci_low: float
    ci_high: float
    margin: float
    p_value: float
    outcome: StatOutcome
    n: int


def tango_z(n: int, gains: npt.ArrayLike, losses: npt.ArrayLike, delta0: float) -> FloatArray:
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
    z_obs = float(tango_z(n, gains, losses, -margin))
    if n > _EXACT_MAX_N:
        return float(stats.norm.sf(z_obs))
    x, y = np.triu_indices(n + 1)  # all (x, y) with x + y <= n, via y' = y + x
    x, y = x.copy(), (y - x).copy()
    keep = tango_z(n, x, y, -margin) >= z_obs - 1e-9
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
            return float(tango_z(n, gains, losses, d0)) - target

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
    check_unit(alpha, "alpha")
    n = int(ref.size)
    gains = int(np.sum(cand & ~ref))  # candidate passes where reference failed
    losses = int(np.sum(ref & ~cand))
    p = _exact_noninferiority_p(n, gains, losses, margin)
    low, high = _tango_ci(n, gains, losses, alpha)
    outcome: StatOutcome = "inconclusive"
    if p <= alpha:
        outcome = "pass"
    elif high < -margin:
        outcome = "fail"
    return EquivalenceResult((gains - losses) / n, low, high, margin, p, outcome, n)


