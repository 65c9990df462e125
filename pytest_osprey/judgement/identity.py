"""Output quality: tie-aware greedy identity against a reference condition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..results.records import RequestRecord


@dataclass(frozen=True)
class Divergence:
    prompt_id: str
    position: int
    reference_token: int | None
    candidate_token: int | None
    margin: float | None  # reference's top-1 minus top-2 logprob at that position
    near_tie: bool
    reference_text: str
    candidate_text: str


@dataclass
class IdentityResult:
    compared: int = 0
    identical: int = 0
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def genuine(self) -> list[Divergence]:
        return [d for d in self.divergences if not d.near_tie]

    @property
    def near_ties(self) -> list[Divergence]:
        return [d for d in self.divergences if d.near_tie]

    @property
    def near_tie_fraction(self) -> float:
        return len(self.near_ties) / self.compared if self.compared else 0.0


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token; a length difference counts at the shorter end."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _context(text: str, ids: Sequence[int], pos: int, width: int = 60) -> str:
    # Token->char offsets are engine-specific; approximate by the proportional position.
    if not ids:
        return text[:width]
    at = int(len(text) * pos / max(1, len(ids)))
    return text[max(0, at - width // 2) : at + width // 2]


def greedy_identity(
    reference: Sequence[RequestRecord], candidate: Sequence[RequestRecord], epsilon: float
) -> IdentityResult:
    """Compare each prompt's greedy output (first ok record per prompt on each side).

    At the first divergence the reference's top-1/top-2 margin tells a near-tie (margin <=
    epsilon: numerics may flip it, harmless) from a genuine change in what users get.
    """
    ref = first_ok_greedy(reference)
    cand = first_ok_greedy(candidate)
    result = IdentityResult()
    for pid, r in ref.items():
        c = cand.get(pid)
        if c is None:
            continue
        result.compared += 1
        pos = first_divergence(r.output_ids, c.output_ids)
        if pos is None:
            result.identical += 1
            continue
        margin = None
        if r.top2_margin is not None and pos < len(r.top2_margin):
            margin = r.top2_margin[pos]
        result.divergences.append(
            Divergence(
                prompt_id=pid,
                position=pos,
                reference_token=r.output_ids[pos] if pos < len(r.output_ids) else None,
                candidate_token=c.output_ids[pos] if pos < len(c.output_ids) else None,
                margin=margin,
                near_tie=margin is not None and margin <= epsilon,
                reference_text=_context(r.output_text, r.output_ids, pos),
                candidate_text=_context(c.output_text, c.output_ids, pos),
            )
        )
    return result


def first_ok_greedy(records: Sequence[RequestRecord]) -> dict[str, RequestRecord]:
    """Prompt id -> its first completed greedy record (earliest boot and pass, then start
    time)."""
    out: dict[str, RequestRecord] = {}
    for r in sorted(records, key=lambda r: (r.boot, r.repetition, r.started_at or 0.0)):
        if r.ok and r.mode == "greedy" and r.prompt_id not in out:
            out[r.prompt_id] = r
    return out
