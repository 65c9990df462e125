"""report.html: one self-contained page (inline CSS, plots as PNG data URIs, no external URL).

Every string that comes from records, config or the summary goes through :func:`_e`
(``html.escape``): model outputs are untrusted text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..judgement.figures import Figures, all_figures
from ..results.files import write_text_atomic
from ..results.folder import SavedCampaign
from ..results.records import RequestRecord
from .html_sections import PLOT_CAPTIONS, analyses, setup_section, stability_section
from .htmlkit import badge as _badge
from .htmlkit import esc as _e
from .htmlkit import figure as _figure
from .htmlkit import money as _money
from .htmlkit import num as _num
from .htmlkit import table as _table
from .setup import memory_basis
from .terminal import Columns, header, legend, speedup_cells, table_rows

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
h1{font-size:26px;margin:0 0 4px}h2{font-size:20px;margin:34px 0 10px;
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
.verdict{border-radius:8px;padding:12px 16px;margin:10px 0;border:2px solid}
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
"""



# --------------------------------------------------------------------------- sections


def _header(summary: dict[str, Any], data: SavedCampaign, title: str) -> str:
    meta = data.meta
    run = summary.get("run_id") or meta.run_id
    trace = str(summary.get("trace_hash") or meta.trace_hash or "")[:12]
    config = str(summary.get("config_hash") or meta.config_hash or "")[:12]
    status = summary.get("status") or meta.status
    conds = summary.get("conditions") or {
        n: c.model_dump() for n, c in meta.conditions.items()}
    rows = [
        (_e(name), _e(info.get("role")), _num(info.get("boot_s"), "{:.1f}"),
         _num(info.get("peak_memory_mb"), "{:.0f}"), _e(info.get("error") or "-"))
        for name, info in conds.items()
    ]
    nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in (
        ("verdicts", "Verdicts"), ("setup", "Set-up"), ("stability", "Stability"),
        ("gates", "Gates"), ("figures", "Figures"), ("analyses", "Analyses"), ("cost", "Cost"),
        ("plots", "Plots"), ("outputs", "Outputs")))
    return (
        f"<h1>{_e(title)}</h1>"
        f'<p class="meta">pilot <b>{_e(summary.get("pilot_name") or meta.pilot_name)}</b>'
        f" &middot; run <code>{_e(run)}</code> &middot; status <b>{_e(status)}</b> &middot; "
        f"trace <code>{_e(trace)}</code> &middot; config <code>{_e(config)}</code> &middot; "
        f"pytest-osprey {_e(meta.tool_version or '')}</p><nav>{nav}</nav>"
        + _table(("condition", "role", "boot s", memory_basis(meta)[0], "error"), rows, {2, 3})
    )


def _verdicts(summary: dict[str, Any]) -> str:
    out = ['<h2 id="verdicts">Verdicts</h2>']
    for v in summary.get("verdicts", []):
        verdict = v.get("verdict")
        cls = verdict if verdict in ("KEEP", "DROP", "INCONCLUSIVE") else "INCONCLUSIVE"
        line = str(v.get("headline") or "")
        prefix = f"{verdict} {v.get('candidate')}:"
        rest = line[len(prefix):].strip() if line.startswith(prefix) else line
        items = []
        for b in v.get("bullets") or []:
            word = "" if b.get("outcome") == "fail" else f" ({_e(b.get('outcome'))})"
            diag = (f'<br><span class="diag">diagnosis: {_e(b["diagnosis"])}</span>'
                    if b.get("diagnosis") else "")
            items.append(f"<li><b>{_e(b.get('name'))}</b>{word}: {_e(b.get('text'))}{diag}"
                         "</li>")
        if not items:
            items = [f"<li>{_e(r)}</li>" for r in v.get("reasons") or []]
        items += [f'<li class="diag">note: {_e(n)}</li>' for n in v.get("notes") or []]
        items += [f"<li>could not have failed: {_e(u)}</li>" for u in v.get("unproven") or []]
        if not items and verdict == "KEEP":
            items = ["<li>every gating gate passed</li>"]
        out.append(f'<div class="verdict {cls}"><span class="label">{_e(verdict)}</span>'
                   f'<b>{_e(v.get("candidate"))}</b> <span class="head">{_e(rest)}</span>'
                   f"<ul>{''.join(items)}</ul></div>")
    if len(out) == 1:
        out.append('<p class="note">No candidate was judged.</p>')
    return "".join(out)


