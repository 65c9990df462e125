"""summary.json (the machine-readable sheet) and report.md, written atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..campaign import CampaignData
from ..config import Pilot
from ..correctness import correctness_by_prompt
from ..cost import cost_summary
from ..history import Comparison
from ..judgement import Judgement
from ..records import write_json_atomic, write_text_atomic
from .figures import TABLE_HEADER, table_rows
from .html import write_html
from .plots import all_plots
from .summary_schema import SUMMARY_SCHEMA, Summary


def summary_dict(judgement: Judgement, data: CampaignData, pilot: Pilot,
                 comparison: Comparison | None = None) -> dict[str, Any]:
    """summary.json's content, validated against its schema (summary_schema.Summary)."""
    meta = data.meta
    cost = cost_summary(pilot, data)
    per_request = {(c["condition"], c["load"]): c["cost_per_request"] for c in cost["table"]}
    raw = {
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
        "figures": [
            {**f.as_dict(), "cost_per_request": per_request.get((f.condition, f.load)),
             **_correctness(data, f.condition, f.load)}
            for f in judgement.figures
        ],
        "cost": cost,
        "conditions": {
            name: {k: info.get(k) for k in ("role", "error", "boot_s", "peak_memory_mb")}
            for name, info in meta.get("conditions", {}).items()
        },
        "comparison": comparison.as_dict() if comparison is not None else None,
    }
    return Summary.model_validate(raw).model_dump(by_alias=True)


def _correctness(data: CampaignData, condition: str, load: str) -> dict[str, Any]:
    """Pass count of the prompts' expect checks at one load level (null without the trace)."""
    if data.prompts is None:
        return {"checked": None, "correct": None, "correct_fraction": None}
    passed = correctness_by_prompt(data.of(condition, load), data.prompts)
    n = len(passed)
    return {"checked": n, "correct": sum(passed.values()),
            "correct_fraction": sum(passed.values()) / n if n else None}


def markdown(judgement: Judgement, data: CampaignData, title: str,
             comparison: Comparison | None = None) -> str:
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
    if comparison is not None:
        lines += ["", "## Compared with an earlier campaign", "",
                  f"`{comparison.previous_dir}` (run `{comparison.previous_run_id}`), "
                  f"tolerance {comparison.tolerance:.0%}.", ""]
        lines += [f"- {'**REGRESSION** ' if f.regression else ''}{f.text}"
                  for f in comparison.findings]
        lines += [f"- {note}" for note in comparison.notes]
    meta = data.meta
    lines += ["", f"Run `{meta.get('run_id')}`, trace `{str(meta.get('trace_hash'))[:12]}`, "
              f"status {meta.get('status')}.", ""]
    return "\n".join(lines)


def write_reports(directory: Path, judgement: Judgement, data: CampaignData,
                  pilot: Pilot, comparison: Comparison | None = None) -> list[Path]:
    """summary.json, report.md (and $GITHUB_STEP_SUMMARY), report.html — each atomically."""
    settings = pilot.report
    summary = summary_dict(judgement, data, pilot, comparison)
    written = [directory / "summary.json"]
    write_json_atomic(written[0], summary)
    if settings.html:
        plots = all_plots(data, pilot.limits.speedup_min, pilot.sampling.seed)
        written.append(write_html(directory, summary, data, plots, settings.title))
    if settings.markdown:
        text = markdown(judgement, data, settings.title, comparison)
        write_text_atomic(directory / "report.md", text)
        written.append(directory / "report.md")
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
    return written
