"""report.html: one self-contained page (inline CSS, plots as PNG data URIs, no external URL).

Every string that comes from records, config or the summary goes through :func:`esc`
(``html.escape``): model outputs are untrusted text. The page's parts, top to bottom: the
banner (partial, re-judged), header, verdicts with the deciding speedup and the unchecked
checks, the key figures (all of this on the first screen), the set-up (collapsed),
stability, gates, figures per load level, analyses, cost, history, plots, outputs, failed
requests.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..judgement import CostSection, GateKind, GoodputSection, Stability
from ..judgement.figures import Figures
from ..judgement.figures.measured import P99_MIN_REQUESTS
from ..judgement.quality.param_verdicts import is_refusal
from ..results.files import write_text_atomic
from ..results.folder import SavedCampaign
from ..results.records import RequestRecord
from .exact_table import HEADER, exact_tables
from .sections import (
    Section,
    cost_section,
    evidence_words,
    goodput_section,
    stability_section,
)
from .setup import level_order, memory_basis, shards_line
from .terminal import (
    SERVING_HEADER,
    Columns,
    figure_speedups,
    header,
    legend,
    serving_cells,
    table_rows,
    worse_than_baseline,
)

MAX_DIVERGENT = 20  # divergent prompts shown per condition pair
SAMPLES_WHEN_IDENTICAL = 3
_NEWLINES = re.compile(r"(\n+)")
# Nothing may load from anywhere: inline style and data: images only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
MAX_ERRORS = 5

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;
 margin:0;background:#f6f8fa}
main{max-width:1280px;margin:0 auto;padding:24px 28px 60px;background:#fff;
 box-sizing:border-box}
h1{font-size:22px;margin:0 0 4px}h2{font-size:20px;margin:34px 0 10px;
 border-bottom:1px solid #d0d7de;padding-bottom:4px}h3{font-size:16px;margin:20px 0 8px}
.meta{color:#59636e;font-size:13px}.meta code{font-size:12px}
nav a{margin-right:14px;color:#0969da;text-decoration:none}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px;max-width:100%}
table.gates{table-layout:fixed;width:100%}table.gates td{overflow-wrap:anywhere}
table.gates col.kind{width:118px}table.gates col.judged{width:140px}
table.gates col.outcome{width:112px}table.gates col.num{width:128px}
table.gates td.num{white-space:normal}
.scroll{overflow-x:auto;max-width:100%}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f3f6}tr:nth-child(even) td{background:#fafbfc}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.summary{white-space:pre-wrap;overflow-wrap:anywhere;
 font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
.verdict{border-radius:8px;padding:8px 14px;margin:8px 0;border:2px solid}
.verdict .label{font-weight:700;font-size:20px;margin-right:10px}
.verdict ul{margin:6px 0 0;padding-left:20px}.verdict .head{font-size:15px}
.verdict .diag{font-style:italic}.warning{background:#fff8c5;border:1px solid #d4a72c;
 border-radius:6px;padding:8px 12px;margin:8px 0;color:#4d2d00}
.reported{border-left:4px solid #8c959f;padding-left:10px}
.KEEP{background:#dafbe1;border-color:#1a7f37;color:#0f5323}
.DROP{background:#ffebe9;border-color:#cf222e;color:#82071e}
.INCONCLUSIVE{background:#fff8c5;border-color:#bf8700;color:#6c4400}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-weight:600;font-size:12px;
 white-space:nowrap}
.pass{background:#dafbe1;color:#1a7f37}.fail{background:#ffebe9;color:#cf222e}
.inconclusive{background:#fff8c5;color:#9a6700}.skip{background:#eaeef2;color:#59636e}
.over{color:#cf222e;font-weight:600}.note{color:#59636e;font-size:13px}
figure{margin:14px 0 22px}figure img{max-width:100%;border:1px solid #d0d7de}
figcaption{color:#59636e;font-size:13px}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:10px;margin:4px 0 14px}
.pair pre{white-space:pre-wrap;word-break:break-word;background:#f6f8fa;border:1px solid #d0d7de;
 padding:8px;margin:0;max-height:260px;overflow:auto;font-size:12px}
.pair .who{font-weight:600;font-size:12px;color:#59636e}
mark{background:#ffd8b5}.ws{color:#8c959f;font-size:11px}
.deciding{font-size:15px;margin:4px 0 0}#verdicts{margin-top:12px}
h2.first{font-size:17px;margin:14px 0 4px}.unchecked{font-weight:600}
table.levels{font-size:12px}table.levels th,table.levels td{padding:3px 5px}
table.levels td.num{white-space:normal}
table.key{font-size:12.5px}table.key th,table.key td{white-space:nowrap;padding:3px 6px}
details.setup{margin:14px 0}details.setup>summary{cursor:pointer;font-size:16px;font-weight:600}
"""


# --------------------------------------------------------------------------- HTML primitives
# Every string is escaped; cells and bodies handed in are already HTML.


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def num(value: object, fmt: str = "{:.4g}") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return esc(value)
    return esc(fmt.format(value))


