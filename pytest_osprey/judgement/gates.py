"""Gates and verdicts: what each test asserts, and KEEP / DROP / INCONCLUSIVE per candidate.

The gate list is planned from the pilot alone (so pytest can collect one test per gate before
anything runs) and evaluated from a saved campaign (so a campaign can be re-judged).
"""

from __future__ import annotations

from collections.abc import Callable

from ..pilot.schema import Pilot
from ..results.folder import SavedCampaign, iter_pairs
from ..results.preflight_file import Preflight
from ..results.records import RequestRecord
from . import stats
from .cost import break_even, condition_cost
from .fairness import fairness_check
from .gate_result import Evidence, GateResult, GateSpec, Outcome, Verdict
from .quality_gates import QUALITY_EVALUATORS
from .sequential import SequentialDecision, obrien_fleming_plan, sequential_speedup

__all__ = ["PREFLIGHT", "Evidence", "GateResult", "GateSpec", "Outcome", "Verdict", "evaluate",
           "plan_gates", "sequential_look"]

PREFLIGHT = ("command_line", "artifact")  # judged before (and without) any boot


def plan_gates(pilot: Pilot, conditions: list[str], dry_run: bool = False) -> list[GateSpec]:
    """Every gate of this pilot, in the order the tests run."""
    specs: list[GateSpec] = [GateSpec("command_line", c) for c in conditions]
    drafted = [c for c in conditions if pilot.conditions[c].speculates]
    specs += [GateSpec("artifact", c) for c in drafted]
    if dry_run:
        return specs
    for c in conditions:
        specs += [GateSpec("completed", c, load=level) for level in pilot.load.levels]
    base = pilot.baseline
    judged = [c for c in conditions if c != base and pilot.conditions[c].role != "baseline"]
    specs += [GateSpec("fairness", c, reference=base) for c in judged]
    if pilot.sampling.greedy:
        specs += [GateSpec("greedy_identity", c, reference=base) for c in judged]
        specs += [GateSpec("correctness", c, reference=base) for c in judged]
    if pilot.sampling.sampled.enabled:
        specs += [GateSpec("distribution", c, reference=base) for c in judged]
    if pilot.sampling.params.enabled:
        specs += [GateSpec("sampling_params", c, reference=base) for c in judged]
    # Reported beside the verdict, never deciding it: speed says what acceptance is worth.
    current = pilot.current if pilot.current in conditions else None
    specs += [GateSpec("acceptance", c, reference=current if c != current else None,
                       gating=False)
              for c in judged if pilot.conditions[c].speculates]
    for cand in [c for c in judged if pilot.conditions[c].role == "candidate"]:
        for ref in [r for r in pilot.references(cand) if r in conditions]:
            for level in pilot.load.levels:
                primary = level == pilot.primary_load
                specs.append(GateSpec("speedup", cand, reference=ref, load=level, gating=primary))
            unusual = pilot.trace.unusual_slice
            specs.append(GateSpec(
                "speedup", cand, reference=ref, load=pilot.primary_load, slice=unusual,
                gating=pilot.decision.gate_unusual_slice,
            ))
        mem = pilot.limits.memory
        if mem.max_peak_mb is not None or mem.max_increase_pct is not None:
            specs.append(GateSpec("memory", cand, reference=pilot.baseline))
        cost = pilot.limits.cost
        if cost.max_cost_per_request is not None:
            specs.append(GateSpec("cost", cand, load=pilot.primary_load))
        if cost.max_break_even_days is not None:
            specs.append(GateSpec("break_even", cand, reference=pilot.baseline,
                                  load=pilot.primary_load))
        for i, lim in enumerate(pilot.limits.latency):
            for level in [lim.load] if lim.load else list(pilot.load.levels):
                specs.append(GateSpec("latency", cand, load=level, index=i))
    return specs


def _e2e(r: RequestRecord) -> float | None:
    return r.e2e_s if r.ok else None


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


