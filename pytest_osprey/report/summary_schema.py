"""The structure of summary.json (the results sheet): pydantic models that build and validate
it, and from which its JSON Schema and (with summary_reference.py) docs/summary-json.md are
rendered.

Versioning: ``schema`` is bumped when a key is removed or renamed, or its meaning or unit
changes. Keys may be added within a version, so every model keeps keys it does not declare
(``extra="allow"``) and readers should ignore keys they do not know.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..judgement import (
    BlockDrift,
    BlockLoad,
    BreakEven,
    Comparison,
    ConditionCost,
    CostLimitsEntry,
    CostSection,
    DomainRow,
    Evidence,
    Figures,
    Finding,
    GoodputRow,
    GoodputSection,
    Outcome,
    Stability,
    Verdict,
)
from .summary_spent import SpentEntry

SUMMARY_SCHEMA: Final = 2
"""Version of the summary.json format (the ``schema`` key)."""


class _Sheet(BaseModel):
    # Keep undeclared keys instead of dropping them: a field added to the figures or the
    # cost table still reaches summary.json (tests flag it as undocumented).
    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True,
                              populate_by_name=True)


class UnprovenEntry(_Sheet):
    """A gating gate that passed or was skipped unable to fail (`verdicts[].unproven[]`)."""

    gate: str
    """`kind[id]`, as pytest names its test (`correctness[tiny-drafter-vs-baseline]`)."""
    kind: str
    """The gate kind (`gates[].kind`)."""
    evidence: Literal["underpowered", "not_evaluable"]
    """Its `gates[].evidence`: too few data to have failed, or nothing it could judge."""


class UncheckedEntry(_Sheet):
    """A quality check that did not run for the candidate (`verdicts[].unchecked[]`): the
    verdict says nothing about it, and its headline names it."""

    check: str
    """`greedy identity`, `correctness`, `sampled distribution` or `sampling params`."""
    kind: str
    """Its gate kind (`gates[].kind`)."""
    why: str
    """The pilot key that is off (`not run (sampling.sampled.enabled is off)`), or the
    outcome and first line of the gate that could not judge."""


class ReasonEntry(_Sheet):
    """One reason of a verdict, in words (`verdicts[].bullets[]`)."""

    name: str
    """What failed, e.g. `speed at concurrent`, `greedy outputs`."""
    outcome: Outcome
    """fail or inconclusive."""
    text: str
    """The gate's figures in a few words."""
    diagnosis: str | None
    """What the pattern usually means (accept length near 1: never accepted; faster at low
    load but slower at concurrency: batch-size crossover; unusual slice worse: domain gap);
    null when none is known."""
    gate: str
    """`kind[id]` of the gate: its full evidence is in `gates[]`."""


class SetupRow(_Sheet):
    """One line of the set-up block (`setup[]`)."""

    what: str
    """What it describes (engine, hardware, dtype, blocks, load levels, ...)."""
    value: str
    """As read from campaign.json, in words."""


class CrossoverEntry(_Sheet):
    """Up to which concurrency speculation pays (`verdicts[].crossover`): where the
    candidate's speedup over the baseline falls to `limits.speedup_min` across the
    closed-loop levels. The log speedup is taken as linear in log2(concurrency) between two
    tested levels, never extrapolated beyond them; the point is where the weighted monotone
    fit of the levels' estimates crosses the threshold, the interval inverts the test of
    "speedup = threshold" along the interpolated curve, counting the part of neighbouring
    levels' errors they share: the stable prompt-to-prompt part and the between-boot part of
    each level's variance (they replay the same prompts in the same boots); noise shared in
    time is each level's own (docs/crossover.md)."""

    status: Literal["crosses", "pays_everywhere", "pays_nowhere", "not_estimable"]
    """`crosses`: it falls to the threshold within the tested range; `pays_everywhere`: it
    clears it at every level tested (the crossing, if any, lies beyond the highest);
    `pays_nowhere`: at none (below the lowest); `not_estimable`: see `reason`."""
    concurrency: float | None
    """The estimated crossing (requests in flight); null unless `status` is `crosses`."""
    ci: Annotated[list[float | None], Field(min_length=2, max_length=2)]
    """[low, high] at `decision.confidence` (requests in flight); null at an end the interval
    leaves the tested range by (the crossing may lie beyond it: nothing says how far)."""
    levels: list[str]
    """The closed-loop levels it rests on, lightest first."""
    concurrencies: list[int] = Field(default_factory=list)
    """Their concurrencies, as `levels`."""
    threshold: float | None = None
    """The speedup it crosses (`limits.speedup_min`, ratio)."""
    fit: list[float] = Field(default_factory=list)
    """The monotone fit's speedup at each level (ratio), as `levels`; `[]` when not
    estimable."""
    reason: str = ""
    """Why it is `not_estimable` (fewer than 3 closed-loop levels with a finite speedup
    interval, levels sharing a concurrency, a speedup rising with concurrency), and which
    levels were left out for want of a finite interval; `""` when neither applies."""
    text: str = ""
    """The line the verdict's notes carry, e.g. `speculation pays up to about x12 [8, 20]
    ...`."""


