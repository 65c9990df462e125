"""Which quality checks did not run for a candidate: named beside every verdict, so that a
verdict never implies a check it did not make (greedy output identical says nothing of the
sampled distribution a service at temperature > 0 serves).

A check counts as run when at least one of its gates for the candidate was judged with the
evidence to fail (a skipped gate, or one that could not have failed, did not check).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ...pilot.schema import Pilot
from ..gates.kinds import GateKind as K
from ..gates.result import GateResult

CHECKS: dict[K, tuple[str, str]] = {
    K.GREEDY_IDENTITY: ("greedy identity", "sampling.greedy"),
    K.CORRECTNESS: ("correctness", "sampling.greedy"),
    K.DISTRIBUTION: ("sampled distribution", "sampling.sampled.enabled"),
    K.SAMPLING_PARAMS: ("sampling params", "sampling.params.enabled"),
}
"""The quality checks, in the order they are named: gate kind -> (name, the key that runs it)."""


@dataclass(frozen=True)
class Unchecked:
    """One quality check that did not run for a candidate."""

    check: str  # e.g. "sampled distribution"
    kind: str  # its gate kind
    why: str  # the pilot key that is off, or why its gate could not judge
    judged: bool = False  # its gate ran but could not have failed (not switched off)

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if k != "judged"}


def _why_not(gates: Sequence[GateResult], key: str) -> str:
    if not gates:
        return f"not run ({key} is off)"
    first = gates[0].summary.splitlines()[0] if gates[0].summary else ""
    said = gates[0].evidence.replace("_", " ") if gates[0].evidence == "not_evaluable" \
        else f"{gates[0].outcome} ({gates[0].evidence.replace('_', ' ')})"
    # The gate's own summary often opens with what it was ("not evaluable: ..."): once.
    first = first.removeprefix(f"{said}: ").removeprefix("not evaluable: ")
    return f"{said}: {first}".rstrip(": ")


def unchecked(pilot: Pilot, candidate: str, results: Sequence[GateResult]) -> list[Unchecked]:
    """The quality checks that did not run for ``candidate`` against the baseline."""
    out = []
    for kind, (name, key) in CHECKS.items():
        gates = [g for g in results if g.spec.kind == kind and g.spec.condition == candidate
                 and g.spec.reference == pilot.baseline]
        if any(g.outcome != "skip" and g.evidence != "not_evaluable" for g in gates):
            continue
        out.append(Unchecked(name, kind.value, _why_not(gates, key), judged=bool(gates)))
    return out