def table(columns: Sequence[str], rows: Iterable[Sequence[str]], numeric: Iterable[int] = (),
          classes: dict[int, str] | None = None, css: str | None = None) -> str:
    """Cells in ``rows`` are already HTML; ``columns`` are plain text. ``numeric`` columns
    are right-aligned; ``classes`` gives other columns a CSS class; ``css`` the table one."""
    cls = {i: "num" for i in numeric} | (classes or {})
    head = "".join(f"<th>{esc(h)}</th>" for h in columns)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="{cls[i]}">{c}</td>' if i in cls else f"<td>{c}</td>"
            for i, c in enumerate(row)
        ) + "</tr>"
        for row in rows
    )
    opening = f'<table class="{css}">' if css else "<table>"
    return f"{opening}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def badge(outcome: object, evidence: object = "tested") -> str:
    cls = outcome if outcome in ("pass", "fail", "inconclusive", "skip") else "skip"
    # A pass that could not have failed must not look like one that could: no green badge.
    if cls == "pass" and evidence not in (None, "tested"):
        cls = "inconclusive"
    return f'<span class="badge {cls}">{esc(outcome)}</span>'


def figure(key: str, title: str, png: bytes, caption: str) -> str:
    """A plot with its caption in words; ``key`` (all_plots' name) stays in the image's alt."""
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return (f'<figure><img src="{uri}" alt="{esc(key)}">'
            f"<figcaption><b>{esc(title)}.</b> {esc(caption)}</figcaption></figure>")


# --------------------------------------------------------------------------- plots


PLOT_CAPTIONS = {
    "latency_cdf": "Completion latency CDF per condition, one panel per load level.",
    "ttft_throughput": "Time to first token (ms) and per-request output tokens/s per "
    "condition, one column per load level, each on its own axis (queueing at a high load "
    "would flatten a low load's boxes); boxes: quartiles, whiskers: 1.5 IQR.",
    "accept_length": "Distribution of per-request accept length for drafter conditions, on "
    "its whole range: 1 (no drafted token accepted) to the drafted tokens per step + 1.",
    "speedup": "Per-prompt speedup (reference / candidate completion latency, geometric mean "
    "over repetitions); bars are 95% bootstrap intervals over repetitions (paired by block) "
    "where a prompt has >= 2 on both sides. Solid line: no change; dashed: the KEEP threshold; "
    "dotted: geometric mean over prompts; green band: the speed gate's overall 95% CI.",
    "timeline": "Every greedy request's completion latency against the time it ran, per "
    "condition and load level; alternate passes shaded; dashed: the host's load average. "
    "A condition whose latency moves between passes with the same prompts shows a machine "
    "changing speed.",
    "load_speedups": "Each candidate's completion-latency speedup at every load level, with "
    "the speed gates' 95% CIs (x: total-time speedup where judged).",
    "crossover": "Each candidate's speedup over the baseline against concurrency (log scale) "
    "at every closed-loop level, with the speed gates' 95% CIs; dashed: the KEEP threshold; "
    "dotted: the monotone fit; diamond and band: the concurrency up to which speculation pays "
    "and its 95% interval (an arrow: open beyond the tested range).",
    "domains": "Speedup over the baseline per domain of the trace (95% bootstrap CI over "
    "that domain's prompts: descriptive, not a gate) and the candidate's pooled accept "
    "length there, at the primary load.",
    "distribution": "The sampled-distribution check as a picture: per output position, how "
    "often two samples of a prompt share a token (a sharper sampler, e.g. a lower temperature "
    "or top-p, raises it), and the distribution of output lengths.",
    "acceptance_positions": "Share of verify steps in which the draft token at each position "
    "was accepted (later positions are accepted only after the earlier ones).",
    "goodput": "Share of requests meeting every goodput target, per condition and load.",
}


PLOT_TITLES = {
    "latency_cdf": "Completion latency", "ttft_throughput": "Time to first token and "
    "throughput", "accept_length": "Accept length per request", "timeline": "The campaign "
    "as it ran", "load_speedups": "Speedup across load levels", "crossover": "Up to which "
    "concurrency speculation pays", "domains": "Speed per domain", "acceptance_positions":
    "Acceptance per draft position", "goodput": "Goodput per condition and load level",
}


def _caption(key: str) -> str:
    """A plot's caption; a per-pair plot (``speedup_cand_vs_baseline``) shares its kind's."""
    return PLOT_CAPTIONS.get(key) or PLOT_CAPTIONS.get(key.split("_", 1)[0], "")


def _title(key: str, data: SavedCampaign) -> str:
    """A plot's title in words; the per-pair plots name their conditions (all_plots' keys)."""
    meta = data.meta
    for cand in meta.candidates:
        for ref in (meta.baseline, meta.current):
            if ref and key == f"speedup_{cand}_vs_{ref}":
                return f"Per-prompt speedup, {cand} vs {ref}"
    for cond in meta.conditions:
        if key == f"distribution_{cond}":
            return f"Sampled outputs, {cond} vs {meta.baseline}"
    return PLOT_TITLES.get(key) or key.replace("_", " ").capitalize()


