"""What a verdict means for the person reading it: the numbers that decided it, each reason in
a few words, and a diagnosis where the pattern is a known one.

Pure: judged gates, figures and (optionally) the records in; a :class:`Diagnosis` out. The
wording of a headline is the reports' business (``report/headline.py``).

Known patterns:

* **never accepted**: an accept length near 1 (1 = only the target's own token per verify
  step) means the target rejected nearly every drafted token: the drafter speaks another
  vocabulary/tokenizer than the target, or was never adapted to this target; for a
  multi-layer or Osprey EAGLE-3 draft on SGLang, most likely an SGLang without its patch;
* **batch-size crossover**: faster at low load but slower at the higher concurrency: verifying
  drafts costs compute that concurrent requests would otherwise share;
* **domain gap**: clearly slower (or accepting fewer tokens) on the unusual slice than overall:
  the drafter was adapted on other text.

With three or more closed-loop levels, the concurrency up to which speculation pays (its
speedup over the baseline clears the threshold) is estimated with an interval
(:mod:`..speed.crossover`) and said in a line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy.stats import norm

from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ..figures.measured import Figures, accept_lengths
from ..gates.kinds import GateKind as K
from ..gates.result import GateResult, Outcome, Verdict
from ..quality.exact import CLASS_WORDS
from ..speed.crossover import Crossover, crossover, levels_from_gates
from .next_step import Found, next_step
from .partial import WITHHELD
from .unchecked import Unchecked, unchecked
from .verdicts import CandidateVerdict

DRAFT_LAYOUT = "draft layout"
"""The artifact check's line naming a draft stock SGLang serves wrong (preflight.artifact)."""
ACCEPT_FLOOR = 1.15
"""A pooled accept length below this reads as "the drafter is (almost) never accepted"."""
DOMAIN_GAP = 0.9
"""The unusual slice is flagged when its speedup is below this fraction of the overall one."""
QUALITY_KINDS = (K.GREEDY_IDENTITY, K.CORRECTNESS, K.DISTRIBUTION)
SPEED_KINDS = (K.SPEEDUP, K.GOODPUT, K.LATENCY, K.COST, K.BREAK_EVEN)


@dataclass(frozen=True)
class Speed:
    """A speedup gate's figures (ratios; > 1: the candidate is faster)."""

    reference: str
    load: str
    outcome: Outcome
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    threshold: float | None
    total_time: float | None = None
    total_low: float | None = None
    total_high: float | None = None


@dataclass(frozen=True)
class Reason:
    """One failed or inconclusive gating gate, in words."""

    name: str  # e.g. "speed at concurrent"
    outcome: Outcome
    text: str  # the figures, short
    diagnosis: str | None
    gate: str  # kind[id]: where the full evidence is


