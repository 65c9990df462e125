"""Partial campaigns are labelled, never judged as complete.

An interrupted or failed campaign writes summary.json and both reports marked INTERRUPTED,
with what was measured and no verdict, and exits non-zero. A campaign.json left at
``running`` by a process that is gone reads ``killed``. Re-judging a partial folder
(``report DIR``, ``--reuse``/``--osprey-reuse``) says so before anything else and prints no
KEEP or DROP.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.campaign import runner as runner_module
from pytest_osprey.results.campaign_file import CampaignFile, incomplete_note, live_status
from testkit.endpoint_pilot import run_cli, saved_results, sglang_routes, write_endpoint_pilot
from testkit.factories import ROOT
from testkit.fake_server import ScriptedServer
from testkit.pilot_run import QUIET


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_results(tmp_path_factory.mktemp("saved"), prompts=3)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _left_running(saved: Path, folder: Path, *, pid: int, node: str | None = None,
                  drop: int = 2) -> Path:
    """A copy of ``saved`` as a writer that stopped mid-campaign left it: status running,
    its last ``drop`` records missing."""
    shutil.copytree(saved, folder)
    meta = json.loads((folder / "campaign.json").read_text())
    meta.update(status="running", ended_at=None, writer_pid=pid)
    meta["host"]["node"] = node or platform.node()
    (folder / "campaign.json").write_text(json.dumps(meta))
    lines = (folder / "records.jsonl").read_text().splitlines(keepends=True)
    (folder / "records.jsonl").write_text("".join(lines[:-drop]))
    for name in ("summary.json", "report.md"):
        (folder / name).unlink()
    return folder


# --------------------------------------------------------------------------- the status


@pytest.mark.slow  # over a second on 2 busy cores
def test_running_with_the_writer_gone_reads_killed(saved: Path, tmp_path: Path) -> None:
    meta = CampaignFile.model_validate(json.loads((saved / "campaign.json").read_text()))
    assert live_status(meta) == "complete" and incomplete_note(meta, 6) is None
    started = time.time() - 100  # the campaign began well before the processes below
    dead = meta.model_copy(update={"status": "running", "writer_pid": _dead_pid(),
                                   "started_at": started})
    assert live_status(dead) == "killed"
    note = incomplete_note(dead, 4)
    assert note is not None and "it was killed" in note and "4 of 6 greedy" in note
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as alive:
        try:
            # A live pid started after the campaign is a recycled one: still killed.
            later = dead.model_copy(update={"writer_pid": alive.pid})
            assert live_status(later) == "killed"
            mine = later.model_copy(update={"started_at": time.time() + 10})
            assert live_status(mine) == "running"
        finally:
            alive.kill()
    elsewhere = dead.model_copy(update={"host": {"node": "another-host"}})
    assert live_status(elsewhere) == "running"


def test_report_of_a_killed_campaign_says_so_first_and_gives_no_verdict(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _left_running(saved, tmp_path / "res", pid=_dead_pid())
    assert run_cli(["report", str(folder)]) == 2
    out = capsys.readouterr()
    first = out.err.splitlines()[0]
    assert first.startswith(f"warning: {folder}: INTERRUPTED: campaign.json still says running")
    assert "it was killed" in first and "4 of 6 greedy requests measured" in first
    verdicts = [line for line in out.out.splitlines() if line.startswith(
        ("KEEP", "DROP", "INCONCLUSIVE"))]
    assert verdicts and all(v.startswith("INCONCLUSIVE cand: INTERRUPTED, no verdict: ")
                            for v in verdicts)
    copy = next(folder.glob("rejudged-*"))
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["status"] == "killed" and "it was killed" in summary["partial"]
    gating_passes = [g for g in summary["gates"] if g["gating"] and g["outcome"] == "pass"
                     and g["kind"] not in ("command_line", "artifact")]
    assert gating_passes == []
    md = (copy / "report.md").read_text().splitlines()
    assert md[2].startswith("> **INTERRUPTED** &mdash; campaign.json still says running")


def test_reuse_of_a_partial_folder_says_so_first(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _left_running(saved, tmp_path / "res", pid=_dead_pid())
    with ScriptedServer(routes=sglang_routes()) as srv:
        pilot = write_endpoint_pilot(tmp_path / "p", srv.url)
        assert run_cli(["run", str(pilot), "--reuse", str(folder)]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines()[0].startswith(f"warning: {folder}: INTERRUPTED: ")
    assert "KEEP" not in out.out and "DROP" not in out.out


@pytest.mark.slow  # over a second on 2 busy cores
def test_pytest_reuse_of_a_partial_folder_warns_in_the_header_and_fails(
    saved: Path, tmp_path: Path
) -> None:
    folder = _left_running(saved, tmp_path / "res", pid=_dead_pid())
    with ScriptedServer(routes=sglang_routes()) as srv:
        pilot = write_endpoint_pilot(tmp_path / "p", srv.url)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("GITHUB_STEP_SUMMARY", None)
        done = subprocess.run(
            [sys.executable, "-m", "pytest", *QUIET, f"--osprey-config={pilot}",
             f"--osprey-reuse={folder}", "-p", "no:benchmark"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert done.returncode != 0, out[-3000:]
    header = out.index(f"osprey warning: {folder}: INTERRUPTED: ")
    assert header < out.index("collected"), "the warning must come before the tests"
    assert "KEEP cand" not in out and "DROP cand" not in out
    assert "INCONCLUSIVE cand: INTERRUPTED, no verdict:" in out


# --------------------------------------------------------------------------- runs that stop


def _stop_after(n: int, error: BaseException) -> Any:
    """A RecordWriter.write that raises ``error`` once ``n`` records are written."""
    real = runner_module.RecordWriter.write

    def write(self: Any, record: Any) -> None:
        if self.count >= n:
            raise error
        real(self, record)

    return write


@pytest.mark.parametrize(("error", "code", "says"), [
    (KeyboardInterrupt(), 2, "the campaign was interrupted (SIGINT (Ctrl-C))"),
    (RuntimeError("engine fell over"), 1, "(error: RuntimeError: engine fell over)"),
])
def test_a_stopped_campaign_reports_what_it_measured_with_no_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    error: BaseException, code: int, says: str,
) -> None:
    monkeypatch.setattr(runner_module.RecordWriter, "write", _stop_after(3, error))
    with ScriptedServer(routes=sglang_routes()) as srv:
        pilot = write_endpoint_pilot(tmp_path / "p", srv.url, prompts=4, html=True)
        assert run_cli(["run", str(pilot), "--results", str(tmp_path / "res")]) == code
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    res = tmp_path / "res"
    assert {"summary.json", "report.md", "report.html", "campaign.json"} <= set(os.listdir(res))
    meta = json.loads((res / "campaign.json").read_text())
    assert meta["status"] == "interrupted" and meta["writer_pid"] == os.getpid()
    summary = json.loads((res / "summary.json").read_text())
    assert says in summary["partial"] and "3 of 8 greedy requests measured" in summary["partial"]
    assert [v["verdict"] for v in summary["verdicts"]] == ["INCONCLUSIVE"]
    # What was measured is shown (the plan alternates conditions: the 3 are split).
    assert sum(f["ok"] for f in summary["figures"]) == 3
    html = (res / "report.html").read_text()
    assert html.index("INTERRUPTED") < html.index("<h1>")
    assert f"INTERRUPTED: {summary['partial']}" in out.err


@pytest.mark.slow  # over a second on 2 busy cores
def test_a_condition_that_stopped_mid_campaign_withholds_only_what_involves_it(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A candidate's server crashed in block 1 (campaign.json says so, its records stop):
    the reports say so first and its verdict is withheld; the other candidate, judged on
    whole data, keeps its own."""
    folder = saved_results(tmp_path_factory.mktemp("crash"), prompts=3,
                           candidates=("cand", "cand2"))
    meta = json.loads((folder / "campaign.json").read_text())
    meta["conditions"]["cand"]["error"] = "server exited with code 9 during block 1"
    (folder / "campaign.json").write_text(json.dumps(meta))
    lines = (folder / "records.jsonl").read_text().splitlines(keepends=True)
    kept = [line for line in lines if '"condition":"cand"' not in line]
    kept += [line for line in lines if '"condition":"cand"' in line][:1]
    (folder / "records.jsonl").write_text("".join(kept))
    code = run_cli(["report", str(folder)])
    assert code == 1  # the campaign ran to its end: not an interrupted one (2)
    capsys.readouterr()
    summary = json.loads(next(folder.glob("rejudged-*/summary.json")).read_text())
    assert summary["status"] == "complete"
    assert summary["partial"] == ("condition 'cand' stopped mid-campaign (server exited with "
                                  "code 9 during block 1); 1 of its 3 greedy requests "
                                  "measured")
    verdicts = {v["candidate"]: v for v in summary["verdicts"]}
    assert verdicts["cand"]["verdict"] == "INCONCLUSIVE"
    assert verdicts["cand"]["reasons"][0].startswith("INTERRUPTED, no verdict: condition 'cand'")
    assert not any("no verdict" in r for r in verdicts["cand2"]["reasons"])
    cand2 = [g for g in summary["gates"] if g["condition"] == "cand2"]
    assert cand2 and not any("campaign incomplete" in g["summary"] for g in cand2)
