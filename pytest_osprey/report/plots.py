"""Report plots as PNG bytes (matplotlib's Agg canvas; no pyplot, no display, no global state).

Every function reads a :class:`SavedCampaign`'s timed records and copes with empty conditions:
a panel with nothing to draw says so instead of failing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..judgement import GateKind
from ..results.folder import SavedCampaign
from ..results.records import RequestRecord
from .plotkit import (
    accept_axis_top,
    color_of,
    condition_order,
    empty_note,
    speedup_axis,
    timed_words,
    to_png,
)
from .plots_analyses import analysis_plots
from .plots_crossover import crossover_plot
from .setup import level_order

FloatArray = npt.NDArray[np.float64]
BOOTSTRAP_RESAMPLES = 1000


def _ok(records: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok]


# --------------------------------------------------------------------------- latency CDF


def latency_cdf(data: SavedCampaign) -> bytes:
    """Completion latency CDF: one panel per load level, one line per condition."""
    levels = level_order(data)
    fig = Figure(figsize=(5.2 * len(levels), 4.0), layout="constrained")
    axes = fig.subplots(1, len(levels), squeeze=False)[0]
    for ax, (level, conc) in zip(axes, levels, strict=True):
        drawn = False
        for i, cond in enumerate(condition_order(data)):
            values = np.sort([r.e2e_s * 1000 for r in _ok(data.of(cond, level))
                              if r.e2e_s is not None])
            if values.size == 0:
                ax.plot([], [], color=color_of(i), label=f"{cond} (no successful request)")
                continue
            y = np.arange(0, values.size + 1) / values.size
            ax.step(np.r_[values[0], values], y, where="post", color=color_of(i), lw=1.8,
                    label=f"{cond} (n={values.size})")
            drawn = True
        if not drawn:
            empty_note(ax, "no successful requests")
        ax.set_title(f"load {level} ({conc})")
        ax.set_xlabel("completion latency (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Completion latency CDF ({timed_words(data)}, successful requests)")
    return to_png(fig)


# --------------------------------------------------------------------------- per-prompt speedup


def _ci(draws: FloatArray) -> tuple[float, float]:
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(np.exp(lo)), float(np.exp(hi))


def prompt_speedups(
    data: SavedCampaign, reference: str, candidate: str, load: str, seed: int = 0
) -> list[tuple[str, str, float, float | None, float | None]]:
    """Per prompt: (id, slice, speedup, CI low, CI high); speedup = reference / candidate
    completion latency, geometric means over repetitions. The 95% percentile-bootstrap CI
    resamples repetitions: paired by repetition (the same block on both sides, so drift
    between blocks cancels) when >= 2 repetitions pair up, else each side on its own; None
    with fewer than 2 repetitions on either side."""
    ref: dict[str, dict[int, list[float]]] = {}
    cand: dict[str, dict[int, list[float]]] = {}
    slices: dict[str, str] = {}
    mode = data.timed_mode
    for r in data.records:
        if r.mode != mode or r.load != load or not r.ok or not r.e2e_s or r.e2e_s <= 0:
            continue
        side = ref if r.condition == reference else cand if r.condition == candidate else None
        if side is not None:
            side.setdefault(r.prompt_id, {}).setdefault(r.repetition, []).append(
                math.log(r.e2e_s))
            slices[r.prompt_id] = r.slice
    rng = np.random.default_rng(seed)
    out = []
    for pid in sorted(set(ref) & set(cand), key=lambda p: (slices[p], p)):
        a = np.array([v for vs in ref[pid].values() for v in vs])
        b = np.array([v for vs in cand[pid].values() for v in vs])
        est = float(np.exp(a.mean() - b.mean()))
        low = high = None
        paired = sorted(set(ref[pid]) & set(cand[pid]))
        if len(paired) >= 2:
            d = np.array([np.mean(ref[pid][k]) - np.mean(cand[pid][k]) for k in paired])
            low, high = _ci(d[rng.integers(0, d.size, (BOOTSTRAP_RESAMPLES, d.size))].mean(1))
        elif a.size >= 2 and b.size >= 2:
            ra = a[rng.integers(0, a.size, (BOOTSTRAP_RESAMPLES, a.size))].mean(axis=1)
            rb = b[rng.integers(0, b.size, (BOOTSTRAP_RESAMPLES, b.size))].mean(axis=1)
            low, high = _ci(ra - rb)
        out.append((pid, slices[pid], est, low, high))
    return out


NAMED_ROWS = 80  # prompts the per-prompt speedup plot names, a row each
Overall = dict[str, tuple[float, float, float]]  # load -> the gate's estimate, CI low, high


def speedup_plot(
    data: SavedCampaign, reference: str, candidate: str, threshold: float = 1.0, seed: int = 0,
    overall: Overall | None = None,
) -> bytes:
    """Per-prompt speedup of ``candidate`` over ``reference``: one panel per load level,
    prompts down the side grouped and colored by slice, log-scale speedup axis; the speed
    gate's overall estimate and CI (``overall``) as a band where given. Past NAMED_ROWS
    prompts each panel ranks its prompts by speedup, unnamed."""
    overall = overall or {}
    levels = level_order(data)
    per_level = [prompt_speedups(data, reference, candidate, lv, seed) for lv, _ in levels]
    ids = sorted({(s, p) for rows in per_level for p, s, *_ in rows})
    named = len(ids) <= NAMED_ROWS
    # Past NAMED_ROWS prompts a row each would make a figure metres tall (10^4 prompts: over
    # matplotlib's 2^16-pixel limit): each panel then ranks its prompts by speedup, unnamed.
    ranks = [{row[0]: i for i, row in enumerate(sorted(rows, key=lambda r: r[2]))}
             for rows in per_level]
    pos_named = {p: i for i, (_, p) in enumerate(ids)}
    slice_names = sorted({s for s, _ in ids})
    colors = {s: color_of(i) for i, s in enumerate(slice_names)}
    values = [v for rows in per_level for row in rows for v in row[2:] if v is not None]
    values += [v for band in overall.values() for v in band if math.isfinite(v) and v > 0]
    low = min([*values, threshold, 1.0]) / 1.15
    high = max([*values, threshold, 1.0]) * 1.15
    fig = Figure(figsize=(4.8 * len(levels) + 1.4,
                          2.6 + 0.24 * max(min(len(ids), NAMED_ROWS), 4)),
                 layout="constrained")
    axes = fig.subplots(1, len(levels), squeeze=False, sharey=True)[0]
    for ax, (level, conc), rows, rank in zip(axes, levels, per_level, ranks, strict=True):
        pos = pos_named if named else rank
        speedup_axis(ax, low, high)
        ax.axvline(1.0, color="#444444", lw=1, label="1x (no change)")
        if threshold != 1.0:
            ax.axvline(threshold, color="#c44e52", lw=1.2, ls="--",
                       label=f"KEEP threshold {threshold:g}x")
        for s in slice_names:
            mine = [row for row in rows if row[1] == s]
            with_ci = [row for row in mine if row[3] is not None and row[4] is not None]
            if with_ci:
                # Clamped: a degenerate interval can sit a rounding error off its estimate.
                lo = [max(0.0, row[2] - (row[3] or 0.0)) for row in with_ci]
                hi = [max(0.0, (row[4] or 0.0) - row[2]) for row in with_ci]
                ax.errorbar([row[2] for row in with_ci], [pos[row[0]] for row in with_ci],
                            xerr=[lo, hi], fmt="none", ecolor=colors[s], alpha=0.6, lw=1.2)
            ax.scatter([row[2] for row in mine], [pos[row[0]] for row in mine],
                       color=colors[s], s=24, zorder=3, label=f"slice {s}")
        band = overall.get(level)
        if band is not None and band[1] > 0 and band[2] > 0:
            ax.axvspan(band[1], band[2], color="#55a868", alpha=0.15, zorder=0,
                       label="overall 95% CI (the speed gate)")
        if rows:
            geo = float(np.exp(np.mean(np.log([row[2] for row in rows]))))
            ax.axvline(geo, color="#55a868", lw=1.2, ls=":", label="geometric mean")
            ax.set_title(f"load {level} ({conc}): geometric mean {geo:.3f}x, "
                         f"{len(rows)} prompts", fontsize=10)
        else:
            empty_note(ax, "no prompt completed on both sides")
            ax.set_title(f"load {level} ({conc})", fontsize=10)
        ax.set_xlabel(f"speedup = {reference} / {candidate} latency")
        ax.grid(alpha=0.3, axis="x")
    if named:
        axes[0].set_yticks(range(len(ids)), [p for _, p in ids], fontsize=8)
        axes[0].set_ylabel("prompt")
    else:
        axes[0].set_ylabel(f"{len(ids)} prompts, ranked by speedup in each panel")
    axes[0].set_ylim(len(ids) - 0.5 if ids else 0.5, -0.5)
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center",
               ncols=min(len(handles), 6), fontsize=8, frameon=False)
    fig.suptitle(f"Per-prompt speedup, {candidate} vs {reference} "
                 "(bars: 95% bootstrap CI over repetitions; > 1x: candidate faster)",
                 fontsize=11)
    return to_png(fig)


# --------------------------------------------------------------------------- accept length


def accept_length_plot(data: SavedCampaign) -> bytes:
    """Histogram of per-request accept length, one series per drafter condition."""
    fig = Figure(figsize=(7.5, 4.0), layout="constrained")
    ax = fig.subplots()
    series = []
    roles = data.meta.conditions
    for i, cond in enumerate(condition_order(data)):
        info = roles.get(cond)
        if (info is not None and info.role == "baseline") or cond == data.meta.baseline:
            continue  # speculation off: an accept length of 1 says nothing
        ok = _ok(data.of(cond))
        values = [r.accept_length for r in ok if r.accept_length is not None]
        verified = [(r.output_tokens or 0, r.spec_verify_ct) for r in ok if r.spec_verify_ct]
        pooled = sum(t for t, _ in verified) / sum(v for _, v in verified) if verified else None
        if values:
            label = f"{cond} (n={len(values)}, per-request mean {np.mean(values):.2f}"
            label += f", pooled {pooled:.2f})" if pooled is not None else ")"
            series.append((i, label, values))
    # The axis spans what an accept length can be: 1 (no draft accepted, the target's own
    # token only) to k + 1 (every one of k drafted tokens accepted), so a drafter stuck at the
    # floor shows as such instead of filling an axis zoomed onto 1.00-1.25.
    top = accept_axis_top(data, [max(v) for _, _, v in series])
    ax.set_xlim(0.9, top + 0.1)
    if series:
        bins = np.linspace(1.0, top, max(10, round((top - 1.0) * 8) + 1)).tolist()
        for i, label, values in series:
            ax.hist(values, bins=bins, histtype="stepfilled", alpha=0.35, color=color_of(i),
                    edgecolor=color_of(i), lw=1.5,
                    label=label)
    else:
        empty_note(ax, "no drafter condition recorded an accept length")
    ax.axvline(1.0, color="#444444", lw=1, ls="--", label="1 = no drafted token accepted")
    ax.legend(fontsize=8)
    ax.set_xlabel("accept length (tokens per verify step, bonus token included)")
    ax.set_ylabel("requests")
    ax.grid(alpha=0.3)
    ax.set_title(f"Accept length per request ({timed_words(data)}, all load levels)",
                 fontsize=10)
    return to_png(fig)


# --------------------------------------------------------------------------- TTFT, throughput


def _boxes(ax: Axes, values: dict[str, list[float]], conds: list[str]) -> None:
    """One box per condition (quartiles, whiskers 1.5 IQR) on one load level's own axis."""
    drawn = False
    for i, cond in enumerate(conds):
        vals = values.get(cond, [])
        if not vals:
            ax.text(i, 0.02, "no ok request", ha="center", va="bottom", fontsize=8,
                    rotation=90, color="#888888", transform=ax.get_xaxis_transform())
            continue
        ax.boxplot([vals], positions=[i], widths=0.6, patch_artist=True,
                   boxprops={"facecolor": color_of(i), "alpha": 0.6},
                   medianprops={"color": "black"}, flierprops={"markersize": 3})
        drawn = True
    ax.set_xticks(range(len(conds)), conds, fontsize=8, rotation=15)
    ax.set_xlim(-0.6, len(conds) - 0.4)
    ax.grid(alpha=0.3, axis="y")
    if not drawn:
        empty_note(ax, "no successful requests")


