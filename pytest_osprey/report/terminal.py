"""The figures as a table (terminal, report.md, report.html) and the terminal's closing lines.

Both adapters (the pytest plugin and ``python -m pytest_osprey run``) print
:func:`closing_lines`: the set-up in one line, the table, stability warnings, then a headline
per candidate with its reasons.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..judgement import Figures, GateKind

Cell = tuple[float | None, float | None, float | None]  # speedup estimate, CI low, CI high


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


@dataclass(frozen=True)
class Columns:
    """What the table's context decides: the memory column's label, which conditions draft,
    each (condition, load)'s speedup over the baseline."""

    memory: str = "peak MiB"
    memory_note: str = "peak memory"
    baseline: str | None = None
    speedups: Mapping[tuple[str, str], Cell] | None = None


def speedup_cells(gates: Iterable[Mapping[str, Any]], baseline: str | None) -> dict[
        tuple[str, str], Cell]:
    """(condition, load) -> speedup over the baseline on the whole trace, from gate entries
    (summary.json's ``gates[]`` or ``GateResult.as_dict()``)."""
    out: dict[tuple[str, str], Cell] = {}
    for g in gates:
        if g.get("kind") != GateKind.SPEEDUP or g.get("slice") or g.get("reference") != baseline:
            continue
        ci = g.get("ci") or [None, None]
        out[(str(g.get("condition")), str(g.get("load")))] = (g.get("estimate"), ci[0], ci[1])
    return out


def speedup_text(cell: Cell | None) -> str:
    if cell is None or cell[0] is None:
        return "-"
    est, low, high = cell
    if low is None or high is None:
        return f"{est:.2f}x"
    return f"{est:.2f}x [{low:.2f}, {high:.2f}]"


def header(cols: Columns, full: bool = False) -> tuple[str, ...]:
    return ("condition", "load", "ok/total", "TTFT p50/p95 ms", "completion p50/p95 ms",
            "speedup vs baseline [95% CI]", "aggregate tok/s",
            "accept len (pooled/mean)" if full else "accept len", cols.memory, "in flight")


TABLE_HEADER = header(Columns(), full=True)


def _accept(f: Figures, cols: Columns, full: bool) -> str:
    # The baseline's 1.00 (each step yields the target's one token) would read as a drafter
    # that is never accepted: speculation is off there, so there is no accept length.
    if f.condition == cols.baseline:
        return "n/a"
    if f.accept_length_pooled is None:
        return "-"
    if full:
        return f"{_num(f.accept_length_pooled)}/{_num(f.accept_length_mean)}"
    return _num(f.accept_length_pooled)


def table_rows(figs: Sequence[Figures], cols: Columns | None = None,
               full: bool = False) -> list[tuple[str, ...]]:
    cols = cols or Columns()
    speedups = cols.speedups or {}
    return [
        (
            f.condition,
            f"{f.load} ({f.load_label})",
            f"{f.ok}/{f.total}",
            f"{_ms(f.ttft_p50_s)}/{_ms(f.ttft_p95_s)}",
            f"{_ms(f.e2e_p50_s)}/{_ms(f.e2e_p95_s)}",
            "n/a" if f.condition == cols.baseline else speedup_text(
                speedups.get((f.condition, f.load))),
            _num(f.tokens_per_s, "{:.1f}"),
            _accept(f, cols, full),
            _num(f.peak_memory_mb, "{:.0f}"),
            in_flight_text(f),
        )
        for f in figs
    ]


def in_flight_text(f: Figures) -> str:
    """The measured in-flight load (mean over measured requests); an open-loop level's
    achieved rate beside it."""
    text = _num(f.in_flight_mean)
    if f.achieved_rate is not None and f.load_label.startswith("Poisson"):
        text += f" @ {f.achieved_rate:.2f}/s"
    return text


def text_table(figs: Sequence[Figures], cols: Columns | None = None) -> list[str]:
    cols = cols or Columns()
    rows = [header(cols), *table_rows(figs, cols)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def legend(cols: Columns) -> str:
    return ("aggregate tok/s: output tokens of all completed requests / busy wall time; "
            "accept len: tokens per verify step, pooled (n/a: speculation off); "
            f"{cols.memory}: {cols.memory_note}; in flight: requests at the engine during "
            "each measured request, averaged (fillers keep a closed-loop level steady; "
            "open loop: @ achieved rate)")


def results_line(reports: Sequence[Path]) -> str | None:
    """``results: DIR (report.html, report.md, summary.json)``."""
    if not reports:
        return None
    folder = reports[0].parent
    return f"results: {folder} ({', '.join(p.name for p in reports)})"
