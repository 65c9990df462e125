"""Evaluating gates: one evaluator per kind, from preflight.json or a saved campaign (so a
campaign can be re-judged). What the gates are is planned in gate_spec.py."""

from __future__ import annotations

from ..pilot.schema import Pilot
from ..results.folder import SavedCampaign
from ..results.preflight_file import Preflight
from .consistency import boot_consistency
from .cost import break_even, condition_cost
from .fairness import fairness_check
from .gate_spec import PREFLIGHT, Evidence, GateResult, GateSpec, Outcome, Verdict, plan_gates
from .goodput import goodput_gate
from .quality_gates import QUALITY_EVALUATORS
from .speed_gates import latency_gate, speedup_gate

__all__ = ["PREFLIGHT", "Evidence", "GateResult", "GateSpec", "Outcome", "Verdict", "evaluate",
           "plan_gates"]


def evaluate(
    spec: GateSpec, pilot: Pilot, data: SavedCampaign | None, preflight: Preflight
) -> GateResult:
    """One gate's result. Preflight gates need no campaign (``data`` may be None)."""
    if spec.kind in PREFLIGHT:
        return _PREFLIGHT[spec.kind](spec, preflight)
    assert data is not None
    fn = _EVALUATORS[spec.kind]
    err = data.condition_error(spec.condition)
    if err:
        return GateResult(spec, "fail", f"{spec.condition} did not run: {err}")
    if spec.reference:
        ref_err = data.condition_error(spec.reference)
        if ref_err:
            return GateResult(spec, "fail", f"reference {spec.reference} did not run: {ref_err}")
    return fn(spec, pilot, data)


def _command_line(spec: GateSpec, preflight: Preflight) -> GateResult:
    check = preflight.command_lines.get(spec.condition)
    if check is None:
        return GateResult(spec, "skip", "command line not checked for this condition")
    return GateResult(spec, "pass" if check.ok else "fail", "\n".join(check.lines),
                      details=check.model_dump())


def _artifact(spec: GateSpec, preflight: Preflight) -> GateResult:
    report = preflight.artifacts.get(spec.condition)
    if report is None:
        return GateResult(spec, "skip", "artifact check not run for this condition")
    bad = [c for c in report.checks if not c.ok]
    if bad:
        return GateResult(spec, "fail", "; ".join(f"{c.name}: {c.detail}" for c in bad),
                          details=report.model_dump())
    return GateResult(spec, "pass", f"{len(report.checks)} checks passed",
                      details=report.model_dump())


def _completed(
    spec: GateSpec, pilot: Pilot, data: SavedCampaign
) -> GateResult:
    recs = data.of(spec.condition, spec.load)
    if not recs:
        return GateResult(spec, "fail", f"no requests recorded for {spec.condition}/{spec.load}")
    ok = sum(r.ok for r in recs)
    frac = ok / len(recs)
    need = pilot.limits.min_completed_fraction
    errors = sorted({(r.error or "")[:120] for r in recs if not r.ok})
    summary = f"{ok}/{len(recs)} completed ({frac:.1%}; need >= {need:.1%})"
    if errors:
        summary += "; errors: " + " | ".join(errors[:3])
    return GateResult(spec, "pass" if frac >= need else "fail", summary, estimate=frac,
                      threshold=need, details={"ok": ok, "total": len(recs)})


