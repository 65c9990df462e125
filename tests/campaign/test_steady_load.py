"""Steady load: the in-flight load recomputed from records, the fairness failure of a level
that drains, fillers recorded and never judged, and a real closed-loop run that holds x4."""

from __future__ import annotations

import asyncio
import heapq
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_osprey.campaign.runner import Campaign
from pytest_osprey.campaign.steady import filler_order, hold_load
from pytest_osprey.engines.sglang import engine as sg
from pytest_osprey.engines.vllm.metrics import max_num_seqs_of
from pytest_osprey.judgement.figures.measured import all_figures
from pytest_osprey.judgement.service.fairness import fairness_check
from pytest_osprey.judgement.service.load import drained, in_flight, level_loads
from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.trace import load_trace
from pytest_osprey.report.setup import measured_load
from pytest_osprey.report.terminal import in_flight_text
from pytest_osprey.results.folder import iter_pairs, load_campaign
from pytest_osprey.results.records import RequestRecord
from testkit.endpoint_pilot import run_cli, sglang_routes, write_endpoint_pilot
from testkit.factories import ROOT, make_record, saved_campaign
from testkit.fake_engine import sglang_events
from testkit.fake_server import Reply, ScriptedServer

FIXTURES = ROOT / "tests" / "fixtures" / "sglang-0.5.23-cpu"


def rec(cond: str, pid: str, start: float, e2e: float, ttft: float = 0.0, *,
        load: str = "x4", c: int = 4, filler: bool = False, ok: bool = True,
        **kw: Any) -> RequestRecord:
    return make_record(cond, pid, load=load, concurrency=c, started_at=start, e2e_s=e2e,
                       ttft_s=ttft, filler=filler, ok=ok, **kw)


# --------------------------------------------------------------------------- the statistic


def test_in_flight_of_known_overlaps() -> None:
    a = rec("base", "a", 0.0, 10.0)
    b = rec("base", "b", 5.0, 10.0, ttft=5.0)  # decodes over [10, 15]
    f = rec("base", "f", 0.0, 20.0, filler=True)
    other = rec("cand", "a", 0.0, 30.0)  # another condition never counts
    got = {r.prompt_id: v for r, v in in_flight([a, b, f, other]) if r.condition == "base"}
    assert got == pytest.approx({"a": (10 + 5 + 10) / 10, "b": (0 + 5 + 5) / 5})
    assert "f" not in got  # fillers are counted, never measured
    # A request whose first token is its last: the count at that instant.
    point = rec("base", "p", 12.0, 1.0, ttft=1.0)
    values = dict((r.prompt_id, v) for r, v in in_flight([a, b, f, point]))
    assert values["p"] == pytest.approx(3.0)  # itself, b and the filler at t = 13


def test_an_answer_in_one_piece_is_counted_over_its_whole_life() -> None:
    """All tokens in one chunk (no inter-token gap): the engine decoded before it answered, so
    the count is over the request's life, not the instant its chunk arrived."""
    a = rec("base", "a", 0.0, 10.0)
    b = replace(rec("base", "b", 0.0, 10.5, ttft=10.4), itl_s=[0.0, 0.0, 0.0])
    late = rec("base", "f", 10.2, 5.0, filler=True)  # the replacement, sent a moment late
    values = dict((r.prompt_id, v) for r, v in in_flight([a, b, late]))
    assert values["b"] == pytest.approx((10.0 + 10.5 + 0.3) / 10.5)  # not the 1.5 at 10.4
    streamed = replace(b, itl_s=[0.05, 0.0, 0.05])
    values = dict((r.prompt_id, v) for r, v in in_flight([a, streamed, late]))
    assert values["b"] == pytest.approx((0.0 + 0.1 + 0.1) / 0.1)  # its own decode window


def _grid_truth(records: list[RequestRecord], r: RequestRecord, step: float = 1e-4) -> float:
    """Independent of the code under test: the in-flight count sampled on a fine grid."""
    assert r.started_at is not None and r.e2e_s is not None and r.ttft_s is not None
    t = np.arange(r.started_at + r.ttft_s, r.started_at + r.e2e_s, step) + step / 2
    n = np.zeros_like(t)
    for o in records:
        assert o.started_at is not None and o.e2e_s is not None
        n += (t >= o.started_at) & (t < o.started_at + o.e2e_s)
    return float(n.mean())


def _durations(rng: np.random.Generator, starts: np.ndarray) -> np.ndarray:
    """Heavy-tailed request times with noise shared in time: a drift, and a stall over
    [1.0, 1.4) s that lengthens every request in flight then."""
    base = np.exp(rng.normal(-1.0, 0.6, len(starts))) * (1 + 0.1 * starts)
    base *= np.where(rng.random(len(starts)) < 0.1, rng.pareto(2.0, len(starts)) + 1, 1.0)
    return base + np.where(starts < 1.4, 0.4 * (starts + base > 1.0), 0.0)


