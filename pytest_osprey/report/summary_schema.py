"""The structure of summary.json (the results sheet): pydantic models that build and validate
it, and from which its JSON Schema and its reference (docs/summary-json.md) are rendered.

Versioning: ``schema`` is bumped when a key is removed or renamed, or its meaning or unit
changes. Keys may be added within a version, so every model keeps keys it does not declare
(``extra="allow"``) and readers should ignore keys they do not know.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    GateKind,
    GoodputRow,
    GoodputSection,
    Outcome,
    Stability,
    Verdict,
)

SUMMARY_SCHEMA: Final = 1
"""Version of the summary.json format (the ``schema`` key)."""


class _Sheet(BaseModel):
    # Keep undeclared keys instead of dropping them: a field added to the figures or the
    # cost table still reaches summary.json (tests flag it as undocumented).
    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True,
                              populate_by_name=True)


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
    levels' errors they share (same prompts and boots: 1 - the speed gate's time share)."""

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
    summary`. Empty for KEEP."""
    headline: str = ""
    """The verdict in one line of at most 160 characters: the deciding speedup with its CI
    and threshold, total-time speedup when judged, accept length, quality in a word, and
    the quality checks that did not run (`unchecked: ...`, never shortened away)."""
    bullets: list[ReasonEntry] = Field(default_factory=list)
    """The failed, then inconclusive, gating gates in words, each with a diagnosis where the
    pattern is a known one."""
    notes: list[str] = Field(default_factory=list)
    """Diagnoses tied to no failed gate (e.g. a domain gap on a reported-only slice)."""
    unproven: list[str] = []
    """Gating gates that passed or were skipped without the evidence to have failed
    (`evidence` not `tested`): `kind[id] evidence`. A KEEP with entries here rests on gates
    that could hardly, or not at all, have said no."""
    unchecked: list[UncheckedEntry] = Field(default_factory=list)
    """The quality checks that did not run for this candidate (a gate absent, skipped or
    unable to fail); the headline says `greedy output identical; unchecked: ...` rather than
    `quality identical` while any is listed."""
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


class ConditionEntry(_Sheet):
    """One condition as the campaign ran it (`conditions.NAME`)."""

    role: str | None
    """baseline, current or candidate."""
    error: str | None
    """Why the condition did not run or stopped; null when it ran."""
    boot_s: float | None
    """Engine boot time (seconds)."""
    peak_memory_mb: float | None
    """Peak device memory over the campaign (MiB)."""


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
    schema_: Literal[1] = Field(SUMMARY_SCHEMA, alias="schema")
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
    """What ran, on what, how (engine and version, hardware, dtype, threads, blocks and
    order, warm-up, what a load level means for this engine, what the memory figure is)."""
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
    """What differs between the merged shards' machines (`--allow-heterogeneous`)."""


def json_schema() -> dict[str, Any]:
    """The JSON Schema of summary.json (draft 2020-12, the dialect pydantic writes)."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            **Summary.model_json_schema()}


@dataclass(frozen=True)
class KindDoc:
    """What a gate kind puts in `estimate`, `ci`, `threshold` and `details`."""

    passes_when: str
    estimate: str
    threshold: str
    details: str


_NONE = "-"
_DIVERGENCE = ("`prompt_id`, `load`, `position` (token index), `reference_token`, "
               "`candidate_token`, `margin` (the reference's top-1 minus top-2 logprob there), "
               "`runner_up` (the reference's top-2 token id there; null: not recorded), "
               "`near_tie`, `reference_text`, `candidate_text`")

GATE_KINDS: dict[GateKind, KindDoc] = {
    GateKind.COMMAND_LINE: KindDoc(
        "the condition's engine command line builds (and parses where the engine's parser is "
        "importable)", _NONE, _NONE,
        "`condition`, `ok`, `lines` (the masked command line and parser messages), "
        "`environment` (a launched engine's: the variables the pilot sets and how many of "
        "this process's were withheld as possible credentials; null for the embedded engine)"),
    GateKind.ARTIFACT: KindDoc(
        "every drafter check passes", _NONE, _NONE,
        "`ok`, `checks` (list of `name`, `ok`, `detail`)"),
    GateKind.COMPLETED: KindDoc(
        "completed fraction >= threshold",
        "completed requests / requests sent at the level (fraction 0-1)",
        "`limits.min_completed_fraction` (fraction 0-1)",
        "`ok`, `total` (requests)"),
    GateKind.FAIRNESS: KindDoc(
        "engine, version, device, precision, context, sampling and trace identical; every "
        "closed-loop level held >= 0.95 x its concurrency in flight (measured from the "
        "records) and ran within every condition's running cap; every condition ran the "
        "speculation its pilot names, its depth fixed unless `speculation.adaptive` "
        "(docs/acceptance.md)", _NONE,
        _NONE,
        "`differences` (list of what differs), `compared` (field -> condition -> value), "
        "`in_flight` (per condition and level: `concurrency`, `rate`, `measured`, `fillers`, "
        "`mean`, `min`, `within` (share within +-5%), `achieved_rate` (requests/s)), "
        "`speculation` (condition -> `asked`, `ran`, `adaptive_allowed`), `depth_per_stretch` "
        "(`condition`, `boot`, `stretch`, `load`, `num_steps`, `num_draft_tokens`: the depths "
        "seen), `reconciliation` (per stretch and counter: `records`, `engine`, `mismatch`), "
        "`flags` (mismatches, shown without failing the gate)"),
    GateKind.GREEDY_IDENTITY: KindDoc(
        "genuine divergences <= threshold, and the near-tie rate per compared token not above "
        "the identical-condition control's (the baseline's later blocks against its first: an "
        "exact test relabelling each prompt's runs, one-sided at (1 - `decision.confidence`)/2; "
        "without a control, an exact Poisson test against `limits.quality.max_near_tie_rate`). "
        "A near-tie: the candidate's token is the baseline's runner-up and the baseline's "
        "margin there <= `limits.quality.near_tie_epsilon`",
        "genuine (not near-tie) greedy divergences over the candidate's outputs (count)",
        "`limits.quality.max_genuine_divergences` (count)",
        "`compared`, `identical` (the candidate's greedy outputs, every prompt, block and load "
        "level, each against the baseline's first output of its prompt and level), `tokens` "
        "(compared tokens), `genuine`, "
        "`near_ties` (lists of divergences: " + _DIVERGENCE + "), `near_tie_rate` (per "
        "token), `rate_test` (`control` or `fixed`), `control` (`compared`, `tokens`, "
        "`near_ties`, `genuine` of the baseline against its rerun; null without one). "
        "`p_value`: the near-tie rate test's"),
    GateKind.CORRECTNESS: KindDoc(
        "losses (answers the baseline got right that the candidate gets wrong) <= threshold: "
        "the exact binomial loss rule; new right answers never offset a loss. skip (evidence "
        "`not_evaluable`) when the baseline got none of the checked prompts right; evidence "
        "`underpowered` when the rule would catch a drafter breaking 20% of answers with "
        "less than 80% probability",
        "losses (count); CI: [0, one-sided upper Clopper-Pearson bound of the loss rate at "
        "1 - (1 - `decision.confidence`)/2] (fraction)",
        "the critical count: the most losses a drafter at `limits.quality.max_loss_rate` "
        "exceeds with probability <= (1 - `decision.confidence`)/2 (0 with the default: any "
        "loss fails)",
        "`n_pairs` (checked prompts), `at_risk` (of those, right for the baseline), "
        "`reference_rate`, `candidate_rate` (fractions 0-1), `losses` (prompt id -> why the "
        "candidate's answer failed), `gains` (prompt ids), `critical`, `power` (loss rate -> "
        "probability the rule fails such a drafter at this size), `control_losses` (the "
        "baseline against its own rerun; null without one). `p_value`: P(Bin(at_risk, "
        "max_loss_rate) >= losses)"),
    GateKind.DISTRIBUTION: KindDoc(
        "the stratified permutation test (each prompt's samples relabelled independently) of "
        "the summed standardised MMD^2 under a sequence kernel does not reject at the "
        "threshold; inconclusive (evidence `not_evaluable`) when the smallest attainable "
        "p-value of the budget exceeds it",
        "distance: mean unbiased MMD^2 over prompts (0 expected for identical samplers; "
        "unitless, kernel scale 0-2)",
        "alpha, `limits.quality.distribution_alpha` (probability)",
        "`smallest_p` (floor of the p-value at this budget), `critical` (the smallest "
        "distance this budget flags), `similarity_ratio` (candidate within-prompt sample "
        "similarity over the baseline's; > 1: less diverse), `prompts`, "
        "`samples_per_prompt`, `worst` (the most different prompt, in words)"),
    GateKind.SAMPLING_PARAMS: KindDoc(
        "every sampling-parameter probe (penalties, stop, max/min tokens, logit bias: "
        "identical greedy tokens; JSON schema, regex: valid output) honoured as by the "
        "baseline; skip when no probe could be tested",
        "parameters not honoured (count)", "0",
        "`honoured` (probe names), `broken` (probe -> what went wrong), `not_tested` (probe -> "
        "why: unsupported by the engine, no effect on the baseline, ...)"),
    GateKind.ACCEPTANCE: KindDoc(
        "reported only, never gating: no draft position's acceptance rate collapsed, against "
        "the lightest load level or the current drafter (below (1 - "
        "`limits.quality.max_acceptance_drop`) x the compared rate, with confidence); skip "
        "when the engine reports no per-position acceptance",
        _NONE, _NONE,
        "`rates` (load level -> acceptance rate per draft position), `collapses` (in words, "
        "with the positions)"),
    GateKind.SPEEDUP: KindDoc(
        "CI low > threshold (the deciding test's one-sided p <= alpha) and the environment "
        "stable enough (no pass changed by as much as that margin); fail when CI high < "
        "threshold; else inconclusive. The primary gate with "
        "`decision.early_stop`: the group-sequential decision at the campaign's last look",
        "completion-latency speedup, reference / candidate, by `decision.speedup_metric`: "
        "per_prompt (geometric mean of per-prompt ratios) or total_time (ratio of summed "
        "latencies) (ratio; > 1 is faster); CI: t with a variance clustered by prompt and by "
        "time unit (a block in one pass; total_time: Fieller)",
        "`limits.speedup_min` against the baseline, 1.0 against another reference (ratio)",
        "`method`, `metric`, `n_prompts`, `n_clusters` (min of prompts and time units: what df "
        "rests on), `n_time_units` ((boot, pass, block) units), `n_boots`, `n_passes`, "
        "`per_prompt` and `total_time` (each `estimate`, `ci`, `p_value`, `df`, `outcome`), "
        "`time_share` and `boot_share` (shares of the estimate's variance due to pass-to-pass "
        "and boot-to-boot variation), `shared_share` (the share of it the other load levels "
        "hold too: stable prompt-to-prompt and boot variation; the crossover's covariance), "
        "`boot_confounded` (one boot per condition: a boot "
        "offset cannot be told from the drafter), `drift` (each condition against itself: "
        "`estimate` ratio, `ci`, `p_value`, `boot`, `pass`, `unstable`, `tolerance`, "
        "`bias_bound`: the largest change of one pass of the reference against the same pass "
        "of the candidate, ratio; an unstable environment vetoes a KEEP only when CI low / "
        "threshold <= `bias_bound`), "
        "`reason` (why not KEEP despite the interval), `held_back` (that reason as a word: "
        "`one_block` or `unstable_environment`), `sequential` (`look`, `looks`, `z`, "
        "`keep_boundary`, `drop_boundary`, `decision`), `advice` (`more_prompts`, "
        "`more_passes`: (smallest, central, largest), `better`, `settle`: what would settle "
        "it, in words)"),
    GateKind.BOOT_CONSISTENCY: KindDoc(
        "with `load.boots_per_condition` >= 2: the condition's boots serve alike: identical "
        "greedy outputs at the lightest load (first pass of each boot; near-ties by the first "
        "boot's own margin apart) and no boot whose accept length differs from its other "
        "boots' by more than `decision.regression_tolerance` (Mann-Whitney, p < 0.01)",
        "genuine greedy output divergences between boots (count)", "0 (count)",
        "`boots`, `prompts` (compared on every boot), `divergent`, `near_ties` (in words), "
        "`accept_length` (boot -> pooled tokens per verify step), `accept_flags`"),
    GateKind.GOODPUT: KindDoc(
        "non-inferior share of requests meeting `limits.goodput`'s targets (exact paired "
        "test, pairs = prompt x block; CI low > threshold) and, with `min_share`, the share's "
        "lower bound at or above it; inconclusive when the baseline meets the targets too "
        "rarely for a loss to show (a gate that could not fail never passes)",
        "candidate share minus baseline share of good requests (fraction -1..1)",
        "minus `limits.goodput.margin` (fraction)",
        "`n_pairs`, `reference_share`, `candidate_share` (0-1), `gains`, `losses` (pairs), "
        "`targets` (in words), `margin`; with a floor `min_share`, `share_low`, "
        "`share_high` (one-sided Clopper-Pearson bounds, 0-1)"),
    GateKind.LATENCY: KindDoc(
        "upper confidence bound of the percentile <= threshold; fail when the lower bound is "
        "above it",
        "observed percentile of the limit's metric (seconds); CI: [estimate, upper bound], "
        "the prompt's block as the unit (Korn-Graubard clustered Clopper-Pearson)",
        "the limit's `max_s` (seconds)",
        "`units` (independent units), `effective_n`, `lower` (lower bound, seconds), `metric` and "
        "`percentile` (the limit's)"),
    GateKind.MEMORY: KindDoc(
        "peak within `limits.memory` (absolute and increase over the baseline)",
        "peak device memory of the candidate (MiB)",
        "`limits.memory.max_peak_mb` (MiB); null when only the increase is limited", _NONE),
    GateKind.COST: KindDoc(
        "cost per successful request <= threshold",
        "cost per successful request at the level (currency)",
        "`limits.cost.max_cost_per_request` (currency)",
        "the level's cost row (see ConditionCost)"),
    GateKind.BREAK_EVEN: KindDoc(
        "break-even days <= threshold",
        "days of expected traffic until the setup cost is recovered (days), by the savings "
        "per request against the reference: the baseline, and the current drafter when the "
        "pilot has one (one gate each)",
        "`limits.cost.max_break_even_days` (days)",
        "the break-even entry (see BreakEven)"),
}

INTRO = """# summary.json reference

Generated from the models in `pytest_osprey/report/summary_schema.py`
(`python -m pytest_osprey summary-reference`); a test keeps it current.
`python -m pytest_osprey summary-schema` prints the JSON Schema.

summary.json is the machine-readable results sheet, in the results folder beside
`records.jsonl` and `campaign.json`. Re-judging a campaign
(`python -m pytest_osprey report DIR`) judges it again from those files alone and writes a
marked copy into `DIR/rejudged-<UTC time>/`, the original untouched.

Every key below is always written; "null" marks the values that may be null. `schema`
changes when a key is removed or renamed, or its meaning or unit changes; keys may be added
within a version, so readers should ignore keys they do not know. Numbers are written as
Python's `json` writes them: an unbounded confidence limit is `Infinity`.
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_reference() -> str:
    """docs/summary-json.md: the field tables, then what each gate kind reports."""
    from ..pilot.reference import render_models

    parts = [render_models(Summary, INTRO, defaults=False, paragraph=True)]
    parts.append("## Gate kinds\n")
    parts.append("What `estimate`, `ci`, `threshold` and `details` of a gate hold, by `kind`. "
                 "`-`: always null (`details`: `{}`).\n")
    parts.append("| kind | passes when | estimate (unit) | threshold (unit) | details |\n"
                 "|---|---|---|---|---|")
    for kind, doc in GATE_KINDS.items():
        parts.append(f"| `{kind}` | {_cell(doc.passes_when)} | {_cell(doc.estimate)} "
                     f"| {_cell(doc.threshold)} | {_cell(doc.details)} |")
    parts.append("")
    return "\n".join(parts)


# Models documented in the reference that live with the code computing them.
__all__ = ["BlockDrift", "BlockLoad", "BreakEven", "ConditionCost", "CostLimitsEntry",
           "CostSection", "DomainRow", "Figures", "Finding", "GoodputRow", "GoodputSection",
           "Stability", "Summary"]
