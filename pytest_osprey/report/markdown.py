"""report.md: made to be read as a pull-request comment or a CI step summary.

First what decides: a headline per candidate with its reasons, a warning when the machine was
unsteady, one key table, and a line saying when, on what, how many passes ran, and where the
full report is (under GitHub Actions or GitLab CI, links to the run and its artifacts). Then
the details, each collapsed (``<details>``): the gates that decide, the gates reported only
(visibly apart: they never fail the run), cost, set-up, stability, latency, throughput and
memory, per-domain speed, goodput. A comparison with an earlier campaign stays in the head: a
regression is news. Tables keep to seven short columns (a PR comment is about 880 px wide),
and each names the load level of its rows.

Every piece of text from the pilot, the engine or the records is escaped (``<``, ``>``, ``&``,
``[``, ``]``, ``!``, ``#``, a joiner after ``@`` and in ``://``, and ``|`` in table cells): a
model's output or an engine's error must not become markup, a mention, a link or an image.
The page is capped (``report.markdown_max_kib``, 64 KiB by default, never above GitHub's
1 MiB step-summary limit): sections that do not fit are cut, with a note saying so.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..judgement import CostSection, Figures, GoodputSection, Stability
from ..results.campaign_file import CampaignFile
from .exact_table import HEADER, exact_tables
from .sections import (
    Section,
    cost_section,
    evidence_words,
    goodput_section,
    stability_section,
)
from .setup import hardware, memory_basis, shards_line, short_setup, started
from .terminal import Columns, figure_speedups, in_flight_text, speedup_text, table_rows

GITHUB_LIMIT = 1024 * 1024  # bytes GitHub accepts in one step summary
RESERVE = 400  # bytes kept for the truncation note
ICONS = {"KEEP": ":white_check_mark:", "DROP": ":x:", "INCONCLUSIVE": ":warning:"}


# Markdown that text from a server, a trace or a pilot must not make live in a PR comment:
# links and images (a remote image tracks every reader: "[" and "!" escaped), headings ("#").
# Backslash escapes are CommonMark's own; "@" and "://" get a zero-width joiner instead, since
# GitHub turns @name into a mention and a bare URL into a link whatever the escaping.
_MARKDOWN = str.maketrans({c: "\\" + c for c in "\\[]!#"})
_ZWJ = "\u2060"


def esc(value: object) -> str:
    """Text from the pilot, the engine or the records, safe in Markdown: no HTML, no code
    spans, no links, images, mentions or headings, one line (every kind of line break)."""
    text = html.escape("" if value is None else str(value), quote=False).replace("`", "&#96;")
    text = text.translate(_MARKDOWN).replace("@", "@" + _ZWJ).replace("://", ":" + _ZWJ + "//")
    text = text.replace("www.", "www" + _ZWJ + ".")
    return " ".join(text.splitlines())


def cell(value: object) -> str:
    """Safe in a table cell: one line, pipes escaped."""
    return " ".join(esc(value).split()).replace("|", "\\|")


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(cell(h) for h in header) + " |",
           "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def _details(summary: str, lines: Sequence[str]) -> str:
    return "\n".join(["<details><summary>" + summary + "</summary>", "", *lines, "",
                      "</details>", ""])


# --------------------------------------------------------------------------- the head


def _verdicts(summary: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for v in summary.get("verdicts", []):
        verdict = str(v.get("verdict"))
        line = esc(v.get("headline") or f"{verdict} {v.get('candidate')}")
        rest = line[len(verdict):] if line.startswith(verdict) else " " + line
        out.append(f"{ICONS.get(verdict, '')} **{esc(verdict)}**{rest}".strip())
        for b in v.get("bullets", []):
            word = "" if b.get("outcome") == "fail" else f" ({esc(b.get('outcome'))})"
            out.append(f"- **{esc(b.get('name'))}**{word}: {esc(b.get('text'))}")
            if b.get("diagnosis"):
                out.append(f"  - *diagnosis:* {esc(b['diagnosis'])}")
        cross = v.get("crossover") or {}
        plotted = cross.get("text") if cross.get("status") not in (None, "not_estimable") \
            else None
        out += [f"- *note:* {esc(n)}" + (" (speedup against concurrency: plotted in "
                                          "report.html)" if n == plotted else "")
                for n in v.get("notes", [])]
        out += [f"- *{evidence_words(u['evidence'])}:* {esc(u['gate'])}"
                for u in v.get("unproven", [])]
        out += [f"- *unchecked {esc(u.get('check'))}:* {esc(u.get('why'))}"
                for u in v.get("unchecked", [])]
        if v.get("next_step"):
            out.append(f"- **next:** {esc(v['next_step'])}")
        out.append("")
    if not out:
        out = ["No candidate was judged.", ""]
    return out


def _columns(summary: Mapping[str, Any], meta: CampaignFile) -> Columns:
    label, note, _ = memory_basis(meta)
    return Columns(memory=label, memory_note=note, baseline=meta.baseline,
                   speedups=figure_speedups(_figures(summary)))


def _figures(summary: Mapping[str, Any]) -> list[Figures]:
    return [Figures.model_validate(f) for f in summary.get("figures", [])]


def key_table(summary: Mapping[str, Any], meta: CampaignFile) -> list[str]:
    """Seven short columns: what decides, at each load level (the rest is in the details)."""
    cols = _columns(summary, meta)
    rows = [(r[0], r[1], r[5], r[4], r[3], r[6], r[7])
            for r in table_rows(_figures(summary), cols, deltas=True)]
    lines = _table(("condition", "load", "speedup [95% CI]", "completion p50/p95 ms",
                    "TTFT p50/p95 ms", "tok/s", "accept len"), rows)
    if any("%)" in c for r in rows for c in r):
        lines += ["", "<sub>(+N%): worse than the baseline at the same load by N%</sub>"]
    return lines


_URL = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~%/-]*)?")
_REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


def ci_links(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(label, URL) of the CI run and its artifacts, from GitHub Actions' or GitLab CI's
    variables; none outside CI. A value that is not a plain URL (or repository, or run id) is
    left out: it goes into a link."""
    server, repo, run = (env.get(k, "") for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY",
                                                   "GITHUB_RUN_ID"))
    if _URL.fullmatch(server) and _REPO.fullmatch(repo) and run.isdigit():
        url = f"{server.rstrip('/')}/{repo}/actions/runs/{run}"
        return [("CI run", url), ("artifacts", f"{url}#artifacts")]
    job, pipeline = env.get("CI_JOB_URL", ""), env.get("CI_PIPELINE_URL", "")
    out = []
    if _URL.fullmatch(pipeline):
        out.append(("CI pipeline", pipeline))
    if _URL.fullmatch(job):
        out += [("CI job", job), ("artifacts", f"{job.rstrip('/')}/artifacts/browse")]
    return out


