"""Pooling shards into one judged campaign (``python -m pytest_osprey merge OUT DIR...``).

Shards of one plan (``--shard K/N``, shards/plan.py) replayed disjoint passes of the same
seeded plan, every condition on every machine. Their records pool into one campaign without
renumbering: a pass, and so every time unit (boot, pass, block) the speed test counts, is one
machine's; pairs never cross machines, so a slow machine cannot fake a speedup. The merged
folder is an ordinary results folder (campaign.json, records.jsonl, summary.json, report.md,
report.html) judged as a one-machine run of the same pilot would be; each record names its
shard and campaign.json the shards (``merged``) and what the merge lacks or mixes
(``merge_note``).

Nothing a shard's folder says is taken on trust where it can be checked:

- its pilot text against ``pilot_text_sha256`` and its records.jsonl against
  ``records_sha256`` (both written by the run; a folder from before the records hash is
  merged with a note that its records are unverified);
- its records against its plan: every record of a condition, load level and prompt the
  campaign names, of a pass in the shard's declared share (the passes ``K/N`` gives), and as
  many per pass, level and condition as the plan's blocks hold. A shard short of its plan
  is incomplete whatever its status field says;
- its trace files, where they are readable here, against ``trace_hash`` (a note when not).

Refused (:class:`MergeError`, one line): folders that are not shards or cannot be read (any
malformed file, named), shards of different pilots, configs, traces or plans, a shard given
twice, a pilot text or records changed since the run, records outside the shard's plan or
share, missing or incomplete shards (unless ``partial``: then the campaign is labelled
partial and no verdict is claimed), and shards whose hardware, engine version, model digests
or pytest-osprey version differ (unless ``heterogeneous``: each machine stays its own
stratum, as its passes are, and the difference is reported). The merged folder is written
into a temporary folder beside OUT and renamed to OUT at the end: a merge that fails (a full
disk included) leaves no half-written folder. OUT never resolves to, into or above a shard.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..exit_codes import EXIT_INTERRUPTED
from ..judgement import Diagnosis
from ..pilot import ConfigError
from ..pilot.loading import load_pilot_text
from ..results import Preflight, SavedCampaign, read_preflight
from ..results.campaign_file import (
    CampaignFile,
    ConditionRun,
    MergedShard,
    file_sha256,
    stopped_conditions,
    text_sha256,
)
from ..results.records import RecordWriter
from ..results.scores import SCORES_FILE, ScoreWriter
from ..run.folders import FolderError, claim, one_line
from ..run.inputs import ReusedCampaign, UsageError, open_saved
from ..run.pilot_run import PilotRun
from .plan import Shard, ShardError

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
    unverified: tuple[str, ...] = ()  # what could not be checked, in words

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
    meta = data.meta
    if meta.shard is None:
        raise MergeError(f"{directory}: not a shard (a whole run: its campaign.json names no "
                         "shard; shards are run with --shard K/N)")
    try:  # read now: the merged folder takes shard 1's, and a bad one is named as the shard's
        read_preflight(directory / "preflight.json")
    except ValueError as exc:
        raise MergeError(" ".join(str(exc).split())) from None
    unverified = _verify(directory, data)
    _in_plan(directory, data)
    stopped = stopped_conditions(meta)
    if note is None and stopped:
        note = "; ".join(f"condition {c!r} stopped ({why.splitlines()[0]})"
                         for c, why in stopped.items())
    short = _short_of_plan(data)
    if short:
        note = f"{note}; {short}" if note else short
    return _Shard(directory, data, note, tuple(unverified))


def _verify(directory: Path, data: SavedCampaign) -> list[str]:
    """Check the shard's files against the hashes its run wrote (a changed file is refused);
    what cannot be checked, in words."""
    meta, where = data.meta, directory / "campaign.json"
    unverified: list[str] = []
    if meta.pilot_text is None or meta.pilot_text_sha256 is None:
        unverified.append("its pilot text (no pilot_text_sha256)")
    elif text_sha256(meta.pilot_text) != meta.pilot_text_sha256:
        raise MergeError(f"{where}: pilot_text was changed after the run (its sha256 no longer "
                         "matches pilot_text_sha256); only shards as their runs left them merge")
    if meta.pilot_text is not None and meta.config_hash is not None:
        # The pilot as parsed, against the digest the run took of it (the text and its hash
        # rewritten together still do not give the run's config_hash).
        try:
            digest = load_pilot_text(meta.pilot_text, str(where)).digest()
        except (ConfigError, ValueError) as exc:
            raise MergeError(f"{where}: pilot_text: {' '.join(str(exc).split())}") from None
        if digest != meta.config_hash:
            raise MergeError(f"{where}: pilot_text is not the pilot the run digested (its "
                             f"digest {digest[:12]}, config_hash {meta.config_hash[:12]}); "
                             "only shards as their runs left them merge")
    records = directory / "records.jsonl"
    if meta.records_sha256 is None:
        unverified.append("its records (no records_sha256: a folder from an older version, "
                          "or a run that never ended)")
    else:
        try:
            found = file_sha256(records)
        except OSError as exc:
            raise MergeError(one_line(exc, f"{records}: cannot read")) from None
        if found != meta.records_sha256:
            raise MergeError(f"{records}: changed since its run (sha256 "
                             f"{str(found)[:12]}, the run wrote {meta.records_sha256[:12]}): "
                             "a copy cut short, or records edited; copy the shard again")
    if meta.trace_files and all(Path(f).is_file() for f in meta.trace_files) \
            and data.prompts is None:
        unverified.append("its trace (the trace files here differ from the run's trace_hash: "
                          "correctness cannot read its prompts)")
    return unverified


def _in_plan(directory: Path, data: SavedCampaign) -> None:
    """Refuse a shard whose declared share is not its index's, or whose records name a
    pass, condition, load level or prompt outside what its campaign.json declares."""
    meta, shard = data.meta, data.meta.shard
    assert shard is not None
    where = directory / "campaign.json"
    if meta.plan is not None:
        try:
            share = Shard(shard.index, shard.count).passes(meta.plan.passes)
        except ShardError as exc:
            raise MergeError(f"{where}: shard: {exc}") from None
        if shard.passes != share:
            raise MergeError(f"{where}: shard {shard.index}/{shard.count} declares passes "
                             f"{shard.passes}, but its share of the plan's {meta.plan.passes} "
                             f"is {share}: a shard relabelled or edited")
    declared = {"condition": set(meta.conditions), "load": set(meta.load_levels),
                "prompt_id": set(meta.prompt_ids)}
    passes = set(shard.passes)
    records = directory / "records.jsonl"
    for r in data.sent:
        for what, allowed in declared.items():
            value = getattr(r, what)
            if allowed and value not in allowed:
                raise MergeError(f"{records}: a record of {what} {value!r}, which its "
                                 "campaign.json does not declare (records of another run)")
        if r.mode == data.timed_mode and not r.filler and r.repetition not in passes:
            raise MergeError(f"{records}: records of pass {r.repetition}, outside the shard's "
                             f"declared passes {sorted(passes)} (a shard relabelled as another, "
                             "or records of another shard)")


def _short_of_plan(data: SavedCampaign) -> str | None:
    """Where the shard's timed records fall short of its plan, in a line (None: they do not).

    Each (condition, boot, pass, load level) due holds as many timed requests as the plan's
    blocks at that level (every partition of a level has the same block sizes). A condition
    that never ran (its error recorded) is not due; after a decided early stop only the
    (boot, pass) units it reached are."""
    meta, shard = data.meta, data.meta.shard
    if meta.plan is None or shard is None:
        return None
    per_level = {level: sum(len(b) for b in blocks) for level, blocks in meta.plan.blocks.items()}
    due_conditions = [c for c, info in meta.conditions.items() if info.error is None]
    units = [(boot, p) for boot in range(meta.plan.boots_per_condition) for p in shard.passes]
    got = Counter((r.condition, r.boot, r.repetition, r.load) for r in data.records
                  if r.mode == data.timed_mode)
    if meta.stopped_after_block is not None:
        reached = {(b, p) for (_, b, p, _) in got}
        last = max((units.index(u) for u in reached if u in units), default=-1)
        units = units[:last + 1]
    expected = found = 0
    gaps: list[str] = []
    for cond in due_conditions:
        for boot, p in units:
            for level, n in per_level.items():
                have = got.get((cond, boot, p, level), 0)
                expected += n
                found += min(have, n)
                if have != n:
                    gaps.append(f"{cond} pass {p}" + (f" boot {boot}" if boot else "")
                                + f" at {level}: {have} of {n}")
    if not gaps:
        return None
    shown = ", ".join(gaps[:3]) + (f" and {len(gaps) - 3} more" if len(gaps) > 3 else "")
    return (f"short of its plan: its records hold {found} of the {expected} timed requests "
            f"its plan gives it ({shown})")


def _same(shards: list[_Shard]) -> None:
    """One pilot, one config, one trace, one plan, one split; each shard once."""
    first = shards[0]
    m0 = first.data.meta
    checks: list[tuple[str, Any]] = [
        ("pilot", lambda m: m.pilot_name), ("config", lambda m: m.config_hash),
        ("trace", lambda m: m.trace_hash), ("prompt list", lambda m: m.prompt_ids),
        ("pilot text", lambda m: text_sha256(m.pilot_text)),
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
            "tool": {"pytest-osprey": meta.tool_version},
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
    _check_out(out, directories)
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
    notes = [f"heterogeneous shards: {mixed}"] if mixed else []
    notes += [f"shard {s.index} unverified: {', '.join(s.unverified)}" for s in shards
              if s.unverified]
    run_id = (datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-merged-"
              + secrets.token_hex(3))
    meta = _merged_meta(shards, first.count, run_id, missing, "; ".join(notes) or None,
                        missing_notes or {})
    work = _work_folder(out)
    try:
        merged = _write(work, meta, shards)
        try:
            os.rename(work, out)  # onto nothing, or onto an empty folder: atomic
        except OSError as exc:
            raise MergeError(one_line(exc, f"merged folder {out}: cannot put it in place")
                             ) from None
    finally:
        shutil.rmtree(work.parent, ignore_errors=True)  # the work folder's holder (emptied)
    merged.directory = out
    merged.reports = [out / p.relative_to(work) for p in merged.reports]
    merged.notes = [n.replace(str(work), str(out)) for n in merged.notes]
    return merged


def _check_out(out: Path, directories: list[Path]) -> None:
    """OUT is new (or an empty folder) and neither a shard, inside one nor above one."""
    try:
        target = out.resolve()
        for d in directories:
            source = d.resolve()
            if target == source or source in target.parents or target in source.parents:
                raise MergeError(f"merged folder {out}: it is, or holds, or lies inside the "
                                 f"shard folder {d}; an output never replaces an input: "
                                 "choose a new folder")
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            what = "a file" if not out.is_dir() else "not empty"
            raise MergeError(f"merged folder {out}: {what}; an earlier run's results are never "
                             "written over: choose a new folder (or remove this one)")
    except (OSError, RuntimeError) as exc:  # a symlink loop, a folder that cannot be read
        raise MergeError(one_line(exc, f"merged folder {out}: cannot check it")) from None


def _work_folder(out: Path) -> Path:
    """A new folder named as ``out`` inside a new hidden one beside it (the reports name
    their folder), claimed for this merge."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        holder = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.merging-"))
    except OSError as exc:
        raise MergeError(one_line(exc, f"merged folder {out}: cannot create beside it")
                         ) from None
    try:
        work = holder / out.name
        work.mkdir()
        claim(work)
    except (OSError, FolderError) as exc:
        shutil.rmtree(holder, ignore_errors=True)
        raise MergeError(one_line(exc, f"merged folder {out}: cannot create beside it")
                         ) from None
    return work


