"""The analyses' plots: the campaign's timeline, speed across load levels, per domain, the
sampled-distribution check, acceptance per draft position and goodput (PNG bytes, Agg).

Figures come from summary.json's content where judging computed them (gates, domains,
goodput, acceptance) and from the records for what only they hold (timeline, samples).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..judgement import END, GateKind, records_to_samples
from ..results.folder import SavedCampaign
from .plotkit import (
    accept_axis_top,
    color_of,
    condition_order,
    empty_note,
    speedup_axis,
    timed_words,
    to_png,
)
from .setup import level_order

MARKERS = ("o", "s", "^", "D", "v", "P")


def _legend(ax: Axes, **kw: Any) -> None:
    if ax.get_legend_handles_labels()[0]:  # an empty legend only warns
        ax.legend(fontsize=8, **kw)


# --------------------------------------------------------------------------- timeline


def timeline(data: SavedCampaign) -> bytes:
    """Completion latency of every timed request against wall time, one colour per
    condition, one marker per load level, passes shaded, load average beside."""
    mode = data.timed_mode
    recs = [r for r in data.records if r.mode == mode and r.ok and r.e2e_s is not None
            and r.started_at is not None]
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax = fig.subplots()
    if not recs:
        empty_note(ax, "no timed request")
        return to_png(fig)
    t0 = min([r.started_at or 0.0 for r in recs] + [e.started for e in data.meta.schedule])
    blocks: dict[int, list[float]] = {}
    for e in data.meta.schedule:
        if e.mode == mode:
            span = blocks.setdefault(e.boot * 1000 + e.pass_index,
                                     [e.started, e.ended or e.started])
            span[0], span[1] = min(span[0], e.started), max(span[1], e.ended or e.started)
    for n, (_, (start, end)) in enumerate(sorted(blocks.items())):
        if n % 2 == 0:
            ax.axvspan(start - t0, end - t0, color="#eaeef2", zorder=0)
        ax.text((start + end) / 2 - t0, 1.0, f"pass {n + 1}", ha="center", va="bottom",
                fontsize=8, color="#59636e", transform=ax.get_xaxis_transform())
    levels = [lv for lv, _ in level_order(data)]
    for i, cond in enumerate(condition_order(data)):
        for j, level in enumerate(levels):
            mine = [r for r in recs if r.condition == cond and r.load == level]
            if mine:
                ax.scatter([(r.started_at or 0) - t0 for r in mine],
                           [(r.e2e_s or 0) * 1000 for r in mine], s=12, alpha=0.7,
                           color=color_of(i), marker=MARKERS[j % len(MARKERS)],
                           label=f"{cond}, {level}")
    loads = [(e.started - t0, e.loadavg[0]) for e in data.meta.schedule if e.loadavg]
    if loads:
        twin = ax.twinx()
        xs, ys = zip(*sorted(loads), strict=True)
        twin.step(xs, ys, where="post", color="#8c8c8c", lw=1, ls="--")
        twin.set_ylabel("load average (1 min, dashed)", color="#59636e")
        twin.set_ylim(0, max(max(ys) * 1.2, 1.0))
    ax.set_xlabel("wall time since the first request (s)")
    ax.set_ylabel("completion latency (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncols=min(4, max(1, len(levels))), loc="upper left")
    ax.set_title(f"Timeline: {timed_words(data)}, as they ran (shaded: alternate passes)",
                 fontsize=11, pad=14)
    return to_png(fig)


# --------------------------------------------------------------------------- across loads


def load_speedups(data: SavedCampaign, summary: Mapping[str, Any], threshold: float) -> bytes:
    """Each candidate's speedup at every load level in one view, with the gates' CIs."""
    levels = level_order(data)
    x = {lv: k for k, (lv, _) in enumerate(levels)}
    fig = Figure(figsize=(7.5, 4.0), layout="constrained")
    ax = fig.subplots()
    series: dict[tuple[str, str], list[tuple[int, float, float, float, Any]]] = {}
    for g in summary.get("gates", []):
        ci = g.get("ci") or [None, None]
        if g.get("kind") != GateKind.SPEEDUP or g.get("slice") or g.get("load") not in x \
                or g.get("estimate") is None or None in ci:
            continue
        total = (g.get("details") or {}).get("total_time")
        total = total.get("estimate") if isinstance(total, Mapping) else total
        series.setdefault((g["condition"], g["reference"]), []).append(
            (x[g["load"]], g["estimate"], ci[0], ci[1], total))
    values = [1.0, threshold]
    for i, ((cand, ref), pts) in enumerate(sorted(series.items())):
        pts.sort()
        off = (i - (len(series) - 1) / 2) * 0.08
        xs = [p[0] + off for p in pts]
        ax.errorbar(xs, [p[1] for p in pts],
                    yerr=[[max(0.0, p[1] - p[2]) for p in pts],
                          [max(0.0, p[3] - p[1]) for p in pts]],
                    fmt="o", color=color_of(i), capsize=4, label=f"{cand} vs {ref}",
                    ls="-" if ref == data.meta.baseline else "--")
        totals = [(xx, p[4]) for xx, p in zip(xs, pts, strict=True) if p[4] is not None]
        if totals:
            ax.scatter(*zip(*totals, strict=True), marker="x", color=color_of(i), zorder=4,
                       label=f"{cand} vs {ref}: total time")
        values += [v for p in pts for v in p[1:4]]
    if not series:
        empty_note(ax, "no speed gate was judged")
    speedup_axis(ax, min(values) / 1.1, max(values) * 1.1, axis="y")
    ax.axhline(1.0, color="#444444", lw=1)
    if threshold != 1.0:
        ax.axhline(threshold, color="#c44e52", lw=1.2, ls="--",
                   label=f"KEEP threshold {threshold:g}x")
    ax.set_xticks(range(len(levels)), [f"{lv} ({c})" for lv, c in levels])
    ax.set_xlim(-0.5, len(levels) - 0.5)
    ax.set_xlabel("load level")
    ax.set_ylabel("completion-latency speedup (> 1: faster)")
    ax.grid(alpha=0.3, axis="y")
    _legend(ax)
    ax.set_title("Speedup across load levels (bars: the speed gates' 95% CIs)", fontsize=11)
    return to_png(fig)


# --------------------------------------------------------------------------- per domain


def domain_plot(rows: Sequence[Mapping[str, Any]], threshold: float, accept_top: float) -> bytes:
    """Speedup (with its descriptive CI) and accept length per domain, per candidate."""
    cands = list(dict.fromkeys(str(r["candidate"]) for r in rows))
    domains = sorted({str(r["domain"]) for r in rows})
    pos = {d: k for k, d in enumerate(domains)}
    fig = Figure(figsize=(11, 1.6 + 0.42 * max(len(domains), 3)), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, sharey=True)
    values = [1.0, threshold]
    for i, cand in enumerate(cands):
        mine = [r for r in rows if r["candidate"] == cand and r.get("speedup") is not None]
        off = (i - (len(cands) - 1) / 2) * 0.18
        for r in mine:
            y = pos[str(r["domain"])] + off
            low, high = r.get("ci_low"), r.get("ci_high")
            if low is not None and high is not None:
                ax1.plot([low, high], [y, y], color=color_of(i), lw=2, alpha=0.6)
                values += [low, high]
            values.append(r["speedup"])
        ax1.scatter([r["speedup"] for r in mine], [pos[str(r["domain"])] + off for r in mine],
                    color=color_of(i), zorder=3, label=cand)
        acc = [r for r in rows if r["candidate"] == cand and r.get("accept_length") is not None]
        ax2.barh([pos[str(r["domain"])] + off for r in acc], [r["accept_length"] for r in acc],
                 height=0.16, color=color_of(i), alpha=0.8, label=cand)
    speedup_axis(ax1, min(values) / 1.1, max(values) * 1.1)
    ax1.axvline(1.0, color="#444444", lw=1)
    if threshold != 1.0:
        ax1.axvline(threshold, color="#c44e52", lw=1.2, ls="--")
    ax1.set_yticks(range(len(domains)), domains)
    ax1.set_ylim(len(domains) - 0.5, -0.5)
    ax1.set_xlabel("speedup vs baseline (95% bootstrap CI over the domain's prompts)")
    ax1.grid(alpha=0.3, axis="x")
    _legend(ax1)
    ax2.axvline(1.0, color="#444444", lw=1, ls="--")
    ax2.set_xlim(0, accept_top + 0.1)  # the whole range, 1 to k + 1: a floor shows as one
    ax2.set_xlabel("accept length, pooled (1 = nothing accepted)")
    ax2.grid(alpha=0.3, axis="x")
    fig.suptitle("Per domain, at the primary load", fontsize=11)
    return to_png(fig)


# --------------------------------------------------------------------------- distribution


def _repeat_rates(samples: Mapping[str, Sequence[Sequence[int]]], k: int) -> list[float]:
    """Per position: the chance two samples of a prompt share the token there (END counted
    as a token), averaged over prompts: how sharp the sampler is."""
    out = []
    for j in range(k):
        rates = []
        for seqs in samples.values():
            if len(seqs) < 2:
                continue
            toks = [s[j] if j < len(s) else END for s in seqs]
            _, counts = np.unique(toks, return_counts=True)
            n = len(toks)
            rates.append(float((counts * (counts - 1)).sum() / (n * (n - 1))))
        out.append(float(np.mean(rates)) if rates else float("nan"))
    return out


def distribution_title(gate: Mapping[str, Any] | None) -> str:
    """The distribution gate's result in words, from the fields it writes: its outcome, the
    distance (mean MMD^2) against the smallest one this budget flags, p against alpha."""
    if gate is None:
        return "not judged"
    details = gate.get("details") or {}
    parts = [str(gate.get("outcome")).upper()]
    if details.get("method") == "exact":  # the target scored the samples: no distance
        parts.append(f"exact test of {details.get('samples')} samples scored by the target")
        if gate.get("estimate") is not None:
            parts.append(f"effective temperature {gate['estimate']:.2f} (the class with the "
                         "smallest p)")
    elif gate.get("estimate") is not None:
        text = f"distance (mean MMD\u00b2) {gate['estimate']:.3g}"
        if details.get("critical") is not None:
            text += f", flagged from {details['critical']:.3g}"
        parts.append(text)
    if gate.get("p_value") is not None:
        alpha = gate.get("threshold")
        parts.append(f"p {gate['p_value']:.3g}"
                     + (f" vs \u03b1 {alpha:g}" if alpha is not None else ""))
    if details.get("prompts") is not None:
        parts.append(f"{details['prompts']} prompts x {details.get('samples_per_prompt')} "
                     "samples")
    if gate.get("evidence") == "not_evaluable" and details.get("smallest_p") is not None:
        parts.append(f"could not have failed: smallest possible p {details['smallest_p']:.3g}")
    return parts[0] + ": " + ", ".join(parts[1:]) if len(parts) > 1 else parts[0]


def _length_panel(ax: Axes, sides: Sequence[tuple[str, list[int]]], capped: bool) -> None:
    """Output lengths as side-by-side bars; when every sample has the same length (all hit
    the max_tokens cap) the panel says so: lengths cannot tell the samplers apart then."""
    every = [n for _, lengths in sides for n in lengths]
    low, high = min(every), max(every)
    edges = (np.arange(low, high + 2) - 0.5 if high - low < 24
             else np.histogram_bin_edges(every, bins=16))
    centres = (edges[:-1] + edges[1:]) / 2
    width = float(np.min(np.diff(edges))) * 0.8 / len(sides)
    for i, (name, lengths) in enumerate(sides):
        counts, _ = np.histogram(lengths, bins=edges)
        ax.bar(centres + (i - (len(sides) - 1) / 2) * width, 100 * counts / len(lengths),
               width=width, color=color_of(i), alpha=0.8, label=f"{name} (n={len(lengths)})")
    ax.set_xlabel("output length (tokens)")
    ax.set_ylabel("samples (%)")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left")
    if low == high:
        ax.set_xlim(low - 3, low + 3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        why = "the max_tokens cap" if capped else "one length"
        ax.text(0.5, 0.55, f"every sample is {low} tokens long ({why}):\nlength cannot "
                "tell the samplers apart", ha="center", va="center", transform=ax.transAxes,
                fontsize=9, color="#444444",
                bbox={"facecolor": "white", "edgecolor": "#cccccc", "boxstyle": "round"})
    ax.set_title("Output length", fontsize=10)


def distribution_figure(data: SavedCampaign, reference: str, candidate: str,
                        gate: Mapping[str, Any] | None, positions: int = 8) -> Figure:
    """The sampled-distribution check as a picture: sampler sharpness per position and the
    output lengths, reference against candidate; the title is the gate's result."""
    ref = records_to_samples(data.records, reference)
    cand = records_to_samples(data.records, candidate)
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    fig.suptitle(f"Sampled outputs, {candidate} vs {reference}\n{distribution_title(gate)}",
                 fontsize=10)
    if not ref or not cand:
        empty_note(ax1, "no sampled outputs on both sides")
        empty_note(ax2, "no sampled outputs on both sides")
        return fig
    xs = np.arange(1, positions + 1)
    sides = []
    for i, (name, samples) in enumerate(((reference, ref), (candidate, cand))):
        ax1.plot(xs, 100 * np.array(_repeat_rates(samples, positions)), "-o",
                 color=color_of(i), label=name)
        sides.append((name, [len(s) for seqs in samples.values() for s in seqs]))
    ax1.set_xlabel("output position (1 = first generated token)")
    ax1.set_ylabel("two samples share the token (%)")
    ax1.set_ylim(0, 105)
    ax1.grid(alpha=0.3)
    _legend(ax1)
    ax1.set_title("Sharpness per position (a lower temperature or top-p raises it)",
                  fontsize=10)
    capped = all(r.finish_reason == "length" for r in data.records
                 if r.mode == "sampled" and r.ok and r.condition in (reference, candidate))
    _length_panel(ax2, sides, capped)
    return fig


