"""The figures as a plain-text table (terminal, report.md)."""

from __future__ import annotations

from collections.abc import Sequence

from ..judgement.figures import Figures


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


TABLE_HEADER = (
    "condition", "load", "ok/total", "TTFT p50/p95 ms", "completion p50/p95 ms", "tok/s",
    "accept len (pooled/mean)", "peak MiB",
)


def table_rows(figs: Sequence[Figures]) -> list[tuple[str, ...]]:
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


def text_table(figs: Sequence[Figures]) -> list[str]:
    rows = [TABLE_HEADER, *table_rows(figs)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
