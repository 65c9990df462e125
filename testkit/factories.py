"""Test factories shared by the suite: request records, pilots (in memory and as files), saved
campaigns, traces and the tiny models.

Defaults are plain and valid; a test states what it cares about as overrides.
"""

from __future__ import annotations

import copy
import heapq
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.results.campaign_file import CampaignFile
from pytest_osprey.results.folder import SavedCampaign
from pytest_osprey.results.records import RequestRecord

ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- tiny models

# Built by fixtures/models' recipe (MANIFEST.json); OSPREY_TINY_MODELS points at another copy.
TINY_MODELS = Path(os.environ.get("OSPREY_TINY_MODELS") or ROOT / "fixtures" / "models")
TINY_TARGET = TINY_MODELS / "tiny-target"
TINY_DRAFTER = TINY_MODELS / "tiny-drafter"
TINY_DRAFTER_WEAK = TINY_MODELS / "tiny-drafter-weak"


def fake_model(folder: Path) -> Path:
    """A model folder that passes the pilot's path checks (a config.json, no weights)."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 4}
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return folder


def pilot_layout(folder: Path, data: Mapping[str, Any]) -> Path:
    """What pilot file content ``data`` names, made under ``folder``: fake model folders for
    the target and drafters, one-prompt trace files. For pilots loaded with path checks."""
    fake_model(folder / data["target"]["model"])
    for cond in data["conditions"].values():
        if cond.get("drafter"):
            fake_model(folder / cond["drafter"])
    for name in data["trace"]["files"]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text('{"id": "a", "domain": "chat", "prompt": "hi"}\n', "utf-8")
    return folder


# --------------------------------------------------------------------------- records


def make_record(condition: str = "base", prompt_id: str = "p0", *, measured: bool = True,
                **overrides: Any) -> RequestRecord:
    """One greedy request at load ``low`` (x1), block 0. A completed one (``ok``, the default)
    took 1 s (``ttft_s``: a tenth of ``e2e_s``) for tokens [1, 2, 3]; a failed one
    (``ok=False``) has an error and, unless given, no timings or output. ``measured=False``
    leaves out those defaults: the measurement is what the overrides say (else the record's own
    defaults: no timings, no output, no error), for tests that set their own."""
    ok = overrides.get("ok", True)
    block = overrides.get("block", 0)
    fields: dict[str, Any] = {
        "run_id": "r", "block": block, "repetition": block, "load": "low", "concurrency": 1,
        "slice": "core", "domain": "d", "mode": "greedy", "sample_index": 0, "ok": ok,
    }  # fmt: skip
    if measured:
        e2e = overrides.get("e2e_s", 1.0 if ok else None)
        ids = overrides.get("output_ids", [1, 2, 3] if ok else [])
        fields.update({
            "error": None if ok else "HTTP 500", "e2e_s": e2e,
            "ttft_s": e2e / 10 if e2e is not None else None,
            "output_ids": ids, "output_tokens": len(ids) if ok else None,
        })  # fmt: skip
    fields.update(overrides)
    return RequestRecord(condition=condition, prompt_id=prompt_id, **fields)


def closed_loop_starts(durations: Sequence[float], concurrency: int, filler_s: float = 0.5
                       ) -> tuple[list[float], list[tuple[float, float, bool]]]:
    """How the runner lays out a closed-loop stretch: ``concurrency`` workers take requests of
    the given ``durations`` in order, then send fillers of ``filler_s`` until the last one has
    ended, cutting the fillers still running there. Returns each request's start (from 0) and
    the fillers as (start, duration, completed)."""
    free = [(0.0, w) for w in range(max(1, concurrency))]
    heapq.heapify(free)
    starts = []
    for d in durations:
        t, w = heapq.heappop(free)
        starts.append(t)
        heapq.heappush(free, (t + d, w))
    last = max((t + d for t, d in zip(starts, durations, strict=True)), default=0.0)
    fillers = []
    while free and free[0][0] < last:
        t, w = heapq.heappop(free)
        cut = min(filler_s, last - t)
        fillers.append((t, cut, cut == filler_s))
        heapq.heappush(free, (t + cut, w))
    return starts, fillers


def paired_campaign(
    factors: Mapping[str, float],
    *,
    prompts: int = 20,
    loads: Mapping[str, int] | None = None,
    passes: int = 1,
    seed: int = 0,
    prompt_sd: float = 0.5,
    noise_sd: float = 0.1,
    fields: Callable[[str, int, int], Mapping[str, Any]] | None = None,
) -> list[RequestRecord]:
    """Greedy records with a known truth: prompt ``p{i}`` takes a lognormal time of its own
    (log-sd ``prompt_sd``), times the condition's factor (0.5: twice as fast as 1.0), times
    independent lognormal noise (``noise_sd``) per request. Every condition runs every prompt
    at every load level in every pass, one prompt per block (a saved campaign without a plan
    is judged so); ``fields(condition, i, pass)`` adds per-record overrides (failures,
    tokens, slices)."""
    import numpy as np  # here, not at import: conftest stays cheap to load

    rng = np.random.default_rng(seed)
    base = rng.lognormal(0.0, prompt_sd, prompts)
    out = []
    for pass_index in range(passes):
        for load, concurrency in (loads or {"low": 1}).items():
            for cond, factor in factors.items():
                for i in range(prompts):
                    e2e = float(base[i] * factor * rng.lognormal(0.0, noise_sd))
                    out.append(make_record(
                        cond, f"p{i}", block=i, repetition=pass_index, load=load,
                        concurrency=concurrency, e2e_s=e2e,
                        **(fields(cond, i, pass_index) if fields else {}),
                    ))  # fmt: skip
    return out


def sampled_records(
    condition: str, prompt_id: str, outputs: list[list[int]], **overrides: Any
) -> list[RequestRecord]:
    """The sampled pass of one condition on one prompt: one record per output, indexed."""
    return [
        make_record(condition, prompt_id, mode="sampled", sample_index=i, output_ids=ids,
                    **overrides)
        for i, ids in enumerate(outputs)
    ]


def saved_campaign(
    records: list[RequestRecord], directory: Path = Path("."), **meta: Any
) -> SavedCampaign:
    """The campaign ``records`` came from, as judgement reads it. campaign.json facts are
    ``meta``; unless given, every condition in the records ran without error, at the load
    levels the records name."""
    meta.setdefault("conditions", {r.condition: {"error": None} for r in records})
    meta.setdefault("load_levels", {r.load: r.concurrency for r in records})
    return SavedCampaign(directory, CampaignFile.model_validate(meta), records)


# --------------------------------------------------------------------------- pilots

PILOT_DEFAULTS: dict[str, Any] = {
    "target": {"model": "/m/target"},
    "conditions": {"base": {"role": "baseline"}, "cand": {"role": "candidate", "drafter": "/m/d"}},
    "trace": {"files": ["t.jsonl"]},
}


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in: mappings key by key, anything else replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def pilot_data(conditions: Mapping[str, Any] | None = None, **sections: Any) -> dict[str, Any]:
    """A pilot file's content: :data:`PILOT_DEFAULTS` with ``sections`` deep-merged in.
    ``conditions``, given, replace the default ones (their names are the test's)."""
    data = deep_merge(PILOT_DEFAULTS, sections)
    if conditions is not None:
        data["conditions"] = copy.deepcopy(dict(conditions))
    return data


def make_pilot(conditions: Mapping[str, Any] | None = None, **sections: Any) -> Pilot:
    """A validated pilot (see :func:`pilot_data`); nothing is read from disk."""
    return Pilot.model_validate(pilot_data(conditions, **sections))


def endpoint_conditions(urls: Mapping[str, str], protocol: str = "sglang") -> dict[str, Any]:
    """Conditions served by running servers: the first is the baseline, the rest candidates."""
    return {name: {"role": "candidate" if i else "baseline",
                   "endpoint": {"url": url, "protocol": protocol}}
            for i, (name, url) in enumerate(urls.items())}  # fmt: skip


def write_trace(path: Path, n: int, max_new_tokens: int = 4) -> Path:
    """A trace of ``n`` chat prompts ``p0``..., each asking for ``max_new_tokens``."""
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"p{i}", "domain": "chat", "prompt": f"Hello {i}",
                                 "max_new_tokens": max_new_tokens}) + "\n")  # fmt: skip
    return path


