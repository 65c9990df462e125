"""The shipped pilot's own records re-judged under the low-load noise families.

The shipped pilot (``pilot.yaml``: 21 prompts, x1 and x4, 4 passes, interleaved) is run once
(``python -m pytest --osprey-config=pilot.yaml``; minutes on a CPU) or an existing results
folder of it is read (``--results DIR``). Its timed x1 records keep everything - plan, blocks,
stretches, start times, lengths - but their latencies, which are replaced by synthetic ones
of known truth: per prompt a log-normal base (SD 0.6) and the drafter's gain (a true
speedup x a prompt interaction of SD 0.15), times the noise of a family
(``testkit.speed_sim.low_load_models``) laid on the requests in the order they started:
request noise, per-server stalls of 2-8 consecutive requests of one condition, +-25% drift
shared by both conditions over the campaign, Pareto stretch shocks. Each copy is judged by
the library's own gate path (``judgement.gates.evaluate``, as ``python -m pytest_osprey
report`` does: the speed gate at x1 against the baseline, the drift check over every level)
and the KEEP / DROP / withheld rates are printed, at a true 1.0x (the threshold) and 1.5x.

    python benchmarks/pilot_rejudge.py --results osprey-results/embedded-cpu-...  # ~3 min
    python benchmarks/pilot_rejudge.py                      # runs the pilot first
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout: testkit

from pytest_osprey.judgement.gates.evaluate import evaluate  # noqa: E402
from pytest_osprey.judgement.gates.kinds import GateKind  # noqa: E402
from pytest_osprey.judgement.gates.spec import GateSpec  # noqa: E402
from pytest_osprey.pilot.loading import load_pilot_text  # noqa: E402
from pytest_osprey.results import SavedCampaign, read_preflight  # noqa: E402
from pytest_osprey.results.preflight_file import Preflight  # noqa: E402
from pytest_osprey.results.records import RequestRecord  # noqa: E402
from pytest_osprey.run.inputs import open_saved  # noqa: E402
from testkit.speed_sim import Noise, _stalls, low_load_models  # noqa: E402

LEVEL = "low"


def run_pilot(into: Path) -> Path:
    """The shipped pilot run once into ``into``; its results folder."""
    cmd = [sys.executable, "-m", "pytest", f"--osprey-config={ROOT / 'pilot.yaml'}",
           f"--osprey-results={into}", "-q", "-p", "no:cacheprovider"]
    subprocess.run(cmd, cwd=ROOT, check=False)
    if not (into / "campaign.json").is_file():
        sys.exit(f"the pilot left no campaign.json in {into}")
    return into


def synthetic(data: SavedCampaign, baseline: str, candidate: str, noise: Noise,
              speedup: float, rng: np.random.Generator) -> SavedCampaign:
    """``data`` with its timed x1 latencies of both conditions replaced (see the module)."""
    mode = data.timed_mode
    timed = [i for i, r in enumerate(data.records)
             if r.mode == mode and r.load == LEVEL and r.condition in (baseline, candidate)]
    timed.sort(key=lambda i: (data.records[i].started_at or 0.0, i))
    recs = [data.records[i] for i in timed]
    ids = sorted({r.prompt_id for r in recs})
    index = {p: k for k, p in enumerate(ids)}
    prompt = np.array([index[r.prompt_id] for r in recs])
    cond = np.array([int(r.condition == candidate) for r in recs])[None, :]
    stretch = np.array([r.stretch or 0 for r in recs])
    _, seg = np.unique(stretch, return_inverse=True)
    t = np.array([r.started_at or 0.0 for r in recs])
    u = (t - t.min()) / max(float(np.ptp(t)), 1e-9)
    base = 0.6 * rng.standard_normal(len(ids))
    gain = math.log(speedup) + 0.15 * rng.standard_normal(len(ids))
    log_lat = base[prompt] - cond[0] * gain[prompt]
    log_lat += noise.request_sd * rng.standard_normal(len(recs))
    if noise.stall_prob:
        log_lat += math.log(noise.stall_factor) * _stalls(rng, cond, noise)[0]
    if noise.pareto_scale:
        shock = rng.pareto(noise.pareto_shape, int(seg.max()) + 1)
        log_lat += np.log1p(noise.pareto_scale * shock)[seg]
    if noise.drift_sd:
        phase = rng.uniform(0, 2 * math.pi)
        log_lat += noise.drift_sd * math.sqrt(2) * np.sin(2 * math.pi * u + phase)
    records: list[RequestRecord] = list(data.records)
    for i, value in zip(timed, np.exp(log_lat), strict=True):
        records[i] = replace(records[i], e2e_s=float(value))
    return replace(data, records=records)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, help="a results folder of the shipped pilot")
    ap.add_argument("--copies", type=int, default=60, help="synthetic copies per cell")
    args = ap.parse_args()
    start, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.results or run_pilot(Path(tmp) / "results")
        data, partial = open_saved(folder)
        if partial:
            print(f"note: {partial}")
        pilot = load_pilot_text(data.meta.pilot_text or (folder / "pilot.yaml").read_text(),
                                str(folder))
        preflight = read_preflight(folder / "preflight.json") or Preflight()
    baseline = pilot.baseline
    candidate = next(c for c in pilot.conditions if c != baseline)
    spec = GateSpec(GateKind.SPEEDUP, candidate, reference=baseline, load=LEVEL)
    passes = len({r.repetition for r in data.records if r.load == LEVEL})
    print(f"Shipped pilot re-judged at x1 ({LEVEL}), {baseline} vs {candidate}, "
          f"{passes} passes of its records, {args.copies} synthetic copies per cell; "
          f"threshold {pilot.limits.speedup_min}x; speed gate as `report` judges it.\n")
    print("| noise | truth | KEEP | DROP | withheld (drift) | inconclusive | stall named |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k, (name, noise) in enumerate(low_load_models().items()):
        for truth in (1.0, 1.5):
            rng = np.random.default_rng(100 * k + int(10 * truth))
            got = {"pass": 0, "fail": 0, "held": 0, "inconclusive": 0, "stall": 0}
            for _ in range(args.copies):
                copy = synthetic(data, baseline, candidate, noise, truth, rng)
                res = evaluate(spec, pilot, copy, preflight)
                if res.details.get("held_back") == "unstable_environment":
                    got["held"] += 1
                else:
                    got[res.outcome if res.outcome in got else "inconclusive"] += 1
                got["stall"] += "stall" in res.details
            n = args.copies
            print(f"| {name} | {truth:.1f}x | {got['pass'] / n:.3f} | {got['fail'] / n:.3f} | "
                  f"{got['held'] / n:.3f} | {got['inconclusive'] / n:.3f} | "
                  f"{got['stall'] / n:.3f} |", flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s wall, {time.process_time() - cpu:.0f} s CPU, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} load average")


if __name__ == "__main__":
    main()
