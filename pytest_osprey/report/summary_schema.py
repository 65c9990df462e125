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

from ..decision import Outcome, Verdict

SUMMARY_SCHEMA: Final = 1
"""Version of the summary.json format (the ``schema`` key)."""


class _Sheet(BaseModel):
    # Keep undeclared keys instead of dropping them: a field added to the figures or the
    # cost table still reaches summary.json (tests flag it as undocumented).
    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True,
                              populate_by_name=True)


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
    applicable). Holm's adjustment is already applied."""
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
    """One-sided p-value of the gate's test before Holm's adjustment (unitless); null when
    the gate has no test."""
    details: dict[str, Any]
    """Kind-specific evidence (see Gate kinds below); `{}` when none."""


class FigureEntry(_Sheet):
    """Measured figures of one condition at one load level (`figures[]`), from the completed
    greedy requests of that level; null where nothing was measured."""

    condition: str
    """Condition name."""
    load: str
    """Load level name."""
    concurrency: int
    """Requests in flight at once (closed loop); for an open-loop level its cap, 0 when
    uncapped."""
    ok: int
    """Completed requests (count)."""
    total: int
    """Requests sent (count); `total - ok` failed."""
    ttft_p50_s: float | None
    """Median time to first token (seconds)."""
    ttft_p95_s: float | None
    """95th percentile time to first token (seconds)."""
    e2e_p50_s: float | None
    """Median completion latency, request sent to last token (seconds)."""
    e2e_p95_s: float | None
    """95th percentile completion latency (seconds)."""
    tpot_p50_s: float | None
    """Median time per output token after the first, (e2e - ttft) / (tokens - 1): the mean
    inter-token latency of a request (seconds per token)."""
    tokens_per_s: float | None
    """Aggregate throughput: output tokens of the completed requests / busy wall time of the
    level, summed over blocks (tokens per second)."""
    request_tokens_per_s_p50: float | None
    """Median per-request throughput, output tokens / completion latency (tokens per
    second)."""
    accept_length_pooled: float | None
    """Pooled accept length: all output tokens / all verify steps (tokens per step); null
    without speculation."""
    accept_length_mean: float | None
    """Per-request accept length, tokens / verify steps, averaged over requests (tokens per
    step); null without speculation."""
    peak_memory_mb: float | None
    """Peak device memory of the condition over the whole campaign, not per level (MiB)."""
    load_label: str = ""
    """How the load level reads in reports: `x4` (closed loop) or `Poisson 2/s` (open
    loop)."""
    dispatch_lag_p99_s: float | None = None
    """Open loop: 99th percentile of how late requests were sent after their Poisson arrival
    times, the client's own lag plus any wait under the in-flight cap (seconds); null for
    closed-loop levels."""
    cost_per_request: float | None = None
    """Serving cost per successful request at this level (`cost.currency`), as in the
    cost table; null when no request succeeded."""
    checked: int | None = None
    """Prompts with an `expect` check whose output was checked at this level (count; first
    completed greedy output of each); null when the trace could not be read."""
    correct: int | None = None
    """Of those, outputs that passed their check (count); null as `checked`."""
    correct_fraction: float | None = None
    """`correct / checked` (0-1); null when nothing was checked."""


class CostLimitsEntry(_Sheet):
    """The pilot's cost limits (`cost.limits`)."""

    max_cost_per_request: float | None
    """`limits.cost.max_cost_per_request` (currency per successful request); null: none."""
    max_break_even_days: float | None
    """`limits.cost.max_break_even_days` (days); null: none."""


class CostRow(_Sheet):
    """Serving cost of one condition at one load level (`cost.table[]`)."""

    condition: str
    """Condition name."""
    load: str
    """Load level name."""
    concurrency: int
    """As in figures: requests in flight (open loop: its cap, 0 when uncapped)."""
    ok: int
    """Successful requests (count)."""
    total: int
    """Requests sent (count)."""
    busy_s: float | None
    """Busy wall time of the level's requests, failed ones included, per block from first
    start to last finish, summed (seconds)."""
    requests_per_hour: float | None
    """Successful requests per busy hour (requests per hour)."""
    hourly_cost: float
    """`device_hour_price * devices_per_server` (currency per hour)."""
    cost_per_request: float | None
    """`hourly_cost / requests_per_hour` (currency per successful request); null when none
    succeeded."""
    setup_cost: float
    """Pretraining + adaptation + idle device hours priced (currency)."""
    currency: str
    """Currency code of the amounts."""
    load_label: str = ""
    """As in figures: `x4` (closed loop) or `Poisson 2/s` (open loop)."""


