"""What would settle an inconclusive speed result: more prompts, or more passes.

Plugging the observed speedup in as the truth is biased exactly when advice is needed: a
result is inconclusive *because* its estimate fell short of the keep boundary, so the
estimate of a truly faster drafter runs low (and the advice high, with a long tail). Here the
effect is estimated conditionally on the result being inconclusive: the speedup under which
the observed t statistic is the median (or a quartile) of the t statistics that end
inconclusive - a median-unbiased estimate given the selection (noncentral t, truncated to
the inconclusive region). The sample size for 80% power then follows from the variance
components (stable prompt-to-prompt variation, which only more prompts reduce;
pass-to-pass variation, which more passes reduce too; what noise shared in time adds, which
falls with the number of time units, prompts x passes) and the t-test's degrees of freedom
(min(prompts, time units) - 1: more passes raise it too; at low load the serial term's
effective time clusters stand for the units).

The range reported runs from the optimistic quartile to the pessimistic one; the central
value is the one validated (tests/judgement/test_speed_simulation.py: at a true 1.2x its median is
within 2x of the need found by simulating larger campaigns).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .speedup import SpeedResult

MAX_PROMPTS = 100_000
MAX_PASSES = 64


@dataclass(frozen=True)
class Advice:
    """Extra prompts / passes for ``power`` to settle the question (keep or drop).

    Each range is (smallest, central, largest) over the three assumed effects; None: the
    cap (``MAX_PROMPTS`` or ``MAX_PASSES``) would not do, e.g. a true speedup at the
    threshold, or passes alone when stable prompt-to-prompt variation dominates.
    ``speedups``: the true speedups assumed (optimistic quartile, central, pessimistic
    quartile). ``better``: the option with fewer extra requests at the central value.
    ``text``: all of it in words; ``settle``: in a few words, from the first option that can
    settle the question (None: neither can).
    """

    more_prompts: tuple[int | None, int | None, int | None]
    more_passes: tuple[int | None, int | None, int | None]
    speedups: tuple[float, float, float]
    better: Literal["prompts", "passes", "neither"]
    extra_requests_prompts: int | None
    extra_requests_passes: int | None
    text: str
    settle: str | None


def _truncated_quantile_ncp(t_obs: float, df: float, edge: float, q: float) -> float:
    """Noncentrality under which P(T <= t_obs | -edge < T < edge) = q."""
    from scipy import optimize, stats

    t_obs = min(max(t_obs, -edge + 1e-6), edge - 1e-6)

    def f(ncp: float) -> float:
        lo, hi = stats.nct.cdf(-edge, df, ncp), stats.nct.cdf(edge, df, ncp)
        mass = hi - lo
        inside = (stats.nct.cdf(t_obs, df, ncp) - lo) / mass if mass > 1e-12 else math.nan
        if not math.isfinite(inside):  # all mass beyond an edge (or scipy's NaN far out):
            return 1.0 - q if ncp < 0 else -q  # push the root inwards
        return float(min(max(inside, 0.0), 1.0)) - q

    lo, hi = -30.0, 30.0
    if f(lo) * f(hi) > 0:
        return lo if f(lo) < 0 else hi
    return float(optimize.brentq(f, lo, hi, xtol=1e-6))


def _power(delta: float, var: float, df: float, alpha: float) -> float:
    from scipy import special, stats

    if var <= 0:
        return 1.0 if delta != 0 else 0.0
    crit = float(special.stdtrit(df, 1 - alpha))
    return float(stats.nct.sf(crit, df, abs(delta) / math.sqrt(var)))


def _smallest(
    power_at: Callable[[int], float], start: int, cap: int, target: float
) -> int | None:
    """Smallest integer n in [start, cap] with power_at(n) >= target (power rises with n)."""
    fn = power_at
    if fn(cap) < target:
        return None
    lo, hi = start, cap
    if fn(lo) >= target:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fn(mid) < target else (lo, mid)
    return hi


def advise(
    result: SpeedResult, power: float = 0.8, levels: int = 1, conditions: int = 2
) -> Advice | None:
    """Advice for an inconclusive ``result`` (None when it is not inconclusive on speed).

    ``levels`` and ``conditions`` only scale the extra request counts (every prompt or pass
    is replayed per level and condition).
    """
    from scipy import special

    gate, comp = result.gating, result.components
    if gate.outcome != "inconclusive" or not gate.se_log > 0 or comp.clusters < 2:
        return None
    alpha = (1 - result.confidence) / 2
    df = max(gate.df, 1.0)
    edge = float(special.stdtrit(df, 1 - alpha))
    log_thr = math.log(result.threshold)
    t_obs = (math.log(gate.estimate) - log_thr) / gate.se_log
    k, passes, boots = comp.clusters, max(comp.passes, 1.0), max(comp.boots, 1)
    n = result.n_prompts
    between, within = comp.between, comp.within

    def prompt_var(prompts: float, npasses: float) -> float:
        clusters = k * prompts / n
        return (between + within / (npasses * boots)) / clusters + comp.boot_var

    if between + within <= 0:  # no components (one pass, degenerate): scale the variance
        between = gate.se_log**2 * k - comp.boot_var * k
    # What the time units add beyond the prompt part (shared-in-time noise): it falls with
    # the number of units, i.e. with prompts x passes (a block holds a fixed number).
    excess = max(gate.se_log**2 - prompt_var(n, passes), 0.0)
    units = float(comp.time_units if comp.time_units > 0 else k)
    if result.serial_clusters > 0:  # low load: the serial term's effective clusters, which
        units = result.serial_clusters  # grow with the units at a fixed reach

    def var_at(prompts: float, npasses: float) -> float:
        return prompt_var(prompts, npasses) + excess * (n * passes) / (prompts * npasses)

    def df_at(prompts: float, npasses: float) -> float:
        grown = units * (prompts * npasses) / (n * passes)
        return max(min(k * prompts / n, grown) - 1, 1.0)

    prompts_out: list[int | None] = []
    passes_out: list[int | None] = []
    speedups = []
    for q in (0.25, 0.5, 0.75):  # optimistic, central, pessimistic effect
        delta = _truncated_quantile_ncp(t_obs, df, edge, q) * gate.se_log
        speedups.append(math.exp(log_thr + delta))

        def by_prompts(m: int, delta: float = delta) -> float:
            return _power(delta, var_at(m, passes), df_at(m, passes), alpha)

        def by_passes(p: int, delta: float = delta) -> float:
            return _power(delta, var_at(n, p), df_at(n, p), alpha)

        total = _smallest(by_prompts, n + 1, MAX_PROMPTS, power)
        prompts_out.append(None if total is None else total - n)
        more = _smallest(by_passes, int(passes) + 1, MAX_PASSES, power)
        passes_out.append(None if more is None else more - int(passes))
    p_range = _ordered(prompts_out)
    s_range = _ordered(passes_out)
    per = levels * conditions * boots
    req_prompts = None if p_range[1] is None else p_range[1] * int(passes) * per
    req_passes = None if s_range[1] is None else s_range[1] * n * per
    options = {k2: v for k2, v in (("prompts", req_prompts), ("passes", req_passes))
               if v is not None}
    better: Literal["prompts", "passes", "neither"] = "neither"
    if options:
        better = "prompts" if options.get("prompts", math.inf) <= options.get(
            "passes", math.inf) else "passes"
    return Advice(p_range, s_range, (speedups[0], speedups[1], speedups[2]), better,
                  req_prompts, req_passes, _text(p_range, s_range, better),
                  _settle(p_range, s_range))


def _ordered(values: list[int | None]) -> tuple[int | None, int | None, int | None]:
    """(smallest, central, largest); None (beyond the cap) counts as the largest. The need is
    not monotone in the effect when the quartiles straddle the threshold (settling as DROP
    on one side, as KEEP on the other), hence min/max rather than the quartiles' order."""
    finite = [v for v in values if v is not None]
    lo = min(finite) if finite else None
    hi = None if None in values else max(finite)
    return lo, values[1], hi


def _fmt(values: tuple[int | None, int | None, int | None], unit: str) -> str:
    lo, mid, hi = values
    if mid is None:
        return f"no realistic number of {unit} (the speedup may sit at the threshold)"
    top = "many more" if hi is None else str(hi)
    return f"about {mid} more {unit} (range {lo}-{top})"


def _text(
    prompts: tuple[int | None, int | None, int | None],
    passes: tuple[int | None, int | None, int | None],
    better: str,
) -> str:
    text = f"{_fmt(prompts, 'prompts')}, or {_fmt(passes, 'passes')}"
    if better != "neither":
        text += f"; more {better} cost fewer requests"
    return text


def _settle(
    prompts: tuple[int | None, int | None, int | None],
    passes: tuple[int | None, int | None, int | None],
) -> str | None:
    if prompts[1] is not None:
        return f"{_fmt(prompts, 'prompts')}, or {_fmt(passes, 'passes')}"
    return _fmt(passes, "passes") if passes[1] is not None else None
