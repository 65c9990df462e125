"""campaign.json: the facts of one campaign (what ran, how, on what), typed and versioned.

Written by the campaign as it goes (atomically, after each block) and read by everything that
judges or reports a saved campaign. Unknown keys are kept (``extra="allow"``): a newer writer
may add facts an older reader does not know; a newer ``schema`` than this reader's is refused.
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import psutil
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from .files import write_json_atomic

CAMPAIGN_SCHEMA: Final = 1
Status = Literal["running", "complete", "interrupted"]


def _order_now(value: Any) -> Any:
    # Campaigns recorded before the interleaved order had its name call it abba.
    return "interleaved" if value == "abba" else value


Order = Annotated[str, BeforeValidator(_order_now)]
"""interleaved or sequential (as the pilot's load.order)."""


class CampaignFileError(ValueError):
    """campaign.json cannot be read; the message names the file and the problem."""


class _Facts(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class PinCheck(_Facts):
    """One pinned drafter file hashed again while the campaign ran (``pins.sha256``)."""

    file: str
    """The file, relative to the drafter."""
    when: str
    """``boot N`` (just after that boot loaded it) or ``after the campaign``."""
    expected: str
    found: str
    """Its sha256 then, or ``missing``."""

    @property
    def ok(self) -> bool:
        return self.found == self.expected.lower()

    def text(self) -> str:
        return (f"pinned {self.file} changed ({self.when}): sha256 {self.found[:16]}, pinned "
                f"{self.expected[:16]}")


class ConditionRun(_Facts):
    """One condition as the campaign ran it."""

    role: str | None = None
    error: str | None = None
    """Why the condition did not run or stopped; null when it ran."""
    boot_s: float | None = None
    peak_memory_mb: float | None = None
    fingerprint: dict[str, Any] = Field(default_factory=dict)
    """The engine's own facts: engine + version, device, dtype, context, resolved args."""
    pins: list[PinCheck] = Field(default_factory=list)
    """The drafter's pinned files hashed again at each boot and after the campaign."""

    def pin_changes(self) -> list[PinCheck]:
        return [c for c in self.pins if not c.ok]


class ScheduleEntry(_Facts):
    """One replayed stretch: a condition's requests of one block, load level and mode."""

    block: int
    condition: str
    load: str
    mode: str
    started: float
    ended: float | None = None
    boot: int = 0
    pass_index: int = 0
    stretch: int | None = None
    loadavg: list[float] | None = None
    """The host's 1, 5 and 15 minute load averages when the stretch started (os.getloadavg);
    null where the platform has none."""
    loadavg_end: list[float] | None = None
    """The same when it ended."""
    spec_counters: dict[str, float] | None = None
    """The engine's own speculation counters when the stretch started (verify_steps,
    output_tokens, accepted, draft_tokens, pos0...) and gauges (num_steps, num_draft_tokens:
    the active depth where it adapts); null where the engine exports none."""
    spec_counters_end: dict[str, float] | None = None
    """The same when it ended: the difference is the stretch's (docs/acceptance.md)."""


class PlanFacts(_Facts):
    """The replay plan the campaign followed (see campaign/schedule.py)."""

    passes: int
    boots_per_condition: int = 1
    order: Order = "interleaved"
    looks: int = 1
    seed: str = "0"
    blocks: dict[str, list[list[str]]] = Field(default_factory=dict)
    """Load level -> its blocks of prompt ids (a block is the statistics' unit)."""
    level_passes: dict[str, int] = Field(default_factory=dict)
    """Load levels that ran fewer passes per boot than ``passes`` (load.level_passes)."""

    def block_of(self, level: str) -> dict[str, int]:
        return {pid: k for k, ids in enumerate(self.blocks.get(level, [])) for pid in ids}


class DrawnStratum(_Facts):
    slice: str
    domain: str
    available: int
    """Prompts of this (slice, domain) the draw chose from."""
    drawn: int


class DrawFacts(_Facts):
    """Which prompts one pass used and why (pilot/draw.py): a seeded draw stratified by
    slice and domain across the trace, never its head."""

    purpose: str
    """``trace`` (trace.limit / limit_per_slice), ``sampled`` or ``params``."""
    seed: int
    """The pilot's ``sampling.seed``."""
    budget: int | None = None
    """The prompts asked for (null: all)."""
    population: int
    """Prompts drawn from."""
    drawn: int
    allocation: str
    """``all``, ``proportional`` (every stratum represented, the rest in proportion to its
    size, largest remainders) or ``fewer than strata`` (the unusual slice keeps one, other
    strata drawn at random weighted by size)."""
    reason: str
    """The same in a sentence."""
    strata: list[DrawnStratum] = Field(default_factory=list)
    prompt_ids: list[str] = Field(default_factory=list)
    """The drawn prompts, in trace order."""


class ExpectedFacts(_Facts):
    """The campaign's expected time, stated before it ran (campaign/expected_time.py)."""

    source: str
    """The time model's source: a default per engine kind, stated as an assumption."""
    seconds: float
    """Wall time of the full plan, every condition."""
    first_look_seconds: float | None = None
    """With early stopping: the time if the timed passes stop at the first look."""
    phases: dict[str, float] = Field(default_factory=dict)
    """Seconds per phase: boots, warm-up, timed, greedy, sampled, scoring, params."""
    devices: int
    """Devices held (cost.devices_per_server)."""
    device_hours: float
    cost: float | None = None
    """device_hours x cost.device_hour_price, when a price is set."""
    worst_device_hours: float | None = None
    """The worst case: the whole plan at full token budgets and a hung server per condition
    (its boot timeout or the timeout breaker's requests, the longer)."""
    worst_cost: float | None = None
    """worst_device_hours x cost.device_hour_price, when a price is set."""


class SizeFacts(_Facts):
    """The campaign's size as planned before it ran (campaign/size.py), per condition; a
    shard records the whole plan's (an early stop runs fewer)."""

    conditions: int
    timed: int
    """Timed requests per condition (speed)."""
    greedy: int = 0
    """The untimed greedy pass beside sampled timed passes (identity, correctness)."""
    sampled: int = 0
    """The sampled pass (the distribution check)."""
    params: int = 0
    """The sampling-parameters pass."""
    requests: int
    """All conditions' measured requests."""
    quality_requests: int
    """Of ``requests``, those run only for quality evidence: greedy + sampled + params."""
    quality_share: float
    """``quality_requests / requests``."""
    output_tokens: int
    expected: ExpectedFacts | None = None
    """The expected time (null: no time model, known after warm-up)."""


def text_sha256(text: str | None) -> str | None:
    """sha256 of a saved text (UTF-8), None for none."""
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_sha256(path: Path) -> str | None:
    """sha256 of a file's bytes, read in chunks; None when there is no such file."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    except FileNotFoundError:
        return None
    return digest.hexdigest()


class ShardFacts(_Facts):
    """The share of the replay plan one machine ran (``--shard K/N``)."""

    index: int
    """K, 1-based."""
    count: int
    """N: the shards the plan was split into."""
    passes: list[int] = Field(default_factory=list)
    """The plan's passes (0-based) this shard replayed (pass p: shard p mod N + 1)."""
    hardware: dict[str, Any] = Field(default_factory=dict)
    """Per condition: engine, version, device, dtype, model and drafter digests."""


class MergedShard(_Facts):
    """One shard a merged campaign pooled (or expected and lacks)."""

    index: int
    source: str | None = None
    """The shard's results folder; null for a shard that is missing."""
    run_id: str | None = None
    status: str = "missing"
    """The shard campaign's status (complete, interrupted, killed, running) or missing."""
    node: str | None = None
    passes: list[int] = Field(default_factory=list)
    greedy_requests: int = 0
    hardware: dict[str, Any] = Field(default_factory=dict)
    note: str | None = None
    """Why the shard is not complete (a worker that died, an interrupt), if it is not."""


class CampaignFile(_Facts):
    """campaign.json."""

    schema_: int = Field(CAMPAIGN_SCHEMA, alias="schema")
    run_id: str | None = None
    tool_version: str | None = None
    pilot_name: str | None = None
    config_hash: str | None = None
    pilot_text: str | None = None
    """The pilot file as it was run (re-judging uses it unless told otherwise)."""
    pilot_text_sha256: str | None = None
    """sha256 of ``pilot_text`` as written by the run: an edit made afterwards is refused."""
    trace_hash: str | None = None
    records_sha256: str | None = None
    """sha256 of records.jsonl as the run left it, written when the campaign ends (null while
    it runs, and in folders from before it was kept): a merge refuses records changed since."""
    trace_files: list[str] = Field(default_factory=list)
    prompt_ids: list[str] = Field(default_factory=list)
    baseline: str | None = None
    current: str | None = None
    candidates: list[str] = Field(default_factory=list)
    load_levels: dict[str, Any] = Field(default_factory=dict)
    """Level name -> concurrency (int) or an open-loop level ({rate, max_concurrency})."""
    blocks: int = 1
    warmup_requests: int | None = None
    """Warm-up requests per condition after boot (not recorded)."""
    order: Order | None = None
    """Block order: interleaved (all conditions up at once) or sequential."""
    block_order: list[list[str]] = Field(default_factory=list)
    sampling: dict[str, Any] = Field(default_factory=dict)
    conditions: dict[str, ConditionRun] = Field(default_factory=dict)
    schedule: list[ScheduleEntry] = Field(default_factory=list)
    plan: PlanFacts | None = None
    """The replay plan; null for campaigns recorded before plans (one block per prompt)."""
    early_stop: bool = False
    sequential: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    stopped_after_block: int | None = None
    status: Status = "running"
    stop_reason: str | None = None
    """Why an interrupted campaign stopped (a signal, an error); null otherwise."""
    started_at: float | None = None
    ended_at: float | None = None
    host: dict[str, Any] = Field(default_factory=dict)
    shard: ShardFacts | None = None
    """The share of a sharded plan this campaign ran; null for a whole (one-machine) run."""
    merged: list[MergedShard] = Field(default_factory=list)
    """A merged campaign's shards (``python -m pytest_osprey merge``); empty otherwise."""
    merge_note: str | None = None
    """What a merged campaign lacks or mixes (missing shards, heterogeneous machines)."""
    draws: dict[str, DrawFacts] = Field(default_factory=dict)
    """Pass -> which prompts it used and why: ``trace`` (only with trace.limit or
    limit_per_slice), ``sampled``, ``params`` (those that ran); empty in campaigns recorded
    before draws (the passes then took the first prompts of the trace)."""
    size: SizeFacts | None = None
    """The planned size; null in campaigns recorded before it."""
    writer_pid: int | None = None
    """The process writing this campaign: with ``host.node``, how a reader tells a campaign
    still running from one whose process was killed (status left at running)."""

    def condition_error(self, condition: str) -> str | None:
        info = self.conditions.get(condition)
        if info is None:
            return "condition was not run"
        return info.error

    def save(self, directory: Path) -> None:
        write_json_atomic(directory / "campaign.json", self.model_dump(mode="json", by_alias=True))


def read_campaign_file(path: Path) -> CampaignFile:
    """campaign.json at ``path``; every problem is a :class:`CampaignFileError` naming it."""
    try:
        raw = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise CampaignFileError(f"{path}: no campaign.json (is this a results folder?)") from None
    except json.JSONDecodeError as exc:
        raise CampaignFileError(
            f"{path}: not valid JSON: {exc.msg} (line {exc.lineno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CampaignFileError(f"{path}: cannot read: {exc}") from None
    except RecursionError:
        raise CampaignFileError(f"{path}: not a campaign file (JSON nested too deeply)") from None
    if not isinstance(raw, dict):
        raise CampaignFileError(f"{path}: not a campaign file (expected a JSON object)")
    schema = raw.get("schema", CAMPAIGN_SCHEMA)
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > CAMPAIGN_SCHEMA:
        raise CampaignFileError(f"{path}: campaign schema {schema} is newer than this version "
                                f"reads ({CAMPAIGN_SCHEMA}); upgrade pytest-osprey")
    try:  # an escaped lone surrogate reads, but no file or report could ever write it
        json.dumps(raw, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise CampaignFileError(f"{path}: holds a lone UTF-16 surrogate (\\ud800-\\udfff), "
                                "not text") from None
    try:
        return CampaignFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise CampaignFileError(f"{path}: {where}: {first['msg']}") from None


def live_status(meta: CampaignFile) -> str:
    """The campaign's status as it really is: campaign.json's, except that ``running`` left by
    a process that is gone (SIGKILL, a crash, a power cut) reads ``killed``. A writer on
    another host cannot be checked: it stays ``running``."""
    if meta.status != "running" or meta.writer_pid is None:
        return meta.status
    if meta.host.get("node") != platform.node():
        return "running"
    try:
        proc = psutil.Process(meta.writer_pid)
        # A recycled pid belongs to a process started after the campaign.
        alive = proc.status() != psutil.STATUS_ZOMBIE and (
            meta.started_at is None or proc.create_time() <= meta.started_at + 1)
    except psutil.Error:
        alive = False
    return "running" if alive else "killed"


def incomplete_note(meta: CampaignFile, measured: int) -> str | None:
    """Why this campaign is not a complete one, in a line (None when it is complete); shown
    after an ``INTERRUPTED`` label, its verdicts withheld."""
    status = live_status(meta)
    if status == "complete":
        return None
    expected = _expected_greedy(meta)
    done = f"{measured} of {expected} greedy requests measured" if expected else (
        f"{measured} requests measured")
    where = f"pid {meta.writer_pid} on {meta.host.get('node') or 'an unknown host'}"
    if status == "killed":
        why = (f"campaign.json still says running but its process ({where}) is gone: it was "
               "killed (SIGKILL, a crash, a power cut or a full disk)")
    elif status == "running":
        why = f"the campaign is still running ({where}) or its host cannot be checked"
    else:
        why = f"the campaign was interrupted ({meta.stop_reason or 'no reason recorded'})"
    return f"{why}; {done}"


def _expected_greedy(meta: CampaignFile) -> int:
    """Greedy requests the plan holds (an early stop ends a complete campaign sooner)."""
    passes = meta.plan.passes * meta.plan.boots_per_condition if meta.plan else meta.blocks
    return len(meta.prompt_ids) * len(meta.load_levels) * max(passes, 1) * len(
        meta.conditions)


def stopped_conditions(meta: CampaignFile) -> dict[str, str]:
    """Conditions that booted and then stopped before the campaign's end (a server that
    crashed or failed its warm-up): condition -> why. Not those that never booted."""
    return {name: info.error for name, info in meta.conditions.items()
            if info.error and info.boot_s is not None}


def stopped_note(meta: CampaignFile, measured: dict[str, int]) -> str | None:
    """The conditions that stopped mid-campaign and what each measured, in a line (None when
    none did); ``measured``: condition -> greedy requests recorded."""
    stopped = stopped_conditions(meta)
    if not stopped:
        return None
    per = len(meta.prompt_ids) * len(meta.load_levels) * max(meta.blocks, 1)
    parts = [f"condition {name!r} stopped mid-campaign ({why.splitlines()[0]}); "
             f"{measured.get(name, 0)} of its {per} greedy requests measured"
             for name, why in stopped.items()]
    return "; ".join(parts)
