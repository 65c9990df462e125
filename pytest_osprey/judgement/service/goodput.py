"""Goodput: the share of requests that meet the pilot's service-level targets.

A request is *good* when it completed and met every target the pilot names
(``limits.goodput``: time to first token, mean inter-token latency, completion latency); a
failed request is never good. Goodput is reported per condition and load level, and gated per
candidate and load level as paired non-inferiority against the baseline:

* pairs are (prompt, boot, pass) at one load level: the same prompt in the same pass on both
  sides, replayed in adjacent stretches, so slow drift hits both members of a pair;
* the test is the exact unconditional paired non-inferiority test of
  :func:`.noninferiority.mcnemar_noninferiority` (H0: candidate share - baseline share <=
  -margin); the pairs of one block share that block's moment in time, a dependence the test
  does not model, which is why the margin should not be set tighter than the block-to-block
  stability of the machine allows;
* an optional absolute floor ``min_share``: a one-sided Clopper-Pearson bound on the
  candidate's share (pass when the lower bound reaches it, fail when the upper bound is below);
* a gate must be able to fail and to pass: when the baseline meets the targets so rarely that
  losing every such request would not show inferiority, or when there are too few pairs for
  even a perfect candidate to pass, the gate says so and is inconclusive, never a pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scipy import stats as sps

from ...pilot.limits import GoodputTargets
from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ...results.records import RequestRecord
from ..gates.result import GateResult
from ..gates.spec import GateSpec
from ..sheet import Sheet
from ..stats.core import StatOutcome
from ..stats.noninferiority import mcnemar_noninferiority


class GoodputRow(Sheet):
    """Goodput of one condition at one load level (`goodput.table[]`), greedy pass."""

    condition: str
    """Condition name."""
    load: str
    """Load level name."""
    sent: int
    """Requests sent (count); failed ones count as not good."""
    good: int
    """Requests that completed and met every target (count)."""
    share: float | None
    """`good / sent` (0-1); null when nothing was sent."""
    ttft_share: float | None
    """Share of requests meeting the TTFT target alone (0-1); null without that target."""
    tpot_share: float | None
    """Share meeting the inter-token target alone (0-1); null without that target."""
    e2e_share: float | None
    """Share meeting the completion-latency target alone (0-1); null without that target."""


class GoodputSection(Sheet):
    """The targets and every condition's goodput (`goodput`); null when the pilot sets no
    `limits.goodput`."""

    ttft_s: float | None
    """Time-to-first-token target (seconds); null: none."""
    tpot_s: float | None
    """Mean inter-token latency target (seconds per token); null: none."""
    e2e_s: float | None
    """Completion-latency target (seconds); null: none."""
    min_share: float | None
    """Absolute floor on a candidate's share (0-1); null: none."""
    margin: float
    """Non-inferiority margin against the baseline (fraction 0-1)."""
    table: list[GoodputRow]
    """Every condition at every load level."""


def _within(value: float | None, limit: float | None) -> bool:
    return limit is None or (value is not None and value <= limit)


def meets(r: RequestRecord, targets: GoodputTargets) -> bool:
    """Whether one request is good. A one-token answer has no inter-token gap: it meets a
    TPOT target."""
    if not r.ok:
        return False
    tpot = r.tpot_s if r.output_tokens is not None and r.output_tokens >= 2 else 0.0
    return (_within(r.ttft_s, targets.ttft_s) and _within(tpot, targets.tpot_s)
            and _within(r.e2e_s, targets.e2e_s))


