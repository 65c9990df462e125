"""Whole pilot runs for fault and security tests: ``python -m pytest --osprey-config=...`` in
its own session, booting the fake SGLang server (testkit/fakepkgs) per condition.

Each condition's fake server appends its events (pids, requests, answers) to its own file
under an events folder (``OSPREY_FAKE_EVENTS``, see fake_engine.py). Every process of a run
carries that folder in its environment, which is how :meth:`PilotRun.leftovers` finds what
survived a run, and how :meth:`PilotRun.cleanup` ends it without ever touching another
process (never by name).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil

SERVERS = Path(__file__).resolve().parent  # testkit
FAKEPKGS = SERVERS / "fakepkgs"
# Plugins this venv carries that a pilot run does not need: seconds of start-up each.
QUIET = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark",
         "-p", "no:anyio"]  # fmt: skip


def fake_target(engine: str = "sglang", env: Mapping[str, str] | None = None,
                **more: Any) -> dict[str, Any]:
    """A pilot's target that boots the fake ``engine`` server (fakepkgs) with this Python."""
    return {"engine": engine, "model": "fake-model", "python": sys.executable,
            "env": {"PYTHONPATH": str(FAKEPKGS), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
            "boot_timeout_s": 30, **more}  # fmt: skip


def fake_sglang(
    events: Path,
    *,
    base_env: Mapping[str, str] | None = None,
    cand_env: Mapping[str, str] | None = None,
    blocks: int = 1,
    levels: Mapping[str, int] | None = None,
    order: str = "sequential",
    boot_timeout_s: float = 30,
    request_timeout_s: float = 30,
    html: bool = False,
    target: Mapping[str, Any] | None = None,
    extra_conditions: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The sections of a two-condition pilot on the fake SGLang server (baseline + an NGRAM
    candidate: no drafter to check), each server noting its events under ``events``; for
    factories.make_pilot / write_pilot, which add the trace. ``blocks``: passes over the trace.
    Sequential order by default: each condition's requests contiguous, in trace order, so a
    fault planted at a server's n-th request lands where the test expects it."""
    events.mkdir(parents=True, exist_ok=True)

    def env(name: str, more: Mapping[str, str] | None) -> dict[str, str]:
        return {"OSPREY_FAKE_EVENTS": str(events / f"{name}.txt"), **(more or {})}

    return {
        "name": "faults",
        "target": {**fake_target("sglang", boot_timeout_s=boot_timeout_s), **(target or {})},
        "conditions": {
            "baseline": {"role": "baseline", "env": env("baseline", base_env)},
            "cand": {"role": "candidate", "speculation": {"algorithm": "NGRAM"},
                     "env": env("cand", cand_env)},
            **(extra_conditions or {}),
        },
        "load": {"levels": dict(levels or {"low": 1}), "warmup_requests": 0,
                 "passes": blocks, "order": order, "request_timeout_s": request_timeout_s,
                 "block_prompts": {name: 100 for name in (levels or {"low": 1})}},
        "decision": {"early_stop": False},
        "report": {"html": html},
    }  # fmt: skip


class Events:
    """What one fake server said it did (``start PID HOST PORT``, ``request PID N`` ...)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[list[str]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        return [line.split() for line in text.splitlines() if line.strip()]

    def of(self, kind: str) -> list[list[str]]:
        return [parts[1:] for parts in self.lines() if parts[0] == kind]

    @property
    def pid(self) -> int | None:
        starts = self.of("start")
        return int(starts[-1][0]) if starts else None

    @property
    def host(self) -> str | None:
        starts = self.of("start")
        return starts[-1][1] if starts else None

    def pids(self) -> set[int]:
        return {int(p[0]) for p in self.of("start") + self.of("child")}

    def prompts(self) -> list[str]:
        """The texts the server was sent for generation, in arrival order."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line.split(" ", 2)[2]) for line in text.splitlines()
                if line.startswith("prompt ")]

    @property
    def requests(self) -> int:
        return len(self.of("request"))

    @property
    def answered(self) -> int:
        return len(self.of("answered"))


def wait_for(what: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(step)
    return what()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def servers_left(conditions: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """(every server pid campaign.json's fingerprints name, those still alive): whatever a
    pilot's outcome, its servers must be gone (checked by pid, never by name)."""
    pids = [p for c in conditions.values() for p in c["fingerprint"].get("pids", [])]
    return pids, [p for p in pids if not gone(p)]


MARK = "OSPREY_FAKE_RUN"


def marked(mark: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``OSPREY_FAKE_RUN=mark``: the pytest run,
    the fake servers it booted and any child they spawned (they inherit it)."""
    mine = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARK) == mark:
                mine.append(proc)
    return mine


def leftovers(mark: str, timeout: float = 1.0) -> list[str]:
    """Marked processes still alive after ``timeout`` (to finish dying), described."""
    wait_for(lambda: not marked(mark), timeout, step=0.1)
    out = []
    for p in marked(mark):
        with contextlib.suppress(psutil.Error):
            out.append(f"{p.pid} {' '.join(p.cmdline())[:200]}")
    return out


def kill_marked(mark: str) -> None:
    procs = marked(mark)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=5)


class PilotRun:
    """One ``pytest --osprey-config`` subprocess in a new session (so a test can signal it
    alone), its terminal output in a file."""

    def __init__(self, cwd: Path, pilot_path: Path, events: Path, *args: str,
                 env: Mapping[str, str] | None = None) -> None:  # fmt: skip
        self.cwd = cwd
        self.events_dir = events
        self.out_path = cwd.parent / f"{cwd.name}-terminal.txt"
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("PYTEST_", "OSPREY_")) and k != "GITHUB_STEP_SUMMARY"}
        self.env = {**base, "PYTHONDONTWRITEBYTECODE": "1", MARK: str(events), **(env or {})}
        # Ctrl-C must reach pytest even where this test runs with SIGINT ignored (a
        # background job): set Python's handler explicitly, as an interactive start has it.
        main = ("import signal, sys, pytest; "
                "signal.signal(signal.SIGINT, signal.default_int_handler); "
                "sys.exit(pytest.main())")
        self.argv = [sys.executable, "-c", main, f"--osprey-config={pilot_path}",
                     "--osprey-results=res", *QUIET, "-q", *args]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def results(self) -> Path:
        return self.cwd / "res"

    def events(self, condition: str) -> Events:
        return Events(self.events_dir / f"{condition}.txt")

    def start(self) -> PilotRun:
        with self.out_path.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        return self

    def run(self, timeout: float = 60) -> int:
        return self.start().wait(timeout)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"pytest still running after {timeout:g} s; output:\n{self.output()[-3000:]}"
            ) from None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)  # the pytest process only, as a terminal's kill would

    def output(self) -> str:
        try:
            return self.out_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ------------------------------------------------------------------ leftovers

    def processes(self) -> list[psutil.Process]:
        return marked(str(self.events_dir))

    def leftovers(self, timeout: float = 1.0) -> list[str]:
        """What of this run is still alive (given ``timeout`` to finish dying)."""
        return leftovers(str(self.events_dir), timeout)

    def cleanup(self) -> None:
        """Kill whatever of this run is left: the pytest session, then each process found by
        its mark (pids only, never by name)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        kill_marked(str(self.events_dir))

    # ------------------------------------------------------------------ results

    def records(self) -> list[dict[str, Any]]:
        """records.jsonl, every line a JSON object (a torn or invalid line fails the test)."""
        path = self.results / "records.jsonl"
        if not path.is_file():
            return []
        text = path.read_text("utf-8")
        assert text == "" or text.endswith("\n"), "records.jsonl ends with a torn line"
        return [json.loads(line) for line in text.splitlines()]

    def campaign(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.results / "campaign.json").read_text("utf-8"))
        return data


def run_two_shards(root: Path, pilot: Path) -> None:
    """Shards 1 and 2 of ``pilot`` run in this process into ``root/s1`` and ``root/s2``; the
    fake servers marked with ``root`` are ended whatever happens."""
    from pytest_osprey.run.pilot_run import PilotRun, RunOptions
    from pytest_osprey.shards.plan import Shard

    try:
        for k in (1, 2):
            run = PilotRun(pilot, RunOptions(results=root / f"s{k}", shard=Shard(k, 2)))
            assert run.run().exit_code in (0, 1)
    finally:
        kill_marked(str(root))
