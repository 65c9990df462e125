"""Per condition and load level: the figures every report shows (from records alone)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..campaign import CampaignData
from ..config import level_label
from ..records import RequestRecord


@dataclass(frozen=True)
class Figures:
    condition: str
    load: str
    concurrency: int
    ok: int
    total: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    tpot_p50_s: float | None
    tokens_per_s: float | None  # output tokens / wall time of the level's requests, aggregate
    request_tokens_per_s_p50: float | None  # per request
    accept_length_pooled: float | None  # sum tokens / sum verify steps
    accept_length_mean: float | None  # mean over requests of tokens / verify steps
    peak_memory_mb: float | None
    load_label: str = ""  # how the load reads: x4 (closed loop) or Poisson 2/s (open loop)
    # Open loop: how late the client sent requests after their arrival times (its own fidelity,
    # plus the wait under a max_concurrency cap); None for closed-loop levels.
    dispatch_lag_p99_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _wall(records: list[RequestRecord]) -> float | None:
    # Sum of each block's busy span: blocks run apart in time, the gaps between are not load.
    by_block: dict[int, list[tuple[float, float]]] = {}
    for r in records:
        if r.started_at is not None and r.e2e_s is not None:
            by_block.setdefault(r.block, []).append((r.started_at, r.started_at + r.e2e_s))
    if not by_block:
        return None
    return sum(max(e for _, e in v) - min(s for s, _ in v) for v in by_block.values())


def figures_for(
    data: CampaignData, condition: str, load: str, concurrency: int, label: str | None = None
) -> Figures:
    recs = data.of(condition, load)
    ok = [r for r in recs if r.ok]
    tokens = [r.output_tokens or 0 for r in ok]
    wall = _wall(ok)
    # Verify steps as counted, or as implied by an engine-reported accept length.
    verified: list[tuple[int, float]] = []
    for r in ok:
        if r.output_tokens and r.spec_verify_ct:
            verified.append((r.output_tokens, float(r.spec_verify_ct)))
        elif r.output_tokens and r.accept_length:
            verified.append((r.output_tokens, r.output_tokens / r.accept_length))
    pooled = sum(t for t, _ in verified) / sum(v for _, v in verified) if verified else None
    mean = float(np.mean([t / v for t, v in verified])) if verified else None
    info = data.meta.get("conditions", {}).get(condition, {})
    return Figures(
        condition=condition,
        load=load,
        concurrency=concurrency,
        ok=len(ok),
        total=len(recs),
        ttft_p50_s=_pct([r.ttft_s for r in ok if r.ttft_s is not None], 50),
        ttft_p95_s=_pct([r.ttft_s for r in ok if r.ttft_s is not None], 95),
        e2e_p50_s=_pct([r.e2e_s for r in ok if r.e2e_s is not None], 50),
        e2e_p95_s=_pct([r.e2e_s for r in ok if r.e2e_s is not None], 95),
        tpot_p50_s=_pct([t for r in ok if (t := r.tpot_s) is not None], 50),
        tokens_per_s=sum(tokens) / wall if wall else None,
        request_tokens_per_s_p50=_pct([t for r in ok if (t := r.tokens_per_s) is not None], 50),
        accept_length_pooled=pooled,
        accept_length_mean=mean,
        peak_memory_mb=info.get("peak_memory_mb"),
        load_label=label or f"x{concurrency}",
        dispatch_lag_p99_s=_pct([r.dispatch_lag_s for r in recs if r.dispatch_lag_s is not None],
                                99),
    )


def all_figures(data: CampaignData) -> list[Figures]:
    levels: dict[str, Any] = data.meta.get("load_levels", {})
    return [
        figures_for(data, cond, level, _concurrency(value), level_label(value))
        for cond in data.meta.get("conditions", {})
        for level, value in levels.items()
    ]


def _concurrency(value: Any) -> int:
    """A saved level's concurrency: closed loop as is, open loop its cap (0: none)."""
    if isinstance(value, dict):
        return int(value.get("max_concurrency") or 0)
    return int(value)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


TABLE_HEADER = (
    "condition", "load", "ok/total", "TTFT p50/p95 ms", "completion p50/p95 ms", "tok/s",
    "accept len (pooled/mean)", "peak MiB",
)


def table_rows(figs: list[Figures]) -> list[tuple[str, ...]]:
    return [
        (
            f.condition,
            f"{f.load} ({f.load_label})",
            f"{f.ok}/{f.total}",
            f"{_ms(f.ttft_p50_s)}/{_ms(f.ttft_p95_s)}",
            f"{_ms(f.e2e_p50_s)}/{_ms(f.e2e_p95_s)}",
            _num(f.tokens_per_s, "{:.1f}"),
            f"{_num(f.accept_length_pooled)}/{_num(f.accept_length_mean)}",
            _num(f.peak_memory_mb, "{:.0f}"),
        )
        for f in figs
    ]


def text_table(figs: list[Figures]) -> list[str]:
    rows = [TABLE_HEADER, *table_rows(figs)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
