"""What every report plot shares: the PNG canvas, colours, condition and level order, an
empty-panel note, and a speedup axis with readable labels."""

from __future__ import annotations

import io
import math

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from ..results.folder import SavedCampaign

DPI = 100
COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
          "#8c8c8c", "#ccb974", "#64b5cd")


def to_png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def condition_order(data: SavedCampaign) -> list[str]:
    names = list(data.meta.conditions)
    for r in data.records:
        if r.condition not in names:
            names.append(r.condition)
    return names




def color_of(i: int) -> str:
    return COLORS[i % len(COLORS)]


def empty_note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666666",
            bbox={"facecolor": "white", "edgecolor": "#cccccc", "boxstyle": "round"}, zorder=5)


NICE_TICKS = (0.1, 0.2, 0.25, 0.33, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 2.5, 3.0,
              4.0, 5.0, 7.0, 10.0, 20.0, 50.0, 100.0)


def speedup_axis(ax: Axes, low: float, high: float, axis: str = "x") -> None:
    """Log axis with plain 'Nx' labels at a handful of round speedups, spaced apart so that
    their labels never run into each other."""
    which = ax.xaxis if axis == "x" else ax.yaxis
    # An interval with no information (df 0 gives [0, inf]) must not stretch the axis to
    # nothing: the axis spans the round speedups at most, the bar runs off its edge.
    low = max(low, NICE_TICKS[0]) if math.isfinite(low) else NICE_TICKS[0]
    high = min(high, NICE_TICKS[-1]) if math.isfinite(high) else NICE_TICKS[-1]
    if not high > low:
        low, high = NICE_TICKS[0], NICE_TICKS[-1]
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    (ax.set_xlim if axis == "x" else ax.set_ylim)(low, high)
    gap = math.log(high / low) / 9  # at most about 9 labels across the axis
    ticks = [1.0]
    for t in sorted(NICE_TICKS, key=lambda t: abs(math.log(t))):
        if low <= t <= high and all(abs(math.log(t / u)) >= gap for u in ticks):
            ticks.append(t)
    which.set_major_locator(FixedLocator(sorted(ticks)))
    which.set_minor_locator(NullLocator())
    which.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}x"))


def draft_tokens(data: SavedCampaign) -> int:
    """The most tokens any condition drafts per step (its fingerprint; 4 when unknown)."""
    ks = [int(k) for c in data.meta.conditions.values()
          if isinstance(k := c.fingerprint.get("num_draft_tokens"), int)]
    return max(ks, default=4)


def accept_axis_top(data: SavedCampaign, highest: list[float]) -> float:
    """Right end of the accept-length axis: k + 1 for k drafted tokens (or what was seen)."""
    return max([*highest, draft_tokens(data) + 1.0, 2.0])


def timed_words(data: SavedCampaign) -> str:
    """What the timed records are, for a plot's title: the timed passes run at the serving
    sampling where the pilot serves sampled, and only then is a greedy pass beside them
    (untimed, not plotted)."""
    if data.timed_mode != "serving":
        return "timed greedy requests"
    rec = next((r for r in data.records if r.mode == "serving"), None)
    if rec is None or rec.temperature is None:
        return "timed requests at the serving sampling"
    top_p = "" if rec.top_p in (None, 1.0) else f", top-p {rec.top_p:g}"
    return f"timed requests sampled at T {rec.temperature:g}{top_p}"
