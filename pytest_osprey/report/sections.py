"""The report sections every output shows alike, picked once from the typed judgement: each
section's title, its notes (the wording, in one place) and its tables' rows as plain text.
report.md and report.html only format them (escaping, alignment, a flag on a value over its
limit); neither picks rows nor words a sentence of its own for these sections."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..judgement import CostSection, GoodputSection, Stability


@dataclass(frozen=True)
class Cell:
    """A table cell's plain text; ``over``: the value is past the pilot's limit."""

    text: str
    over: bool = False


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: Sequence[tuple[Cell, ...]]
    numeric: frozenset[int] = frozenset()
    """Columns of numbers (right-aligned where the output aligns)."""
    caption: str | None = None
    detail: frozenset[int] = frozenset()
    """Columns a narrow output (report.md, at most 7 columns for a PR comment) leaves out."""

    def narrow(self) -> tuple[tuple[str, ...], list[tuple[Cell, ...]]]:
        """The header and rows without the :attr:`detail` columns."""
        keep = [i for i in range(len(self.header)) if i not in self.detail]
        return (tuple(self.header[i] for i in keep),
                [tuple(row[i] for i in keep) for row in self.rows])


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    notes: list[str] = field(default_factory=list)
    """Plain sentences; `code` in backticks."""
    tables: list[Table] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """Said first where the output shows them (report.md says them under the verdicts)."""


# What a gate that passed without full evidence lacked, as every report words it: an
# underpowered gate could have failed, on too few data to trust its pass.
EVIDENCE_WORDS = {"underpowered": "too few data to trust its pass",
                  "not_evaluable": "could not have failed"}


def evidence_words(evidence: str) -> str:
    """The words for a gate's ``evidence`` short of ``tested``."""
    return EVIDENCE_WORDS.get(evidence, evidence.replace("_", " "))


def num(value: object, fmt: str = "{:.4g}") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return fmt.format(value)


def money(value: object) -> str:
    """Currency amounts in plain decimals (no exponent), 3 significant digits when small."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return num(value)
    if not math.isfinite(value):
        return f"{value:g}"
    if value == 0:
        return "0.00"
    decimals = max(2, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def sig2(value: object) -> str:
    """Two significant figures, plain decimals: throughput and break-even come from a few
    minutes of traffic, not to the unit."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = 1 - math.floor(math.log10(abs(value)))
    return f"{round(value, digits):,.{max(digits, 0)}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _over(value: float | None, limit: float | None) -> bool:
    return value is not None and limit is not None and value > limit


def stability_section(st: Stability) -> Section:
    """The baseline against its own first pass, and the load average during the replays."""
    notes, tables = [], []
    if st.drift:
        notes.append(f"The baseline ({st.baseline}, speculation off) against its own first "
                     "pass, same prompts: 1.00x means the machine ran at the same speed.")
        tables.append(Table(("load", "pass", "baseline latency vs pass 1", "prompts"),
                            [(Cell(d.load), Cell(str(d.block)), Cell(f"{d.ratio:.2f}x"),
                              Cell(str(d.prompts))) for d in st.drift],
                            frozenset({1, 2, 3})))
    else:
        notes.append("One pass: no drift between passes to measure.")
    loads = [x.loadavg_1m for x in st.load if x.loadavg_1m is not None]
    if loads:
        notes.append(f"Load average (1 min) during the replays: {min(loads):.1f} to "
                     f"{max(loads):.1f} on {st.cpus or '?'} CPUs.")
    return Section("stability", "Environment stability", notes, tables, list(st.warnings))


def goodput_section(gp: GoodputSection) -> Section:
    """Requests that met every latency target, per condition and load."""
    targets = ", ".join(f"{name} <= {value * 1000:g} ms" for value, name in (
        (gp.ttft_s, "TTFT"), (gp.tpot_s, "inter-token"), (gp.e2e_s, "completion"))
        if value is not None)
    rows = [(Cell(r.condition), Cell(r.load), Cell(f"{r.good}/{r.sent}"), Cell(_pct(r.share)),
             Cell(_pct(r.ttft_share)), Cell(_pct(r.tpot_share)), Cell(_pct(r.e2e_share)))
            for r in gp.table]
    return Section("goodput", "Goodput", [
        f"A request is good when it completed with {targets}. Margin against the baseline "
        f"{gp.margin:.0%}."],
        [Table(("condition", "load", "good/sent", "share", "TTFT ok", "inter-token ok",
                "completion ok"), rows, frozenset({2, 3, 4, 5, 6}))])


def cost_section(cost: CostSection) -> Section:
    """Cost per request at each condition and load, and each candidate's break-even."""
    title = "Cost and break-even"
    if not cost.device_hour_price:
        return Section("cost", "Cost: not configured", [
            "Cost not configured: `cost.device_hour_price` is 0, so no cost per request and no "
            "break-even are computed. Set it (and `cost.setup` per drafter) to see them."])
    cur = cost.currency
    limits = cost.limits
    max_cost = limits.max_cost_per_request if limits is not None else None
    max_days = limits.max_break_even_days if limits is not None else None
    per_day = cost.expected_requests_per_day
    note = (f"Serving cost: {money(cost.device_hour_price)} {cur} per device-hour x "
            f"{num(cost.devices_per_server)} device(s) per server. Expected traffic: "
            + (f"{per_day:,.0f} requests/day. " if per_day is not None else "not given. ")
            + "Limits: cost per request "
            + (f"{money(max_cost)} {cur}" if max_cost is not None else "none")
            + ", break-even " + (f"{num(max_days)} days" if max_days is not None else "none")
            + ". Cost per request = hourly cost / successful requests per busy hour.")
    rows = [(Cell(c.condition), Cell(f"{c.load} ({c.load_label or f'x{c.concurrency}'})"),
             Cell(f"{c.ok}/{c.total}"), Cell(num(c.busy_s, "{:.2f}")),
             Cell(sig2(c.requests_per_hour)),
             Cell(money(c.cost_per_request), _over(c.cost_per_request, max_cost)),
             Cell(money(None if c.cost_per_request is None else c.cost_per_request * 1000)),
             Cell(money(c.setup_cost)))
            for c in cost.table]
    tables = [Table(("condition", "load", "ok/total", "busy s", "ok requests/hour",
                     f"cost per ok request ({cur})", f"per 1,000 ({cur})", f"setup ({cur})"),
                    rows, frozenset({2, 3, 4, 5, 6, 7}), detail=frozenset({3, 6}))]
    be = [(Cell(b.candidate), Cell(b.reference), Cell(b.load), Cell(money(b.setup_cost)),
           Cell(money(b.savings_per_request)), Cell(sig2(b.requests)),
           Cell(sig2(b.days), _over(b.days, max_days)), Cell(b.reason or ""))
          for b in cost.break_even]
    if be:
        tables.append(Table(("candidate", "vs", "load", "setup", "savings per request",
                             "break-even requests", "days", "note"), be,
                            frozenset({3, 4, 5, 6}),
                            "Break-even (setup cost / savings per request)",
                            detail=frozenset({3, 4})))
    return Section("cost", title, [note], tables)
