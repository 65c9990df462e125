"""Pooling shards into one judged campaign (``python -m pytest_osprey merge OUT DIR...``).

Shards of one plan (``--shard K/N``, campaign/shards.py) replayed disjoint passes of the same
seeded plan, every condition on every machine. Their records pool into one campaign without
renumbering: a pass, and so every time unit (boot, pass, block) the speed test counts, is one
machine's; pairs never cross machines, so a slow machine cannot fake a speedup. The merged
folder is an ordinary results folder (campaign.json, records.jsonl, summary.json, report.md,
report.html) judged as a one-machine run of the same pilot would be; each record names its
shard and campaign.json the shards (``merged``) and what the merge lacks or mixes
(``merge_note``).

Refused (:class:`MergeError`, one line): folders that are not shards, shards of different
pilots, configs, traces or plans, a shard given twice, missing or incomplete shards (unless
``partial``: then the campaign is labelled partial and no verdict is claimed), and shards
whose hardware, engine version or model digests differ (unless ``heterogeneous``: each
machine stays its own stratum, as its passes are, and the difference is reported).
"""

from __future__ import annotations

import secrets
import shutil
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .exit_codes import EXIT_INTERRUPTED
from .judgement import Diagnosis, diagnose_all
from .pilot import ConfigError
from .pilot.loading import load_pilot_text
from .results import Preflight, SavedCampaign, read_preflight
from .results.campaign_file import CampaignFile, ConditionRun, MergedShard, stopped_conditions
from .results.records import RecordWriter
from .results.scores import SCORES_FILE, ScoreWriter
from .run import PilotRun
from .run_folders import FolderError, fresh_results
from .run_inputs import ReusedCampaign, UsageError, open_saved

__all__ = ["MergeError", "Merged", "merge_shards"]

# Host facts that make two machines different hardware (the node name never does).
_HOST_KEYS = ("machine", "processor", "cpus", "system")


class MergeError(ValueError):
    """Shards that cannot be merged; the message is one line naming the folder and why."""


@dataclass
class Merged:
    """A merged, judged campaign."""

    directory: Path
    run: PilotRun
    reports: list[Path]
    diagnoses: list[Diagnosis]
    partial: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """The run's status as every entry point gives it (:mod:`pytest_osprey.exit_codes`);
        a partial merge claims no verdict (2, the code ``report`` gives the same folder)."""
        if self.partial:
            return EXIT_INTERRUPTED
        return self.run.exit_code()


@dataclass(frozen=True)
class _Shard:
    directory: Path
    data: SavedCampaign
    note: str | None  # why its campaign is incomplete

    @property
    def index(self) -> int:
        assert self.data.meta.shard is not None
        return self.data.meta.shard.index


def _open(directory: Path) -> _Shard:
    if not (directory / "campaign.json").is_file():
        raise MergeError(f"{directory}: no campaign.json there (not a results folder)")
    try:
        data, note = open_saved(directory)
    except UsageError as exc:
        raise MergeError(str(exc)) from None
    if data.meta.shard is None:
        raise MergeError(f"{directory}: not a shard (a whole run: its campaign.json names no "
                         "shard; shards are run with --shard K/N)")
    stopped = stopped_conditions(data.meta)
    if note is None and stopped:
        note = "; ".join(f"condition {c!r} stopped ({why.splitlines()[0]})"
                         for c, why in stopped.items())
    return _Shard(directory, data, note)


