"""The set-up of a campaign in words: what ran, on what, how the blocks and load levels were
laid out, and what the memory figure measures. Read from campaign.json (what actually ran),
the pilot filling in only what campaign.json of an older campaign lacks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Any

from ..judgement import Figures
from ..pilot.schema import Pilot, level_label
from ..results.campaign_file import CampaignFile
from ..results.folder import SavedCampaign


def level_order(data: SavedCampaign) -> list[tuple[str, str]]:
    """(level name, how its load reads: ``x4`` or ``Poisson 2/s``) in the pilot's order."""
    levels: dict[str, str] = {
        k: level_label(v) for k, v in data.meta.load_levels.items()
    }
    for r in data.records:
        levels.setdefault(r.load, level_label({"rate": r.rate} if r.rate else r.concurrency))
    return list(levels.items()) or [("-", "-")]


ONE_AT_A_TIME = ("transformers",)  # engines that served one request at a time, until their
# fingerprint said "batching"


def _fingerprints(meta: CampaignFile) -> list[dict[str, Any]]:
    return [c.fingerprint for c in meta.conditions.values() if c.fingerprint]


def _common(meta: CampaignFile, key: str) -> str | None:
    values = list(dict.fromkeys(str(fp.get(key)) for fp in _fingerprints(meta)
                                if fp.get(key) is not None))
    return " / ".join(values) if values else None


def engine_name(meta: CampaignFile, pilot: Pilot | None = None) -> str:
    engine = _common(meta, "engine") or (pilot.target.engine if pilot else None) or "unknown"
    version = _common(meta, "version")
    return f"{engine} {version}" if version else engine


def memory_basis(meta: CampaignFile) -> tuple[str, str, str]:
    """(column label, what it measures in a few words, in full) of the conditions' memory
    figure."""
    facts = [fp.get("memory") for fp in _fingerprints(meta)]
    bases = {f.get("basis") for f in facts if isinstance(f, Mapping)}
    kinds = {f.get("kind") for f in facts if isinstance(f, Mapping)}
    notes = list(dict.fromkeys(str(fp.get("memory_method")) for fp in _fingerprints(meta)
                               if fp.get("memory_method")))
    note = "; ".join(notes) or "as the engine reports it"
    if bases == {"weights"}:
        return "weights MiB", "weights + buffers loaded, not a peak", (
            f"{note}: what each condition holds loaded, not a peak (conditions of the "
            "in-process engine share one process, whose peak cannot be told apart)")
    if kinds == {"gpu"}:
        return "peak GPU MiB", "peak GPU memory", note
    if bases == {"rss"}:
        return "peak RSS MiB", "peak resident memory of the server", note
    return "memory MiB", "as each engine reports it", note


def load_meaning(meta: CampaignFile, pilot: Pilot | None = None) -> str:
    """What a load level means for this engine."""
    engine = (_common(meta, "engine") or (pilot.target.engine if pilot else "")).split(" ")[0]
    levels = ", ".join(f"{k} = {level_label(v)}" for k, v in meta.load_levels.items())
    open_loop = any(isinstance(v, Mapping) for v in meta.load_levels.values())
    if engine in ONE_AT_A_TIME and not _common(meta, "batching"):
        text = ("this engine serves one request at a time (batch size 1): at xN, N requests "
                "are in flight and wait their turn, so latency there includes queueing and "
                "a higher level measures queueing, not batching")
    elif engine.startswith("endpoint"):
        text = "xN keeps N requests in flight at the endpoint; how it batches them is its own"
    else:
        text = ("xN keeps N requests in flight; the engine batches them together (continuous "
                "batching), so a higher level measures speculation under a larger batch")
    if open_loop:
        text += ("; Poisson r/s sends requests at random times averaging r per second, "
                 "whatever the engine's pace (<=xN: at most N in flight)")
    return f"{levels}: {text}"


