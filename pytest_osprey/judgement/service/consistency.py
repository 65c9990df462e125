"""Boot consistency: each boot of a condition must serve like its others.

Bugs that show only on some boots exist in the field (a drafter loaded with the wrong
vocabulary map on one start, a tree kernel picked by a race, acceptance that collapses after
a particular warm-up). With ``load.boots_per_condition`` >= 2 every condition is compared with
itself across its boots:

* greedy outputs at the lightest load level measured on two boots or more (one request at a
  time, so batch composition cannot explain a difference; ``load.level_passes`` can leave
  the lightest level on the first boot alone, and then the next level is compared), first
  pass of each boot: a divergence is genuine unless the
  first boot's own top-1/top-2 margin there is within ``near_tie_epsilon``;
* accept length (speculative conditions; the timed records, so at the serving sampling where
  the pilot serves sampled): per-request accept lengths of each boot against
  the pooled others, a Mann-Whitney test; a boot that differs by more than
  ``decision.regression_tolerance`` with p < 0.01 is flagged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ...pilot.schema import Pilot
from ...results.folder import SavedCampaign
from ...results.records import RequestRecord, timed_mode
from ..gates.result import GateResult, Outcome
from ..gates.spec import GateSpec
from ..quality.identity import first_divergence

ALPHA = 0.01


@dataclass
class Consistency:
    boots: int
    output_boots: int = 0  # boots with greedy outputs to compare
    prompts: int = 0  # compared across every boot with greedy outputs
    divergent: list[str] = field(default_factory=list)  # "prompt: boot 1 vs boot 2 @token 7"
    near_ties: list[str] = field(default_factory=list)
    accept: dict[int, float] = field(default_factory=dict)  # boot (1-based) -> pooled
    accept_flags: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.divergent and not self.accept_flags


def _first_per_boot(
    records: Sequence[RequestRecord], level: str
) -> dict[str, dict[int, RequestRecord]]:
    out: dict[str, dict[int, RequestRecord]] = {}
    for r in sorted(records, key=lambda r: (r.boot, r.repetition, r.started_at or 0.0)):
        if r.ok and r.mode == "greedy" and r.load == level:
            out.setdefault(r.prompt_id, {}).setdefault(r.boot, r)
    return out


def boot_consistency(records: Sequence[RequestRecord], level: str, epsilon: float,
                     tolerance: float) -> Consistency:
    """One condition's records: its boots compared with each other (see the module). Outputs
    are compared over the boots that ran a greedy pass (``sampling.greedy_boots`` can leave
    it to the first), accept length over every boot that ran timed passes."""
    mode = timed_mode(records)
    boots = sorted({r.boot for r in records if r.mode in ("greedy", mode)})
    greedy = sorted({r.boot for r in records if r.mode == "greedy"})
    res = Consistency(boots=len(boots), output_boots=len(greedy))
    if len(boots) < 2:
        return res
    compared = _first_per_boot(records, level) if len(greedy) >= 2 else {}
    for pid, per_boot in sorted(compared.items()):
        if len(per_boot) < len(greedy):
            continue
        res.prompts += 1
        first_boot = min(per_boot)
        first = per_boot[first_boot]
        for boot, other in sorted(per_boot.items()):
            if boot == first_boot:
                continue
            pos = first_divergence(first.output_ids, other.output_ids)
            if pos is None:
                continue
            margin = (first.top2_margin[pos] if first.top2_margin is not None
                      and pos < len(first.top2_margin) else None)
            text = f"{pid}: boot {first_boot + 1} vs boot {boot + 1} @token {pos}"
            if margin is not None and margin <= epsilon:
                res.near_ties.append(text + f" (margin {margin:.3f})")
            else:
                res.divergent.append(text)
            break
    _acceptance(records, boots, tolerance, res)
    return res


def _acceptance(records: Sequence[RequestRecord], boots: list[int], tolerance: float,
                res: Consistency) -> None:
    from scipy import stats

    per_boot: dict[int, list[float]] = {b: [] for b in boots}
    pooled: dict[int, list[tuple[int, float]]] = {b: [] for b in boots}
    mode = timed_mode(records)  # acceptance as served
    for r in records:
        if r.ok and r.mode == mode and r.output_tokens and r.spec_verify_ct:
            per_boot[r.boot].append(r.output_tokens / r.spec_verify_ct)
            pooled[r.boot].append((r.output_tokens, float(r.spec_verify_ct)))
    if not all(per_boot.values()):
        return
    for b in boots:
        res.accept[b + 1] = sum(t for t, _ in pooled[b]) / sum(v for _, v in pooled[b])
    # Against the typical boots (within the tolerance of the median boot), so that one boot
    # off does not make the others look off too; with two boots neither can be told typical.
    median = float(sorted(res.accept.values())[len(boots) // 2]) if len(boots) > 2 else None
    typical = [b for b in boots if median is not None
               and abs(res.accept[b + 1] / median - 1) <= tolerance]
    suspects = [b for b in boots if b not in typical] if typical else boots[1:]
    for b in suspects:
        against = typical or [o for o in boots if o != b]
        others = [x for o in against for x in per_boot[o]]
        rest = sum(t for o in against for t, _ in pooled[o]) / sum(
            v for o in against for _, v in pooled[o])
        ratio = res.accept[b + 1] / rest
        if abs(ratio - 1) <= tolerance or len(per_boot[b]) < 3 or len(others) < 3:
            continue
        p = float(stats.mannwhitneyu(per_boot[b], others, alternative="two-sided").pvalue)
        if p < ALPHA:
            res.accept_flags.append(
                f"boot {b + 1} accepted {res.accept[b + 1]:.2f} tokens per step against "
                f"{rest:.2f} on its other boots ({ratio - 1:+.0%}, p={p:.2g})")


def compared_level(pilot: Pilot, records: Sequence[RequestRecord]) -> str:
    """The lightest closed-loop level whose greedy records span two boots or more (else the
    lightest level): a level measured on one boot has nothing to compare."""
    load = pilot.load
    closed = sorted((k for k, v in load.levels.items() if isinstance(v, int)),
                    key=load.concurrency)
    for level in closed:
        if len({r.boot for r in records if r.load == level and r.mode == "greedy"}) >= 2:
            return level
    return load.lightest()


def judge_boot_consistency(spec: GateSpec, pilot: Pilot, data: SavedCampaign) -> GateResult:
    mine = [r for r in data.records if r.condition == spec.condition]
    level = compared_level(pilot, mine)
    res = boot_consistency(mine, level,
                           pilot.limits.quality.near_tie_epsilon,
                           pilot.decision.regression_tolerance)
    if res.boots < 2:
        return GateResult(spec, "skip", f"{res.boots} boot recorded: nothing to compare")
    accept = ", ".join(f"boot {b}: {a:.2f}" for b, a in sorted(res.accept.items()))
    if res.output_boots < 2:
        outputs = (f"outputs not compared: greedy outputs on {res.output_boots} of "
                   f"{res.boots} boots (sampling.greedy_boots)")
        if not accept:
            return GateResult(spec, "skip", f"{outputs}; no accept length to compare",
                              details={"boots": res.boots, "output_boots": res.output_boots})
        summary = f"{outputs}; accept length {accept}"
    else:
        summary = (f"{res.prompts} prompts compared over {res.output_boots} boots at {level}: "
                   f"{len(res.divergent)} genuine output divergence(s), {len(res.near_ties)} "
                   "at near-ties" + (f"; accept length {accept}" if accept else ""))
    for line in [*res.divergent[:3], *res.accept_flags]:
        summary += f"\n  {line}"
    outcome: Outcome = "pass" if res.ok else "fail"
    if res.prompts == 0 and not res.accept:
        outcome, summary = "inconclusive", summary + "; nothing completed on every boot"
    return GateResult(spec, outcome, summary, estimate=len(res.divergent), threshold=0,
                      details={"boots": res.boots, "output_boots": res.output_boots,
                               "prompts": res.prompts,
                               "divergent": res.divergent, "near_ties": res.near_ties,
                               "accept_length": {str(k): v for k, v in res.accept.items()},
                               "accept_flags": res.accept_flags})
