"""The Osprey-against-EAGLE-3 example (examples/pilot-osprey-vs-eagle3.yaml) run end to end
against three serving twins (testkit/serving_twin.py) and read against their known truth.

The pilot keeps the example's conditions (``baseline`` plain, ``eagle3`` the current drafter,
``osprey`` the candidate), its levels (x1, x8, x32, primary x8), its limits, decision and cost
sections, and its load plan (the shipped 4 passes x 2 boots, the six-boot per-change plan
docs/scale.md recommends, or that plan with x32 on every boot). What differs, and why:

* every condition is an endpoint: a :class:`TwinProcess` (nothing boots; a "boot" is a
  stretch of the plan, with no boot-wide offset: the twins have none);
* timed greedy (no ``sampling.serving``): the twins' acceptance does not depend on
  temperature, and the untimed greedy pass beside sampled passes would double the time;
* no ``pins`` (the twin reports SGLang 0.5.23, the example pins 0.5.9);
* a synthetic trace of equal-length prompts (about 200 tokens), outputs of 256-512 tokens
  cycled over the prompts, a third of the prompts in the unusual slice.

The truth at a level is the geometric mean over the output lengths of
``twin_model.true_speedup`` at that length (the schedule in virtual time): exact at x1, where
each request runs alone; at x8 and x32 requests of different lengths share a batch, which
the per-length truths do not model (they differ by up to 7% between 256 and 512 tokens at
x32).
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from testkit.serving_twin import TwinProcess
from testkit.twin_model import profile, true_speedup

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "pilot-osprey-vs-eagle3.yaml"
PROFILE_OF = {"baseline": "plain", "eagle3": "eagle3-like", "osprey": "osprey-like"}
LEVELS = {"low": 1, "medium": 8, "high": 32}
PROMPT_TOKENS = 200  # the twin counts one token per 4 characters
OUTPUTS = (256, 384, 512)
PLANS: dict[str, dict[str, Any]] = {
    "shipped": {"passes": 4, "boots_per_condition": 2},
    "six-boot": {"passes": 1, "boots_per_condition": 6, "level_passes": {"low": 1, "high": 1}},
    # x32 on every boot too: its interval finite, so the crossover is estimated
    "six-boot-x32": {"passes": 1, "boots_per_condition": 6, "level_passes": {"low": 1}},
}
PAIRS = (("eagle3", "baseline"), ("osprey", "baseline"), ("osprey", "eagle3"))


@dataclass(frozen=True)
class PairResult:
    """One pair's speed gate at one level, against the twins' truth."""

    condition: str
    reference: str
    level: str
    estimate: float
    ci: tuple[float, float]
    truth: float
    outcome: str  # the gate's: pass | fail | inconclusive

    @property
    def covered(self) -> bool:
        return self.ci[0] <= self.truth <= self.ci[1]


@dataclass(frozen=True)
class CampaignResult:
    seed: int
    wall_s: float
    client_cpu_s: float  # the CLI's process: user + system
    exit_code: int
    pairs: list[PairResult]
    verdict: str  # the candidate's
    verdict_right: bool
    crossover: dict[str, Any]  # the candidate's against the baseline, as summary.json has it
    true_crossover: str  # pays_everywhere | pays_nowhere | crosses
    overhead_s: dict[str, float]  # condition -> median measured x1 latency minus its truth
    load_average: tuple[float, float, float]


def trace_lines(prompts: int) -> list[dict[str, Any]]:
    body = "Explain how a serving system batches requests, step by step. " * 13
    return [{"id": f"p{i:02d}", "domain": ("legal" if i % 3 == 2 else "chat"),
             "slice": "unusual" if i % 3 == 2 else "core",
             "prompt": f"{i:02d} {body}"[:4 * PROMPT_TOKENS],
             "max_new_tokens": OUTPUTS[i % len(OUTPUTS)]} for i in range(prompts)]


def pilot_dict(urls: dict[str, str], plan: str, confidence: float | None) -> dict[str, Any]:
    """The example pilot, its conditions served by the twins at ``urls``."""
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    data["target"] = {"engine": "endpoint", "model": data["target"]["model"]}
    for name, cond in data["conditions"].items():
        cond.pop("drafter", None)
        cond.pop("pins", None)
        cond["endpoint"] = {"url": urls[name], "protocol": "sglang"}
    data.pop("sampling", None)
    data["trace"] = {"files": ["trace.jsonl"], "unusual_slice": "unusual"}
    data["load"] = {"levels": dict(LEVELS), "warmup_requests": 8, "order": "sequential",
                    **PLANS[plan]}
    if confidence is not None:
        data["decision"]["confidence"] = confidence
    data["report"] = {"title": data["report"]["title"], "html": False}
    return data


def truths(time_scale: float) -> dict[tuple[str, str, str], float]:
    """(condition, reference, level) -> the twins' true per-prompt speedup."""
    out = {}
    for cond, ref in PAIRS:
        for level, c in LEVELS.items():
            logs = [math.log(true_speedup(profile(PROFILE_OF[cond], time_scale),
                                          profile(PROFILE_OF[ref], time_scale), c,
                                          PROMPT_TOKENS, n, repeats=60)) for n in OUTPUTS]
            out[(cond, ref, level)] = math.exp(float(np.mean(logs)))
    return out


