"""The crossover in the reports: a campaign whose speedup falls with concurrency through the
threshold (a known crossing) gives a diagnosis line, summary.json's `crossover`, a plot and a
markdown mention; too few closed-loop levels say why in summary.json."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_osprey.judgement import GateKind, judge, plan_gates
from pytest_osprey.judgement.verdict.diagnosis import diagnose_all
from pytest_osprey.report.markdown import esc, markdown
from pytest_osprey.report.plots_crossover import crossover_plot
from pytest_osprey.report.summary import summary_dict
from pytest_osprey.results.folder import SavedCampaign
from pytest_osprey.results.preflight_file import Preflight
from testkit.factories import make_pilot, make_record, saved_campaign

THRESHOLD = 1.3
PEAK, FALL = 1.8, 0.15  # speedup 1.8 c^-0.15: it falls to 1.3 at c = (1.8/1.3)^(1/0.15)
CROSSING = (PEAK / THRESHOLD) ** (1 / FALL)


def _campaign(levels: dict[str, int], prompts: int = 24, passes: int = 2,
              seed: int = 3) -> SavedCampaign:
    rng = np.random.default_rng(seed)
    base = rng.lognormal(0.0, 0.4, prompts)
    records = []
    for rep in range(passes):
        for level, c in levels.items():
            for cond in ("base", "cand"):
                factor = 1.0 if cond == "base" else c ** FALL / PEAK
                for i in range(prompts):
                    e2e = float(base[i] * factor * c ** 0.2 * rng.lognormal(0.0, 0.04))
                    records.append(make_record(cond, f"p{i}", block=i, repetition=rep,
                                               load=level, concurrency=c, e2e_s=e2e))
    return saved_campaign(records, run_id="r", baseline="base", candidates=["cand"],
                          load_levels=levels)


def _summary(load: dict[str, Any], levels: dict[str, int]) -> tuple[Any, dict[str, Any]]:
    pilot = make_pilot(load=load, limits={"speedup_min": THRESHOLD},
                       decision={"early_stop": False}, report={"html": False})
    assert pilot.load.levels == levels
    data = _campaign(levels)
    specs = [s for s in plan_gates(pilot, list(pilot.conditions)) if s.kind == GateKind.SPEEDUP]
    judgement = judge(pilot, specs, data, Preflight())
    return (pilot, judgement, data), summary_dict(judgement, data, pilot)


def test_sweep_campaign_reports_its_crossover(tmp_path: Path) -> None:
    levels = {f"c{c}": c for c in (1, 2, 4, 8, 16, 32)}
    (pilot, judgement, data), summary = _summary({"sweep": {"max": 32}, "passes": 2}, levels)
    cross = summary["verdicts"][0]["crossover"]
    assert cross["status"] == "crosses" and cross["levels"] == list(levels)
    low, high = cross["ci"]
    assert low is not None and high is not None
    assert low < CROSSING < high and low < cross["concurrency"] < high
    assert math.isclose(cross["concurrency"], CROSSING, rel_tol=0.35)
    note = next(n for n in summary["verdicts"][0]["notes"] if n.startswith("speculation"))
    assert note.startswith(f"speculation pays up to about x{cross['concurrency']:.0f} [")
    assert note == cross["text"]
    (diag,) = diagnose_all(pilot, judgement.verdicts, list(judgement.results.values()),
                           judgement.figures, data)
    assert diag.crossover is not None and diag.crossover.concurrency == cross["concurrency"]

    png = crossover_plot(summary, THRESHOLD)
    assert png is not None and png.startswith(b"\x89PNG")
    text = markdown(summary, data.meta, "t", tmp_path.name, 64)
    assert "plotted in report.html" in text and esc(note.split(" (")[0]) in text


def test_two_levels_say_why_there_is_no_crossover() -> None:
    _, summary = _summary({"levels": {"low": 1, "busy": 4}}, {"low": 1, "busy": 4})
    cross = summary["verdicts"][0]["crossover"]
    assert cross["status"] == "not_estimable" and cross["concurrency"] is None
    assert cross["reason"] == "2 closed-loop level(s) judged (x1, x4); 3 or more are needed"
    assert not any(n.startswith("speculation") for n in summary["verdicts"][0]["notes"])
    assert crossover_plot(summary, THRESHOLD) is None


def test_open_loop_levels_are_left_out() -> None:
    levels = {"c1": 1, "c2": 2, "c4": 4}
    pilot = make_pilot(load={"levels": {**levels, "poisson": {"rate": 2.0}}},
                       limits={"speedup_min": THRESHOLD})
    from pytest_osprey.judgement.verdict.diagnosis import pays_up_to

    data = _campaign(levels)
    specs = [s for s in plan_gates(pilot, list(pilot.conditions))
             if s.kind == GateKind.SPEEDUP and s.load in levels]
    judgement = judge(pilot, specs, data, Preflight())
    got = pays_up_to(pilot, list(judgement.results.values()))
    assert got.levels == ("c1", "c2", "c4") and got.status == "pays_everywhere"


def test_plot_draws_open_intervals_and_several_candidates() -> None:
    def gate(cand: str, load: str, est: float) -> dict[str, Any]:
        return {"kind": "speedup", "condition": cand, "reference": "base", "load": load,
                "slice": None, "estimate": est, "ci": [est / 1.1, est * 1.1]}

    levels, concs = ["c1", "c4", "c16"], [1, 4, 16]
    summary = {
        "conditions": {"base": {"role": "baseline"}},
        "gates": [gate("a", lv, e) for lv, e in zip(levels, (2.0, 1.8, 1.6), strict=True)]
        + [gate("b", lv, e) for lv, e in zip(levels, (1.5, 1.2, 0.9), strict=True)],
        "verdicts": [
            {"candidate": "a", "crossover": {"status": "pays_everywhere", "concurrency": None,
                                             "ci": [5.0, None], "levels": levels,
                                             "concurrencies": concs, "threshold": THRESHOLD,
                                             "fit": [2.0, 1.8, 1.6]}},
            {"candidate": "b", "crossover": {"status": "crosses", "concurrency": 3.0,
                                             "ci": [None, 6.0], "levels": levels,
                                             "concurrencies": concs, "threshold": THRESHOLD,
                                             "fit": [1.5, 1.2, 0.9]}},
        ]}
    png = crossover_plot(summary, THRESHOLD)
    assert png is not None and png.startswith(b"\x89PNG")


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_sweep_campaign_end_to_end(tmp_path: Path) -> None:
    """A whole run (`python -m pytest_osprey run`) of a pilot with `load.sweep` against two
    scripted servers, the candidate's twice as fast at every level: levels c1, c2, c4 run,
    and summary.json says speculation pays at every level tested."""
    import json

    from testkit.endpoint_pilot import generate_reply, run_cli, sglang_routes
    from testkit.factories import dump_pilot, pilot_data
    from testkit.fake_server import ScriptedServer

    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"id": f"p{i}", "domain": "chat", "prompt": f"Hi {i}",
                                         "max_new_tokens": 2}) + "\n" for i in range(8)))
    with ScriptedServer(routes=sglang_routes(generate_reply(delay=0.06))) as slow, \
            ScriptedServer(routes=sglang_routes(generate_reply(delay=0.03))) as fast:
        data = pilot_data(
            {"base": {"role": "baseline", "endpoint": {"url": slow.url, "protocol": "sglang"}},
             "cand": {"role": "candidate", "endpoint": {"url": fast.url, "protocol": "sglang"}}},
            name="sweep", target={"engine": "endpoint", "model": "m"},
            trace={"files": ["trace.jsonl"]},
            load={"sweep": {"max": 4}, "warmup_requests": 0, "passes": 2,
                  "block_prompts": {"c1": 2, "c2": 2, "c4": 4}},
            limits={"speedup_min": 1.3}, decision={"early_stop": False},
            report={"html": True})
        pilot = dump_pilot(tmp_path / "pilot.yaml", data)
        code = run_cli(["run", str(pilot), "--results", str(tmp_path / "res")])
    assert code in (0, 1), code
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    cross = summary["verdicts"][0]["crossover"]
    assert cross["levels"] == ["c1", "c2", "c4"], cross
    assert cross["status"] == "pays_everywhere", cross
    assert cross["ci"][1] is None and cross["concurrency"] is None
    assert any(n.startswith("speculation pays at every level tested (>= x4)")
               for n in summary["verdicts"][0]["notes"])
    assert '<img src="data:image/png;base64,' in (html := (tmp_path / "res" / "report.html")
                                                    .read_text())
    assert 'alt="crossover"' in html