def _when(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def started(meta: CampaignFile) -> str | None:
    """The campaign's start, UTC (what a report dates itself by: judging again changes
    nothing in it)."""
    return _when(meta.started_at)


def hardware(meta: CampaignFile) -> str:
    """The device and the host, without repeating what says the same (a CPU's processor
    name is often just its architecture)."""
    device = _common(meta, "device_name") or _common(meta, "device")
    host = meta.host
    machine, cpus = host.get("machine"), host.get("cpus")
    parts = [device] if device else []
    if machine and machine != device:
        parts.append(str(machine))
    text = ", ".join(parts) or "unknown"
    return f"{text} ({cpus} CPUs)" if cpus else text


def _design(meta: CampaignFile, order: str | None, long: bool = False) -> str:
    """Passes, boots and order in words (the replay plan's shape)."""
    plan = meta.plan
    if plan is None:  # recorded before replay plans
        return f"{meta.blocks} block(s)" + (f" {order}" if order else "")
    text = f"{plan.passes} pass(es)"
    if plan.boots_per_condition > 1:
        text += f" x {plan.boots_per_condition} boots per condition"
    text += f" {plan.order}"
    if long:
        sizes = ", ".join(f"{lvl}: {len(bs)} blocks of ~{max(len(b) for b in bs)} prompts"
                          for lvl, bs in plan.blocks.items() if bs)
        text += (f"; per pass, each block of prompts is replayed by every condition in turn "
                 f"(counterbalanced order): {sizes}")
        if meta.stopped_after_block:
            text += f"; stopped early after pass {meta.stopped_after_block} (decided)"
    return text


def measured_load(figures: Sequence[Figures]) -> str | None:
    """Each level's measured in-flight load, over the conditions (from the records):
    ``x4 3.97-3.99 in flight``; an open-loop level with its achieved rate."""
    parts = []
    for level in dict.fromkeys(f.load for f in figures):
        mine = [f for f in figures if f.load == level and f.in_flight_mean is not None]
        if not mine:
            continue
        lo, hi = (min(f.in_flight_mean or 0.0 for f in mine),
                  max(f.in_flight_mean or 0.0 for f in mine))
        label = mine[0].load_label
        text = (level if label == level else f"{level} ({label})") + f" {lo:.2f}" + (
            f"-{hi:.2f}" if hi - lo >= 0.005 else "")
        rates = [f.achieved_rate for f in mine if f.achieved_rate is not None]
        if rates and mine[0].load_label.startswith("Poisson"):
            text += f" at {min(rates):.2f}" + (f"-{max(rates):.2f}" if max(rates) - min(rates)
                                                >= 0.005 else "") + "/s achieved"
        parts.append(text)
    return "measured in flight: " + ", ".join(parts) if parts else None


def passes_text(ending: Mapping[str, Any], order: str | None = None) -> str:
    """The passes run of those planned, in words: ``1 of 4 passes interleaved (stopped
    early; not measured: ...)``; ``ending``: summary.json's ``campaign`` (or
    ``CampaignEnd.as_dict()``)."""
    planned = ending.get("passes_planned")
    text = f"{ending.get('passes_run')} of {planned} pass{'' if planned == 1 else 'es'}"
    if order:
        text += f" {order}"
    notes = []
    if ending.get("stopped_early"):
        notes.append("stopped early")
    elif ending.get("status") not in (None, "complete"):
        notes.append(str(ending.get("status")))
    if ending.get("not_measured"):
        notes.append("not measured: " + ", ".join(map(str, ending["not_measured"])))
    return text + (f" ({'; '.join(notes)})" if notes else "")


def short_setup(meta: CampaignFile, pilot: Pilot | None = None,
                with_hardware: bool = True, figures: Sequence[Figures] = (),
                ending: Mapping[str, Any] | None = None) -> str:
    """One line: engine, device, dtype, threads, passes and order (with ``ending``, the
    passes run of those planned, an early stop and what it left unmeasured), warm-up, the
    load each level measured."""
    parts = [f"{engine_name(meta, pilot)} on {hardware(meta)}" if with_hardware
             else engine_name(meta, pilot)]
    dtype = _common(meta, "dtype")
    if dtype:
        parts.append(dtype)
    threads = _common(meta, "threads")
    if threads:
        parts.append(f"{threads} thread{'' if str(threads) == '1' else 's'}")
    order = meta.order or (pilot.load.order if pilot else None)
    if ending is not None:
        boots = meta.plan.boots_per_condition if meta.plan is not None else 1
        parts.append(passes_text(ending, (f"over {boots} boots " if boots > 1 else "")
                                 + ((meta.plan.order if meta.plan else order) or "")))
    else:
        parts.append(_design(meta, order))
    warm = meta.warmup_requests if meta.warmup_requests is not None else (
        pilot.load.warmup_requests if pilot else None)
    if warm is not None:
        parts.append(f"{warm} warm-up request(s)")
    line = ", ".join(parts)
    load = measured_load(figures)
    return f"{line}; {load}" if load else line


def _agreed(meta: CampaignFile, key: str, differs: list[str]) -> Any:
    """The conditions' common fingerprint value of ``key``; None (and ``key`` in ``differs``)
    when they disagree, None when none says."""
    values = [fp[key] for fp in _fingerprints(meta) if fp.get(key) is not None]
    if len({repr(v) for v in values}) > 1:
        differs.append(key)
        return None
    return values[0] if values else None


def _count(value: Any) -> int | None:
    """A count as recorded (some servers report one as text); None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, str) and value.strip().isdigit() else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _speculation(fp: Mapping[str, Any]) -> dict[str, Any] | None:
    """A speculating condition's settings: as read back from the engine where it says, as
    asked otherwise; None without speculation."""
    facts = fp.get("speculation")
    side = {}
    if isinstance(facts, Mapping):
        ran, asked = facts.get("ran") or {}, facts.get("asked") or {}
        side = {k: ran.get(k) if ran.get(k) is not None else asked.get(k)
                for k in ("algorithm", "num_steps", "eagle_topk", "num_draft_tokens", "adaptive")}
    if not fp.get("drafter") and not any(v is not None for v in side.values()):
        return None
    if side.get("num_draft_tokens") is None:
        side["num_draft_tokens"] = fp.get("num_draft_tokens")
    for key in ("num_steps", "eagle_topk", "num_draft_tokens"):
        side[key] = _count(side.get(key))
    adaptive = side.get("adaptive")
    return {**side, "algorithm": _text(side.get("algorithm")),
            "adaptive": adaptive if isinstance(adaptive, bool) else None,
            "draft_loop": _text(fp.get("draft_loop"))}


def setup_facts(meta: CampaignFile, pilot: Pilot | None = None) -> dict[str, Any]:
    """The set-up as fields (summary.json's ``setup_facts``), from campaign.json."""
    differs: list[str] = []
    host = meta.host
    memory = [fp.get("memory") for fp in _fingerprints(meta)]
    gpus = list(dict.fromkeys(str(m["device"]) for m in memory
                              if isinstance(m, Mapping) and m.get("kind") == "gpu"
                              and m.get("device")))
    plan = meta.plan
    engine = _agreed(meta, "engine", differs) or (pilot.target.engine if pilot else None)

    def text(key: str) -> str | None:
        return _text(_agreed(meta, key, differs))

    return {
        "engine": _text(engine),
        "engine_version": text("version"),
        "torch": text("torch"),
        "hardware": {"machine": _text(host.get("machine")), "cpus": _count(host.get("cpus")),
                     "node": _text(host.get("node")), "device_name": text("device_name"),
                     "gpu": " / ".join(gpus) or None},
        "device": text("device"),
        "dtype": text("dtype"),
        "quantization": text("quantization"),
        "threads": _count(_agreed(meta, "threads", differs)),
        "context_length": _count(_agreed(meta, "context_length", differs)),
        "sampling": dict(meta.sampling),
        "speculation": {name: spec for name, info in meta.conditions.items()
                        if (spec := _speculation(info.fingerprint)) is not None},
        "passes": plan.passes if plan is not None else meta.blocks,
        "boots_per_condition": plan.boots_per_condition if plan is not None else 1,
        "order": meta.order or (plan.order if plan is not None else None),
        "warmup_requests": meta.warmup_requests,
        "load_levels": dict(meta.load_levels),
        "prompts": len(meta.prompt_ids),
        "differs": differs,
    }


def models(meta: CampaignFile, pilot: Pilot | None = None) -> dict[str, Any]:
    """The target and each condition's drafter, with the digest the engine took of its
    files (summary.json's ``models``)."""
    fps = {name: info.fingerprint for name, info in meta.conditions.items()}
    differs: list[str] = []
    target = {"path": _text(_agreed(meta, "model", differs)
                            or (pilot.target.model if pilot else None)),
              "digest": _text(_agreed(meta, "model_digest", differs))}
    drafters = {}
    for name, fp in fps.items():
        cond = pilot.conditions.get(name) if pilot else None
        path = fp.get("drafter") or (str(cond.drafter) if cond and cond.drafter else None)
        if path:
            drafters[name] = {"path": str(path), "digest": _text(fp.get("drafter_digest"))}
    return {"target": target, "drafters": drafters}


def setup_rows(meta: CampaignFile, pilot: Pilot | None = None,
               figures: Sequence[Figures] = ()) -> list[tuple[str, str]]:
    """(what, value) rows of the set-up block every report carries (with the figures, the
    load each level measured)."""
    rows: list[tuple[str, str]] = [("engine", engine_name(meta, pilot))]
    torch = _common(meta, "torch")
    if torch:
        rows[0] = ("engine", f"{rows[0][1]} (torch {torch})")
    rows.append(("hardware", hardware(meta)))
    for key, label in (("dtype", "dtype"), ("quantization", "quantization"),
                       ("threads", "threads"), ("context_length", "context length")):
        value = _common(meta, key)
        if value:
            rows.append((label, value))
    for name, info in meta.conditions.items():
        fp = info.fingerprint
        if fp.get("drafter"):
            k = fp.get("num_draft_tokens")
            loop = {"engine": "the engine's draft loop",
                    "transformers": "transformers' assisted generation",
                    }.get(str(fp.get("draft_loop")))
            # The folder's name, not the runner's absolute path (summary.json's `models`
            # has the path): the rows are read in a PR comment.
            digest = fp.get("drafter_digest")
            rows.append((f"drafter of {name}", PurePath(str(fp["drafter"])).name
                         + (f" (digest {digest})" if digest else "")
                         + (f", {k} tokens drafted per step" if k else "")
                         + (f" ({loop})" if loop else "")))
    order = meta.order or (pilot.load.order if pilot else None)
    rows.append(("replay", _design(meta, order, long=True)))
    warm = meta.warmup_requests if meta.warmup_requests is not None else (
        pilot.load.warmup_requests if pilot else None)
    if warm is not None:
        rows.append(("warm-up", f"{warm} request(s) per condition after boot, not recorded"))
    rows.append(("load levels", load_meaning(meta, pilot)))
    load = measured_load(figures)
    if load:
        fillers = sum(f.fillers for f in figures)
        rows.append(("measured load", load.removeprefix("measured in flight: ")
                     + " requests in flight on average over each level's measured requests"
                     + (f" ({fillers} fillers sent to hold the load, recorded, not judged)"
                        if fillers else "")))
    rows.append(("prompts", f"{len(meta.prompt_ids)} (trace {str(meta.trace_hash or '')[:12]})"))
    sampled = meta.sampling.get("sampled") if isinstance(meta.sampling, Mapping) else None
    if isinstance(sampled, Mapping) and sampled.get("enabled"):
        rows.append(("sampled pass", f"temperature {sampled.get('temperature')}, top-p "
                     f"{sampled.get('top_p')}, {sampled.get('samples_per_prompt')} samples x "
                     f"{sampled.get('prompts') or 'all'} prompts"))
    label, _, note = memory_basis(meta)
    rows.append((label, note))
    when = started(meta)
    if when:
        rows.append(("started", when))
    return rows


def shards_line(summary: Mapping[str, Any]) -> str | None:
    """A merged campaign's shards in a line (None for a one-machine run)."""
    shards = summary.get("shards") or []
    if not shards:
        return None
    parts = [f"shard {s['index']} on {s.get('node') or 'an unknown host'}: {s['status']}"
             + (f" ({s['note']})" if s.get("note") else "") for s in shards]
    line = f"Merged from {len(shards)} shards: " + "; ".join(parts)
    if summary.get("merge_note"):
        note = str(summary["merge_note"])
        mixed = "heterogeneous shards" in note
        line += f". {note}" + (" (each machine a stratum of its own passes)" if mixed else "")
        speeds = machine_speeds(shards) if mixed else None
        if speeds:
            line += f"; machine speedups: {speeds}"
    return line


def machine_speeds(shards: list[Mapping[str, Any]]) -> str | None:
    """Each shard's own speedup per candidate, in words ("shard 1 1.31x, shard 2 1.12x";
    the candidate named first when there are several); None when no shard has one."""
    names = list(dict.fromkeys(c for s in shards for c in (s.get("speedup") or {})))
    if not names:
        return None

    def cell(s: Mapping[str, Any], name: str) -> str:
        value = (s.get("speedup") or {}).get(name)
        return f"shard {s['index']} " + ("n/a" if value is None else f"{value:.2f}x")

    parts = [(f"{name} " if len(names) > 1 else "")
             + ", ".join(cell(s, name) for s in shards) for name in names]
    return "; ".join(parts)
