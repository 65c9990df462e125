"""report.md: verdicts, figures and gates in Markdown (also for $GITHUB_STEP_SUMMARY).

GitHub renders HTML inside Markdown, and a step summary is shown to everyone who can see the
workflow run: every text that comes from outside (the title, server error bodies in gate
summaries, paths) is HTML-escaped here, so it shows as text and never as markup.
"""

from __future__ import annotations

import html
from typing import Any

from ..judgement.history import Comparison
from ..judgement.judge import Judgement
from ..results.campaign_file import live_status
from ..results.folder import SavedCampaign
from .terminal import TABLE_HEADER, table_rows


def _esc(value: Any) -> str:
    """Text as Markdown shows it: no HTML, one line."""
    text = html.escape(str(value), quote=False).replace("`", "&#96;")
    return " ".join(text.splitlines())  # every kind of line break (\r, \x85, \u2028...)


def _cell(value: Any) -> str:
    return _esc(value).replace("|", "\\|")


def markdown(judgement: Judgement, data: SavedCampaign, title: str,
             comparison: Comparison | None = None, *, partial: str | None = None,
             rejudged: dict[str, Any] | None = None) -> str:
    lines = [f"# {_esc(title)}", ""]
    if partial:  # said first: what follows is no verdict
        lines += [f"> **INTERRUPTED** &mdash; {_esc(partial)}. Judged as measured: no "
                  "verdict.", ""]
    if rejudged:
        lines += [f"_Re-judged copy ({_esc(rejudged.get('at'))}, limits from "
                  f"{_esc(rejudged.get('pilot'))}); the original reports are untouched._", ""]
    for v in judgement.verdicts:
        lines.append(f"- **{v.verdict}** `{_esc(v.candidate)}`")
        lines += [f"  - {_esc(r)}" for r in v.reasons]
    if not judgement.verdicts:
        lines.append("- no candidate was judged")
    lines += ["", "## Figures", ""]
    lines.append("| " + " | ".join(TABLE_HEADER) + " |")
    lines.append("|" + "---|" * len(TABLE_HEADER))
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |"
              for row in table_rows(judgement.figures)]
    lines += ["", "## Gates", "", "| gate | outcome | summary |", "|---|---|---|"]
    for g in judgement.results.values():
        text = _cell(g.summary.splitlines()[0] if g.summary else "")
        lines.append(f"| {_cell(g.spec.kind)}[{_cell(g.spec.id)}] | {g.outcome} | {text} |")
    if comparison is not None:
        lines += ["", "## Compared with an earlier campaign", "",
                  f"{_esc(comparison.previous_dir)} (run {_esc(comparison.previous_run_id)}), "
                  f"tolerance {comparison.tolerance:.0%}.", ""]
        lines += [f"- {'**REGRESSION** ' if f.regression else ''}{_esc(f.text)}"
                  for f in comparison.findings]
        lines += [f"- {_esc(note)}" for note in comparison.notes]
    meta = data.meta
    status = live_status(meta)
    lines += ["", f"Run {_esc(meta.run_id)}, trace {_esc(str(meta.trace_hash)[:12])}, "
              f"status {_esc(status)}.", ""]
    return "\n".join(lines)
