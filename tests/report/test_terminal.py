"""What a user sees in the terminal: real pilot runs (pytest and ``python -m pytest_osprey``
in subprocesses) against two scripted servers, the candidate twice as fast. Progress, the
osprey table, the headline verdict - and pytest-benchmark's banner and tables only when a
benchmark output is asked for. A dry run lists what it checked and leaves no folder."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testkit.factories import ROOT, dump_pilot, endpoint_conditions, pilot_data, write_trace
from testkit.fake_server import Reply, ScriptedServer


def _routes(delay: float) -> dict[tuple[str, str], Any]:
    meta = {"prompt_tokens": 2, "completion_tokens": 4, "finish_reason": "length"}
    gen = Reply(events=[(delay, {"text": "abcd", "output_ids": [5, 6, 7, 8],
                                 "meta_info": meta})])
    return {("GET", "/health"): Reply(json_body={}), ("POST", "/flush_cache"): Reply(json_body={}),
            ("POST", "/generate"): gen}  # fmt: skip


def _pilot(path: Path, trace: Path, base: str, cand: str) -> Path:
    return dump_pilot(path, pilot_data(
        endpoint_conditions({"baseline": base, "cand": cand}), name="terminal",
        target={"engine": "endpoint", "model": "m"}, trace={"files": [str(trace)]},
        load={"levels": {"low": 1, "busy": 2}, "warmup_requests": 0, "blocks": 2},
        sampling={"greedy": True}, decision={"primary_load": "busy"}, report={"html": False}))


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env_args = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:anyio"]
    return subprocess.run([sys.executable, "-m", "pytest", *env_args, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("terminal")
    trace = write_trace(tmp / "t.jsonl", 8)
    out: dict[str, Any] = {"dir": tmp}
    with ScriptedServer(routes=_routes(0.04)) as b, ScriptedServer(routes=_routes(0.02)) as c:
        pilot = _pilot(tmp / "pilot.yaml", trace, b.url, c.url)
        out["plain"] = _run(tmp, f"--osprey-config={pilot}", "--osprey-results=plain")
        out["bench"] = _run(tmp, f"--osprey-config={pilot}", "--osprey-results=bench",
                            f"--benchmark-json={tmp / 'bench.json'}")
        out["cli"] = subprocess.run(
            [sys.executable, "-m", "pytest_osprey", "run", str(pilot), "--results", "cli"],
            cwd=tmp, capture_output=True, text=True, timeout=300)
    out["dry"] = _run(tmp, f"--osprey-config={pilot}", "--osprey-dry-run")
    out["cli_dry"] = subprocess.run(
        [sys.executable, "-m", "pytest_osprey", "run", str(pilot), "--dry-run"],
        cwd=tmp, capture_output=True, text=True, timeout=300)
    return out


def _closing(text: str) -> list[str]:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("set-up:")), None)
    assert start is not None, text
    return lines[start:]


@pytest.mark.slow  # over a second on 2 busy cores
def test_quiet_terminal_without_benchmark_output(outputs: dict[str, Any]) -> None:
    res = outputs["plain"]
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    assert "benchmark:" not in out  # pytest-benchmark's banner
    assert "benchmark 'osprey" not in out and "test_latency_series" not in out
    assert "Legend:" not in out and "OPS" not in out
    assert re.search(r"\[osprey\] greedy pass 1 of 2: (\d+)/\1 requests", out)  # progress
    closing = _closing(out)
    header = closing[1]
    for column in ("ok/total", "speedup [95% CI]", "tok/s", "req/s", "accept", "in flight"):
        assert column in header
    latency = next(line for line in closing[2:] if line.startswith("condition "))
    for column in ("TTFT p50/p95 ms", "TPOT p50/p95 ms", "completion p50/p95 ms"):
        assert column in latency
    base_row = next(line for line in closing if line.startswith("baseline ") and "busy" in line)
    assert base_row.count("n/a") >= 2  # no speedup, no accept length: speculation is off
    cand_row = next(line for line in closing if line.startswith("cand ") and "busy x2" in line)
    assert "x [" in cand_row  # its speedup with a CI
    table = closing[1:closing.index("")]
    assert max(len(line) for line in table) <= 120, "\n".join(table)
    assert any(line.startswith("campaign: ") and "pass" in line for line in closing)
    # No ETA from one request; a timed pass's line says what is left of the campaign.
    assert not re.search(r" 1/\d+ requests, ETA", out), out
    assert re.search(r"greedy pass 1 of 2: (\d+)/\1 requests, campaign ETA \d", out), out
    verdict = next(line for line in closing if line.startswith("KEEP cand:"))
    assert len(verdict) <= 160 and "speedup" in verdict and "at busy" in verdict
    assert "p=" not in verdict and "[cand-" not in verdict
    assert any(line.startswith("results: ") and "plain" in line for line in closing)
    # A skipped gate's reason is one line of pytest's short summary.
    assert re.search(r"^SKIPPED \[\d+\] .*: (could not have failed|reported only)", out, re.M), out
    # The reason (after pytest's "path:line: ", whose length depends on where pytest runs) fits
    # a wide terminal line.
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    reasons = [re.sub(r"^SKIPPED \[\d+\] \S+:\d+: ", "", line) for line in skipped]
    assert skipped and max(map(len, reasons)) <= 160, skipped
    assert not any("not evaluable): not evaluable" in line for line in skipped), skipped
    # Short: the whole session, progress included, fits a screen or two.
    assert len(out.splitlines()) < 70, out


def test_benchmark_tables_and_json_when_asked(outputs: dict[str, Any]) -> None:
    res = outputs["bench"]
    assert res.returncode == 0, res.stdout + res.stderr
    assert "benchmark:" in res.stdout and "benchmark 'osprey busy e2e'" in res.stdout
    bench = json.loads((outputs["dir"] / "bench.json").read_text())
    names = {b["param"] for b in bench["benchmarks"]}
    assert names == {f"{c}-{lv}-{m}" for c in ("baseline", "cand") for lv in ("low", "busy")
                     for m in ("e2e", "ttft")}


def test_cli_run_prints_the_same_closing_lines(outputs: dict[str, Any]) -> None:
    cli, plain = outputs["cli"], outputs["plain"]
    assert cli.returncode == 0, cli.stdout + cli.stderr
    # Progress of each pass, to its end (early stopping may end the run after pass 1).
    assert re.search(r"\[osprey\] greedy pass \d of 2: (\d+)/\1 requests", cli.stdout)
    closing = _closing(cli.stdout)
    assert closing[1] == _closing(plain.stdout)[1]  # the same table header
    assert any(line.startswith("KEEP cand: speedup") for line in closing)
    assert "\x1b[" not in cli.stdout  # no colour codes into a pipe


@pytest.mark.parametrize("which", ["dry", "cli_dry"])
def test_dry_run_lists_its_checks_and_leaves_no_folder(outputs: dict[str, Any],
                                                       which: str) -> None:
    res = outputs[which]
    assert res.returncode == 0, res.stdout + res.stderr
    assert "dry run: nothing was booted; checked:" in res.stdout
    assert "baseline: command line ok: endpoint http://127.0.0.1:" in res.stdout
    assert "cand: command line ok" in res.stdout
    # Before anything runs, both adapters say what it will cost.
    # The expected time first; the worst case only where none is known (endpoints here).
    assert re.search(r"expected time: known after warm-up \(the progress line's ETA\); campaign "
                     r"size: [\d,]+ requests .*judge memory about [\d,]+ MiB; at most "
                     r"[\d.,]+ (min|h) if every request ran to its timeout", res.stdout), res.stdout
    # With the greedy timed passes the only quality requests are the parameter probes
    # (off here): the quality passes' share is said, and is 0.
    assert re.search(r"; quality passes: 0 of ([\d,]+) requests, 0%;", res.stdout), res.stdout
    # ... and what the speed gate can see at each load level.
    assert re.search(r"speed: this design \(\d+ prompts, \d+ passes\) keeps a true speedup "
                     r"against speedup_min [\d.]+x with 80% power from: at x\d+ \(\d+ time "
                     r"units, df \d+\) [\d.]+x", res.stdout), res.stdout
    assert not (outputs["dir"] / "osprey-results").exists()


@pytest.mark.slow  # over a second on 2 busy cores
def test_help_describes_the_tool() -> None:
    res = subprocess.run([sys.executable, "-m", "pytest_osprey", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    assert "Keep or drop a speculative-decoding drafter" in res.stdout
    assert "examples:" in res.stdout and "run pilot.yaml --dry-run" in res.stdout
    sub = subprocess.run([sys.executable, "-m", "pytest_osprey", "run", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert "Run a pilot without pytest" in sub.stdout
