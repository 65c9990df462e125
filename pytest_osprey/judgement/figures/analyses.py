"""Descriptive analyses beside the gates: speed and acceptance per domain, acceptance per draft
position. Pure functions of a saved campaign; nothing here decides a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from pydantic import Field
from scipy import stats as sps

from ...results.folder import SavedCampaign
from ...results.records import RequestRecord
from ..gates.kinds import GateKind
from ..gates.result import GateResult
from ..sheet import Sheet
from .measured import accept_lengths

DOMAIN_MIN_PROMPTS = 3
"""Below this many paired prompts a domain's speedup has no interval (two give a t interval
with one degree of freedom: spanning orders of magnitude, it says nothing)."""
DOMAIN_CONFIDENCE = 0.95


class DomainRow(Sheet):
    """One candidate on one domain of the trace, against one reference (`domains[]`)."""

    candidate: str
    """Candidate condition name."""
    reference: str
    """Condition compared with."""
    load: str
    """Load level name."""
    domain: str
    """Domain of the prompts (the trace's `domain`)."""
    slice: str
    """Slice of those prompts (several slices joined by `+`)."""
    prompts: int
    """Prompts completed on both sides (count)."""
    speedup: float | None
    """Geometric mean over the domain's prompts of reference / candidate completion latency
    (ratio; > 1 faster); null when no prompt paired."""
    ci_low: float | None
    """Lower end of a 95% Student-t interval of the mean log ratio over the domain's prompts
    (ratio; a bootstrap from a handful of prompts is far too narrow); descriptive, not a gate;
    null with fewer than 3 prompts."""
    ci_high: float | None
    """Upper end of that interval (ratio)."""
    accept_length: float | None
    """The candidate's pooled accept length on the domain (tokens per verify step)."""
    held_out_overlap: list[str] = Field(default_factory=list)
    """Ids of the domain's prompts found in the candidate's adaptation data by the held-out
    check (its accept length there is inflated); empty when none were or none was named."""


def _logs(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in records:
        if r.ok and r.e2e_s and r.e2e_s > 0:
            out.setdefault(r.prompt_id, []).append(math.log(r.e2e_s))
    return out


def domain_interval(log_ratios: Sequence[float] | np.ndarray,
                    confidence: float = DOMAIN_CONFIDENCE) -> tuple[float, float] | None:
    """The speedup's interval from per-prompt log ratios: a Student-t interval of their mean,
    exponentiated; None below :data:`DOMAIN_MIN_PROMPTS` prompts."""
    x = np.asarray(log_ratios, dtype=float)
    if x.size < DOMAIN_MIN_PROMPTS:
        return None
    sem = float(np.std(x, ddof=1)) / math.sqrt(x.size)
    if sem == 0.0:
        return float(math.exp(x.mean())), float(math.exp(x.mean()))
    low, high = sps.t.interval(confidence, x.size - 1, loc=float(x.mean()), scale=sem)
    return float(math.exp(low)), float(math.exp(high))


def domain_rows(data: SavedCampaign, reference: str, candidate: str, load: str,
                overlap: Sequence[str] = ()) -> list[DomainRow]:
    """Per domain: the candidate's speedup over ``reference`` and its accept length, with
    ``overlap`` (prompt ids found in its adaptation data) split by domain."""
    ref_recs, cand_recs = data.of(reference, load), data.of(candidate, load)
    ref, cand = _logs(ref_recs), _logs(cand_recs)
    domain_of = {r.prompt_id: r.domain or "-" for r in ref_recs + cand_recs}
    slice_of = {r.prompt_id: r.slice for r in ref_recs + cand_recs}
    out = []
    for domain in sorted(set(domain_of.values())):
        pids = sorted(p for p, d in domain_of.items() if d == domain)
        ratios = np.array([np.mean(ref[p]) - np.mean(cand[p]) for p in pids
                           if p in ref and p in cand])
        low, high = domain_interval(ratios) or (None, None)
        members = set(pids)  # a set: a list's membership test made this O(records x prompts)
        pooled, _ = accept_lengths([r for r in cand_recs if r.prompt_id in members])
        out.append(DomainRow(
            candidate=candidate, reference=reference, load=load, domain=domain,
            slice="+".join(sorted({slice_of[p] for p in pids})), prompts=int(ratios.size),
            speedup=float(math.exp(ratios.mean())) if ratios.size else None,
            ci_low=low, ci_high=high, accept_length=pooled,
            held_out_overlap=[p for p in overlap if domain_of.get(p) == domain],
        ))
    return out


def held_out_overlaps(results: Iterable[GateResult]) -> dict[str, list[str]]:
    """Condition -> the prompt ids its artifact gate's held-out check found in its
    adaptation data (the check's ``overlapping``, as preflight.json records it)."""
    out: dict[str, list[str]] = {}
    for r in results:
        if r.spec.kind == GateKind.ARTIFACT:
            ids = [str(i) for c in r.details.get("checks") or []
                   for i in (c.get("overlapping") or [])]
            if ids:
                out[r.spec.condition] = ids
    return out


def all_domain_rows(data: SavedCampaign, load: str,
                    overlaps: Mapping[str, Sequence[str]] | None = None) -> list[DomainRow]:
    """Every candidate against the baseline at ``load``, per domain; ``overlaps``: see
    :func:`held_out_overlaps`."""
    base = data.meta.baseline
    if not base:
        return []
    return [row for cand in data.meta.candidates
            for row in domain_rows(data, base, cand, load, (overlaps or {}).get(cand, ()))]
