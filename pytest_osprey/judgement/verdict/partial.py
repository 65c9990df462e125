"""A partial campaign decides nothing.

An interrupted or killed campaign holds fewer requests than planned, often of one condition
more than another: its gates can be computed (and are shown: they say what was measured),
but a pass on part of the data is no pass. So every gating pass becomes inconclusive and
every verdict INCONCLUSIVE, the reason stated first. A condition that stopped mid-campaign
(its server crashed) leaves the others whole: only the gates and verdicts that involve it
are withheld. Preflight gates (command lines, artifacts) judge no measurement and stand as
they are.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from ..gates.evaluate import PREFLIGHT
from ..gates.kinds import GateKind
from ..gates.result import GateResult
from ..gates.spec import GateSpec
from .verdicts import CandidateVerdict

WITHHELD = "INTERRUPTED, no verdict"  # how a withheld verdict's first reason starts


@dataclass(frozen=True)
class Withheld:
    """Why a campaign's verdicts are withheld: ``why`` said first in each, for all of them or
    (``conditions``: those that stopped mid-campaign) those that involve them."""

    why: str
    conditions: Collection[str] | None = None


GateKey = tuple[GateKind, str]


def withhold(results: dict[GateKey, GateResult], verdicts: list[CandidateVerdict],
             withheld: Withheld) -> tuple[dict[GateKey, GateResult], list[CandidateVerdict]]:
    """``results`` and ``verdicts`` with the verdicts withheld (new ones; those given are
    unchanged)."""
    why, conditions = withheld.why, withheld.conditions

    def involved(spec: GateSpec) -> bool:
        return conditions is None or spec.condition in conditions or (
            spec.reference is not None and spec.reference in conditions)

    def held(result: GateResult) -> GateResult:
        # Preflight gates judge the pilot and artifacts, not the measurements: they stand.
        if (result.spec.gating and result.outcome == "pass" and involved(result.spec)
                and result.spec.kind not in PREFLIGHT):
            return replace(result, outcome="inconclusive",
                           summary=f"campaign incomplete, not a pass: {result.summary}")
        return result

    new = {id(r): held(r) for r in results.values()}
    out = []
    for verdict in verdicts:
        gates = [new[id(g)] if id(g) in new else held(g) for g in verdict.gates]
        if conditions is None or verdict.candidate in conditions or any(
                involved(g.spec) for g in verdict.gates):
            verdict = replace(verdict, verdict="INCONCLUSIVE", withheld=why,
                              reasons=[f"{WITHHELD}: {why}", *verdict.reasons])
        out.append(replace(verdict, gates=gates))
    return {key: new[id(r)] for key, r in results.items()}, out