Titled = dict[str, tuple[str, bytes]]  # plot key -> (its title in words, PNG)


def _take(plots: Titled, key: str) -> str:
    """The plot ``key`` as a figure, taken out of ``plots`` (the rest show under Plots)."""
    entry = plots.pop(key, None)
    if entry is None:
        return ""
    return figure(key, entry[0], entry[1], _caption(key))


# --------------------------------------------------------------------------- sections


def _header(summary: dict[str, Any], data: SavedCampaign, title: str) -> str:
    meta = data.meta
    run = summary.get("run_id") or meta.run_id
    trace = str(summary.get("trace_hash") or meta.trace_hash or "")[:12]
    config = str(summary.get("config_hash") or meta.config_hash or "")[:12]
    status = summary.get("status") or meta.status
    nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in (
        ("verdicts", "Verdicts"), ("key", "Key figures"), ("setup", "Set-up"),
        ("stability", "Stability"),
        ("gates", "Gates"), ("figures", "Figures"), ("analyses", "Analyses"), ("cost", "Cost"),
        ("plots", "Plots"), ("outputs", "Outputs")))
    return (
        f"<h1>{esc(title)}</h1>"
        f'<p class="meta">pilot <b>{esc(summary.get("pilot_name") or meta.pilot_name)}</b>'
        f" &middot; run <code>{esc(run)}</code> &middot; status <b>{esc(status)}</b> &middot; "
        f"trace <code>{esc(trace)}</code> &middot; config <code>{esc(config)}</code> &middot; "
        f"pytest-osprey {esc(meta.tool_version or '')}</p><nav>{nav}</nav>"
    )




def _where(g: dict[str, Any]) -> str:
    return " ".join(x for x in (
        esc(g.get("condition")), f"vs {esc(g['reference'])}" if g.get("reference") else "",
        f"at {esc(g['load'])}" if g.get("load") else "",
        f"on {esc(g['slice'])}" if g.get("slice") else "") if x)


def deciding_gate(summary: dict[str, Any], candidate: str, baseline: str | None,
                  levels: Sequence[str]) -> dict[str, Any] | None:
    """The speed gate that decides ``candidate``'s verdict: against the baseline on every
    prompt, gating (the primary load); where the pilot gates several levels, the last in the
    pilot's order (the heaviest, the default primary)."""
    speeds = [g for g in summary.get("gates", []) if g.get("kind") == GateKind.SPEEDUP
              and g.get("condition") == candidate and g.get("reference") == baseline
              and not g.get("slice")]
    gating = [g for g in speeds if g.get("gating", True)] or speeds
    order = {lv: k for k, lv in enumerate(levels)}
    return max(gating, key=lambda g: order.get(g.get("load"), -1), default=None)


def _deciding(g: dict[str, Any] | None, labels: dict[str, str]) -> str:
    if g is None or g.get("estimate") is None:
        return '<p class="deciding">Deciding speedup: <b>not judged</b></p>'
    unit = GATE_UNITS[GateKind.SPEEDUP]
    ci = g.get("ci") or [None, None]
    text = _with_unit(g["estimate"], unit)
    if None not in ci:  # as the headline writes it: 0.84x [0.74, 0.95]
        text += f" [{num(ci[0], '{:.2f}')}, {num(ci[1], '{:.2f}')}]"
    load = str(g.get("load"))
    at = f"{esc(load)} ({esc(labels[load])})" if load in labels else esc(load)
    need = (f" vs <b>{_with_unit(g['threshold'], unit)}</b> needed"
            if g.get("threshold") is not None else "")
    return (f'<p class="deciding">Deciding speedup over {esc(g.get("reference"))} at {at}: '
            f'<b class="speedup">{text}</b> (95% CI){need} '
            f"{badge(g.get('outcome'), g.get('evidence'))}</p>")


def _checks(v: dict[str, Any], gates: list[dict[str, Any]]) -> list[str]:
    """The quality checks that did not run, then the other gating gates that could not have
    said no: what the verdict does not rest on."""
    unchecked = v.get("unchecked") or []
    items = [f'<li><b class="unchecked">unchecked: {esc(u.get("check"))}</b>: '
             f'{esc(u.get("why"))}</li>' for u in unchecked]
    named = {u.get("kind") for u in unchecked}
    for g in gates:
        if (g.get("gating", True) and g.get("condition") == v.get("candidate")
                and g.get("evidence") not in (None, "tested") and g.get("outcome") != "fail"
                and g.get("kind") not in named):
            words = evidence_words(str(g.get("evidence")))
            items.append(f'<li><b class="unchecked">{esc(words)}</b>: '
                         f'{esc(g.get("kind")).replace("_", " ")} {_where(g)} '
                         f'({esc(g.get("outcome"))})</li>')
    return items


