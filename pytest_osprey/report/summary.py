"""summary.json (the machine-readable sheet) and report.md, written atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..campaign import CampaignData
from ..config import Pilot
from ..cost import cost_summary
from ..judgement import Judgement
from ..records import write_json_atomic, write_text_atomic
from .figures import TABLE_HEADER, table_rows
from .html import write_html
from .plots import all_plots

SUMMARY_SCHEMA = 1


def summary_dict(judgement: Judgement, data: CampaignData, pilot: Pilot) -> dict[str, Any]:
    meta = data.meta
    return {
        "schema": SUMMARY_SCHEMA,
        "run_id": meta.get("run_id"),
        "pilot_name": meta.get("pilot_name"),
        "trace_hash": meta.get("trace_hash"),
        "config_hash": meta.get("config_hash"),
        "status": meta.get("status"),
        "verdicts": [
            {"candidate": v.candidate, "verdict": v.verdict, "reasons": v.reasons}
            for v in judgement.verdicts
        ],
        "gates": [g.as_dict() for g in judgement.results.values()],
        "figures": [f.as_dict() for f in judgement.figures],
        "cost": cost_summary(pilot, data),
        "conditions": {
            name: {k: info.get(k) for k in ("role", "error", "boot_s", "peak_memory_mb")}
            for name, info in meta.get("conditions", {}).items()
        },
    }


def markdown(judgement: Judgement, data: CampaignData, title: str) -> str:
    lines = [f"# {title}", ""]
    for v in judgement.verdicts:
        lines.append(f"- **{v.verdict}** `{v.candidate}`")
        lines += [f"  - {r}" for r in v.reasons]
    if not judgement.verdicts:
        lines.append("- no candidate was judged")
    lines += ["", "## Figures", ""]
    lines.append("| " + " | ".join(TABLE_HEADER) + " |")
    lines.append("|" + "---|" * len(TABLE_HEADER))
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(judgement.figures)]
    lines += ["", "## Gates", "", "| gate | outcome | summary |", "|---|---|---|"]
    for g in judgement.results.values():
        text = g.summary.splitlines()[0].replace("|", "\\|")
        lines.append(f"| {g.spec.kind}[{g.spec.id}] | {g.outcome} | {text} |")
    meta = data.meta
    lines += ["", f"Run `{meta.get('run_id')}`, trace `{str(meta.get('trace_hash'))[:12]}`, "
              f"status {meta.get('status')}.", ""]
    return "\n".join(lines)


def write_reports(directory: Path, judgement: Judgement, data: CampaignData,
                  pilot: Pilot) -> list[Path]:
    """summary.json, report.md (and $GITHUB_STEP_SUMMARY), report.html — each atomically."""
    settings = pilot.report
    summary = summary_dict(judgement, data, pilot)
    written = [directory / "summary.json"]
    write_json_atomic(written[0], summary)
    if settings.html:
        plots = all_plots(data, pilot.limits.speedup_min, pilot.sampling.seed)
        written.append(write_html(directory, summary, data, plots, settings.title))
    if settings.markdown:
        text = markdown(judgement, data, settings.title)
        write_text_atomic(directory / "report.md", text)
        written.append(directory / "report.md")
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
    return written
