"""The figures as a table (terminal, report.md, report.html) and the terminal's closing lines.

Both adapters (the pytest plugin and ``python -m pytest_osprey run``) print
:func:`closing_lines`: the set-up in one line, the table, stability warnings, then a headline
per candidate with its reasons.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..judgement import Cell, Figures
from ..judgement.figures.measured import P99_MIN_REQUESTS


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


def figure_speedups(figs: Iterable[Figures]) -> dict[tuple[str, str], Cell]:
    """(condition, load) -> the speedup the judgement put in each figures row."""
    out: dict[tuple[str, str], Cell] = {}
    for f in figs:
        if f.speedup is not None:
            low, high = f.speedup_ci if f.speedup_ci else (None, None)
            out[(f.condition, f.load)] = (f.speedup, low, high)
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
               full: bool = False, deltas: bool = False) -> list[tuple[str, ...]]:
    """One row per condition and level; ``deltas``: latency and memory cells carry their rise
    over the baseline at the same load where the condition is worse (``42 (+35%)``)."""
    cols = cols or Columns()
    speedups = cols.speedups or {}
    rises = worse_than_baseline(figs, cols.baseline) if deltas else {}
    out: list[tuple[str, ...]] = []
    for f in figs:
        up = rises.get((f.condition, f.load), {})
        out.append((
            f.condition,
            f"{f.load} ({f.load_label})",
            f"{f.ok}/{f.total}",
            _pair(f, "ttft", up),
            _pair(f, "e2e", up),
            "n/a" if f.condition == cols.baseline else speedup_text(
                speedups.get((f.condition, f.load))),
            _num(f.tokens_per_s, "{:.1f}"),
            _accept(f, cols, full),
            _with_delta(_num(f.peak_memory_mb, "{:.0f}"), up.get("peak_memory_mb")),
            in_flight_text(f),
        ))
    return out


SERVING_HEADER = ("TPOT p50/p95 ms", "req/s", "tokens in/out", "p99 TTFT/TPOT/e2e ms")


def serving_cells(f: Figures, rises: Mapping[str, float] | None = None) -> tuple[str, ...]:
    """The serving figures beside :func:`table_rows`' (report.html's per-level tables): TPOT
    with its rise over the baseline, request throughput, mean prompt and output lengths, and
    the p99s (``-`` below :data:`~..judgement.figures.measured.P99_MIN_REQUESTS`)."""
    up = rises or {}
    p99 = "/".join(_ms(getattr(f, f"{m}_p99_s")) for m in ("ttft", "tpot", "e2e"))
    return (_pair(f, "tpot", up), _num(f.requests_per_s),
            f"{_num(f.input_tokens_mean, '{:.0f}')}/{_num(f.output_tokens_mean, '{:.0f}')}",
            "-" if p99 == "-/-/-" else p99)


def in_flight_text(f: Figures) -> str:
    """The measured in-flight load (mean over measured requests); an open-loop level's
    achieved rate beside it."""
    text = _num(f.in_flight_mean)
    if f.achieved_rate is not None and f.load_label.startswith("Poisson"):
        text += f" @ {f.achieved_rate:.2f}/s"
    return text


WIDTH = 120
"""The terminal's closing lines fit this many columns (the headline aside)."""

MIN_DELTA = 0.01
"""A candidate's rise over the baseline below this (1%) is not flagged: it would read +0%."""

WORSE_WHEN_HIGHER = ("ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "tpot_p95_s",
                     "tpot_p99_s", "e2e_p50_s", "e2e_p95_s", "e2e_p99_s", "peak_memory_mb")
"""The figures compared with the baseline's at the same load: latencies and memory."""


def worse_than_baseline(figs: Sequence[Figures], baseline: str | None) -> dict[
        tuple[str, str], dict[str, float]]:
    """(condition, load) -> figure -> relative rise over the baseline's at the same load
    (0.35: 35% higher), only where the condition is worse by at least :data:`MIN_DELTA`."""
    base = {f.load: f for f in figs if f.condition == baseline}
    out: dict[tuple[str, str], dict[str, float]] = {}
    for f in figs:
        ref = base.get(f.load)
        if ref is None or f.condition == baseline:
            continue
        rises = {}
        for name in WORSE_WHEN_HIGHER:
            mine, theirs = getattr(f, name), getattr(ref, name)
            if mine is not None and theirs and theirs > 0 and mine / theirs - 1 >= MIN_DELTA:
                rises[name] = mine / theirs - 1
        if rises:
            out[(f.condition, f.load)] = rises
    return out