def _verdicts(summary: dict[str, Any], data: SavedCampaign) -> str:
    """Per candidate: the verdict and its headline, the deciding speedup with its CI and
    threshold, and what was not checked; the reasons follow the key figures (_reasons)."""
    out = ['<section id="verdicts">']  # no heading: the first thing under the title
    levels = level_order(data)
    labels = dict(levels)
    gates = summary.get("gates", [])
    for v in summary.get("verdicts", []):
        verdict = v.get("verdict")
        cls = verdict if verdict in ("KEEP", "DROP", "INCONCLUSIVE") else "INCONCLUSIVE"
        line = str(v.get("headline") or "")
        prefix = f"{verdict} {v.get('candidate')}:"
        rest = line[len(prefix):].strip() if line.startswith(prefix) else line
        deciding = deciding_gate(summary, str(v.get("candidate")), data.meta.baseline,
                                 [lv for lv, _ in levels])
        checks = _checks(v, gates)
        out.append(f'<div class="verdict {cls}"><span class="label">{esc(verdict)}</span>'
                   f'<b>{esc(v.get("candidate"))}</b> <span class="head">{esc(rest)}</span>'
                   + _deciding(deciding, labels)
                   + (f'<ul class="checks">{"".join(checks)}</ul>' if checks else "")
                   + "</div>")
    if len(out) == 1:
        out.append('<p class="note">No candidate was judged.</p>')
    # On the first screen, under the verdicts they qualify (as report.md says them); the
    # stability section further down holds the figures behind them.
    for w in (summary.get("stability") or {}).get("warnings") or []:
        out.append(f'<div class="warning"><b>Warning:</b> {esc(w)} '
                   '(<a href="#stability">stability</a>)</div>')
    return "".join(out) + "</section>"


def _reasons(summary: dict[str, Any]) -> str:
    """Each verdict's reasons as named bullets with their diagnoses, and its notes."""
    out = []
    for v in summary.get("verdicts", []):
        items = []
        for b in v.get("bullets") or []:
            word = "" if b.get("outcome") == "fail" else f" ({esc(b.get('outcome'))})"
            diag = (f'<br><span class="diag">diagnosis: {esc(b["diagnosis"])}</span>'
                    if b.get("diagnosis") else "")
            items.append(f"<li><b>{esc(b.get('name'))}</b>{word}: {esc(b.get('text'))}{diag}"
                         "</li>")
        if not items:
            items = [f"<li>{esc(r)}</li>" for r in v.get("reasons") or []]
        items += [f'<li class="diag">note: {esc(n)}</li>' for n in v.get("notes") or []]
        if not items and v.get("verdict") == "KEEP":
            items = ["<li>every gating gate passed</li>"]
        if v.get("next_step"):
            items.append(f'<li class="next"><b>next:</b> {esc(v["next_step"])}</li>')
        cls = v.get("verdict") if v.get("verdict") in ("KEEP", "DROP") else "INCONCLUSIVE"
        out.append(f'<div class="verdict {cls} why"><b>{esc(v.get("verdict"))} '
                   f'{esc(v.get("candidate"))}</b><ul>{"".join(items)}</ul></div>')
    return ('<h2 id="reasons">Why</h2>' + "".join(out)) if out else ""


def _key_figures(summary: dict[str, Any], data: SavedCampaign) -> str:
    """Every condition and load level in one table: the figures a reviewer compares."""
    figs = _all_figures(summary, data)
    label, note, _ = memory_basis(data.meta)
    cols = Columns(memory=label, memory_note=note, baseline=data.meta.baseline,
                   speedups=figure_speedups(figs))
    head = header(cols)
    rows = [[esc(c) for c in row] for row in table_rows(figs, cols, deltas=True)]
    body = (table(head, rows, set(range(2, len(head)))) if rows
            else '<p class="note">No figures.</p>')
    return ('<h2 id="key" class="first">Key figures</h2><div class="scroll">'
            + body.replace("<table>", '<table class="key">', 1) + "</div>"
            + f'<p class="note">{esc(legend(cols))}.</p>')


def _setup(summary: dict[str, Any], data: SavedCampaign) -> str:
    """The set-up and the conditions as booted, collapsed: read when a figure surprises."""
    rows = [(esc(r.get("what")), esc(r.get("value"))) for r in summary.get("setup") or []]
    body = (table(("set-up", "value"), rows) if rows
            else '<p class="note">Set-up not recorded.</p>')
    conds = summary.get("conditions") or {
        n: c.model_dump() for n, c in data.meta.conditions.items()}
    body += table(("condition", "role", "boot s", memory_basis(data.meta)[0], "error"), [
        (esc(name), esc(info.get("role")), num(info.get("boot_s"), "{:.1f}"),
         num(info.get("peak_memory_mb"), "{:.0f}"), esc(info.get("error") or "-"))
        for name, info in conds.items()], {2, 3})
    return (f'<details class="setup" id="setup"><summary>Set-up: engine, hardware, replay and '
            f"the {len(conds)} conditions as booted</summary>{body}</details>")