def ttft_throughput_figure(data: SavedCampaign) -> Figure:
    """Per-request time to first token (top row, ms) and output tokens/s (bottom row), one
    column per load level, each with its own axis: queueing at a high load must not
    flatten the boxes of a low one."""
    conds, levels = condition_order(data), level_order(data)
    fig = Figure(figsize=(max(6.0, 3.6 * len(levels) + 1.0), 6.6), layout="constrained")
    axes = fig.subplots(2, len(levels), squeeze=False)
    for j, (level, conc) in enumerate(levels):
        ok = {c: _ok(data.of(c, level)) for c in conds}
        top, bottom = axes[0][j], axes[1][j]
        _boxes(top, {c: [r.ttft_s * 1000 for r in rs if r.ttft_s is not None]
                     for c, rs in ok.items()}, conds)
        top.set_title(f"load {level} ({conc})", fontsize=10)
        _boxes(bottom, {c: [t for r in rs if (t := r.tokens_per_s) is not None]
                        for c, rs in ok.items()}, conds)
        top.set_ylabel("time to first token (ms)" if j == 0 else "ms")
        bottom.set_ylabel("output tokens/s per request" if j == 0 else "tokens/s")
    fig.suptitle("Time to first token (top) and throughput (bottom) per request\n"
                 f"{timed_words(data)}, successful requests; each load level on its own axis",
                 fontsize=10)
    return fig