def _drained_block(c: int, seed: int) -> list[RequestRecord]:
    """The old stretch: c prompts sent at once, waited for; the batch shrinks as they end."""
    rng = np.random.default_rng(seed)
    starts = np.zeros(c)
    dur = _durations(rng, starts)
    return [rec("base", f"p{i}", 0.0, float(d), ttft=float(0.05 * d), c=c)
            for i, d in enumerate(dur)]


def _steady_stretch(c: int, measured: int, seed: int) -> list[RequestRecord]:
    """c workers: measured requests, then fillers until the last measured one ends; fillers
    still running are cut there (cancelled)."""
    rng = np.random.default_rng(seed)
    free = [(0.0, w) for w in range(c)]
    heapq.heapify(free)
    out: list[RequestRecord] = []
    ends: list[float] = []
    for i in range(measured):
        t, w = heapq.heappop(free)
        d = float(_durations(rng, np.array([t]))[0])
        out.append(rec("base", f"p{i}", t, d, ttft=0.05 * d, c=c))
        ends.append(t + d)
        heapq.heappush(free, (t + d, w))
    last = max(ends)
    k = 0
    while free[0][0] < last:
        t, w = heapq.heappop(free)
        d = float(_durations(rng, np.array([t]))[0])
        cut = min(d, last - t)
        out.append(rec("base", f"f{k}", t, cut, c=c, filler=True, ok=cut == d))
        k += 1
        heapq.heappush(free, (t + cut, w))
    return out


@pytest.mark.parametrize("c", [4, 8, 32])
def test_in_flight_matches_the_truth_of_a_drained_and_a_steady_stretch(c: int) -> None:
    for seed in range(3):
        drain = _drained_block(c, seed)
        for r, v in in_flight(drain):
            assert v == pytest.approx(_grid_truth(drain, r), abs=0.01)
        (lv,) = level_loads(saved_campaign(drain))
        assert lv.steady is False and lv.mean is not None and lv.mean < 0.95 * c
        (why,) = drained([lv])
        assert f"load 'x4': base's measured requests ran with {lv.mean:.2f} requests" in why
        assert f"below 0.95 x {c}" in why

        steady = _steady_stretch(c, 3 * c, seed)
        values = [v for _, v in in_flight(steady)]
        assert len(values) == 3 * c  # every measured request, no filler
        assert values == pytest.approx([c] * len(values), rel=1e-9)  # the truth: c, always
        (lv,) = level_loads(saved_campaign(steady))
        assert lv.steady and lv.within == 1.0 and lv.fillers > 0 and not drained([lv])
        last = max((r.started_at or 0.0) + (r.e2e_s or 0.0) for r in steady if not r.filler)
        assert lv.achieved_rate == pytest.approx(3 * c / last)  # measured throughput


def test_a_drained_level_fails_fairness_naming_it_and_a_steady_one_passes() -> None:
    meta = {"conditions": {"base": {"fingerprint": {}}, "cand": {"fingerprint": {}}}}
    steady = [*_steady_stretch(4, 12, 0),
              *(rec("cand", r.prompt_id, r.started_at or 0.0, r.e2e_s or 0.0,
                    ttft=r.ttft_s or 0.0, filler=r.filler, ok=r.ok)
                for r in _steady_stretch(4, 12, 1))]
    data = saved_campaign(steady)
    assert fairness_check(meta, data.records, level_loads(data)).ok
    drain = [*_drained_block(4, 0), *(rec("cand", r.prompt_id, 0.0, r.e2e_s or 0.0)
                                      for r in _drained_block(4, 1))]
    data = saved_campaign(drain)
    res = fairness_check(meta, data.records, level_loads(data))
    assert not res.ok and len(res.differences) == 2
    assert all("load 'x4'" in d and "below 0.95 x 4" in d for d in res.differences)


def test_achieved_rate_of_an_open_loop_level() -> None:
    rng = np.random.default_rng(3)
    starts = np.cumsum(rng.exponential(1 / 5.0, 400))  # Poisson 5/s
    recs = [rec("base", f"p{i}", float(t), 0.1, load="poisson", c=0, rate=5.0)
            for i, t in enumerate(starts)]
    (lv,) = level_loads(saved_campaign(recs))
    assert lv.achieved_rate == pytest.approx(5.0, rel=0.15)  # 400 arrivals: s.e. 5%
    assert lv.steady is None and lv.within is None
    assert lv.mean == pytest.approx(1 + 5.0 * 0.1, rel=0.25)  # Little: 1 + rate x time


# --------------------------------------------------------------------------- fillers


