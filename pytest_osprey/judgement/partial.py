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

from .diagnosis import WITHHELD
from .gates import PREFLIGHT, GateSpec
from .judge import Judgement


def withhold(judgement: Judgement, why: str,
             conditions: Collection[str] | None = None) -> Judgement:
    """``judgement`` with its verdicts withheld because of ``why`` (changed in place): all of
    them, or (``conditions``: those that stopped mid-campaign) those that involve them."""

    def involved(spec: GateSpec) -> bool:
        return conditions is None or spec.condition in conditions or (
            spec.reference is not None and spec.reference in conditions)

    for result in judgement.results.values():
        # Preflight gates judge the pilot and artifacts, not the measurements: they stand.
        if (result.spec.gating and result.outcome == "pass" and involved(result.spec)
                and result.spec.kind not in PREFLIGHT):
            result.outcome = "inconclusive"
            result.summary = f"campaign incomplete, not a pass: {result.summary}"
    for verdict in judgement.verdicts:
        if conditions is None or verdict.candidate in conditions or any(
                involved(g.spec) for g in verdict.gates):
            verdict.verdict = "INCONCLUSIVE"
            verdict.reasons = [f"{WITHHELD}: {why}", *verdict.reasons]
    return judgement
