"""The quality gates: greedy identity, correctness, sampled distribution, sampling parameters
honoured, acceptance health. Each gate states whether it could have failed (``evidence``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ...pilot.probes import BY_NAME, PARAMETERS, PLAIN
from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ...results.records import RequestRecord
from ...results.scores import ScoreLine
from ..gates.result import GateResult, Outcome
from ..gates.spec import GateSpec
from .acceptance import collapses, describe, pooled
from .correctness import correctness_gate
from .distribution import budget_problem, distribution_check, records_to_samples
from .exact import ExactResult, ScoredSample, ScoredToken, Served, exact_test
from .exact_power import Budget, what_the_budget_sees
from .exact_power import budget_problem as exact_budget_problem
from .identity import classify, first_divergence, garwood, greedy_identity
from .param_verdicts import (
    ParamVerdict,
    Status,
    combine,
    is_refusal,
    parameter_verdicts,
    sampled_verdicts,
    used_by_service,
)


def _alpha(pilot: Pilot) -> float:
    return (1 - pilot.decision.confidence) / 2


def sampling_budget_problem(pilot: Pilot, trace_prompts: int) -> str | None:
    """Why the pilot's sampled pass could never fail the distribution gate, naming the keys
    to change; None when it can (or there is no sampled pass)."""
    sampled = pilot.sampling.sampled
    if not sampled.enabled:
        return None
    prompts = min(sampled.prompts or trace_prompts, trace_prompts)
    why = budget_problem(prompts, sampled.samples_per_prompt,
                         pilot.limits.quality.distribution_alpha)
    if why is None:
        exact = _exact_budget(pilot, trace_prompts)
        if exact is not None:  # the exact test must see greedy verification (SGLang on CPU)
            why = exact_budget_problem(*exact, pilot.limits.quality.distribution_alpha)
    if why is None:
        return None
    return (f"sampling.sampled.samples_per_prompt / sampling.sampled.prompts: {why} "
            f"(limits.quality.distribution_alpha)")


def sampling_budget_sees(pilot: Pilot, trace_prompts: int) -> str | None:
    """What the sampled pass can see, said before anything boots ("... detects a temperature
    shift of 0.15 at the speculative positions with 80% power ..."); None without one."""
    exact = _exact_budget(pilot, trace_prompts)
    if exact is None:
        return None
    return what_the_budget_sees(*exact, pilot.limits.quality.distribution_alpha)


def _exact_budget(pilot: Pilot, trace_prompts: int) -> tuple[Budget, Served] | None:
    """The sampled pass as the exact test's power sees it (tokens: the pass's budget, or the
    pilot's cap; outputs that end sooner hold fewer), or None where it samples nothing."""
    sampled = pilot.sampling.sampled
    served = served_sampling(pilot)
    if not sampled.enabled or served.temperature == 0:
        return None
    prompts = min(sampled.prompts or trace_prompts, trace_prompts)
    tokens = sampled.max_new_tokens or pilot.max_new_tokens_cap or 128
    return Budget(prompts, sampled.samples_per_prompt, tokens, sampled.score_top_k), served


# --------------------------------------------------------------------------- greedy identity


def _rate(events: int, tokens: int, confidence: float) -> str:
    high = garwood(events, tokens, confidence)[1]
    return f"{events} in {tokens} tokens ({events / max(tokens, 1):.2%}/token, <= {high:.2%})"


def _compared_words(data: SavedCampaign, spec: GateSpec) -> str:
    """What the greedy comparison covered, as run: prompts, greedy passes (boots included) and
    load levels, so a single untimed pass is not read as every pass."""
    recs = data.of(spec.condition, mode="greedy")
    prompts = len({r.prompt_id for r in recs})
    passes = len({(r.boot, r.repetition) for r in recs})
    loads = sorted({r.load for r in recs})
    return (f"greedy, {prompts} prompt{'s' if prompts != 1 else ''} x {passes} "
            f"pass{'es' if passes != 1 else ''} at load {', '.join(loads)}")


def judge_greedy_identity(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    q = pilot.limits.quality
    assert spec.reference is not None
    res = greedy_identity(data.of(spec.reference, mode="greedy"),
                          data.of(spec.condition, mode="greedy"), q.near_tie_epsilon,
                          _alpha(pilot), q.max_near_tie_rate)
    cand, control, test = res.candidate, res.control, res.test
    if cand.compared == 0:
        return GateResult(spec, "fail", "no prompt completed on both sides: nothing to compare")
    genuine = cand.genuine
    conf = pilot.decision.confidence
    if test.method == "control" and control is not None:
        seen = _rate(len(control.near_ties), control.tokens, conf)
        tolerance = (f"control (the reference's later passes against its first) {seen}; "
                     f"relabelling p={test.p_value:.3g}")
    else:
        tolerance = (f"the fixed limit {q.max_near_tie_rate:.2%}/token (no identical-condition "
                     f"control: one greedy pass of the reference), Poisson p={test.p_value:.3g}")
    summary = (
        f"{cand.identical}/{cand.compared} identical outputs ({_compared_words(data, spec)}); "
        f"{len(genuine)} genuine divergence(s) (max {q.max_genuine_divergences}); near-ties "
        f"(runner-up within {q.near_tie_epsilon} nats) "
        f"{_rate(len(cand.near_ties), cand.tokens, conf)} vs {tolerance}"
    )
    if control is not None and control.genuine:
        summary += (f"; note: the reference's own rerun diverged genuinely {len(control.genuine)}"
                    " time(s) (non-deterministic beyond near-ties)")
    for d in genuine[:3]:
        why = "no top-2 ids recorded" if d.runner_up is None else (
            f"runner-up {d.runner_up}" if d.candidate_token != d.runner_up else "margin")
        summary += (
            f"\n  {d.prompt_id} [{d.load}] @token {d.position}: {d.reference_token} -> "
            f"{d.candidate_token} (margin {d.margin if d.margin is None else round(d.margin, 3)},"
            f" {why}): {d.reference_text!r} vs {d.candidate_text!r}"
        )
    ok = len(genuine) <= q.max_genuine_divergences and test.outcome == "pass"
    return GateResult(
        spec, "pass" if ok else "fail", summary, estimate=len(genuine),
        threshold=q.max_genuine_divergences, p_value=test.p_value,
        details={"compared": cand.compared, "identical": cand.identical,
                 "tokens": cand.tokens, "genuine": [d.__dict__ for d in genuine],
                 "near_ties": [d.__dict__ for d in cand.near_ties],
                 "near_tie_rate": cand.rate, "rate_test": test.method,
                 "control": None if control is None else {
                     "compared": control.compared, "tokens": control.tokens,
                     "near_ties": len(control.near_ties), "genuine": len(control.genuine)}},
    )


# --------------------------------------------------------------------------- correctness


def judge_correctness(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.reference is not None
    if data.prompts is None:
        return GateResult(spec, "skip", "the trace files are gone or changed: nothing to check")
    q = pilot.limits.quality
    res = correctness_gate(data.of(spec.reference, mode="greedy"),
                           data.of(spec.condition, mode="greedy"), data.prompts,
                           q.max_loss_rate, _alpha(pilot))
    test = res.test
    details: dict[str, Any] = {"n_pairs": res.n_pairs, "reference_rate": res.reference_rate,
                               "candidate_rate": res.candidate_rate, "losses": res.losses,
                               "gains": res.gains, "control_losses": res.control_losses}
    if test is None or test.outcome == "skip":
        return GateResult(spec, res.outcome, res.summary, details=details)
    details |= {"at_risk": test.at_risk, "critical": test.critical,
                "power": {f"{k:g}": v for k, v in test.power.items()}}
    return GateResult(spec, res.outcome, res.summary, estimate=len(res.losses),
                      ci_low=0.0, ci_high=test.upper, threshold=test.critical,
                      p_value=test.p_value, details=details,
                      evidence="underpowered" if test.underpowered else "tested")


# --------------------------------------------------------------------------- distribution


def scored_samples(lines: Sequence[ScoreLine]) -> list[ScoredSample]:
    """scores.jsonl's lines as the exact test reads them."""
    return [ScoredSample(line.prompt_id, line.sample_index, tuple(
        ScoredToken(p.token, p.logprob, p.top_ids, p.top_logprobs, k)
        for p, k in zip(line.positions, line.classes, strict=True))) for line in lines]


def served_sampling(pilot: Pilot) -> Served:
    """The sampling the sampled pass asked for: what its samples should follow."""
    s = pilot.sampling.sampled
    return Served(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p)


def exact_details(res: ExactResult) -> dict[str, Any]:
    """The per-class figures of an exact test (score z, PIT p, top-1 observed/expected,
    draws outside the served support, effective temperature and its CI) as gate details."""
    return {"outcome": res.outcome, "p_value": res.p_value, "summary": res.summary,
            "split_known": res.split_known, "confidence": res.confidence,
            "served": res.served.words(),
            "classes": {k: {"n": c.n, "score_z": c.score_z, "pit_p": c.pit_p,
                            "top1_observed": c.top1_observed, "top1_expected": c.top1_expected,
                            "outside_support": c.outside_support,
                            "temperature": c.temperature,
                            "temperature_ci": list(c.temperature_ci),
                            "decisive": c.decisive, "p_value": c.p_value,
                            "outcome": c.outcome}
                        for k, c in res.classes.items()}}


def _judge_exact(spec: GateSpec, pilot: Pilot, data: SavedCampaign,
                 lines: list[ScoreLine]) -> GateResult:
    """The candidate's samples against the target's own distribution, per position class;
    the scorer's own samples (the baseline's) are the A/A control: where they fail, the
    scores do not describe what the server samples from, and nothing is concluded."""
    served = served_sampling(pilot)
    alpha = pilot.limits.quality.distribution_alpha
    conf = pilot.decision.confidence
    seed = pilot.sampling.seed
    scorer = lines[0].scorer
    control_lines = data.scores_of(scorer) if scorer != spec.condition else []
    # The vocabulary bounds the tail beyond the top-K from both sides, where the scorer knew it.
    sizes = {line.vocab for line in (*lines, *control_lines)}
    vocab = sizes.pop() if len(sizes) == 1 else None
    res = exact_test(scored_samples(lines), served, alpha, seed, confidence=conf, vocab=vocab)
    control = (exact_test(scored_samples(control_lines), served, alpha, seed + 1,
                          confidence=conf, vocab=vocab) if control_lines else None)
    details: dict[str, Any] = {"method": "exact", "scorer": scorer,
                               "samples": len(lines), "candidate": exact_details(res),
                               "control": None if control is None else exact_details(control)}
    tokens = sum(c.n for c in res.classes.values())
    size = f"{len(lines)} samples, {tokens} tokens scored by {scorer} (the target)"
    if control is not None and control.outcome == "fail":
        return GateResult(
            spec, "inconclusive",
            f"the target's scores disagree with what {scorer} itself samples (A/A control "
            f"fails: {control.summary}), so the candidate's test is not trusted; candidate: "
            f"{res.summary} ({size})", p_value=res.p_value, threshold=alpha, details=details)
    control_text = ("" if control is None else
                    f"; A/A control ({scorer}'s own samples) as served, p={control.p_value:.3g}")
    return GateResult(spec, res.outcome, f"{res.summary} ({size}){control_text}",
                      estimate=_worst_temperature(res), p_value=res.p_value, threshold=alpha,
                      details=details)


def _worst_temperature(res: ExactResult) -> float | None:
    """The effective temperature of the class with the smallest p (the gate's estimate)."""
    if not res.classes:
        return None
    worst = min(res.classes.values(), key=lambda c: c.p_value)
    return None if math.isnan(worst.temperature) else worst.temperature


def judge_distribution(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.reference is not None
    lines = data.scores_of(spec.condition)
    if lines:  # the target scored the samples: the exact test decides
        return _judge_exact(spec, pilot, data, lines)
    ref = records_to_samples(data.records, spec.reference)
    cand = records_to_samples(data.records, spec.condition)
    if not any(len(ref.get(p, ())) >= 2 and len(v) >= 2 for p, v in cand.items()):
        return GateResult(spec, "fail", "no prompt has 2 sampled outputs on both sides")
    res = distribution_check(ref, cand, alpha=pilot.limits.quality.distribution_alpha,
                             seed=pilot.sampling.seed)
    # Said, so that a reader knows why no position is named: the target did not score these
    # samples (an endpoint without logprobs, or a run before scoring existed).
    return GateResult(
        spec, res.outcome, f"{res.summary} (two-sample check: the samples were not scored by "
        "the target)", estimate=res.distance, threshold=res.alpha, p_value=res.p_value,
        evidence="not_evaluable" if res.smallest_p > res.alpha else "tested",
        details={"method": "two-sample", "smallest_p": res.smallest_p, "critical": res.critical,
                 "similarity_ratio": res.similarity_ratio, "prompts": res.n_prompts,
                 "samples_per_prompt": res.samples_per_prompt, "worst": res.worst},
    )


# --------------------------------------------------------------------------- sampling params


def _params_records(data: SavedCampaign, cond: str) -> dict[tuple[str, str], RequestRecord]:
    return {(r.prompt_id, r.probe or PLAIN): r for r in data.of(cond, mode="params")}


def _judge_probe(name: str, ref: dict[tuple[str, str], RequestRecord],
                 cand: dict[tuple[str, str], RequestRecord], pid: str,
                 epsilon: float) -> tuple[str, str]:
    """(status, why): ok | broken | refused | unsupported | not_evaluable for one probe and
    prompt (refused: the candidate declines what the baseline accepts)."""
    probe = BY_NAME[name]
    r, c = ref.get((pid, name)), cand.get((pid, name))
    r_plain, c_plain = ref.get((pid, PLAIN)), cand.get((pid, PLAIN))
    if r is None or r_plain is None:
        return "not_evaluable", "the baseline did not run it"
    if not r.ok:
        kind = "unsupported" if (r.error or "").startswith("unsupported") else "not_evaluable"
        return kind, f"baseline: {r.error}"
    if c is None or c_plain is None:
        return "broken", "the condition did not run it"
    if (r.request or {}) != (c.request or {}):
        return "not_evaluable", "derived from plain outputs that differ (see greedy identity)"
    if not c.ok:
        return ("refused" if is_refusal(c.error) else "broken"), f"{c.error}"
    settings = r.request or {}
    if probe.check(settings, r.output_text, r.output_ids, r_plain.output_text,
                   r_plain.output_ids) is not None:
        return "not_evaluable", "the baseline itself does not honour it"
    if probe.informative and r.output_ids == r_plain.output_ids:
        return "not_evaluable", "it changed nothing in the baseline's output"
    wrong = probe.check(settings, c.output_text, c.output_ids, c_plain.output_text,
                        c_plain.output_ids)
    if wrong is not None:
        return "broken", wrong
    if probe.kind == "same":
        pos = first_divergence(r.output_ids, c.output_ids)
        if pos is not None and not classify(r, c, pos, epsilon).near_tie:
            return "broken", (f"output differs from the baseline's at token {pos} "
                              f"({r.output_text[:40]!r} vs {c.output_text[:40]!r})")
    return "ok", ""


def _greedy_verdict(name: str, label: str, results: list[tuple[str, str, str]]
                    ) -> ParamVerdict:
    """One greedy probe's per-prompt results as a verdict."""
    status: dict[str, Status] = {"ok": "honoured", "broken": "not_honoured",
                                 "refused": "refused"}
    return combine(name, label, [
        ParamVerdict(name, label, status.get(s, "not_tested"),
                     f"greedy, {pid}: {why}" if s in ("broken", "refused") else why)
        for pid, s, why in results])


def judge_sampling_params(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    """One verdict per sampling parameter (:mod:`.param_verdicts`) and per other greedy probe
    (stop strings, token limits, logit bias, constrained decoding)."""
    assert spec.reference is not None
    ref = _params_records(data, spec.reference)
    cand = _params_records(data, spec.condition)
    prompts = sorted({pid for pid, probe in ref if probe == PLAIN})
    if not prompts:
        return GateResult(spec, "fail", "no sampling-parameter probe was recorded")
    eps = pilot.limits.quality.near_tie_epsilon
    per: dict[str, list[tuple[str, str, str]]] = {}
    for name in BY_NAME:
        for pid in prompts:
            if (pid, name) in ref or (pid, name) in cand:
                per.setdefault(name, []).append((pid, *_judge_probe(name, ref, cand, pid, eps)))
    labels = dict(PARAMETERS)
    greedy = {n: _greedy_verdict(n, labels.get(n, n), v) for n, v in per.items()}
    params = parameter_verdicts(sampled_verdicts(pilot, data, spec.reference, spec.condition),
                                greedy)
    verdicts = {**params, **{n: v for n, v in greedy.items() if n not in params}}
    used = used_by_service(pilot)
    wrong = [v for v in verdicts.values() if v.status == "not_honoured"]
    refused = [v for v in verdicts.values() if v.status == "refused"]
    ok = [v.label for v in verdicts.values() if v.status == "honoured"]
    untested = [v for v in verdicts.values() if v.status == "not_tested"]
    lines = [v.clause() for v in (*wrong, *refused)]
    # "No fault found", not "honoured": a probe that saw no drop was sized, not proven.
    lines.append(f"no fault found: {', '.join(ok) or 'none'}")
    if untested:
        lines.append("not tested: " + "; ".join(f"{v.label} ({v.why})" for v in untested))
    blocking = [v for v in refused if v.parameter in used]
    outcome: Outcome = "fail" if wrong or blocking else ("pass" if ok or refused else "skip")
    summary = "; ".join(lines) + f" ({len(prompts)} prompt(s))"
    return GateResult(spec, outcome, summary, estimate=len(wrong) + len(blocking), threshold=0,
                      details={"parameters": {n: v.as_dict() for n, v in verdicts.items()},
                               "honoured": sorted(n for n, v in verdicts.items()
                                                  if v.status == "honoured"),
                               "broken": {n: v.why for n, v in verdicts.items()
                                          if v.status == "not_honoured"},
                               "refused": {n: v.why for n, v in verdicts.items()
                                           if v.status == "refused"},
                               "not_tested": {n: v.why for n, v in verdicts.items()
                                              if v.status == "not_tested"}},
                      evidence="tested" if ok or wrong or refused else "not_evaluable")


# --------------------------------------------------------------------------- acceptance


def judge_acceptance(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    q = pilot.limits.quality
    alpha = _alpha(pilot)
    levels = list(pilot.load.levels)
    mine = {lv: pooled(data.of(spec.condition, lv)) for lv in levels}
    if not any(mine.values()):
        return GateResult(spec, "skip", "the engine reported no per-position acceptance")
    findings, shown = [], []
    for lv, rates in mine.items():
        if rates is not None:
            shown.append(f"{lv}: {rates.text()}")
    light = mine.get(pilot.load.lightest())
    for lv, rates in mine.items():
        if rates is None or light is None or lv == pilot.load.lightest():
            continue
        found = collapses(rates, light, q.max_acceptance_drop, alpha)
        if found:
            findings.append(f"at load {lv} against load {pilot.load.lightest()}: "
                            f"{describe(found)}")
    if spec.reference is not None:
        for lv in levels:
            theirs, rates = pooled(data.of(spec.reference, lv)), mine.get(lv)
            if theirs is None or rates is None:
                continue
            found = collapses(rates, theirs, q.max_acceptance_drop, alpha)
            if found:
                findings.append(f"at load {lv} against {spec.reference} ({theirs.text()}): "
                                f"{describe(found)}")
    summary = ("acceptance collapsed " + "; ".join(findings) if findings
               else "no collapse of per-position acceptance") + " (rates per draft position: " \
        + "; ".join(shown) + ")"
    return GateResult(spec, "fail" if findings else "pass", summary,
                      details={"rates": {lv: r.rates if r else None for lv, r in mine.items()},
                               "collapses": findings})