def _gate_figures(g: dict[str, Any]) -> str:
    """Estimate [CI] vs threshold (and p), stacked in one narrow cell."""
    parts = []
    if g.get("estimate") is not None:
        parts.append(_num(g.get("estimate")))
    ci = g.get("ci")
    if isinstance(ci, list) and len(ci) == 2:
        parts.append(f"[{_num(ci[0])}, {_num(ci[1])}]")
    if g.get("threshold") is not None:
        parts.append(f"vs {_num(g.get('threshold'))}")
    if g.get("p_value") is not None:
        parts.append(f'<span class="note">p {_num(g.get("p_value"), "{:.3g}")}</span>')
    return "<br>".join(parts) or "-"


def _gate_table(gates: list[dict[str, Any]]) -> str:
    rows = []
    for g in gates:
        where = " ".join(x for x in (
            _e(g.get("condition")), f"vs {_e(g['reference'])}" if g.get("reference") else "",
            f"at {_e(g['load'])}" if g.get("load") else "",
            f"on {_e(g['slice'])}" if g.get("slice") else "") if x)
        evidence = g.get("evidence")
        badge = _badge(g.get("outcome"), evidence) + (
            f'<br><span class="note">{_e(evidence)}</span>'
            if evidence and evidence != "tested" else "")
        kind = (f'<span title="test_{_e(g.get("kind"))}[{_e(g.get("id"))}]">'
                + _e(g.get("kind")).replace("_", "_<wbr>") + "</span>")  # wraps at "_"
        rows.append((kind, where, badge, _gate_figures(g), _e(g.get("summary"))))
    cols = ('<colgroup><col class="kind"><col class="judged"><col class="outcome">'
            '<col class="num"><col></colgroup>')
    table = _table(("gate", "judged", "outcome", "estimate [CI] vs threshold", "result"),
                   rows, {3}, {4: "summary"})
    return table.replace("<table>", f'<table class="gates">{cols}', 1)


def _gates(summary: dict[str, Any]) -> str:
    gates = summary.get("gates", [])
    if not gates:
        return '<h2 id="gates">Gates</h2><p class="note">No gate results.</p>'
    deciding = [g for g in gates if g.get("gating", True)]
    reported = [g for g in gates if not g.get("gating", True)]
    out = ['<h2 id="gates">Gates</h2>',
           f"<h3>Gates that decide the verdict ({len(deciding)})</h3>", _gate_table(deciding)]
    if reported:
        out += [f'<div class="reported"><h3>Reported only ({len(reported)}): never decide the '
                "verdict or fail the run</h3>"
                '<p class="note">Other load levels and the unusual slice, shown for '
                "information. In pytest a reported-only gate that passes shows PASSED; any "
                "other outcome shows SKIPPED with its result.</p>",
                _gate_table(reported), "</div>"]
    return "".join(out)


def _figures(summary: dict[str, Any], data: SavedCampaign) -> str:
    raw = summary.get("figures")
    figs = ([Figures.model_validate(d) for d in raw] if raw is not None
            else all_figures(data))
    label, note, _ = memory_basis(data.meta)
    cols = Columns(memory=label, memory_note=note, baseline=data.meta.baseline,
                   speedups=speedup_cells(summary.get("gates", []), data.meta.baseline))
    out = ['<h2 id="figures">Figures per condition and load level</h2>',
           f'<p class="note">{_e(legend(cols))}.</p>']
    levels = list(dict.fromkeys(f.load for f in figs))
    full = header(cols, full=True)
    head = [h for i, h in enumerate(full) if i != 1]
    for level in levels:
        mine = [f for f in figs if f.load == level]
        rows = [[_e(c) for i, c in enumerate(row) if i != 1]
                for row in table_rows(mine, cols, full=True)]
        out.append(f"<h3>Load {_e(level)} ({_e(mine[0].load_label)})</h3>")
        out.append(_table(head, rows, set(range(1, len(head)))))
    if not figs:
        out.append('<p class="note">No figures.</p>')
    return "".join(out)


