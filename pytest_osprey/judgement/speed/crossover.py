"""Up to which concurrency does speculation pay: the crossover of a candidate's speedup with
the threshold across closed-loop load levels, with a confidence interval (pure numpy/scipy).

Model: the log speedup as a function of ``x = log2(concurrency)``, known at the tested levels
with the speed gates' estimates and CIs. Between two tested levels it is interpolated
linearly; nothing is extrapolated beyond the tested range.

* Point estimate: the weighted monotone (non-increasing) fit of the per-level log estimates
  (weights: inverse variances), interpolated, where it falls through ``log(threshold)``. The
  monotone fit makes one crossing out of noisy levels that zig-zag around the threshold.
* Interval: test inversion. ``x`` is in the confidence set when the interpolated log speedup
  at ``x`` is not distinguishable from the threshold (two-sided, at the gates' confidence).
  Its variance counts the covariance of the two neighbouring levels: they replay the same
  prompts (stable prompt-to-prompt variation is common to both) and the same boots, so that
  part of a level's variance is taken as shared (``shared_share``, the gate's detail of that
  name, see :func:`shared_share`); noise shared in time (shocks, stalls, correlated request
  noise) lands in each level's own time units and is taken as each level's own.
  The interval is the stretch of that set around the estimate, open at an end of the tested
  range that it reaches: the crossing may lie beyond it, and nothing here says how far. (For
  a total-time metric, whose interval is Fieller's and asymmetric, the standard error is
  read from the interval's width.)

Validated by simulation (tests/judgement/test_crossover.py, benchmarks/crossover_coverage.py, see
docs/crossover.md): per-level estimates drawn around a known curve with a known crossing,
independent and correlated between levels, and whole campaigns through the replay planner
under noise shared in time, cover it at the nominal rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy import optimize, special

from ..gates.result import GateResult
from ..stats.core import FloatArray

Status = Literal["crosses", "pays_everywhere", "pays_nowhere", "not_estimable"]
MIN_LEVELS = 3
"""Closed-loop levels needed: through two, a straight line is the whole model and nothing
checks its shape."""
GRID = 801
"""Points per gap between two tested levels at which the confidence set is evaluated."""


@dataclass(frozen=True)
class LevelSpeedup:
    """One closed-loop level's speedup (> 1: the candidate is faster) and its CI."""

    level: str
    concurrency: int
    estimate: float
    ci_low: float
    ci_high: float
    df: float = math.inf
    """Degrees of freedom of the interval's t quantile (inf: normal)."""
    shared_share: float = 0.0
    """Share of the log estimate's variance common to the other levels (0-1)."""


@dataclass(frozen=True)
class Crossover:
    """Where the speedup stops clearing the threshold. ``ci_low``/``ci_high`` None: the
    interval is open at that end of the tested range (the crossing may lie beyond it)."""

    status: Status
    concurrency: float | None
    ci_low: float | None
    ci_high: float | None
    threshold: float
    confidence: float
    levels: tuple[str, ...] = ()
    concurrencies: tuple[int, ...] = ()
    reason: str = ""
    fit: tuple[float, ...] = field(default=())
    """The monotone fit's speedup at each level (as ``levels``)."""

    def text(self) -> str:
        """One line for the diagnosis, e.g. ``speculation pays up to about x12 [8, 20]``."""
        if self.status == "not_estimable":
            return f"crossover not estimated: {self.reason}"
        top, bottom = max(self.concurrencies), min(self.concurrencies)
        low = concurrency_text(self.ci_low) if self.ci_low is not None else f"<={bottom}"
        high = concurrency_text(self.ci_high) if self.ci_high is not None else f">={top}"
        where = f"{self.confidence:.0%} CI [{low}, {high}]"
        if self.status == "crosses":
            assert self.concurrency is not None
            return (f"speculation pays up to about x{concurrency_text(self.concurrency)} "
                    f"[{low}, {high}] "
                    f"({self.confidence:.0%} CI of where its speedup falls to "
                    f"{self.threshold:g}x)")
        if self.status == "pays_everywhere":
            return (f"speculation pays at every level tested (>= x{top}); crossover "
                    f"{where}")
        return f"speculation pays at no level tested (<= x{bottom}); crossover {where}"

    def as_dict(self) -> dict[str, Any]:
        """summary.json's ``crossover`` entry."""
        return {"status": self.status, "concurrency": self.concurrency,
                "ci": [self.ci_low, self.ci_high], "levels": list(self.levels),
                "concurrencies": list(self.concurrencies), "threshold": self.threshold,
                "fit": list(self.fit), "reason": self.reason,
                "text": self.text()}