@dataclass(frozen=True)
class Diagnosis:
    candidate: str
    verdict: Verdict
    speed: Speed | None  # the deciding one: primary load, against the baseline
    accept_length: float | None  # pooled, at the primary load
    quality: str  # one word: identical | equivalent | changed | worse | unproven | unchecked
    reasons: list[Reason]
    notes: list[str] = field(default_factory=list)  # diagnoses not tied to a listed reason
    withheld: str | None = None  # why no verdict: the campaign (or a condition) is partial
    crossover: Crossover | None = None  # up to which concurrency speculation pays
    unchecked: list[Unchecked] = field(default_factory=list)  # quality checks that did not run
    not_run: str | None = None  # the candidate (or a reference) never ran: nothing measured
    next_step: str = ""  # what to do next, from the pattern that decided it (.next_step)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def total_time(details: Mapping[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(estimate, low, high) of a total-time speedup in a speedup gate's details, whichever
    shape it has (a number, or a mapping with an estimate and a CI); Nones when absent."""
    value = details.get("total_time")
    if isinstance(value, Mapping):
        ci = value.get("ci")
        low, high = (ci if isinstance(ci, list | tuple) and len(ci) == 2
                     else (value.get("ci_low"), value.get("ci_high")))
        return _num(value.get("estimate")), _num(low), _num(high)
    return _num(value), None, None


def speed_of(g: GateResult) -> Speed:
    t, t_low, t_high = total_time(g.details)
    return Speed(g.spec.reference or "", g.spec.load or "", g.outcome, g.estimate, g.ci_low,
                 g.ci_high, g.threshold, t, t_low, t_high)


def gate_name(g: GateResult, candidate: str, baseline: str) -> str:
    s = g.spec
    at = f" at {s.load}" if s.load else ""
    vs = f" vs {s.reference}" if s.reference and s.reference != baseline else ""
    names = {
        K.SPEEDUP: f"speed{vs}{at}" + (f" on the {s.slice} slice" if s.slice else ""),
        K.COMPLETED: f"completed requests{at}" if s.condition == candidate
        else f"{s.condition} completed requests{at}",
        K.GREEDY_IDENTITY: f"greedy outputs{vs}",
        K.CORRECTNESS: f"correctness{vs}",
        K.DISTRIBUTION: f"sampled outputs{vs}",
        K.FAIRNESS: "fair comparison",
        K.LATENCY: f"latency limit{at}",
        K.MEMORY: "memory",
        K.COST: f"cost per request{at}",
        K.BREAK_EVEN: f"break-even{vs}",
        K.GOODPUT: f"goodput{at}",
        K.ARTIFACT: "drafter artifact",
        K.COMMAND_LINE: "command line",
        K.BOOT_CONSISTENCY: "boots alike" if s.condition == candidate
        else f"{s.condition} boots alike",
    }
    return names.get(s.kind, s.kind)


def _first_line(g: GateResult, width: int = 160) -> str:
    text = g.gist
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def _speed_text(g: GateResult) -> str:
    d = g.details
    assert g.estimate is not None and g.ci_low is not None
    thr = g.threshold if g.threshold is not None else 1.0
    text = f"{g.estimate:.2f}x [{g.ci_low:.2f}, {g.ci_high or 0:.2f}]"
    inconclusive = g.outcome == "inconclusive"
    held_keep = inconclusive and g.ci_low > thr  # clear of it, held back by a reason
    held_drop = inconclusive and g.ci_high is not None and g.ci_high < thr
    word = {"fail": "below", "inconclusive": "clears" if held_keep else
            "is below" if held_drop else "straddles"}.get(g.outcome)
    if word:
        text += f", {word} the {thr:.2f}x needed"
    if held_keep or held_drop:
        text += (", but not without the pass where the comparison changed (unstable "
                 "environment)" if d.get("held_back") == "unstable_environment"
                 else f", but {d.get('reason', '')}")
    advice = d.get("advice")
    settle = advice.get("settle") if isinstance(advice, Mapping) else None
    if g.outcome == "inconclusive" and settle:
        text += f" ({settle})"
    return text


def _exact_text(d: Mapping[str, Any]) -> str:
    """The exact test's weakest position class in figures: its effective temperature and CI
    against the served one, its score z and top-1 count."""
    if (d.get("control") or {}).get("outcome") == "fail":
        return ("the target's scores disagree with the baseline's own samples (A/A control "
                "fails): the candidate's test is not trusted")
    classes = (d.get("candidate") or {}).get("classes") or {}
    if not classes:
        return "no token scored"
    name, c = min(classes.items(), key=lambda kv: kv[1].get("p_value", 1.0))
    lo, hi = (c.get("temperature_ci") or [None, None])[:2]

    def t(x: Any) -> str:
        return "inf" if x is None or x == math.inf else f"{x:.2f}"

    temp = c.get("temperature")
    fitted = isinstance(temp, int | float) and not math.isnan(temp)
    fit = f"effective temperature {t(temp)} [{t(lo)}, {t(hi)}], " if fitted else ""
    return (f"{CLASS_WORDS.get(name, name)}: {fit}"
            + f"score z {c.get('score_z', 0):+.1f}, top-1 drawn {c.get('top1_observed')} "
            f"times for {c.get('top1_expected', 0):.0f} expected "
            f"(served {(d.get('candidate') or {}).get('served')})")


def short_text(g: GateResult) -> str:
    """The gate's result in a few words (figures, not internal ids or p-values), from its
    fields and details; a gate without them shows its summary's first line."""
    d = g.details
    if g.spec.kind == K.SPEEDUP and g.estimate is not None and g.ci_low is not None:
        return _speed_text(g)
    if g.spec.kind == K.GREEDY_IDENTITY and "compared" in d:
        genuine = d.get("genuine") or []
        text = f"{len(genuine)} genuine divergence(s) in {d['compared']} prompts"
        if genuine and isinstance(genuine[0], Mapping):
            text += f", first at {genuine[0].get('prompt_id')} token {genuine[0].get('position')}"
        return text
    if g.spec.kind == K.CORRECTNESS and "at_risk" in d and g.ci_high is not None:
        # The loss rule's own figures: answers lost of those at risk, its bound on the rate.
        return (f"{g.estimate or 0:.0f} of {d['at_risk']} answers the reference got right now "
                f"wrong (fails above {g.threshold or 0:.0f}), loss rate <= {g.ci_high:.0%}; "
                f"pass rate {d['candidate_rate']:.0%} vs {d['reference_rate']:.0%} over "
                f"{d.get('n_pairs')} prompts")
    if g.spec.kind == K.DISTRIBUTION and d.get("method") == "exact":
        return _exact_text(d)
    if g.spec.kind == K.DISTRIBUTION and "prompts" in d and g.estimate is not None:
        return (f"distance {g.estimate:.4f} (flagged from {d.get('critical', 0):.4f}) over "
                f"{d['prompts']} prompts x {d.get('samples_per_prompt')} samples")
    if g.spec.kind == K.LATENCY and "metric" in d and g.estimate is not None \
            and g.ci_high is not None and g.threshold is not None:
        bound = f"{g.ci_high * 1000:.1f} ms" if math.isfinite(g.ci_high) else "unbounded"
        return (f"{d['metric']} p{d.get('percentile', 0):g} {g.estimate * 1000:.1f} ms, "
                f"bound {bound} vs limit {g.threshold * 1000:.1f} ms")
    if g.spec.kind == K.BREAK_EVEN and (d.get("reason") or g.estimate is not None):
        if g.estimate is not None:
            return f"setup cost recovered after {g.estimate:,.1f} days, {g.threshold:g} allowed"
        return str(d["reason"]).removeprefix("no break-even: ")
    if g.spec.kind == K.FAIRNESS and g.outcome == "fail" and d.get("differences"):
        text = "differ beyond the drafter: " + "; ".join(map(str, d["differences"]))
        return text if len(text) <= 160 else text[:157].rstrip() + "..."
    if g.spec.kind == K.GOODPUT and "candidate_share" in d:
        return (f"{d['candidate_share']:.0%} of requests meet the targets vs "
                f"{d['reference_share']:.0%}")
    return _first_line(g)