class BreakEvenEntry(_Sheet):
    """When a candidate's setup cost is paid back by its savings per request
    (`cost.break_even[]`), at the primary load level."""

    candidate: str
    """Candidate condition name."""
    reference: str
    """Condition it saves against."""
    load: str
    """Load level of the costs compared."""
    currency: str
    """Currency code of the amounts."""
    setup_cost: float
    """Candidate's setup cost (currency)."""
    cost_reference: float | None
    """Reference's cost per successful request (currency)."""
    cost_candidate: float | None
    """Candidate's cost per successful request (currency)."""
    savings_per_request: float | None
    """`cost_reference - cost_candidate` (currency per request)."""
    requests: float | None
    """`setup_cost / savings_per_request` when savings are positive (requests)."""
    days: float | None
    """`requests / cost.expected_requests_per_day`, when that is given (days)."""
    reason: str | None
    """Why there is no break-even, or why days are unknown; null when `days` is set."""


class CostSection(_Sheet):
    """Cost inputs and what they imply (`cost`)."""

    currency: str
    """Currency code of every amount."""
    device_hour_price: float
    """Price of one device for one hour (currency)."""
    devices_per_server: int
    """Devices one serving instance occupies (count)."""
    expected_requests_per_day: float | None
    """Expected traffic (requests per day); null when not given."""
    primary_load: str
    """Load level whose costs decide (`decision.primary_load`)."""
    limits: CostLimitsEntry
    """The cost limits judged."""
    table: list[CostRow]
    """Every condition at every load level, in the pilot's order."""
    break_even: list[BreakEvenEntry]
    """Each candidate against each of its references."""


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


class HistoryFinding(_Sheet):
    """One check of a kept drafter against the earlier campaign (`comparison.findings[]`)."""

    candidate: str
    """The drafter kept in the earlier campaign."""
    check: Literal["verdict", "speedup", "latency", "accept_length"]
    """verdict: still KEEP; speedup: the speedup gate vs the baseline (x); latency: its own
    completion latency paired by prompt across the runs, as "times as fast as before" (x, >1
    faster now); accept_length: pooled accept length (tokens per verify step)."""
    load: str | None
    """Load level; null for the verdict."""
    previous: float | str | None
    """The earlier figure (verdict name, speedup x, accept length); null for latency."""
    current: float | str | None
    """This campaign's figure, same unit."""
    regression: bool
    """Worse than before beyond `comparison.tolerance` (for speedup and latency: the whole
    confidence interval is)."""
    text: str
    """The finding in words."""
    ci: list[float | None] | None = None
    """Confidence interval of `current` where it has one (speedup, latency)."""


class HistoryComparison(_Sheet):
    """`--osprey-compare DIR`: this campaign against an earlier accepted one of the same
    trace (`comparison`)."""

    previous_dir: str
    """The earlier campaign's results folder."""
    previous_run_id: str | None
    """Its run id."""
    trace_hash: str
    """The trace hash both share."""
    tolerance: float
    """decision.regression_tolerance (fraction)."""
    kept: list[str]
    """Drafters the earlier campaign kept: the ones held to it."""
    findings: list[HistoryFinding]
    """Every check made."""
    notes: list[str]
    """What could not be compared, and why."""


class Summary(_Sheet):
    """summary.json: the verdicts, every gate and the measured figures of one judged
    campaign. Rewritten whole by each judging (`python -m pytest_osprey report DIR`)."""

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
    """The campaign's status: complete, interrupted or running."""
    verdicts: list[VerdictEntry]
    """One per judged candidate, in the pilot's order."""
    gates: list[GateEntry]
    """Every gate judged."""
    figures: list[FigureEntry]
    """Every condition at every load level."""
    cost: CostSection
    """Serving cost and break-even."""
    conditions: dict[str, ConditionEntry]
    """Condition name -> how it ran."""
    comparison: HistoryComparison | None = None
    """Comparison with a previous campaign (--osprey-compare); null when none."""


