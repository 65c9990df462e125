"""Speedup against concurrency (PNG bytes, Agg): each candidate's speedup over the baseline at
every closed-loop level with the speed gates' CIs, on a log2 concurrency axis, the threshold,
the monotone fit, and where the speedup falls to the threshold with its interval (from
summary.json's ``verdicts[].crossover``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from matplotlib.figure import Figure

from ..judgement import GateKind
from ..judgement.speed.crossover import concurrency_text
from .plotkit import color_of, speedup_axis, to_png


def _points(summary: Mapping[str, Any], cand: str,
            cross: Mapping[str, Any]) -> list[tuple[int, float, float, float]]:
    """(concurrency, estimate, low, high) of the candidate's gates at the crossover's levels."""
    conc = dict(zip(cross.get("levels") or [], cross.get("concurrencies") or [], strict=False))
    baseline = next((c for c, info in (summary.get("conditions") or {}).items()
                     if isinstance(info, Mapping) and info.get("role") == "baseline"), None)
    out = []
    for g in summary.get("gates", []):
        ci = g.get("ci") or [None, None]
        if g.get("kind") != GateKind.SPEEDUP or g.get("condition") != cand or g.get("slice") \
                or g.get("load") not in conc or g.get("estimate") is None or None in ci \
                or (baseline is not None and g.get("reference") != baseline):
            continue
        if all(math.isfinite(v) and v > 0 for v in (g["estimate"], *ci)):
            out.append((int(conc[g["load"]]), float(g["estimate"]), float(ci[0]),
                        float(ci[1])))
    return sorted(out)


def crossover_plot(summary: Mapping[str, Any], threshold: float) -> bytes | None:
    """The plot, or None when no candidate's crossover was estimated (the speed across load
    levels plot shows the levels then)."""
    shown = [(v["candidate"], v["crossover"]) for v in summary.get("verdicts", [])
             if isinstance(v.get("crossover"), Mapping)
             and v["crossover"].get("status") != "not_estimable"]
    if not shown:
        return None
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    values = [1.0, threshold]
    ticks: set[int] = set()
    for i, (cand, cross) in enumerate(shown):
        pts = _points(summary, cand, cross)
        color = color_of(i)
        if pts:
            xs = [math.log2(p[0]) for p in pts]
            ax.errorbar(xs, [p[1] for p in pts],
                        yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                        fmt="o", color=color, capsize=4, label=f"{cand} (speed gates' CIs)")
            values += [v for p in pts for v in p[1:]]
            ticks |= {p[0] for p in pts}
        fit = cross.get("fit") or []
        concs = cross.get("concurrencies") or []
        if len(fit) == len(concs) and fit:
            ax.plot([math.log2(c) for c in concs], fit, color=color, lw=1, ls=":",
                    label=f"{cand}: monotone fit")
        _crossing(ax, cross, concs, color, cand)
    if not ticks:
        ticks = {1}
    speedup_axis(ax, min(values) / 1.1, max(values) * 1.1, axis="y")
    ax.axhline(1.0, color="#444444", lw=1)
    ax.axhline(threshold, color="#c44e52", lw=1.2, ls="--", label=f"threshold {threshold:g}x")
    low, high = math.log2(min(ticks)), math.log2(max(ticks))
    pad = max(0.3, 0.05 * (high - low))
    ax.set_xlim(low - pad, high + pad)
    ax.set_xticks([math.log2(c) for c in sorted(ticks)], [f"x{c}" for c in sorted(ticks)])
    ax.set_xlabel("concurrency (requests in flight, log scale)")
    ax.set_ylabel("completion-latency speedup (> 1: faster)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax.set_title("Speedup against concurrency: where speculation stops paying", fontsize=11)
    return to_png(fig)


def _crossing(ax: Any, cross: Mapping[str, Any], concs: list[int], color: str,
              cand: str) -> None:
    """The crossing at the threshold with its interval; an open end runs to the edge of the
    tested range with an arrow (the crossing may lie beyond it)."""
    if not concs:
        return
    ci = cross.get("ci") or [None, None]
    low = math.log2(ci[0]) if ci[0] else math.log2(min(concs))
    high = math.log2(ci[1]) if ci[1] else math.log2(max(concs))
    y = float(cross.get("threshold") or 1.0)
    ax.plot([low, high], [y, y], color=color, lw=4, alpha=0.35, solid_capstyle="butt",
            label=f"{cand}: crossover interval")
    for end, open_, sign in ((low, ci[0] is None, -1), (high, ci[1] is None, 1)):
        if open_:
            ax.annotate("", xy=(end + 0.25 * sign, y), xytext=(end, y),
                        arrowprops={"arrowstyle": "->", "color": color})
    point = cross.get("concurrency")
    if point:
        ax.plot([math.log2(point)], [y], marker="D", color=color, ms=7, ls="none",
                label=f"{cand}: pays up to about x{concurrency_text(point)}")
