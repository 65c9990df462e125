"""Results folders: never reused silently, never overwritten by re-judging, and every
filesystem problem (a file in the way, a read-only or full file system, a missing step-summary
folder, a garbage results folder) is one line, never a traceback.

Whole runs go through ``python -m pytest_osprey`` against an in-test SGLang-speaking server
(seconds each). Read-only and full file systems are real: a tiny tmpfs in a user namespace
(skipped where the machine allows none), besides an in-process ENOSPC that always runs.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_osprey.results import records as records_module
from pytest_osprey.run.folders import default_results
from testkit import tinyfs
from testkit.endpoint_pilot import run_cli, saved_results, sglang_routes, tree, write_endpoint_pilot
from testkit.factories import ROOT
from testkit.fake_server import ScriptedServer

FUZZ = settings(deadline=None, database=None, max_examples=40,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
TINYFS = pytest.mark.skipif(not tinyfs.available(),
                            reason="no user namespace with tmpfs on this machine")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete results folder (read-only for the tests: copy it to change it)."""
    return saved_results(tmp_path_factory.mktemp("saved"))


@pytest.fixture
def copy(saved: Path, tmp_path: Path) -> Path:
    out = tmp_path / "res"
    shutil.copytree(saved, out)
    return out


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(routes=sglang_routes()) as srv:
        yield srv


