"""report.html and its plots, from a synthetic campaign (no engine)."""

from __future__ import annotations

import base64
import math
import re
from pathlib import Path

import pytest

from pytest_osprey.report.html import render_html, write_html
from pytest_osprey.report.plots import all_plots, prompt_speedups
from pytest_osprey.report.sections import sig2
from pytest_osprey.results.folder import SavedCampaign
from testkit.report_campaign import make_data, make_summary, rec

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def data() -> SavedCampaign:
    return make_data()


@pytest.fixture(scope="module")
def plots(data: SavedCampaign) -> dict[str, bytes]:
    return all_plots(data, speedup_min=1.1)


@pytest.fixture(scope="module")
def page(data: SavedCampaign, plots: dict[str, bytes]) -> str:
    return render_html(make_summary(data), data, plots, title="Pilot <report>")


@pytest.mark.slow  # over a second on 2 busy cores
def test_plots_are_png(plots: dict[str, bytes]) -> None:
    assert set(plots) == {
        "latency_cdf", "ttft_throughput", "accept_length", "speedup_cand_vs_baseline",
        "speedup_cand_vs_current", "speedup_broken_vs_baseline", "speedup_broken_vs_current",
        "timeline", "load_speedups",
    }  # "broken" (zero successful requests) still gets its plots, empty panels saying so
    for key, png in plots.items():
        assert png.startswith(PNG_MAGIC), key
        assert len(png) > 5000, key


@pytest.mark.slow  # over a second on 2 busy cores
def test_plots_survive_a_single_prompt_and_repetition() -> None:
    data = make_data(prompts=[("p1", "core")], blocks=1)
    data.meta.candidates = ["cand"]
    plots = all_plots(data)
    assert len(plots) == 7
    assert all(png.startswith(PNG_MAGIC) for png in plots.values())


def test_prompt_speedups_geometric_mean_and_ci(data: SavedCampaign) -> None:
    rows = {pid: row for pid, *row in prompt_speedups(data, "baseline", "cand", "busy")}
    assert list(rows) == ["p1", "p2", "p3"]  # by slice, then id
    slice_, est, low, high = rows["p2"]
    assert slice_ == "core"
    assert est == pytest.approx(1 / 0.6)  # each repetition is 1/0.6 times faster
    # Paired by repetition: block-to-block drift (10% per block here) cancels out.
    assert low == pytest.approx(est) and high == pytest.approx(est)
    # A noisy prompt: its interval widens around the estimate.
    noisy = make_data()
    noisy.records = [
        rec("cand", r.prompt_id, r.slice, r.load, r.block, e2e_s=(r.e2e_s or 0) * 1.3)
        if (r.condition, r.prompt_id, r.block) == ("cand", "p2", 1) else r
        for r in noisy.records
    ]
    _, _, est, low, high = prompt_speedups(noisy, "baseline", "cand", "busy")[1]
    assert low is not None and high is not None and low < est < high
    single = prompt_speedups(make_data(blocks=1), "baseline", "cand", "busy")
    assert all(low is None and high is None for *_, low, high in single)
    assert prompt_speedups(data, "baseline", "broken", "busy") == []


def test_page_has_every_section_in_order(page: str) -> None:
    ids = ["verdicts", "key", "reasons", "setup", "stability", "gates", "figures", "analyses",
           "cost", "plots", "outputs", "errors"]
    at = [page.index(f'id="{i}"') for i in ids]
    assert at == sorted(at)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<title>Pilot &lt;report&gt;</title>" in page
    assert "Load low (x1)" in page and "Load busy (x4)" in page
    assert "Break-even" in page and "cand-vs-baseline-busy" in page


def test_verdicts_come_first_and_are_colored(page: str) -> None:
    for verdict in ("KEEP", "DROP", "INCONCLUSIVE"):
        assert f'class="verdict {verdict}"' in page
    assert page.index('class="verdict KEEP"') < page.index('id="gates"')
    assert "every gating gate passed" in page and "CI straddles" in page


def test_plots_are_embedded_as_png_data_uris(page: str, plots: dict[str, bytes]) -> None:
    uris = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(uris) == len(plots)
    assert all(base64.b64decode(u).startswith(PNG_MAGIC) for u in uris)