def quality_word(gates: Sequence[GateResult]) -> str:
    # A gate that passed without evidence (it could not have failed) says nothing either way.
    quality = [g for g in gates if g.spec.kind in QUALITY_KINDS and g.outcome != "skip"
               and getattr(g, "evidence", "tested") in (None, "tested")]
    if not quality:
        return "unchecked"
    if any(g.outcome == "fail" for g in quality):
        return "worse" if any(g.spec.kind == K.CORRECTNESS and g.outcome == "fail"
                              for g in quality) else "changed"
    if any(g.outcome == "inconclusive" for g in quality):
        return "unproven"
    greedy = [g for g in quality if g.spec.kind == K.GREEDY_IDENTITY]
    if greedy and all(g.details.get("identical") == g.details.get("compared") for g in greedy):
        return "identical"
    return "equivalent"


def _patched_draft(results: Sequence[GateResult], candidate: str) -> str | None:
    """The description of ``candidate``'s draft where its artifact check found one that stock
    SGLang serves wrong (its ``draft layout`` line); None otherwise."""
    for g in results:
        if g.spec.kind == K.ARTIFACT and g.spec.condition == candidate:
            for c in g.details.get("checks") or []:
                if isinstance(c, Mapping) and c.get("name") == DRAFT_LAYOUT:
                    return str(c.get("detail"))
    return None


