"""The pilot summary a reviewer reads in the terminal, built from planted campaigns: two
tables within 120 columns, a rise over the baseline flagged where a candidate is worse, the
gates that could not have failed named, how the campaign ended, progress with ETAs, and the
queueing warning."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.campaign import runner
from pytest_osprey.campaign.events import ETA_MIN_DONE, ProgressEvent, campaign_eta, pass_eta
from pytest_osprey.campaign.runner import Campaign
from pytest_osprey.judgement import (
    GateResult,
    GateSpec,
    Judgement,
    all_figures,
    diagnose_all,
    judge,
    speedup_cells,
    stability,
)
from pytest_osprey.judgement.figures.speedups import with_speedups
from pytest_osprey.judgement.verdict.verdicts import verdicts
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.pilot.trace import load_trace
from pytest_osprey.report.console import closing_lines
from pytest_osprey.report.terminal import (
    WIDTH,
    Columns,
    terminal_legend,
    text_table,
    worse_than_baseline,
)
from pytest_osprey.results import Preflight
from pytest_osprey.results.folder import SavedCampaign
from testkit import factories
from testkit.factories import closed_loop_starts, make_record, saved_campaign, write_trace
from testkit.serving_sim import Planted, TemperatureEngine

LEVELS = {"low": 1, "concurrent": 4}
LONG = "eagle3-llama-draft-2"  # a 20-character condition name


def _pilot(cand: str) -> Pilot:
    return factories.make_pilot(
        target={"model": "t"},
        conditions={"baseline": {"role": "baseline"},
                    cand: {"role": "candidate", "drafter": "d"}},
        trace={"files": ["p.jsonl"]}, load={"levels": LEVELS, "passes": 4},
        limits={"speedup_min": 1.0}, decision={"primary_load": "concurrent"})


def _level(cond: str, load: str, n: int, e2e: float, ttft: float,
           tokens: int = 48) -> list[Any]:
    """``n`` requests of one condition at one closed-loop level, laid out as the runner
    lays them (``LEVELS[load]`` workers), each ``e2e`` s with its first token at ``ttft``."""
    starts, _ = closed_loop_starts([e2e] * n, LEVELS[load])
    return [make_record(cond, f"p{i}", load=load, concurrency=LEVELS[load], block=0,
                        e2e_s=e2e, ttft_s=ttft, started_at=1000.0 + s,
                        output_ids=list(range(tokens)))
            for i, s in enumerate(starts)]


def _campaign(cand: str, n: int = 21, *, queueing: bool = True,
              memory: tuple[float, float] = (68.0, 91.0), **meta: Any) -> SavedCampaign:
    """The baseline and ``cand`` at x1 and x4. Queueing: at x4 each request waits for the
    three before it (TTFT grows 49x, throughput does not); else x4 batches (1.5x the
    throughput, TTFT 4.8x).
    The candidate is slower to its first token (+35% at p50) and holds more memory."""
    heavy = (2.0, 1.5 + 0.031) if queueing else (1.2, 0.15)
    recs = [*_level("baseline", "low", n, 0.50, 0.031),
            *_level("baseline", "concurrent", n, *heavy),
            *_level(cand, "low", n, 0.40, 0.031 * 1.35),
            *_level(cand, "concurrent", n, heavy[0] * 0.8, heavy[1])]
    conditions = {"baseline": {"error": None, "peak_memory_mb": memory[0]},
                  cand: {"error": None, "peak_memory_mb": memory[1]}}
    return saved_campaign(recs, conditions=conditions, baseline="baseline",
                          load_levels=LEVELS, **meta)


def _speed(cand: str, load: str) -> GateResult:
    spec = GateSpec("speedup", cand, reference="baseline", load=load,
                    gating=load == "concurrent")
    return GateResult(spec, "pass", "speedup 1.250x", estimate=1.25, ci_low=1.18,
                      ci_high=1.33, threshold=1.0)


def _judgement(pilot: Pilot, data: SavedCampaign, cand: str) -> Judgement:
    results = [
        _speed(cand, "low"), _speed(cand, "concurrent"),
        GateResult(GateSpec("greedy_identity", cand, reference="baseline"), "pass",
                   "21/21 identical", estimate=0, threshold=0,
                   details={"compared": 21, "identical": 21, "genuine": [], "near_ties": []}),
        # No answer the baseline got right: nothing to lose, the gate could not have failed.
        GateResult(GateSpec("correctness", cand, reference="baseline"), "skip",
                   "not evaluable: the baseline got no answer right"),
        GateResult(GateSpec("goodput", cand, reference="baseline", load="concurrent"),
                   "pass", "the baseline met the targets in 2 of 21 requests",
                   evidence="not_evaluable"),
    ]
    decided = verdicts(pilot, results)
    figures = all_figures(data, pilot)
    cells = speedup_cells(results, "baseline")
    return replace(judge(pilot, [], data, Preflight()),
                   results={(g.spec.kind, g.spec.id): g for g in results}, verdicts=decided,
                   figures=with_speedups(figures, cells), speedups=cells,
                   diagnoses=diagnose_all(pilot, decided, results, figures, data))


def _cols(judgement: Judgement) -> Columns:
    return Columns(memory="weights MiB", memory_note="weights + buffers loaded, not a peak",
                   baseline="baseline", speedups={
                       (g.spec.condition, g.spec.load or ""): (g.estimate, g.ci_low, g.ci_high)
                       for g in judgement.results.values() if g.spec.kind == "speedup"})


@pytest.mark.parametrize("cand", ["tiny-drafter", LONG])
def test_the_tables_fit_120_columns_with_every_column(cand: str) -> None:
    assert len(LONG) == 20
    pilot, data = _pilot(cand), _campaign(cand)
    judgement = _judgement(pilot, data, cand)
    cols = _cols(judgement)
    lines = text_table(judgement.figures, cols) + terminal_legend(cols, judgement.figures)
    assert max(len(line) for line in lines) <= WIDTH, "\n".join(lines)
    speed, latency = lines[0], lines[5]
    for column in ("ok/total", "speedup [95% CI]", "tok/s", "req/s", "accept", "weights MiB",
                   "in flight"):
        assert column in speed
    for column in ("TTFT p50/p95 ms", "TPOT p50/p95 ms", "completion p50/p95 ms"):
        assert column in latency
    row = next(line for line in lines[1:5] if line.startswith(f"{cand} ")
               and "concurrent x4" in line)
    assert "1.25x [1.18, 1.33]" in row and "91 (+34%)" in row
    # 21 requests a level: no p99, and the legend says what it needs.
    assert not any(line.startswith("p99 ms") for line in lines)
    assert "p99 from 100 completed requests a level: low x1 has 21" in lines[-1]


def test_a_rise_over_the_baseline_is_a_number_then_a_cell() -> None:
    data = _campaign("cand")
    figs = all_figures(data)
    rises = worse_than_baseline(figs, "baseline")
    low = rises[("cand", "low")]
    assert low["ttft_p50_s"] == pytest.approx(0.35, abs=1e-9)
    assert low["peak_memory_mb"] == pytest.approx(91 / 68 - 1)
    # Faster to complete: not flagged; nor is anything of the baseline itself.
    assert "e2e_p50_s" not in low and not any(c == "baseline" for c, _ in rises)
    assert "ttft_p50_s" not in rises[("cand", "concurrent")]  # the same TTFT there
    table = text_table(figs, Columns(baseline="baseline"))
    cand_low = next(line for line in table if line.startswith("cand ") and "TT" not in line
                    and "/" in line and "low x1" in line and "(+35%)" in line)
    assert "42 (+35%)/42 (+35%)" in cand_low  # TTFT p50/p95 in ms, each with its rise
    same = _campaign("cand", memory=(68.0, 68.0))
    assert ("cand", "low") in worse_than_baseline(all_figures(same), "baseline")
    assert "peak_memory_mb" not in worse_than_baseline(all_figures(same), "baseline")[
        ("cand", "low")]


def test_p99_is_shown_from_100_requests() -> None:
    figs = all_figures(_campaign("cand", n=120))
    lines = text_table(figs, Columns(baseline="baseline"))
    p99 = [line for line in lines if line.startswith("p99 ms")]
    assert len(p99) == 4 and all("TTFT " in line and "completion " in line for line in p99)
    assert "p99 ms cand low x1: TTFT 42 (+35%)" in p99[2]
    assert not any("p99 from" in line for line in terminal_legend(Columns(), figs))


def test_closing_lines_name_what_could_not_have_failed_and_how_it_ended() -> None:
    cand = "tiny-drafter"
    pilot = _pilot(cand)
    data = _campaign(cand, plan={"passes": 4, "looks": 4,
                                 "blocks": {"low": [["p0"]], "concurrent": [["p0"]]}},
                     status="complete", stopped_after_block=1,
                     sequential={cand: [{"look": 1, "decision": "keep"}]})
    lines = [line.text for line in closing_lines(pilot, _judgement(pilot, data, cand), data,
                                                 None, [])]
    head = next(line for line in lines if line.startswith(f"KEEP {cand}:"))
    assert "quality identical" not in head
    # The quality part gives way to the width; what could not have failed stays said.
    assert "unproven: correctness; unchecked: sampled distribution" in head
    shown = "\n".join(lines)
    assert "  - unchecked correctness: not evaluable: " in shown
    assert "not evaluable: not evaluable" not in shown and "skip (not evaluable)" not in shown
    goodput = [line for line in lines if line.startswith("  - could not have failed: goodput")]
    assert goodput == ["  - could not have failed: goodput at concurrent (pass, not evaluable): "
                       "the baseline met the targets in 2 of 21 requests"]
    assert lines[-1] == ("campaign: stopped after pass 1 of 4: speed cleared the early-KEEP "
                         "boundary; not measured: drift between passes, near-tie control (a "
                         "second greedy pass of the baseline); time units per level "
                         "(stretches both conditions ran, which the speed test pairs within): "
                         "low 1, concurrent 1")
    assert any(line.startswith("WARNING: x4 (concurrent) measured queueing")
               for line in lines)
    table = lines[1:lines.index("")]
    assert all(len(line) <= WIDTH for line in table), "\n".join(table)


def test_queueing_is_warned_of_and_batching_is_not() -> None:
    (warning,) = [w for w in stability(_campaign("cand")).warnings if "queueing" in w]
    assert warning == ("x4 (concurrent) measured queueing on this engine, not batching: "
                       "baseline throughput 0.9x of x1's, TTFT p50 49x")
    assert stability(_campaign("cand", queueing=False)).warnings == []


def test_no_eta_before_three_requests_then_the_whole_campaign() -> None:
    assert ETA_MIN_DONE == 3
    assert pass_eta(2.0, 1, 84) is None and pass_eta(4.0, 2, 84) is None
    assert pass_eta(6.0, 3, 84) == pytest.approx(162.0)
    assert pass_eta(1.0, 1, 1) == 0.0  # a pass of one request is done when it is
    # Pass 2 of 4 half done after 50 s; pass 1 took 90 s; 30 s of untimed passes to come.
    assert campaign_eta([90.0], 50.0, 100.0, 2, 30.0) == pytest.approx(50 + 2 * 90 + 30)
    # Before any pass finished: this pass's projected time stands in for the mean.
    assert campaign_eta([], 75.0, 100.0, 3, 0.0) == pytest.approx(375.0)
    assert campaign_eta([], None, None, 3, 10.0) is None
    start = ProgressEvent("all", "serving", block=0, done=1, total=84, passes=4)
    assert start.line() == "[osprey] serving pass 1 of 4: 1/84 requests"
    later = ProgressEvent("all", "serving", block=1, done=42, total=84, eta_s=50.0, passes=4,
                          campaign_eta_s=260.0)
    assert later.line() == ("[osprey] serving pass 2 of 4: 42/84 requests, ETA 50s, "
                            "campaign ETA 4m 20s")
    assert later.line(finished=True).endswith("42/84 requests, campaign ETA 4m 20s")


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_campaigns_progress_events_carry_both_etas(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded from a real campaign (simulated engines that take their time): no pass ETA
    before 3 requests, and the whole campaign's ETA falling pass by pass to what the untimed
    greedy pass is expected to take."""
    trace = write_trace(tmp_path / "t.jsonl", 6, 8)
    pilot = factories.make_pilot(
        trace={"files": [str(trace)]},
        load={"levels": {"c1": 1, "c3": 3}, "passes": 3, "warmup_requests": 1},
        sampling={"serving": {"temperature": 0.8, "top_p": 0.95}})
    monkeypatch.setattr(runner, "make_engine", lambda p, c, boot: TemperatureEngine(
        c, p.conditions[c].speculates, Planted()))
    events: list[ProgressEvent] = []
    Campaign(pilot, load_trace(pilot.trace.files), tmp_path / "res", ["base", "cand"],
             progress=events.append).run()
    timed = [e for e in events if e.phase == "serving"]
    assert timed and all(e.passes == 3 for e in timed)
    assert all(e.eta_s is None for e in timed if e.done < ETA_MIN_DONE)
    assert all(e.eta_s is not None for e in timed if e.done >= ETA_MIN_DONE)
    ends = [e.campaign_eta_s for e in timed if e.done == e.total]
    assert len(ends) == 3 and all(x is not None for x in ends)
    first, second, last = (float(x or 0) for x in ends)
    assert first > second > last > 0  # the last: the greedy pass still to run
    assert next(e.line() for e in timed if e.done == e.total).startswith(
        "[osprey] serving pass 1 of 3: ")
    greedy = [e for e in events if e.phase == "greedy (untimed)"]
    assert greedy and all(e.campaign_eta_s is None for e in greedy)


def test_why_outputs_were_not_scored_is_news_to_the_terminal() -> None:
    """Each scoring message is shown (a terminal shows each phase once, a failure after the
    start of scoring included); a timed pass's repeats are not."""
    start = ProgressEvent("baseline", "score", message="scoring cand's sampled outputs",
                          total=24)
    failed = ProgressEvent("baseline", "score", message="sampled outputs not scored: no "
                           "input_token_logprobs")
    assert start.key != failed.key
    assert "not scored: no input_token_logprobs" in failed.line()
    one = ProgressEvent("all", "serving", block=0, done=1, total=84, passes=4)
    two = ProgressEvent("all", "serving", block=0, done=2, total=84, passes=4)
    assert one.key == two.key
