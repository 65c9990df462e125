"""Open-loop load levels: seeded Poisson arrivals, the same for every condition of a block,
sent on time to a real HTTP server, with the dispatch lag recorded."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.campaign.requests import poisson_arrivals
from pytest_osprey.campaign.runner import Campaign
from pytest_osprey.judgement.figures.measured import all_figures
from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.schema import ConfigError, Pilot, level_label
from pytest_osprey.pilot.trace import load_trace
from testkit.factories import dump_pilot, endpoint_conditions, make_pilot, pilot_data, write_trace
from testkit.fake_server import Reply, ScriptedServer, sglang_routes


def test_arrivals_are_a_poisson_process_of_the_given_rate() -> None:
    rate = 7.0
    gaps = np.diff(poisson_arrivals(20_000, rate, "s"))
    # Exponential gaps with mean 1/rate: a KS test against the known truth, not a tolerance.
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.001
    assert stats.kstest(gaps, "expon", args=(0, 1 / (rate * 1.1))).pvalue < 1e-6
    assert abs(gaps.mean() * rate - 1) < 0.05


def test_arrivals_are_seeded() -> None:
    first = poisson_arrivals(50, 2.0, "0:open:0:greedy")
    assert first == poisson_arrivals(50, 2.0, "0:open:0:greedy")
    assert first != poisson_arrivals(50, 2.0, "0:open:1:greedy")
    assert first[0] == 0.0 and first == sorted(first)


def test_open_loop_levels_in_the_pilot(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", 2)
    dump_pilot(tmp_path / "p.yaml", pilot_data(
        {"base": {"role": "baseline"}}, target={"model": "m"}, trace={"files": [str(trace)]},
        load={"levels": {"low": 1, "busy": 4,
                         "poisson": {"rate": 2.5, "max_concurrency": 16}}}))
    pilot = load_pilot(tmp_path / "p.yaml", check_paths=False)
    load = pilot.load
    assert (load.concurrency("busy"), load.rate("busy")) == (4, None)
    assert (load.concurrency("poisson"), load.rate("poisson")) == (16, 2.5)
    assert load.label("poisson") == "Poisson 2.5/s, <=x16" and load.label("low") == "x1"
    # Closed and open loads are not comparable: the default primary is the busiest closed one.
    assert pilot.primary_load == "busy" and load.lightest() == "low"
    assert level_label({"rate": 3}) == "Poisson 3/s"


def test_open_loop_typo_names_the_field(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", 2)
    dump_pilot(tmp_path / "p.yaml", pilot_data(
        {"base": {"role": "baseline"}}, target={"model": "m"}, trace={"files": [str(trace)]},
        load={"levels": {"poisson": {"rates": 2}}}))
    with pytest.raises(ConfigError) as err:
        load_pilot(tmp_path / "p.yaml", check_paths=False)
    assert "load.levels.poisson.rates: unknown key; did you mean 'rate'?" in str(err.value)


class _Arrivals:
    """A /generate route that notes when each request reached the server."""

    def __init__(self, delay: float = 0.0) -> None:
        self.times: list[float] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.delay = delay
        self._lock = threading.Lock()

    def __call__(self, _body: Any) -> Reply:
        with self._lock:
            self.times.append(time.perf_counter())
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(self.delay)
        with self._lock:
            self.in_flight -= 1
        meta = {"prompt_tokens": 2, "completion_tokens": 2, "finish_reason": "length"}
        return Reply(events=[(0, {"text": "ab", "output_ids": [5, 6], "meta_info": meta})])


def _pilot(trace: Path, urls: dict[str, str], level: dict[str, Any]) -> Pilot:
    return make_pilot(
        endpoint_conditions(urls), target={"engine": "endpoint", "model": "m"},
        trace={"files": [str(trace)]},
        load={"levels": {"poisson": level}, "warmup_requests": 0, "passes": 2,
              "block_prompts": {"poisson": 100}},  # one block: the whole trace per stretch
        report={"html": False},
    )  # fmt: skip


@pytest.mark.slow  # over a second on 2 busy cores
def test_open_loop_sends_on_schedule_and_pairs_conditions(tmp_path: Path) -> None:
    n, rate = 12, 25.0
    trace_path = write_trace(tmp_path / "t.jsonl", n)
    seen = {"base": _Arrivals(), "cand": _Arrivals()}
    with ScriptedServer(routes=sglang_routes(seen["base"])) as a, \
            ScriptedServer(routes=sglang_routes(seen["cand"])) as b:
        pilot = _pilot(trace_path, {"base": a.url, "cand": b.url}, {"rate": rate})
        data = Campaign(pilot, load_trace([trace_path]), tmp_path / "res", ["base", "cand"]).run()
    assert len(data.records) == 2 * 2 * n and all(r.ok for r in data.records)
    assert {r.rate for r in data.records} == {rate}
    assert {r.concurrency for r in data.records} == {0}  # no cap
    for pass_index in (0, 1):
        plan = poisson_arrivals(n, rate, f"0:poisson:0:{pass_index}:0:greedy")
        for name in ("base", "cand"):
            got = np.array(seen[name].times[pass_index * n:(pass_index + 1) * n])
            # Each condition's requests reached the server at the stretch's planned offsets.
            offsets = np.sort(got - got.min())
            assert np.max(np.abs(offsets - np.array(plan))) < 0.1, (name, pass_index)
    lags = [r.dispatch_lag_s for r in data.records]
    assert all(lag is not None and lag >= 0 for lag in lags)
    assert float(np.median([lag for lag in lags if lag is not None])) < 0.05
    assert data.meta.load_levels == {"poisson": {"rate": rate, "max_concurrency": None}}
    figs = all_figures(data)
    assert {f.load_label for f in figs} == {"Poisson 25/s"}
    assert all(f.dispatch_lag_p99_s is not None and f.dispatch_lag_p99_s < 0.5 for f in figs)


@pytest.mark.slow  # over a second on 2 busy cores
def test_open_loop_cap_holds_requests_back_and_says_how_long(tmp_path: Path) -> None:
    n = 6
    trace_path = write_trace(tmp_path / "t.jsonl", n)
    slow = _Arrivals(delay=0.15)
    with ScriptedServer(routes=sglang_routes(slow)) as srv:
        # 100 arrivals/s against a server taking 0.15 s each, one in flight at most.
        pilot = _pilot(trace_path, {"base": srv.url}, {"rate": 100.0, "max_concurrency": 1})
        pilot = pilot.model_copy(update={"load": pilot.load.model_copy(update={"passes": 1})})
        data = Campaign(pilot, load_trace([trace_path]), tmp_path / "res", ["base"]).run()
    assert slow.most_in_flight == 1
    assert {r.concurrency for r in data.records} == {1}
    lags = sorted(r.dispatch_lag_s or 0.0 for r in data.records)
    # The last arrival waits for the five before it: about 5 x 0.15 s minus its arrival offset.
    assert lags[-1] > 0.4