def section(sec: Section, heading: str = "h2", warnings: bool = True) -> str:
    """A section of :mod:`.sections` as HTML: its warnings, notes (`code` as code) and
    tables, a value over its limit flagged."""
    anchor = f' id="{sec.key}"' if heading == "h2" else ""
    out = [f"<{heading}{anchor}>{esc(sec.title)}</{heading}>"]
    if warnings:
        out += [f'<div class="warning"><b>Warning:</b> {esc(w)}</div>' for w in sec.warnings]
    for note in sec.notes:
        parts = note.split("`")
        out.append('<p class="note">' + "".join(
            f"<code>{esc(p)}</code>" if i % 2 else esc(p) for i, p in enumerate(parts))
            + "</p>")
    for t in sec.tables:
        if t.caption:
            out.append(f"<h3>{esc(t.caption)}</h3>")
        out.append(table(t.header, [tuple(f'<span class="over">{esc(c.text)}</span>' if c.over
                                          else esc(c.text) for c in row) for row in t.rows],
                         t.numeric))
    return "".join(out)


def _stability(summary: dict[str, Any], plots: Titled) -> str:
    st = summary.get("stability")
    head = (section(stability_section(Stability.model_validate(st)), warnings=False) if st
            else '<h2 id="stability">Environment stability</h2>')
    return head + _take(plots, "timeline")


def _prompts(r: dict[str, Any]) -> str:
    """The domain's prompt count; those in the candidate's adaptation data named."""
    seen = r.get("held_out_overlap") or []
    if not seen:
        return num(r.get("prompts"))
    return (f'{num(r.get("prompts"))} <span class="over" title="in the adaptation data: its '
            f'speed and accept length there may be inflated">({len(seen)} in adaptation data: '
            f'{esc(", ".join(map(str, seen)))})</span>')


def domain_section(summary: dict[str, Any], plots: Titled) -> str:
    rows = summary.get("domains") or []
    if not rows:
        return ""

    def ci(r: dict[str, Any]) -> str:
        if r.get("ci_low") is None or r.get("ci_high") is None:
            return "-"
        return f"[{num(r['ci_low'], '{:.2f}')}, {num(r['ci_high'], '{:.2f}')}]"

    body = table(("candidate", "domain", "slice", "prompts", "speedup", "95% CI", "accept len"),
                 [(esc(r.get("candidate")), esc(r.get("domain")), esc(r.get("slice")),
                   _prompts(r), num(r.get("speedup"), "{:.2f}x"), ci(r),
                   num(r.get("accept_length"), "{:.2f}")) for r in rows], {3, 4, 5, 6})
    load = rows[0].get("load")
    return (f"<h3>Per domain (load {esc(load)})</h3>" + body + _take(plots, "domains"))


def _goodput(summary: dict[str, Any], plots: Titled) -> str:
    gp = summary.get("goodput")
    if not gp:
        return ""
    return section(goodput_section(GoodputSection.model_validate(gp)), "h3") \
        + _take(plots, "goodput")


def _analyses(summary: dict[str, Any], plots: Titled) -> str:
    out = ['<h2 id="analyses">Analyses</h2>', "<h3>Speed across load levels</h3>",
           _take(plots, "load_speedups"), _take(plots, "crossover"), domain_section(summary, plots),
           _goodput(summary, plots)]
    shares = summary.get("acceptance_by_position") or {}
    if shares:
        out.append("<h3>Acceptance per draft position</h3>")
        out.append(table(("condition", *[f"pos {k + 1}" for k in range(max(map(len,
                         shares.values())))]),
                         [(esc(c), *[num(v, "{:.0%}") for v in vs]) for c, vs in
                          shares.items()], range(1, 1 + max(map(len, shares.values())))))
        out.append(_take(plots, "acceptance_positions"))
    else:
        out.append('<h3>Acceptance per draft position</h3><p class="note">Not recorded: the '
                   "engine reported no per-position counts for this campaign.</p>")
    dist = [k for k in plots if k.startswith("distribution_")]
    if dist:
        out.append("<h3>Sampled-distribution check</h3>")
        out += [_take(plots, k) for k in dist]
    return "".join(out)


# How each gate kind's estimate, CI and threshold read (docs/summary-json.md, Gate kinds):
# the factor from the stored unit and the format with the unit shown.
GATE_UNITS: dict[str, tuple[float, str]] = {
    GateKind.SPEEDUP: (1.0, "{:.2f}x"),
    GateKind.LATENCY: (1000.0, "{:.1f} ms"),
    GateKind.MEMORY: (1.0, "{:.0f} MiB"),
    GateKind.COMPLETED: (100.0, "{:.1f}%"),
    GateKind.GOODPUT: (100.0, "{:+.1f} pp"),  # a difference of shares, percentage points
    GateKind.BREAK_EVEN: (1.0, "{:,.1f} days"),
    GateKind.GREEDY_IDENTITY: (1.0, "{:g} divergent"),
    GateKind.BOOT_CONSISTENCY: (1.0, "{:g} divergent"),
    GateKind.CORRECTNESS: (1.0, "{:g} lost"),
    GateKind.SAMPLING_PARAMS: (1.0, "{:g} broken"),
    GateKind.DISTRIBUTION: (1.0, "MMD\u00b2 {:.3g}"),
}
THRESHOLD_IS_ALPHA = {GateKind.DISTRIBUTION}  # the threshold is the p-value's level


