"""The report page's analysis sections: set-up, environment stability, and the analyses
(speed across load levels, per domain, goodput, acceptance per position, the sampled-
distribution check). Each section takes the plots it shows out of ``plots`` (the page shows
the rest under Plots)."""

from __future__ import annotations

from typing import Any

from .htmlkit import esc, figure, num, table

PLOT_CAPTIONS = {
    "latency_cdf": "Completion latency CDF per condition, one panel per load level.",
    "ttft_throughput": "Time to first token and per-request output tokens/s, per condition "
    "and load level (boxes: quartiles; whiskers: 1.5 IQR).",
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


def _take(plots: dict[str, bytes], key: str) -> str:
    png = plots.pop(key, None)
    if png is None:
        return ""
    caption = PLOT_CAPTIONS.get(key) or PLOT_CAPTIONS.get(key.split("_", 1)[0], "")
    return figure(key, png, caption)


def setup_section(summary: dict[str, Any]) -> str:
    rows = [(esc(r.get("what")), esc(r.get("value"))) for r in summary.get("setup") or []]
    if not rows:
        return '<h2 id="setup">Set-up</h2><p class="note">Not recorded.</p>'
    return '<h2 id="setup">Set-up</h2>' + table(("set-up", "value"), rows)


def stability_section(summary: dict[str, Any], plots: dict[str, bytes]) -> str:
    out = ['<h2 id="stability">Environment stability</h2>']
    st = summary.get("stability") or {}
    for w in st.get("warnings") or []:
        out.append(f'<div class="warning"><b>Unsteady machine:</b> {esc(w)}</div>')
    drift = st.get("drift") or []
    if drift:
        out.append(f'<p class="note">The baseline ({esc(st.get("baseline"))}, speculation off) '
                   "against its own first pass, same prompts: 1.00x means the machine ran "
                   "at the same speed.</p>")
        out.append(table(("load", "pass", "baseline latency vs pass 1", "prompts"), [
            (esc(d.get("load")), num(d.get("block")), num(d.get("ratio"), "{:.2f}x"),
             num(d.get("prompts"))) for d in drift], {1, 2, 3}))
    elif st:
        out.append('<p class="note">One pass: no drift between passes to measure.</p>')
    loads = [x for x in st.get("load") or [] if x.get("loadavg_1m") is not None]
    if loads:
        top = max(x["loadavg_1m"] for x in loads)
        low = min(x["loadavg_1m"] for x in loads)
        out.append(f'<p class="note">Load average (1 min) during the replays: {low:.1f} to '
                   f"{top:.1f} on {esc(st.get('cpus') or '?')} CPUs.</p>")
    out.append(_take(plots, "timeline"))
    return "".join(out)


def _domains(summary: dict[str, Any], plots: dict[str, bytes]) -> str:
    rows = summary.get("domains") or []
    if not rows:
        return ""

    def ci(r: dict[str, Any]) -> str:
        if r.get("ci_low") is None or r.get("ci_high") is None:
            return "-"
        return f"[{num(r['ci_low'], '{:.2f}')}, {num(r['ci_high'], '{:.2f}')}]"

    body = table(("candidate", "domain", "slice", "prompts", "speedup", "95% CI", "accept len"),
                 [(esc(r.get("candidate")), esc(r.get("domain")), esc(r.get("slice")),
                   num(r.get("prompts")), num(r.get("speedup"), "{:.2f}x"), ci(r),
                   num(r.get("accept_length"), "{:.2f}")) for r in rows], {3, 4, 5, 6})
    load = rows[0].get("load")
    return (f"<h3>Per domain (load {esc(load)})</h3>" + body + _take(plots, "domains"))


def _goodput(summary: dict[str, Any], plots: dict[str, bytes]) -> str:
    gp = summary.get("goodput")
    if not gp:
        return ""
    targets = ", ".join(f"{name} &le; {num(gp[key] * 1000, '{:g}')} ms" for key, name in (
        ("ttft_s", "TTFT"), ("tpot_s", "inter-token"), ("e2e_s", "completion"))
        if gp.get(key) is not None)

    def pct(v: object) -> str:
        return "-" if not isinstance(v, int | float) else f"{v:.0%}"

    body = table(("condition", "load", "good/sent", "share", "TTFT ok", "inter-token ok",
                  "completion ok"),
                 [(esc(r.get("condition")), esc(r.get("load")),
                   f"{num(r.get('good'))}/{num(r.get('sent'))}", pct(r.get("share")),
                   pct(r.get("ttft_share")), pct(r.get("tpot_share")), pct(r.get("e2e_share")))
                  for r in gp.get("table", [])], {2, 3, 4, 5, 6})
    return (f'<h3>Goodput</h3><p class="note">A request is good when it completed with '
            f"{targets}. Margin against the baseline {num(gp.get('margin'), '{:.0%}')}.</p>"
            + body + _take(plots, "goodput"))


def analyses(summary: dict[str, Any], plots: dict[str, bytes]) -> str:
    out = ['<h2 id="analyses">Analyses</h2>', "<h3>Speed across load levels</h3>",
           _take(plots, "load_speedups"), _domains(summary, plots), _goodput(summary, plots)]
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
