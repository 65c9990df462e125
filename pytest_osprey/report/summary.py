"""summary.json (the machine-readable sheet), report.md and report.html, written atomically."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..judgement import Comparison, Judgement
from ..judgement.figures.measured import memory_kind
from ..pilot.schema import Pilot
from ..results.campaign_file import live_status
from ..results.ending import campaign_end
from ..results.files import write_json_atomic, write_text_atomic
from ..results.folder import SavedCampaign
from ..results.redact import scrub
from ..results.spent import campaign_spent
from .headline import headline
from .markdown import markdown
from .setup import models, setup_facts, setup_rows
from .summary_schema import SUMMARY_SCHEMA, Summary


def summary_dict(judgement: Judgement, data: SavedCampaign, pilot: Pilot,
                 comparison: Comparison | None = None, *, partial: str | None = None,
                 rejudged: dict[str, Any] | None = None) -> dict[str, Any]:
    """summary.json's content, validated against its schema (summary_schema.Summary)."""
    meta = data.meta
    per_machine = judgement.machine_speedups
    summary = Summary.model_validate({
        "schema": SUMMARY_SCHEMA,
        "run_id": meta.run_id,
        "pilot_name": meta.pilot_name,
        "trace_hash": meta.trace_hash,
        "config_hash": meta.config_hash,
        "status": live_status(meta),
        "campaign": {**campaign_end(data).as_dict(), "tool_version": meta.tool_version,
                     "started_at": meta.started_at, "ended_at": meta.ended_at,
                     "started_at_iso": _iso(meta.started_at),
                     "ended_at_iso": _iso(meta.ended_at),
                     "spent": (spent.as_dict() if (spent := campaign_spent(meta, pilot))
                               is not None else None),
                     "requests_planned": meta.size.requests if meta.size else None,
                     "quality_requests": meta.size.quality_requests if meta.size else None,
                     "quality_share": meta.size.quality_share if meta.size else None,
                     "draws": {k: d.prompt_ids for k, d in meta.draws.items()}},
        "models": models(meta, pilot),
        "partial": partial,
        "rejudged": rejudged,
        "verdicts": [
            {"candidate": v.candidate, "verdict": v.verdict, "reasons": v.reasons,
             "headline": headline(d), "bullets": [asdict(r) for r in d.reasons],
             "notes": d.notes, "unchecked": [u.as_dict() for u in d.unchecked],
             "next_step": d.next_step,
             "crossover": d.crossover.as_dict() if d.crossover is not None else None,
             "unproven": [{"gate": f"{g.spec.kind}[{g.spec.id}]", "kind": g.spec.kind,
                           "evidence": g.evidence} for g in v.unproven]}
            for v, d in zip(judgement.verdicts, judgement.diagnoses, strict=True)
        ],
        "gates": [g.as_dict() for g in judgement.results.values()],
        "figures": judgement.figures,
        "cost": judgement.cost,
        "conditions": {
            name: {"role": info.role, "error": info.error, "boot_s": info.boot_s,
                   "peak_memory_mb": info.peak_memory_mb,
                   "memory_kind": memory_kind(info.fingerprint)}
            for name, info in meta.conditions.items()
        },
        "comparison": comparison,
        "setup": [{"what": k, "value": v} for k, v in setup_rows(meta, pilot, judgement.figures)],
        "setup_facts": setup_facts(meta, pilot),
        "stability": judgement.stability,
        "goodput": judgement.goodput,
        "domains": judgement.domains,
        "acceptance_by_position": judgement.acceptance,
        "shards": [{"index": m.index, "status": m.status, "node": m.node, "passes": m.passes,
                    "greedy_requests": m.greedy_requests, "note": m.note,
                    "speedup": per_machine[i] if i < len(per_machine) else {}}
                   for i, m in enumerate(meta.merged)],
        "merge_note": meta.merge_note,
    })
    return summary.model_dump(by_alias=True)


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


def write_reports(directory: Path, judgement: Judgement, data: SavedCampaign,
                  pilot: Pilot, comparison: Comparison | None = None, *,
                  partial: str | None = None, rejudged: dict[str, Any] | None = None,
                  plots: bool = True, warn: Callable[[str], None] | None = None) -> list[Path]:
    """summary.json, report.md (and $GITHUB_STEP_SUMMARY), report.html — each atomically.

    ``partial``: why the campaign is incomplete, said first in every report; ``rejudged``:
    this is a re-judged copy (when and under which limits); ``plots=False`` leaves the plots
    out (an interrupted run has seconds to finish). A step summary that cannot be written is
    skipped with a ``warn``ing: the reports and the gates do not depend on it."""
    settings = pilot.report
    summary = summary_dict(judgement, data, pilot, comparison, partial=partial,
                           rejudged=rejudged)
    written = [directory / "summary.json"]
    write_json_atomic(written[0], summary)
    if settings.html:
        from .html import write_html

        drawn: dict[str, bytes] = {}
        if plots and plots_available(warn):
            from .plots import all_plots

            drawn = all_plots(data, pilot.limits.speedup_min, pilot.sampling.seed, summary)
        written.append(write_html(directory, summary, data, drawn, settings.title))
    if settings.markdown:
        text = markdown(summary, data.meta, settings.title, directory.name,
                        settings.markdown_max_kib)
        write_text_atomic(directory / "report.md", text)
        written.append(directory / "report.md")
        problem = append_step_summary(text)
        if problem and warn is not None:
            warn(problem)
    return written


def plots_available(warn: Callable[[str], None] | None) -> bool:
    """Whether matplotlib can draw here; without it report.html is written without its plots,
    and ``warn`` says so (the gates and the tables do not depend on them)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None or _no_plots(warn)
    except ImportError:
        return _no_plots(warn)


def _no_plots(warn: Callable[[str], None] | None) -> bool:
    if warn is not None:
        warn("report.html has no plots: matplotlib is not installed here "
             "(pip install matplotlib)")
    return False


def append_step_summary(text: str) -> str | None:
    """Append to ``$GITHUB_STEP_SUMMARY`` when set; a problem is returned, never raised."""
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not step_summary:
        return None
    try:
        with open(step_summary, "a", encoding="utf-8") as fh:
            fh.write(scrub(text) + "\n")
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return (f"GITHUB_STEP_SUMMARY={step_summary}: cannot append the report ({why}); "
                "step summary skipped")
    return None