# --------------------------------------------------------------------------- all together


def _overall(summary: dict[str, Any] | None, reference: str, candidate: str) -> Overall:
    out: Overall = {}
    for g in (summary or {}).get("gates", []):
        ci = g.get("ci")
        if (g.get("kind"), g.get("condition"), g.get("reference")) == (
                GateKind.SPEEDUP, candidate, reference) and not g.get("slice") \
                and g.get("estimate") is not None and ci and None not in ci:
            out[str(g.get("load"))] = (float(g["estimate"]), float(ci[0]), float(ci[1]))
    return out


def all_plots(data: SavedCampaign, speedup_min: float = 1.0, seed: int = 0,
              summary: dict[str, Any] | None = None) -> dict[str, bytes]:
    """Every report plot, keyed by a stable name (the HTML report shows them in this order).
    Speedup plots: each candidate vs the baseline (threshold ``speedup_min``) and vs the
    current drafter (threshold 1), with the speed gates' CIs from ``summary``; then the
    analyses (``plots_analyses``)."""
    plots = {"latency_cdf": latency_cdf(data),
             "ttft_throughput": to_png(ttft_throughput_figure(data))}
    baseline = data.meta.baseline
    current = data.meta.current
    for cand in data.meta.candidates:
        for ref, threshold in ((baseline, speedup_min), (current, 1.0)):
            if ref:
                plots[f"speedup_{cand}_vs_{ref}"] = speedup_plot(
                    data, ref, cand, threshold, seed, _overall(summary, ref, cand))
    plots["accept_length"] = accept_length_plot(data)
    plots.update(analysis_plots(data, summary or {}, speedup_min))
    crossing = crossover_plot(summary or {}, speedup_min)
    if crossing is not None:
        plots["crossover"] = crossing
    return plots

