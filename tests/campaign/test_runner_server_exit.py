"""A server that dies is named as dead, even when its sockets refuse before its exit is seen."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from pytest_osprey.campaign.runner import Campaign


class _DyingServer:
    """returncode stays None until ``exit_after_s`` has passed, as while the kernel reaps."""

    def __init__(self, exit_after_s: float, code: int = 9) -> None:
        self._t_exit = time.monotonic() + exit_after_s
        self._code = code
        self.log_path = Path("/tmp/cand.log")

    @property
    def returncode(self) -> int | None:
        return self._code if time.monotonic() >= self._t_exit else None


class _Engine:
    def __init__(self, server: Any) -> None:
        self.server = server


def test_exit_seen_late_is_still_named() -> None:
    engine: Any = _Engine(_DyingServer(0.3))
    died = asyncio.run(Campaign._server_exit(engine, wait_s=5.0, where=" during pass 1"))
    assert died is not None and "exited with code 9 during pass 1" in died
    assert "/tmp/cand.log" in died


def test_live_server_is_not_called_dead_and_the_wait_is_bounded() -> None:
    engine: Any = _Engine(_DyingServer(60.0))
    t0 = time.monotonic()
    assert asyncio.run(Campaign._server_exit(engine, wait_s=0.3)) is None
    assert time.monotonic() - t0 < 2.0


def test_no_wait_when_nothing_failed() -> None:
    engine: Any = _Engine(_DyingServer(0.3))
    assert asyncio.run(Campaign._server_exit(engine, wait_s=0.0)) is None


def test_in_process_engine_has_no_server_to_die() -> None:
    engine: Any = _Engine(None)  # the Engine protocol's server reads None in process
    assert asyncio.run(Campaign._server_exit(engine, wait_s=1.0)) is None
