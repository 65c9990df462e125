"""Security: loopback by default, API keys never written, model output escaped, no stray files.

One whole pilot run (its own pytest session, cwd in a temporary folder) boots the fake SGLang
server per condition with a required API key, and talks to an already running endpoint with
another key; every condition streams back ``<script>alert(1)</script>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from html import escape as html_escape
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from pytest_osprey.engines.base import BootSpec, EngineError, GenerationRequest
from pytest_osprey.engines.process import choose_port
from pytest_osprey.engines.sglang.engine import SGLangEngine, sglang_argv
from pytest_osprey.engines.vllm.engine import VLLMEngine, vllm_argv
from pytest_osprey.pilot.schema import Pilot
from testkit.factories import make_pilot, write_pilot
from testkit.pilot_run import (
    MARK,
    SERVERS,
    PilotRun,
    fake_sglang,
    fake_target,
    kill_marked,
    leftovers,
    wait_for,
)

XSS = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
HTML_ID = "<img src=x onerror=alert(2)>"  # a prompt id is free text too
KEY_ENV, EP_KEY_ENV = "OSPREY_TEST_API_KEY", "OSPREY_TEST_ENDPOINT_KEY"


# --------------------------------------------------------------------------- binding


def _pilot(engine: str, mark: str = "", **target: Any) -> Pilot:
    return make_pilot(
        {"base": {"role": "baseline"},
         "cand": {"role": "candidate", "speculation": {"algorithm": "ngram"}}},
        target=fake_target(engine, env={MARK: mark}, **target),
    )  # fmt: skip


def _host(argv: list[str]) -> str:
    return argv[argv.index("--host") + 1]


def test_server_command_lines_bind_loopback_unless_the_pilot_says_otherwise() -> None:
    for engine, argv_of in (("sglang", sglang_argv), ("vllm", vllm_argv)):
        for cond in ("base", "cand"):
            assert _host(argv_of(_pilot(engine), cond, 30000)) == "127.0.0.1"
            wide = _pilot(engine, host="0.0.0.0")
            assert _host(argv_of(wide, cond, 30000)) == "0.0.0.0"


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("engine_cls", [SGLangEngine, VLLMEngine])
def test_booted_server_listens_on_loopback_only(engine_cls: Any, tmp_path: Path) -> None:
    mark = str(tmp_path)
    engine = engine_cls(_pilot(engine_cls.__name__[:-6].lower(), mark), "base",
                        BootSpec("base", log_dir=tmp_path))  # fmt: skip
    try:
        engine.start()
        assert engine.server is not None
        listening = [
            c.laddr for pid in engine.server.pids()
            for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]  # fmt: skip
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
        res = asyncio.run(engine.generate(GenerationRequest("p", "Hi", 2, want_margins=False)))
        assert res.ok, res.error
    finally:
        engine.stop()
        kill_marked(mark)


def test_boot_failure_message_masks_the_key(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed boot reports the command line and the log's tail: both with the key masked."""
    key = f"osk-{secrets.token_hex(16)}"
    monkeypatch.setenv(KEY_ENV, key)
    mark = str(tmp_path)
    p = _pilot("sglang", mark, api_key_env=KEY_ENV, engine_args=["--crash-after", "0"])
    engine = SGLangEngine(p, "base", BootSpec("base", log_dir=tmp_path))
    try:
        with pytest.raises(EngineError) as exc:
            engine.start()
    finally:
        engine.stop()
        kill_marked(mark)
    msg = str(exc.value)
    assert "exited with code 3" in msg and "fake server argv:" in msg
    assert "--config" in msg and key not in msg
    assert key not in (tmp_path / "base.log").read_text()


# --------------------------------------------------------------------------- a whole run


@dataclass
class SecureRun:
    run: PilotRun
    rc: int
    keys: tuple[str, str]
    before: dict[str, tuple[int, int]]
    after: dict[str, tuple[int, int]]
    root: Path


