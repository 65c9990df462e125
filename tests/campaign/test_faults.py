"""No orphans under signals and crashes, nothing lost.

Whole pilot runs (``python -m pytest --osprey-config=...`` in its own session) boot the fake
SGLang server per condition; the test interrupts them (SIGINT, SIGTERM) during a boot and
during a replay, makes a server crash, a boot time out and single requests fail. After each:
no process of the run is left, records.jsonl holds every request completed before the fault,
campaign.json says what happened, and the exit code is never a pass.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.campaign.runner import Campaign
from pytest_osprey.pilot.trace import load_trace
from pytest_osprey.results.files import write_json_atomic, write_text_atomic
from pytest_osprey.results.folder import load_campaign
from pytest_osprey.results.records import RecordWriter, read_records
from testkit.factories import endpoint_conditions, make_pilot, make_record, write_pilot, write_trace
from testkit.fake_server import Reply, ScriptedServer, sglang_routes
from testkit.pilot_run import MARK, PilotRun, fake_sglang, gone, kill_marked, leftovers, wait_for

INTERRUPTED = pytest.ExitCode.INTERRUPTED
FAILED = pytest.ExitCode.TESTS_FAILED


@dataclass
class Outcome:
    """A finished (or killed) pilot run, read once for the tests that share it."""

    rc: int | None
    output: str
    leftovers: list[str]
    records: list[dict[str, Any]]
    campaign: dict[str, Any]
    answered: dict[str, int]
    pids: dict[str, set[int]]
    signalled_at: float | None = None
    results: set[str] = field(default_factory=set)
    summary: dict[str, Any] = field(default_factory=dict)

    def outcome(self, test_id: str) -> str | None:
        """PASSED / FAILED / ERROR of a test in the ``-rA`` summary."""
        m = re.search(rf"^(PASSED|FAILED|ERROR) \S*::{re.escape(test_id)}(\s|$)", self.output,
                      re.MULTILINE)  # fmt: skip
        return m.group(1) if m else None

    def ok_records(self, condition: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["condition"] == condition and r["ok"]]


def _collect(run: PilotRun, rc: int | None, signalled_at: float | None = None) -> Outcome:
    campaign_path = run.results / "campaign.json"
    summary = run.results / "summary.json"
    conditions = ("baseline", "cand")
    return Outcome(
        rc=rc,
        output=run.output(),
        leftovers=run.leftovers(),
        records=run.records(),
        campaign=run.campaign() if campaign_path.is_file() else {},
        answered={c: run.events(c).answered for c in conditions},
        pids={c: run.events(c).pids() for c in conditions},
        signalled_at=signalled_at,
        results={p.name for p in run.results.iterdir()} if run.results.is_dir() else set(),
        summary=json.loads(summary.read_text()) if summary.is_file() else {},
    )


def _setup(tmp: Path, **kw: Any) -> PilotRun:
    """A pilot run in ``tmp`` (see servers.pilot_run.fake_sglang for ``kw``), test outcomes
    shown."""
    events = tmp / "events"
    path = write_pilot(tmp, prompts=kw.pop("prompts", 4), **fake_sglang(events, **kw))
    (tmp / "work").mkdir()
    return PilotRun(tmp / "work", path, events, "-rA")


def _interrupted(tmp: Path, sig: int, during: str) -> Outcome:
    """Start a run, signal it during the baseline's boot or its third request, collect."""
    if during == "boot":
        base = {"OSPREY_FAKE_READY_AFTER": "8", "OSPREY_FAKE_SPAWN_CHILD": "1"}
    else:  # the third request never gets an answer: the signal lands mid-request
        base = {"OSPREY_FAKE_FAULTS": "3=hang", "OSPREY_FAKE_SPAWN_CHILD": "1"}
    run = _setup(tmp, base_env=base, order="interleaved")  # both servers up at the signal
    try:
        run.start()
        events = run.events("baseline")
        if during == "boot":
            assert wait_for(lambda: len(events.pids()) == 2, 60), run.output()
            time.sleep(0.3)
        else:
            assert wait_for(lambda: events.requests >= 3, 60), run.output()
        signalled_at = time.time()
        run.signal(sig)
        rc = run.wait(60)
        return _collect(run, rc, signalled_at)
    finally:
        run.cleanup()


