"""The embedded engine writes logs/<condition>.log, as a booted server does: what it loaded and
how, when it was ready, each failed request, and what it served (a real engine, the tiny
target)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pytest_osprey.engines.base import BootSpec, GenerationRequest
from pytest_osprey.engines.embedded.engine import TransformersEngine
from testkit.factories import ROOT, make_pilot

MODELS = ROOT / "fixtures" / "models"
pytestmark = pytest.mark.slow  # boots the tiny target


def test_log_per_condition(tmp_path: Path) -> None:
    if not (MODELS / "tiny-target").is_dir():
        pytest.skip("tiny models not found (fixtures/models)")
    import torch

    threads = torch.get_num_threads()  # the engine sets target.threads process-wide
    pilot = make_pilot(
        target={"model": str(MODELS / "tiny-target"), "context_length": 64, "threads": 1},
        conditions={"baseline": {"role": "baseline"}},
        trace={"files": ["p.jsonl"]},
    )
    engine = TransformersEngine(pilot, "baseline", BootSpec("baseline", tmp_path / "logs"))
    try:
        engine.start()
        ok = asyncio.run(engine.generate(GenerationRequest("short", "def add(a, b):", 4)))
        # Prompt + output beyond the context length: the request fails, the log says why.
        bad = asyncio.run(engine.generate(GenerationRequest("long", "x " * 80, 8)))
    finally:
        engine.stop()
        torch.set_num_threads(threads)
    assert ok.ok and not bad.ok
    log = (tmp_path / "logs" / "baseline.log").read_text("utf-8").splitlines()
    assert "loading target" in log[0] and "float32 on cpu" in log[0]
    assert "speculation off" in log[0]
    assert any("ready after" in line and "1 thread(s)" in line for line in log)
    assert any("request long failed: prompt" in line for line in log)
    assert "stopped: served 2 request(s), 1 failed" in log[-1]


def test_a_request_its_client_ends_is_not_a_failure(tmp_path: Path) -> None:
    """A load filler cancelled when its stretch ends: counted apart, never "failed" nor
    "interrupted" in a clean run's log."""
    if not (MODELS / "tiny-target").is_dir():
        pytest.skip("tiny models not found (fixtures/models)")
    import contextlib

    import torch

    threads = torch.get_num_threads()
    pilot = make_pilot(
        target={"model": str(MODELS / "tiny-target"), "context_length": 512, "threads": 1},
        conditions={"baseline": {"role": "baseline"}}, trace={"files": ["p.jsonl"]})
    engine = TransformersEngine(pilot, "baseline", BootSpec("baseline", tmp_path / "logs"))

    async def filler_ended_early() -> None:
        task = asyncio.create_task(engine.generate(
            GenerationRequest("filler", "def add(a, b):", 400, ignore_eos=True)))
        await asyncio.sleep(0.5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for _ in range(100):  # the sequence leaves the batch after its current step
            if engine._cancelled:
                break
            await asyncio.sleep(0.05)

    try:
        engine.start()
        asyncio.run(filler_ended_early())
    finally:
        engine.stop()
        torch.set_num_threads(threads)
    log = (tmp_path / "logs" / "baseline.log").read_text("utf-8")
    assert "failed: cancelled" not in log and "interrupted" not in log
    assert "served 1 request(s), 0 failed, 1 ended early by the client;" in log
