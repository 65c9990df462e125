"""The speed gate: a saved campaign's records arranged as the replay plan ran them (boots x
passes x prompts, each prompt's block), judged by the time-aware statistics.

One deciding test per gate, and the p-value shown is its own: the cluster-robust t-test of
the gating metric (``decision.speedup_metric``), or, for a primary gate with early
stopping, the group-sequential decision at the last look the campaign made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ...results.records import RequestRecord
from ..gates.result import GateResult, Outcome
from ..gates.spec import GateSpec
from .advice import advise
from .crossover import shared_share
from .drift import Drift, drift_check, within_machines
from .sequential import Look, sequential_look, sequential_plan
from .served import lengths, sampling_text, served_sampling
from .speedup import (
    CONFOUNDED,
    FloatArray,
    IntArray,
    PairedLatencies,
    Request,
    SpeedError,
    SpeedResult,
    collect,
    speed_test,
)


def blocks_of(data: SavedCampaign, level: str) -> dict[str, int]:
    """Prompt id -> its block at ``level`` in the first pass (the plan's; one block per prompt
    for campaigns recorded before plans). Later passes re-partition: a record's ``block`` is
    its block in its own pass."""
    plan = data.meta.plan
    if plan is not None and plan.blocks.get(level):
        return plan.block_of(level)
    ids = sorted({r.prompt_id for r in data.at(level, any_mode=True)})
    return {pid: i for i, pid in enumerate(ids)}


def _requests(data: SavedCampaign, level: str, conditions: tuple[str, ...],
              slice_: str | None = None, upto_look: int | None = None) -> list[Request]:
    block = blocks_of(data, level)
    planned = data.meta.plan is not None  # records carry their pass's block
    mode = data.timed_mode
    # Timed at a sampled serving setting: latencies like with like (served.py).
    at = lengths(data.records, level, mode).latency if mode == "serving" else None
    out = []
    for r in data.at(level, mode):
        if r.condition not in conditions:
            continue
        if (slice_ is not None and r.slice != slice_) or r.prompt_id not in block:
            continue
        if upto_look is not None and _look_of(data, r) > upto_look:
            continue
        latency = r.e2e_s if at is None else at(r)
        out.append(Request(r.condition, r.prompt_id, latency, r.ok and latency is not None,
                           r.boot, r.repetition, r.block if planned else block[r.prompt_id],
                           r.stretch or 0, r.started_at or 0.0))
    return out


def _look_of(data: SavedCampaign, r: RequestRecord) -> int:
    """The early-stopping look whose data first include this record (campaign/schedule.py)."""
    plan = data.meta.plan
    if plan is None:
        return r.repetition + 1
    if plan.boots_per_condition == 1:
        return r.repetition + 1 if plan.order == "interleaved" else 1
    return max(1, r.boot)


def paired(data: SavedCampaign, reference: str, candidate: str, level: str,
           slice_: str | None = None, upto_look: int | None = None) -> PairedLatencies:
    return collect(_requests(data, level, (reference, candidate), slice_, upto_look),
                   reference, candidate)


def drift(pilot: Pilot, data: SavedCampaign, reference: str, candidate: str, level: str,
          upto_look: int | None = None) -> Drift | None:
    """Each of the two conditions against itself between passes and boots, at every load level
    (a pass covers them all: more data to see it by); the bias bound pairs the two conditions
    at each level. ``level`` alone when the levels' pass layouts differ."""
    levels = [lv for lv in pilot.load.levels if lv != level]
    machines = machines_of(data)
    for attempt in ([level, *levels], [level]):
        series: list[tuple[FloatArray, IntArray]] = []
        names: list[str] = []
        pairs: list[tuple[int, int]] = []
        for lv in attempt:
            got = []
            for cond in (reference, candidate):
                try:
                    one = collect(_requests(data, lv, (cond,), None, upto_look), cond, cond)
                except SpeedError:
                    continue
                got.append(len(series))
                series.append((one.reference, one.time_units))
                names.append(cond if len(attempt) == 1 else f"{cond} at {lv}")
            if len(got) == 2:
                pairs.append((got[0], got[1]))
            if machines is not None and got:
                fair = within_machines([series[i][0] for i in got],
                                       machines[: series[got[0]][0].shape[1]])
                for i, lat in zip(got, fair, strict=True):
                    series[i] = (lat, series[i][1])
        if series and len({s[0].shape[:2] for s in series}) == 1:
            try:
                return drift_check(series, tolerance=pilot.decision.drift_tolerance,
                                   names=names, pairs=pairs)
            except (SpeedError, ValueError):
                return None
    return None


