"""Per-position acceptance: how often the j-th drafted token is accepted, and its collapse.

Engines report it per request where they can (SGLang's spec_correct_drafts_histogram, vLLM's
per-position counters when a request runs alone, the embedded engine's verify steps):
``spec_drafts`` verify steps and, per draft position j, how many accepted the j-th token.
Pooled over requests, position j's rate is sum(accepted[j]) / sum(drafts).

A drafter that works at batch size 1 and breaks when sequences are batched (or on some boots)
shows it here first: acceptance at every position falls towards 0 while the output may still
look plausible. A position **collapses** against a comparison when its rate falls below
(1 - ``max_drop``) x the comparison's, with confidence: the one-sided (1 - alpha) upper
Clopper-Pearson bound of its rate lies below (1 - max_drop) x the lower bound of the
comparison's. Verify steps are counted as independent trials, which understates the spread
when acceptance varies between requests; the large relative drop demanded keeps ordinary
variation from being flagged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scipy import stats as sps

from ...results.records import RequestRecord


@dataclass(frozen=True)
class PositionRates:
    drafts: int  # verify steps
    accepted: tuple[int, ...]  # per draft position
    requests: int

    @property
    def rates(self) -> list[float]:
        return [a / self.drafts for a in self.accepted] if self.drafts else []

    def text(self) -> str:
        return "/".join(f"{r:.2f}" for r in self.rates)


@dataclass(frozen=True)
class Collapse:
    position: int  # 0-based draft position
    rate: float
    compared_rate: float


def pooled(records: Iterable[RequestRecord]) -> PositionRates | None:
    """The completed requests' per-position acceptance, pooled; None when none reported it.
    Positions are those every reporting request shares."""
    drafts = 0
    total: list[int] | None = None
    n = 0
    for r in records:
        acc = r.spec_accepted_per_position
        if not r.ok or not r.spec_drafts or not acc:
            continue
        n += 1
        drafts += r.spec_drafts
        total = list(acc) if total is None else [a + b for a, b in zip(total, acc, strict=False)]
    if total is None or drafts == 0:
        return None
    return PositionRates(drafts, tuple(total), n)


def per_position_acceptance(records: Iterable[RequestRecord]) -> list[float] | None:
    """Share of verify steps whose draft token at position j (0-based) was accepted, pooled
    over the completed requests (summary.json's ``acceptance_by_position``); None when no
    request reported per-position counts. Every engine records them as ``spec_drafts`` and
    ``spec_accepted_per_position``."""
    rates = pooled(records)
    return rates.rates if rates is not None else None


@dataclass(frozen=True)
class AcceptLength:
    """The reported accept length, tokens per verify step: all of a request's output tokens
    (the prefill's included) over its verify steps (docs/acceptance.md). ``pooled`` =
    Σ tokens / Σ steps (each step weighs the same), ``per_request_mean`` = the mean of each
    request's tokens / steps (each request weighs the same: SGLang's ``spec_accept_length``,
    the Osprey evaluation's mean(tokens / verify_ct))."""

    pooled: float
    per_request_mean: float
    requests: int
    verify_steps: float


def accept_length(records: Iterable[RequestRecord]) -> AcceptLength | None:
    """The one definition, from the completed requests with output tokens and verify steps
    (``spec_verify_ct``; where an engine reported only its own accept length, the steps it
    implies, tokens / accept length); None when none has them."""
    verified: list[tuple[int, float]] = []
    for r in records:
        if not r.ok or not r.output_tokens:
            continue
        if r.spec_verify_ct:
            verified.append((r.output_tokens, float(r.spec_verify_ct)))
        elif r.accept_length:
            verified.append((r.output_tokens, r.output_tokens / r.accept_length))
    if not verified:
        return None
    steps = sum(v for _, v in verified)
    return AcceptLength(sum(t for t, _ in verified) / steps,
                        sum(t / v for t, v in verified) / len(verified), len(verified), steps)


def _upper(k: int, n: int, alpha: float) -> float:
    return 1.0 if k >= n else float(sps.beta.ppf(1 - alpha, k + 1, n - k))


def _lower(k: int, n: int, alpha: float) -> float:
    return 0.0 if k <= 0 else float(sps.beta.ppf(alpha, k, n - k + 1))


def collapses(
    rates: PositionRates, compared: PositionRates, max_drop: float, alpha: float
) -> list[Collapse]:
    """The positions of ``rates`` that collapsed against ``compared`` (module docstring)."""
    out = []
    for j, (a, b) in enumerate(zip(rates.accepted, compared.accepted, strict=False)):
        high = _upper(a, rates.drafts, alpha)
        low = _lower(b, compared.drafts, alpha)
        if high < (1 - max_drop) * low:
            out.append(Collapse(j, a / rates.drafts, b / compared.drafts))
    return out


def describe(found: list[Collapse]) -> str:
    return ", ".join(f"position {c.position + 1}: {c.rate:.2f} vs {c.compared_rate:.2f}"
                     for c in found)


# ----------------------------------------------------------------- reconciled with the engine

ROUNDING = 0.5
"""Counters are whole counts sent as floats: a difference beyond this is a mismatch."""
SUMMED = ("verify_steps", "output_tokens", "accepted")
"""The snapshot counters a stretch's records add up to (docs/acceptance.md)."""


def _share(r: RequestRecord, counter: str) -> int | None:
    """What one record adds to ``counter`` (None: the record does not say)."""
    if counter == "verify_steps":
        return r.spec_verify_ct
    if counter == "output_tokens":
        return r.output_tokens
    acc = r.spec_accepted_per_position
    return sum(acc) if acc is not None else r.spec_accepted


@dataclass(frozen=True)
class Reconciled:
    """One counter of one stretch: the records' sum against the engine's own difference."""

    condition: str
    boot: int
    stretch: int
    counter: str  # verify_steps | output_tokens | accepted
    records: int
    engine: float
    # False where fillers were cancelled in the stretch: the engine also counted the steps
    # they took before the cancel, which no record reports, so it may only exceed the records.
    exact: bool = True

    @property
    def mismatch(self) -> bool:
        over = self.records - self.engine
        return abs(over) > ROUNDING if self.exact else over > ROUNDING

    def text(self) -> str:
        bound = "" if self.exact else " (at least, with cancelled fillers)"
        return (f"{self.condition} stretch {self.stretch} (boot {self.boot}): {self.counter} "
                f"{self.records} in the records, {self.engine:g} by the engine's "
                f"counters{bound}")


def reconcile(schedule: Iterable[Any], records: Iterable[RequestRecord]) -> list[Reconciled]:
    """Per stretch with engine counter snapshots (``spec_counters`` / ``spec_counters_end`` of
    campaign.json's schedule), each counter the engine and every request of the stretch
    (fillers included: the engine counted them too) both report, summed both ways. Stretches
    with a failed measured request are left out: the engine may count a request the client
    gave up. Fillers cancelled once the measured requests ended are such requests too, by
    design: there the engine's count bounds the records' from above (``exact`` False)."""
    groups: dict[tuple[str, int, int], list[RequestRecord]] = {}
    for r in records:
        if r.stretch is not None:
            groups.setdefault((r.condition, r.boot, r.stretch), []).append(r)
    out = []
    for entry in schedule:
        before, after = entry.spec_counters, entry.spec_counters_end
        if not after or entry.stretch is None:
            continue
        sent = groups.get((entry.condition, entry.boot, entry.stretch), [])
        recs = [r for r in sent if r.ok]
        cancelled = [r for r in sent if not r.ok]
        if not recs or any(not r.filler for r in cancelled):
            continue
        for counter in SUMMED:
            values = [_share(r, counter) for r in recs]
            if counter not in after or any(v is None for v in values):
                continue
            delta = after[counter] - (before or {}).get(counter, 0.0)
            out.append(Reconciled(entry.condition, entry.boot, entry.stretch, counter,
                                  sum(v for v in values if v is not None), delta,
                                  exact=not cancelled))
    return out


# ------------------------------------------------------------- each record against itself

MAY_PROPOSE_NOTHING = frozenset({"ngram", "suffix"})
"""Prompt-lookup drafters: a step whose lookup finds nothing drafts nothing, and vLLM counts
no verify step for it, so a record's tokens have no upper bound from its own counts."""


@dataclass(frozen=True)
class RecordCheck:
    """One record against itself (docs/acceptance.md): ``output_tokens`` within what its verify
    steps and accepted drafts allow, or ``accepted`` (the engine's total) equal to its
    histogram's sum."""

    condition: str
    prompt_id: str
    load: str
    mode: str
    boot: int
    stretch: int | None
    check: str  # output_tokens | accepted
    value: int
    low: int
    high: int | None  # None: no upper bound (MAY_PROPOSE_NOTHING)

    @property
    def mismatch(self) -> bool:
        return self.value < self.low or (self.high is not None and self.value > self.high)

    def text(self) -> str:
        where = f", stretch {self.stretch}" if self.stretch is not None else ""
        request = (f"{self.condition} request {self.prompt_id} (load {self.load!r}, {self.mode}, "
                   f"boot {self.boot}{where})")
        if self.check == "accepted":
            return (f"{request}: {self.value} accepted drafts by the engine's total, "
                    f"{self.low} by its histogram")
        allowed = f"{self.low}-{self.high}" if self.high is not None else f">= {self.low}"
        return (f"{request}: output_tokens {self.value}, its verify steps and accepted drafts "
                f"allow {allowed}")


def _counts(r: RequestRecord) -> tuple[int, int, int] | None:
    """(accepted drafts, draft positions, steps those cover) of one record: its histogram, else
    the engine's totals (positions: proposed per step, rounded up); None where neither."""
    acc = r.spec_accepted_per_position
    if acc is not None and r.spec_drafts is not None:
        return sum(acc), len(acc), r.spec_drafts
    steps, proposed = r.spec_verify_ct, r.spec_proposed
    if r.spec_accepted is not None and steps and proposed:
        return r.spec_accepted, -(-proposed // steps), steps
    return None


def self_checks(records: Iterable[RequestRecord],
                open_ended: Iterable[str] = ()) -> list[RecordCheck]:
    """Every completed record checked against itself where it carries the counts
    (docs/acceptance.md). With s verify steps, A accepted drafts, k draft positions and d of
    the steps in the histogram, output_tokens = s + A + p - c + u: p (0 or 1) the prefill's
    token (SGLang and vLLM commit it outside every verify step; the embedded engine's first
    verify step is its prefill), c (0..k) tokens a stop dropped from the last step, u
    (0..(s - d) k) drafts accepted in steps the histogram leaves out. ``open_ended``: the
    conditions whose drafter may propose nothing (MAY_PROPOSE_NOTHING), checked from below
    only."""
    unbounded = set(open_ended)
    out = []
    for r in records:
        if not r.ok:
            continue
        at = (r.condition, r.prompt_id, r.load, r.mode, r.boot, r.stretch)
        acc = r.spec_accepted_per_position
        if acc is not None and r.spec_drafts is not None and r.spec_accepted is not None:
            out.append(RecordCheck(*at, "accepted", r.spec_accepted, sum(acc), sum(acc)))
        counts = _counts(r)
        steps, tokens = r.spec_verify_ct, r.output_tokens
        if counts is None or not steps or tokens is None or not counts[1]:
            continue
        accepted, k, covered = counts
        high = None if r.condition in unbounded else \
            steps + accepted + 1 + max(0, steps - covered) * k
        out.append(RecordCheck(*at, "output_tokens", tokens, steps + accepted - k, high))
    return out


# ------------------------------------------------------------------------ depth per stretch

K_TOLERANCE = 0.1
"""Draft tokens per verify step a stretch's mean K may stray from the pilot's: a fixed K
drafts exactly K per step, less only where the engine trims drafts (its token budget, the
context's end); a K that varies with the batch size moves it by whole tokens."""


def mean_k(before: Mapping[str, float] | None, after: Mapping[str, float]) -> float | None:
    """Draft tokens per verify step between two snapshots (vLLM's ``draft_tokens`` and
    ``verify_steps`` counters: K, the root not included); None where the engine does not
    count draft tokens or nothing was verified."""
    start = before or {}
    if "draft_tokens" not in after or "verify_steps" not in after:
        return None
    steps = after["verify_steps"] - start.get("verify_steps", 0.0)
    if steps <= 0:
        return None
    return (after["draft_tokens"] - start.get("draft_tokens", 0.0)) / steps


def depth_per_stretch(schedule: Iterable[Any]) -> list[dict[str, Any]]:
    """K per stretch, where the engine exports it: the active depth at the start and end of
    each stretch (SGLang's num_steps / num_draft_tokens gauges), and the mean K over it from
    the draft-token and verify-step counters (vLLM: ``mean_k``)."""
    out = []
    for entry in schedule:
        ends = [c for c in (entry.spec_counters, entry.spec_counters_end) if c]
        seen = {k: sorted({c[k] for c in ends if k in c}) for k in ("num_steps",
                                                                      "num_draft_tokens")}
        row: dict[str, Any] = {k: v for k, v in seen.items() if v}
        if entry.spec_counters_end and entry.stretch is not None:
            k = mean_k(entry.spec_counters, entry.spec_counters_end)
            if k is not None:
                row["mean_k"] = k
        if row:
            out.append({"condition": entry.condition, "boot": entry.boot,
                        "stretch": entry.stretch, "load": entry.load, **row})
    return out