def _with_unit(value: object, unit: tuple[float, str]) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return num(value)
    if not math.isfinite(value):
        return "unbounded" if value > 0 else esc(f"{value:g}")
    return esc(unit[1].format(value * unit[0]))


def _gate_figures(g: dict[str, Any], currency: str = "") -> str:
    """Estimate [CI] vs threshold (and p), each with the gate kind's unit, stacked in one
    narrow cell."""
    kind = str(g.get("kind"))
    unit = GATE_UNITS.get(kind) or ((1.0, "{:.3g} " + currency) if kind == GateKind.COST
                                    else (1.0, "{:.4g}"))
    if (g.get("details") or {}).get("method") == "exact":  # an effective temperature
        unit = (1.0, "T\u0302 {:.2f}")
    parts = []
    if g.get("estimate") is not None:
        parts.append(_with_unit(g.get("estimate"), unit))
    ci = g.get("ci")
    if isinstance(ci, list) and len(ci) == 2:
        parts.append(f"[{_with_unit(ci[0], unit)}, {_with_unit(ci[1], unit)}]")
    alpha = kind in THRESHOLD_IS_ALPHA
    if g.get("threshold") is not None and not alpha:
        parts.append(f"vs {_with_unit(g.get('threshold'), unit)}")
    if g.get("p_value") is not None:
        level = f" vs &alpha; {num(g.get('threshold'), '{:g}')}" if alpha else ""
        parts.append(f'<span class="note">p {num(g.get("p_value"), "{:.3g}")}{level}</span>')
    return "<br>".join(parts) or "-"


def _gate_table(gates: list[dict[str, Any]], currency: str) -> str:
    rows = []
    for g in gates:
        where = _where(g)
        evidence = g.get("evidence")
        outcome = badge(g.get("outcome"), evidence) + (
            f'<br><span class="note">{esc(evidence)}</span>'
            if evidence and evidence != "tested" else "")
        kind = (f'<span title="test_{esc(g.get("kind"))}[{esc(g.get("id"))}]">'
                + esc(g.get("kind")).replace("_", "_<wbr>") + "</span>")  # wraps at "_"
        rows.append((kind, where, outcome, _gate_figures(g, currency), esc(g.get("summary"))))
    cols = ('<colgroup><col class="kind"><col class="judged"><col class="outcome">'
            '<col class="num"><col></colgroup>')
    body = table(("gate", "judged", "outcome", "estimate [CI] vs threshold", "result"),
                 rows, {3}, {4: "summary"})
    return body.replace("<table>", f'<table class="gates">{cols}', 1)


def _gates(summary: dict[str, Any]) -> str:
    gates = summary.get("gates", [])
    if not gates:
        return '<h2 id="gates">Gates</h2><p class="note">No gate results.</p>'
    currency = str((summary.get("cost") or {}).get("currency") or "")
    deciding = [g for g in gates if g.get("gating", True)]
    reported = [g for g in gates if not g.get("gating", True)]
    out = ['<h2 id="gates">Gates</h2>',
           f"<h3>Gates that decide the verdict ({len(deciding)})</h3>",
           _gate_table(deciding, currency)]
    if reported:
        out += [f'<div class="reported"><h3>Reported only ({len(reported)}): never decide the '
                "verdict or fail the run</h3>"
                '<p class="note">Other load levels and the unusual slice, shown for '
                "information. In pytest a reported-only gate that passes shows PASSED; any "
                "other outcome shows SKIPPED with its result.</p>",
                _gate_table(reported, currency), "</div>"]
    return "".join(out)


def _exact(summary: dict[str, Any]) -> str:
    tables = exact_tables(summary)
    if not tables:
        return ""
    out = ['<h3 id="exact">Sampled distribution (exact test)</h3>',
           '<p class="note">Sampled tokens scored by the target, per position class: score z '
           "(0 expected), PIT p, draws of the target's top-1 against expectation, draws "
           "outside the served support, and the fitted effective temperature.</p>"]
    for caption, rows in tables:
        out += [f"<p><b>{esc(caption)}</b></p>",
                table(HEADER, [tuple(esc(c) for c in r) for r in rows], {1, 2, 3, 4, 5})]
    return "".join(out)


def _all_figures(summary: dict[str, Any], data: SavedCampaign) -> list[Figures]:
    return [Figures.model_validate(d) for d in summary.get("figures") or []]