def machines_of(data: SavedCampaign) -> IntArray | None:
    """A merged campaign's machine (shard, 0-based) per pass of its plan (pass p ran on
    shard p mod N: shards/plan.py); None for a one-machine campaign."""
    plan, shards = data.meta.plan, len(data.meta.merged)
    if plan is None or shards < 2:
        return None
    return np.arange(plan.passes, dtype=np.int64) % shards


def machine_speedups(pilot: Pilot, data: SavedCampaign,
                     candidates: list[str]) -> list[dict[str, float | None]]:
    """A merged campaign's speedup of each candidate against the baseline at the primary
    load on each machine (shard, in order) alone: the geometric mean over prompts of
    baseline / candidate latency, each prompt's pairs on that machine pooled by their mean
    log ratio. Descriptive (how far the machines disagree), not a gate; None where a machine
    has no pair. ``[]`` for a one-machine campaign."""
    machines = machines_of(data)
    if machines is None:
        return []
    out: list[dict[str, float | None]] = [{} for _ in data.meta.merged]
    for cand in candidates:
        try:
            pair = paired(data, pilot.baseline, cand, pilot.primary_load)
        except SpeedError:
            pair = None
        for m, row in enumerate(out):
            row[cand] = _speedup_on(pair, machines, m)
    return out


def _speedup_on(pair: PairedLatencies | None, machines: IntArray, m: int) -> float | None:
    if pair is None:
        return None
    on = machines[: pair.reference.shape[1]] == m
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.log(pair.reference[:, on, :]) - np.log(pair.candidate[:, on, :])
    ratio = ratio.reshape(-1, ratio.shape[-1])  # (cells, prompts)
    seen = np.isfinite(ratio)
    counts = seen.sum(axis=0)
    if not (counts > 0).any():
        return None
    per_prompt = np.where(seen, ratio, 0.0).sum(axis=0)[counts > 0] / counts[counts > 0]
    return float(np.exp(per_prompt.mean()))


def threshold_for(pilot: Pilot, reference: str) -> float:
    return pilot.limits.speedup_min if reference == pilot.baseline else 1.0


def looks_done(data: SavedCampaign, level: str) -> int:
    mode = data.timed_mode
    return max((_look_of(data, r) for r in data.records
                if r.mode == mode and r.load == level), default=0)


def plan_looks(pilot: Pilot, data: SavedCampaign) -> int:
    plan = data.meta.plan
    return plan.looks if plan is not None else pilot.load.passes


def look_at(pilot: Pilot, data: SavedCampaign, candidate: str, look: int,
            reference: str | None = None) -> Look | str:
    """The group-sequential decision (primary load, against ``reference``: by default the
    baseline) on the data of looks 1..``look``. Recomputed from the records, so the
    campaign's interim looks and a re-judged campaign apply the same rule. A string says why
    no look is possible."""
    level = pilot.primary_load
    ref = pilot.baseline if reference is None else reference
    seq = sequential_plan(plan_looks(pilot, data), (1 - pilot.decision.confidence) / 2,
                          futility_power=pilot.decision.futility_power)
    try:
        paired_data = paired(data, ref, candidate, level, upto_look=look)
        return sequential_look(
            paired_data, seq, min(look, seq.looks), threshold_for(pilot, ref),
            pilot.decision.speedup_metric, pilot.decision.confidence,
            drift(pilot, data, ref, candidate, level, upto_look=look))
    except SpeedError as exc:
        return str(exc)


def combined_decision(decisions: Sequence[str]) -> str:
    """A candidate's decision from its primary gates' looks (against the baseline and the
    current drafter): a KEEP needs every gate kept, so one drop decides drop, one futility
    stop decides inconclusive, and otherwise any gate still open continues."""
    for way in ("drop", "inconclusive", "continue"):
        if way in decisions:
            return way
    return "keep"


def _look_facts(look: Look, extra: dict[str, Any]) -> dict[str, Any]:
    return {"look": look.look, "z": look.z, "keep_boundary": look.keep_boundary,
            "drop_boundary": look.drop_boundary, "decision": look.decision,
            "estimate": look.gating.estimate, **extra}