def json_schema() -> dict[str, Any]:
    """The JSON Schema of summary.json (draft 2020-12, the dialect pydantic writes)."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            **Summary.model_json_schema()}


@dataclass(frozen=True)
class GateKind:
    """What a gate kind puts in `estimate`, `ci`, `threshold` and `details`."""

    passes_when: str
    estimate: str
    threshold: str
    details: str


_NONE = "-"
_DIVERGENCE = ("`prompt_id`, `position` (token index), `reference_token`, `candidate_token`, "
               "`margin` (the reference's top-1 minus top-2 logprob there), `near_tie`, "
               "`reference_text`, `candidate_text`")

GATE_KINDS: dict[str, GateKind] = {
    "command_line": GateKind(
        "the condition's engine command line builds (and parses where the engine's parser is "
        "importable)", _NONE, _NONE,
        "`condition`, `ok`, `lines` (the masked command line and parser messages)"),
    "artifact": GateKind(
        "every drafter check passes", _NONE, _NONE,
        "`ok`, `checks` (list of `name`, `ok`, `detail`)"),
    "completed": GateKind(
        "completed fraction >= threshold",
        "completed requests / requests sent at the level (fraction 0-1)",
        "`limits.min_completed_fraction` (fraction 0-1)",
        "`ok`, `total` (requests)"),
    "fairness": GateKind(
        "engine, version, device, precision, context, sampling and trace identical", _NONE,
        _NONE,
        "`differences` (list of what differs), `compared` (field -> condition -> value)"),
    "greedy_identity": GateKind(
        "genuine divergences <= threshold and near-tie fraction within "
        "`limits.quality.max_near_tie_fraction`",
        "genuine (not near-tie) greedy divergences (count)",
        "`limits.quality.max_genuine_divergences` (count)",
        "`compared`, `identical` (prompts), `genuine`, `near_ties` (lists of divergences: "
        + _DIVERGENCE + ")"),
    "correctness": GateKind(
        "CI low > threshold (non-inferior pass rate; exact McNemar)",
        "candidate pass rate minus reference pass rate over paired prompts (fraction -1..1)",
        "minus `limits.quality.correctness_margin` (fraction)",
        "`n_pairs` (prompts), `reference_rate`, `candidate_rate` (fractions 0-1), `losses` "
        "(prompt id -> why the candidate's answer failed), `p_holm` (Holm-adjusted p-value, "
        "gating claims of a candidate with two or more)"),
    "distribution": GateKind(
        "no permutation test rejects at the threshold after Holm",
        "mean total-variation distance between the sampled token distributions (0-1)",
        "family-wise level alpha, `limits.quality.distribution_alpha` (probability)",
        "`min_adjusted_p`, `tv_null` (TV expected by chance alone, 0-1), `underpowered`, "
        "`worst` (the most different position, in words)"),
    "speedup": GateKind(
        "CI low > threshold; fail when CI high < threshold; else inconclusive (or the "
        "group-sequential decision with `decision.early_stop`)",
        "completion-latency speedup, reference / candidate, geometric mean over prompts "
        "(ratio; > 1 is faster); CI: bootstrap over prompts",
        "`limits.speedup_min` against the baseline, 1.0 against another reference (ratio)",
        "`method` (CI method), `n_prompts`, `p_holm` (as for correctness)"),
    "latency": GateKind(
        "upper confidence bound of the percentile <= threshold",
        "observed percentile of the limit's metric (seconds); CI: [estimate, upper bound]",
        "the limit's `max_s` (seconds)", _NONE),
    "memory": GateKind(
        "peak within `limits.memory` (absolute and increase over the baseline)",
        "peak device memory of the candidate (MiB)",
        "`limits.memory.max_peak_mb` (MiB); null when only the increase is limited", _NONE),
    "cost": GateKind(
        "cost per successful request <= threshold",
        "cost per successful request at the level (currency)",
        "`limits.cost.max_cost_per_request` (currency)",
        "the level's cost row (see CostRow)"),
    "break_even": GateKind(
        "break-even days <= threshold",
        "days of expected traffic until the setup cost is recovered (days)",
        "`limits.cost.max_break_even_days` (days)",
        "the break-even entry (see BreakEvenEntry)"),
}

INTRO = """# summary.json reference

Generated from the models in `pytest_osprey/report/summary_schema.py`
(`python -m pytest_osprey summary-reference`); a test keeps it current.
`python -m pytest_osprey summary-schema` prints the JSON Schema.

summary.json is the machine-readable results sheet, in the results folder beside
`records.jsonl` and `campaign.json`. Re-judging a campaign
(`python -m pytest_osprey report DIR`) rewrites it from those files alone.

Every key below is always written; "null" marks the values that may be null. `schema`
changes when a key is removed or renamed, or its meaning or unit changes; keys may be added
within a version, so readers should ignore keys they do not know. Numbers are written as
Python's `json` writes them: an unbounded confidence limit is `Infinity`.
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_reference() -> str:
    """docs/summary-json.md: the field tables, then what each gate kind reports."""
    from ..reference import render_models

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