def _figures(summary: dict[str, Any], data: SavedCampaign) -> str:
    figs = _all_figures(summary, data)
    label, note, _ = memory_basis(data.meta)
    cols = Columns(memory=label, memory_note=note, baseline=data.meta.baseline,
                   speedups=figure_speedups(figs))
    out = ['<h2 id="figures">Figures per condition and load level</h2>',
           f'<p class="note">{esc(legend(cols))}.</p>']
    levels = list(dict.fromkeys(f.load for f in figs))
    full = header(cols, full=True)
    head = [h for i, h in enumerate(full) if i != 1] + list(SERVING_HEADER)
    rises = worse_than_baseline(figs, cols.baseline)
    for level in levels:
        mine = [f for f in figs if f.load == level]
        rows = [[esc(c) for i, c in enumerate(row) if i != 1]
                + [esc(c) for c in serving_cells(f, rises.get((f.condition, f.load)))]
                for f, row in zip(mine, table_rows(mine, cols, full=True, deltas=True),
                                  strict=True)]
        # A p99 column only where one was measured: the legend says what it needs.
        shown = head if any(r[-1] != "-" for r in rows) else head[:-1]
        rows = [r[:len(shown)] for r in rows]
        out.append(f"<h3>Load {esc(level)} ({esc(mine[0].load_label)})</h3>")
        levels_table = table(shown, rows, set(range(1, len(shown))), css="levels")
        out.append(f'<div class="scroll">{levels_table}</div>')
        if shown is not head:
            fewest = min(f.ok for f in mine)
            out.append(f'<p class="note">p99 is shown from {P99_MIN_REQUESTS} completed '
                       f"requests a level; this one has {fewest}.</p>")
    if not figs:
        out.append('<p class="note">No figures.</p>')
    return "".join(out)


def _cost(summary: dict[str, Any]) -> str:
    cost = summary.get("cost")
    if not cost:
        return '<h2 id="cost">Cost and break-even</h2><p class="note">No cost section in the ' \
               "summary.</p>"
    return section(cost_section(CostSection.model_validate(cost)))


def _plots(plots: Titled) -> str:
    out = ['<h2 id="plots">Plots</h2>']
    for key, (title, png) in plots.items():
        out.append(figure(key, title, png, _caption(key)))
    if not plots:
        out.append('<p class="note">No plots.</p>')
    return "".join(out)


def _first_outputs(records: list[RequestRecord]) -> dict[str, RequestRecord]:
    """Per prompt: the earliest successful greedy output (lowest block, first load level)."""
    out: dict[str, RequestRecord] = {}
    for r in records:
        if r.ok and (r.prompt_id not in out or (r.boot, r.repetition)
                     < (out[r.prompt_id].boot, out[r.prompt_id].repetition)):
            out[r.prompt_id] = r
    return out


def _visible(text: str) -> str:
    """Escaped text with newlines shown (a tiny model's output can be all newlines): each
    newline gets a mark, runs of more than two collapse into one mark with a count."""
    out = []
    for part in _NEWLINES.split(text):
        if part.startswith("\n"):
            k = len(part)
            out.append('<span class="ws">\u21b5</span>\n' * k if k <= 2
                       else f'<span class="ws">\u21b5&times;{k}</span>\n')
        else:
            out.append(esc(part))
    return "".join(out)


def _diverging(ref: str, cand: str) -> tuple[str, str]:
    """Both texts as HTML, the part after their common prefix marked."""
    n = next((i for i, (a, b) in enumerate(zip(ref, cand, strict=False)) if a != b),
             min(len(ref), len(cand)))

    def mark(text: str) -> str:
        if not text:
            return '<span class="ws">(empty output)</span>'
        rest = text[n:]
        return _visible(text[:n]) + (f"<mark>{_visible(rest)}</mark>" if rest else "")

    return mark(ref), mark(cand)


