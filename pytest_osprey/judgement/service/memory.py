"""The memory gate: a candidate's peak memory against the pilot's limits (absolute, and as an
increase over the baseline's)."""

from __future__ import annotations

from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ..gates.result import GateResult
from ..gates.spec import GateSpec


def judge_memory(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.reference is not None
    conds = data.meta.conditions
    mine, theirs = conds.get(spec.condition), conds.get(spec.reference)
    peak = mine.peak_memory_mb if mine is not None else None
    ref = theirs.peak_memory_mb if theirs is not None else None
    method = str(mine.fingerprint.get("memory_method", "")) if mine is not None else ""
    if peak is None:
        return GateResult(spec, "fail", "no memory figure was recorded for this condition")
    lim = pilot.limits.memory
    problems, parts = [], [f"peak {peak:.0f} MiB" + (f" ({method})" if method else "")]
    if lim.max_peak_mb is not None:
        parts.append(f"limit {lim.max_peak_mb:g} MiB")
        if peak > lim.max_peak_mb:
            problems.append("over max_peak_mb")
    if lim.max_increase_pct is not None:
        if ref is None or ref <= 0:
            problems.append(f"no baseline figure to compare with ({spec.reference})")
        else:
            increase = (peak / ref - 1) * 100
            parts.append(f"{increase:+.1f}% vs {spec.reference} ({ref:.0f} MiB; limit "
                         f"+{lim.max_increase_pct:g}%)")
            if increase > lim.max_increase_pct:
                problems.append("over max_increase_pct")
    summary = ", ".join(parts) + (f": {'; '.join(problems)}" if problems else "")
    return GateResult(spec, "fail" if problems else "pass", summary, estimate=peak,
                      threshold=lim.max_peak_mb)