def candidate_looks(pilot: Pilot, data: SavedCampaign, conditions: Sequence[str], look: int,
                    extra: dict[str, Any] | None = None) -> tuple[bool, dict[str, dict[str, Any]]]:
    """The interim look of every candidate in ``conditions``: whether all are decided, and
    per candidate the look's facts (those of the gate against the baseline, ``extra`` added;
    ``decision`` combined over its primary gates; ``against``: the look against each other
    reference). A campaign stops only when every candidate is decided: a KEEP against the
    baseline with the gate against the current drafter still open does not stop it."""
    decided, looks = True, {}
    for cand in pilot.candidates:
        if cand not in conditions:
            continue
        refs = [r for r in pilot.references(cand) if r in conditions]
        got = [look_at(pilot, data, cand, look, ref) for ref in refs]
        seen = [g for g in got if not isinstance(g, str)]
        if not refs or refs[0] != pilot.baseline or len(seen) < len(refs):
            decided = False
            continue
        entry = _look_facts(seen[0], extra or {})
        entry["decision"] = combined_decision([g.decision for g in seen])
        if len(seen) > 1:
            entry["against"] = {ref: _look_facts(g, {})
                                for ref, g in zip(refs[1:], seen[1:], strict=True)}
        looks[cand] = entry
        decided = decided and entry["decision"] != "continue"
    return decided, looks


def p_text(p: float) -> str:
    """A p-value as read: ``p=0.0123``, and ``p>0.999`` rather than a bare ``p=1`` (a
    one-sided p near 1 says the effect went the other way, not that it is certain)."""
    return "p>0.999" if p > 0.999 else f"p={p:.3g}"


def _ratio(v: float) -> str:
    return f"{v:.3f}" if math.isfinite(v) else ("inf" if v > 0 else "0")


def _details(res: SpeedResult, names: tuple[str, str] = ("reference", "candidate")
             ) -> dict[str, Any]:
    def metric(m: Any) -> dict[str, Any]:
        return {"estimate": m.estimate, "ci": [m.ci_low, m.ci_high], "p_value": m.p_value,
                "df": m.df, "outcome": m.outcome}

    comp = res.components
    out: dict[str, Any] = {
        "method": f"two-way cluster-robust t-test over {res.n_prompts} prompts x "
                  f"{res.n_time_units} time units (df {res.gating.df:.1f})"
                  + (f", time units as a series (serial term, {res.serial_clusters:.1f} "
                     f"effective time clusters)" if res.serial_clusters > 0 else "")
                  + (f", between-boot component over {res.n_boots} boots"
                     if res.n_boots > 1 else ""),
        "serial_clusters": res.serial_clusters,
        "metric": res.metric,
        "n_prompts": res.n_prompts,
        "n_clusters": res.n_clusters,
        "n_time_units": res.n_time_units,
        "n_boots": res.n_boots,
        "n_passes": res.n_passes,
        "per_prompt": metric(res.per_prompt),
        "total_time": metric(res.total_time),
        "time_share": comp.time_share,
        "boot_share": comp.boot_share,
        # What the other load levels share of this variance (same prompts, same boots).
        "shared_share": float(shared_share(comp.between, comp.clusters, comp.boot_var,
                                           res.gating.se_log ** 2)),
        "boot_confounded": res.boot_confounded,
    }
    if res.drift is not None:
        d = res.drift
        out["drift"] = {"estimate": d.estimate, "ci": [d.ci_low, d.ci_high],
                        "p_value": d.p_value, "boot": d.instance[0] + 1,
                        "pass": d.instance[1] + 1, "unstable": d.unstable,
                        "tolerance": d.tolerance, "bias_bound": d.bias_bound,
                        "changed": [{"boot": b + 1, "pass": p + 1} for b, p in d.changed]}
    if res.drift_adjusted is not None:
        out["drift_adjusted"] = metric(res.drift_adjusted)
    if res.stall is not None:
        st = res.stall
        out["stall"] = {"condition": names[0] if st.side == "reference" else names[1],
                        "first_unit": st.first_unit, "last_unit": st.last_unit,
                        "from": {"boot": st.passes[0][0], "pass": st.passes[0][1]},
                        "to": {"boot": st.passes[1][0], "pass": st.passes[1][1]},
                        "size": st.size, "score": st.score, "p_value": st.p_value,
                        "reach": st.reach, "outlasts_reach": st.outlasts_reach}
    if res.reason:
        out["reason"] = res.reason
    if res.held_back:
        out["held_back"] = res.held_back
    return out