def pilot_text(data: Mapping[str, Any]) -> str:
    """``data`` as a pilot file's YAML text, as it is (no schema check)."""
    return yaml.safe_dump(dict(data), sort_keys=False)


def dump_pilot(path: Path, data: Mapping[str, Any]) -> Path:
    """``data`` written as a pilot file at ``path``, as it is (no schema check: for tests of
    what the loader makes of it)."""
    path.write_text(pilot_text(data), encoding="utf-8")
    return path


def write_pilot(
    folder: Path,
    conditions: Mapping[str, Any] | None = None,
    *,
    prompts: int = 4,
    filename: str = "pilot.yaml",
    **sections: Any,
) -> Path:
    """``folder/filename``: a pilot file (see :func:`pilot_data`, checked against the schema)
    replaying ``folder/trace.jsonl``, written beside it with ``prompts`` prompts."""
    folder.mkdir(parents=True, exist_ok=True)
    trace = write_trace(folder / "trace.jsonl", prompts)
    data = pilot_data(conditions, **sections)
    data["trace"] = {**data["trace"], "files": [str(trace)]}
    Pilot.model_validate(data)
    path = folder / filename
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def pilot_variant(
    device: str, order: str, prompts: int, passes: int, tokens: int
) -> dict[str, Any]:
    """The shipped pilot.yaml on ``device``, cut down (``prompts`` prompts, ``passes``
    passes, ``tokens`` new tokens at most), with every path made absolute."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "pilot.yaml").read_text(encoding="utf-8"))
    data["name"] = f"gpu-check-{order}"
    target = data["target"]
    target["device"] = device
    target["model"] = str(ROOT / target["model"])
    for cond in data["conditions"].values():
        if cond.get("drafter"):
            cond["drafter"] = str(ROOT / cond["drafter"])
    trace = data["trace"]
    trace["files"] = [str(ROOT / f) for f in trace["files"]]
    if trace.get("ids"):
        trace["ids"] = trace["ids"][:prompts]
    else:
        trace["limit"] = prompts
    data["max_new_tokens_cap"] = tokens
    data["load"].update(passes=passes, warmup_requests=1, order=order)
    sampled = data.get("sampling", {}).get("sampled")
    if sampled:
        # The smallest budget whose distribution check can still fail (a run refuses less).
        sampled.update(prompts=min(prompts, 2), samples_per_prompt=4, max_new_tokens=8)
    params = data.get("sampling", {}).get("params")
    if params:
        params.update(prompts=1, samples=2)  # each parameter still judged, at a small budget
    data["report"] = {"title": f"GPU check ({device}, {order})", "html": False}
    return data


def embedded_pilot(device: str, quick: bool) -> dict[str, Any]:
    """pilot.yaml on ``device`` with absolute paths (run from any folder); ``quick`` cuts it
    to a few prompts, one pass and short outputs (the CPU dry mode)."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "pilot.yaml").read_text("utf-8"))
    data["name"] = f"embedded-{device.replace(':', '')}"
    target = data["target"]
    target["device"] = device
    target["model"] = str(ROOT / target["model"])
    if device.startswith("cuda"):
        target.pop("threads", None)  # a CPU setting
    for cond in data["conditions"].values():
        if cond.get("drafter"):
            cond["drafter"] = str(ROOT / cond["drafter"])
    trace = data["trace"]
    trace["files"] = [str(ROOT / f) for f in trace["files"]]
    if quick:
        trace["ids"] = trace["ids"][:4]
        data["max_new_tokens_cap"] = 12
        data["load"].update(passes=2, warmup_requests=1)
        data["sampling"]["sampled"].update(prompts=2, samples_per_prompt=4, max_new_tokens=8)
        data["sampling"]["params"].update(prompts=1, samples=2)
    data["report"] = {"title": f"Embedded pilot ({device})"}
    return data