def _never_accepted(accept: float | None, draft: str | None) -> str | None:
    if accept is None or accept >= ACCEPT_FLOOR:
        return None
    said = (f"accept length {accept:.2f}: the target almost never accepted a drafted token "
            "(1.00 = only its own token per step)")
    if draft is not None:  # a draft stock SGLang loads but runs wrong, silently
        return (f"{said} - most likely an SGLang without the drafter's patch, running this "
                f"{draft} with the target's embedding or only its first layer "
                "(see the artifact check's serving engine line)")
    return f"{said} - a vocabulary/tokenizer mismatch with the target or a drafter not " \
        "adapted to it"


def _log_se(s: Speed, z: float) -> float | None:
    """The standard error of log(speedup) its interval implies (normal on the log scale,
    ``z`` the quantile of the interval's confidence)."""
    if s.estimate is None or s.ci_low is None or s.ci_high is None or s.ci_low <= 0 \
            or not math.isfinite(s.ci_high) or s.ci_high <= s.ci_low:
        return None
    return (math.log(s.ci_high) - math.log(s.ci_low)) / (2 * z)


def _falls(light: Speed, heavy: Speed, z: float) -> bool:
    """The speedup is lower at the heavier load beyond the two intervals' noise: a z test on
    the log ratios (the levels are measured on different requests, so their errors add)."""
    a, b = _log_se(light, z), _log_se(heavy, z)
    if a is None or b is None or light.estimate is None or heavy.estimate is None:
        return False
    return (math.log(light.estimate) - math.log(heavy.estimate)) / math.hypot(a, b) > z


def _crossover(speeds: Sequence[Speed], order: Mapping[str, int], z: float
               ) -> tuple[str, str] | None:
    """(heavier load, text) when the candidate is slower at a heavier load and either faster
    at its lightest one, or at least not slower there with the speedup falling with load
    (the interval at x1 may straddle 1 while x4 is clearly below)."""
    ranked = sorted((s for s in speeds if s.estimate is not None and s.load in order),
                    key=lambda s: order[s.load])
    if len(ranked) < 2:
        return None
    light = ranked[0]
    assert light.estimate is not None
    # Shown, not guessed: each side's CI must exclude 1 (the point estimate alone only where
    # a gate has no CI), or noise at one level reads as a crossover.
    faster = light.ci_low > 1 if light.ci_low is not None else light.estimate >= 1.05
    even = light.ci_high is not None and light.ci_high > 1  # not shown slower at low load
    for heavy in ranked[1:]:
        assert heavy.estimate is not None
        slower = heavy.ci_high < 1 if heavy.ci_high is not None else heavy.estimate <= 0.95
        if not slower:
            continue
        if faster:
            said = f"faster at {light.load} ({light.estimate:.2f}x) but slower at {heavy.load}"
        elif even and _falls(light, heavy, z):
            said = (f"no slower at {light.load} ({light.estimate:.2f}x [{light.ci_low:.2f}, "
                    f"{light.ci_high:.2f}]) but clearly slower at {heavy.load}")
        else:
            continue
        return heavy.load, (
            f"{said} ({heavy.estimate:.2f}x): the batch-size crossover - verifying drafts "
            "costs compute that concurrent requests need; keep speculation for low load or "
            "cap it by batch size")
    return None


def _domain_gap(overall: Speed | None, unusual: GateResult | None,
                accept: tuple[float | None, float | None]) -> str | None:
    if overall is None or overall.estimate is None or unusual is None \
            or unusual.estimate is None:
        return None
    worse = unusual.estimate < overall.estimate * DOMAIN_GAP and (
        (unusual.ci_high is not None and unusual.ci_high < overall.estimate)
        or unusual.estimate < 1 <= overall.estimate)
    if not worse:
        return None
    text = (f"slower on the {unusual.spec.slice} slice ({unusual.estimate:.2f}x vs "
            f"{overall.estimate:.2f}x overall")
    if accept[0] is not None and accept[1] is not None:
        text += f"; accept length {accept[0]:.2f} vs {accept[1]:.2f}"
    return text + ("): a domain gap - the drafter was adapted on other text; adapt it on this "
                   "domain or route these requests around it")