def _footer(summary: Mapping[str, Any], meta: CampaignFile, folder: str,
            env: Mapping[str, str]) -> str:
    when = started(meta) or "date unknown"
    ending = summary.get("campaign")
    if isinstance(ending, Mapping) and (ending.get("stopped_early")
                                        or ending.get("status") != "complete"):
        # Why it ended early, in the ending's own words (with what was not measured).
        setup = esc(short_setup(meta, with_hardware=False,
                                ending={**ending, "not_measured": []}))
        setup += f" &middot; {esc(ending.get('text'))}"
    elif isinstance(ending, Mapping):
        setup = esc(short_setup(meta, with_hardware=False, ending=ending))
    else:
        setup = esc(short_setup(meta, with_hardware=False))
    links = "".join(f" &middot; [{label}]({url})" for label, url in ci_links(env))
    return (f"<sub>Campaign started {esc(when)} on {esc(hardware(meta))} &middot; {setup} "
            f"&middot; run `{esc(meta.run_id)}` &middot; full report with plots: "
            f"`{esc(folder)}/report.html` in the results folder{links}</sub>")


# --------------------------------------------------------------------------- details


def _gate_rows(gates: Iterable[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for g in gates:
        outcome = str(g.get("outcome"))
        evidence = g.get("evidence")
        if evidence and evidence != "tested":
            outcome += f" ({evidence})"
        where = " ".join(x for x in (
            str(g.get("condition")),
            f"vs {g['reference']}" if g.get("reference") else "",
            f"at {g['load']}" if g.get("load") else "",
            f"on {g['slice']}" if g.get("slice") else "") if x)
        text = [line.strip() for line in str(g.get("summary") or "").splitlines()]
        # A first line that ends in a colon introduces the reason (the fairness gate's "differ
        # beyond the drafter:" and what differs): the row keeps it whole.
        result = (text[0] + " " + "; ".join(line for line in text[1:] if line)
                  if text and text[0].endswith(":") else text[0] if text else "")
        rows.append((str(g.get("kind")), where, outcome.upper() if outcome in (
            "fail", "inconclusive") else outcome, result))
    return rows


def _count(gates: Sequence[Mapping[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for g in gates:
        counts[str(g.get("outcome"))] = counts.get(str(g.get("outcome")), 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def _gates(summary: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    gates = summary.get("gates", [])
    deciding = [g for g in gates if g.get("gating", True)]
    reported = [g for g in gates if not g.get("gating", True)]
    header = ("gate", "judged", "outcome", "result")
    out = []
    if deciding:
        out.append((f"<b>Gates that decide the verdict</b> ({len(deciding)}: "
                    f"{_count(deciding)})", _table(header, _gate_rows(deciding))))
    if reported:
        out.append((f"<b>Reported only</b> ({len(reported)}: {_count(reported)}) &mdash; never "
                    "decide the verdict or fail the run",
                    ["These gates (other load levels, the unusual slice) are shown for "
                     "information; in pytest a reported-only gate that passes shows PASSED, "
                     "any other outcome SKIPPED with its result.", "",
                     *_table(header, _gate_rows(reported))]))
    return out


def _section(sec: Section) -> tuple[str, list[str]]:
    """A section of :mod:`.sections` as a title and Markdown lines (its warnings are said
    under the verdicts already); `code` in a note stays a code span."""
    lines: list[str] = []
    for note in sec.notes:
        parts = note.split("`")
        lines += ["".join(f"`{p}`" if i % 2 else esc(p) for i, p in enumerate(parts)), ""]
    for t in sec.tables:
        if t.caption:
            lines += [f"**{esc(t.caption)}**", ""]
        header, rows = t.narrow()
        lines += [*_table(header, [[f"**{c.text}**" if c.over else c.text for c in row]
                                   for row in rows]), ""]
    return sec.title, lines[:-1] if lines and not lines[-1] else lines


def _cost(summary: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    cost = summary.get("cost")
    return _section(cost_section(CostSection.model_validate(cost))) if cost else None


def exact_section(summary: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    tables = exact_tables(summary)
    if not tables:
        return None
    lines = ["Sampled tokens scored by the target, per position class: score z (0 expected), "
             "PIT p, draws of the target's top-1 against expectation, draws outside the served "
             "support, and the fitted effective temperature.", ""]
    for caption, rows in tables:
        lines += [f"**{esc(caption)}**", "", *_table(HEADER, rows), ""]
    return "Sampled distribution (exact test)", lines


def _setup(summary: Mapping[str, Any]) -> tuple[str, list[str]]:
    return "Set-up", _table(("set-up", "value"), [(r.get("what"), r.get("value"))
                                       for r in summary.get("setup", [])])


def _stability(summary: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    st = summary.get("stability")
    return _section(stability_section(Stability.model_validate(st))) if st else None


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _all_figures(summary: Mapping[str, Any], meta: CampaignFile) -> list[tuple[str, list[str]]]:
    """Latency, then throughput and memory: two tables of at most seven short columns, each
    row naming its load level."""
    figs = _figures(summary)
    cols = _columns(summary, meta)
    baseline = meta.baseline

    def pair(a: float | None, b: float | None) -> str:
        return f"{_ms(a)}/{_ms(b)}"

    def accept(f: Figures) -> str:
        if f.condition == baseline:
            return "n/a"
        if f.accept_length_pooled is None:
            return "-"
        mean = f"{f.accept_length_mean:.2f}" if f.accept_length_mean is not None else "-"
        return f"{f.accept_length_pooled:.2f}/{mean}"

    latency = [(f.condition, f"{f.load} ({f.load_label})", f"{f.ok}/{f.total}",
                pair(f.ttft_p50_s, f.ttft_p95_s), pair(f.e2e_p50_s, f.e2e_p95_s),
                pair(f.tpot_p50_s, f.tpot_p95_s)) for f in figs]
    throughput = [(f.condition, f"{f.load} ({f.load_label})", _num(f.tokens_per_s, "{:.1f}"),
                   _num(f.requests_per_s), accept(f), _num(f.peak_memory_mb, "{:.0f}"),
                   in_flight_text(f)) for f in figs]
    return [
        ("Latency per condition and load", _table(
            ("condition", "load", "ok/total", "TTFT p50/p95 ms", "completion p50/p95 ms",
             "TPOT p50/p95 ms"), latency)),
        ("Throughput and memory per condition and load", [
            *_table(("condition", "load", "tok/s", "req/s", "accept len", cols.memory,
                     "in flight"), throughput),
            "", f"tok/s, req/s: all completed requests over busy wall time; accept len: "
            f"pooled/mean tokens per verify step (n/a: speculation off); {esc(cols.memory)}: "
            f"{esc(cols.memory_note)}; in flight: requests at the engine, averaged"]),
    ]


def domain_section(summary: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    rows = summary.get("domains") or []
    if not rows:
        return None

    def ci(r: Mapping[str, Any]) -> str:
        return speedup_text((r.get("speedup"), r.get("ci_low"), r.get("ci_high")))

    accept = [r.get("accept_length") for r in rows]
    loads = ", ".join(dict.fromkeys(str(r.get("load")) for r in rows))
    lines = _table(
        ("candidate", "domain", "slice", "prompts", "speedup [95% CI]", "accept len"),
        [(r.get("candidate"), r.get("domain"), r.get("slice"), _prompts(r), ci(r),
          f"{a:.2f}" if isinstance(a, float) else "-") for r, a in zip(rows, accept,
                                                                        strict=True)])
    if any(r.get("held_out_overlap") for r in rows):
        lines += ["", "*: prompts that appear in the candidate's adaptation data (the held-out "
                  "check): its speed and accept length there may be inflated."]
    return f"Speed and accept length per domain at {esc(loads)}", lines


def _prompts(r: Mapping[str, Any]) -> str:
    """The domain's prompt count, with how many are in the adaptation data (``3*``)."""
    seen = r.get("held_out_overlap") or []
    return f"{r.get('prompts')} ({len(seen)} in adaptation data*: {', '.join(map(str, seen))})" \
        if seen else str(r.get("prompts"))


def _goodput(summary: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    gp = summary.get("goodput")
    return _section(goodput_section(GoodputSection.model_validate(gp))) if gp else None


def _comparison(summary: Mapping[str, Any]) -> list[str]:
    """Kept in the head, not collapsed: a regression is news."""
    comp = summary.get("comparison")
    if not comp:
        return []
    lines = [f"**Compared with an earlier campaign** `{esc(comp.get('previous_dir'))}` (run "
             f"`{esc(comp.get('previous_run_id'))}`), tolerance "
             f"{float(comp.get('tolerance') or 0):.0%}:"]
    lines += [f"- {'**REGRESSION** ' if f.get('regression') else ''}{esc(f.get('text'))}"
              for f in comp.get("findings", [])]
    lines += [f"- {esc(n)}" for n in comp.get("notes", [])]
    return [*lines, ""]


# --------------------------------------------------------------------------- the page


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _fit(title: str, lines: list[str], room: int) -> str | None:
    """The section, its table rows cut to fit ``room`` bytes; None if not even its start
    fits."""
    whole = _details(title, lines)
    if _size(whole) <= room:
        return whole
    for keep in range(len(lines) - 1, 2, -1):
        cut = _details(title + " (cut)", [*lines[:keep], "", "*... cut to fit the size cap: "
                                          "the rest is in report.html and summary.json*"])
        if _size(cut) <= room:
            return cut
    return None


def _shards(summary: Mapping[str, Any]) -> list[str]:
    line = shards_line(summary)
    return [f"_{esc(line)}._", ""] if line else []


def markdown(summary: Mapping[str, Any], meta: CampaignFile, title: str, folder: str,
             max_kib: int = 64, env: Mapping[str, str] | None = None) -> str:
    """report.md for ``summary`` (summary.json's content), at most ``max_kib`` KiB; ``env``
    (default: this process's) names the CI run it links to."""
    limit = min(max_kib * 1024, GITHUB_LIMIT) - RESERVE
    head = [f"## {esc(title)}", ""]
    partial = summary.get("partial")
    if partial:  # said first: what follows is no verdict
        head += [f"> **INTERRUPTED** &mdash; {esc(partial)}. Judged as measured: no verdict.",
                 ""]
    rejudged = summary.get("rejudged")
    if isinstance(rejudged, Mapping):
        head += [f"_Re-judged copy ({esc(rejudged.get('at'))}, limits from "
                 f"{esc(rejudged.get('pilot'))}); the original reports are untouched._", ""]
    head += [*_shards(summary), *_verdicts(summary), *_comparison(summary)]
    warnings = (summary.get("stability") or {}).get("warnings") or []
    if warnings:
        head += ["> [!WARNING]", *[f"> {esc(w)}" for w in warnings], ""]
    footer = _footer(summary, meta, folder, os.environ if env is None else env)
    head += [*key_table(summary, meta), "", footer, "", ""]
    text = "\n".join(head)
    if _size(text) > limit:  # a head that alone is too large: cut at a line
        raw = text.encode("utf-8")[:limit]
        text = raw[: raw.rfind(b"\n") + 1].decode("utf-8", "ignore")
        return text + "\n*report.md cut at its size cap: the rest is in report.html.*\n"
    sections = [*_gates(summary), exact_section(summary), _cost(summary), _setup(summary),
                _stability(summary),
                *_all_figures(summary, meta), domain_section(summary), _goodput(summary)]
    left_out = []
    for sec in sections:
        if sec is None:
            continue
        block = _fit(sec[0], sec[1], limit - _size(text))
        if block is None:
            left_out.append(sec[0].replace("<b>", "").replace("</b>", "").split(" (")[0])
        else:
            text += block + "\n"
    if left_out:
        text += (f"*Left out to stay under {max_kib} KiB: {esc(', '.join(left_out))}; see "
                 "report.html and summary.json.*\n")
    return text
