"""Fairness: the conditions of a campaign may differ in the drafter only.

A speedup or a quality verdict means something only if every condition ran on the same GPU,
at the same precision, with the same sampling, context length and request trace. This module
checks that from campaign.json (the engine fingerprints) and the records, and names every
difference with its value per condition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ...results.records import RequestRecord
from ..gates.result import GateResult
from ..gates.spec import GateSpec
from ..quality.acceptance import (
    MAY_PROPOSE_NOTHING,
    RecordCheck,
    depth_per_stretch,
    reconcile,
    self_checks,
)
from .load import LevelLoad, drained, level_loads
from .speculation import depth_differences, speculation_differences

ADVICE = "keep the GPU, precision, sampling, context and request trace fixed"

# Fingerprint fields compared, with the keys each engine uses for them (first one present).
# SGLang's fingerprint puts the device name under "device"; transformers has both.
FIELDS: dict[str, tuple[str, ...]] = {
    "engine": ("engine",),
    "version": ("version",),
    "device_name": ("device_name", "device"),
    "dtype": ("dtype",),
    "quantization": ("quantization",),
    "context_length": ("context_length",),
    # Chat prompts are rendered with the target's template where it has one ("none" else).
    "chat_template": ("chat_template",),
}
_DTYPES = {
    "fp32": "float32", "float": "float32", "float32": "float32", "torch.float32": "float32",
    "fp16": "float16", "half": "float16", "float16": "float16", "torch.float16": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16", "torch.bfloat16": "bfloat16",
    "fp64": "float64", "float64": "float64", "double": "float64",
}


@dataclass
class FairnessResult:
    """``ok`` unless some compared field differs; ``compared``: field -> condition -> value."""

    ok: bool
    differences: list[str] = field(default_factory=list)
    compared: dict[str, dict[str, Any]] = field(default_factory=dict)
    not_shown: list[str] = field(default_factory=list)  # fields some conditions lack
    not_compared: list[str] = field(default_factory=list)  # conditions that did not run
    flags: list[str] = field(default_factory=list)  # shown, not failing (acceptance counts)

    @property
    def summary(self) -> str:
        if self.ok:
            head = (f"conditions comparable on {', '.join(self.compared) or 'nothing'}"
                    + (f" ({len(self.not_compared)} not run)" if self.not_compared else ""))
        else:
            head = f"conditions differ beyond the drafter ({ADVICE}):\n  " + "\n  ".join(
                self.differences)
        if self.not_shown:
            head += "\n  not shown: " + "; ".join(self.not_shown)
        if self.flags:
            head += "\n  flagged: " + "\n  flagged: ".join(self.flags)
        return head


def _canonical(name: str, value: Any) -> Any:
    """A comparable form: dtype aliases folded, numbers as numbers, mappings as JSON text."""
    if value is None:
        return None
    if name == "dtype" and isinstance(value, str):
        return _DTYPES.get(value.strip().lower(), value.strip().lower())
    if name == "context_length" and isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, Mapping | list):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def _shown(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{c}={v!r}" for c, v in values.items())


def fairness_check(meta: Mapping[str, Any], records: Sequence[RequestRecord],
                   loads: Sequence[LevelLoad] = ()) -> FairnessResult:
    """Check that all conditions that ran share engine, version, device, dtype, context length,
    sampling parameters and trace hash, were sent the same prompts per load level and mode,
    held each closed-loop level's load (``loads``, measured from the records) and could run
    it (their running caps).

    A field missing on some conditions is reported under ``not_shown``, not as a difference
    (engines report different facts). Conditions whose boot failed are left out (the
    completed gate fails them); conditions seen only in the records are compared too.
    """
    conditions: Mapping[str, Any] = meta.get("conditions") or {}
    result = FairnessResult(ok=True)
    names: list[str] = []
    for name, entry in conditions.items():
        if isinstance(entry, Mapping) and entry.get("error"):
            result.not_compared.append(name)
        else:
            names.append(name)
    names += sorted({r.condition for r in records} - set(conditions))
    # A level that did not hold its load is unfair even to a lone condition: its figures
    # are not those of the load it names.
    result.differences += drained(loads, names)
    if len(names) < 2:
        result.ok = not result.differences
        return result

    def info(name: str) -> Mapping[str, Any]:
        value = conditions.get(name)
        return value if isinstance(value, Mapping) else {}

    def fingerprint(name: str) -> Mapping[str, Any]:
        fp = info(name).get("fingerprint")
        return fp if isinstance(fp, Mapping) else {}

    values: dict[str, dict[str, Any]] = {}
    for fname, keys in FIELDS.items():
        values[fname] = {
            c: next((fingerprint(c)[k] for k in keys if fingerprint(c).get(k) is not None), None)
            for c in names
        }
    # Campaign-wide facts, unless a condition carries its own (merged or per-condition runs).
    for fname in ("sampling", "trace_hash"):
        values[fname] = {
            c: info(c).get(fname, fingerprint(c).get(fname, meta.get(fname))) for c in names
        }
    for fname, per in values.items():
        result.compared[fname] = per
        present = {c: v for c, v in per.items() if v is not None}
        missing = [c for c in names if c not in present]
        if missing and present:
            result.not_shown.append(f"{fname} not shown for {', '.join(missing)}")
        elif not present:
            result.not_shown.append(f"{fname} not shown by any condition")
        if len({_canonical(fname, v) for v in present.values()}) > 1:
            result.differences.append(f"{fname} differs: {_shown(present)}")
    result.differences += _prompt_sets(records, names)
    caps = {c: fingerprint(c).get("max_running_requests") for c in names}
    if any(v is not None for v in caps.values()):
        result.compared["max_running_requests"] = caps
    result.differences += _running_caps(records, caps)
    result.ok = not result.differences
    return result


def _peak_in_flight(records: Sequence[RequestRecord]) -> int:
    """The most of ``records`` that were in flight at once (from start times and latencies)."""
    edges = sorted(
        (t, step) for r in records if r.started_at is not None and r.e2e_s is not None
        for t, step in ((r.started_at, 1), (r.started_at + r.e2e_s, -1))
    )  # an end before a start at the same instant: not overlapping
    peak = now = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def _running_caps(records: Sequence[RequestRecord], caps: Mapping[str, Any]) -> list[str]:
    """A server runs at most ``max_running_requests`` at once and queues the rest (SGLang caps
    speculative servers at 48 by default, not the plain one): at a load above a condition's
    cap, that condition does not run the load the level names (its latency counts the wait,
    its batch is the cap), and where another condition's cap is higher only one side queues."""
    known = {c: v for c, v in caps.items() if isinstance(v, int) and v > 0}
    if not known:
        return []
    by_load: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.condition in known:
            by_load.setdefault(r.load, []).append(r)
    out = []
    for load, recs in sorted(by_load.items()):
        closed = {r.concurrency for r in recs if r.rate is None and r.concurrency > 0}
        if closed:
            peak = max(closed)
        else:  # open loop: what was in flight, per condition
            peak = max(_peak_in_flight([r for r in recs if r.condition == c]) for c in known)
        capped = ", ".join(f"{c} runs at most {cap}" for c, cap in known.items() if cap < peak)
        if not capped:
            continue
        side = ("requests queue on one side only"
                if len({min(cap, peak) for cap in known.values()}) > 1
                else "the excess queues in the server")
        out.append(f"load {load!r}: up to {peak} requests in flight, but {capped} at once "
                   f"(max_running_requests: {_shown(known)}): {side}; give every condition "
                   f"--max-running-requests of at least {peak} (SGLang; vLLM: --max-num-seqs)")
    return out


