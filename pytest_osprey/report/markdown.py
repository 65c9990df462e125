"""report.md: verdicts, figures and gates in Markdown (also for $GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

from ..judgement.history import Comparison
from ..judgement.judge import Judgement
from ..results.folder import SavedCampaign
from .terminal import TABLE_HEADER, table_rows


def markdown(judgement: Judgement, data: SavedCampaign, title: str,
             comparison: Comparison | None = None) -> str:
    lines = [f"# {title}", ""]
    for v in judgement.verdicts:
        lines.append(f"- **{v.verdict}** `{v.candidate}`")
        lines += [f"  - {r}" for r in v.reasons]
        lines += [f"  - could not have failed ({g.evidence.replace('_', ' ')}): "
                  f"{g.spec.kind}[{g.spec.id}]" for g in v.unproven]
    if not judgement.verdicts:
        lines.append("- no candidate was judged")
    lines += ["", "## Figures", ""]
    lines.append("| " + " | ".join(TABLE_HEADER) + " |")
    lines.append("|" + "---|" * len(TABLE_HEADER))
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(judgement.figures)]
    lines += ["", "## Gates", "", "| gate | outcome | summary |", "|---|---|---|"]
    for g in judgement.results.values():
        text = g.summary.splitlines()[0].replace("|", "\\|")
        lines.append(f"| {g.spec.kind}[{g.spec.id}] | {g.label} | {text} |")
    if comparison is not None:
        lines += ["", "## Compared with an earlier campaign", "",
                  f"`{comparison.previous_dir}` (run `{comparison.previous_run_id}`), "
                  f"tolerance {comparison.tolerance:.0%}.", ""]
        lines += [f"- {'**REGRESSION** ' if f.regression else ''}{f.text}"
                  for f in comparison.findings]
        lines += [f"- {note}" for note in comparison.notes]
    meta = data.meta
    lines += ["", f"Run `{meta.run_id}`, trace `{str(meta.trace_hash)[:12]}`, "
              f"status {meta.status}.", ""]
    return "\n".join(lines)
