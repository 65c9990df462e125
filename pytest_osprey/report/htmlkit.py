"""Small HTML helpers shared by the report page's modules: every string escaped."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable, Sequence


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def num(value: object, fmt: str = "{:.4g}") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return esc(value)
    return esc(fmt.format(value))


def money(value: object) -> str:
    """Currency amounts in plain decimals (no exponent), 3 significant digits when small."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return num(value)
    if not math.isfinite(value):
        return esc(f"{value:g}")
    if value == 0:
        return "0.00"
    decimals = max(2, 2 - math.floor(math.log10(abs(value))))
    return esc(f"{value:,.{decimals}f}")


def table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Iterable[int] = (),
           classes: dict[int, str] | None = None) -> str:
    """Cells in ``rows`` are already HTML; ``header`` is plain text. ``numeric`` columns are
    right-aligned; ``classes`` gives other columns a CSS class."""
    cls = {i: "num" for i in numeric} | (classes or {})
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="{cls[i]}">{c}</td>' if i in cls else f"<td>{c}</td>"
            for i, c in enumerate(row)
        ) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def badge(outcome: object, evidence: object = "tested") -> str:
    cls = outcome if outcome in ("pass", "fail", "inconclusive", "skip") else "skip"
    # A pass that could not have failed must not look like one that could: no green badge.
    if cls == "pass" and evidence not in (None, "tested"):
        cls = "inconclusive"
    return f'<span class="badge {cls}">{esc(outcome)}</span>'


def figure(key: str, png: bytes, caption: str) -> str:
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return (f'<figure><img src="{uri}" alt="{esc(key)}">'
            f"<figcaption><b>{esc(key)}</b>: {esc(caption)}</figcaption></figure>")