def _has_slice(data: SavedCampaign, slice_: str) -> bool:
    """Whether the trace holds a prompt of ``slice_`` (the records', where it cannot be
    read): a slice gate on a trace without one is not run, not failed."""
    if data.prompts is not None:
        return any(p.slice == slice_ for p in data.prompts.values())
    return any(r.slice == slice_ for r in data.records)


def judge_speedup(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.reference is not None and spec.load is not None
    threshold = threshold_for(pilot, spec.reference)
    if spec.slice is not None and not _has_slice(data, spec.slice):
        why = f"the trace has no {spec.slice}-slice prompts"
        return GateResult(spec, "skip", f"not run: {why}", details={"not_run": why})
    try:
        data_pairs = paired(data, spec.reference, spec.condition, spec.load, spec.slice)
        res = speed_test(data_pairs, threshold, pilot.decision.confidence,
                         pilot.decision.speedup_metric,
                         drift(pilot, data, spec.reference, spec.condition, spec.load))
    except SpeedError as exc:
        return GateResult(spec, "fail" if spec.gating else "skip", f"cannot judge speed: {exc}")
    gate = res.gating
    outcome: Outcome = res.outcome
    p_value, details = gate.p_value, _details(res, (spec.reference, spec.condition))
    sequential = ""
    if pilot.decision.early_stop and spec.slice is None and spec.load == pilot.primary_load \
            and spec.reference in pilot.references(spec.condition):
        look = look_at(pilot, data, spec.condition, looks_done(data, spec.load), spec.reference)
        if isinstance(look, str):
            sequential = f"; group-sequential look not possible: {look}"
        else:
            outcome = ("pass" if look.decision == "keep"
                       else "fail" if look.decision == "drop" else "inconclusive")
            details["sequential"] = {"look": look.look, "looks": look.looks, "z": look.z,
                                     "keep_boundary": look.keep_boundary,
                                     "drop_boundary": look.drop_boundary,
                                     "decision": look.decision}
            sequential = "; " + look.summary()
    other = res.total_time if res.metric == "per_prompt" else res.per_prompt
    name = {"per_prompt": "per-prompt", "total_time": "total-time"}
    summary = (
        f"completion-latency speedup ({name[res.metric]}) {_ratio(gate.estimate)}x, "
        f"{pilot.decision.confidence:.0%} CI [{_ratio(gate.ci_low)}, {_ratio(gate.ci_high)}] vs "
        f"minimum {threshold:.3f}x; {name[other.metric]} {_ratio(other.estimate)}x; "
        f"{res.n_prompts} prompts x {res.n_passes} passes in {res.n_time_units} time units"
        + (f" x {res.n_boots} boots" if res.n_boots > 1 else "")
        + f"; one-sided {p_text(p_value)} (two-way cluster-robust t, df {gate.df:.1f})"
    )
    mode = data.timed_mode
    if (timed := sampling_text(served_sampling(data.records, mode))):
        summary += f"; {timed}"
    if mode == "serving":
        got = lengths(data.records, spec.load, mode)
        details["sampling"] = served_sampling(data.records, mode)
        details["lengths"] = {
            "timed": got.timed, "rescaled": got.rescaled,
            "rule": "at a sampled serving setting each timed latency is taken at its prompt's "
                    "common length (e2e x L / output tokens, L the most tokens of the prompt's "
                    "timed requests at this level): unchanged where lengths agree (fixed "
                    "length), per output token where they do not"}
        if got.rescaled:
            summary += (f"; {got.rescaled} of {got.timed} timed requests ended short of their "
                        f"prompt's length and were compared per output token")
    if res.reason:
        summary += f"; {res.reason}"
    summary += "".join(f"; {note}" for note in res.notes if note != CONFOUNDED)
    if res.stall is not None:
        summary += f"; {res.stall.text(spec.reference, spec.condition)}"
    summary += sequential
    if outcome == "inconclusive":
        advice = advise(res, levels=len(pilot.load.levels))
        if advice is not None:
            summary += f"; {advice.text}"
            details["advice"] = {"more_prompts": list(advice.more_prompts),
                                 "more_passes": list(advice.more_passes),
                                 "better": advice.better, "settle": advice.settle}
    return GateResult(spec, outcome, summary, estimate=gate.estimate, ci_low=gate.ci_low,
                      ci_high=gate.ci_high, threshold=threshold, p_value=p_value,
                      details=details)