def _same(shards: list[_Shard]) -> None:
    """One pilot, one config, one trace, one plan, one split; each shard once."""
    first = shards[0]
    m0 = first.data.meta
    checks: list[tuple[str, Any]] = [
        ("pilot", lambda m: m.pilot_name), ("config", lambda m: m.config_hash),
        ("trace", lambda m: m.trace_hash),
        ("replay plan", lambda m: m.plan.model_dump(mode="json") if m.plan else None),
        ("shard count", lambda m: m.shard.count if m.shard else None),
    ]
    folders: dict[Path, Path] = {}
    runs: dict[str, Path] = {}
    indices: dict[int, Path] = {}
    for s in shards:
        meta = s.data.meta
        for what, get in checks:
            if get(meta) != get(m0):
                raise MergeError(f"{s.directory}: a shard of a different {what} than "
                                 f"{first.directory} ({_short(get(meta))} vs "
                                 f"{_short(get(m0))}); only shards of one pilot run merge")
        twice = folders.get(s.directory.resolve()) or (
            runs.get(meta.run_id) if meta.run_id else None)
        if twice is not None:
            raise MergeError(f"{s.directory}: given twice (the same shard campaign as {twice})")
        if s.index in indices:
            raise MergeError(f"shard {s.index} given twice: {indices[s.index]} and "
                             f"{s.directory} (two campaigns of the same shard)")
        folders[s.directory.resolve()] = indices[s.index] = s.directory
        if meta.run_id:
            runs[meta.run_id] = s.directory


def _short(value: Any) -> str:
    text = str(value)
    return text[:12] if len(text) > 40 else text


def _machine(s: _Shard) -> dict[str, Any]:
    meta = s.data.meta
    assert meta.shard is not None
    return {"host": {k: meta.host.get(k) for k in _HOST_KEYS},
            **{c: facts for c, facts in sorted(meta.shard.hardware.items())}}


def _heterogeneity(shards: list[_Shard]) -> str | None:
    """What differs between the shards' machines, in a line (None: nothing)."""
    first = _machine(shards[0])
    diffs: list[str] = []
    for s in shards[1:]:
        other = _machine(s)
        for part in sorted(set(first) | set(other)):
            a, b = first.get(part, {}), other.get(part, {})
            for k in sorted(set(a) | set(b)):
                if a.get(k) != b.get(k):
                    diffs.append(f"shard {s.index} {part}.{k} {_short(b.get(k))!s} vs shard "
                                 f"{shards[0].index} {_short(a.get(k))!s}")
    return "; ".join(diffs) or None


def _merged_meta(shards: list[_Shard], expected: int, run_id: str, missing: list[int],
                 note: str | None, why_missing: dict[int, str]) -> CampaignFile:
    base = shards[0].data.meta
    conditions: dict[str, ConditionRun] = {}
    for name in base.conditions:
        runs = [(s.index, s.data.meta.conditions[name]) for s in shards
                if name in s.data.meta.conditions]
        errors = [f"shard {k}: {c.error}" for k, c in runs if c.error]
        boots = [c.boot_s for _, c in runs if c.boot_s is not None]
        peaks = [c.peak_memory_mb for _, c in runs if c.peak_memory_mb is not None]
        conditions[name] = runs[0][1].model_copy(update=dict(error="; ".join(errors) or None,
                                       boot_s=max(boots) if boots else None,
                                       peak_memory_mb=max(peaks) if peaks else None))
    merged = [MergedShard(index=s.index, source=str(s.directory), run_id=s.data.meta.run_id,
                          status="complete" if s.note is None else "incomplete",
                          node=s.data.meta.host.get("node"),
                          passes=list(s.data.meta.shard.passes) if s.data.meta.shard else [],
                          greedy_requests=sum(1 for r in s.data.records if r.mode == "greedy"),
                          hardware=_machine(s), note=s.note) for s in shards]
    merged += [MergedShard(index=k, note="missing: " + why_missing.get(
        k, "no results folder given")) for k in missing]
    merged.sort(key=lambda m: m.index)
    lacking = [m for m in merged if m.status != "complete"]
    status = "complete" if not lacking else "interrupted"
    reason = None
    if lacking:
        reason = "merged partially: " + "; ".join(
            f"shard {m.index} of {expected} {m.note or m.status}" for m in lacking)
    starts = [s.data.meta.started_at for s in shards if s.data.meta.started_at is not None]
    ends = [s.data.meta.ended_at for s in shards if s.data.meta.ended_at is not None]
    return base.model_copy(update={
        "run_id": run_id, "shard": None, "merged": merged, "merge_note": note,
        "conditions": conditions, "status": status, "stop_reason": reason,
        "schedule": [e for s in shards for e in s.data.meta.schedule],
        # Looks taken across shards (a driver's rule) are every shard's, recorded alike.
        "sequential": base.sequential, "early_stop": any(s.data.meta.early_stop for s in shards),
        "stopped_after_block": max((s.data.meta.stopped_after_block or 0 for s in shards),
                                   default=0) or None,
        "started_at": min(starts, default=None), "ended_at": max(ends, default=None),
        "host": {}, "writer_pid": None,
    })