# --------------------------------------------------------------------------- acceptance, goodput


def acceptance_figure(shares: Mapping[str, Sequence[float]]) -> Figure:
    """summary.json's ``acceptance_by_position``: per condition, the share of verify steps
    accepting the draft token at each position, as bars labelled in %."""
    fig = Figure(figsize=(7.5, 3.8), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(len(shares), 1)
    for i, (cond, values) in enumerate(shares.items()):
        xs = np.arange(len(values)) + (i - (len(shares) - 1) / 2) * width
        bars = ax.bar(xs, [100 * v for v in values], width=width * 0.9, color=color_of(i),
                      label=cond)
        ax.bar_label(bars, [f"{100 * v:.0f}%" for v in values], fontsize=8)
    top = max((len(v) for v in shares.values()), default=1)
    ax.set_xticks(range(top), [str(k + 1) for k in range(top)])
    ax.set_ylim(0, 110)
    ax.set_xlabel("draft position (1 = first drafted token)")
    ax.set_ylabel("verify steps accepting it (%)")
    ax.grid(alpha=0.3, axis="y")
    _legend(ax)
    ax.set_title("Acceptance per draft position", fontsize=11)
    return fig


def goodput_plot(section: Mapping[str, Any], levels: Sequence[tuple[str, str]]) -> bytes:
    rows = section.get("table", [])
    conds = list(dict.fromkeys(str(r["condition"]) for r in rows))
    fig = Figure(figsize=(7.5, 3.8), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(len(conds), 1)
    for i, cond in enumerate(conds):
        for j, (level, _) in enumerate(levels):
            share = next((r.get("share") for r in rows
                          if r["condition"] == cond and r["load"] == level), None)
            if share is not None:
                ax.bar(j + (i - (len(conds) - 1) / 2) * width, 100 * share, width=width * 0.9,
                       color=color_of(i), label=cond if j == 0 else None)
    if section.get("min_share") is not None:
        ax.axhline(100 * section["min_share"], color="#c44e52", ls="--", lw=1.2,
                   label="floor")
    ax.set_xticks(range(len(levels)), [f"{lv} ({c})" for lv, c in levels])
    ax.set_ylim(0, 105)
    ax.set_ylabel("requests meeting every target (%)")
    ax.grid(alpha=0.3, axis="y")
    _legend(ax)
    ax.set_title("Goodput per condition and load level", fontsize=11)
    return to_png(fig)


def analysis_plots(data: SavedCampaign, summary: Mapping[str, Any],
                   threshold: float) -> dict[str, bytes]:
    plots = {"timeline": timeline(data), "load_speedups": load_speedups(data, summary,
                                                                         threshold)}
    if summary.get("domains"):
        seen = [float(r["accept_length"]) for r in summary["domains"]
                if r.get("accept_length") is not None]
        plots["domains"] = domain_plot(summary["domains"], threshold,
                                       accept_axis_top(data, seen))
    gates = summary.get("gates", [])
    base = data.meta.baseline
    if base and any(r.mode == "sampled" for r in data.records):
        for cand in [c for c in data.meta.conditions if c != base]:
            gate = next((g for g in gates if g.get("kind") == GateKind.DISTRIBUTION
                         and g.get("condition") == cand), None)
            plots[f"distribution_{cand}"] = to_png(distribution_figure(data, base, cand, gate))
    if summary.get("acceptance_by_position"):
        plots["acceptance_positions"] = to_png(
            acceptance_figure(summary["acceptance_by_position"]))
    if summary.get("goodput"):
        plots["goodput"] = goodput_plot(summary["goodput"], level_order(data))
    return plots