def _share(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def goodput_row(records: Sequence[RequestRecord], condition: str, load: str,
                targets: GoodputTargets) -> GoodputRow:
    ok = [r for r in records if r.ok]

    def alone(limit: float | None, value: str) -> float | None:
        if limit is None or not records:
            return None
        hits = 0
        for r in ok:
            v = getattr(r, value)
            if value == "tpot_s" and (r.output_tokens or 0) < 2:
                v = 0.0
            hits += v is not None and v <= limit
        return hits / len(records)

    good = [meets(r, targets) for r in records]
    return GoodputRow(
        condition=condition, load=load, sent=len(records), good=sum(good), share=_share(good),
        ttft_share=alone(targets.ttft_s, "ttft_s"), tpot_share=alone(targets.tpot_s, "tpot_s"),
        e2e_share=alone(targets.e2e_s, "e2e_s"),
    )


def goodput_section(pilot: Pilot, data: SavedCampaign) -> GoodputSection | None:
    """summary.json's `goodput`: None when the pilot sets no targets."""
    targets = pilot.limits.goodput
    if targets is None:
        return None
    table = [goodput_row(data.of(cond, level), cond, level, targets)
             for cond in data.meta.conditions for level in data.meta.load_levels]
    return GoodputSection(ttft_s=targets.ttft_s, tpot_s=targets.tpot_s, e2e_s=targets.e2e_s,
                          min_share=targets.min_share, margin=targets.margin, table=table)


def targets_text(targets: GoodputTargets) -> str:
    parts = []
    if targets.ttft_s is not None:
        parts.append(f"TTFT <= {targets.ttft_s * 1000:g} ms")
    if targets.tpot_s is not None:
        parts.append(f"inter-token <= {targets.tpot_s * 1000:g} ms")
    if targets.e2e_s is not None:
        parts.append(f"completion <= {targets.e2e_s * 1000:g} ms")
    return ", ".join(parts)


def paired_flags(data: SavedCampaign, reference: str, candidate: str, load: str,
                 targets: GoodputTargets) -> tuple[list[bool], list[bool]]:
    """Good/not good of reference and candidate per (prompt, boot, pass) present on both
    sides."""
    def by_key(cond: str) -> dict[tuple[str, int, int], bool]:
        out: dict[tuple[str, int, int], bool] = {}
        for r in data.of(cond, load):
            out.setdefault((r.prompt_id, r.boot, r.repetition), meets(r, targets))
        return out

    ref, cand = by_key(reference), by_key(candidate)
    keys = [k for k in ref if k in cand]
    return [ref[k] for k in keys], [cand[k] for k in keys]


def share_bounds(good: int, n: int, alpha: float) -> tuple[float, float]:
    """One-sided Clopper-Pearson bounds (each at level 1 - alpha) of a binomial share."""
    low = 0.0 if good == 0 else float(sps.beta.ppf(alpha, good, n - good + 1))
    high = 1.0 if good == n else float(sps.beta.ppf(1 - alpha, good + 1, n - good))
    return low, high


@dataclass(frozen=True)
class GoodputResult:
    """The goodput gate's judgement (the gate kind ``goodput`` wraps it)."""

    outcome: StatOutcome
    summary: str
    estimate: float | None = None  # candidate share - reference share, paired
    ci_low: float | None = None
    ci_high: float | None = None
    threshold: float | None = None  # -margin
    p_value: float | None = None
    details: dict[str, object] = field(default_factory=dict)


def goodput_gate(pilot: Pilot, data: SavedCampaign, candidate: str, reference: str,
                 load: str) -> GoodputResult:
    """The goodput gate of ``candidate`` against ``reference`` at ``load``."""
    targets = pilot.limits.goodput
    assert targets is not None
    alpha = (1 - pilot.decision.confidence) / 2
    ref, cand = paired_flags(data, reference, candidate, load, targets)
    n = len(ref)
    what = targets_text(targets)
    if n == 0:
        return GoodputResult("fail", f"no request of {candidate} pairs with {reference} at "
                             f"{load}: goodput cannot be compared")
    margin = targets.margin
    res = mcnemar_noninferiority(ref, cand, margin, alpha)
    ref_share, cand_share = sum(ref) / n, sum(cand) / n
    details: dict[str, object] = {
        "n_pairs": n, "reference_share": ref_share, "candidate_share": cand_share,
        "gains": sum(c and not r for r, c in zip(ref, cand, strict=True)),
        "losses": sum(r and not c for r, c in zip(ref, cand, strict=True)),
        "targets": what, "margin": margin,
    }
    summary = (f"goodput {cand_share:.0%} vs {reference} {ref_share:.0%} "
               f"({res.estimate * 100:+.1f} points, {pilot.decision.confidence:.0%} CI "
               f"[{res.ci_low * 100:+.1f}, {res.ci_high * 100:+.1f}] vs margin "
               f"-{margin * 100:g}) over {n} paired requests; targets {what}")
    outcome = res.outcome
    notes = []
    # Attainability: could this gate fail at all (a candidate losing every request the
    # baseline got right), and could it pass (a candidate exactly as good as the baseline)?
    if mcnemar_noninferiority(ref, [False] * n, margin, alpha).outcome != "fail":
        outcome = "inconclusive"
        notes.append(f"cannot detect a loss: losing all {sum(ref)} of the {n} paired requests "
                     f"{reference} served within the targets would not show the candidate "
                     "worse than the margin; add prompts or blocks, or relax the targets")
    elif outcome == "inconclusive" and \
            mcnemar_noninferiority(ref, ref, margin, alpha).outcome != "pass":
        notes.append(f"{n} pairs cannot show non-inferiority at margin {margin:g} even for a "
                     "candidate as good as the baseline; add prompts or blocks")
    if targets.min_share is not None:
        low, high = share_bounds(sum(cand), n, alpha)
        details |= {"share_low": low, "share_high": high, "min_share": targets.min_share}
        summary += (f"; floor {targets.min_share:.0%}: share bounds [{low:.0%}, {high:.0%}]")
        if high < targets.min_share:
            outcome = "fail"
            notes.append(f"below the floor of {targets.min_share:.0%}")
        elif low < targets.min_share and outcome == "pass":
            outcome = "inconclusive"
            notes.append(f"not shown above the floor of {targets.min_share:.0%}")
    if notes:
        summary += "; " + "; ".join(notes)
    return GoodputResult(outcome, summary, res.estimate, res.ci_low, res.ci_high, -margin,
                         res.p_value, details)


def judge_goodput(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    assert spec.reference is not None and spec.load is not None
    res = goodput_gate(pilot, data, spec.condition, spec.reference, spec.load)
    return GateResult(spec, res.outcome, res.summary, estimate=res.estimate, ci_low=res.ci_low,
                      ci_high=res.ci_high, threshold=res.threshold, p_value=res.p_value,
                      details=res.details)
