"""Sampled tokens scored against the target's own next-token distribution, per position class.

Interface (the data the campaign saves and the judgement reads). Every sampled token of a
condition's sampled pass is scored by the *target* (the baseline server asked for the
prompt-plus-sample's logprobs, or the embedded target): at that position the target's raw
(temperature 1, untruncated) log-probabilities of its top-K tokens and of the token drawn.
From those the distribution the service should have sampled from (:class:`Served`:
temperature, then top-k, top-p, min-p, and the frequency/presence penalties of the tokens the
sample already holds) follows.

Position classes: ``first`` (the token the target samples alone after the prefill),
``drafted`` (a token a verify step accepted from the drafter), ``bonus`` (the token a verify
step adds after its accepted drafts), ``later`` (positions 2+ where the engine does not say
which were drafted: SGLang and vLLM give per-request totals only).

API (stable): :func:`exact_test` judges :class:`ScoredSample` lists; :func:`positions_from`
turns them into :class:`Positions` arrays and :func:`judge_positions` judges those (the fast
path simulations use). Results are :class:`ExactResult` / :class:`ClassResult` data. The
input types and the served distribution live in :mod:`.exact_served` and are re-exported
here.

**Statistics**, per class, each exact or asymptotically exact under H0 "every token was drawn
from the served distribution given its context", whatever the dependence between the tokens
of a sample (each is a sum of martingale differences or a randomised PIT, whose values are
independent U(0, 1) under H0):

* *score test*: ``z = sum(log q(x) + H(q)) / sqrt(sum Var_q log q)``, two-sided;
* *randomised PIT*: tokens ordered by ``q`` descending, ``u = F(x-) + V q(x)``, KS against
  U(0, 1);
* *top-1*: draws of the most likely token against ``sum q_max`` (variance ``sum q(1 - q)``);
* *tail rate*: draws beyond the top-K against the served tail mass (bounded, see below);
* *outside the served support*: a draw the served top-k / top-p / min-p (or a temperature of
  0) excludes has probability 0: one is decisive (p = 0). The scorer's and the sampler's
  logits differ by rounding, so a draw counts only when it stays excluded with its logit
  raised by ``tolerance`` nats; a draw excluded by less is left out of every statistic;
* *penalties* (when served): the log-likelihood ratio of the draws without the served
  frequency/presence penalties against with them, one-sided against its H0 mean.

The class's p is the Bonferroni minimum over the statistics it could compute; the result's,
the Bonferroni minimum over the classes present. Beside the tests, the maximum-likelihood
*effective temperature* of the draws given the raw logits (on the served support), with a
profile-likelihood interval at ``confidence``: it sizes the defect and names no direction the
data do not show (an effective temperature above the fit's range reads inf, below it 0; the
draws are also tested against the fitted temperature, so a mixture reads "not sampled at any
single temperature"). The failing sentence (``summary``) names the class and what was
measured: the parameter whose support the draws left, the penalties, or the temperature.

**The tail beyond K.** Only the top-K raw log-probabilities are known; the rest of the
vocabulary holds their missing mass ``m``, every tail token at most as likely as the K-th.
The tail is never ignored and never guessed: the score test, the PIT, the top-1 count and the
temperature fit use the draws that fell in the top-K tokens the served support keeps
whatever the tail holds (a top-p cut can move with the tail's mass), judged against the
served distribution *conditioned on those tokens* (exact, whatever the tail holds); the
tail-rate test compares the number of draws beyond K with the served tail mass, which is only
bounded (above by the K-th probability times ``m`` at a temperature <= 1, below by it above
1; the other bound needs the vocabulary size ``vocab``, else it is 0 or unbounded; penalties
only lower the tail tokens they hit, which the lower bound leaves out), so it can only reject
outside the bounds: conservative. Where a truncation might cut into the tail, the tail is kept (the
largest support), so a tail draw is never called outside the support on a guess.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, special, stats

from ..stats.core import FloatArray, StatOutcome, StatsError, check_unit
from .exact_served import (
    POSITION_CLASSES,
    TRUNCATIONS,
    IntArray,
    PositionClass,
    Positions,
    ScoredSample,
    ScoredToken,
    Served,
    Support,
    positions_from,
    served_support,
)

CLASS_WORDS = {"first": "first token", "drafted": "drafted positions", "bonus": "bonus tokens",
               "later": "positions 2+ (drafted and bonus not told apart)"}
T_MAX = 20.0  # the temperature fit's hot end: a fit above it reads inf
BETA_MAX = 1000.0  # its cold end, as 1/T: below T = 0.001 reads 0 (greedy)
# A wording threshold (it chooses words, never the outcome): a best single temperature
# rejected at this level reads "no single temperature".
CLASS_SINGLE_LEVEL = 0.001


@dataclass(frozen=True)
class ClassResult:
    """The exact test of one position class."""

    klass: PositionClass
    n: int  # tokens of this class
    scored: int  # draws in the served top-K (score, PIT, top-1 and temperature use these,
    # conditioned on the tokens kept whatever the unknown tail holds: Support.core)
    score_z: float  # sum(log q(x) + H(q)) / sqrt(sum Var_q log q): 0 expected, < 0 off-mode
    score_p: float
    pit_p: float  # randomised PIT, KS against U(0, 1)
    top1_observed: int  # draws of the target's most likely token
    top1_expected: float  # sum over positions of q(argmax)
    top1_z: float
    top1_p: float
    tail_observed: int  # draws beyond the top-K where the served support holds the tail
    tail_expected: tuple[float, float]  # its bounds (the tail mass is only bounded)
    tail_p: float
    outside_support: int  # draws the served distribution gives probability 0
    outside_by: dict[str, int]  # which truncation excluded them (TRUNCATIONS)
    boundary: int  # excluded by less than the tolerance: left out of every statistic
    temperature: float  # maximum-likelihood effective temperature (inf: above T_MAX)
    temperature_ci: tuple[float, float]  # at ``confidence``; inf above the fit's range, 0 below
    # (nan, like temperature, where nothing could be fitted: no drawn token had a rival)
    inverse_temperature: float  # 1/T, the fitted parameter (< 0: least likely tokens favoured)
    inverse_temperature_ci: tuple[float, float]
    single_temperature_p: float  # the draws against the best single temperature (score and
    # top-1, Bonferroni): small when no one temperature describes them (a mixture)
    penalty_llr: float  # log-likelihood of the draws without the served penalties minus with
    # them (> 0: the draws fit better without; nan: no penalties served)
    penalty_p: float  # one-sided test of that ratio against its H0 mean (1.0: not run)
    decisive: str  # the statistic with the smallest p: score, PIT, top-1, tail, support,
    # penalties
    p_value: float  # the class's combined p (Bonferroni over its statistics)
    outcome: StatOutcome


@dataclass(frozen=True)
class ExactResult:
    """Per-position-class exact test of one condition's samples against the target."""

    outcome: StatOutcome
    p_value: float  # min over classes, Bonferroni-adjusted
    alpha: float
    served: Served
    classes: dict[str, ClassResult] = field(default_factory=dict)
    summary: str = ""  # one sentence that sizes the defect, e.g. "drafted positions sampled
    # at an effective temperature > 2.0 (served 0.8); first token as served"
    split_known: bool = True  # False: positions 2+ tested together ("later"), and said so
    confidence: float = 0.95