def concurrency_text(c: float) -> str:
    """A concurrency as the reports write it: ``12``, ``8.1``, ``4``."""
    return f"{c:.0f}" if c >= 10 else f"{c:.1f}".removesuffix(".0")


def _not_estimable(reason: str, threshold: float, confidence: float,
                   levels: Sequence[LevelSpeedup] = ()) -> Crossover:
    return Crossover("not_estimable", None, None, None, threshold, confidence,
                     tuple(lv.level for lv in levels),
                     tuple(lv.concurrency for lv in levels), reason)


def _usable(lv: LevelSpeedup) -> bool:
    values = (lv.estimate, lv.ci_low, lv.ci_high)
    return all(math.isfinite(v) and v > 0 for v in values) and lv.ci_high > lv.ci_low


def crossover(levels: Sequence[LevelSpeedup], threshold: float,
              confidence: float = 0.95) -> Crossover:
    """The concurrency at which the speedup falls to ``threshold``, with its interval at
    ``confidence`` (the level of the gates' CIs, two-sided)."""
    if not (threshold > 0 and math.isfinite(threshold)) or not 0.5 < confidence < 1:
        raise ValueError(f"threshold {threshold} / confidence {confidence} out of range")
    ranked = sorted(levels, key=lambda lv: lv.concurrency)
    seen: dict[int, str] = {}
    for lv in ranked:
        if lv.concurrency in seen:
            return _not_estimable(f"levels {seen[lv.concurrency]} and {lv.level} share "
                                  f"x{lv.concurrency}", threshold, confidence, ranked)
        seen[lv.concurrency] = lv.level
    # A level without a finite interval (one block, a failed gate) says nothing about the
    # curve: it is left out, and the result says so.
    unusable = [lv.level for lv in ranked if not _usable(lv)]
    note = f"left out (no finite speedup interval): {', '.join(unusable)}" if unusable else ""
    ranked = [lv for lv in ranked if _usable(lv)]
    if len(ranked) < MIN_LEVELS:
        tested = ", ".join(f"x{lv.concurrency}" for lv in ranked) or "none"
        return _not_estimable(f"{len(ranked)} closed-loop level(s) judged ({tested}); "
                              f"{MIN_LEVELS} or more are needed" + (f"; {note}" if note else ""),
                              threshold, confidence, ranked)

    x = np.log2([lv.concurrency for lv in ranked])
    y = np.log([lv.estimate for lv in ranked])
    q = np.array([_quantile(lv.df, confidence) for lv in ranked])
    se = (np.log([lv.ci_high for lv in ranked]) - np.log([lv.ci_low for lv in ranked])) / (2 * q)
    shared = np.sqrt(np.clip([lv.shared_share for lv in ranked], 0.0, 1.0))
    cov = np.outer(shared * se, shared * se)
    np.fill_diagonal(cov, se**2)
    log_thr = math.log(threshold)
    names = tuple(lv.level for lv in ranked)
    concs = tuple(lv.concurrency for lv in ranked)

    fit = optimize.isotonic_regression(y, weights=1 / se**2, increasing=False).x
    base = Crossover("crosses", None, None, None, threshold, confidence, names, concs, note,
                     fit=tuple(float(v) for v in np.exp(fit)))
    if y[0] < log_thr <= y[-1]:
        return _not_estimable(
            f"the speedup rises with concurrency (below {threshold:g}x at x{concs[0]}, above "
            f"at x{concs[-1]}): no point where speculation stops paying"
            + (f"; {note}" if note else ""), threshold, confidence, ranked)

    if fit[-1] >= log_thr:
        status: Status = "pays_everywhere"
        at = float(x[-1])
    elif fit[0] < log_thr:
        status, at = "pays_nowhere", float(x[0])
    else:
        j = int(np.flatnonzero(fit >= log_thr)[-1])
        w = (fit[j] - log_thr) / (fit[j] - fit[j + 1])
        status, at = "crosses", float(x[j] + w * (x[j + 1] - x[j]))
    point = float(2**at) if status == "crosses" else None
    span = _confidence_set(x, y, cov, q, log_thr, at)
    if span is None:  # every point distinguishable from the threshold (a raw crossing
        # always is not, so the status is one of the two below): the side it lies on
        low, high = (float(concs[-1]), None) if status == "pays_everywhere" \
            else (None, float(concs[0]))
    else:
        low = None if span[0] <= x[0] else float(2 ** span[0])
        high = None if span[1] >= x[-1] else float(2 ** span[1])
    # A monotone speedup that pays everywhere (nowhere) crosses beyond the top (bottom).
    if status == "pays_everywhere":
        high = None
    elif status == "pays_nowhere":
        low = None
    return _replace(base, status, point, low, high)


