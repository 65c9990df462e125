"""What workload was timed, and how requests of unequal length are compared like with like.

At a sampled serving setting the conditions' outputs differ, so two requests of one prompt
need not produce as many tokens. The pilot asks for fixed lengths (ignore end of sequence,
as serving benchmarks do): then every timed request of a prompt runs to its budget and
completion latency compares as it is. A request that ended early anyway (an engine that
ignored ignore_eos, a context limit) or a pilot without fixed lengths is compared per output
token: its latency is taken at the prompt's common length, ``e2e_s x L / output_tokens``,
where L is the most tokens any timed request of the prompt at that level produced. Where
every length agrees this is the completion latency unchanged; the gate's details count the
requests that were rescaled.

Everything here is read from the records (the sampling each request was sent with).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ...results.records import RequestRecord


@dataclass(frozen=True)
class Lengths:
    """The timed requests' output lengths at one level."""

    common: dict[str, int]  # prompt id -> the length its latencies are taken at
    rescaled: int  # ok timed requests whose own length differed from it
    timed: int  # ok timed requests

    def latency(self, r: RequestRecord) -> float | None:
        """``r``'s completion latency at its prompt's common length (None: not comparable)."""
        if r.e2e_s is None:
            return None
        n, common = r.output_tokens, self.common.get(r.prompt_id)
        if not n or common is None or n == common:
            return r.e2e_s
        return r.e2e_s * common / n


def lengths(records: Iterable[RequestRecord], level: str, mode: str) -> Lengths:
    """The common length of each prompt over the ok ``mode`` records at ``level``."""
    common: dict[str, int] = {}
    seen: list[RequestRecord] = []
    for r in records:
        if r.mode == mode and r.load == level and r.ok and r.output_tokens:
            seen.append(r)
            common[r.prompt_id] = max(common.get(r.prompt_id, 0), r.output_tokens)
    rescaled = sum(1 for r in seen if r.output_tokens != common[r.prompt_id])
    return Lengths(common, rescaled, len(seen))


def served_sampling(records: Iterable[RequestRecord], mode: str) -> list[dict[str, object]]:
    """The distinct sampling settings the ``mode`` records were sent with (seeds aside)."""
    out: list[dict[str, object]] = []
    for r in records:
        if r.mode != mode or r.filler:
            continue
        one: dict[str, object] = {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k,
               "min_p": r.min_p, "ignore_eos": r.ignore_eos}
        if one not in out:
            out.append(one)
    return out


def sampling_text(settings: list[dict[str, object]]) -> str:
    """The timed sampling in words, for a gate's summary ("" when greedy or unrecorded)."""
    words = []
    for s in settings:
        if not s.get("temperature"):
            continue
        parts = [f"temperature {s['temperature']:g}", f"top-p {s['top_p']:g}"]
        if s.get("top_k") is not None:
            parts.append(f"top-k {s['top_k']}")
        if s.get("min_p"):
            parts.append(f"min-p {s['min_p']:g}")
        parts.append("fixed length" if s.get("ignore_eos") else "lengths as sampled")
        words.append(", ".join(parts))
    return "timed at " + "; ".join(words) if words else ""
