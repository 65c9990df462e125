"""summary.json (the machine-readable sheet), report.md and report.html, written atomically."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..judgement.analyses import all_domain_rows, per_position_acceptance
from ..judgement.cost import cost_summary
from ..judgement.diagnosis import diagnose_all
from ..judgement.goodput import goodput_section
from ..judgement.history import Comparison
from ..judgement.judge import Judgement
from ..judgement.stability import stability
from ..pilot.schema import Pilot
from ..results.files import write_json_atomic, write_text_atomic
from ..results.folder import SavedCampaign
from .headline import headline
from .markdown import markdown
from .setup import setup_rows
from .summary_schema import SUMMARY_SCHEMA, Summary


def summary_dict(judgement: Judgement, data: SavedCampaign, pilot: Pilot,
                 comparison: Comparison | None = None) -> dict[str, Any]:
    """summary.json's content, validated against its schema (summary_schema.Summary)."""
    meta = data.meta
    diagnoses = diagnose_all(pilot, judgement.verdicts, list(judgement.results.values()),
                             judgement.figures, data)
    acceptance = {c: shares for c in meta.conditions
                  if (shares := per_position_acceptance(data.of(c))) is not None}
    summary = Summary.model_validate({
        "schema": SUMMARY_SCHEMA,
        "run_id": meta.run_id,
        "pilot_name": meta.pilot_name,
        "trace_hash": meta.trace_hash,
        "config_hash": meta.config_hash,
        "status": meta.status,
        "verdicts": [
            {"candidate": v.candidate, "verdict": v.verdict, "reasons": v.reasons,
             "headline": headline(d), "bullets": [asdict(r) for r in d.reasons],
             "notes": d.notes}
            for v, d in zip(judgement.verdicts, diagnoses, strict=True)
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
        "setup": [{"what": k, "value": v} for k, v in setup_rows(meta, pilot)],
        "stability": stability(data),
        "goodput": goodput_section(pilot, data),
        "domains": all_domain_rows(data, pilot.primary_load, pilot.sampling.seed),
        "acceptance_by_position": acceptance,
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

        plots = all_plots(data, pilot.limits.speedup_min, pilot.sampling.seed, summary)
        written.append(write_html(directory, summary, data, plots, settings.title))
    if settings.markdown:
        text = markdown(summary, data.meta, settings.title, directory.name,
                        settings.markdown_max_kib)
        write_text_atomic(directory / "report.md", text)
        written.append(directory / "report.md")
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            with open(step_summary, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")
    return written