def _crash(tmp: Path) -> Outcome:
    """The candidate's server dies (exit 9) right after answering its 2nd request of 4,
    leaving a child behind; two blocks, so the campaign meets the dead server again."""
    run = _setup(tmp, blocks=2, cand_env={"OSPREY_FAKE_CRASH_AFTER": "2",
                                          "OSPREY_FAKE_SPAWN_CHILD": "1"})  # fmt: skip
    try:
        return _collect(run, run.run(120))
    finally:
        run.cleanup()


FAULTS = "2=500,3=malformed,4=truncate,5=hang"


def _faults(tmp: Path) -> Outcome:
    """The candidate's requests 2-5 of 6 fail (HTTP 500, malformed SSE, truncated stream,
    no answer within request_timeout_s); a third condition never becomes healthy."""
    late = {"role": "candidate", "speculation": {"algorithm": "NGRAM"},
            "env": {"OSPREY_FAKE_EVENTS": str(tmp / "events" / "late.txt"),
                    "OSPREY_FAKE_NEVER_READY": "1", "OSPREY_FAKE_SPAWN_CHILD": "1"}}
    run = _setup(tmp, prompts=6, request_timeout_s=1.5, boot_timeout_s=5,
                 cand_env={"OSPREY_FAKE_FAULTS": FAULTS}, extra_conditions={"late": late})
    try:
        out = _collect(run, run.run(120))
        out.pids["late"] = run.events("late").pids()
        return out
    finally:
        run.cleanup()


