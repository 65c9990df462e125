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

from collections.abc import Iterable
from dataclasses import dataclass

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