def _outputs(data: SavedCampaign) -> str:
    out = ['<h2 id="outputs">Outputs (greedy)</h2>']
    baseline = data.meta.baseline
    others = [c for c in data.meta.conditions if c != baseline]
    levels: list[str | None] = [*data.meta.load_levels] or [None]
    if not baseline or not others:
        return out[0] + '<p class="note">No condition to compare with the baseline.</p>'
    # Timed at a sampled serving setting, the greedy outputs are the untimed greedy pass's.
    level = levels[0] if data.timed_mode == "greedy" else None
    ref = _first_outputs(data.of(baseline, level, "greedy"))
    for cond in others:
        cand = _first_outputs(data.of(cond, level, "greedy"))
        common = [p for p in ref if p in cand]
        divergent = [p for p in common if ref[p].output_ids != cand[p].output_ids
                     or (not ref[p].output_ids and ref[p].output_text != cand[p].output_text)]
        out.append(f"<h3>{esc(cond)} vs {esc(baseline)}: {len(divergent)} of {len(common)} "
                   f"prompts diverge (first repetition, load {esc(levels[0])})</h3>")
        shown = divergent[:MAX_DIVERGENT]
        if not divergent:
            # Outputs with visible text first: a sample of blank outputs shows little.
            shown = sorted(common, key=lambda p: not ref[p].output_text.strip())
            shown = shown[:SAMPLES_WHEN_IDENTICAL]
            out.append('<p class="note">All greedy outputs identical; a sample follows.</p>')
        elif len(divergent) > MAX_DIVERGENT:
            out.append(f'<p class="note">First {MAX_DIVERGENT} shown.</p>')
        for pid in shown:
            a, b = _diverging(ref[pid].output_text, cand[pid].output_text)
            out.append(
                f"<div><b>{esc(pid)}</b> <span class=\"note\">slice {esc(ref[pid].slice)}, "
                f"{esc(ref[pid].output_tokens)} vs {esc(cand[pid].output_tokens)} tokens</span>"
                f'<div class="pair"><div><div class="who">{esc(baseline)}</div><pre>{a}</pre>'
                f'</div><div><div class="who">{esc(cond)}</div><pre>{b}</pre></div></div></div>')
    return "".join(out)


def _errors(data: SavedCampaign) -> str:
    # A probe the engine declines ("unsupported", HTTP 400) is not a failed request: the
    # sampling_params gate names it (refused under speculation, or not tested).
    failed = [r for r in data.records if not r.ok
              and not (r.mode == "params" and is_refusal(r.error))]
    if not failed:
        return ""
    by_cond: dict[str, list[RequestRecord]] = {}
    for r in failed:
        by_cond.setdefault(r.condition, []).append(r)
    rows = []
    for cond, recs in by_cond.items():
        errors = list(dict.fromkeys((r.error or "(no message)")[:300] for r in recs))
        rows.append((esc(cond), esc(len(recs)),
                     "<br>".join(esc(e) for e in errors[:MAX_ERRORS])
                     + (" &hellip;" if len(errors) > MAX_ERRORS else "")))
    return '<h2 id="errors">Failed requests</h2>' + table(
        ("condition", "failed", "errors (distinct, first few)"), rows, {1})


def _history(summary: dict[str, Any]) -> str:
    comp = summary.get("comparison")
    if not comp:
        return ""
    out = ['<h2 id="history">Compared with an earlier campaign</h2>',
           f'<p class="note">{esc(comp.get("previous_dir"))} '
           f'(run {esc(comp.get("previous_run_id"))}), tolerance '
           f'{num(100 * float(comp.get("tolerance") or 0), "{:.0f}")}%.</p>']
    rows = [(esc(f.get("candidate")), esc(f.get("check")), esc(f.get("load") or "-"),
             '<span class="over">REGRESSION</span>' if f.get("regression") else "ok",
             esc(f.get("text"))) for f in comp.get("findings", [])]
    if rows:
        out.append(table(["drafter", "check", "load", "outcome", "finding"], rows, set()))
    out += [f'<p class="note">{esc(n)}</p>' for n in comp.get("notes", [])]
    return "".join(out)


def _banner(summary: dict[str, Any]) -> str:
    """First thing on the page: a partial campaign (no verdict) and a re-judged copy."""
    out = []
    if summary.get("partial"):
        out.append('<div class="verdict DROP"><span class="label">INTERRUPTED</span>'
                   f"{esc(summary['partial'])}. Judged as measured: no verdict.</div>")
    rejudged = summary.get("rejudged")
    if isinstance(rejudged, dict):
        out.append(f'<p class="note"><b>Re-judged copy</b> ({esc(rejudged.get("at"))}, limits '
                   f"from {esc(rejudged.get('pilot'))}); the original reports are untouched.</p>")
    shards = shards_line(summary)
    if shards:
        out.append(f'<p class="note">{esc(shards)}.</p>')
    return "".join(out)


# --------------------------------------------------------------------------- page


def render_html(summary: dict[str, Any], data: SavedCampaign, plots: dict[str, bytes],
                title: str | None = None) -> str:
    """The whole report page as one string (UTF-8, no external resources)."""
    title = title or summary.get("title") or f"Drafter pilot: {summary.get('pilot_name', '')}"
    titled = {key: (_title(key, data), png) for key, png in plots.items()}
    body = "".join((
        _banner(summary), _header(summary, data, str(title)), _verdicts(summary, data),
        _key_figures(summary, data), _reasons(summary), _setup(summary, data),
        _stability(summary, titled), _gates(summary), _exact(summary),
        _figures(summary, data), _analyses(summary, titled), _cost(summary), _history(summary),
        _plots(titled), _outputs(data), _errors(data),
    ))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )


def write_html(directory: Path, summary: dict[str, Any], data: SavedCampaign,
               plots: dict[str, bytes], title: str | None = None) -> Path:
    """Write ``directory/report.html`` atomically; returns its path."""
    path = directory / "report.html"
    write_text_atomic(path, render_html(summary, data, plots, title))
    return path
