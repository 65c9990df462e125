"""summary.json (the machine-readable sheet), report.md and report.html, written atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..judgement.cost import cost_summary
from ..judgement.history import Comparison
from ..judgement.judge import Judgement
from ..pilot.schema import Pilot
from ..results.files import write_json_atomic, write_text_atomic
from ..results.folder import SavedCampaign
from .markdown import markdown
from .summary_schema import SUMMARY_SCHEMA, Summary


def summary_dict(judgement: Judgement, data: SavedCampaign, pilot: Pilot,
                 comparison: Comparison | None = None) -> dict[str, Any]:
    """summary.json's content, validated against its schema (summary_schema.Summary)."""
    meta = data.meta
    summary = Summary.model_validate({
        "schema": SUMMARY_SCHEMA,
        "run_id": meta.run_id,
        "pilot_name": meta.pilot_name,
        "trace_hash": meta.trace_hash,
        "config_hash": meta.config_hash,
        "status": meta.status,
        "verdicts": [
            {"candidate": v.candidate, "verdict": v.verdict, "reasons": v.reasons,
             "unproven": [f"{g.spec.kind}[{g.spec.id}] {g.evidence}" for g in v.unproven]}
            for v in judgement.verdicts
        ],
        "gates": [g.as_dict() for g in judgement.results.values()],
        "figures": judgement.figures,
        "cost": cost_summary(pilot, data),
        "conditions": {
            name: {"role": info.role, "error": info.error, "boot_s": info.boot_s,
                   "peak_memory_mb": info.peak_memory_mb}
            for name, info in meta.conditions.items()
        },
        "comparison": comparison,
    })
    return summary.model_dump(by_alias=True)


def write_reports(directory: Path, judgement: Judgement, data: SavedCampaign,
                  pilot: Pilot, comparison: Comparison | None = None) -> list[Path]:
    """summary.json, report.md (and $GITHUB_STEP_SUMMARY), report.html — each atomically."""
    settings = pilot.report
    summary = summary_dict(judgement, data, pilot, comparison)
    written = [directory / "summary.json"]
    write_json_atomic(written[0], summary)
    if settings.html:
        from .html import write_html
        from .plots import all_plots

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