def pays_up_to(pilot: Pilot, speeds: Sequence[GateResult]) -> Crossover:
    """Where the speedup over the baseline (``speeds``: one candidate's gates against it)
    stops clearing ``limits.speedup_min`` across the closed-loop levels."""
    load = pilot.load
    closed = {lv: load.concurrency(lv) for lv in load.levels if load.rate(lv) is None}
    return crossover(levels_from_gates([g for g in speeds if g.spec.slice is None], closed),
                     pilot.limits.speedup_min, pilot.decision.confidence)


def diagnose(pilot: Pilot, verdict: CandidateVerdict, results: Sequence[GateResult],
             figures: Sequence[Figures], data: SavedCampaign | None = None) -> Diagnosis:
    """The diagnosis of one candidate's verdict."""
    cand, base, primary = verdict.candidate, pilot.baseline, pilot.primary_load
    if verdict.not_run is not None:
        first = next((g for g in verdict.gates if g.details.get("not_run")), None)
        gate = f"{first.spec.kind}[{first.spec.id}]" if first is not None else ""
        return Diagnosis(cand, verdict.verdict, None, None, "not measured",
                         [Reason("did not run", "fail" if verdict.verdict == "DROP"
                                 else "inconclusive", verdict.not_run, None, gate)],
                         not_run=verdict.not_run, next_step=next_step(verdict, Found()))
    mine = [g for g in results if g.spec.condition == cand]
    speeds = [g for g in mine if g.spec.kind == K.SPEEDUP and g.spec.reference == base]
    overall = {g.spec.load: speed_of(g) for g in speeds if g.spec.slice is None}
    deciding = overall.get(primary)
    fig = {f.load: f for f in figures if f.condition == cand}
    accept = fig[primary].accept_length_pooled if primary in fig else None
    order = {f.load: (f.concurrency or 0) for f in figures if f.condition == base}
    unusual = next((g for g in speeds if g.spec.slice and g.spec.load == primary), None)
    slice_accept: tuple[float | None, float | None] = (None, None)
    if data is not None and unusual is not None:
        recs = data.of(cand, primary)
        slice_accept = (accept_lengths([r for r in recs if r.slice == unusual.spec.slice])[0],
                        accept_lengths([r for r in recs if r.slice != unusual.spec.slice])[0])

    patched = _patched_draft(results, cand)
    pending = {"never": _never_accepted(accept, patched)}
    cross = _crossover(list(overall.values()), order,
                       float(norm.ppf((1 + pilot.decision.confidence) / 2)))
    pending["cross"] = cross[1] if cross else None
    pending["gap"] = _domain_gap(deciding, unusual, slice_accept)
    found = Found(cross[0] if cross else None,
                  unusual.spec.slice if pending["gap"] and unusual is not None else None,
                  pending["never"] is not None, patched is not None)

    reasons = []
    listed = [g for g in verdict.gates if g.outcome == "fail"] + \
        [g for g in verdict.gates if g.outcome == "inconclusive"]
    for g in listed:
        diag = None
        if g.spec.kind in SPEED_KINDS:
            if g.spec.slice and pending["gap"]:
                diag, pending["gap"] = pending["gap"], None
            elif cross and g.spec.load == cross[0] and pending["cross"]:
                diag, pending["cross"] = pending["cross"], None
            elif pending["never"]:
                diag, pending["never"] = pending["never"], None
        reasons.append(Reason(gate_name(g, cand, base), g.outcome, short_text(g), diag,
                              f"{g.spec.kind}[{g.spec.id}]"))
    notes = [text for text in pending.values() if text]
    where = pays_up_to(pilot, speeds)
    if where.status != "not_estimable":
        notes.append(where.text())
    withheld = f"{WITHHELD}: {verdict.withheld}" if verdict.withheld is not None else None
    return Diagnosis(cand, verdict.verdict, deciding, accept, quality_word(mine), reasons, notes,
                     withheld, where, unchecked(pilot, cand, results),
                     next_step=next_step(verdict, found))


def diagnose_all(pilot: Pilot, verdicts: Sequence[CandidateVerdict],
                 results: Sequence[GateResult], figures: Sequence[Figures],
                 data: SavedCampaign | None = None) -> list[Diagnosis]:
    return [diagnose(pilot, v, results, figures, data) for v in verdicts]
