"""What each replayed request is given: its output budget, its open-loop arrival time; and the
facts recorded beside it (the host's load, why a campaign stopped)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import platform
import random
from typing import Any

from ..pilot.schema import Pilot
from ..pilot.trace import Prompt
from ..signals import interrupt_reason


def poisson_arrivals(n: int, rate: float, seed: str) -> list[float]:
    """Arrival times (seconds from the start) of ``n`` requests of a Poisson process.

    Seeded by the level, block and pass, so every condition sees the same arrival times in
    the same block: an open-loop comparison stays paired.
    """
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def stop_reason(exc: BaseException) -> str:
    """Why a campaign stopped, in words for campaign.json."""
    if isinstance(exc, KeyboardInterrupt | asyncio.CancelledError):
        return interrupt_reason()
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"error: {exc.strerror or exc}{where}"
    return f"error: {type(exc).__name__}: {exc}"


def max_new_tokens(pilot: Pilot, prompt: Prompt, override: int | None = None) -> int:
    n = override or prompt.max_new_tokens or pilot.max_new_tokens
    if pilot.max_new_tokens_cap is not None:
        n = min(n, pilot.max_new_tokens_cap)
    return n


def host_load() -> list[float] | None:
    """The host's 1/5/15-minute load averages (reports set them beside the timings: a busy
    machine explains a slow block); None where the platform has none."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def sample_seed(base: int, condition: str, prompt_id: str, index: int) -> int:
    """The seed of a condition's ``index``-th sample of a prompt: distinct per condition,
    prompt and sample.

    The distribution check compares samples that must be independent. With seeds shared
    across conditions a candidate's draws reuse the baseline's random numbers and come out
    coupled (the test loses most of its power); with seeds shared across prompts, sample i of
    every prompt draws the same random numbers, and prompts that start alike come out alike
    (seen: one identical 16-token output in half the cells of a 4-prompt run), which breaks
    the independence between prompts that the stratified test assumes.
    """
    key = f"{base}\x1f{condition}\x1f{prompt_id}\x1f{index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % 2**31


def serving_seed(base: int, prompt_id: str, boot: int, pass_index: int, copy: int) -> int:
    """The seed of a timed request at the serving sampling: the same for every condition (a
    candidate that verifies exactly draws what the baseline draws, so a pair differs by the
    drafter, not by luck), distinct per prompt, boot, pass and copy (each timed request an
    independent draw of the served workload)."""
    key = f"serving\x1f{base}\x1f{prompt_id}\x1f{boot}\x1f{pass_index}\x1f{copy}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % 2**31


def host_facts() -> dict[str, Any]:
    """The machine the campaign ran on, for campaign.json."""
    return {"machine": platform.machine(), "node": platform.node(),
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "system": platform.system(), "processor": platform.processor() or None}