def _one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# --------------------------------------------------------------------------- never reused


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_run_into_a_non_empty_folder_is_refused_and_touches_nothing(
    copy: Path, tmp_path: Path, server: ScriptedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(copy)
    pilot = write_endpoint_pilot(tmp_path / "p", server.url)
    assert run_cli(["run", str(pilot), "--results", str(copy)]) == 4
    line = _one_error(capsys.readouterr().err)
    assert f"results folder {copy} is not empty (it holds campaign.json and " in line
    assert "choose a new folder" in line and "--reuse DIR" in line
    assert tree(copy) == before


@FUZZ
@given(names=st.lists(st.text(st.characters(codec="utf-8", exclude_characters="/\x00"),
                              min_size=1, max_size=20).filter(lambda n: n not in (".", "..")),
                      min_size=1, max_size=4, unique=True))
def test_any_content_in_the_folder_refuses_a_run(
    tmp_path_factory: pytest.TempPathFactory, server: ScriptedServer, names: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    work = tmp_path_factory.mktemp("busy")
    folder = work / "res"
    folder.mkdir()
    for name in names:
        (folder / name).write_bytes(b"x")
    pilot = write_endpoint_pilot(work / "p", server.url)
    assert run_cli(["run", str(pilot), "--dry-run", "--results", str(folder)]) == 4
    line = _one_error(capsys.readouterr().err)
    first = sorted(names)[0]
    assert f"it holds {first if first.isprintable() else repr(first)}" in line
    assert sorted(os.listdir(folder)) == sorted(names)


def test_a_file_in_place_of_the_folder(tmp_path: Path, server: ScriptedServer,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "res").write_text("mine")
    pilot = write_endpoint_pilot(tmp_path / "p", server.url)
    assert run_cli(["run", str(pilot), "--results", str(tmp_path / "res")]) == 4
    assert "it is a file, not a folder" in _one_error(capsys.readouterr().err)
    assert (tmp_path / "res").read_text() == "mine"


def test_an_empty_folder_is_fine_and_default_folders_never_collide(
    tmp_path: Path, server: ScriptedServer
) -> None:
    (tmp_path / "empty").mkdir()
    pilot = write_endpoint_pilot(tmp_path / "p", server.url)
    assert run_cli(["run", str(pilot), "--dry-run", "--results", str(tmp_path / "empty")]) == 0
    assert (tmp_path / "empty" / "preflight.json").is_file()
    made = {default_results(tmp_path, "same") for _ in range(5)}  # same second, 5 folders
    assert len(made) == 5 and all(p.parent == tmp_path / "osprey-results" for p in made)


# --------------------------------------------------------------------------- re-judging


def _rejudged(folder: Path) -> list[Path]:
    return sorted(folder.glob("rejudged-*"))


def test_report_writes_a_marked_copy_and_never_the_original(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(copy)
    for n in (1, 2):
        assert run_cli(["report", str(copy)]) in (0, 1)
        assert len(_rejudged(copy)) == n  # a new folder each time
    assert {k: v for k, v in tree(copy).items() if not k.startswith("rejudged-")} == before
    new = _rejudged(copy)[-1]
    summary = json.loads((new / "summary.json").read_text())
    assert summary["rejudged"]["pilot"] == "the pilot saved in campaign.json"
    assert summary["rejudged"]["source"] == str(copy)
    original = json.loads(before["summary.json"])
    assert original["rejudged"] is None
    assert {k: v for k, v in summary.items() if k != "rejudged"} == {
        k: v for k, v in original.items() if k != "rejudged"}
    assert "_Re-judged copy (" in (new / "report.md").read_text()
    assert str(new / "summary.json") in capsys.readouterr().out


def test_reuse_writes_a_marked_copy_or_into_a_new_folder(
    copy: Path, tmp_path: Path, server: ScriptedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(copy)
    pilot = write_endpoint_pilot(tmp_path / "p", server.url)
    assert run_cli(["run", str(pilot), "--reuse", str(copy)]) in (0, 1)
    assert len(_rejudged(copy)) == 1
    assert run_cli(["run", str(pilot), "--reuse", str(copy), "--results",
                    str(tmp_path / "other")]) in (0, 1)
    summary = json.loads((tmp_path / "other" / "summary.json").read_text())
    assert summary["rejudged"]["pilot"] == str(pilot)
    assert {k: v for k, v in tree(copy).items() if not k.startswith("rejudged-")} == before
    assert "booting" not in capsys.readouterr().out


def test_report_judges_under_the_pilot_saved_in_campaign_json(
    copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (copy / "pilot.yaml").unlink()
    assert run_cli(["report", str(copy)]) in (0, 1)
    text = json.loads((copy / "campaign.json").read_text())["pilot_text"]
    strict = tmp_path / "strict.yaml"
    strict.write_text(text.replace("report:", "limits: {speedup_min: 900}\nreport:"))
    assert run_cli(["report", str(copy), "--config", str(strict)]) == 1  # DROP now
    assert "DROP cand" in capsys.readouterr().out
    meta = json.loads((copy / "campaign.json").read_text())
    meta["pilot_text"] = None
    (copy / "campaign.json").write_text(json.dumps(meta))
    assert run_cli(["report", str(copy)]) == 4
    assert "give the limits with --config PILOT" in _one_error(capsys.readouterr().err)


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                       lambda c: st.lists(c, max_size=3) | st.dictionaries(
                           st.text(max_size=12), c, max_size=4), max_leaves=12)
CAMPAIGN_KEYS = ["schema", "run_id", "status", "conditions", "prompt_ids", "load_levels",
                 "blocks", "pilot_text", "writer_pid", "host", "schedule", "trace_files"]


@pytest.mark.slow  # over a second on 2 busy cores
@FUZZ
@given(garbage=st.one_of(
    st.binary(max_size=200),
    JSONISH.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(CAMPAIGN_KEYS), JSONISH, min_size=1).map(
        lambda d: json.dumps(d).encode())),
    which=st.sampled_from(["campaign.json", "records.jsonl", "preflight.json"]))
def test_a_garbage_results_folder_is_one_line_never_a_traceback(
    saved: Path, tmp_path_factory: pytest.TempPathFactory, server: ScriptedServer,
    garbage: bytes, which: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """Whatever campaign.json, records.jsonl or preflight.json holds: ``report`` and
    ``run --reuse`` judge it or refuse it in one line (exit 4), and never crash."""
    work = tmp_path_factory.mktemp("garbage")
    folder = work / "res"
    shutil.copytree(saved, folder)
    (folder / which).write_bytes(garbage)
    pilot = write_endpoint_pilot(work / "p", server.url)
    for argv in (["report", str(folder)], ["run", str(pilot), "--reuse", str(folder)]):
        code = run_cli(argv)
        out = capsys.readouterr()
        assert code in (0, 1, 2, 4), (argv, code, out.err)
        assert "Traceback" not in out.err and "internal error" not in out.err, out.err
        if code == 4:
            _one_error(out.err)


# --------------------------------------------------------------------------- filesystem faults


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_missing_step_summary_folder_is_a_warning_not_a_failure(
    tmp_path: Path, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Both conditions are one server: a speedup about 1x is never below 0.5x, and a speed
    # left undecided by 3 prompts is skipped, so the run's own exit code is 0 whatever the
    # noise and only the step summary could change it.
    pilot = write_endpoint_pilot(tmp_path / "p", server.url,
                                 extra={"limits": {"speedup_min": 0.5},
                                        "decision": {"inconclusive": "skip"}})
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert run_cli(["run", str(pilot), "--results", str(tmp_path / "ref")]) == 0
    capsys.readouterr()
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "no" / "such" / "summary.md"))
    assert run_cli(["run", str(pilot), "--results", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if "GITHUB_STEP_SUMMARY" in line]
    assert warning == [f"warning: GITHUB_STEP_SUMMARY={tmp_path}/no/such/summary.md: cannot "
                       "append the report (No such file or directory); step summary skipped"]
    assert {"summary.json", "report.md"} <= set(os.listdir(tmp_path / "b"))
    assert "Traceback" not in err


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_full_disk_mid_campaign_is_one_line_and_reports_what_was_measured(
    tmp_path: Path, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ENOSPC from the records file after two records: the campaign stops, the error is one
    line, summary.json and report.md say INTERRUPTED with the two records."""
    real = records_module.RecordWriter.write

    def write(self: Any, record: Any) -> None:
        if self.count >= 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        real(self, record)

    monkeypatch.setattr(records_module.RecordWriter, "write", write)
    pilot = write_endpoint_pilot(tmp_path / "p", server.url, prompts=4)
    assert run_cli(["run", str(pilot), "--results", str(tmp_path / "res")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "campaign error: campaign stopped: No space left on device (the disk is full)" in err
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "No space left" in summary["partial"]
    assert all(v["verdict"] == "INCONCLUSIVE" for v in summary["verdicts"])
    assert "2 of 8 greedy requests measured" in summary["partial"]
    assert (tmp_path / "res" / "report.md").read_text().splitlines()[2].startswith(
        "> **INTERRUPTED**")


def _pythonpath() -> dict[str, str]:
    root = ROOT
    return {"PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.slow  # over a second on 2 busy cores
@TINYFS
def test_a_really_full_disk_is_one_line_for_run_and_report(
    saved: Path, tmp_path: Path, server: ScriptedServer
) -> None:
    pilot = write_endpoint_pilot(tmp_path / "p", server.url, prompts=60)
    mnt = tmp_path / "mnt"
    run = tinyfs.run_on_tmpfs(mnt, 16, tinyfs.osprey("run", str(pilot), "--results",
                                                     str(mnt / "res")), env=_pythonpath())
    assert run.returncode in (1, 4), run.stdout + run.stderr
    assert "Traceback" not in run.stderr and "No space left on device" in run.stderr
    assert len([line for line in run.stderr.splitlines() if "error" in line]) <= 2, run.stderr
    used = sum(-(-len(v) // 4096) * 4 for v in tree(saved).values())  # tmpfs pages, KiB
    rep = tinyfs.run_on_tmpfs(mnt, used + 12, tinyfs.osprey("report", str(mnt)), seed=saved,
                              env=_pythonpath())
    assert rep.returncode == 4, rep.stdout + rep.stderr
    assert _one_error(rep.stderr).startswith("error: reports not written: No space left")


@pytest.mark.slow  # over a second on 2 busy cores
@TINYFS
def test_a_read_only_file_system_is_one_line_for_run_and_report(
    saved: Path, tmp_path: Path, server: ScriptedServer
) -> None:
    pilot = write_endpoint_pilot(tmp_path / "p", server.url)
    mnt = tmp_path / "ro"
    for argv, says in (
        (tinyfs.osprey("run", str(pilot), "--results", str(mnt / "res")), "Read-only file"),
        (tinyfs.osprey("report", str(mnt)), "not writable (read-only file system"),
        (tinyfs.osprey("run", str(pilot), "--reuse", str(mnt)), "not writable"),
    ):
        done = tinyfs.run_on_tmpfs(mnt, 1024, argv, seed=saved, read_only=True,
                                   env=_pythonpath())
        assert done.returncode == 4, done.stdout + done.stderr
        assert says in _one_error(done.stderr)


def test_two_runs_racing_into_one_new_folder_one_proceeds(tmp_path: Path) -> None:
    """Runs started at the same moment into one new --results folder all see it empty; the
    exclusive claim lets exactly one through and refuses the others in one line."""
    import threading

    from pytest_osprey.run.folders import LOCK, FolderError, fresh_results

    def race(folder: Path, runs: int) -> tuple[list[Path], list[str]]:
        start = threading.Barrier(runs)
        won: list[Path] = []
        refused: list[str] = []

        def go() -> None:
            start.wait()
            try:
                won.append(fresh_results(folder, "--reuse"))
            except FolderError as exc:
                refused.append(str(exc))

        threads = [threading.Thread(target=go) for _ in range(runs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return won, refused

    for attempt in range(20):
        folder = tmp_path / f"race-{attempt}"
        won, refused = race(folder, 6)
        assert len(won) == 1 and len(refused) == 5
        assert all("\n" not in m and str(folder) in m for m in refused)
        assert (folder / LOCK).read_text().startswith("pid ")


def test_a_run_releases_only_its_own_lock(tmp_path: Path) -> None:
    from pytest_osprey.run.folders import LOCK, fresh_results, release

    mine = fresh_results(tmp_path / "mine", "--reuse")
    release(mine)
    assert not (mine / LOCK).exists()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / LOCK).write_text("pid 1 started 2026-01-01T00:00:00Z\n")
    release(theirs)  # another process's claim stays
    assert (theirs / LOCK).exists()
    release(tmp_path / "never-claimed")  # nothing there: nothing to do


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("entry", ["cli", "pytest"])
@pytest.mark.parametrize("stdout", ["closed", "reader gone"])
def test_a_closed_or_broken_stdout_keeps_the_measurement(tmp_path: Path, stdout: str,
                                                         entry: str) -> None:
    """`run ... >&-` and `run ... | head -c 100` (the command line or pytest): the terminal
    output is lost, the run is not: its folder is complete and the exit code is the run's
    (the one `report` gives its folder), not an internal error."""
    import subprocess
    import sys

    from pytest_osprey.__main__ import main
    from testkit.pilot_run import QUIET

    with ScriptedServer(routes=sglang_routes()) as srv:
        pilot = write_endpoint_pilot(tmp_path, srv.url, 3)
        argv = ([sys.executable, "-m", "pytest_osprey", "run", str(pilot), "--results",
                 str(tmp_path / "res")] if entry == "cli" else
                [sys.executable, "-m", "pytest", *QUIET, f"--osprey-config={pilot}",
                 "--osprey-results", str(tmp_path / "res")])
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if stdout == "closed":
            proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  env=env, timeout=240, close_fds=True, cwd=tmp_path,
                                  preexec_fn=lambda: os.close(1))
            code, err = proc.returncode, proc.stderr.decode()
        else:
            with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=env, cwd=tmp_path) as run:
                assert run.stdout is not None and run.stderr is not None
                run.stdout.read(100)
                run.stdout.close()  # the reader goes away after 100 bytes
                err = run.stderr.read().decode()
                code = run.wait(timeout=240)
    assert code in (0, 1), err
    assert "internal error" not in err and "Traceback" not in err
    assert "INTERNALERROR" not in err
    res = tmp_path / "res"
    assert {"summary.json", "report.md", "campaign.json", "records.jsonl"} <= set(os.listdir(res))
    assert code == main(["report", str(res)])  # the exit the folder's judgement gives


@pytest.fixture(scope="module")
def one_saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One complete small campaign, copied by each test that tampers with it."""
    return saved_results(tmp_path_factory.mktemp("saved"))


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("fault", ["missing", "empty", "folder", "fifo", "edited pilot",
                                   "unrelated pilot", "duplicated"])
def test_a_folder_that_is_not_what_it_claims(tmp_path: Path, fault: str,
                                            one_saved: Path) -> None:
    """Re-judging a tampered or broken complete campaign: refused in one line (exit 4), except
    duplicated lines, which are collapsed (each request counted once) and said so."""
    import subprocess
    import sys

    res = tmp_path / "res"
    shutil.copytree(one_saved, res)
    records = res / "records.jsonl"
    lines = records.read_bytes()
    config: list[str] = []
    if fault == "missing":
        records.unlink()
    elif fault == "empty":
        records.write_bytes(b"")
    elif fault == "folder":
        records.unlink()
        records.mkdir()
    elif fault == "fifo":
        records.unlink()
        os.mkfifo(records)
    elif fault == "edited pilot":
        meta = json.loads((res / "campaign.json").read_text())
        meta["pilot_text"] = meta["pilot_text"].replace("speedup_min", "speedup_min ", 1) + "\n"
        (res / "campaign.json").write_text(json.dumps(meta))
    elif fault == "unrelated pilot":
        other = tmp_path / "other"
        other.mkdir()
        config = ["--config", str(write_endpoint_pilot(other, "http://127.0.0.1:9", 3,
                                                       candidates=("someone-else",)))]
    else:
        records.write_bytes(lines + lines)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_osprey", "report", str(res), *config],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    if fault == "duplicated":
        assert proc.returncode in (0, 1), proc.stderr
        assert "duplicated record line(s) collapsed" in proc.stderr
        return
    assert proc.returncode == 4, (proc.returncode, proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    said = {"missing": "missing", "empty": "without a record", "folder": "not a regular file",
            "fifo": "not a regular file", "edited pilot": "changed after the run",
            "unrelated pilot": "not a pilot of this campaign"}[fault]
    assert said in proc.stderr, proc.stderr


@pytest.mark.parametrize("field,value", [("accept_length", 1e9), ("ttft_s", float("nan")),
                                         ("spec_verify_ct", -3), ("e2e_s", float("inf"))])
def test_an_impossible_value_in_saved_records_is_a_failed_request_not_a_fact(
    copy: Path, capsys: pytest.CaptureFixture[str], field: str, value: float
) -> None:
    """records.jsonl edited after the run (or written by a version that did not check): the
    record with a value no server can report is judged as a failed request, and said."""
    path = copy / "records.jsonl"
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    assert first["ok"]
    first[field] = value
    lines[0] = json.dumps(first)  # NaN and Infinity as Python's json writes them
    path.write_text("\n".join(lines) + "\n")
    assert run_cli(["report", str(copy)]) == 1  # the completed-requests gate fails
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "1 record(s) with an impossible value" in out.out + \
        out.err
    summary = json.loads((_rejudged(copy)[-1] / "summary.json").read_text())
    completed = [g for g in summary["gates"] if g["kind"] == "completed"
                 and g["condition"] == first["condition"] and g["load"] == first["load"]]
    assert completed and completed[0]["outcome"] == "fail"
    assert "NaN" not in (_rejudged(copy)[-1] / "summary.json").read_text()