def _prompt_sets(records: Sequence[RequestRecord], names: Sequence[str]) -> list[str]:
    """Every condition must have been sent the same prompts at each (load, mode)."""
    seen: dict[tuple[str, str], dict[str, set[str]]] = {}
    for r in records:
        if r.condition in names:
            seen.setdefault((r.load, r.mode), {}).setdefault(r.condition, set()).add(r.prompt_id)
    out = []
    for (load, mode), per in sorted(seen.items()):
        union = set().union(*per.values())
        for c in names:
            lacking = sorted(union - per.get(c, set()))
            if lacking:
                shown = ", ".join(lacking[:5]) + (f" (+{len(lacking) - 5} more)"
                                                  if len(lacking) > 5 else "")
                out.append(f"load {load!r}, {mode}: {c} has no request for {len(lacking)} "
                           f"prompt(s) the others were sent: {shown}")
    return out


RECORDS_NAMED = 5
"""Records that disagree with themselves named in the flags; the rest are counted."""


def _record_flags(wrong: Sequence[RecordCheck]) -> list[str]:
    flags = [f"acceptance not reconciled: {c.text()}" for c in wrong[:RECORDS_NAMED]]
    if len(wrong) > RECORDS_NAMED:
        flags.append(f"acceptance not reconciled: {len(wrong) - RECORDS_NAMED} more record(s) "
                     "disagree with their own counts (record_mismatches)")
    return flags


def judge_fairness(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    """The fairness gate: the candidate and its references, compared as they ran."""
    involved = {spec.condition, *pilot.references(spec.condition)}
    meta = data.meta.model_dump(by_alias=True)
    meta["conditions"] = {n: c for n, c in meta["conditions"].items() if n in involved}
    loads = [lv for lv in level_loads(data) if lv.condition in involved]
    records = [r for r in data.records if r.condition in involved]
    res = fairness_check(meta, records, loads)
    schedule = [e for e in data.meta.schedule if e.condition in involved]
    depths = depth_per_stretch(schedule)
    speculation: dict[str, Any] = {}
    for name, run in data.meta.conditions.items():
        facts = run.fingerprint.get("speculation")
        if name not in involved or run.error or not isinstance(facts, Mapping):
            continue
        speculation[name] = facts
        cond = pilot.conditions.get(name)
        allowed = (bool(cond.speculation and cond.speculation.adaptive)
                   if cond is not None else None)
        res.differences += speculation_differences(name, facts, allowed)
        res.differences += depth_differences(name, facts, depths, allowed)
    res.ok = not res.differences
    # Every request sent, fillers included: the engine's counters count them as well.
    sent = [r for r in data.sent if r.condition in involved]
    reconciled = reconcile(schedule, sent)
    # A count that disagrees with the engine's own says the records' acceptance figures are
    # not the engine's: flagged for the reader, not a difference between the conditions.
    res.flags += [f"acceptance not reconciled: {r.text()}" for r in reconciled if r.mismatch]
    open_ended = [n for n, f in speculation.items()
                  if str((f.get("ran") or {}).get("algorithm", "")).lower() in MAY_PROPOSE_NOTHING]
    checks = self_checks(sent, open_ended)  # fillers that completed are records too
    wrong = [c for c in checks if c.mismatch]
    res.flags += _record_flags(wrong)
    return GateResult(spec, "pass" if res.ok else "fail", res.summary,
                      details={"differences": res.differences, "compared": res.compared,
                               "in_flight": [lv.as_dict() for lv in loads],
                               "speculation": speculation, "depth_per_stretch": depths,
                               "reconciliation": [asdict(r) | {"mismatch": r.mismatch}
                                                  for r in reconciled],
                               "records_checked": len(checks),
                               "record_mismatches": [asdict(c) for c in wrong],
                               "flags": res.flags})