def _fairness(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    involved = {spec.condition, *pilot.references(spec.condition)}
    meta = data.meta.model_dump(by_alias=True)
    meta["conditions"] = {n: c for n, c in meta["conditions"].items() if n in involved}
    res = fairness_check(meta, [r for r in data.records if r.condition in involved])
    return GateResult(spec, "pass" if res.ok else "fail", res.summary,
                      details={"differences": res.differences, "compared": res.compared})


def _memory(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.reference is not None
    conds = data.meta.conditions
    mine, theirs = conds.get(spec.condition), conds.get(spec.reference)
    peak = mine.peak_memory_mb if mine is not None else None
    ref = theirs.peak_memory_mb if theirs is not None else None
    method = str(mine.fingerprint.get("memory_method", "")) if mine is not None else ""
    if peak is None:
        return GateResult(spec, "fail", "no memory figure was recorded for this condition")
    lim = pilot.limits.memory
    problems, parts = [], [f"peak {peak:.0f} MiB" + (f" ({method})" if method else "")]
    if lim.max_peak_mb is not None:
        parts.append(f"limit {lim.max_peak_mb:g} MiB")
        if peak > lim.max_peak_mb:
            problems.append("over max_peak_mb")
    if lim.max_increase_pct is not None:
        if ref is None or ref <= 0:
            problems.append(f"no baseline figure to compare with ({spec.reference})")
        else:
            increase = (peak / ref - 1) * 100
            parts.append(f"{increase:+.1f}% vs {spec.reference} ({ref:.0f} MiB; limit "
                         f"+{lim.max_increase_pct:g}%)")
            if increase > lim.max_increase_pct:
                problems.append("over max_increase_pct")
    summary = ", ".join(parts) + (f": {'; '.join(problems)}" if problems else "")
    return GateResult(spec, "fail" if problems else "pass", summary, estimate=peak,
                      threshold=lim.max_peak_mb)


def _cost(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.load is not None
    limit = pilot.limits.cost.max_cost_per_request
    assert limit is not None
    c = condition_cost(pilot, data, spec.condition, spec.load)
    cur = pilot.cost.currency
    if c.cost_per_request is None:
        return GateResult(spec, "fail", f"no successful request at {spec.load}: cost unknown")
    ok = c.cost_per_request <= limit
    return GateResult(
        spec, "pass" if ok else "fail",
        f"cost per successful request {c.cost_per_request:.6f} {cur} (limit {limit:g} {cur}) "
        f"at {c.requests_per_hour:.0f} requests/h",
        estimate=c.cost_per_request, threshold=limit, details=c.model_dump(),
    )


def _break_even(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.load is not None and spec.reference is not None
    limit = pilot.limits.cost.max_break_even_days
    assert limit is not None
    be = break_even(pilot, data, spec.condition, spec.reference, spec.load)
    if be.days is None:
        return GateResult(spec, "fail", f"break-even: {be.reason}", threshold=limit,
                          details=be.model_dump())
    ok = be.days <= limit
    return GateResult(
        spec, "pass" if ok else "fail",
        f"setup cost recovered after {be.requests:,.0f} requests = {be.days:.1f} days at the "
        f"expected traffic (limit {limit:g} days)",
        estimate=be.days, threshold=limit, details=be.model_dump(),
    )


def _boot_consistency(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    level = pilot.load.lightest()
    res = boot_consistency(data.of(spec.condition), level,
                           pilot.limits.quality.near_tie_epsilon,
                           pilot.decision.regression_tolerance)
    if res.boots < 2:
        return GateResult(spec, "skip", f"{res.boots} boot recorded: nothing to compare")
    accept = ", ".join(f"boot {b}: {a:.2f}" for b, a in sorted(res.accept.items()))
    summary = (f"{res.prompts} prompts compared over {res.boots} boots at {level}: "
               f"{len(res.divergent)} genuine output divergence(s), {len(res.near_ties)} at "
               "near-ties" + (f"; accept length {accept}" if accept else ""))
    for line in [*res.divergent[:3], *res.accept_flags]:
        summary += f"\n  {line}"
    outcome: Outcome = "pass" if res.ok else "fail"
    if res.prompts == 0 and not res.accept:
        outcome, summary = "inconclusive", summary + "; nothing completed on every boot"
    return GateResult(spec, outcome, summary, estimate=len(res.divergent), threshold=0,
                      details={"boots": res.boots, "prompts": res.prompts,
                               "divergent": res.divergent, "near_ties": res.near_ties,
                               "accept_length": {str(k): v for k, v in res.accept.items()},
                               "accept_flags": res.accept_flags})


def _goodput(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.reference is not None and spec.load is not None
    res = goodput_gate(pilot, data, spec.condition, spec.reference, spec.load)
    return GateResult(spec, res.outcome, res.summary, estimate=res.estimate, ci_low=res.ci_low,
                      ci_high=res.ci_high, threshold=res.threshold, p_value=res.p_value,
                      details=res.details)


_PREFLIGHT = {"command_line": _command_line, "artifact": _artifact}
_EVALUATORS = {
    "completed": _completed,
    "fairness": _fairness,
    **QUALITY_EVALUATORS,
    "speedup": speedup_gate,
    "latency": latency_gate,
    "memory": _memory,
    "cost": _cost,
    "break_even": _break_even,
    "goodput": _goodput,
    "boot_consistency": _boot_consistency,
}
