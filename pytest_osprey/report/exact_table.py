"""The exact distribution test's per-class figures as table rows, for report.md and
report.html: one small table per condition (the candidate, and the baseline's own samples as
its A/A control), read from the distribution gates' details in summary.json."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

HEADER = ("class", "n", "score z", "PIT p", "top-1 obs / exp", "outside", "T̂ [CI]")


def _f(value: Any, fmt: str) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    return "inf" if value == math.inf else fmt.format(value)


def _temperature(c: Mapping[str, Any]) -> str:
    t, ci = c.get("temperature"), c.get("temperature_ci") or [None, None]
    if not isinstance(t, int | float) or (isinstance(t, float) and math.isnan(t)):
        return "-"
    # In summary.json an infinite bound reads null: above the fit's range.
    lo, hi = (_f(x, "{:.2f}") if x is not None else "inf" for x in ci)
    return f"{_f(t, '{:.2f}')} [{lo}, {hi}]"


def rows(test: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """One row per position class of one exact test's details (quality.gates.exact_details)."""
    out: list[tuple[str, ...]] = []
    for klass, c in (test.get("classes") or {}).items():
        mark = " (FAIL)" if c.get("outcome") == "fail" else ""
        out.append((f"{klass}{mark}", _f(c.get("n"), "{:d}"), _f(c.get("score_z"), "{:+.1f}"),
                    _f(c.get("pit_p"), "{:.2g}"),
                    f"{_f(c.get('top1_observed'), '{:d}')} / "
                    f"{_f(c.get('top1_expected'), '{:.1f}')}",
                    _f(c.get("outside_support"), "{:d}"), _temperature(c)))
    return out


def exact_tables(summary: Mapping[str, Any]) -> list[tuple[str, list[tuple[str, ...]]]]:
    """(caption, rows) per condition whose distribution gate ran the exact test; the scorer's
    own samples (the A/A control) once, first."""
    out: list[tuple[str, list[tuple[str, ...]]]] = []
    control_shown = False
    for g in summary.get("gates", []):
        d = g.get("details") or {}
        if g.get("kind") != "distribution" or d.get("method") != "exact":
            continue
        served = (d.get("candidate") or {}).get("served", "")
        control = d.get("control")
        if control and not control_shown:
            control_shown = True
            out.append((f"{d.get('scorer')} (the A/A control: its own samples), served "
                        f"{served}: {control.get('outcome')}", rows(control)))
        cand = d.get("candidate") or {}
        out.append((f"{g.get('condition')}, served {served}: {g.get('outcome')}", rows(cand)))
    return out