class VerdictEntry(_Sheet):
    """One candidate's verdict (`verdicts[]`)."""

    candidate: str
    """Candidate condition name."""
    verdict: Verdict
    """KEEP when every gating gate of the candidate (and the `completed` gates of its
    references) passed; DROP when one failed; INCONCLUSIVE when none failed but one was
    inconclusive."""
    reasons: list[str]
    """One line per failed, then inconclusive, gating gate: `kind[id]: first line of its
    summary`; a single `CONDITION did not run: why` when the candidate (or a reference) never
    ran. Empty for KEEP."""
    headline: str = ""
    """The verdict in one line of at most 160 characters: the deciding speedup with its CI
    and threshold, total-time speedup when judged, accept length, quality in a word
    (`quality unproven: correctness not evaluable` when a quality gate could not have
    failed), and the quality checks that did not run (`unchecked: ...`, never shortened
    away); `CONDITION did not run: why; speed and quality not measured` when nothing was."""
    bullets: list[ReasonEntry] = Field(default_factory=list)
    """The failed, then inconclusive, gating gates in words, each with a diagnosis where the
    pattern is a known one."""
    notes: list[str] = Field(default_factory=list)
    """Diagnoses tied to no failed gate (e.g. a domain gap on a reported-only slice)."""
    unproven: list[UnprovenEntry] = Field(default_factory=list)
    """Gating gates that passed or were skipped without the evidence to have failed
    (`evidence` not `tested`). A KEEP with entries here rests on gates that could hardly, or
    not at all, have said no."""
    unchecked: list[UncheckedEntry] = Field(default_factory=list)
    """The quality checks that did not run for this candidate (a gate absent, skipped or
    unable to fail); the headline says `greedy output identical; unchecked: ...` rather than
    `quality identical` while any is listed."""
    next_step: str = ""
    """What to do next, drawn from the pattern that decided the verdict: finish a partial
    campaign, fix a quality defect first, pair or patch a drafter never accepted, serve
    speculation below the batch-size crossover, adapt on a slice with a domain gap, rerun on
    a quiet machine, collect the evidence an INCONCLUSIVE lacks, or ship a KEEP behind the
    kill switch."""
    crossover: CrossoverEntry | None = None
    """Up to which concurrency speculation pays (always set by this version; `status`
    `not_estimable` with its `reason` when it cannot be estimated)."""


class GateEntry(_Sheet):
    """One judged gate (`gates[]`), in the order the tests run. The meaning and unit of
    `estimate`, `ci`, `threshold` and `details` depend on `kind`: see Gate kinds below."""

    kind: str
    """Gate kind (see Gate kinds below)."""
    id: str
    """`condition[-vs-reference][-load][-slice][-limitN]`: the pytest test id; unique
    together with `kind`."""
    condition: str
    """Condition judged."""
    reference: str | None
    """Condition it is compared with; null for gates on one condition."""
    load: str | None
    """Load level judged; null for gates over all levels."""
    slice: str | None
    """Trace slice judged (speedup on the unusual slice); null: every prompt."""
    gating: bool
    """True: decides the verdict. False: reported only (other load levels, the unusual
    slice unless `decision.gate_unusual_slice`)."""
    outcome: Outcome
    """pass, fail, inconclusive (the evidence settles neither way) or skip (not
    applicable). Gates are not adjusted against each other: KEEP needs every one to pass."""
    evidence: Evidence = "tested"
    """How much the outcome says: `tested` (the gate could have failed), `underpowered` (it
    could fail, but too few data to catch the effect its kind is sized for: a pass says
    little) or `not_evaluable` (it could not have failed: nothing at risk, or a budget that
    cannot reach its level). Reports show a pass that is not `tested` apart."""
    summary: str
    """Human-readable result; the first line is the one quoted in verdict reasons."""
    estimate: float | int | None
    """Point estimate, in the unit of the gate kind; null when not estimated."""
    ci: Annotated[list[float | None], Field(min_length=2, max_length=2)] | None
    """[low, high] confidence interval of `estimate` at `decision.confidence`, same unit;
    null when the gate has none. May hold Infinity (latency bound from too few samples)."""
    threshold: float | int | None
    """Limit the estimate is judged against, same unit; null when the gate has none."""
    p_value: float | None
    """One-sided p-value of the gate's deciding test (unitless); null when the gate has no
    test."""
    details: dict[str, Any]
    """Kind-specific evidence (see Gate kinds below); `{}` when none."""