def _speedup(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.reference is not None and spec.load is not None
    pairs = list(iter_pairs(data, spec.reference, spec.condition, spec.load, _e2e, spec.slice))
    threshold = pilot.limits.speedup_min if spec.reference == pilot.baseline else 1.0
    if len(pairs) < 2:
        return GateResult(spec, "fail" if spec.gating else "skip",
                          f"{len(pairs)} paired prompt(s): too few to judge speed")
    ref = {pid: r for pid, r, _ in pairs}
    cand = {pid: c for pid, _, c in pairs}
    try:
        res = stats.paired_speedup(
            ref, cand, threshold=threshold, confidence=pilot.decision.confidence,
            n_resamples=pilot.decision.bootstrap_resamples, seed=pilot.sampling.seed,
        )
    except stats.StatsError as exc:
        return GateResult(spec, "fail", f"cannot judge speed: {exc}")
    outcome = res.outcome
    sequential = ""
    if pilot.decision.early_stop and spec.slice is None and spec.load == pilot.primary_load \
            and spec.reference == pilot.baseline:
        look = sequential_look(pilot, data, spec.condition)
        if isinstance(look, str):
            sequential = f"; group-sequential look not possible: {look}"
        else:
            if look.decision != "continue":
                outcome = "pass" if look.decision == "keep" else "fail"
            sequential = (
                f"; group-sequential decision {look.decision.upper()} at look {look.look}/"
                f"{pilot.load.blocks} (z={look.z:.2f}, keep boundary {look.boundary:.2f})"
            )
    summary = (
        f"completion-latency speedup {res.estimate:.3f}x, {pilot.decision.confidence:.0%} CI "
        f"[{res.ci_low:.3f}, {res.ci_high:.3f}] vs minimum {threshold:.3f}x over {res.n_prompts} "
        f"prompts ({res.n_pairs} requests); p={res.p_value:.3g}"
    )
    summary += sequential
    if outcome == "inconclusive" and res.more_pairs_needed:
        summary += f"; about {res.more_pairs_needed} more paired prompts would settle it"
    return GateResult(spec, outcome, summary, estimate=res.estimate, ci_low=res.ci_low,
                      ci_high=res.ci_high, threshold=threshold, p_value=res.p_value,
                      details={"method": res.method, "n_prompts": res.n_prompts})


def sequential_look(pilot: Pilot, data: SavedCampaign, candidate: str) -> SequentialDecision | str:
    """The group-sequential decision (primary load, vs baseline) at the last recorded block.

    Recomputed from the records, so the campaign's interim looks and a re-judged campaign
    apply the same rule under the pilot's current limits. A string says why no look is possible.
    """
    level = pilot.primary_load
    looks = max((r.block for r in data.records), default=-1) + 1
    plan = obrien_fleming_plan(pilot.load.blocks, (1 - pilot.decision.confidence) / 2)

    def blocks(cond: str) -> list[dict[str, list[float]]]:
        out: list[dict[str, list[float]]] = [{} for _ in range(looks)]
        for r in data.of(cond, level):
            if r.ok and r.e2e_s:
                out[r.block].setdefault(r.prompt_id, []).append(r.e2e_s)
        return out

    try:
        return sequential_speedup(blocks(pilot.baseline), blocks(candidate),
                                  pilot.limits.speedup_min, plan, pilot.decision.futility_speedup)
    except stats.StatsError as exc:
        return str(exc)


_METRICS: dict[str, Callable[[RequestRecord], float | None]] = {
    "ttft": lambda r: r.ttft_s,
    "e2e": lambda r: r.e2e_s,
    "tpot": lambda r: r.tpot_s,
}


def _latency(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.index is not None
    lim = pilot.limits.latency[spec.index]
    values = [v for r in data.of(spec.condition, spec.load) if r.ok
              if (v := _METRICS[lim.metric](r)) is not None]
    if not values:
        return GateResult(spec, "fail", f"no {lim.metric} measurements")
    res = stats.percentile_upper_bound(values, lim.percentile / 100, lim.max_s,
                                       pilot.decision.confidence)
    summary = (f"{lim.metric} p{lim.percentile:g} = {res.estimate * 1000:.1f} ms, upper "
               f"{pilot.decision.confidence:.0%} bound {res.bound * 1000:.1f} ms vs limit "
               f"{lim.max_s * 1000:.1f} ms (n={res.n})")
    return GateResult(spec, res.outcome, summary, estimate=res.estimate, ci_high=res.bound,
                      ci_low=res.estimate, threshold=lim.max_s)


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


_PREFLIGHT = {"command_line": _command_line, "artifact": _artifact}
_EVALUATORS = {
    "completed": _completed,
    "fairness": _fairness,
    **QUALITY_EVALUATORS,
    "speedup": _speedup,
    "latency": _latency,
    "memory": _memory,
    "cost": _cost,
    "break_even": _break_even,
}
