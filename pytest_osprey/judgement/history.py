"""``--osprey-compare DIR``: this campaign against an earlier accepted one, for the drafters
kept there.

Only campaigns of the same prompt trace compare (same trace hash), so every prompt pairs with
itself across the two runs. For each drafter the earlier campaign kept, a regression is:

* its verdict is no longer KEEP;
* a speedup over the baseline whose confidence interval now lies below the earlier
  estimate less the tolerance (speed relative to the baseline: robust to a slower machine);
* its own completion latency, paired by prompt across the runs, confidently slower than
  before by more than the tolerance (the baseline's change is shown beside it, to tell a
  drafter regression from a changed machine or engine);
* its pooled accept length down by more than the tolerance;
* its per-position acceptance collapsed (:mod:`.quality.acceptance`), named with the positions.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..pilot.schema import Pilot
from ..results.folder import SavedCampaign, iter_pairs, load_campaign
from ..results.records import RequestRecord
from .figures.measured import figures_for
from .gates.kinds import GateKind
from .quality.acceptance import collapses, describe, pooled
from .speed.across_runs import SpeedupResult, paired_speedup
from .stats.core import StatsError
from .verdict.judge import Judgement


class HistoryError(ValueError):
    """The earlier campaign cannot be compared with this one (the message says why)."""


@dataclass(frozen=True)
class Previous:
    directory: Path
    summary: dict[str, Any]
    data: SavedCampaign

    @property
    def kept(self) -> list[str]:
        return [v["candidate"] for v in self.summary.get("verdicts", [])
                if v.get("verdict") == "KEEP"]


def open_previous(directory: Path, trace_hash: str) -> Previous:
    """The earlier campaign, refused (HistoryError) unless it is complete, judged and ran the
    same prompt trace."""
    if not directory.is_dir():
        raise HistoryError(f"{directory}: no such folder")
    summary_path = directory / "summary.json"
    if not (directory / "campaign.json").is_file() or not summary_path.is_file():
        raise HistoryError(f"{directory}: not a judged results folder (needs campaign.json and "
                           "summary.json)")
    try:
        summary = json.loads(summary_path.read_text("utf-8"))
        data = load_campaign(directory)
    except (ValueError, OSError) as exc:
        raise HistoryError(f"{directory}: cannot read it: {exc}") from None
    if not isinstance(summary, dict):
        raise HistoryError(f"{summary_path}: not a summary object")
    status = data.meta.status
    if status != "complete":
        raise HistoryError(f"{directory}: that campaign did not complete (status {status}); "
                           "compare with a finished one")
    theirs = data.meta.trace_hash or summary.get("trace_hash")
    if theirs != trace_hash:
        raise HistoryError(
            f"{directory}: its prompt trace differs from this pilot's (trace hash "
            f"{str(theirs)[:12]} there, {trace_hash[:12]} here): results of different prompts "
            "do not compare; use the same trace files, ids and limits"
        )
    return Previous(directory, summary, data)


class _Sheet(BaseModel):
    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)


class Finding(_Sheet):
    """One check of a kept drafter against the earlier campaign (`comparison.findings[]`)."""

    candidate: str
    """The drafter kept in the earlier campaign."""
    check: Literal["verdict", "speedup", "latency", "accept_length", "acceptance"]
    """verdict: still KEEP; speedup: the speedup gate vs the baseline (x); latency: its own
    completion latency paired by prompt across the runs, as "times as fast as before" (x, >1
    faster now); accept_length: pooled accept length (tokens per verify step); acceptance:
    per-position acceptance rates (`previous`/`current`: the rates joined by "/"), a
    regression when a position collapsed (limits.quality.max_acceptance_drop)."""
    load: str | None
    """Load level; null for the verdict."""
    previous: float | str | None
    """The earlier figure (verdict name, speedup x, accept length); null for latency."""
    current: float | str | None
    """This campaign's figure, same unit."""
    regression: bool
    """Worse than before beyond `comparison.tolerance` (for speedup and latency: the whole
    confidence interval is)."""
    text: str
    """The finding in words."""
    ci: list[float | None] | None = None
    """Confidence interval of `current` where it has one (speedup, latency)."""


class Comparison(_Sheet):
    """`--osprey-compare DIR`: this campaign against an earlier accepted one of the same
    trace (`comparison`)."""

    previous_dir: str
    """The earlier campaign's results folder."""
    previous_run_id: str | None
    """Its run id."""
    trace_hash: str
    """The trace hash both share."""
    tolerance: float
    """decision.regression_tolerance (fraction)."""
    kept: list[str]
    """Drafters the earlier campaign kept: the ones held to it."""
    findings: list[Finding] = Field(default_factory=list)
    """Every check made."""
    notes: list[str] = Field(default_factory=list)
    """What could not be compared, and why."""

    def regressions(self, candidate: str | None = None) -> list[Finding]:
        return [f for f in self.findings if f.regression
                and (candidate is None or f.candidate == candidate)]