def _cost(summary: dict[str, Any]) -> str:
    out = ['<h2 id="cost">Cost and break-even</h2>']
    cost = summary.get("cost")
    if not cost:
        return out[0] + '<p class="note">No cost section in the summary.</p>'
    if not cost.get("device_hour_price"):
        return out[0] + ('<p class="note">Cost not configured: <code>cost.device_hour_price'
                         "</code> is 0, so no cost per request and no break-even are computed. "
                         "Set it (and <code>cost.setup</code> per drafter) to see them.</p>")
    cur = _e(cost.get("currency", ""))
    limits = cost.get("limits") or {}
    max_cost, max_days = limits.get("max_cost_per_request"), limits.get("max_break_even_days")
    per_day = cost.get("expected_requests_per_day")
    out.append(
        f'<p class="note">Serving cost: {_money(cost.get("device_hour_price"))} {cur} per '
        f'device-hour &times; {_num(cost.get("devices_per_server"))} device(s) per server. '
        "Expected traffic: "
        + (f"{_num(per_day, '{:,.0f}')} requests/day. " if per_day is not None else "not given. ")
        + "Limits: cost per request "
        + (f"{_money(max_cost)} {cur}" if max_cost is not None else "none")
        + ", break-even " + (f"{_num(max_days)} days" if max_days is not None else "none")
        + ". Cost per request = hourly cost / successful requests per busy hour.</p>")

    def over(value: object, limit: object, fmt: str | None = None) -> str:
        text = _num(value, fmt) if fmt else _money(value)
        bad = isinstance(value, int | float) and isinstance(limit, int | float) and value > limit
        return f'<span class="over">{text}</span>' if bad else text

    rows = [
        (_e(c.get("condition")),
         f"{_e(c.get('load'))} ({_e(c.get('load_label') or 'x' + str(c.get('concurrency')))})",
         f"{_e(c.get('ok'))}/{_e(c.get('total'))}", _num(c.get("busy_s"), "{:.2f}"),
         _num(c.get("requests_per_hour"), "{:.1f}"),
         over(c.get("cost_per_request"), max_cost), _money(_per_k(c.get("cost_per_request"))),
         _money(c.get("setup_cost")))
        for c in cost.get("table", [])
    ]
    unit = cost.get("currency", "")
    out.append(_table(("condition", "load", "ok/total", "busy s", "ok requests/hour",
                       f"cost per ok request ({unit})", f"per 1,000 ({unit})",
                       f"setup ({unit})"), rows, {2, 3, 4, 5, 6, 7}))
    be_rows = [
        (_e(b.get("candidate")), _e(b.get("reference")), _e(b.get("load")),
         _money(b.get("setup_cost")), _money(b.get("savings_per_request")),
         _num(b.get("requests"), "{:,.0f}"), over(b.get("days"), max_days, "{:,.1f}"),
         _e(b.get("reason") or ""))
        for b in cost.get("break_even", [])
    ]
    if be_rows:
        out.append("<h3>Break-even (setup cost / savings per request)</h3>")
        out.append(_table(("candidate", "vs", "load", "setup", "savings per request",
                           "break-even requests", "days", "note"), be_rows, {3, 4, 5, 6}))
    return "".join(out)


def _per_k(value: object) -> object:
    return value * 1000 if isinstance(value, int | float) else value


def _plots(plots: dict[str, bytes]) -> str:
    out = ['<h2 id="plots">Plots</h2>']
    for key, png in plots.items():
        caption = PLOT_CAPTIONS.get(key) or PLOT_CAPTIONS.get(key.split("_", 1)[0], "")
        out.append(_figure(key, png, caption))
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
            out.append(_e(part))
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
    ref = _first_outputs(data.of(baseline, levels[0]))
    for cond in others:
        cand = _first_outputs(data.of(cond, levels[0]))
        common = [p for p in ref if p in cand]
        divergent = [p for p in common if ref[p].output_ids != cand[p].output_ids
                     or (not ref[p].output_ids and ref[p].output_text != cand[p].output_text)]
        out.append(f"<h3>{_e(cond)} vs {_e(baseline)}: {len(divergent)} of {len(common)} "
                   f"prompts diverge (first repetition, load {_e(levels[0])})</h3>")
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
                f"<div><b>{_e(pid)}</b> <span class=\"note\">slice {_e(ref[pid].slice)}, "
                f"{_e(ref[pid].output_tokens)} vs {_e(cand[pid].output_tokens)} tokens</span>"
                f'<div class="pair"><div><div class="who">{_e(baseline)}</div><pre>{a}</pre>'
                f'</div><div><div class="who">{_e(cond)}</div><pre>{b}</pre></div></div></div>')
    return "".join(out)


