"""A recorded campaign that exercises every gate kind and verdict: a project (pilot, trace,
drafter folders), the results folder a campaign leaves, and the judging the plugin does. The
summary.json and report tests read it as a real run's output."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pytest_osprey.campaign.size import campaign_size
from pytest_osprey.judgement import judge, plan_gates
from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.pilot.selection import pass_draws
from pytest_osprey.pilot.trace import load_trace
from pytest_osprey.report.summary import write_reports
from pytest_osprey.results.files import write_json_atomic
from pytest_osprey.results.folder import load_campaign
from pytest_osprey.results.preflight_file import read_preflight
from pytest_osprey.results.records import RecordWriter, RequestRecord

from .factories import closed_loop_starts, make_record, pilot_data, pilot_text, sampled_records

RUN_ID = "20250101T000000Z-abc123"
LEVELS = {"low": 1, "busy": 4}
# Latency factor against the baseline (a speedup of 1/factor) and peak memory (MiB).
CONDITIONS = {
    "baseline": ("baseline", 1.0, 1000.0),
    "current": ("current", 0.8, 1050.0),
    "cand": ("candidate", 0.6, 1100.0),
    "slow": ("candidate", 1.02, 1600.0),
}
PROMPTS = [(f"p{i:02d}", "unusual" if i % 4 == 0 else "core") for i in range(1, 13)]
BLOCKS = 2
SAMPLED = 4  # prompts of the sampled pass, 4 samples each

PILOT = pilot_text(pilot_data(
    {"baseline": {"role": "baseline"},
     "current": {"role": "current", "drafter": "drafters/current"},
     "cand": {"role": "candidate", "drafter": "drafters/cand"},
     "slow": {"role": "candidate", "drafter": "drafters/slow"}},
    name="schema-pilot",
    target={"engine": "transformers", "model": "target", "context_length": 1024},
    trace={"files": ["trace.jsonl"]},
    sampling={"sampled": {"enabled": True, "samples_per_prompt": 4, "prompts": 4},
              "params": {"enabled": True, "prompts": 1}},
    load={"levels": {"low": 1, "busy": 4}, "passes": 2, "boots_per_condition": 2},
    limits={
        "speedup_min": 1.1,
        "min_completed_fraction": 0.9,
        "quality": {"max_loss_rate": 0.0},
        "memory": {"max_increase_pct": 30},
        "latency": [{"metric": "ttft", "percentile": 50, "max_s": 0.5, "load": "busy"}],
        "cost": {"max_cost_per_request": 0.01, "max_break_even_days": 90},
        "goodput": {"ttft_s": 0.5, "e2e_s": 5.0, "margin": 0.3},
    },
    decision={"early_stop": True},
    cost={"device_hour_price": 3.0, "expected_requests_per_day": 20000,
          "setup": {"cand": {"pretraining": 40.0}, "slow": {"adaptation": 5.0}}},
    report={"html": False},
))


def _text(cond: str, pid: str) -> str:
    # The slow candidate gets p05 wrong (a genuine divergence and a failed expect check).
    return f"answer {pid}" if not (cond == "slow" and pid == "p05") else "something else"


def _ids(cond: str, pid: str) -> list[int]:
    n = int(pid[1:])
    ids = [n, n + 1, n + 2, n + 3, n + 4, n + 5]
    if cond == "slow" and pid == "p05":
        ids[2] = 99  # where the baseline's margin is wide: genuine
    if cond in ("cand", "current") and pid == "p07":
        ids[4] = 98  # where the baseline's margin is narrow: a near-tie
    return ids


def campaign_records(rng: np.random.Generator) -> list[RequestRecord]:
    effect = {pid: float(rng.lognormal(0.0, 0.3)) for pid, _ in PROMPTS}
    out = []
    for block in range(BLOCKS):
        for cond, (_, factor, _mb) in CONDITIONS.items():
            for level, conc in LEVELS.items():
                e2es = [0.4 * effect[pid] * factor * conc ** 0.3 * float(rng.lognormal(0, 0.05))
                        for pid, _ in PROMPTS]
                # Laid out as the runner sends them: the level's load held by fillers.
                starts, fillers = closed_loop_starts(e2es, conc)
                if conc == 1:  # one after another (as first written: the cost figures)
                    starts, fillers = [k * e for k, e in enumerate(e2es)], []
                t0 = 1000.0 * block + (100.0 if level == "busy" else 0.0)
                for k, (pid, slice_) in enumerate(PROMPTS):
                    e2e = e2es[k]
                    ids = _ids(cond, pid)
                    ok = not (cond == "current" and level == "busy" and k == 11 and block == 1)
                    out.append(make_record(
                        cond, pid, run_id=RUN_ID, block=block, boot=block, load=level,
                        concurrency=conc,
                        slice=slice_, ok=ok, error=None if ok else "timed out after 300 s",
                        e2e_s=e2e if ok else None, itl_s=[0.9 * e2e / 5] * 5 if ok else [],
                        prompt_tokens=30, output_ids=ids if ok else [],
                        output_text=_text(cond, pid) if ok else "",
                        top2_margin=[2.0, 2.0, 2.0, 2.0, 0.01, 2.0] if cond == "baseline"
                        else None,
                        top2_ids=[[t, 98 if j == 4 else 97] for j, t in enumerate(ids)]
                        if cond == "baseline" else None,
                        spec_verify_ct=3 if ok and cond != "baseline" else None,
                        spec_drafts=2 if ok and cond != "baseline" else None,
                        spec_accepted_per_position=[2, 1, 0] if ok and cond != "baseline"
                        else None,
                        finish_reason="length", started_at=t0 + starts[k],
                    ))
                out += [make_record(cond, PROMPTS[j % len(PROMPTS)][0], run_id=RUN_ID,
                                    block=block, boot=block, load=level, concurrency=conc,
                                    filler=True, ok=done, e2e_s=d, started_at=t0 + t,
                                    error=None if done else "cancelled: filler")
                        for j, (t, d, done) in enumerate(fillers)]
    for cond in CONDITIONS:  # the sampled pass: one distribution for every condition
        for pid, slice_ in PROMPTS[:SAMPLED]:
            outputs = [[int(t) for t in rng.integers(0, 5, 6)] for _ in range(4)]
            out += sampled_records(cond, pid, outputs, run_id=RUN_ID, slice=slice_,
                                   e2e_s=0.3, ttft_s=0.05, output_text="x", started_at=5000.0)
    for cond in CONDITIONS:  # the sampling-parameters pass: one penalty probe, honoured
        for probe, ids, request in (("plain", [1, 2, 1, 2], None),
                                    ("repetition_penalty", [1, 2, 3, 4],
                                     {"repetition_penalty": 1.3})):
            out.append(make_record(
                cond, PROMPTS[0][0], measured=False, run_id=RUN_ID, slice=PROMPTS[0][1],
                mode="params", ok=True, output_ids=ids, output_text="x", probe=probe,
                request=request, started_at=6000.0))
    return out


def write_project(root: Path) -> Path:
    project = root / "project"
    for d in ("target", "drafters/current", "drafters/cand", "drafters/slow"):
        (project / d).mkdir(parents=True)
    lines = [json.dumps({"id": pid, "slice": slice_, "domain": "d", "prompt": f"Say {pid}",
                         "expect": {"type": "contains", "value": f"answer {pid}"}})
             for pid, slice_ in PROMPTS]
    (project / "trace.jsonl").write_text("\n".join(lines) + "\n", "utf-8")
    (project / "pilot.yaml").write_text(PILOT, "utf-8")
    return project


def _drafted(pilot: Pilot, name: str) -> dict[str, Any]:
    """What the embedded engine's fingerprint adds for a condition that drafts."""
    drafter = pilot.conditions[name].drafter
    if drafter is None:
        return {}
    k = {"algorithm": "assisted", "num_steps": None, "eagle_topk": None,
         "num_draft_tokens": 2, "adaptive": False}
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return {"drafter": str(drafter), "drafter_digest": digest,
            "num_draft_tokens": 2, "draft_loop": "engine",
            "speculation": {"asked": k, "ran": k, "adaptive_allowed": False}}