def _write(work: Path, meta: CampaignFile, shards: list[_Shard]) -> Merged:
    """The merged records, campaign.json, pilot and preflight written into ``work``, judged."""
    quality_from = shards[0].index  # the sampled passes ran on shard 1 (the lowest present)
    run_id = str(meta.run_id)
    try:
        with RecordWriter(work / "records.jsonl") as writer:
            for s in shards:
                for r in s.data.sent:
                    if r.mode != "greedy" and s.index != quality_from:
                        continue
                    writer.write(replace(r, run_id=run_id, shard=s.index))
        meta.records_sha256 = file_sha256(work / "records.jsonl")
        # The target's scores of the sampled passes (shard quality_from's), under the new run id.
        scores = next(s for s in shards if s.index == quality_from).data.scores
        if scores:
            score_writer = ScoreWriter(work / SCORES_FILE)
            try:
                score_writer.write([replace(line, run_id=run_id) for line in scores])
            finally:
                score_writer.close()
        meta.save(work)
        source = shards[0].directory
        for name in ("pilot.yaml", "preflight.json"):
            if (source / name).is_file():
                shutil.copyfile(source / name, work / name)
    except OSError as exc:
        raise MergeError(one_line(exc, f"merging into {work}")) from None
    merged = _judge(work, meta)
    if merged.run.write_error:
        raise MergeError(merged.run.write_error)
    return merged


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
    return Merged(out, run, list(run.reports), judgement.diagnoses, partial, notes)
