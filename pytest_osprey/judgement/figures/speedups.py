"""Each (condition, load)'s speedup over the baseline on the whole trace, as its speed gate
judged it, and the figures rows that carry it (summary.json's ``figures[].speedup``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..gates.kinds import GateKind
from ..gates.result import GateResult
from .measured import Figures

Cell = tuple[float | None, float | None, float | None]  # speedup estimate, CI low, CI high


def speedup_cells(results: Iterable[GateResult], baseline: str | None) -> dict[
        tuple[str, str], Cell]:
    """(condition, load) -> the whole-trace speed gate's estimate and interval against the
    baseline (a later gate of the same cell wins, as the gates are listed)."""
    out: dict[tuple[str, str], Cell] = {}
    for r in results:
        s = r.spec
        if s.kind != GateKind.SPEEDUP or s.slice or s.reference != baseline:
            continue
        high = r.ci_high if r.ci_low is not None else None  # an interval has both ends
        out[(str(s.condition), str(s.load))] = (r.estimate, r.ci_low, high)
    return out


def with_speedups(figures: Iterable[Figures],
                  cells: Mapping[tuple[str, str], Cell]) -> list[Figures]:
    """``figures`` with each row's speedup and interval filled in where a gate judged it."""
    return [f.model_copy(update={"speedup": cell[0], "speedup_ci": [cell[1], cell[2]]
                                 if cell[1] is not None else None})
            if (cell := cells.get((f.condition, f.load))) is not None else f
            for f in figures]