# Every pilot run of this module, started together (they mostly wait: boots, timeouts).
JOBS: dict[str, Callable[[Path], Outcome]] = {
    "sigint-boot": lambda t: _interrupted(t, signal.SIGINT, "boot"),
    "faults": _faults,
    "crash": _crash,
    "sigint-replay": lambda t: _interrupted(t, signal.SIGINT, "replay"),
    "sigterm-boot": lambda t: _interrupted(t, signal.SIGTERM, "boot"),
    "sigterm-replay": lambda t: _interrupted(t, signal.SIGTERM, "replay"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome | BaseException]:
    out: dict[str, Outcome | BaseException] = {}
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {n: pool.submit(job, tmp_path_factory.mktemp(n)) for n, job in JOBS.items()}
        for name, future in futures.items():
            try:
                out[name] = future.result()
            except Exception as exc:  # reported by the tests of that run only
                out[name] = exc
    return out


def _get(runs: dict[str, Outcome | BaseException], name: str) -> Outcome:
    value = runs[name]
    if isinstance(value, BaseException):
        raise value
    return value


@pytest.fixture
def sigint_boot(runs: dict[str, Outcome | BaseException]) -> Outcome:
    return _get(runs, "sigint-boot")


@pytest.fixture
def sigint_replay(runs: dict[str, Outcome | BaseException]) -> Outcome:
    return _get(runs, "sigint-replay")


@pytest.fixture
def sigterm_boot(runs: dict[str, Outcome | BaseException]) -> Outcome:
    return _get(runs, "sigterm-boot")


@pytest.fixture
def sigterm_replay(runs: dict[str, Outcome | BaseException]) -> Outcome:
    return _get(runs, "sigterm-replay")


@pytest.fixture
def crash(runs: dict[str, Outcome | BaseException]) -> Outcome:
    return _get(runs, "crash")


@pytest.fixture
def faults(runs: dict[str, Outcome | BaseException]) -> Outcome:
    return _get(runs, "faults")


def _ended_cleanly(out: Outcome) -> None:
    """No process of the run left, the campaign marked interrupted, the exit code a failure."""
    assert out.leftovers == [], out.output[-3000:]
    for pids in out.pids.values():
        assert all(gone(p) for p in pids)
    assert out.rc not in (None, 0)
    assert out.campaign["status"] == "interrupted"
    assert out.campaign["ended_at"] is not None
    # What was measured is reported, marked, with no verdict.
    assert {"summary.json", "report.md"} <= out.results, out.output[-3000:]
    assert out.summary["status"] == "interrupted" and out.summary["partial"]
    assert all(v["verdict"] == "INCONCLUSIVE" for v in out.summary["verdicts"])


# --------------------------------------------------------------------------- SIGINT


@pytest.mark.slow  # over a second on 2 busy cores
def test_sigint_during_boot_stops_the_booting_server(sigint_boot: Outcome) -> None:
    out = sigint_boot
    assert out.rc == INTERRUPTED, out.output[-3000:]
    _ended_cleanly(out)
    assert out.records == []
    assert "KeyboardInterrupt" in out.output


def test_sigint_during_boot_takes_effect_at_once(sigint_boot: Outcome) -> None:
    # The fake server becomes healthy 8 s after it starts; Ctrl-C came ~0.3 s after.
    assert sigint_boot.signalled_at is not None
    took = sigint_boot.campaign["ended_at"] - sigint_boot.signalled_at
    assert took < 4, f"the campaign ended {took:.1f} s after Ctrl-C"


def test_sigint_during_replay_loses_nothing_and_leaves_nothing(sigint_replay: Outcome) -> None:
    out = sigint_replay
    assert out.rc == INTERRUPTED, out.output[-3000:]
    _ended_cleanly(out)
    # Requests 1 and 2 were answered, 3 was in flight: exactly two records, both complete.
    assert out.answered["baseline"] == 2
    assert len(out.ok_records("baseline")) == 2
    assert [r["prompt_id"] for r in out.records if r["condition"] == "baseline"] == ["p0", "p1"]
    assert all(r["ok"] for r in out.records if r["condition"] == "cand")  # if it went first
    fingerprints = out.campaign["conditions"]
    for name in ("baseline", "cand"):
        pids = fingerprints[name]["fingerprint"]["pids"]
        assert pids and all(gone(p) for p in pids)


# --------------------------------------------------------------------------- SIGTERM



def test_sigterm_during_boot_is_never_a_pass(sigterm_boot: Outcome) -> None:
    assert sigterm_boot.rc not in (None, 0)
    assert sigterm_boot.records == []


def test_sigterm_during_boot_leaves_no_orphans(sigterm_boot: Outcome) -> None:
    _ended_cleanly(sigterm_boot)


def test_sigterm_during_replay_loses_no_record(sigterm_replay: Outcome) -> None:
    out = sigterm_replay
    assert out.rc not in (None, 0)
    assert out.answered["baseline"] == 2
    baseline = [r for r in out.records if r["condition"] == "baseline"]
    assert len(out.ok_records("baseline")) == 2 == len(baseline)
    assert all(r["ok"] for r in out.records)  # the candidate's too, if it went first


def test_sigterm_during_replay_leaves_no_orphans(sigterm_replay: Outcome) -> None:
    _ended_cleanly(sigterm_replay)


# --------------------------------------------------------------------------- crash


def test_server_crash_leaves_nothing_and_keeps_every_answer(crash: Outcome) -> None:
    assert crash.rc not in (None, 0), crash.output[-3000:]
    assert crash.leftovers == []
    assert all(gone(p) for p in crash.pids["cand"])
    assert len(crash.pids["cand"]) == 2  # the server and the child it spawned
    assert crash.answered["cand"] == 2
    assert len(crash.ok_records("cand")) == 2
    failed = [r for r in crash.records if r["condition"] == "cand" and not r["ok"]]
    assert failed and all(r["error"] for r in failed)


def test_server_crash_fails_its_condition_and_the_campaign_goes_on(crash: Outcome) -> None:
    assert crash.campaign["status"] == "complete"
    error = crash.campaign["conditions"]["cand"]["error"] or ""
    assert "exit" in error or "died" in error, error
    assert len([r for r in crash.records if r["condition"] == "baseline"]) == 8
    assert crash.outcome("test_completed[cand-low]") == "FAILED"
    assert crash.outcome("test_completed[baseline-low]") == "PASSED"
    assert "summary.json" in crash.results
    # Labelled partial, its verdict withheld: the comparison lacks the crashed side.
    assert crash.summary["partial"].startswith(
        "condition 'cand' stopped mid-campaign (server exited with code 9 during pass 1")
    assert [v["verdict"] for v in crash.summary["verdicts"]] == ["INCONCLUSIVE"]


@pytest.mark.slow  # over a second on 2 busy cores
def test_server_crash_in_the_last_block_is_named(tmp_path: Path) -> None:
    # In process (no pytest around it): the Campaign itself, booting the fake SGLang servers.
    mark = str(tmp_path)
    sections = fake_sglang(tmp_path / "events", cand_env={"OSPREY_FAKE_CRASH_AFTER": "2"})
    sections["target"]["env"][MARK] = mark
    trace = write_trace(tmp_path / "trace.jsonl", 4)
    p = make_pilot(trace={"files": [str(trace)]}, **sections)
    try:
        campaign = Campaign(p, load_trace([trace]), tmp_path / "res",
                            ["baseline", "cand"]).run()  # fmt: skip
        assert leftovers(mark) == []
    finally:
        kill_marked(mark)
    assert campaign.meta.status == "complete"
    assert len([r for r in campaign.records if r.condition == "cand" and r.ok]) == 2
    assert campaign.condition_error("cand"), "campaign.json does not name the crash"


# --------------------------------------------------------------------------- boot timeout


def test_boot_timeout_fails_the_condition_and_kills_its_tree(faults: Outcome) -> None:
    out = faults
    assert out.rc == FAILED, out.output[-3000:]
    assert out.leftovers == []
    assert len(out.pids["late"]) == 2 and all(gone(p) for p in out.pids["late"])
    error = out.campaign["conditions"]["late"]["error"]
    assert "not healthy after 5 s" in error and "target.boot_timeout_s" in error
    assert out.campaign["status"] == "complete"
    assert out.outcome("test_completed[late-low]") == "FAILED"
    assert "late did not run: condition 'late': server not healthy" in out.output
    # The other conditions ran in full.
    assert len(out.ok_records("baseline")) == 6 == out.answered["baseline"]


# --------------------------------------------------------------------------- request faults


def test_request_faults_are_failed_records_and_the_campaign_goes_on(faults: Outcome) -> None:
    out = faults
    assert out.rc == FAILED, out.output[-3000:]
    assert out.leftovers == []
    cand = {r["prompt_id"]: r for r in out.records if r["condition"] == "cand"}
    assert list(cand) == [f"p{i}" for i in range(6)]  # every request recorded, in order
    assert [cand[f"p{i}"]["ok"] for i in range(6)] == [True, False, False, False, False, True]
    expected = {"p1": "HTTP 500", "p2": "malformed JSON", "p3": "truncated", "p4": "timed out"}
    for pid, needle in expected.items():
        assert needle in (cand[pid]["error"] or ""), cand[pid]
        assert cand[pid]["output_tokens"] is None
    assert cand["p5"]["output_ids"] == [100, 101, 102, 103]  # after the faults: served well
    assert out.answered["cand"] == 2
    assert out.outcome("test_completed[cand-low]") == "FAILED"
    assert out.outcome("test_completed[baseline-low]") == "PASSED"
    gate = next(g for g in out.summary["gates"]
                if g["id"] == "cand-low" and g["kind"] == "completed")  # fmt: skip
    assert gate["outcome"] == "fail" and gate["details"] == {"ok": 2, "total": 6}
    assert "HTTP 500" in gate["summary"]


# --------------------------------------------------------------------------- results files

_WRITER = """
import sys
from pathlib import Path
from pytest_osprey.results.files import write_json_atomic
path = Path(sys.argv[1])
docs = [{"n": i, "pad": [i] * 200_000} for i in range(2)]
print("ready", flush=True)
i = 0
while True:
    write_json_atomic(path, docs[i % 2])
    i += 1
"""


@pytest.mark.slow  # over a second on 2 busy cores
def test_write_json_atomic_killed_mid_write_leaves_a_whole_file(tmp_path: Path) -> None:
    """A writer SIGKILLed at any moment: the file is the old or the new document, whole."""
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"n": -1})
    for delay in (0.05, 0.13, 0.21, 0.34):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)],
                                stdout=subprocess.PIPE, start_new_session=True)  # fmt: skip
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            time.sleep(delay)
        finally:
            proc.kill()
            proc.wait(10)
        data = json.loads(path.read_text())
        assert data["n"] in (-1, 0, 1)
        assert data.get("pad", [data["n"]] * 200_000) == [data["n"]] * 200_000