def test_fillers_are_in_no_judged_view() -> None:
    recs = [rec("base", "a", 0.0, 1.0), rec("cand", "a", 0.0, 1.0),
            rec("base", "b", 0.0, 2.0, filler=True), rec("cand", "b", 0.0, 0.5, filler=True,
                                                         ok=False, error="cancelled")]
    data = saved_campaign(recs)
    assert {r.prompt_id for r in data.records} == {"a"}
    assert {r.prompt_id for r in data.of("base")} == {"a"}
    assert len(data.sent) == 4 and len(data.fillers) == 2
    assert [p for p, _, _ in iter_pairs(data, "base", "cand", "x4", lambda r: r.e2e_s)] == ["a"]


def test_filler_order_is_seeded_and_cycles() -> None:
    it = filler_order(["a", "b", "c"], "s")
    first = [next(it) for _ in range(9)]
    assert sorted(first[:3]) == sorted(first[3:6]) == ["a", "b", "c"]
    again = filler_order(["a", "b", "c"], "s")
    assert [next(again) for _ in range(9)] == first


def test_hold_load_keeps_every_worker_busy_until_the_last_measured_ends() -> None:
    in_flight_now: list[int] = []
    busy = 0
    cancelled = 0

    async def measured(k: int) -> None:
        nonlocal busy
        busy += 1
        in_flight_now.append(busy)
        await asyncio.sleep(0.01 * (1 + k % 5))
        busy -= 1

    async def filler() -> bool:
        nonlocal busy, cancelled
        busy += 1
        try:
            # Longer than any measured request: still running when the last one ends, so
            # its cancellation is what ends it (not the machine's timing).
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled += 1
            raise
        finally:
            busy -= 1
        return True

    asyncio.run(hold_load(4, 10, measured, filler))
    assert busy == 0 and cancelled > 0
    assert in_flight_now[:4] == [1, 2, 3, 4] and set(in_flight_now[4:]) == {4}


# --------------------------------------------------------------------------- a real run


def _long_enough(pilot: Path) -> Path:
    """The endpoint pilot with its trace asking for the 12 tokens :func:`_answer` may give."""
    trace = pilot.parent / "trace.jsonl"
    trace.write_text(trace.read_text().replace('"max_new_tokens": 2', '"max_new_tokens": 12'))
    return pilot


def _answer(body: Any) -> Reply:
    """An n-token stream, n set by the prompt (3 to 12 tokens, 15 ms apart): without fillers
    a block's batch would drain as its short answers end."""
    n = 3 + sum(map(ord, str(body.get("text", "")))) % 10
    events = sglang_events(body, n, incremental=False, speculates=False)
    return Reply(events=[(0.015, e) for e in events])


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_closed_loop_run_holds_x4_and_records_its_fillers(tmp_path: Path) -> None:
    with ScriptedServer(routes=sglang_routes(_answer)) as srv:
        pilot = _long_enough(write_endpoint_pilot(tmp_path, srv.url, prompts=8, extra={
            "load": {"levels": {"x4": 4}, "warmup_requests": 0, "passes": 1},
            "decision": {"primary_load": "x4"}}))
        code = run_cli(["run", str(pilot), "--results", str(tmp_path / "res")])
        assert code in (0, 1), code
        # A cancelled filler closes its stream (an engine aborts a request whose client
        # went away): the server saw streams left mid-way, never more than were cancelled.
        cut = [x for x in srv.seen if x.path == "/generate" and not x.complete]
    lines = [json.loads(x) for x in (tmp_path / "res" / "records.jsonl").read_text()
             .splitlines()]
    fillers = [x for x in lines if x["filler"]]
    assert fillers and all(x["load"] == "x4" and x["mode"] == "greedy" for x in fillers)
    cancelled = [x for x in fillers if not x["ok"]]
    assert cancelled and all("filler no longer needed" in x["error"] for x in cancelled)
    assert 0 < len(cut) <= len(cancelled)
    assert len([x for x in srv.seen if x.path == "/generate"]) <= len(lines)  # all recorded
    data = load_campaign(tmp_path / "res")
    assert len(data.records) == 2 * 8  # conditions x prompts, no filler
    loads = level_loads(data)
    assert {lv.condition for lv in loads} == {"base", "cand"}
    for lv in loads:
        assert lv.mean == pytest.approx(4.0, rel=0.05), lv
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    (fair,) = [g for g in summary["gates"] if g["kind"] == "fairness"]
    assert fair["outcome"] == "pass"
    assert {f["condition"]: round(f["in_flight_mean"], 2) for f in summary["figures"]} == {
        lv.condition: round(lv.mean or 0.0, 2) for lv in loads}
    # The set-up row states the same range as the records, to two decimals.
    lo, hi = (min(lv.mean or 0.0 for lv in loads), max(lv.mean or 0.0 for lv in loads))
    stated = f"x4 {lo:.2f}" + (f"-{hi:.2f}" if hi - lo >= 0.005 else "")
    assert any(r["what"] == "measured load" and r["value"].startswith(stated + " ")
               for r in summary["setup"])
    # Judged again from the folder alone: the same in-flight figures.
    assert run_cli(["report", str(tmp_path / "res")]) in (0, 1)
    (again,) = (tmp_path / "res").glob("rejudged-*/summary.json")
    (fair2,) = [g for g in json.loads(again.read_text())["gates"] if g["kind"] == "fairness"]
    assert fair2["details"]["in_flight"] == fair["details"]["in_flight"]


