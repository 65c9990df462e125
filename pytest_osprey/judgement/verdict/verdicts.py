"""Verdicts: KEEP / DROP / INCONCLUSIVE per candidate, from its judged gates."""

from __future__ import annotations

from dataclasses import dataclass

from ...pilot.schema import Pilot
from ..gates.kinds import GateKind
from ..gates.result import GateResult, Verdict

# Gates of a single condition that a candidate's verdict also needs of its references.
PER_CONDITION = (GateKind.COMPLETED, GateKind.BOOT_CONSISTENCY)


@dataclass(frozen=True)
class CandidateVerdict:
    candidate: str
    verdict: Verdict
    reasons: list[str]
    gates: list[GateResult]
    withheld: str | None = None  # why no verdict: the campaign (or a condition) is partial
    not_run: str | None = None  # "cand did not run: why" when it (or a reference) never ran

    @property
    def unproven(self) -> list[GateResult]:
        """Gating gates that passed (or were skipped) without the evidence to have failed;
        a gate not run for want of its data (``details.not_run``) says so itself."""
        return [g for g in self.gates if g.outcome in ("pass", "skip")
                and g.evidence != "tested" and not g.details.get("not_run")]

    def line(self) -> str:
        why = "; ".join(self.reasons) if self.reasons else "every gate passed"
        weak = self.unproven
        if weak:
            why += "; without the evidence to have failed: " + ", ".join(
                f"{g.spec.kind}[{g.spec.id}] {g.evidence.replace('_', ' ')}" for g in weak)
        return f"{self.verdict} {self.candidate}: {why}"


def verdicts(pilot: Pilot, results: list[GateResult]) -> list[CandidateVerdict]:
    """KEEP only when every gating gate of the candidate (and of its references) passes."""
    out = []
    for cand in pilot.candidates:
        involved = {cand, *pilot.references(cand)}
        mine = [
            g for g in results
            if g.spec.gating and (g.spec.condition == cand or (
                g.spec.kind in PER_CONDITION and g.spec.condition in involved))
        ]
        if not mine:
            continue
        failed = [g for g in mine if g.outcome == "fail"]
        unsure = [g for g in mine if g.outcome == "inconclusive"]
        absent = {str(g.details["not_run"]): str(g.details.get("error"))
                  for g in failed if g.details.get("not_run")}
        if absent:
            # Nothing of it was measured: a candidate that never ran cannot ship (DROP); one
            # whose reference never ran was not compared (INCONCLUSIVE). Either way one
            # reason, not every gate's failure read as a measurement.
            who = cand if cand in absent else next(iter(absent))
            why = f"{who} did not run: {absent[who]}" if who == cand \
                else f"reference {who} did not run: {absent[who]}"
            out.append(CandidateVerdict(cand, "DROP" if who == cand else "INCONCLUSIVE",
                                        [why], mine, not_run=why))
            continue
        if failed:
            verdict: Verdict = "DROP"
        elif unsure:
            verdict = "INCONCLUSIVE"
        else:
            verdict = "KEEP"
        reasons = [f"{g.spec.kind}[{g.spec.id}]: {g.gist}"
                   for g in failed + unsure]

        out.append(CandidateVerdict(cand, verdict, reasons, mine))
    return out
