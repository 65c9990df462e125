"""``--osprey-compare``: real pilot runs (pytest in a subprocess) against two scripted servers
whose speed the test sets, so the truth of "regressed or not" is known."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.judgement.history import HistoryError, open_previous
from pytest_osprey.results.folder import load_campaign
from testkit.factories import endpoint_conditions, write_pilot
from testkit.fake_server import Reply, ScriptedServer, sglang_routes
from testkit.pilot_run import QUIET


class _Speed:
    """/generate answering after ``seconds`` (+-10% jitter), settable between runs."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._rng = random.Random(1)
        self._lock = threading.Lock()

    def __call__(self, _body: Any) -> Reply:
        with self._lock:
            delay = self.seconds * self._rng.uniform(0.9, 1.1)
        meta = {"prompt_tokens": 2, "completion_tokens": 4, "finish_reason": "length"}
        return Reply(events=[(delay, {"text": "abcd", "output_ids": [5, 6, 7, 8],
                                      "meta_info": meta})])  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A first campaign keeping a 2x-faster candidate; then the same candidate unchanged, and
    the candidate three times slower; each compared with the first."""
    import subprocess
    import sys

    tmp = tmp_path_factory.mktemp("history")
    base, cand = _Speed(0.04), _Speed(0.02)
    out: dict[str, Any] = {"dir": tmp}

    def run(name: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", *QUIET, "-p", "no:cacheprovider",
             f"--osprey-config={tmp / 'pilot.yaml'}", f"--osprey-results={tmp / name}", *extra],
            cwd=tmp, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    with ScriptedServer(routes=sglang_routes(base)) as b, \
            ScriptedServer(routes=sglang_routes(cand)) as c:
        write_pilot(
            tmp, endpoint_conditions({"baseline": b.url, "cand": c.url}), prompts=10,
            name="history", target={"engine": "endpoint", "model": "m"},
            load={"levels": {"low": 1}, "warmup_requests": 0, "blocks": 2},
            # Wide enough that a busy shared machine's jitter is not a regression; 3x slower
            # still is.
            decision={"regression_tolerance": 0.2}, report={"html": False},
        )
        out["first"] = run("first")
        out["same"] = run("same", f"--osprey-compare={tmp / 'first'}")
        cand.seconds = 0.06
        out["slower"] = run("slower", f"--osprey-compare={tmp / 'first'}")
    return out


@pytest.mark.slow  # over a second on 2 busy cores
def test_first_campaign_keeps_the_candidate(runs: dict[str, Any]) -> None:
    first = runs["first"]
    assert first.returncode == 0, first.stdout + first.stderr
    assert "KEEP cand" in first.stdout


def test_an_unchanged_drafter_does_not_regress(runs: dict[str, Any]) -> None:
    same = runs["same"]
    assert same.returncode == 0, same.stdout + same.stderr
    assert "REGRESSION" not in same.stdout
    summary = json.loads((runs["dir"] / "same" / "summary.json").read_text())
    comp = summary["comparison"]
    assert comp["kept"] == ["cand"] and comp["previous_dir"].endswith("first")
    checks = {f["check"]: f for f in comp["findings"]}
    assert set(checks) >= {"verdict", "speedup", "latency"}
    assert not any(f["regression"] for f in comp["findings"])
    # Same server speed: as fast as before, within 20%.
    assert abs(checks["latency"]["current"] - 1.0) < 0.2


def test_a_slower_drafter_is_flagged(runs: dict[str, Any]) -> None:
    slower = runs["slower"]
    out = slower.stdout
    assert slower.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "FAILED" in out and "test_no_regression[cand]" in out
    assert "cand regressed since" in out and "REGRESSION" in out
    comp = json.loads((runs["dir"] / "slower" / "summary.json").read_text())["comparison"]
    flagged = {f["check"] for f in comp["findings"] if f["regression"]}
    # 3x slower: dropped (slower than the baseline), its speedup and its own latency regressed.
    assert flagged == {"verdict", "speedup", "latency"}
    latency = next(f for f in comp["findings"] if f["check"] == "latency")
    assert latency["current"] < 0.5 and latency["ci"][1] < 0.8
    # The baseline did not change: the slowdown is the drafter's, not the machine's.
    assert "both slower" not in latency["text"]


def test_compare_refuses_another_trace(runs: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="prompt trace differs"):
        open_previous(runs["dir"] / "first", "0" * 64)
    with pytest.raises(HistoryError, match="not a judged results folder"):
        open_previous(tmp_path, "0" * 64)
    with pytest.raises(HistoryError, match="no such folder"):
        open_previous(tmp_path / "nope", "0" * 64)


def test_compare_refuses_an_interrupted_campaign(runs: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(runs["dir"] / "first", copy)
    meta = json.loads((copy / "campaign.json").read_text())
    meta["status"] = "interrupted"
    (copy / "campaign.json").write_text(json.dumps(meta))
    with pytest.raises(HistoryError, match="did not complete"):
        open_previous(copy, str(load_campaign(copy).meta.trace_hash))


@pytest.mark.slow  # over a second on 2 busy cores
def test_compare_refusal_is_a_usage_error(runs: dict[str, Any]) -> None:
    import subprocess
    import sys

    tmp = runs["dir"]
    trace, other = tmp / "trace.jsonl", tmp / "other.jsonl"
    other.write_text(trace.read_text().replace("Hello", "Hi"))
    text = (tmp / "pilot.yaml").read_text().replace(str(trace), str(other))
    (tmp / "other.yaml").write_text(text)
    res = subprocess.run(
        [sys.executable, "-m", "pytest", *QUIET, f"--osprey-config={tmp / 'other.yaml'}",
         f"--osprey-compare={tmp / 'first'}"], cwd=tmp, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert res.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--osprey-compare:" in res.stderr and "prompt trace differs" in res.stderr


def test_report_command_rejudges_with_the_comparison(runs: dict[str, Any], tmp_path: Path) -> None:
    import shutil

    from pytest_osprey.__main__ import main

    copy = tmp_path / "slower"
    shutil.copytree(runs["dir"] / "slower", copy)
    before = json.loads((copy / "summary.json").read_text())
    assert main(["report", str(copy), "--compare", str(runs["dir"] / "first")]) == 1  # DROP
    rejudged = next(copy.glob("rejudged-*"))
    after = json.loads((rejudged / "summary.json").read_text())
    assert after["comparison"]["findings"] == before["comparison"]["findings"]
    assert "Compared with an earlier campaign" in (rejudged / "report.md").read_text()
    assert main(["report", str(copy), "--compare", str(tmp_path / "nope")]) == 4
