"""Server process lifecycle with real subprocesses (testkit/fake_engine.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from pytest_osprey.engines import process as proc
from pytest_osprey.engines.base import BootSpec, EngineError, GenerationRequest
from pytest_osprey.engines.sglang.engine import SGLangEngine
from pytest_osprey.engines.vllm.engine import FLUSHED, VLLMEngine
from pytest_osprey.pilot.schema import Pilot
from testkit.factories import make_pilot
from testkit.pilot_run import SERVERS, fake_target, gone

FAKE = SERVERS / "fake_engine.py"


@pytest.fixture
def tracked() -> Iterator[list[proc.ServerProcess]]:
    """Servers a test starts; whatever happens, every pid of theirs is ended afterwards."""
    servers: list[proc.ServerProcess] = []
    yield servers
    for server in servers:
        pids = server.pids()
        with contextlib.suppress(Exception):
            server.stop(grace_s=1)
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


@pytest.fixture
def make(tracked: list[proc.ServerProcess], tmp_path: Path) -> Callable[..., proc.ServerProcess]:
    def build(*flags: str, timeout: float = 20.0, secrets: tuple[str, ...] = ()) -> Any:
        # Short grace: the fake's stubborn children would otherwise hold each test 10 s.
        port = proc.choose_port("127.0.0.1", 0, "c")
        server = proc.ServerProcess(
            "c",
            [sys.executable, str(FAKE), "--port", str(port), *flags],
            env=dict(os.environ),
            log_path=tmp_path / "logs" / "c.log",
            health_url=f"http://127.0.0.1:{port}/health",
            boot_timeout_s=timeout,
            secrets=secrets,
            grace_s=1.0,
        )
        tracked.append(server)
        return server

    return build


@pytest.mark.slow  # over a second on 2 busy cores
def test_slow_boot_then_ready_then_nothing_left(make: Callable[..., Any]) -> None:
    server = make("--ready-after", "1.0", "--spawn-child")
    server.start()
    assert server.boot_s is not None and server.boot_s >= 1.0
    time.sleep(0.3)  # let the child start
    pids = server.pids()
    assert len(pids) == 2
    assert server.rss_mb() > 1
    assert server in proc.live_servers()
    server.stop()
    assert all(gone(p) for p in pids)
    assert server not in proc.live_servers()
    server.stop()  # idempotent
    assert "listening on" in server.log_path.read_text()


def test_crash_during_boot_reports_exit_code_and_log_tail(make: Callable[..., Any]) -> None:
    server = make("--crash-after", "0.2", "--exit-code", "7")
    with pytest.raises(EngineError) as exc:
        server.start()
    msg = str(exc.value)
    assert "'c'" in msg and "exited with code 7" in msg
    assert "fatal: boot failed on purpose" in msg
    assert server not in proc.live_servers()


@pytest.mark.slow  # over a second on 2 busy cores
def test_boot_timeout_reports_and_kills(make: Callable[..., Any]) -> None:
    server = make("--never-ready", "--spawn-child", "--ignore-sigterm", timeout=1.5)
    t0 = time.monotonic()
    with pytest.raises(EngineError) as exc:
        server.start()
    assert time.monotonic() - t0 < 10
    msg = str(exc.value)
    assert "not healthy after 1.5 s" in msg and "listening on" in msg
    assert "child pid" in msg
    child = int(msg.split("child pid ")[1].split()[0])
    assert gone(child) and gone(server.pid)


@pytest.mark.slow  # over a second on 2 busy cores
def test_sigterm_ignored_tree_and_escaped_child_are_killed(make: Callable[..., Any]) -> None:
    server = make("--ignore-sigterm", "--spawn-child", "--child-setsid")
    server.start()
    time.sleep(0.3)
    pids = server.pids()
    assert len(pids) == 2
    # The child left the process group (its own session): only the pid tree finds it.
    child = next(p for p in pids if p != server.pid)
    assert os.getpgid(child) != os.getpgid(server.pid)
    t0 = time.monotonic()
    server.stop(grace_s=1)
    assert time.monotonic() - t0 < 8
    assert all(gone(p) for p in pids)


def test_stop_all_stops_every_live_server(make: Callable[..., Any]) -> None:
    a, b = make(), make("--ignore-sigterm")
    a.launch()
    b.launch()
    pids = {a.pid, b.pid}
    proc.stop_all()
    assert all(gone(p) for p in pids)
    assert a not in proc.live_servers() and b not in proc.live_servers()


def test_secrets_are_masked_in_log_and_argv(make: Callable[..., Any]) -> None:
    server = make("--api-key", "s3cret-key", secrets=("s3cret-key",))
    server.start()
    assert "s3cret-key" not in " ".join(server.printable_argv)
    server.stop()
    log = server.log_path.read_text()
    assert "fake server argv:" in log and "***" in log
    assert "s3cret-key" not in log


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(EngineError, match=rf"port {port} on 127.0.0.1 is already in use"):
            proc.choose_port("127.0.0.1", port, "cand")
    assert proc.choose_port("127.0.0.1", 0, "cand") > 0


def test_missing_executable_is_a_clear_error(tmp_path: Path) -> None:
    server = proc.ServerProcess(
        "c",
        ["/no/such/python", "-m", "x"],
        env=dict(os.environ),
        log_path=tmp_path / "c.log",
        health_url="http://127.0.0.1:9/health",
        boot_timeout_s=5,
    )
    with pytest.raises(EngineError, match="not found or not executable: /no/such/python"):
        server.start()
    server.stop()


def test_engine_env_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSPREY_A", "os")
    monkeypatch.setenv("OSPREY_B", "os")
    p = make_pilot({"base": {"role": "baseline", "env": {"OSPREY_C": "c"}}},
                   target={"engine": "sglang", "env": {"OSPREY_B": "t", "OSPREY_C": "t"}})
    env = proc.engine_env(p, "base", BootSpec("base", log_dir=Path(".")))
    assert (env["OSPREY_A"], env["OSPREY_B"], env["OSPREY_C"]) == ("os", "t", "c")
    assert proc.engine_python(p.target) == sys.executable


# --------------------------------------------------------------------------- engines


def _pilot(engine: str, **target: Any) -> Pilot:
    return make_pilot(target=fake_target(engine, **target))


def _req() -> GenerationRequest:
    return GenerationRequest(prompt_id="p", prompt="Hi", max_new_tokens=5)


def test_sglang_engine_boots_serves_and_stops(tmp_path: Path) -> None:
    engine = SGLangEngine(_pilot("sglang"), "cand", BootSpec("cand", log_dir=tmp_path))
    try:
        engine.start()
        assert engine.server is not None
        pids = engine.server.pids()
        res = asyncio.run(engine.generate(_req()))
        assert res.ok, res.error
        assert res.output_ids == [100, 101, 102, 103, 104]
        assert res.spec_verify_ct == 3 and res.accept_length == pytest.approx(5 / 3)
        assert len(res.itl_s) == 4
        engine.flush()
        fp = engine.fingerprint()
        assert fp["version"] == "0.0.fake" and fp["kv_capacity_tokens"] == 4096
        # Resolved at boot: the served context (server args say null), the running cap.
        assert fp["context_length"] == 512 and fp["max_running_requests"] == 48
        assert fp["streaming"] == "incremental"
        assert "--speculative-algorithm" in fp["argv"]
        assert (engine.memory_mb() or 0) > 1
    finally:
        engine.stop()
    assert all(gone(p) for p in pids)
    assert (tmp_path / "cand.log").is_file()


def test_vllm_engine_key_in_env_not_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSPREY_VLLM_KEY", "k-vllm-42")
    engine = VLLMEngine(
        _pilot("vllm", api_key_env="OSPREY_VLLM_KEY"), "cand", BootSpec("cand", log_dir=tmp_path)
    )
    try:
        engine.start()
        assert "k-vllm-42" not in " ".join(engine.argv)
        res = asyncio.run(engine.generate(_req()))
        assert res.ok, res.error  # the fake answers 401 without the bearer key
        assert res.output_ids == [100, 101, 102, 103, 104]
        assert res.accept_length == pytest.approx(2.0)  # from /metrics: it ran alone
        assert engine.pooled_accept_length() == pytest.approx(2.0)
        fp = engine.fingerprint()
        assert fp["version"] == "0.0.fake" and fp["speculative_config"]["model"] == "/m/d"
        assert fp["prefix_cache"] == FLUSHED and "pooled_accept_length" not in fp
        engine.flush()  # the engine started it in dev mode: the reset route is there
    finally:
        engine.stop()
    assert "k-vllm-42" not in (tmp_path / "cand.log").read_text()


def test_sglang_engine_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        engine = SGLangEngine(_pilot("sglang", port=port), "base", BootSpec("base", tmp_path))
        with pytest.raises(EngineError, match="already in use"):
            engine.start()
        engine.stop()


def test_sigterm_to_the_group_reaches_children(make: Callable[..., Any]) -> None:
    """A well-behaved tree ends on SIGTERM to its group, well within the grace period."""
    server = make("--spawn-child")
    server.start()
    time.sleep(0.3)
    pids = server.pids()
    assert len(pids) == 2
    t0 = time.monotonic()
    server.stop(grace_s=20)
    assert time.monotonic() - t0 < 10
    assert all(gone(p) for p in pids)
