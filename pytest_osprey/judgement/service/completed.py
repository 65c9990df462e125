"""The completed gate: did enough of a condition's requests complete at a load level."""

from __future__ import annotations

from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ..gates.result import GateResult
from ..gates.spec import GateSpec


def judge_completed(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
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