def test_untrusted_text_is_escaped(page: str) -> None:
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>no</b>" not in page and "engine said &lt;b&gt;no&lt;/b&gt;" in page
    assert "<i>pilot</i>" not in page and "&lt;i&gt;pilot&lt;/i&gt;" in page
    assert "&lt;ok&gt;" in page


def test_no_external_resources(page: str) -> None:
    assert "http://" not in page and "https://" not in page
    for ref in re.findall(r'(?:src|href)="([^"]*)"', page):
        assert ref.startswith(("data:image/png;base64,", "#")), ref


def test_divergent_outputs_are_shown_side_by_side(page: str) -> None:
    outputs = page[page.index('id="outputs"'):]
    assert "cand vs baseline: 1 of 3 prompts diverge" in outputs
    assert "current vs baseline: 0 of 3 prompts diverge" in outputs
    assert "<mark>&lt;script&gt;" in outputs and "answer to p1" in outputs


def test_cost_section_reads_the_summary(page: str, data: SavedCampaign) -> None:
    cost = page[page.index('id="cost"'):page.index('id="plots"')]
    # broken has no successful request: no cost, and no break-even with a reason.
    assert "no cost per request for broken" in cost
    # cand vs baseline at the primary load (busy): 100 setup over positive savings.
    be = next(b for b in make_summary(data)["cost"]["break_even"]
              if b["candidate"] == "cand" and b["reference"] == "baseline")
    assert be["requests"] is not None and math.isfinite(be["requests"])
    assert sig2(be["requests"]) in cost  # two significant figures, as report.md says it


def test_page_without_cost_or_verdicts(data: SavedCampaign) -> None:
    page = render_html({"gates": []}, data, {})
    assert "No cost section" in page and "No candidate was judged" in page
    assert "No plots" in page