def _errors(data: SavedCampaign) -> str:
    # A probe the engine does not offer is not an error (the sampling_params gate lists it).
    failed = [r for r in data.records if not r.ok
              and not (r.mode == "params" and (r.error or "").startswith("unsupported"))]
    if not failed:
        return ""
    by_cond: dict[str, list[RequestRecord]] = {}
    for r in failed:
        by_cond.setdefault(r.condition, []).append(r)
    rows = []
    for cond, recs in by_cond.items():
        errors = list(dict.fromkeys((r.error or "(no message)")[:300] for r in recs))
        rows.append((_e(cond), _e(len(recs)),
                     "<br>".join(_e(e) for e in errors[:MAX_ERRORS])
                     + (" &hellip;" if len(errors) > MAX_ERRORS else "")))
    return '<h2 id="errors">Failed requests</h2>' + _table(
        ("condition", "failed", "errors (distinct, first few)"), rows, {1})


# --------------------------------------------------------------------------- page


def _history(summary: dict[str, Any]) -> str:
    comp = summary.get("comparison")
    if not comp:
        return ""
    out = ['<h2 id="history">Compared with an earlier campaign</h2>',
           f'<p class="note">{_e(comp.get("previous_dir"))} (run {_e(comp.get("previous_run_id"))})'
           f', tolerance {_num(100 * float(comp.get("tolerance") or 0), "{:.0f}")}%.</p>']
    rows = [(_e(f.get("candidate")), _e(f.get("check")), _e(f.get("load") or "-"),
             '<span class="over">REGRESSION</span>' if f.get("regression") else "ok",
             _e(f.get("text"))) for f in comp.get("findings", [])]
    if rows:
        out.append(_table(["drafter", "check", "load", "outcome", "finding"], rows, set()))
    out += [f'<p class="note">{_e(n)}</p>' for n in comp.get("notes", [])]
    return "".join(out)


def _banner(summary: dict[str, Any]) -> str:
    """First thing on the page: a partial campaign (no verdict) and a re-judged copy."""
    out = []
    if summary.get("partial"):
        out.append('<div class="verdict DROP"><span class="label">INTERRUPTED</span>'
                   f"{_e(summary['partial'])}. Judged as measured: no verdict.</div>")
    rejudged = summary.get("rejudged")
    if isinstance(rejudged, dict):
        out.append(f'<p class="note"><b>Re-judged copy</b> ({_e(rejudged.get("at"))}, limits '
                   f"from {_e(rejudged.get('pilot'))}); the original reports are untouched.</p>")
    return "".join(out)


def render_html(summary: dict[str, Any], data: SavedCampaign, plots: dict[str, bytes],
                title: str | None = None) -> str:
    """The whole report page as one string (UTF-8, no external resources)."""
    title = title or summary.get("title") or f"Drafter pilot: {summary.get('pilot_name', '')}"
    plots = dict(plots)
    body = "".join((
        _banner(summary), _header(summary, data, str(title)), _verdicts(summary),
        setup_section(summary), stability_section(summary, plots), _gates(summary),
        _figures(summary, data), analyses(summary, plots), _cost(summary), _history(summary),
        _plots(plots), _outputs(data), _errors(data),
    ))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )


def write_html(directory: Path, summary: dict[str, Any], data: SavedCampaign,
               plots: dict[str, bytes], title: str | None = None) -> Path:
    """Write ``directory/report.html`` atomically; returns its path."""
    path = directory / "report.html"
    write_text_atomic(path, render_html(summary, data, plots, title))
    return path