def record_campaign(project: Path, results: Path) -> None:
    """What a campaign leaves in its results folder (campaign.py, fixtures.py)."""
    pilot = load_pilot(project / "pilot.yaml")
    trace = load_trace(pilot.trace.files)
    results.mkdir(parents=True)
    with RecordWriter(results / "records.jsonl") as writer:
        for r in campaign_records(np.random.default_rng(7)):
            writer.write(r)
    fingerprint = {"engine": "transformers", "version": "4.56.0", "torch": "2.13.0",
                   "device": "cpu", "device_name": "cpu", "dtype": "float32",
                   "quantization": "none", "threads": 2, "context_length": 1024,
                   "model": pilot.target.model, "model_digest": "0123456789abcdef",
                   "memory": {"kind": "host", "basis": "weights", "scope": "condition",
                              "note": "weights + buffers of the loaded models"},
                   "memory_method": "weights + buffers of the loaded models"}
    meta = {
        "schema": 1, "run_id": RUN_ID, "tool_version": "0.1.0", "pilot_name": pilot.name,
        "config_hash": pilot.digest(), "pilot_text": PILOT, "trace_hash": trace.sha256,
        "trace_files": [str(f) for f in trace.files], "prompt_ids": [p.id for p in trace.prompts],
        "baseline": "baseline", "current": "current", "candidates": ["cand", "slow"],
        "load_levels": LEVELS, "blocks": BLOCKS,
        "block_order": [list(CONDITIONS), list(CONDITIONS)[::-1]],
        "sampling": pilot.sampling.model_dump(mode="json"),
        "conditions": {
            name: {"role": role, "error": None, "boot_s": 12.5, "peak_memory_mb": mb,
                   "fingerprint": fingerprint | _drafted(pilot, name)}
            for name, (role, _, mb) in CONDITIONS.items()
        },
        "schedule": [], "early_stop": True, "sequential": {}, "stopped_after_block": None,
        "status": "complete", "started_at": 1000.0, "ended_at": 9000.0,
        "host": {"machine": "x86_64", "node": "n", "python": "3.11", "cpus": 2},
        # As the campaign records them from the pilot before it runs.
        "size": campaign_size(pilot, trace, len(CONDITIONS)).facts(),
        "draws": {k: d.facts() for k, d in pass_draws(pilot, trace.prompts).items()},
    }
    write_json_atomic(results / "campaign.json", meta)
    write_json_atomic(results / "preflight.json", {
        "artifacts": {c: {"ok": True, "checks": [{"name": "weights", "ok": True,
                                                  "detail": "readable"}]}
                      for c in CONDITIONS if c != "baseline"},
        "command_lines": {c: {"condition": c, "ok": True, "lines": [f"serve {c}"]}
                          for c in CONDITIONS},
    })
    shutil.copyfile(project / "pilot.yaml", results / "pilot.yaml")


def judge_as_the_plugin_does(project: Path, results: Path) -> None:
    pilot = load_pilot(project / "pilot.yaml")
    data = load_campaign(results)
    data.prompts = load_trace(pilot.trace.files).by_id()  # as Campaign.run hands it over
    preflight = read_preflight(results / "preflight.json")
    assert preflight is not None
    judgement = judge(pilot, plan_gates(pilot, list(pilot.conditions)), data, preflight)
    write_reports(results, judgement, data, pilot)


def judged_campaign(root: Path, folder: str = "results") -> Path:
    """The recorded campaign, written under ``root``, measured and judged as the plugin does:
    its results folder (summary.json and the reports in it)."""
    project = write_project(root)
    results = root / folder
    record_campaign(project, results)
    judge_as_the_plugin_does(project, results)
    return results