def test_atomic_writes_that_fail_keep_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, report = tmp_path / "campaign.json", tmp_path / "report.md"
    write_json_atomic(path, {"status": "running"})
    write_text_atomic(report, "# old\n")
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(ValueError):
        write_json_atomic(path, loop)  # not serializable: nothing is written
    assert json.loads(path.read_text()) == {"status": "running"}

    def crash(*_a: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)  # dies between writing and publishing
    with pytest.raises(OSError):
        write_json_atomic(path, {"status": "complete"})
    with pytest.raises(OSError):
        write_text_atomic(report, "# new\n")
    assert json.loads(path.read_text()) == {"status": "running"}
    assert report.read_text() == "# old\n"


@pytest.mark.slow  # over a second on 2 busy cores
def test_write_json_atomic_two_writers(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    docs = [{"who": w, "pad": "x" * 300_000} for w in range(2)]
    write_json_atomic(path, docs[0])
    errors: list[BaseException] = []
    torn: list[str] = []
    stop = time.monotonic() + 1.0

    def writer(doc: dict[str, Any]) -> None:
        while time.monotonic() < stop:
            try:
                write_json_atomic(path, doc)
            except Exception as exc:
                errors.append(exc)

    def reader() -> None:
        while time.monotonic() < stop:
            text = path.read_text()
            try:
                json.loads(text)
            except ValueError:
                torn.append(text[-40:])

    threads = [threading.Thread(target=writer, args=(d,)) for d in docs]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"{len(errors)} writes failed, first: {errors[0]!r}"
    assert not torn, f"a reader saw {len(torn)} torn files"


def test_records_are_append_only_and_flushed_per_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as w:
        w.write(make_record("c", "p0"))
        w.write(make_record("c", "p1"))
    before = path.read_bytes()
    # A crash mid-write tore the next line: reopening cuts the torn tail only.
    with path.open("ab") as fh:
        fh.write(b'{"run_id":"r","condition":"c","blo')
    w = RecordWriter(path)
    try:
        assert path.read_bytes() == before
        w.write(make_record("c", "p2"))
        # Readable at once, by another handle, before any close or sync.
        assert [r.prompt_id for r in read_records(path)] == ["p0", "p1", "p2"]
        assert path.read_bytes().startswith(before)
    finally:
        w.close()


def _generate(_body: Any) -> Reply:
    meta = {"prompt_tokens": 2, "completion_tokens": 2, "finish_reason": "length"}
    return Reply(events=[(0, {"text": "ab", "output_ids": [5, 6], "meta_info": meta})])


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_rerun_into_the_same_folder_is_judged_on_its_own_records(tmp_path: Path) -> None:
    trace_path = write_trace(tmp_path / "t.jsonl", 3)
    trace = load_trace([trace_path])
    with ScriptedServer(routes=sglang_routes(_generate)) as srv:
        p = make_pilot(
            conditions=endpoint_conditions({"base": srv.url}),
            target={"engine": "endpoint", "model": "m"}, trace={"files": [str(trace_path)]},
            load={"levels": {"low": 1}, "warmup_requests": 0, "blocks": 1},
            report={"html": False},
        )  # fmt: skip
        first = Campaign(p, trace, tmp_path / "res", ["base"]).run()
        second = Campaign(p, trace, tmp_path / "res", ["base"]).run()
    assert len(first.records) == 3
    lines = (tmp_path / "res" / "records.jsonl").read_text().splitlines()
    assert len(lines) == 6  # append-only: the first run's records are kept
    assert {r.run_id for r in second.records} == {second.meta.run_id}
    assert len(load_campaign(tmp_path / "res").records) == 3