class CampaignEntry(_Sheet):
    """How the campaign ran and ended (`campaign`): the passes planned and run, whether early
    stopping ended it, what it could not measure, and when."""

    status: str
    """complete, interrupted or running, as campaign.json says."""
    passes_planned: int
    """Timed passes the replay plan holds, over every boot (count)."""
    passes_run: int
    """Timed passes that sent at least one measured request (count)."""
    stopped_early: bool
    """True when early stopping ended the campaign before its last pass."""
    stopped_after_pass: int | None
    """The pass after which it stopped (1-based); null when it was not stopped early."""
    decisions: dict[str, str]
    """Candidate -> the decision at the stopping look (keep, drop, inconclusive); `{}` when
    it was not stopped early."""
    not_measured: list[str]
    """What the passes run could not measure (one pass of several: drift between passes,
    the near-tie control); `[]` when nothing was lost."""
    units: dict[str, int]
    """Closed-loop level -> the speed test's time units there (blocks x passes run, count)."""
    text: str
    """The ending in plain words (what report.md's footer says)."""
    tool_version: str | None
    """The pytest-osprey version that recorded the campaign."""
    started_at: float | None
    """When the campaign started (Unix time, seconds)."""
    ended_at: float | None
    """When it ended (Unix time, seconds); null while it runs."""
    started_at_iso: str | None
    """`started_at` in UTC, ISO 8601."""
    ended_at_iso: str | None
    """`ended_at` in UTC, ISO 8601."""
    requests_planned: int | None = None
    """Measured requests the campaign planned, every condition and pass (campaign.json
    `size.requests`); null for campaigns recorded before it."""
    quality_requests: int | None = None
    """Of those, the requests run only for quality evidence: the untimed greedy pass beside
    sampled timed passes, the sampled pass, the sampling-parameters pass (count); null as
    above."""
    quality_share: float | None = None
    """`quality_requests / requests_planned` (0-1); null as above."""
    spent: SpentEntry | None = None
    """What the campaign cost (its wall time x devices, priced); null while it runs."""
    draws: dict[str, list[str]] = Field(default_factory=dict)
    """Pass (`trace` for trace.limit, `sampled`, `params`) -> the prompt ids it drew, seeded
    and stratified by slice and domain across the trace (campaign.json `draws` says why);
    `{}` for campaigns recorded before draws."""


class ModelEntry(_Sheet):
    """A model checkpoint the campaign served (`models.target`, `models.drafters.NAME`)."""

    path: str | None
    """Its folder, or the model id a server resolved, as the pilot names it."""
    digest: str | None
    """What the engine took of its files: sha256 over its `*.safetensors` and `config.json`
    (name and bytes, file by file), the first 16 hex digits; null where the engine took none
    (a launched server or an endpoint loads the files itself)."""


class ModelsSection(_Sheet):
    """The target and the drafters (`models`)."""

    target: ModelEntry
    """The target model, the same for every condition."""
    drafters: dict[str, ModelEntry]
    """Condition -> its drafter; conditions without one (the baseline) are absent."""


class HardwareFacts(_Sheet):
    """The machine (`setup_facts.hardware`)."""

    machine: str | None
    """The host's architecture (`x86_64`, `aarch64`)."""
    cpus: int | None
    """The host's CPUs (count)."""
    node: str | None
    """The host's name."""
    device_name: str | None
    """The device the engine names (a GPU's model, a CPU's processor)."""
    gpu: str | None
    """The GPU(s) the memory figure was read on, with their memory; null on CPU."""


