"""How a campaign ended, in fields and in plain words: the passes planned and run, whether
early stopping ended it and which way each candidate's speed was decided, and what a short
campaign could not measure. Read from campaign.json and the records alone, so that the
terminal, report.md, report.html and summary.json say the same thing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .folder import SavedCampaign
from .records import RequestRecord

# What the sequential look's decision means, said without the statistics' jargon.
_DECIDED = {
    "keep": "speed cleared the early-KEEP boundary",
    "drop": "speed crossed the early-DROP boundary",
    "inconclusive": "speed could not reach the needed speedup in the passes left "
                    "(stopped inconclusive)",
}


@dataclass(frozen=True)
class CampaignEnd:
    """How the campaign ended (summary.json's ``campaign``)."""

    status: str
    """complete | interrupted | running (as campaign.json says)."""
    passes_planned: int
    """Timed passes the plan holds (per boot, times the boots)."""
    passes_run: int
    """Timed passes that sent at least one measured request."""
    stopped_early: bool
    """Early stopping ended the campaign before its last pass."""
    stopped_after_pass: int | None
    """The pass after which it stopped; null when it ran to the end."""
    decisions: dict[str, str] = field(default_factory=dict)
    """Candidate -> the decision at the stopping look (keep, drop, inconclusive); empty when
    the campaign was not stopped early."""
    not_measured: list[str] = field(default_factory=list)
    """What the passes run could not measure (one pass: no drift, no near-tie control)."""
    units: dict[str, int] = field(default_factory=dict)
    """Closed-loop level -> the speed test's units at that level (blocks x passes run)."""
    text: str = ""
    """The ending in plain words."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def campaign_end(data: SavedCampaign) -> CampaignEnd:
    """How ``data``'s campaign ended (see :class:`CampaignEnd`)."""
    meta = data.meta
    plan = meta.plan
    planned = plan.passes * plan.boots_per_condition if plan is not None else max(meta.blocks, 1)
    mode = data.timed_mode
    runs = {(r.boot, r.repetition) for r in data.records
            if r.mode == mode and not r.filler and r.load in meta.load_levels}
    passes_run = len(runs)
    stopped = meta.stopped_after_block is not None and passes_run < planned
    decisions: dict[str, str] = {}
    if stopped:
        for cand, looks in meta.sequential.items():
            if looks:
                decisions[cand] = str(looks[-1].get("decision"))
    greedy = greedy_runs(data.records)
    missing = not_measured(passes_run, planned, greedy)
    units: dict[str, int] = {}
    if plan is not None:
        for level, blocks in plan.blocks.items():
            if isinstance(meta.load_levels.get(level), int):  # load.level_passes: fewer
                ran = {(r.boot, r.repetition) for r in data.records
                       if r.mode == mode and not r.filler and r.load == level}
                units[level] = len(blocks) * max(len(ran), 1)
    return CampaignEnd(meta.status, planned, passes_run, stopped,
                       meta.stopped_after_block if stopped else None, decisions, missing,
                       units, _text(meta.status, planned, passes_run, stopped, decisions,
                                    missing, units, greedy))


def greedy_runs(records: Iterable[RequestRecord]) -> int:
    """Greedy passes run, boots included: the timed ones where the campaign times greedy,
    else the one untimed greedy pass per boot beside the sampled timed passes."""
    return len({(r.boot, r.repetition) for r in records if r.mode == "greedy" and not r.filler})


def not_measured(passes_run: int, planned: int, greedy: int | None = None) -> list[str]:
    """What ``passes_run`` of ``planned`` timed passes and ``greedy`` greedy passes (default:
    the timed ones) could not measure: one pass of several has no pass to compare with, and
    one greedy pass gives greedy identity no near-tie control (the reference's rerun)."""
    missing = ["drift between passes"] if passes_run == 1 and planned > 1 else []
    if (passes_run if greedy is None else greedy) == 1:
        missing.append("near-tie control (a second greedy pass of the baseline)")
    return missing


def stop_text(after: int, planned: int, decisions: Mapping[str, str],
              greedy: int | None = None) -> str:
    """An early stop in plain words: ``stopped after pass 1 of 4: speed cleared the
    early-KEEP boundary``, each candidate named when they were decided differently, then
    what the passes run could not measure."""
    ways = sorted(set(decisions.values()))
    if len(ways) == 1:
        why = _DECIDED.get(ways[0], ways[0])
    else:
        why = "; ".join(f"{c}: {_DECIDED.get(d, d)}" for c, d in decisions.items())
    text = f"stopped after pass {after} of {planned}: {why}"
    missing = not_measured(after, planned, greedy)
    return text + ("; not measured: " + ", ".join(missing) if missing else "")


def _of(done: int, planned: int) -> str:
    return f"{done} of {planned} pass" + ("" if planned == 1 else "es")


def _text(status: str, planned: int, passes_run: int, stopped: bool,
          decisions: Mapping[str, str], not_measured: list[str],
          units: Mapping[str, int], greedy: int) -> str:
    if status == "interrupted":
        head = f"interrupted after {_of(passes_run, planned)}"
    elif status == "running":
        head = f"still running: {_of(passes_run, planned)} so far"
    elif stopped:
        head = stop_text(passes_run, planned, decisions, greedy)
    else:
        head = f"ran {_of(passes_run, planned)}"
    if not_measured and not stopped:
        head += "; not measured: " + ", ".join(not_measured)
    if (stopped or status != "complete") and units:
        head += ("; time units per level (stretches both conditions ran, which the speed "
                 "test pairs within): " + ", ".join(f"{k} {v}" for k, v in units.items()))
    return head
