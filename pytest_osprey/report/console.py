"""What a finished run prints (the pytest terminal summary and ``python -m pytest_osprey run``
alike): the set-up in one line, the figures tables, stability warnings, a headline per
candidate with its reasons and the gates that could not have failed, the comparison with an
earlier campaign, how the campaign ended, and where the results are. Each line comes with a
style the caller may render (colour) or ignore."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..judgement import CandidateVerdict, Comparison, Judgement
from ..judgement.verdict.diagnosis import gate_name, short_text
from ..pilot.schema import Pilot
from ..results.ending import campaign_end
from ..results.folder import SavedCampaign
from ..results.preflight_file import Preflight
from ..results.spent import campaign_spent
from .headline import bullet_lines, headline
from .sections import evidence_words
from .setup import memory_basis, short_setup
from .terminal import Columns, results_line, terminal_legend, text_table

COLORS = {"KEEP": "green", "DROP": "red", "INCONCLUSIVE": "yellow"}


@dataclass(frozen=True)
class Line:
    text: str
    style: str = ""  # "", "red", "green", "yellow", "bold" or "<color> bold"


def table_columns(judgement: Judgement, data: SavedCampaign) -> Columns:
    label, note, _ = memory_basis(data.meta)
    return Columns(memory=label, memory_note=note, baseline=data.meta.baseline,
                   speedups=judgement.speedups)


def closing_lines(pilot: Pilot, judgement: Judgement, data: SavedCampaign,
                  comparison: Comparison | None, reports: Sequence[Path]) -> list[Line]:
    cols = table_columns(judgement, data)
    setup = short_setup(data.meta, pilot, figures=judgement.figures,
                        ending=campaign_end(data).as_dict())
    out = [Line(f"set-up: {setup}")]
    out += [Line(t) for t in text_table(judgement.figures, cols)]
    out += [Line(t) for t in terminal_legend(cols, judgement.figures)]
    for warning in judgement.stability.warnings:
        out.append(Line(f"WARNING: {warning}", "yellow"))
    out.append(Line(""))
    for verdict, d in zip(judgement.verdicts, judgement.diagnoses, strict=True):
        out.append(Line(headline(d), f"{COLORS[d.verdict]} bold"))
        out += [Line(t) for t in bullet_lines(d)]
        out += [Line(t, "yellow") for t in unproven_lines(verdict, data.meta.baseline,
                                                          {u.kind for u in d.unchecked})]
    if comparison is not None:
        out.append(Line(f"compared with {comparison.previous_dir} "
                        f"(run {comparison.previous_run_id}):"))
        for f in comparison.findings:
            out.append(Line(f"  {'REGRESSION ' if f.regression else ''}{f.text}",
                            "red" if f.regression else ""))
        out += [Line(f"  {note}") for note in comparison.notes]
    out.append(Line(f"campaign: {campaign_end(data).text}"))
    spent = campaign_spent(data.meta, pilot)
    if spent is not None:
        out.append(Line(spent.line()))
    where = results_line(reports)
    if where:
        out.append(Line(where))
    return out


def unproven_lines(verdict: CandidateVerdict, baseline: str | None,
                   named: set[str], indent: str = "  ") -> list[str]:
    """A bullet per gating gate of ``verdict`` that passed or was skipped without the
    evidence to have failed, but for the quality checks ``named`` (their gate kinds) as
    unchecked already."""
    return [f"{indent}- {evidence_words(g.evidence)}: "
            f"{gate_name(g, verdict.candidate, baseline or '')} "
            f"({g.outcome}, {g.evidence.replace('_', ' ')}): {short_text(g)}"
            for g in verdict.unproven if g.spec.kind not in named]


def dry_run_lines(preflight: Preflight, conditions: Sequence[str]) -> list[Line]:
    """What a dry run checked, condition by condition, and that nothing was booted."""
    out = [Line("dry run: nothing was booted; checked:")]
    for name in conditions:
        check = preflight.command_lines.get(name)
        if check is not None:
            first = check.lines[0] if check.lines else ""
            out.append(Line(f"  {name}: command line {'ok' if check.ok else 'FAILED'}"
                            + (f": {first}" if first else ""), "" if check.ok else "red"))
            out += [Line(f"      {line}") for line in check.lines[1:4]]
            if check.environment:
                out.append(Line(f"      {check.environment}"))
        report = preflight.artifacts.get(name)
        if report is not None:
            for c in report.checks:
                out.append(Line(f"  {name}: artifact {c.name} {'ok' if c.ok else 'FAILED'}: "
                                f"{c.detail}", "" if c.ok else "red"))
    return out