def compare(
    pilot: Pilot, data: SavedCampaign, judgement: Judgement, previous: Previous,
    tolerance: float,
) -> Comparison:
    """Every kept drafter's regressions (and the figures checked) against ``previous``."""
    out = Comparison(previous_dir=str(previous.directory),
                     previous_run_id=previous.data.meta.run_id,
                     trace_hash=str(data.meta.trace_hash), tolerance=tolerance,
                     kept=previous.kept)
    if not previous.kept:
        out.notes.append("no drafter was kept in the earlier campaign: nothing to hold to it")
    now = {v.candidate: v.verdict for v in judgement.verdicts}
    for cand in previous.kept:
        if cand not in data.meta.conditions:
            out.notes.append(f"{cand} was kept before but is not in this campaign")
            continue
        verdict = now.get(cand, "not judged")
        out.findings.append(Finding(
            candidate=cand, check="verdict", load=None, previous="KEEP", current=verdict,
            regression=verdict != "KEEP", text=f"verdict KEEP before, {verdict} now"))
        out.findings += _speedups(pilot, judgement, previous, cand, tolerance)
        for level in pilot.load.levels:
            out.findings += _latency(pilot, data, previous, cand, level, tolerance)
            out.findings += _accept_length(data, previous, cand, level, tolerance)
            out.findings += acceptance_findings(pilot, data, previous, cand, level)
    return out


def _speedups(pilot: Pilot, judgement: Judgement, previous: Previous, cand: str,
              tolerance: float) -> list[Finding]:
    before = {g["id"]: g for g in previous.summary.get("gates", [])
              if g.get("kind") == GateKind.SPEEDUP and g.get("condition") == cand}
    out = []
    for g in judgement.results.values():
        spec = g.spec
        if spec.kind != GateKind.SPEEDUP or spec.condition != cand \
                or spec.reference != pilot.baseline:
            continue
        old = before.get(spec.id)
        if old is None or old.get("estimate") is None or g.estimate is None:
            continue
        floor = old["estimate"] * (1 - tolerance)
        worse = g.ci_high is not None and g.ci_high < floor
        out.append(Finding(
            candidate=cand, check="speedup", load=spec.load, previous=old["estimate"],
            current=g.estimate, regression=worse,
            text=f"speedup[{spec.id}] {old['estimate']:.3f}x before, {g.estimate:.3f}x now "
            f"(CI [{_f(g.ci_low)}, {_f(g.ci_high)}])"
            + (f": below {floor:.3f}x (earlier estimate less {tolerance:.0%})" if worse else ""),
            ci=[g.ci_low, g.ci_high] if g.ci_low is not None and g.ci_high is not None else None,
        ))
    return out


def _latency(pilot: Pilot, data: SavedCampaign, previous: Previous, cand: str, level: str,
             tolerance: float) -> list[Finding]:
    """The drafter's completion latency now vs before, paired by prompt across the runs."""
    res = _across_runs(pilot, data, previous.data, cand, level, 1 - tolerance)
    if res is None:
        return []
    base = _across_runs(pilot, data, previous.data, pilot.baseline, level, 1 - tolerance)
    worse = res.outcome == "fail"  # confidently below (1 - tolerance) times as fast as before
    text = (f"{cand} at {level}: {res.estimate:.3f}x as fast as before (CI [{res.ci_low:.3f}, "
            f"{res.ci_high:.3f}], {res.n_prompts} prompts)")
    if base is not None:
        text += f"; the baseline {base.estimate:.3f}x as fast as before"
        if worse and base.outcome == "fail":
            text += " (both slower: the machine or engine may have changed)"
    return [Finding(candidate=cand, check="latency", load=level, previous=None,
                    current=res.estimate, regression=worse, text=text,
                    ci=[res.ci_low, res.ci_high])]


def _across_runs(pilot: Pilot, now: SavedCampaign, before: SavedCampaign, condition: str,
                 level: str, threshold: float) -> SpeedupResult | None:
    merged = SavedCampaign(now.directory, now.meta, [
        *[_renamed(r, "before") for r in before.of(condition, level)],
        *[_renamed(r, "now") for r in now.of(condition, level)],
    ])
    pairs = list(iter_pairs(merged, "before", "now", level, lambda r: r.e2e_s))
    if len(pairs) < 2:
        return None
    try:
        return paired_speedup({p: b for p, b, _ in pairs}, {p: n for p, _, n in pairs},
                              threshold=threshold, confidence=pilot.decision.confidence,
                              n_resamples=pilot.decision.bootstrap_resamples,
                              seed=pilot.sampling.seed)
    except StatsError:
        return None


def _renamed(record: RequestRecord, condition: str) -> RequestRecord:
    return RequestRecord.from_dict({**asdict(record), "condition": condition})


def _accept_length(data: SavedCampaign, previous: Previous, cand: str, level: str,
                   tolerance: float) -> list[Finding]:
    old = figures_for(previous.data, cand, level, 0).accept_length_pooled
    new = figures_for(data, cand, level, 0).accept_length_pooled
    if old is None or new is None:
        return []
    worse = new < old * (1 - tolerance)
    return [Finding(candidate=cand, check="accept_length", load=level, previous=old,
                    current=new, regression=worse,
                    text=f"{cand} at {level}: accept length {old:.2f} before, {new:.2f} now"
                    + (f" (down more than {tolerance:.0%})" if worse else ""))]


def acceptance_findings(pilot: Pilot, data: SavedCampaign, previous: Previous, cand: str,
                level: str) -> list[Finding]:
    old, new = pooled(previous.data.of(cand, level)), pooled(data.of(cand, level))
    if old is None or new is None:
        return []
    found = collapses(new, old, pilot.limits.quality.max_acceptance_drop,
                      (1 - pilot.decision.confidence) / 2)
    return [Finding(candidate=cand, check="acceptance", load=level, previous=old.text(),
                    current=new.text(), regression=bool(found),
                    text=f"{cand} at {level}: acceptance per draft position {old.text()} before, "
                    f"{new.text()} now" + (f"; collapsed at {describe(found)}" if found else ""))]


def _f(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.3f}"