# --------------------------------------------------------------------------- engine caps


def test_a_level_above_a_recorded_servers_cap_fails_naming_both() -> None:
    """The cap as a real SGLang 0.5.23 speculative server reports it (48 by default)."""
    info = json.loads((FIXTURES / "incremental_standalone" / "server_info.json").read_text())
    plain = json.loads((FIXTURES / "incremental_plain" / "server_info.json").read_text())
    fps = {}
    for name, body in (("cand", info), ("base", plain)):
        with ScriptedServer() as srv:
            srv.routes[("GET", "/server_info")] = Reply(json_body=body)
            fps[name] = sg.SGLangClient(srv.url, name).fingerprint()
    meta = {"conditions": {n: {"fingerprint": fp} for n, fp in fps.items()}}
    records = [rec(c, p, 0.0, 1.0, load="x64", c=64) for c in ("base", "cand") for p in "ab"]
    res = fairness_check(meta, records)
    assert not res.ok
    assert any("load 'x64'" in d and "cand runs at most 48" in d and "base runs" not in d
               for d in res.differences)
    at_32 = [rec(c, p, 0.0, 1.0, load="x32", c=32) for c in ("base", "cand") for p in "ab"]
    assert fairness_check(meta, at_32).ok


def test_vllm_running_cap_from_its_resolved_config_or_its_command_line() -> None:
    info = {"vllm_config": {"scheduler_config": {"max_num_seqs": 128}}}
    assert max_num_seqs_of(info) == 128
    assert max_num_seqs_of({"vllm_config": "text form"}, ["--max-num-seqs", "16"]) == 16
    assert max_num_seqs_of(None, ["--max-num-seqs=8"]) == 8
    assert max_num_seqs_of(None, ["--model", "m"]) is None


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_cycled_stretch_sends_every_copy_and_records_which(tmp_path: Path) -> None:
    """A stretch may repeat a prompt (the trace cycled to reach the level's concurrency):
    one measured request per entry, each recorded with its occurrence."""
    with ScriptedServer(routes=sglang_routes(_answer)) as srv:
        path = _long_enough(write_endpoint_pilot(tmp_path, srv.url, prompts=3, extra={
            "load": {"levels": {"x8": 8}, "warmup_requests": 0, "passes": 1},
            "decision": {"primary_load": "x8"}}))
        pilot = load_pilot(path)
        campaign = Campaign(pilot, load_trace(pilot.trace.files), tmp_path / "res",
                            list(pilot.conditions))
        campaign.plan = replace(campaign.plan, stretches=tuple(
            replace(s, prompt_ids=(s.prompt_ids * 3)[:8]) for s in campaign.plan.stretches))
        data = campaign.run()
    for cond in ("base", "cand"):
        mine = sorted((r.prompt_id, r.copy) for r in data.of(cond))
        assert mine == sorted([("p0", 0), ("p0", 1), ("p0", 2), ("p1", 0), ("p1", 1),
                               ("p1", 2), ("p2", 0), ("p2", 1)])
    (lv, _) = level_loads(data)
    assert lv.mean == pytest.approx(8.0, rel=0.05) and lv.measured == 8


def test_the_set_up_states_each_levels_measured_load() -> None:
    rng = np.random.default_rng(5)
    starts = np.cumsum(rng.exponential(1 / 5.0, 200))
    recs = [*(rec("base", f"p{i}", float(t), 0.1, load="poisson", c=0, rate=5.0)
              for i, t in enumerate(starts)), *_steady_stretch(4, 12, 0)]
    data = saved_campaign(recs, load_levels={"poisson": {"rate": 5.0}, "x4": 4})
    figs = all_figures(data)
    line = measured_load(figs)
    assert line is not None and line.startswith("measured in flight: poisson (Poisson 5/s) 1.")
    assert "/s achieved" in line and ", x4 4.00" in line
    (x4,) = [f for f in figs if f.load == "x4"]
    assert x4.in_flight_within == 1.0 and x4.fillers > 0 and in_flight_text(x4) == "4.00"
