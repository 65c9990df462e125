"""A partial campaign decides nothing.

An interrupted or killed campaign holds fewer requests than planned, often of one condition
more than another: its gates can be computed (and are shown: they say what was measured),
but a pass on part of the data is no pass. So every gating pass becomes inconclusive and
every verdict INCONCLUSIVE, the reason stated first. Preflight gates (command lines,
artifacts) judge no measurement and stand as they are.
"""

from __future__ import annotations

from .gates import PREFLIGHT
from .judge import Judgement


def withhold(judgement: Judgement, why: str) -> Judgement:
    """``judgement`` with its verdicts withheld because of ``why`` (changed in place)."""
    for result in judgement.results.values():
        # Preflight gates judge the pilot and artifacts, not the measurements: they stand.
        if result.spec.gating and result.outcome == "pass" and result.spec.kind not in PREFLIGHT:
            result.outcome = "inconclusive"
            result.summary = f"campaign incomplete, not a pass: {result.summary}"
    for verdict in judgement.verdicts:
        verdict.verdict = "INCONCLUSIVE"
        verdict.reasons = [f"INTERRUPTED, no verdict: {why}", *verdict.reasons]
    return judgement
