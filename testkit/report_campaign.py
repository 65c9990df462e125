"""A small synthetic campaign for the report tests: four conditions (one that never completes,
one hostile output), two load levels, and the summary the judge would write for it."""

from __future__ import annotations

from typing import Any

from pytest_osprey.judgement.cost.pricing import cost_summary
from pytest_osprey.judgement.figures.measured import all_figures
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.results.folder import SavedCampaign
from pytest_osprey.results.records import RequestRecord

from .factories import make_pilot, make_record, saved_campaign

SCRIPT = "<script>alert(1)</script>"
LEVELS = {"low": 1, "busy": 4}
ROLES = {"baseline": "baseline", "current": "current", "cand": "candidate", "broken": "candidate"}
PROMPTS = [("p1", "core"), ("p2", "core"), ("p3", "unusual")]
SPEED = {"baseline": 1.0, "current": 0.8, "cand": 0.6, "broken": 1.0}


def rec(cond: str, pid: str, slice_: str, load: str, block: int, **kw: Any) -> RequestRecord:
    """Latency grows with the block, the prompt and the load; "broken" never completes."""
    e2e = SPEED[cond] * (1.0 + 0.1 * block + 0.05 * int(pid[1:])) * LEVELS[load]
    ok = cond != "broken"
    speculates = ok and cond in ("current", "cand")
    fields: dict[str, Any] = {
        "block": block, "load": load, "concurrency": LEVELS[load], "slice": slice_, "ok": ok,
        "error": None if ok else "engine said <b>no</b>", "e2e_s": e2e if ok else None,
        "output_tokens": 20 if ok else None, "output_text": f"answer to {pid}" if ok else "",
        "spec_verify_ct": 8 if speculates else None, "accept_length": 2.5 if speculates else None,
        "started_at": 1000.0 * block + 10 * int(pid[1:]) + (100 if load == "busy" else 0),
    }
    return make_record(cond, pid, **{**fields, **kw})


def make_data(prompts: list[tuple[str, str]] = PROMPTS, blocks: int = 2) -> SavedCampaign:
    records = [
        rec(cond, pid, slice_, load, block)
        for block in range(blocks)
        for cond in ROLES
        for load in LEVELS
        for pid, slice_ in prompts
    ]
    # One divergent, hostile output from the candidate.
    for i, r in enumerate(records):
        if (r.condition, r.prompt_id, r.load, r.block) == ("cand", prompts[0][0], "low", 0):
            records[i] = rec("cand", r.prompt_id, r.slice, "low", 0, output_text=SCRIPT,
                             output_ids=[1, 2, 9])
    return saved_campaign(
        records, run_id="run-1", pilot_name="<i>pilot</i>", status="complete",
        trace_hash="ab" * 32, config_hash="cd" * 32, tool_version="0.1.0",
        baseline="baseline", current="current", candidates=["cand", "broken"],
        load_levels=LEVELS, blocks=blocks,
        conditions={c: {"role": role, "error": None, "boot_s": 1.5, "peak_memory_mb": 100.0}
                    for c, role in ROLES.items()},
    )  # fmt: skip


def report_pilot() -> Pilot:
    return make_pilot(
        conditions={c: {"role": r} if r == "baseline" else {"role": r, "drafter": "d"}
                    for c, r in ROLES.items()},
        load={"levels": LEVELS},
        limits={"cost": {"max_cost_per_request": 0.5}},
        cost={"device_hour_price": 2.0, "expected_requests_per_day": 5000,
              "setup": {"cand": {"pretraining": 100.0}}},
    )  # fmt: skip


def make_summary(data: SavedCampaign) -> dict[str, Any]:
    gate: dict[str, Any] = {"kind": "speedup", "id": "cand-vs-baseline-busy", "condition": "cand",
            "reference": "baseline", "load": "busy", "slice": None, "gating": True,
            "outcome": "pass", "summary": "speedup 1.667x <ok>", "estimate": 1.667,
            "ci": [1.5, 1.8], "threshold": 1.1, "p_value": 0.01, "details": {}}
    return {
        "schema": 1, "run_id": "run-1", "pilot_name": "<i>pilot</i>", "status": "complete",
        "trace_hash": "ab" * 32, "config_hash": "cd" * 32,
        "verdicts": [
            {"candidate": "cand", "verdict": "KEEP", "reasons": []},
            {"candidate": "broken", "verdict": "DROP", "reasons": ["completed[broken-low]: 0/6"]},
            {"candidate": "maybe", "verdict": "INCONCLUSIVE", "reasons": ["speedup: CI straddles"]},
        ],
        "gates": [gate, {**gate, "id": "broken-low", "kind": "completed", "outcome": "fail",
                         "ci": None, "summary": "0/6 completed"}],
        "figures": [f.model_dump() for f in all_figures(data)],
        "conditions": {n: c.model_dump() for n, c in data.meta.conditions.items()},
        "cost": cost_summary(report_pilot(), data).model_dump(),
    }
