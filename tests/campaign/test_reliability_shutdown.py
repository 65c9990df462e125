"""Shutdown: SIGINT and SIGTERM end a run, servers included, within 5 s of the signal with a
slow request in flight; a SIGKILLed runner takes its servers with it.

CI runners escalate to SIGKILL about 10 s after their SIGTERM, so the budget is 5 s from the
signal to the runner's exit, measured here for both adapters (``pytest --osprey-config`` and
``python -m pytest_osprey run``), on the embedded engine (a generation of hundreds of tokens
in flight, which runs in a thread) and on a server engine (the fake SGLang server, its
answer never coming). Every run is also checked to leave no process behind and its partial
results reported.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.factories import ROOT, dump_pilot, pilot_data, write_trace
from testkit.pilot_run import PilotRun, fake_sglang, gone, wait_for

MODELS = ROOT / "fixtures" / "models"
BUDGET_S = 5.0
MEASURED: dict[str, float] = {}  # run -> seconds from the signal to the exit (printed below)


@dataclass
class Stopped:
    rc: int | None
    took_s: float
    output: str
    leftovers: list[str]
    summary: dict[str, Any]
    server_pids: set[int]


def _cli(run: PilotRun, pilot_path: Path) -> PilotRun:
    """The same run through ``python -m pytest_osprey run`` (Ctrl-C reaching Python even if
    this test runs with SIGINT ignored, as a background job does)."""
    main = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"sys.argv = ['pytest-osprey', 'run', {str(pilot_path)!r}, '--results', 'res']; "
            "from pytest_osprey.__main__ import cli; cli()")
    run.argv = [sys.executable, "-c", main]
    return run


def _embedded(tmp: Path) -> tuple[Path, Path]:
    """The tiny models, a short prompt then one of 900 tokens (tens of seconds here)."""
    events = tmp / "events"
    events.mkdir()
    trace = tmp / "trace.jsonl"
    trace.write_text(
        json.dumps({"id": "short", "domain": "chat", "prompt": "Hi", "max_new_tokens": 2})
        + "\n" + json.dumps({"id": "long", "domain": "chat", "prompt": "def f(x):",
                             "max_new_tokens": 900}) + "\n")
    data = pilot_data(
        {"baseline": {"role": "baseline"},
         "cand": {"role": "candidate", "drafter": str(MODELS / "tiny-drafter"),
                  "speculation": {"num_draft_tokens": 4}}},
        name="slow",
        target={"engine": "transformers", "model": str(MODELS / "tiny-target"),
                "context_length": 1024, "threads": 1},
        trace={"files": [str(trace)]},
        load={"levels": {"low": 1}, "warmup_requests": 0, "passes": 1},
        report={"html": False},
    )
    return dump_pilot(tmp / "pilot.yaml", data), events


def _server(tmp: Path, order: str = "sequential") -> tuple[Path, Path]:
    """The fake SGLang server per condition; the baseline's 2nd request is never answered.
    ``interleaved``: both servers are up when it hangs."""
    events = tmp / "events"
    trace = write_trace(tmp / "trace.jsonl", 3)
    data = {**fake_sglang(events, base_env={"OSPREY_FAKE_FAULTS": "2=hang",
                                            "OSPREY_FAKE_SPAWN_CHILD": "1"},
                          cand_env={"OSPREY_FAKE_SPAWN_CHILD": "1"}, order=order),
            "trace": {"files": [str(trace)]}}
    return dump_pilot(tmp / "pilot.yaml", data), events


def _stop(tmp: Path, engine: str, adapter: str, sig: int) -> Stopped:
    path, events = (_embedded if engine == "embedded" else _server)(tmp)
    (tmp / "work").mkdir()
    run = PilotRun(tmp / "work", path, events, "-rA")
    if adapter == "cli":
        _cli(run, path)
    try:
        run.start()
        def in_flight() -> bool:
            if engine == "embedded":  # the short prompt done: the long one is generating
                return re.search(r"greedy pass 1( of \d+)?: [12]/4 requests",
                             run.output()) is not None
            return run.events("baseline").requests >= 2  # the 2nd is never answered

        assert wait_for(in_flight, 600, step=0.2), run.output()[-3000:]
        time.sleep(0.5)
        t0 = time.monotonic()
        run.signal(sig)
        assert run.proc is not None
        rc: int | None = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            rc = run.proc.wait(60)
        took = time.monotonic() - t0
        summary = run.results / "summary.json"
        pids = set().union(*(run.events(c).pids() for c in ("baseline", "cand")))
        return Stopped(rc, took, run.output(), run.leftovers(),
                       json.loads(summary.read_text()) if summary.is_file() else {}, pids)
    finally:
        run.cleanup()


RUNS: dict[str, Callable[[Path], Stopped]] = {
    "embedded-pytest-SIGTERM": lambda t: _stop(t, "embedded", "pytest", signal.SIGTERM),
    "embedded-cli-SIGINT": lambda t: _stop(t, "embedded", "cli", signal.SIGINT),
    "server-pytest-SIGINT": lambda t: _stop(t, "server", "pytest", signal.SIGINT),
    "server-pytest-SIGTERM": lambda t: _stop(t, "server", "pytest", signal.SIGTERM),
    "server-cli-SIGTERM": lambda t: _stop(t, "server", "cli", signal.SIGTERM),
}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Stopped | BaseException]:
    out: dict[str, Stopped | BaseException] = {}
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {n: pool.submit(f, tmp_path_factory.mktemp(n)) for n, f in RUNS.items()}
        for name, future in futures.items():
            try:
                out[name] = future.result()
            except Exception as exc:  # reported by that run's test only
                out[name] = exc
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_a_signal_ends_the_run_within_5_s_with_a_request_in_flight(
    stopped: dict[str, Stopped | BaseException], name: str
) -> None:
    result = stopped[name]
    if isinstance(result, BaseException):
        raise result
    MEASURED[name] = result.took_s
    print(f"{name}: exited {result.took_s:.2f} s after the signal (rc {result.rc})")
    assert result.rc is not None, result.output[-3000:]
    assert result.took_s < BUDGET_S, f"{name}: {result.took_s:.1f} s\n{result.output[-3000:]}"
    assert result.rc == 2, result.output[-3000:]  # interrupted, never a pass
    assert result.leftovers == [] and all(gone(p) for p in result.server_pids)
    assert result.summary.get("status") == "interrupted", result.output[-3000:]
    assert re.search(r"the campaign was interrupted \(SIG(INT|TERM)", result.summary["partial"])
    assert "INTERRUPTED" in result.output


# --------------------------------------------------------------------------- SIGKILL


@pytest.mark.slow
def test_servers_die_with_a_sigkilled_runner(tmp_path: Path) -> None:
    """SIGKILL runs no cleanup in the runner: each server's watchdog ends its process group
    (the server and the child it spawned) within a second or so; ``report`` then calls the
    campaign killed."""
    path, events = _server(tmp_path, order="interleaved")
    (tmp_path / "work").mkdir()
    run = PilotRun(tmp_path / "work", path, events, "-rA")
    try:
        run.start()
        assert wait_for(lambda: run.events("baseline").requests >= 2, 300), run.output()
        pids = set().union(*(run.events(c).pids() for c in ("baseline", "cand")))
        assert len(pids) == 4  # two servers, a child each
        run.signal(signal.SIGKILL)
        t0 = time.monotonic()
        assert wait_for(lambda: all(gone(p) for p in pids), 10, step=0.05), run.leftovers()
        took = time.monotonic() - t0
        MEASURED["servers-after-SIGKILL"] = took
        print(f"servers gone {took:.2f} s after the runner's SIGKILL")
        assert took < 3.0
        assert run.leftovers() == []  # watchdogs included
    finally:
        run.cleanup()
    from testkit.endpoint_pilot import run_cli

    assert run_cli(["report", str(run.results)]) == 2
    meta = yaml.safe_load((run.results / "campaign.json").read_text())
    assert meta["status"] == "running"  # as the killed writer left it
