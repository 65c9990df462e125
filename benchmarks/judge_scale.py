"""The judge and the reports at users' scale: time and peak memory on 10^5 records.

A synthetic results folder (records.jsonl in results/records.py's format, campaign.json,
preflight.json, the pilot and its trace) of a baseline and a drafter at x1 and x8, laid out
as the runner lays out an interleaved campaign (blocks, stretches, passes, start times),
with a true 1.3x speedup, 32 output tokens per request and their inter-token times. A fresh
process then loads it, judges it and writes the reports as the plugin does; its wall time per
phase and its peak RSS (getrusage) are printed with the load average. ``--profile`` prints
where the judge's time goes (cProfile, top functions by cumulative time).

    python benchmarks/judge_scale.py                  # 10^5 records
    python benchmarks/judge_scale.py --records 20000 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout: testkit

from pytest_osprey.campaign.size import campaign_size  # noqa: E402
from pytest_osprey.judgement import judge, plan_gates  # noqa: E402
from pytest_osprey.pilot.loading import load_pilot  # noqa: E402
from pytest_osprey.pilot.selection import pass_draws  # noqa: E402
from pytest_osprey.pilot.trace import load_trace  # noqa: E402
from pytest_osprey.report.summary import write_reports  # noqa: E402
from pytest_osprey.results.files import write_json_atomic  # noqa: E402
from pytest_osprey.results.folder import load_campaign  # noqa: E402
from pytest_osprey.results.preflight_file import read_preflight  # noqa: E402
from pytest_osprey.results.records import RecordWriter  # noqa: E402
from testkit.factories import closed_loop_starts, make_record, pilot_data, pilot_text  # noqa: E402

LEVELS = {"low": 1, "busy": 8}
CONDITIONS = {"baseline": ("baseline", 1.0), "cand": ("candidate", 1 / 1.3)}
TOKENS = 32
PASSES = 5
RUN_ID = "20260101T000000Z-scale1"


def pilot_for(prompts: int) -> str:
    return pilot_text(pilot_data(
        {"baseline": {"role": "baseline"},
         "cand": {"role": "candidate", "drafter": "drafters/cand"}},
        name="scale", target={"engine": "transformers", "model": "target"},
        trace={"files": ["trace.jsonl"]},
        load={"levels": LEVELS, "passes": PASSES, "warmup_requests": 0},
        limits={"speedup_min": 1.1}, decision={"early_stop": False},
        report={"html": True}))


def write_folder(root: Path, records: int, seed: int = 0) -> Path:
    """The project and its results folder, ``records`` measured records in all."""
    prompts = records // (len(CONDITIONS) * len(LEVELS) * PASSES)
    for d in ("target", "drafters/cand"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "trace.jsonl").write_text("".join(
        json.dumps({"id": f"p{i:05d}", "domain": f"d{i % 7}", "prompt": f"Say {i}",
                    "max_new_tokens": TOKENS}) + "\n" for i in range(prompts)), "utf-8")
    text = pilot_for(prompts)
    (root / "pilot.yaml").write_text(text, "utf-8")
    pilot = load_pilot(root / "pilot.yaml")
    trace = load_trace(pilot.trace.files)
    rng = np.random.default_rng(seed)
    base = rng.lognormal(0.0, 0.5, prompts)
    res = root / "results"
    res.mkdir()
    stretch, clock = 0, 1000.0
    with RecordWriter(res / "records.jsonl") as writer:
        for p in range(PASSES):
            for level, conc in LEVELS.items():
                order = rng.permutation(prompts)
                for block, start in enumerate(range(0, prompts, conc)):
                    members = order[start:start + conc]
                    for cond, (_, factor) in CONDITIONS.items():
                        stretch += 1
                        e2es = [float(base[i] * factor * conc ** 0.3 * rng.lognormal(0.0, 0.1))
                                for i in members]
                        # The runner's closed loop: fillers hold the load until the last ends.
                        starts, fillers = closed_loop_starts(e2es, conc,
                                                             float(np.median(e2es)))
                        for t, d, done in fillers:
                            writer.write(make_record(
                                cond, f"p{members[0]:05d}", run_id=RUN_ID, block=block,
                                repetition=p, boot=0, stretch=stretch, load=level,
                                concurrency=conc, filler=True, ok=done, e2e_s=d,
                                started_at=clock + t,
                                error=None if done else "cancelled: filler"))
                        for i, e2e, t0 in zip(members, e2es, starts, strict=True):
                            ids = [int(t) for t in (np.arange(TOKENS) * 7 + i) % 3000]
                            spec = cond != "baseline"
                            writer.write(make_record(
                                cond, f"p{i:05d}", run_id=RUN_ID, block=block, repetition=p,
                                boot=0, stretch=stretch, load=level, concurrency=conc,
                                domain=f"d{i % 7}", e2e_s=e2e, ttft_s=e2e / 10,
                                itl_s=[0.9 * e2e / TOKENS] * (TOKENS - 1), prompt_tokens=30,
                                output_ids=ids, output_text=" w" * TOKENS,
                                spec_verify_ct=10 if spec else None,
                                accept_length=TOKENS / 10 if spec else None,
                                spec_drafts=10 if spec else None,
                                spec_accepted_per_position=[9, 7, 5, 3] if spec else None,
                                finish_reason="length", started_at=clock + t0))
                        clock += max(t + d for t, d in zip(starts, e2es, strict=True)) + 0.01
    fingerprint = {"engine": "transformers", "version": "4.56.0", "device": "cpu",
                   "dtype": "float32", "quantization": "none", "model": "target",
                   "model_digest": "0123456789abcdef"}
    write_json_atomic(res / "campaign.json", {
        "schema": 1, "run_id": RUN_ID, "tool_version": "0.1.0", "pilot_name": pilot.name,
        "config_hash": pilot.digest(), "pilot_text": text, "trace_hash": trace.sha256,
        "trace_files": [str(f) for f in trace.files],
        "prompt_ids": [q.id for q in trace.prompts], "baseline": "baseline",
        "current": None, "candidates": ["cand"], "load_levels": LEVELS, "blocks": PASSES,
        "conditions": {n: {"role": role, "error": None, "boot_s": 10.0,
                           "peak_memory_mb": 1000.0, "fingerprint": fingerprint}
                       for n, (role, _) in CONDITIONS.items()},
        "schedule": [], "early_stop": False, "sequential": {}, "stopped_after_block": None,
        "status": "complete", "started_at": 1000.0, "ended_at": clock,
        "host": {"machine": "x86_64", "node": "n", "python": "3.11", "cpus": 2},
        "size": campaign_size(pilot, trace, len(CONDITIONS)).facts(),
        "draws": {k: d.facts() for k, d in pass_draws(pilot, trace.prompts).items()},
    })
    write_json_atomic(res / "preflight.json", {"artifacts": {}, "command_lines": {}})
    return res


def judge_folder(root: Path, profile: bool) -> None:
    """Load, judge, write the reports (in this process): phase times and peak RSS."""
    os.chdir(root)
    res = root / "results"
    times: dict[str, float] = {}
    cpus: dict[str, float] = {}
    prof = cProfile.Profile() if profile else None
    t, c = time.perf_counter(), time.process_time()
    pilot = load_pilot(root / "pilot.yaml")
    data = load_campaign(res)
    data.prompts = load_trace(pilot.trace.files).by_id()
    times["load"], cpus["load"] = time.perf_counter() - t, time.process_time() - c
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    preflight = read_preflight(res / "preflight.json")
    assert preflight is not None
    if prof:
        prof.enable()
    t, c = time.perf_counter(), time.process_time()
    judgement = judge(pilot, plan_gates(pilot, list(pilot.conditions)), data, preflight)
    times["judge"], cpus["judge"] = time.perf_counter() - t, time.process_time() - c
    rss_judged = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t, c = time.perf_counter(), time.process_time()
    write_reports(res, judgement, data, pilot)
    times["reports"], cpus["reports"] = time.perf_counter() - t, time.process_time() - c
    if prof:
        prof.disable()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    summary = json.loads((res / "summary.json").read_text())
    verdict = summary["verdicts"][0]
    sent = len(data.records) + len(data.fillers)
    size = (res / "records.jsonl").stat().st_size
    # CPU time beside wall time: less swayed by a machine shared with other work.
    phases = ", ".join(f"{k} {times[k]:.1f} s (CPU {cpus[k]:.1f})" for k in times)
    print(f"records {len(data.records)} (+{len(data.fillers)} fillers): {phases}, total "
          f"{sum(times.values()):.1f} s; peak RSS {peak:.0f} MiB ({rss_loaded:.0f} after "
          f"loading, {rss_judged:.0f} after judging); verdict {verdict['verdict']} "
          f"({summary['figures'][1].get('speedup')}); load average {os.getloadavg()}")
    print(f"records.jsonl {size / 2**20:.0f} MiB, {size / sent:.0f} bytes per record sent; "
          "reports: " + ", ".join(
              f"{name} {(res / name).stat().st_size / 1024:.0f} KiB"
              for name in ("summary.json", "report.md", "report.html")
              if (res / name).exists()))
    print("reasons:", "; ".join(r["text"] if isinstance(r, dict) and "text" in r else str(r)
                               for r in verdict.get("reasons", []))[:600])
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(35)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--keep", type=Path,
                        help="synthesise into this folder, or reuse the one already there")
    parser.add_argument("--judge", type=Path, help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args()
    if args.judge:
        judge_folder(args.judge, args.profile)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        if not (root / "results" / "campaign.json").exists():
            root.mkdir(parents=True, exist_ok=True)
            t = time.perf_counter()
            write_folder(root, args.records)
            print(f"synthesised in {time.perf_counter() - t:.1f} s")
        else:  # a kept folder: the reports of the last run go, the records stay
            for name in ("summary.json", "report.md", "report.html"):
                (root / "results" / name).unlink(missing_ok=True)
        size = (root / "results" / "records.jsonl").stat().st_size
        print(f"records.jsonl {size / 2**20:.0f} MiB")
        # A fresh process: its peak RSS is the judge's and the reports', not the synthesis's.
        cmd = [sys.executable, __file__, "--judge", str(root),
               *(["--profile"] if args.profile else [])]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
