"""The preflight gates: the command lines and the drafter artifacts, judged from
preflight.json before (and without) any boot."""

from __future__ import annotations

from ...results.campaign_file import ConditionRun
from ...results.preflight_file import Preflight
from .result import GateResult
from .spec import GateSpec


def judge_command_line(spec: GateSpec, preflight: Preflight) -> GateResult:
    check = preflight.command_lines.get(spec.condition)
    if check is None:
        return GateResult(spec, "skip", "command line not checked for this condition")
    return GateResult(spec, "pass" if check.ok else "fail", "\n".join(check.lines),
                      details=check.model_dump())


def judge_artifact(spec: GateSpec, preflight: Preflight) -> GateResult:
    report = preflight.artifacts.get(spec.condition)
    if report is None:
        return GateResult(spec, "skip", "artifact check not run for this condition")
    bad = [c for c in report.checks if not c.ok]
    if bad:
        return GateResult(spec, "fail", "; ".join(f"{c.name}: {c.detail}" for c in bad),
                          details=report.model_dump())
    return GateResult(spec, "pass", f"{len(report.checks)} checks passed",
                      details=report.model_dump())


def pins_rechecked(result: GateResult, run: ConditionRun | None) -> GateResult:
    """The artifact gate once the campaign ran: a pinned file that changed at a boot or
    during the campaign fails it, naming the file, whatever preflight found."""
    changed = run.pin_changes() if run is not None else []
    if not changed:
        return result
    details = {**result.details, "pins": [c.model_dump() for c in run.pins]} if run else {}
    return GateResult(result.spec, "fail", "; ".join(c.text() for c in changed),
                      details=details)
