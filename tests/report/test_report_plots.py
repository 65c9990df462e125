"""The report's plots and first screen against a real summary: the recorded campaign
(testkit/recorded_campaign.py) judged as the plugin judges it, read back from its folder."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.judgement import GateKind
from pytest_osprey.report.html import GATE_UNITS, deciding_gate, render_html
from pytest_osprey.report.plots import all_plots, ttft_throughput_figure
from pytest_osprey.report.plots_analyses import (
    acceptance_figure,
    distribution_figure,
    distribution_title,
)
from pytest_osprey.results.folder import SavedCampaign, load_campaign
from testkit.factories import make_record, saved_campaign
from testkit.recorded_campaign import CONDITIONS, judged_campaign


@dataclass(frozen=True)
class Run:
    data: SavedCampaign
    summary: dict[str, Any]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    results = judged_campaign(tmp_path_factory.mktemp("plots"))
    summary = json.loads((results / "summary.json").read_text("utf-8"))
    return Run(load_campaign(results), summary)


def _gate(summary: dict[str, Any], kind: str, condition: str, **where: Any) -> dict[str, Any]:
    return next(g for g in summary["gates"] if g["kind"] == kind
                and g["condition"] == condition and all(g.get(k) == v for k, v in where.items()))


# --------------------------------------------------------------------------- TTFT per level


def _level_campaign() -> SavedCampaign:
    """TTFT of 30-90 ms at x1 and 1000-1400 ms at x4 (queueing): one axis would flatten x1."""
    records = [make_record(cond, f"p{i}", load=load, concurrency=conc, block=0,
                           e2e_s=1.0 + i / 10, ttft_s=(low + 15 * i) / 1000, output_tokens=30)
               for cond in ("baseline", "cand")
               for load, conc, low in (("low", 1, 30.0), ("busy", 4, 1000.0))
               for i in range(5)]
    return saved_campaign(records, baseline="baseline", candidates=["cand"])


def test_ttft_has_one_axis_per_load_level() -> None:
    fig = ttft_throughput_figure(_level_campaign())
    axes = fig.get_axes()
    assert len(axes) == 4  # TTFT and throughput rows, a column per level
    low, busy = axes[0], axes[1]
    assert [low.get_title(), busy.get_title()] == ["load low (x1)", "load busy (x4)"]
    # Each level on its own scale: the x1 boxes (30-90 ms) fill their axis.
    assert low.get_ylim()[0] <= 30 and 90 <= low.get_ylim()[1] < 200
    assert busy.get_ylim()[0] <= 1000 and busy.get_ylim()[1] >= 1060
    assert "ms" in low.get_ylabel() and "ms" in busy.get_ylabel()


@pytest.mark.slow  # over a second on 2 busy cores
def test_ttft_of_the_recorded_campaign(run: Run) -> None:
    fig = ttft_throughput_figure(run.data)
    levels = list(run.data.meta.load_levels)
    assert len(fig.get_axes()) == 2 * len(levels)
    for ax, level in zip(fig.get_axes()[:len(levels)], levels, strict=True):
        ttfts = [r.ttft_s * 1000 for c in CONDITIONS for r in run.data.of(c, level)
                 if r.ok and r.ttft_s is not None]
        bottom, top = ax.get_ylim()
        assert bottom <= min(ttfts) and max(ttfts) <= top
        assert level in ax.get_title()


# --------------------------------------------------------------------------- distribution


def test_distribution_title_reads_the_gate_fields(run: Run) -> None:
    gate = _gate(run.summary, GateKind.DISTRIBUTION, "cand")
    title = distribution_title(gate)
    assert title.startswith(str(gate["outcome"]).upper())
    assert f"p {gate['p_value']:.3g} vs \u03b1 {gate['threshold']:g}" in title
    assert f"{gate['estimate']:.3g}" in title
    assert f"flagged from {gate['details']['critical']:.3g}" in title
    assert "TV" not in title and "adjusted" not in title  # keys the gate does not write
    fig = distribution_figure(run.data, "baseline", "cand", gate)
    assert title in fig.get_suptitle()
    assert distribution_title(None) == "not judged"


def test_output_length_panel_says_when_every_sample_has_one_length(run: Run) -> None:
    lengths = {len(r.output_ids) for r in run.data.records if r.mode == "sampled"}
    assert lengths == {6}  # the recorded sampled pass: six tokens every time
    fig = distribution_figure(run.data, "baseline", "cand", None)
    panel = fig.get_axes()[1]
    notes = " ".join(t.get_text() for t in panel.texts)
    assert "every sample is 6 tokens long" in notes
    heights = [p.get_height() for p in panel.patches]
    assert sorted(heights) == pytest.approx([100.0, 100.0])  # a bar per side, not a line


def test_output_length_panel_with_lengths_that_differ() -> None:
    records = [make_record(cond, f"p{i}", mode="sampled", sample_index=k,
                           output_ids=list(range(3 + k + (cond == "cand"))))
               for cond in ("baseline", "cand") for i in range(2) for k in range(2)]
    data = saved_campaign(records, baseline="baseline", candidates=["cand"])
    panel = distribution_figure(data, "baseline", "cand", None).get_axes()[1]
    assert not panel.texts
    # baseline: lengths 3 and 4, half each; cand: 4 and 5.
    assert sum(p.get_height() for p in panel.patches) == pytest.approx(200.0)
    assert panel.get_ylabel() == "samples (%)"


# --------------------------------------------------------------------------- acceptance


def test_acceptance_by_position_is_filled_from_the_records(run: Run) -> None:
    shares = run.summary["acceptance_by_position"]
    drafters = [c for c, (role, *_) in CONDITIONS.items() if role != "baseline"]
    assert sorted(shares) == sorted(drafters)  # the baseline drafts nothing
    for cond, values in shares.items():
        recs = [r for r in run.data.of(cond) if r.ok and r.spec_drafts]
        drafts = sum(r.spec_drafts or 0 for r in recs)
        expected = [sum((r.spec_accepted_per_position or [])[j] for r in recs) / drafts
                    for j in range(len(values))]
        assert values == pytest.approx(expected)
    fig = acceptance_figure(shares)
    (ax,) = fig.get_axes()
    heights = [p.get_height() for p in ax.patches]
    assert heights == pytest.approx([100 * v for vs in shares.values() for v in vs])
    assert "%" in ax.get_ylabel()


# --------------------------------------------------------------------------- the page


@pytest.fixture(scope="module")
def page(run: Run) -> str:
    return render_html(run.summary, run.data, all_plots(run.data, 1.1, 0, run.summary))


@pytest.mark.slow  # over a second on 2 busy cores
def test_captions_are_words_not_ids(page: str) -> None:
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", page)
    assert len(captions) >= 8
    for caption in captions:
        title = re.match(r"<b>([^<]*)</b>", caption)
        assert title is not None and " " in title.group(1), caption
        assert not re.search(r"\b[a-z]+_[a-z_]+\b", title.group(1)), caption
    assert "Per-prompt speedup, cand vs baseline" in page
    assert "Sampled outputs, cand vs baseline" in page


def _row(page: str, gate: dict[str, Any]) -> str:
    at = page.index(f'title="test_{gate["kind"]}[{gate["id"]}]"')
    return page[at:page.index("</tr>", at)]


@pytest.mark.parametrize(("kind", "condition", "where", "shown"), [
    (GateKind.SPEEDUP, "cand", {"reference": "baseline", "load": "busy", "slice": None},
     lambda v: f"{v:.2f}x"),
    (GateKind.LATENCY, "cand", {}, lambda v: f"{v * 1000:.1f} ms"),
    (GateKind.MEMORY, "cand", {}, lambda v: f"{v:.0f} MiB"),
    (GateKind.COMPLETED, "cand", {"load": "busy"}, lambda v: f"{100 * v:.1f}%"),
])
def test_gate_estimates_carry_their_unit(page: str, run: Run, kind: str, condition: str,
                                         where: dict[str, Any], shown: Any) -> None:
    gate = _gate(run.summary, kind, condition, **where)
    row = _row(page, gate)
    assert shown(gate["estimate"]) in row
    if gate.get("threshold") is not None:
        assert f"vs {shown(gate['threshold'])}" in row
    assert kind in GATE_UNITS


def test_first_screen_names_the_deciding_speedup(page: str, run: Run) -> None:
    first = page[:page.index('id="reasons"')]
    for v in run.summary["verdicts"]:
        gate = deciding_gate(run.summary, v["candidate"], "baseline", ["low", "busy"])
        assert gate is not None and gate["gating"] and gate["load"] == "busy"
        low, high = gate["ci"]
        assert (f'<b class="speedup">{gate["estimate"]:.2f}x [{low:.2f}, {high:.2f}]</b>'
                in first)
        assert f"vs <b>{gate['threshold']:.2f}x</b> needed" in first
        for u in v["unchecked"]:
            assert f"unchecked: {u['check']}" in first
    key = first[first.index('id="key"'):]
    assert key.count("<tr>") == 1 + len(run.summary["figures"])  # header + every row
    setup = page[page.index('id="setup"') - 40:page.index('id="stability"')]
    assert '<details class="setup" id="setup">' in setup and "<details open" not in setup
    assert ">role<" in setup  # the conditions as booted sit in the set-up, not on top
    assert page.index('id="setup"') > page.index('id="key"')


@pytest.mark.slow  # over a second on 2 busy cores
def test_page_without_sampled_or_per_position_data(tmp_path: Path) -> None:
    records = [make_record(c, "p1", load="low", concurrency=1) for c in ("baseline", "cand")]
    data = saved_campaign(records, baseline="baseline", candidates=["cand"])
    summary = {"gates": [], "verdicts": [{"candidate": "cand", "verdict": "DROP",
                                          "headline": "DROP cand: speed not judged"}]}
    page = render_html(summary, data, all_plots(data, 1.1, 0, summary))
    assert "Deciding speedup: <b>not judged</b>" in page
    assert "Not recorded: the engine reported no per-position counts" in page


def test_titles_say_what_was_timed() -> None:
    """Served sampled, the plots show the timed requests at the serving sampling, not the
    untimed greedy pass beside them; a campaign timed greedy says so."""
    sampled = [make_record(cond, f"p{i}", mode="serving", temperature=0.7, top_p=0.95,
                           output_tokens=3) for cond in ("baseline", "cand") for i in range(4)]
    greedy = [make_record(cond, f"p{i}", output_tokens=3)
              for cond in ("baseline", "cand") for i in range(4)]
    served = ttft_throughput_figure(saved_campaign(sampled + greedy, baseline="baseline",
                                                   candidates=["cand"]))
    assert "timed requests sampled at T 0.7, top-p 0.95" in served.get_suptitle()
    assert "greedy" not in served.get_suptitle()
    timed_greedy = ttft_throughput_figure(saved_campaign(greedy, baseline="baseline",
                                                         candidates=["cand"]))
    assert "timed greedy requests" in timed_greedy.get_suptitle()


@pytest.mark.slow  # over a second on 2 busy cores
def test_speedup_plot_of_many_prompts_stays_a_readable_size() -> None:
    """A row per prompt up to NAMED_ROWS; past it the prompts are ranked, unnamed, in a
    figure of NAMED_ROWS rows (a row each for 600 prompts would be over 14,000 pixels)."""
    import struct

    from pytest_osprey.report.plots import NAMED_ROWS, speedup_plot
    from testkit.factories import paired_campaign

    def height(prompts: int) -> int:
        data = saved_campaign(paired_campaign({"base": 1.0, "cand": 0.8}, prompts=prompts,
                                              passes=2))
        png = speedup_plot(data, "base", "cand")
        return int(struct.unpack(">I", png[20:24])[0])  # IHDR: width, then height

    few, many = height(NAMED_ROWS // 2), height(600)
    assert few < many <= 2 * few, (few, many)