class SpeculationFacts(_Sheet):
    """How one condition speculated (`setup_facts.speculation.NAME`): as the engine reported
    it where it does, as the pilot asked otherwise; null where neither says."""

    algorithm: str | None
    """The engine's algorithm (`EAGLE3`, `eagle3`, `assisted`, ...)."""
    num_steps: int | None
    """Draft steps per verify step (SGLang, count)."""
    eagle_topk: int | None
    """Branches kept per draft step (SGLang EAGLE, count)."""
    num_draft_tokens: int | None
    """Tokens drafted per verify step (SGLang: the root included, count)."""
    adaptive: bool | None
    """The draft depth changes at run time."""
    draft_loop: str | None
    """Who runs the draft loop in the embedded engine (`engine`, `transformers`); null for
    other engines."""


class SetupFacts(_Sheet):
    """The set-up as fields (`setup_facts`), read from campaign.json: what `setup` says in
    words. A fingerprint field the conditions disagree on is null and named in `differs`
    (the fairness gate fails on it)."""

    engine: str | None
    """Engine name (transformers, sglang, vllm, endpoint)."""
    engine_version: str | None
    """Its version, as the engine reports it."""
    torch: str | None
    """torch's version where the engine runs in this process; null otherwise."""
    hardware: HardwareFacts
    """The machine."""
    device: str | None
    """The device the embedded engine ran on (`cpu`, `cuda:0`); null for other engines."""
    dtype: str | None
    """Weights' precision (`float32`, `bfloat16`)."""
    quantization: str | None
    """Quantization (`none`, `int8`, ...); null where not recorded."""
    threads: int | None
    """Compute threads of the embedded engine (count); null for other engines."""
    context_length: int | None
    """Context length the target was loaded with (tokens)."""
    sampling: dict[str, Any]
    """The sampling settings as recorded (`greedy`, `sampled`, `params`, `serving`, `seed`:
    the pilot's `sampling` section as run)."""
    speculation: dict[str, SpeculationFacts]
    """Condition -> how it speculated; conditions without speculation are absent."""
    passes: int
    """Timed passes per boot the plan holds (count)."""
    boots_per_condition: int
    """Engine boots per condition (count)."""
    order: str | None
    """interleaved or sequential."""
    warmup_requests: int | None
    """Warm-up requests per condition after each boot, not recorded (count)."""
    load_levels: dict[str, Any]
    """Level name -> concurrency (closed loop, int) or `{rate, max_concurrency}` (open loop)."""
    prompts: int
    """Prompts in the trace as replayed (count)."""
    differs: list[str]
    """Fingerprint fields the conditions disagree on; `[]` when they all agree."""


class ConditionEntry(_Sheet):
    """One condition as the campaign ran it (`conditions.NAME`)."""

    role: str | None
    """baseline, current or candidate."""
    error: str | None
    """Why the condition did not run or stopped; null when it ran."""
    boot_s: float | None
    """Engine boot time (seconds)."""
    peak_memory_mb: float | None
    """The condition's memory figure (MiB), what `memory_kind` says: the embedded engine on
    CPU, the weights and buffers it holds loaded (not a peak); a GPU engine, its peak GPU
    memory over the campaign; a launched server without a visible GPU, its process tree's
    peak resident memory."""
    memory_kind: Literal["weights", "gpu_peak", "rss_peak"] | None = None
    """What `peak_memory_mb` holds: `weights` (weights + buffers loaded), `gpu_peak` (peak
    GPU memory) or `rss_peak` (peak resident memory); null where the engine did not say."""


class ShardEntry(_Sheet):
    """One shard a merged campaign pooled, or lacks (`shards[]`)."""

    index: int
    """K of a `--shard K/N` run (1-based)."""
    status: str
    """complete, incomplete or missing."""
    node: str | None = None
    """The machine's host name."""
    passes: list[int] = Field(default_factory=list)
    """The plan's passes (0-based) it replayed."""
    greedy_requests: int = 0
    """Measured (greedy) requests it recorded."""
    note: str | None = None
    """Why it is not complete (a dead worker, an interrupt, a folder not given)."""
    speedup: dict[str, float | None] = Field(default_factory=dict)
    """Candidate -> its speedup against the baseline at the primary load on this machine
    alone: the geometric mean over prompts of baseline / candidate latency on the shard's
    records (ratio; > 1 faster), descriptive, not a gate (the gates pool every shard, each
    machine a stratum); null where the shard has no pair."""


