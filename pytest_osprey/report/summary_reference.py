"""docs/summary-json.md: summary.json's reference, rendered from its models (the field
tables) and from what each gate kind puts in ``estimate``, ``ci``, ``threshold`` and
``details`` (a test checks the latter against a real run)."""

from __future__ import annotations

from dataclasses import dataclass

from ..judgement import GateKind
from .summary_schema import Summary


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
        "seen; `mean_k`: draft tokens per verify step over the stretch, from vLLM's counters), "
        "`reconciliation` (per stretch and counter: `records`, `engine`, `mismatch`), "
        "`records_checked` (record checks made: each record's output tokens against its own "
        "verify steps and accepted drafts, the engine's accepted total against its histogram), "
        "`record_mismatches` (those that failed: `condition`, `prompt_id`, `load`, `mode`, "
        "`boot`, `stretch`, `check`, `value`, `low`, `high`), "
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
        "where the target scored the samples (scores.jsonl): the exact per-position test "
        "(score test, randomised PIT, top-1 rate, tail rate, draws outside the served "
        "support, per position class: first token, drafted positions, bonus tokens, or "
        "positions 2+ where the engine does not tell them apart) does not reject at the "
        "threshold, and the baseline's own samples (the A/A control) pass it too (a failing "
        "control: inconclusive). Where nothing was scored (an endpoint without logprobs): "
        "the stratified permutation test (each prompt's samples relabelled independently) "
        "of the summed standardised MMD^2 under a sequence kernel does not reject at the "
        "threshold; inconclusive (evidence `not_evaluable`) when the smallest attainable "
        "p-value of the budget exceeds it",
        "exact: the effective temperature of the class with the smallest p (served: "
        "`sampling.sampled.temperature`); MMD: mean unbiased MMD^2 over prompts (0 expected "
        "for identical samplers; unitless, kernel scale 0-2)",
        "alpha, `limits.quality.distribution_alpha` (probability)",
        "exact: `method` (`exact`), `scorer`, `samples`, `candidate` and `control` (each: "
        "`outcome`, `p_value`, `summary`, `served`, `split_known`, `confidence`, and per "
        "class `n`, `score_z`, `pit_p`, `top1_observed`, `top1_expected`, "
        "`outside_support`, `temperature`, `temperature_ci` (null bound: beyond the fit's "
        "range), `decisive`, `p_value`, `outcome`); MMD: `method` (`two-sample`), "
        "`smallest_p` (floor of the p-value "
        "at this budget), `critical` (the smallest distance this budget flags), "
        "`similarity_ratio` (candidate within-prompt sample similarity over the baseline's; "
        "descriptive, not judged), `prompts`, `samples_per_prompt`, `worst` (the most "
        "different prompt, in words)"),
    GateKind.SAMPLING_PARAMS: KindDoc(
        "one verdict per sampling parameter under speculation, against the baseline: "
        "temperature, top-p, top-k, min-p, frequency and presence penalties each sent alone "
        "and sampled (`sampling.params.samples` per prompt; the penalties at T 0.3, the others "
        "at `sampling.sampled.temperature`), scored by the target and judged by the exact test "
        "at the drafted positions (positions 2+ where the engine does not tell them apart; the "
        "baseline's own samples the A/A control; Bonferroni over the sampled probes at "
        "`limits.quality.distribution_alpha`); the repetition penalty by its greedy probe (a "
        "score cannot rebuild it); the seed by one seeded request sent twice (the same tokens "
        "wherever the baseline gives them); the other greedy probes (stop, max/min tokens, "
        "logit bias: identical greedy tokens; JSON schema, regex: valid output) as before. "
        "Fails on a parameter not honoured (\"top-p ignored at drafted positions\"), and on one "
        "refused under speculation (the candidate answers \"unsupported\" or HTTP 400 where the "
        "baseline accepts it) only where the service's timed requests use it "
        "(`sampling.serving`); skip when nothing could be tested",
        "parameters not honoured, plus refusals the service meets (count)", "0",
        "`parameters` (name -> `status`: `honoured` (no fault found at the probe's budget, "
        "sized in `why`), `not_honoured`, `refused` or `not_tested`; "
        "`why`: the sizing sentence, the engine's answer or the reason; `ignored`: the evidence "
        "names this parameter; `p_value`; `verdict`: the clause in words), `honoured` (names), "
        "`broken` (name -> what went wrong), `refused` (name -> the engine's answer), "
        "`not_tested` (name -> why: unsupported by the baseline, no effect on it, ...)"),
    GateKind.ACCEPTANCE: KindDoc(
        "reported only, never gating: no draft position's acceptance rate collapsed, against "
        "the lightest load level or the current drafter (below (1 - "
        "`limits.quality.max_acceptance_drop`) x the compared rate, with confidence); skip "
        "when the engine reports no per-position acceptance",
        _NONE, _NONE,
        "`rates` (load level -> acceptance rate per draft position), `collapses` (in words, "
        "with the positions)"),
    GateKind.SPEEDUP: KindDoc(
        "CI low > threshold (the deciding test's one-sided p <= alpha); fail when CI high < "
        "threshold; else inconclusive. With an unstable environment (a pass changed) either "
        "verdict must also hold on the drift-adjusted speedup (without the pass that changed "
        "the comparison), else inconclusive. The primary gates (against the baseline and "
        "the current drafter) with `decision.early_stop`: the group-sequential decision at "
        "the campaign's last look. "
        "A slice gate on a trace without prompts of that slice is not run: skip, with "
        "`not_run` saying so (never listed in `verdicts[].unproven`)",
        "completion-latency speedup, reference / candidate, by `decision.speedup_metric`: "
        "per_prompt (geometric mean of per-prompt ratios) or total_time (ratio of summed "
        "latencies) (ratio; > 1 is faster); CI: t with a variance clustered by prompt and by "
        "time unit (a block in one pass; at low load, where a unit holds fewer than 8 "
        "requests per condition, the units as a time series: a Parzen-kernel HAC term; "
        "total_time: Fieller)",
        "`limits.speedup_min` against the baseline, 1.0 against another reference (ratio)",
        "`method`, `metric`, `n_prompts`, `n_clusters` (min of prompts and time units: what df "
        "rests on), `n_time_units` ((boot, pass, block) units), `serial_clusters` (the serial "
        "term's effective time clusters, which stand in for the units in df; 0: not used), "
        "`n_boots`, `n_passes`, "
        "`per_prompt` and `total_time` (each `estimate`, `ci`, `p_value`, `df`, `outcome`), "
        "`time_share` and `boot_share` (shares of the estimate's variance due to pass-to-pass "
        "and boot-to-boot variation), `shared_share` (the share of it the other load levels "
        "hold too: stable prompt-to-prompt and boot variation; the crossover's covariance), "
        "`boot_confounded` (one boot per condition: a boot "
        "offset cannot be told from the drafter), `drift` (each condition against itself: "
        "`estimate` ratio, `ci`, `p_value`, `boot`, `pass`, `unstable`, `tolerance`, "
        "`bias_bound`: the largest change of one pass of the reference against the same pass "
        "of the candidate, ratio, descriptive; `changed`: the passes (`boot`, `pass`) where the "
        "comparison changed: one condition changed and the other did not, or the pair's ratio "
        "moved, by more than the tolerance), `drift_adjusted` (with an unstable environment: "
        "the gating metric without the changed pass least favourable to the verdict, as "
        "`estimate`, `ci`, `p_value`, `df`, `outcome`; a KEEP or a DROP stands only if it "
        "holds there too), `stall` (a run of one condition's requests that ran markedly "
        "slower than their pairs: `condition`, `first_unit` and `last_unit` (time units in "
        "the order they ran, 1-based), `from` and `to` (`boot`, `pass`), `size` (times "
        "slower), `score` (robust z), `p_value`, `reach` (the time units the serial term "
        "reaches over; null where it is off), `outlasts_reach` (the stall ran longer than "
        "that: the interval may be too narrow); named, counted by the serial term), "
        "`reason` (why no verdict despite the interval), `held_back` (that reason as a word: "
        "`one_block` or `unstable_environment`), `sequential` (`look`, `looks`, `z`, "
        "`keep_boundary`, `drop_boundary`, `decision`), `advice` (`more_prompts`, "
        "`more_passes`: (smallest, central, largest), `better`, `settle`: what would settle "
        "it, in words); a slice gate not run: only `not_run` (why, in words)"),
    GateKind.BOOT_CONSISTENCY: KindDoc(
        "with `load.boots_per_condition` >= 2: the condition's boots serve alike: identical "
        "greedy outputs at the lightest load measured on two boots or more (first pass of "
        "each boot; near-ties by the first "
        "boot's own margin apart; over the boots that ran a greedy pass: "
        "`sampling.greedy_boots`) and no boot whose accept length differs from its other "
        "boots' by more than `decision.regression_tolerance` (Mann-Whitney, p < 0.01). "
        "Skipped where outputs cannot be compared (a greedy pass on one boot) and there is no "
        "accept length (a server that does not speculate)",
        "genuine greedy output divergences between boots (count)", "0 (count)",
        "`boots`, `output_boots` (boots with greedy outputs), `prompts` (compared on every "
        "one of those), `divergent`, `near_ties` (in words), "
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
        "clustered two ways, by prompt and by time unit (boot, pass, block): Korn-Graubard "
        "clustered Clopper-Pearson",
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

Generated from the models in `pytest_osprey/report/summary_schema.py` and
`pytest_osprey/report/summary_reference.py`
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