def merge_shards(out: Path, directories: list[Path], *, partial: bool = False,
                 heterogeneous: bool = False,
                 missing_notes: dict[int, str] | None = None) -> Merged:
    """Check, pool and judge the shards in ``directories`` into the new folder ``out``;
    ``missing_notes``: why a shard is missing (a launcher whose worker died), by index."""
    if not directories:
        raise MergeError("merge: no shard folders given")
    shards = [_open(d) for d in directories]
    _same(shards)
    shards.sort(key=lambda s: s.index)
    first = shards[0].data.meta.shard
    assert first is not None
    present = {s.index for s in shards}
    missing = [k for k in range(1, first.count + 1) if k not in present]
    incomplete = [s for s in shards if s.note is not None]
    if (missing or incomplete) and not partial:
        parts = ([f"shard{'s' if len(missing) > 1 else ''} "
                  f"{', '.join(map(str, missing))} of {first.count} missing"] if missing else [])
        parts += [f"shard {s.index} incomplete ({s.note})" for s in incomplete]
        raise MergeError(f"merge: {'; '.join(parts)}; merge with --partial to judge what is "
                         "there (labelled partial, no verdict)")
    mixed = _heterogeneity(shards)
    if mixed and not heterogeneous:
        raise MergeError(f"merge: the shards ran on different machines or software ({mixed}); "
                         "--allow-heterogeneous merges them, each machine a stratum")
    note = f"heterogeneous shards: {mixed}" if mixed else None
    try:
        out = fresh_results(out, "`python -m pytest_osprey report DIR`")
    except FolderError as exc:
        raise MergeError(str(exc)) from None
    run_id = (datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-merged-"
              + secrets.token_hex(3))
    meta = _merged_meta(shards, first.count, run_id, missing, note, missing_notes or {})
    quality_from = shards[0].index  # the sampled passes ran on shard 1 (the lowest present)
    writer = RecordWriter(out / "records.jsonl")
    try:
        for s in shards:
            for r in s.data.sent:
                if r.mode != "greedy" and s.index != quality_from:
                    continue
                writer.write(replace(r, run_id=run_id, shard=s.index))
    finally:
        writer.close()
    # The target's scores of the sampled passes (shard quality_from's), under the new run id.
    scores = next(s for s in shards if s.index == quality_from).data.scores
    if scores:
        score_writer = ScoreWriter(out / SCORES_FILE)
        try:
            score_writer.write([replace(line, run_id=run_id) for line in scores])
        finally:
            score_writer.close()
    meta.save(out)
    source = shards[0].directory
    for name in ("pilot.yaml", "preflight.json"):
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)
    return _judge(out, meta)


def _judge(out: Path, meta: CampaignFile) -> Merged:
    data, partial = open_saved(out)
    try:
        pilot = load_pilot_text(meta.pilot_text or "", f"{out / 'campaign.json'}")
        preflight = read_preflight(out / "preflight.json") or Preflight()
    except (ConfigError, ValueError) as exc:
        raise MergeError(f"{out}: {exc}") from None
    saved = ReusedCampaign(out, data, partial, preflight, "the pilot the shards ran")
    run = PilotRun.from_saved(saved, pilot, results=out)
    judgement = run.judgement()
    notes = list(run.notes)
    if meta.merge_note:
        notes.insert(0, meta.merge_note)
    diagnoses = diagnose_all(run.pilot, judgement.verdicts, list(judgement.results.values()),
                             judgement.figures, run.judged_data or data)
    return Merged(out, run, list(run.reports), diagnoses, partial, notes)
