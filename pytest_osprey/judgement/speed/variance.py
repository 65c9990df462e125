"""The variance of a speed estimate (pure numpy/scipy, batched over campaigns): clustered two
ways, by prompt and by time unit (Cameron, Gelbach & Miller), the time part with a serial
(HAC) term where a unit holds few requests of a condition, and the between-boot component
where a condition booted more than once. :mod:`.speedup` turns it into the deciding test."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..stats.core import FloatArray
from .data import IntArray

DF_QUANTILE = 0.25  # boots: df evaluated at the boot mean square / its chi2 lower quartile


@dataclass(frozen=True)
class _Variance:
    var: FloatArray  # (S,) two-way cluster-robust, plus the between-boot component
    df: FloatArray
    boot_var: FloatArray
    between_rows: FloatArray  # variance of per-prompt mean values (mean form)
    prompts: FloatArray  # prompt clusters with data
    units: FloatArray  # time units with data
    serial: FloatArray  # effective time clusters of the serial term (0: not active)


def two_way(psi: FloatArray, ok: npt.NDArray[np.bool_], units: IntArray) -> _Variance:
    """Variance of ``sum(psi)`` clustered two ways (Cameron, Gelbach & Miller 2011): by prompt
    (its stable effect recurs in every pass) and by time unit (noise shared in time), minus
    their intersection (one cell), each with its CR1 factor; never below either one-way
    variance (the difference can fall under both by chance). df = min(prompts, time units) - 1:
    the scarcer dimension bounds what the data can say about its component. At low load the
    time dimension is the serial term of :func:`_serial` instead (units read as a time
    series), and its effective clusters replace the units in df. With b >= 2
    boots, the prompt part carries the two-way method-of-moments between-boot component of
    ``_mean_variance`` (its df when smaller).
    """
    n_sims, n_boots = psi.shape[0], psi.shape[1]
    present: npt.NDArray[np.bool_] = np.asarray(ok.any(axis=(1, 2)))  # (S,n)
    k = np.maximum(present.sum(axis=1).astype(np.float64), 1.0)
    values = psi.sum(axis=2) * (n_boots * k)[:, None, None]  # (S,B,n) mean form
    var_pb, df_p, boot_var, between_rows = _mean_variance(values, present)
    var_p = var_pb - boot_var
    u = np.broadcast_to(units, psi.shape)
    valid = ok & (u >= 0)
    n_units = int(u.max()) + 1 if u.size else 1
    flat = (np.arange(n_sims)[:, None, None, None] * n_units + u)[valid]
    sums = np.bincount(flat, weights=psi[valid], minlength=n_sims * n_units)
    seen = np.bincount(flat, minlength=n_sims * n_units).reshape(n_sims, n_units) > 0
    g = seen.sum(axis=1).astype(np.float64)
    var_t = (sums.reshape(n_sims, n_units) ** 2).sum(axis=1) * g / np.maximum(g - 1, 1.0)
    n_obs = valid.sum(axis=(1, 2, 3)).astype(np.float64)
    var_i = (np.where(valid, psi, 0.0) ** 2).sum(axis=(1, 2, 3)) * n_obs / np.maximum(
        n_obs - 1, 1.0)
    var_s, eff = _serial(np.asarray(sums, dtype=np.float64).reshape(n_sims, n_units), seen,
                         n_obs / np.maximum(g, 1.0))
    var_t = np.where(eff > 0, var_s, var_t)
    g_t = np.where(eff > 0, eff, g)
    # Floored at the larger one-way variance. With the serial term its lag terms leave
    # var_t - var_i noisy about 0 without serial noise, so the floor biases the variance up
    # 14-17% at x1-x4 (reference noise); floored only where not positive it is unbiased but
    # wider than its df say: false keep 2.9-3.2% at x4 (reference noise), 1.6% floored.
    var = np.maximum(var_p + var_t - var_i, np.maximum(var_p, var_t)) + boot_var
    df = np.minimum(df_p, np.maximum(g_t - 1, 0.0))
    return _Variance(var, df, boot_var, between_rows, present.sum(axis=1).astype(np.float64), g,
                     eff)


SERIAL_BELOW = 8
"""The serial term is on where a time unit holds fewer paired requests than this (x1-x4)."""
SERIAL_SPAN = (10, 4)
"""Requests of one condition the serial term's kernel reaches over, after prewhitening:
where a unit holds one (x1), and where it holds several. Calibrated against stalls of 2-8
consecutive requests of one condition (docs/speed-calibration.md)."""
SERIAL_MIN_SPAN = 4
SERIAL_B = 0.12
"""The kernel's reach is at least this share of the units (fixed-b: the smoothing bias left
by a fixed reach does not shrink as the campaign grows; at 50 prompts x1 a reach of 11
units left false keeps at 3.3%)."""
SERIAL_RHO_MAX = 0.5
"""Bound on the prewhitening AR(1) coefficient: recolouring divides by (1 - rho)^2, which an
overestimated rho inflates without bound (bound 0.6: power at 1.5x under 10% stalls 0.78 at
x1, 0.79 at x4, against 0.79 and 0.80 at 0.5; bound 0.8 with a reach of 16: 0.71 and 0.77)."""
PARZEN_MEAN = 0.75  # integral of the Parzen kernel over [-1, 1]
PARZEN_SQUARE = 0.539285  # integral of its square: the estimate's precision (Kiefer-Vogelsang)


def parzen(x: FloatArray) -> FloatArray:
    x = np.abs(x)
    return np.where(x <= 0.5, 1 - 6 * x * x + 6 * x**3, np.where(x < 1, 2 * (1 - x) ** 3, 0.0))


def serial_span(cells: FloatArray, count: FloatArray) -> FloatArray:
    """The serial term's kernel reach in units (the lag where its weight falls to 0), given
    the paired cells per unit and the units that ran."""
    reach = np.where(cells < 1.5, SERIAL_SPAN[0], SERIAL_SPAN[1])
    # At least SERIAL_MIN_SPAN units (a stall of 8 requests can touch three units of 4) and
    # SERIAL_B of the units.
    span = np.maximum(np.ceil(reach / np.maximum(cells, 1.0)) + 1, SERIAL_MIN_SPAN)
    span = np.maximum(span, np.ceil(SERIAL_B * count))
    # A campaign (or an early look) with fewer units than two reaches cannot measure a
    # correlation that long: the reach is cut to half its units (b <= 0.5).
    return np.asarray(np.minimum(span, np.maximum(count / 2, 2.0)), dtype=np.float64)


def serial_clusters(cells: FloatArray, count: FloatArray) -> FloatArray:
    """The serial term's effective time clusters (fixed-b: ``1 / (0.539 b)``, b = reach /
    units) where it is on (fewer than :data:`SERIAL_BELOW` cells a unit), else 0."""
    b = np.minimum(serial_span(cells, count) / np.maximum(count, 1.0), 1.0)
    return np.where(cells < SERIAL_BELOW, 1 / (PARZEN_SQUARE * b), 0.0)


def serial_reach(clusters: float, units: int) -> int | None:
    """The serial term's reach in units from its effective clusters (``1 / (0.539 b)``,
    b = reach / units), None where it is off (0 clusters)."""
    return round(units / (PARZEN_SQUARE * clusters)) if clusters > 0 else None


def _serial(
    sums: FloatArray, seen: npt.NDArray[np.bool_], cells: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """(time-dimension variance, its effective clusters; both 0 where inactive).

    ``sums``: per campaign the influence sums of the time units in the order they ran,
    ``cells``: paired cells per unit. Where a unit holds fewer than :data:`SERIAL_BELOW`
    requests of a condition (at x1 one), a stall of one server spans several consecutive
    units, which clustering by unit would count as independent draws. The unit sums then
    enter a HAC (Newey-West type) variance with the Parzen kernel, prewhitened by an AR(1)
    fit (coefficient within +-:data:`SERIAL_RHO_MAX`), reaching over :data:`SERIAL_SPAN`
    requests of a condition (``M`` units, at least :data:`SERIAL_MIN_SPAN` and
    :data:`SERIAL_B` of the units: 11 at x1 with 84 units, 4 at x4; at most half the units;
    :func:`serial_span`). Few units: fixed-b (Kiefer & Vogelsang 2005): the estimate of
    centred sums is biased low by about ``1 - 0.75 b`` (b = M / units) and as precise as
    ``1 / (0.539 b)`` independent clusters, which stand in for the time units in df.
    Calibration: docs/speed-calibration.md.
    """
    n_sims, n_units = sums.shape
    active = cells < SERIAL_BELOW
    if not active.any():
        return np.zeros(n_sims), np.zeros(n_sims)
    # Close the gaps left by units without data: the k-th unit that ran is the k-th term.
    rank = np.cumsum(seen, axis=1) - 1
    flat = (np.arange(n_sims)[:, None] * n_units + np.where(seen, rank, 0)).ravel()
    terms = np.bincount(flat, weights=np.where(seen, sums, 0.0).ravel(),
                        minlength=n_sims * n_units).reshape(n_sims, n_units)
    count = seen.sum(axis=1).astype(np.float64)
    span = serial_span(cells, count)
    # AR(1) prewhitening (Andrews & Monahan 1992): the kernel weights a stall's lags inside
    # its reach below 1, so a plain HAC stays some 10% low with many requests in stalls;
    # the residuals of an AR(1) fit carry little of that correlation, and recolouring by
    # 1 / (1 - rho)^2 restores it in full.
    lag1 = (terms[:, 1:] * terms[:, :-1]).sum(axis=1)
    lag0 = (terms**2).sum(axis=1)
    rho = np.clip(lag1 / np.where(lag0 > 0, lag0, 1.0), -SERIAL_RHO_MAX, SERIAL_RHO_MAX)
    resid = terms.copy()
    resid[:, 1:] -= rho[:, None] * terms[:, :-1]
    resid = np.where(np.arange(n_units)[None, :] < count[:, None], resid, 0.0)
    var = (resid**2).sum(axis=1)
    # Every lag's kernel weights at once (thousands of lags at 10^4 units; the same numbers
    # as lag by lag), then each lag's products in turn (as before: the same sums).
    lags = np.arange(1, int(span[active].max()))
    weights = 2 * parzen(lags[:, None] / span[None, :])
    for lag, weight in zip(lags.tolist(), weights, strict=True):
        var += weight * (resid[:, lag:] * resid[:, :-lag]).sum(axis=1)
    var = np.maximum(var, 0.0) / (1 - rho) ** 2
    b = np.minimum(span / np.maximum(count, 1.0), 1.0)
    var = var / (1 - PARZEN_MEAN * b)
    return np.where(active, var, 0.0), np.where(active, 1 / (PARZEN_SQUARE * b), 0.0)


def _mean_variance(
    values: FloatArray, present: npt.NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Variance of the grand mean of centred cell values ``(S, boots, clusters)``.

    Returns (var, df, boot_var, between-cluster variance of cluster means). Clusters: CR1
    over the cluster means (boots averaged), df = clusters - 1. Boots (b >= 2): two-way
    method of moments - boot means' variance minus the interaction mean square / clusters
    estimates the between-boot component (truncated at 0), added with Satterthwaite degrees
    of freedom (evaluated at an upper value of the boot component, see below).
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