# --------------------------------------------------------------------------- input


def _check(served: Served, alpha: float, confidence: float, tolerance: float) -> None:
    check_unit(alpha, "alpha")
    check_unit(confidence, "confidence")
    if not (math.isfinite(served.temperature) and served.temperature >= 0):
        raise StatsError(f"served temperature must be >= 0, got {served.temperature}")
    if not 0 < served.top_p <= 1:
        raise StatsError(f"served top_p must lie in (0, 1], got {served.top_p}")
    if served.top_k is not None and served.top_k < 1:
        raise StatsError(f"served top_k must be >= 1, got {served.top_k}")
    if not 0 <= served.min_p < 1:
        raise StatsError(f"served min_p must lie in [0, 1), got {served.min_p}")
    if served.repetition_penalty <= 0:
        raise StatsError(f"served repetition_penalty must be > 0, got "
                         f"{served.repetition_penalty}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise StatsError(f"tolerance must be >= 0 nats, got {tolerance}")


# --------------------------------------------------------------------------- statistics


def _two_sided(z: float) -> float:
    """Two-sided normal p (special.ndtr: norm.sf without its per-call overhead)."""
    return float(2 * special.ndtr(-abs(z))) if math.isfinite(z) else 0.0


def _z(observed: float, expected: float, var: float) -> float:
    if var <= 0:
        return 0.0 if abs(observed - expected) < 1e-9 else math.copysign(math.inf,
                                                                         observed - expected)
    return (observed - expected) / math.sqrt(var)


def _loglik(beta: float, d: FloatArray, dx: FloatArray) -> float:
    """Sum over rows of log softmax(beta * d)[x] on the kept columns (d: -inf elsewhere)."""
    with np.errstate(invalid="ignore", over="ignore"):
        bd = np.where(np.isfinite(d), beta * d, -np.inf)
    return float((beta * dx - special.logsumexp(bd, axis=1)).sum())


def _fit_temperature(d: FloatArray, dx: FloatArray, confidence: float
                     ) -> tuple[float, tuple[float, float]]:
    """Maximum-likelihood 1/T of the draws and its profile-likelihood interval (the
    log-likelihood is concave in 1/T: one maximum, one crossing a side)."""
    if d.shape[0] == 0:
        return math.nan, (math.nan, math.nan)
    fit = optimize.minimize_scalar(lambda b: -_loglik(b, d, dx), bounds=(-BETA_MAX, BETA_MAX),
                                   method="bounded", options={"xatol": 1e-6})
    beta = float(fit.x)
    best = -float(fit.fun)
    drop = float(stats.chi2.ppf(confidence, 1)) / 2

    def gap(b: float) -> float:
        return best - _loglik(b, d, dx) - drop

    lo = -BETA_MAX if gap(-BETA_MAX) <= 0 else float(optimize.brentq(gap, -BETA_MAX, beta))
    hi = BETA_MAX if gap(BETA_MAX) <= 0 else float(optimize.brentq(gap, beta, BETA_MAX))
    return beta, (lo, hi)


def _temperature(beta: float) -> float:
    """1/beta in the fit's range: 0 at its cold end, inf beyond T_MAX, -inf/negative below 0."""
    if math.isnan(beta):
        return math.nan
    if beta >= BETA_MAX * (1 - 1e-6):
        return 0.0
    if abs(beta) <= 1 / T_MAX:
        return math.inf if beta >= 0 else -math.inf
    return 1.0 / beta


@dataclass(frozen=True)
class _Stats:
    score_z: float
    score_p: float
    pit_p: float
    top1_observed: int
    top1_expected: float
    top1_z: float
    top1_p: float


def _statistics(q: FloatArray, x: IntArray, v: FloatArray) -> _Stats:
    """Score, randomised PIT and top-1 of draws ``x`` from rows of ``q`` (most likely first;
    ``v``: the PIT's uniforms)."""
    at = np.arange(x.size)
    with np.errstate(divide="ignore"):
        logq = np.where(q > 0, np.log(np.where(q > 0, q, 1.0)), 0.0)
    h = -(q * logq).sum(axis=1)
    var = (q * logq**2).sum(axis=1) - h**2
    score_z = _z(float((logq[at, x] + h).sum()), 0.0, float(np.clip(var, 0, None).sum()))
    before = np.cumsum(q, axis=1)[at, x] - q[at, x]
    pit_p = float(stats.kstest(before + v * q[at, x], "uniform").pvalue)
    top1_obs = int((x == 0).sum())
    top1_exp = float(q[:, 0].sum())
    top1_z = _z(top1_obs, top1_exp, float((q[:, 0] * (1 - q[:, 0])).sum()))
    return _Stats(score_z, _two_sided(score_z), pit_p, top1_obs, top1_exp, top1_z,
                  _two_sided(top1_z))


def _normalised(w: FloatArray) -> FloatArray:
    return np.asarray(w / w.sum(axis=1, keepdims=True), dtype=np.float64)


def _class_result(klass: PositionClass, pos: Positions, sv: Support, rows: IntArray,
                  level: float, confidence: float, rng: np.random.Generator,
                  fit: bool, served: Served) -> ClassResult:
    drawn = pos.drawn[rows]
    out = sv.out[rows]
    outside = int((out >= 0).sum())
    by = {TRUNCATIONS[i]: int((out == i).sum()) for i in range(len(TRUNCATIONS))
          if (out == i).any()}
    boundary = int(sv.boundary[rows].sum())
    known = drawn >= 0
    inside = (out < 0) & ~sv.boundary[rows]
    sel = rows[inside & known & sv.core[rows, np.maximum(drawn, 0)]]
    st = _Stats(math.nan, 1.0, 1.0, 0, 0.0, math.nan, 1.0)
    tail_p = single_p = penalty_p = 1.0
    penalty_llr = math.nan
    named: dict[str, float] = {}
    beta, beta_ci = math.nan, (math.nan, math.nan)
    if sel.size:
        q = _normalised(np.where(sv.core[sel], sv.w[sel], 0.0))
        x = pos.drawn[sel]
        v = rng.random(sel.size)
        st = _statistics(q, x, v)
        named |= {"score": st.score_p, "PIT": st.pit_p, "top-1": st.top1_p}
        at = np.arange(sel.size)
        if served.temperature > 0 and (pos.offsets[sel] != 0).any():
            d0 = pos.logits[sel] - pos.offsets[sel]
            d0 = np.where(sv.core[sel], d0 - d0.max(axis=1, keepdims=True), -np.inf)
            q0 = _normalised(np.exp(d0 / served.temperature))
            # The log-likelihood ratio of the named alternative "penalties not applied":
            # under H0 a sum of martingale differences with known mean and variance.
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.where(q > 0, np.log(np.where(q0 > 0, q0, 1.0)) - np.log(
                    np.where(q > 0, q, 1.0)), 0.0)
            mean = (q * r).sum(axis=1)
            var = float(np.clip((q * r**2).sum(axis=1) - mean**2, 0, None).sum())
            penalty_llr = float(r[at, x].sum())
            penalty_p = float(special.ndtr(-_z(penalty_llr, float(mean.sum()), var)))
            named["penalties"] = penalty_p
        if fit:
            d = np.where(sv.core[sel], pos.logits[sel] - pos.logits[sel, :1], -np.inf)
            multi = sv.core[sel].sum(axis=1) >= 2  # a one-token support says nothing of T
            beta, beta_ci = _fit_temperature(d[multi], d[multi, x[multi]], confidence)
            if multi.any():
                # Does the best single temperature describe the draws? (Fitted on the same
                # draws, so it errs towards yes.)
                with np.errstate(over="ignore", invalid="ignore"):
                    bd = np.where(np.isfinite(d[multi]), beta * d[multi], -np.inf)
                    w = np.exp(bd - bd.max(axis=1, keepdims=True))
                fitted = _statistics(_normalised(w), x[multi], v[multi])
                single_p = min(1.0, 2 * min(fitted.score_p, fitted.top1_p))
    # Tail rate: every row whose served support holds the tail (the event is read before
    # conditioning on anything).
    tr = rows[sv.tail_kept[rows] & (sv.out[rows] < 0)]
    tail_obs = int((pos.drawn[tr] < 0).sum())
    tail_bounds = (0.0, 0.0)
    if tr.size:
        # The kept top-K mass is itself bounded (the top-p cut): the most for the lower
        # share, the least (the core) for the upper.
        most = sv.w[tr].sum(axis=1)
        least = np.where(sv.core[tr], sv.w[tr], 0.0).sum(axis=1)
        shares = []
        for t, mass in ((sv.tail_lo[tr], most), (sv.tail_hi[tr], least)):
            with np.errstate(invalid="ignore"):
                s = np.where(np.isinf(t), 1.0, t / (mass + np.where(np.isinf(t), 0.0, t)))
            shares.append(s)
        tail_bounds = (float(shares[0].sum()), float(shares[1].sum()))
        # Only a count outside the bounds is evidence; judged against the nearer bound.
        side = 1 if tail_obs > tail_bounds[1] else 0 if tail_obs < tail_bounds[0] else -1
        if side >= 0:
            s = shares[side]
            tail_p = _two_sided(_z(tail_obs, float(s.sum()), float((s * (1 - s)).sum())))
        named["tail"] = tail_p
    named["support"] = 0.0 if outside else 1.0
    decisive = min(named, key=lambda key: named[key])
    p = min(1.0, len(named) * named[decisive])
    lo, hi = beta_ci
    t_ci = ((math.nan, math.nan) if math.isnan(beta) else
            (_temperature(hi) if hi > 1 / T_MAX else math.inf,
             _temperature(lo) if lo > 1 / T_MAX else math.inf))
    return ClassResult(
        klass=klass, n=int(rows.size), scored=int(sel.size), score_z=st.score_z,
        score_p=st.score_p, pit_p=st.pit_p, top1_observed=st.top1_observed,
        top1_expected=st.top1_expected, top1_z=st.top1_z, top1_p=st.top1_p,
        tail_observed=tail_obs, tail_expected=tail_bounds, tail_p=tail_p,
        outside_support=outside, outside_by=by, boundary=boundary,
        temperature=_temperature(beta), temperature_ci=t_ci, inverse_temperature=beta,
        inverse_temperature_ci=beta_ci, single_temperature_p=single_p,
        penalty_llr=penalty_llr, penalty_p=penalty_p, decisive=decisive, p_value=p,
        outcome="fail" if p < level else "pass")


# --------------------------------------------------------------------------- wording


def _t(value: float) -> str:
    return "inf" if value == math.inf else f"{value:.2f}"


def describe(c: ClassResult, served: Served) -> str:
    """One clause sizing what is wrong with a failing class (or "as served")."""
    name = CLASS_WORDS[c.klass]
    if c.outcome != "fail":
        return f"{name} as served"
    if c.outside_support:
        what, _ = max(c.outside_by.items(), key=lambda kv: kv[1])
        setting = {"temperature 0": "greedy choice (served temperature 0)",
                   "top-k": f"top-k {served.top_k}", "top-p": f"top-p {served.top_p:g}",
                   "min-p": f"min-p {served.min_p:g}",
                   "probability 0": "distribution (the target gives them probability 0)",
                   }[what]
        hint = "" if what == "probability 0" else f" ({what} ignored?)"
        return f"{name}: {c.outside_support} of {c.n} draws outside the served {setting}{hint}"
    beta_lo, beta_hi = c.inverse_temperature_ci
    served_beta = 1 / served.temperature if served.temperature > 0 else BETA_MAX
    ci = f"CI {_t(c.temperature_ci[0])}-{_t(c.temperature_ci[1])}"
    where = f"served {served.temperature:g}"
    if c.decisive == "penalties":
        return (f"{name} fit better without the served penalties (log-likelihood ratio "
                f"{c.penalty_llr:+.1f}, p {c.penalty_p:.2g}: penalties ignored?)")
    fitted = not math.isnan(c.inverse_temperature)
    if fitted and not beta_lo <= served_beta <= beta_hi:
        if c.single_temperature_p < CLASS_SINGLE_LEVEL:
            return (f"{name} not sampled at the served temperature nor at any single one "
                    f"(best fit {_t(c.temperature)}, {ci}, {where}, score z "
                    f"{c.score_z:+.1f}, top-1 drawn {c.top1_observed} times for "
                    f"{c.top1_expected:.1f} expected)")
        if beta_hi < 0:
            return (f"{name} drawn against the target's ranking (effective temperature "
                    f"{c.temperature:.2f}: the least likely tokens favoured, {where})")
        if c.temperature_ci[0] < 0.01:
            return (f"{name} sampled near greedily (effective temperature "
                    f"{_t(c.temperature)}, {ci}, {where})")
        if c.temperature_ci[1] == math.inf:
            low = (f"{_t(c.temperature_ci[0])}" if math.isfinite(c.temperature_ci[0])
                   else f"{T_MAX:g}, the top of the fit's range")
            return f"{name} sampled at an effective temperature > {low} ({where})"
        return (f"{name} sampled at an effective temperature {_t(c.temperature)} ({ci}, "
                f"{where})")
    # A score with no variance (every scored draw at a point mass of the target) has no z:
    # the other figures speak for it.
    parts = ([f"score z {c.score_z:+.1f}"] if math.isfinite(c.score_z) else []) + [
        f"PIT p {c.pit_p:.2g}",
        f"top-1 drawn {c.top1_observed} times for {c.top1_expected:.1f} expected"]
    if c.tail_p < 1:
        lo, hi = c.tail_expected
        parts.append(f"{c.tail_observed} draws beyond the top-K for {lo:.1f}-{hi:.1f} expected")
    # The fitted temperature covers the served one, yet the draws fail: no temperature change
    # explains them (a mixture, garbage at some positions), which is said, not a direction.
    consistent = (f"; not a temperature change (best fit {_t(c.temperature)}, {ci}, covers "
                  f"the served {served.temperature:g})" if fitted else
                  f"; no temperature fits them ({where})")
    return f"{name} not drawn from the served distribution: {', '.join(parts)}{consistent}"


# --------------------------------------------------------------------------- the test


def judge_positions(pos: Positions, served: Served, alpha: float, seed: int = 0, *,
                   confidence: float = 0.95, tolerance: float = 0.05,
                   fit_temperature: bool = True) -> ExactResult:
    """:func:`exact_test` on :class:`Positions` arrays (``fit_temperature=False`` skips the
    effective-temperature fit, which no p-value uses: simulations of power)."""
    _check(served, alpha, confidence, tolerance)
    sv = served_support(pos, served, tolerance)
    rng = np.random.default_rng(seed)
    present = [(k, np.flatnonzero(pos.klass == i)) for i, k in enumerate(POSITION_CLASSES)]
    present = [(k, rows) for k, rows in present if rows.size]
    # Each class is judged at its Bonferroni share of alpha.
    classes: dict[str, ClassResult] = {
        k: _class_result(k, pos, sv, rows, alpha / len(present), confidence, rng,
                         fit_temperature, served) for k, rows in present}
    p = min(1.0, len(classes) * min(c.p_value for c in classes.values()))
    outcome: StatOutcome = "fail" if p < alpha else "pass"
    clauses = [describe(c, served) for c in classes.values()]
    failing = [s for c, s in zip(classes.values(), clauses, strict=True) if c.outcome == "fail"]
    if failing:
        summary = "; ".join(failing + [s for c, s in zip(classes.values(), clauses, strict=True)
                                       if c.outcome != "fail"])
    else:
        summary = (f"every position class as served ({served.words()}): "
                   + ", ".join(CLASS_WORDS[k] for k in classes) + f"; p={p:.3g}")
    split_known = "later" not in classes
    if not split_known:
        summary += "; drafted and bonus positions not told apart (tested together)"
    return ExactResult(outcome=outcome, p_value=p, alpha=alpha, served=served, classes=classes,
                       summary=summary, split_known=split_known, confidence=confidence)


def exact_test(samples: Sequence[ScoredSample], served: Served, alpha: float,
               seed: int = 0, *, confidence: float = 0.95, vocab: int | None = None,
               tolerance: float = 0.05) -> ExactResult:
    """Judge ``samples`` against the target's distribution under ``served`` (module
    docstring): per position class a score test, a randomised PIT, the top-1 rate, the rate
    of draws beyond the top-K and the draws outside the served support, Bonferroni-combined;
    "fail" when the combined p < ``alpha``. ``vocab``: the vocabulary size, which bounds the
    tail beyond K on both sides (None: one side only). ``tolerance``: nats by which the
    scorer's logits may differ from the sampler's before a draw counts as outside the served
    support. ``seed``: the PIT's randomisation. Raises :class:`StatsError` on bad input."""
    _check(served, alpha, confidence, tolerance)
    return judge_positions(positions_from(samples, served, vocab), served, alpha, seed,
                          confidence=confidence, tolerance=tolerance)


__all__ = [
    "BETA_MAX",
    "CLASS_WORDS",
    "POSITION_CLASSES",
    "TRUNCATIONS",
    "T_MAX",
    "ClassResult",
    "ExactResult",
    "PositionClass",
    "Positions",
    "ScoredSample",
    "ScoredToken",
    "Served",
    "Support",
    "describe",
    "exact_test",
    "judge_positions",
    "positions_from",
    "served_support",
]