def test_write_html_is_atomic(tmp_path: Path, data: SavedCampaign) -> None:
    path = write_html(tmp_path, make_summary(data), data, {"x": PNG_MAGIC})
    assert path == tmp_path / "report.html"
    assert path.read_text("utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_no_cost_configured_says_so(data: SavedCampaign) -> None:
    summary = make_summary(data)
    summary["cost"]["device_hour_price"] = 0.0
    cost = render_html(summary, data, {})
    cost = cost[cost.index('id="cost"'):cost.index('id="plots"')]
    assert "Cost not configured" in cost
    assert "0.00" not in cost and "savings" not in cost


def test_page_forbids_every_load_and_shows_setup_and_stability(data: SavedCampaign) -> None:
    summary = make_summary(data)
    summary["setup"] = [{"what": "engine", "value": "transformers 4.57 <x>"}]
    summary["stability"] = {"baseline": "baseline", "drift": [
        {"load": "busy", "block": 2, "ratio": 1.73, "prompts": 3}], "max_drift": 0.73,
        "load": [], "cpus": 2, "warnings": ["the baseline ran 73% slower in block 2"]}
    page = render_html(summary, data, {"timeline": PNG_MAGIC})
    assert '<meta http-equiv="Content-Security-Policy" content="default-src' in page
    setup = page[page.index('id="setup"'):page.index('id="stability"')]
    assert "transformers 4.57 &lt;x&gt;" in setup
    stability = page[page.index('id="stability"'):page.index('id="gates"')]
    assert "1.73x" in stability and 'alt="timeline"' in stability  # the plot sits here
    # The warning on the first screen, under the verdicts it qualifies, said once.
    first = page[page.index('id="verdicts"'):page.index('id="key"')]
    assert 'class="warning"' in first and "73% slower" in first
    assert page.count("73% slower") == 1


def test_reported_only_gates_stand_apart(data: SavedCampaign) -> None:
    summary = make_summary(data)
    summary["gates"].append({**summary["gates"][0], "id": "cand-vs-baseline-low", "load": "low",
                             "gating": False, "outcome": "fail"})
    page = render_html(summary, data, {})
    gates = page[page.index('id="gates"'):page.index('id="figures"')]
    deciding, reported = gates.split('class="reported"')
    assert "cand-vs-baseline-low" not in deciding and "cand-vs-baseline-low" in reported
    assert "never decide the verdict or fail the run" in reported
    assert "table-layout:fixed" in page  # the gates table wraps instead of overflowing


def test_verdict_headline_and_bullets(data: SavedCampaign) -> None:
    summary = make_summary(data)
    summary["verdicts"][1] |= {
        "headline": "DROP broken: speedup 0.61x [0.57, 0.66] vs 1.10x needed at busy",
        "bullets": [{"name": "speed at busy", "outcome": "fail", "text": "0.61x <b>",
                     "diagnosis": "never accepted", "gate": "speedup[broken-vs-baseline-busy]"}],
        "notes": []}
    page = render_html(summary, data, {})
    box = page[page.index('class="verdict DROP"'):]
    box = box[:box.index("</div>")]
    assert "speedup 0.61x [0.57, 0.66] vs 1.10x needed at busy" in box
    why = page[page.index('class="verdict DROP why"'):]
    why = why[:why.index("</div>")]
    assert "<b>speed at busy</b>: 0.61x &lt;b&gt;" in why and "diagnosis: never accepted" in why
    assert "broken-vs-baseline-busy" not in box + why


@pytest.mark.slow  # over a second on 2 busy cores
def test_accept_length_axis_spans_its_range() -> None:
    # A drafter at the floor (accept length 1.0-1.05) is drawn on 1..k+1, not zoomed in.
    from pytest_osprey.report.plotkit import accept_axis_top, draft_tokens

    weak = make_data()
    weak.records = [rec(r.condition, r.prompt_id, r.slice, r.load, r.block,
                        accept_length=1.02 if r.accept_length else None) for r in weak.records]
    for c in weak.meta.conditions.values():
        c.fingerprint = {"num_draft_tokens": 6}
    assert draft_tokens(weak) == 6
    assert accept_axis_top(weak, [1.02]) == 7.0  # 1 (nothing accepted) .. 7 (all 6 drafts)
    assert all_plots(weak)["accept_length"].startswith(PNG_MAGIC)


def test_an_interval_without_information_keeps_the_speedup_axis_finite() -> None:
    """df 0 gives a CI of [0, inf]: the plot is still drawn, its axis bounded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pytest_osprey.report.plotkit import NICE_TICKS, speedup_axis

    fig, ax = plt.subplots()
    try:
        speedup_axis(ax, 0.0 / 1.1, math.inf * 1.1, axis="y")
        assert ax.get_ylim() == pytest.approx((NICE_TICKS[0], NICE_TICKS[-1]))
        speedup_axis(ax, 1.2, 1.6)
        assert ax.get_xlim() == pytest.approx((1.2, 1.6))  # an informative range is kept
    finally:
        plt.close(fig)


def test_the_per_level_tables_carry_the_serving_figures() -> None:
    """TPOT (with its rise over the baseline), req/s, token counts and the p99s beside each
    condition's figures, from the Figures fields, not from text."""
    from pytest_osprey.judgement.figures.measured import Figures
    from pytest_osprey.report.terminal import SERVING_HEADER, serving_cells

    f = Figures(condition="cand", load="low", concurrency=1, ok=120, total=120,
                ttft_p50_s=0.04, ttft_p95_s=0.09, e2e_p50_s=1.0, e2e_p95_s=2.0,
                tpot_p50_s=0.0056, tpot_p95_s=0.011, ttft_p99_s=0.12, e2e_p99_s=2.5,
                tpot_p99_s=0.02, tokens_per_s=10.0, request_tokens_per_s_p50=10.0,
                accept_length_pooled=2.0, accept_length_mean=2.1, peak_memory_mb=90.0,
                requests_per_s=0.35, input_tokens_mean=41.6, output_tokens_mean=48.0)
    cells = serving_cells(f, {"tpot_p95_s": 0.25})
    assert len(cells) == len(SERVING_HEADER) and SERVING_HEADER[-1].startswith("p99")
    assert cells == ("6/11 (+25%)", "0.35", "42/48", "120/20/2500")
    short = f.model_copy(update={"ttft_p99_s": None, "tpot_p99_s": None, "e2e_p99_s": None})
    assert serving_cells(short)[3] == "-"
