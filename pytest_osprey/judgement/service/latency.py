"""The latency gate: a latency percentile's upper bound against its limit."""

from __future__ import annotations

import math
from collections.abc import Callable

from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ...results.records import RequestRecord
from ..gates.result import GateResult
from ..gates.spec import GateSpec
from ..speed.gate import blocks_of
from .latency_bound import BoundError, latency_bound

METRICS: dict[str, Callable[[RequestRecord], float | None]] = {
    "ttft": lambda r: r.ttft_s,
    "e2e": lambda r: r.e2e_s,
    "tpot": lambda r: r.tpot_s,
}


def judge_latency(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    """A latency percentile's upper bound against its limit, clustered two-way: by prompt (a
    slow prompt is slow every time) and by time unit (boot, pass, block: the requests in
    flight together share stalls, and blocks are re-drawn every pass)."""
    assert spec.index is not None and spec.load is not None
    lim = pilot.limits.latency[spec.index]
    block = blocks_of(data, spec.load)
    planned = data.meta.plan is not None  # records carry their pass's block
    rows = [(v, r.prompt_id, (r.boot, r.repetition,
                              r.block if planned else block.get(r.prompt_id, r.prompt_id)))
            for r in data.of(spec.condition, spec.load)
            if r.ok and (v := METRICS[lim.metric](r)) is not None]
    if not rows:
        return GateResult(spec, "fail", f"no {lim.metric} measurements")
    try:
        res = latency_bound([v for v, _, _ in rows], [u for _, u, _ in rows],
                            lim.percentile / 100, lim.max_s, pilot.decision.confidence,
                            time_units=[t for _, _, t in rows])
    except BoundError as exc:
        return GateResult(spec, "fail", f"cannot bound {lim.metric}: {exc}")
    bound = "unbounded" if not math.isfinite(res.bound) else f"{res.bound * 1000:.1f} ms"
    summary = (f"{lim.metric} p{lim.percentile:g} = {res.estimate * 1000:.1f} ms, upper "
               f"{pilot.decision.confidence:.0%} bound {bound} vs limit {lim.max_s * 1000:.1f} ms "
               f"({res.n} requests; {res.n_units} independent units, the fewer of prompts and time "
               f"units; effective n "
               f"{res.effective_n:.0f})")
    if not math.isfinite(res.bound):
        summary += ("; too few independent units to bound this percentile: use more prompts "
                    "or a lower percentile")
    return GateResult(spec, res.outcome, summary, estimate=res.estimate, ci_high=res.bound,
                      ci_low=res.estimate, threshold=lim.max_s,
                      details={"units": res.n_units, "effective_n": res.effective_n,
                               "lower": res.lower, "metric": lim.metric,
                               "percentile": lim.percentile})
