"""What to do after a verdict: one next step, drawn from its diagnosis (the pattern that
decided it), so a reader is not left to work out what a DROP or an INCONCLUSIVE asks of them.

The first pattern that applies wins, in the order a person would fix things: a campaign that
did not finish, a quality defect (speed does not matter while outputs change), a drafter never
accepted, the batch-size crossover, a domain gap, an unsteady machine, more evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..gates.kinds import GateKind as K
from ..gates.result import GateResult
from .verdicts import CandidateVerdict

QUALITY = {K.GREEDY_IDENTITY: "greedy outputs differ", K.CORRECTNESS: "answers lost",
           K.DISTRIBUTION: "sampled outputs not as served",
           K.SAMPLING_PARAMS: "a sampling parameter not honoured"}


@dataclass(frozen=True)
class Found:
    """The diagnosis's patterns, as :func:`next_step` needs them."""

    crossover_at: str | None = None  # the load where the speedup turned below 1
    gap_slice: str | None = None  # the slice the drafter is clearly slower on
    never_accepted: bool = False
    patched_draft: bool = False  # a draft stock SGLang runs wrong (artifact check)


def _settle(gates: Sequence[GateResult]) -> str | None:
    for g in gates:
        advice = g.details.get("advice")
        if g.spec.kind == K.SPEEDUP and g.outcome == "inconclusive" \
                and isinstance(advice, Mapping) and advice.get("settle"):
            return str(advice["settle"])
    return None


def next_step(verdict: CandidateVerdict, found: Found) -> str:
    """One sentence: what to do next about ``verdict`` given what was ``found``."""
    gates = verdict.gates
    if verdict.not_run is not None:
        return "fix what kept it from running (its log in the results folder) and rerun"
    if verdict.withheld is not None:
        return "rerun the campaign to the end: a partial campaign decides nothing"
    broken = next((g for g in gates if g.spec.kind in QUALITY and g.outcome == "fail"), None)
    if broken is not None:
        return (f"fix the engine's verification first ({QUALITY[broken.spec.kind]}): a "
                "drafter that changes outputs is not judged on speed")
    if found.never_accepted:
        return ("serve the drafter on an SGLang with its patch and rerun" if found.patched_draft
                else "pair the drafter with this target (same tokenizer, adapted to it) "
                "and rerun")
    if found.crossover_at is not None:
        return (f"serve speculation only below {found.crossover_at}: a lower "
                "decision.primary_load, fewer draft tokens (speculation.num_draft_tokens), or "
                "adaptive speculation that turns drafting off as the batch grows")
    if found.gap_slice is not None:
        return (f"adapt the drafter on more {found.gap_slice}-slice text, or route those "
                "requests around it")
    settle = _settle(gates)
    if any(g.details.get("held_back") == "unstable_environment" for g in gates):
        return "rerun on a quiet machine" + (f" ({settle})" if settle else "")
    if verdict.verdict == "INCONCLUSIVE":
        return f"collect more evidence: {settle}" if settle else (
            "collect more evidence: more prompts or passes (see the inconclusive gates)")
    if verdict.verdict == "KEEP":
        return ("ship it with speculation off one flag away (the kill switch), and rerun this "
                "pilot on the next drafter, target or engine change")
    return "keep speculation off for this drafter; rerun the pilot when the drafter changes"