def true_crossover(truth: dict[tuple[str, str, str], float], threshold: float) -> str:
    above = [truth[("osprey", "baseline", lv)] > threshold for lv in LEVELS]
    if all(above):
        return "pays_everywhere"
    return "pays_nowhere" if not any(above) else "crosses"


def right_verdict(truth: dict[tuple[str, str, str], float], speedup_min: float) -> str:
    """KEEP when the candidate truly clears both references at the primary load, else DROP."""
    keep = (truth[("osprey", "baseline", "medium")] > speedup_min
            and truth[("osprey", "eagle3", "medium")] > 1.0)
    return "KEEP" if keep else "DROP"


def x1_overheads(res: Path, time_scale: float) -> dict[str, float]:
    """Median measured x1 completion latency minus the twin's virtual-time latency of the same
    request (scaled, from its own decode steps): what the client, the server's event loop and
    the machine add per request (x1 runs one request at a time: exact per request)."""
    sums: dict[str, list[float]] = {}
    with (res / "records.jsonl").open() as fh:
        for line in fh:
            r = json.loads(line)
            if (r.get("load") != "low" or r.get("filler") or r.get("e2e_s") is None
                    or r.get("mode") not in ("greedy", "sampled") or r.get("probe")):
                continue
            # The request's own schedule: its prefill (the first token) and its decode
            # steps, as many as the twin reports (spec_verify_ct; plain: one per token).
            prof = profile(PROFILE_OF[r["condition"]], time_scale)
            steps = r.get("spec_verify_ct") or r["output_tokens"] - 1
            virtual = (prof.prefill_s(r.get("prompt_tokens") or PROMPT_TOKENS)
                       + steps * prof.decode_s(1))
            sums.setdefault(r["condition"], []).append(r["e2e_s"] - virtual)
    # The median: the client's own cost; the mean adds the machine's stalls (a request held
    # up by other work on the cores, up to half a second seen on a shared machine).
    return {c: float(np.median(v)) for c, v in sums.items()}


def run_campaign(folder: Path, *, seed: int, time_scale: float, prompts: int, plan: str,
                 confidence: float | None = None,
                 truth: dict[tuple[str, str, str], float] | None = None) -> CampaignResult:
    """One campaign through ``python -m pytest_osprey run`` against three twin processes
    (seeded ``seed``, ``seed + 1``, ``seed + 2``), read against the truth."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trace.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                for r in trace_lines(prompts)))
    truth = truth or truths(time_scale)
    res = folder / "res"
    with TwinProcess("plain", time_scale=time_scale, seed=seed) as base, \
            TwinProcess("eagle3-like", time_scale=time_scale, seed=seed + 1) as eagle, \
            TwinProcess("osprey-like", time_scale=time_scale, seed=seed + 2) as osprey:
        data = pilot_dict({"baseline": base.url, "eagle3": eagle.url, "osprey": osprey.url},
                          plan, confidence)
        (folder / "pilot.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest_osprey", "run",
                               str(folder / "pilot.yaml"), "--results", str(res)],
                              env=env, cwd=folder, capture_output=True, text=True)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1) or not (res / "summary.json").exists():
        raise RuntimeError(f"the campaign failed (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout)[-2000:]}")
    summary = json.loads((res / "summary.json").read_text())
    pairs = []
    for g in summary["gates"]:
        key = (g["condition"], g["reference"], g["load"])
        if g["kind"] != "speedup" or g["slice"] is not None or key not in truth:
            continue
        low, high = g["ci"]  # null: an open end (one stretch at the level: no df)
        pairs.append(PairResult(g["condition"], g["reference"], g["load"], g["estimate"],
                                (0.0 if low is None else low,
                                 math.inf if high is None else high), truth[key],
                                g["outcome"]))
    verdict = next(v for v in summary["verdicts"] if v["candidate"] == "osprey")
    speedup_min = float(data["limits"]["speedup_min"])
    return CampaignResult(
        seed=seed, wall_s=wall,
        client_cpu_s=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        exit_code=proc.returncode, pairs=pairs, verdict=verdict["verdict"],
        verdict_right=verdict["verdict"] == right_verdict(truth, speedup_min),
        crossover=verdict.get("crossover") or {},
        true_crossover=true_crossover(truth, speedup_min),
        overhead_s=x1_overheads(res, time_scale), load_average=os.getloadavg())


__all__ = ["EXAMPLE", "LEVELS", "OUTPUTS", "PAIRS", "PLANS", "PROFILE_OF", "PROMPT_TOKENS",
           "CampaignResult", "PairResult", "pilot_dict", "right_verdict", "run_campaign",
           "trace_lines", "true_crossover", "truths", "x1_overheads"]
