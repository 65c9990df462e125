"""Early stopping for the speed gate with three outcomes at every look.

At look k (after pass k with one boot; after boot k+1 with several) the deciding test of
:mod:`.speedup` is run on the data so far and its one-sided p-value mapped to
the normal scale (``z = Phi^-1(1 - p)``, so small-sample t-tests keep their level). Then:

* **keep** when z >= ``keep[k]``: boundaries from a Kim-DeMets power spending function
  ``alpha * t**rho`` over the information fraction t (share of the planned requests), so
  the false-keep rate over all looks is ``alpha``;
* **drop** when the speedup is *confidently below the threshold*: z <= -``drop[k]``, the
  same construction with its own rate ``alpha_drop`` (P(drop | true speedup = threshold)
  <= alpha_drop). Never "not shown faster";
* **inconclusive, stop** (interim looks only): even if the rest of the campaign went the way
  the data so far point (the current trend), the chance that the last look keeps, or drops,
  is below ``futility_power`` (stochastic curtailment): finishing would most likely end
  inconclusive too. The trend is read from the look's t statistic (the estimate in units of
  its standard error), not from z: z carries the penalty for estimating the variance with the
  look's few df (a t of 3 on one df is z = 1.28), a penalty the last look, with more time
  units, mostly sheds, so a trend read from z runs low wherever early looks have few df (one
  or three at x32 on 50 prompts) and stopped campaigns the full test would keep. Its cost is
  measured, not bounded: the power lost at a given true speedup
  (benchmarks/stats_calibration.py, benchmarks/sequential_looks.py print it);
* otherwise **continue**; at the last look, **inconclusive**.

All three boundaries are non-binding (each computed as if the others did not exist): a look
that ignores one of them only lowers that rule's error, so false keep stays <= alpha whatever
the campaign does. Boundaries assume independent increments of the score process; repeated
passes over the same prompts make looks more correlated than that, which (Slepian) only
lowers the crossing probabilities, so the plan errs on the conservative side.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from .drift import Drift
from .speedup import (
    FloatArray,
    Metric,
    MetricResult,
    PairedLatencies,
    SpeedError,
    SpeedResult,
    speed_test,
)

Decision = Literal["keep", "drop", "inconclusive", "continue"]
_GRID = 1201


@dataclass(frozen=True)
class SequentialPlan:
    """z boundaries per look (keep: z >= keep[k]; drop: z <= -drop[k]) and the inconclusive
    stop of interim looks: -stop[k] < z < stop[k] (0 where no such stop is allowed)."""

    looks: int
    information: tuple[float, ...]
    alpha: float
    alpha_drop: float
    futility_power: float
    rho: float
    keep: tuple[float, ...]
    drop: tuple[float, ...]
    stop: tuple[float, ...]


def power_spending(t: float, total: float, rho: float) -> float:
    """Kim-DeMets power family: ``total * t**rho`` spent by information fraction t."""
    return float(total * min(max(t, 0.0), 1.0) ** rho)


def spending_bounds(information: Sequence[float], spent: Sequence[float]) -> list[float]:
    """One-sided z boundaries whose first-crossing probabilities (canonical Brownian score
    process, independent increments) equal the increments of ``spent``."""
    from scipy import optimize, stats

    out: list[float] = []
    grid = np.zeros(1)
    weights = np.ones(1)  # a point mass at 0 before the first look
    prev_t, prev_spent = 0.0, 0.0
    for t, s in zip(information, spent, strict=True):
        step, target = t - prev_t, s - prev_spent
        sd = math.sqrt(step)

        def excess(
            c: float, t: float = t, sd: float = sd, grid: FloatArray = grid,
            weights: FloatArray = weights, target: float = target,
        ) -> float:
            return float(weights @ stats.norm.sf((c * math.sqrt(t) - grid) / sd)) - target

        c = math.inf if target <= 1e-15 else float(
            optimize.brentq(excess, -20.0, 60.0, xtol=1e-10))
        out.append(c)
        top = c * math.sqrt(t) if math.isfinite(c) else 10 * math.sqrt(t)
        new = np.linspace(-10 * math.sqrt(t), top, _GRID)
        dens = stats.norm.pdf((new[:, None] - grid[None, :]) / sd) / sd @ weights
        trap = np.full(_GRID, new[1] - new[0])
        trap[[0, -1]] /= 2
        grid, weights = new, dens * trap
        prev_t, prev_spent = t, s
    return out


def sequential_plan(
    looks: int,
    alpha: float = 0.025,
    alpha_drop: float | None = None,
    futility_power: float = 0.20,
    rho: float = 2.0,
    information: Sequence[float] | None = None,
) -> SequentialPlan:
    """Boundaries for ``looks`` looks at ``information`` fractions (default equal steps).

    ``rho`` = 2 (between Pocock, rho ~ 1, and O'Brien-Fleming, rho ~ 3): with few clusters a
    look's t-test has few degrees of freedom, so a boundary very strict early (OBF) is almost
    never crossed and saves nothing, while rho = 1 costs a visible part of the fixed design's
    power; rho = 2 keeps the final boundary near the fixed design's (see
    benchmarks/stats_calibration.py for the trade-off measured).
    """
    info = None if information is None else tuple(float(t) for t in information)
    return _plan(looks, alpha, alpha_drop, futility_power, rho, info)


@functools.lru_cache(maxsize=256)
def _plan(
    looks: int,
    alpha: float,
    alpha_drop: float | None,
    futility_power: float,
    rho: float,
    information: tuple[float, ...] | None,
) -> SequentialPlan:
    if not 1 <= looks <= 20:
        raise SpeedError(f"looks must be between 1 and 20, got {looks}")
    info = list(information) if information is not None else [
        (k + 1) / looks for k in range(looks)]
    if len(info) != looks or any(b <= a for a, b in zip([0.0, *info], info, strict=False)):
        raise SpeedError("information fractions must increase, one per look")
    if abs(info[-1] - 1.0) > 1e-12:
        raise SpeedError("the last look must have information fraction 1")
    drop_rate = alpha if alpha_drop is None else alpha_drop
    for name, v in (("alpha", alpha), ("alpha_drop", drop_rate),
                    ("futility_power", futility_power)):
        if not 0 <= v < 0.5:
            raise SpeedError(f"{name} must lie in [0, 0.5), got {v}")
    if not rho > 0:
        raise SpeedError(f"rho must be positive, got {rho}")
    keep = spending_bounds(info, [power_spending(t, alpha, rho) for t in info])
    drop = spending_bounds(info, [power_spending(t, drop_rate, rho) for t in info])
    # Conditional power under the current trend (drift s_k / sqrt(t_k), s_k the look's
    # statistic on the t scale, see decide) of crossing the last keep boundary:
    # Phi((s_k / sqrt(t_k) - keep_L) / sqrt(1 - t_k)); below futility_power when
    # s_k < sqrt(t_k) * (keep_L + sqrt(1 - t_k) * Phi^-1(futility_power)). Same for drop.
    stop = [0.0] * looks
    if futility_power > 0:
        from scipy import special

        q = float(special.ndtri(futility_power))
        for k, t in enumerate(info[:-1]):
            edge = min(keep[-1], drop[-1]) + math.sqrt(1 - t) * q
            stop[k] = max(0.0, math.sqrt(t) * edge)
    return SequentialPlan(looks, tuple(info), alpha, drop_rate, futility_power, rho,
                          tuple(keep), tuple(drop), tuple(stop))


def z_from_p(p: FloatArray) -> FloatArray:
    """Normal quantile with the same upper tail probability as a one-sided p-value."""
    from scipy import special

    return np.asarray(-special.ndtri(np.clip(p, 1e-300, 1.0)), dtype=np.float64)


def decide(
    z: FloatArray, plan: SequentialPlan, look: int, df: FloatArray | None = None
) -> npt.NDArray[np.int64]:
    """Vectorised decision codes at ``look`` (1-based) from z against the threshold:
    2 keep, 0 drop, 1 inconclusive (a stop at an interim look, or the last look), -1 continue.

    With ``df`` (the deciding test's degrees of freedom), the futility stop judges the trend
    on the t scale: the t statistic with z's p-value on ``df`` (|t| >= |z|, equal as df
    grows), so a look with few df does not stop campaigns whose estimate is on course; and a
    look whose test has no df - one time unit so far, e.g. the first pass of a level whose
    block holds the whole trace - decides nothing: it continues (inconclusive at the last
    look), never stops for futility.
    """
    k = look - 1
    out = np.full(z.shape, -1, dtype=np.int64)
    if look == plan.looks:
        out[:] = 1
    else:
        out[np.abs(t_from_z(z, df)) < plan.stop[k]] = 1
    out[z <= -plan.drop[k]] = 0
    out[z >= plan.keep[k]] = 2
    if df is not None:
        out[np.broadcast_to(df < 1, out.shape)] = 1 if look == plan.looks else -1
    return out


def t_from_z(z: FloatArray, df: FloatArray | None) -> FloatArray:
    """The t statistic on ``df`` degrees of freedom with the same one-sided p-value as z
    (the inverse of ``z_from_p`` applied to a t-test's p); z itself where ``df`` is None."""
    if df is None:
        return z
    from scipy import special

    d = np.broadcast_to(np.asarray(df, dtype=np.float64), z.shape)
    t = special.stdtrit(np.maximum(d, 1e-9), special.ndtr(z))
    return np.asarray(np.where(d >= 1, t, z), dtype=np.float64)


_NAMES: dict[int, Decision] = {2: "keep", 0: "drop", 1: "inconclusive", -1: "continue"}


@dataclass(frozen=True)
class Look:
    """The decision at one look, with the nominal (fixed-design) test at that look."""

    look: int
    looks: int
    decision: Decision
    z: float
    keep_boundary: float
    drop_boundary: float
    stop_boundary: float
    result: SpeedResult

    @property
    def gating(self) -> MetricResult:
        return self.result.gating

    def summary(self) -> str:
        # Two scales, each named: the boundaries are on the normal scale (the t statistic
        # mapped through its df), the futility stop on the t statistic itself.
        text = (f"group-sequential {self.decision.upper()} at look {self.look}/{self.looks} "
                f"(statistic {self.z:.2f} on the normal scale: keep at >= "
                f"{self.keep_boundary:.2f}, drop at <= {-self.drop_boundary:.2f}")
        if self.look < self.looks and self.stop_boundary > 0:
            text += (f"; futility on the t scale: stop inconclusive at |t| < "
                     f"{self.stop_boundary:.2f}, t {self.result.gating.t:.2f} on "
                     f"{self.result.gating.df:.0f} df")
        return text + ")"


def sequential_look(
    data: PairedLatencies,
    plan: SequentialPlan,
    look: int,
    threshold: float = 1.0,
    metric: Metric = "per_prompt",
    confidence: float = 0.95,
    drift: Drift | None = None,
) -> Look:
    """Decide at ``look`` from the data seen so far (``PairedLatencies.upto``).

    ``confidence`` sets the nominal interval shown; the decision uses the plan's boundaries.
    With an unstable ``drift`` a keep or a drop must also hold on the drift-adjusted speedup
    (``SpeedResult.drift_adjusted``); otherwise the campaign continues (inconclusive at the
    end).
    """
    if not 1 <= look <= plan.looks:
        raise SpeedError(f"look {look} outside the plan's 1..{plan.looks}")
    res = speed_test(data, threshold, confidence, metric, drift)
    z = float(z_from_p(np.array([res.gating.p_value]))[0])
    code = int(decide(np.array([z]), plan, look, np.array([res.gating.df]))[0])
    adjusted = res.drift_adjusted  # set when the environment was unstable
    if (code == 2 and (res.n_clusters < 2 or (adjusted is not None
                                              and adjusted.outcome != "pass"))) or (
            code == 0 and adjusted is not None and adjusted.outcome != "fail"):
        code = 1 if look == plan.looks else -1
    k = look - 1
    return Look(look, plan.looks, _NAMES[code], z, plan.keep[k], plan.drop[k], plan.stop[k], res)