def _replace(base: Crossover, status: Status, point: float | None, low: float | None,
             high: float | None) -> Crossover:
    return Crossover(status, point, low, high, base.threshold, base.confidence, base.levels,
                     base.concurrencies, base.reason, base.fit)


def _quantile(df: float, confidence: float) -> float:
    p = 1 - (1 - confidence) / 2
    if not math.isfinite(df):
        return float(special.ndtri(p))
    return float(special.stdtrit(max(df, 1e-9), p))


def _confidence_set(x: np.ndarray, y: np.ndarray, cov: np.ndarray, q: np.ndarray,
                    log_thr: float, at: float) -> tuple[float, float] | None:
    """The stretch of the tested range around ``at`` (the point estimate, or the nearest
    such point) where the interpolated log speedup is not distinguishable from ``log_thr``.

    The whole set can break into pieces where noisy levels zig-zag about the threshold; its
    hull then over-covers (97% for a nominal 95% with independent levels, in simulation),
    the piece at the estimate covers at the nominal rate. None when there is no such point.
    """
    xs, keep = [], []
    w = np.linspace(0.0, 1.0, GRID)
    for j in range(len(x) - 1):
        est = (1 - w) * y[j] + w * y[j + 1]
        var = ((1 - w) ** 2 * cov[j, j] + w**2 * cov[j + 1, j + 1]
               + 2 * w * (1 - w) * cov[j, j + 1])
        # Of the two levels' t quantiles the larger (conservative where their df differ).
        crit = max(q[j], q[j + 1])
        xs.append(x[j] + w * (x[j + 1] - x[j]))
        keep.append(np.abs(est - log_thr) <= crit * np.sqrt(var))
    grid, inside = np.concatenate(xs), np.concatenate(keep)
    if not inside.any():
        return None
    i = int(np.argmin(np.where(inside, np.abs(grid - at), np.inf)))
    out = np.flatnonzero(~inside)
    below, above = out[out < i], out[out > i]
    first = int(below[-1]) + 1 if below.size else 0
    last = int(above[0]) - 1 if above.size else grid.size - 1
    return float(grid[first]), float(grid[last])


def shared_share(between: FloatArray | float, clusters: FloatArray | float,
                 boot_var: FloatArray | float, var: FloatArray | float) -> FloatArray:
    """Share of a level's log-speedup variance that the other levels hold too: the stable
    prompt-to-prompt part (``between`` per prompt, over ``clusters`` prompts: the same
    prompts at every level) and the between-boot part (the same boots). Noise shared in time
    is not in it: each level replays its own stretches, so a shock or a stall lands in one
    level's time units only, and the two-way variance counts it in that level's variance.
    (``1 - time_share`` is not this share: the time share counts pass-to-pass variation of
    single prompts, not the shocks the time-unit clusters add.)"""
    between, clusters = np.asarray(between, float), np.maximum(np.asarray(clusters, float), 1.0)
    boot_var, var = np.asarray(boot_var, float), np.asarray(var, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = (np.maximum(between, 0.0) / clusters + np.maximum(boot_var, 0.0)) / var
    return np.asarray(np.where(var > 0, np.clip(np.nan_to_num(share), 0.0, 1.0), 0.0),
                      dtype=np.float64)


def levels_from_gates(gates: Sequence[GateResult],
                      concurrency: Mapping[str, int]) -> list[LevelSpeedup]:
    """The closed-loop levels among ``gates`` (one candidate's speedup gates against one
    reference, no slice): ``concurrency`` maps each closed-loop level to its concurrency
    (open-loop levels are left out of it). A gate without a finite estimate and CI is kept
    with NaNs, so that the crossover says which level it lacks."""
    out = []
    for g in gates:
        load = g.spec.load
        if load is None or load not in concurrency or g.spec.slice is not None:
            continue
        metric = g.details.get("metric")
        part = g.details.get(metric) if isinstance(metric, str) else None
        df = part.get("df") if isinstance(part, Mapping) else None
        shared = g.details.get("shared_share")
        out.append(LevelSpeedup(
            load, concurrency[load], _float(g.estimate), _float(g.ci_low),
            _float(g.ci_high), float(df) if isinstance(df, int | float) else math.inf,
            float(shared) if isinstance(shared, int | float) else 0.0))
    return out


def _float(v: float | None) -> float:
    return float(v) if v is not None else math.nan