class Rejudged(_Sheet):
    """How a re-judged copy was made (`rejudged`)."""

    at: str
    """When it was judged (UTC, ISO 8601)."""
    pilot: str
    """Whose limits: the pilot text saved in campaign.json, or the file given."""
    source: str
    """The results folder whose campaign was judged."""


class Summary(_Sheet):
    """summary.json: the verdicts, every gate and the measured figures of one judged
    campaign. Re-judging never rewrites it: it writes a marked copy (`rejudged`) in a folder
    of its own (`rejudged-<UTC time>/`)."""

    # "schema" would shadow BaseModel.schema: the key is an alias.
    schema_: Literal[2] = Field(SUMMARY_SCHEMA, alias="schema")
    """Version of this format."""
    run_id: str | None
    """The campaign's run id (UTC start time and a random suffix)."""
    pilot_name: str | None
    """The pilot's `name`."""
    trace_hash: str | None
    """sha256 of the trace's prompts as replayed (hex)."""
    config_hash: str | None
    """sha256 of the pilot configuration the campaign ran with (hex)."""
    status: str | None
    """The campaign's status: complete, interrupted, killed (campaign.json still says running
    but the process writing it is gone) or running."""
    partial: str | None = None
    """Why the campaign is incomplete (interrupted, killed, still running), in a line; null
    when it is complete. A partial campaign's verdicts are withheld: INCONCLUSIVE, with this
    as their first reason, and its passing gates inconclusive."""
    rejudged: Rejudged | None = None
    """Set on a re-judged copy (`--osprey-reuse`, `python -m pytest_osprey report`); null on
    the campaign's own summary."""
    campaign: CampaignEntry | None = None
    """How the campaign ran and ended (always set by this version)."""
    models: ModelsSection | None = None
    """The target and drafters with their digests (always set by this version)."""
    verdicts: list[VerdictEntry]
    """One per judged candidate, in the pilot's order."""
    gates: list[GateEntry]
    """Every gate judged."""
    figures: list[Figures]
    """Every condition at every load level."""
    cost: CostSection
    """Serving cost and break-even."""
    conditions: dict[str, ConditionEntry]
    """Condition name -> how it ran."""
    comparison: Comparison | None = None
    """Comparison with a previous campaign (--osprey-compare); null when none."""
    setup: list[SetupRow] = Field(default_factory=list)
    """What ran, on what, how, in words, as the reports show it (engine and version,
    hardware, dtype, threads, blocks and order, warm-up, what a load level means for this
    engine, what the memory figure is); `setup_facts` has the same as fields."""
    setup_facts: SetupFacts | None = None
    """The set-up as fields (always set by this version)."""
    stability: Stability | None = None
    """How steady the machine was: the baseline against itself between blocks, the load
    average per stretch, warnings."""
    goodput: GoodputSection | None = None
    """Goodput per condition and load level; null when the pilot sets no
    `limits.goodput`."""
    domains: list[DomainRow] = Field(default_factory=list)
    """Each candidate against the baseline per domain of the trace, at the primary load
    (descriptive, not gated)."""
    acceptance_by_position: dict[str, list[float]] = Field(default_factory=dict)
    """Condition -> share of verify steps accepting the draft token at each position (0-1,
    first drafted token first), where the engine recorded per-position counts; `{}` when
    none did."""
    shards: list[ShardEntry] = Field(default_factory=list)
    """A merged campaign's shards, every one expected; empty for a one-machine run."""
    merge_note: str | None = None
    """What differs between the merged shards' machines (`--allow-heterogeneous`), and what
    of a shard could not be verified (records from before `records_sha256` was kept)."""


def json_schema() -> dict[str, Any]:
    """The JSON Schema of summary.json (draft 2020-12, the dialect pydantic writes)."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            **Summary.model_json_schema()}


# Models documented in the reference that live with the code computing them.
__all__ = ["BlockDrift", "BlockLoad", "BreakEven", "ConditionCost", "CostLimitsEntry",
           "CostSection", "DomainRow", "Figures", "Finding", "GoodputRow", "GoodputSection",
           "Stability", "Summary"]