def _snapshot(root: Path, skip: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``root`` (but ``skip``): relative path -> (size, mtime) of
    a file, (-1, 0) of a folder (whose mtime moves with temporary files come and gone, e.g.
    pytest's capture files in $TMPDIR)."""
    out = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if rel.split("/")[0] in skip:
            continue
        st = path.lstat()
        out[rel] = (st.st_size, st.st_mtime_ns) if path.is_file() else (-1, 0)
    return out


@contextlib.contextmanager
def _endpoint(events: Path, key: str) -> Iterator[str]:
    """An already running fake SGLang server that requires ``key`` (not booted by osprey)."""
    mark = f"{events}-endpoint"
    events.mkdir(parents=True, exist_ok=True)
    port = choose_port("127.0.0.1", 0, "ep")
    env = {**os.environ, "VLLM_API_KEY": key, "OSPREY_FAKE_TEXT": XSS, MARK: mark,
           "OSPREY_FAKE_EVENTS": str(events / "ep.txt"), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, str(SERVERS / "fake_engine.py"), "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            return False

        assert wait_for(lambda: proc.poll() is None and up(), 30), "the endpoint did not start"
        yield url
    finally:
        proc.kill()
        proc.wait(10)
        kill_marked(mark)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureRun]:
    root = tmp_path_factory.mktemp("secure")
    keys = (f"osk-{secrets.token_hex(16)}", f"osk-ep-{secrets.token_hex(16)}")
    (root / "pilot").mkdir()
    (root / "work").mkdir()
    (root / "tmpdir").mkdir()
    events = root / "events"
    skip = ("events", "work-terminal.txt")
    with _endpoint(events, keys[1]) as url:
        ep = {"role": "candidate",
              "endpoint": {"url": url, "protocol": "sglang", "api_key_env": EP_KEY_ENV}}
        text = {"OSPREY_FAKE_TEXT": XSS}
        path = write_pilot(root / "pilot", prompts=3, **fake_sglang(
            events, html=True, base_env=text, cand_env=text, extra_conditions={"ep": ep},
            target={"api_key_env": KEY_ENV}))  # fmt: skip
        trace = root / "pilot" / "trace.jsonl"
        first = json.dumps({"id": HTML_ID, "domain": "chat", "prompt": "Hi",
                            "max_new_tokens": 4})  # fmt: skip
        trace.write_text(first + "\n" + trace.read_text())  # first: the report shows it
        before = _snapshot(root, skip)
        run = PilotRun(root / "work", path, events, "-rA", env={
            KEY_ENV: keys[0], EP_KEY_ENV: keys[1], "TMPDIR": str(root / "tmpdir")})
        try:
            rc = run.run(120)
            assert run.leftovers() == []
        finally:
            run.cleanup()
    assert leftovers(f"{events}-endpoint") == []
    yield SecureRun(run, rc, keys, before, _snapshot(root, skip), root)


@pytest.mark.slow  # over a second on 2 busy cores
def test_the_run_used_the_keys(secure: SecureRun) -> None:
    """Every server required its key (the fake answers 401 without it): all requests ok."""
    records = secure.run.records()
    assert {r["condition"] for r in records} == {"baseline", "cand", "ep"}
    assert all(r["ok"] for r in records), [r["error"] for r in records if not r["ok"]]
    assert secure.run.events("ep").answered == 4
    assert secure.rc in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), secure.run.output()
    log = (secure.run.results / "logs" / "baseline.log").read_text()
    assert "api_key='***'" in log  # the server logged its arguments: masked on the way in
    assert "--api-key" not in log and "--config" in log  # the key went by a 0600 file
    assert secure.run.events("baseline").host == secure.run.events("cand").host == "127.0.0.1"


def test_api_keys_appear_in_no_result_file_and_no_output(secure: SecureRun) -> None:
    results = secure.run.results
    files = sorted(p for p in results.rglob("*") if p.is_file())
    names = {p.relative_to(results).as_posix() for p in files}
    assert {"records.jsonl", "campaign.json", "preflight.json", "summary.json", "report.md",
            "report.html", "pilot.yaml", "logs/baseline.log", "logs/cand.log"} <= names
    for key in secure.keys:
        raw = key.encode()
        for path in files:
            assert raw not in path.read_bytes(), f"API key written to {path}"
        assert key not in secure.run.output(), "API key in the terminal output"
        # Pilot copies (pilot.yaml, campaign.json's pilot_text) were checked above.


def test_html_report_escapes_model_output(secure: SecureRun) -> None:
    html = (secure.run.results / "report.html").read_text("utf-8")
    assert ESCAPED in html
    assert "<script" not in html.lower() and "<img src=x" not in html
    assert html_escape(HTML_ID) in html
    records = secure.run.records()
    assert records and all(r["output_text"] == XSS for r in records)  # recorded verbatim


def test_nothing_is_written_outside_the_results_folder(secure: SecureRun) -> None:
    before, after = secure.before, secure.after
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    outside = sorted(p for p in changed if not p.startswith("work/res"))
    assert outside == [], f"written outside the results folder: {outside}"
    assert "work/res/summary.json" in changed