def _with_delta(text: str, rise: float | None) -> str:
    return text if rise is None else f"{text} ({rise:+.0%})"


def _pair(f: Figures, metric: str, rises: Mapping[str, float]) -> str:
    """``42 (+35%)/101 (+33%)``: p50/p95 in ms, each with its rise over the baseline."""
    return "/".join(_with_delta(_ms(getattr(f, f"{metric}_{p}_s")), rises.get(f"{metric}_{p}_s"))
                    for p in ("p50", "p95"))


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def text_table(figs: Sequence[Figures], cols: Columns | None = None) -> list[str]:
    """The terminal's two tables, each within :data:`WIDTH` columns: speed and throughput,
    then latency (p50/p95 ms); a rise over the baseline at the same load in brackets, and a
    p99 line per row that has one."""
    cols = cols or Columns()
    speedups = cols.speedups or {}
    rises = worse_than_baseline(figs, cols.baseline)
    speed = [("condition", "load", "ok/total", "speedup [95% CI]", "tok/s", "req/s", "accept",
              cols.memory, "in flight")]
    latency = [("condition", "load", "TTFT p50/p95 ms", "TPOT p50/p95 ms",
                "completion p50/p95 ms")]
    p99 = []
    for f in figs:
        mine = rises.get((f.condition, f.load), {})
        load = f"{f.load} {f.load_label}"
        speed.append((
            f.condition, load, f"{f.ok}/{f.total}",
            "n/a" if f.condition == cols.baseline else speedup_text(
                speedups.get((f.condition, f.load))),
            _num(f.tokens_per_s, "{:.1f}"), _num(f.requests_per_s), _accept(f, cols, False),
            _with_delta(_num(f.peak_memory_mb, "{:.0f}"), mine.get("peak_memory_mb")),
            in_flight_text(f)))
        latency.append((f.condition, load, _pair(f, "ttft", mine), _pair(f, "tpot", mine),
                        _pair(f, "e2e", mine)))
        shown = [f"{label} {_with_delta(_ms(getattr(f, name)), mine.get(name))}"
                 for label, name in (("TTFT", "ttft_p99_s"), ("TPOT", "tpot_p99_s"),
                                     ("completion", "e2e_p99_s"))
                 if getattr(f, name) is not None]
        if shown:
            p99.append(f"p99 ms {f.condition} {load}: {', '.join(shown)}")
    return [*_aligned(speed), *_aligned(latency), *p99]


def p99_note(figs: Sequence[Figures]) -> str | None:
    """Why p99 is not shown where it is not: ``p99 from 100 requests: low x1 has 21``."""
    short = [f for f in figs if f.ttft_p99_s is None and f.e2e_p99_s is None]
    if not short:
        return None
    counts = dict.fromkeys(f"{f.load} {f.load_label} has {f.ok}" for f in short)
    return f"p99 from {P99_MIN_REQUESTS} completed requests a level: {', '.join(counts)}"


def terminal_legend(cols: Columns, figs: Sequence[Figures]) -> list[str]:
    """The terminal table's legend, in lines within :data:`WIDTH` columns."""
    lines = [
        "tok/s: output tokens of all completed requests / busy wall time; req/s: completed "
        "requests / busy wall time",
        "accept: tokens per verify step, pooled (n/a: speculation off); "
        f"{cols.memory}: {cols.memory_note}",
        "in flight: requests at the engine during each measured request, averaged "
        "(open loop: @ achieved rate)",
        f"(+N%): worse than {cols.baseline or 'the baseline'} at the same load by N%",
    ]
    note = p99_note(figs)
    return [*lines, note] if note else lines


def legend(cols: Columns) -> str:
    return ("aggregate tok/s: output tokens of all completed requests / busy wall time; "
            "accept len: tokens per verify step, pooled (n/a: speculation off); "
            f"{cols.memory}: {cols.memory_note}; in flight: requests at the engine during "
            "each measured request, averaged (fillers keep a closed-loop level steady; "
            "open loop: @ achieved rate); (+N%): worse than the baseline at the same load by N%")


def results_line(reports: Sequence[Path]) -> str | None:
    """``results: DIR (report.html, report.md, summary.json)``."""
    if not reports:
        return None
    folder = reports[0].parent
    return f"results: {folder} ({', '.join(p.name for p in reports)})"
