"""What each replayed request is given: its output budget, its open-loop arrival time; and the
facts recorded beside it (the host's load, why a campaign stopped)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import platform
import random
from collections.abc import Sequence
from typing import Any

from ..engines.base import GenerationRequest
from ..pilot.schema import Pilot
from ..pilot.trace import Prompt
from ..results.records import Mode
from .signals import interrupt_reason


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


def replay_request(pilot: Pilot, mode: Mode, condition: str, prompt: Prompt, text: str,
                   index: int, *, want_margins: bool, boot: int, pass_index: int,
                   copy: int = 0) -> GenerationRequest:
    """The request replaying ``prompt`` (rendered as ``text``) in a ``mode`` pass: its
    sampling, seed and output budget; ``index`` is the sample's, ``copy`` the occurrence of
    the prompt in its stretch (a cycled trace)."""
    if mode == "serving":
        serving = pilot.sampling.serving
        return GenerationRequest(
            prompt_id=prompt.id,
            prompt=text,
            max_new_tokens=max_new_tokens(pilot, prompt),
            temperature=serving.temperature,
            top_p=serving.top_p,
            top_k=serving.top_k,
            min_p=serving.min_p,
            # Every condition runs each prompt to the same length (like with like).
            ignore_eos=serving.fixed_length,
            # The same seed for every condition: the same draw where outputs agree.
            seed=serving_seed(pilot.sampling.seed, prompt.id, boot, pass_index, copy),
            want_margins=False,
            timeout_s=pilot.load.request_timeout_s,
        )
    greedy = mode == "greedy"
    sampled = pilot.sampling.sampled
    return GenerationRequest(
        prompt_id=prompt.id,
        prompt=text,
        max_new_tokens=max_new_tokens(pilot, prompt, None if greedy else sampled.max_new_tokens),
        temperature=0.0 if greedy else sampled.temperature,
        top_p=1.0 if greedy else sampled.top_p,
        top_k=None if greedy else sampled.top_k,
        min_p=0.0 if greedy else sampled.min_p,
        seed=None if greedy else sample_seed(pilot.sampling.seed, condition, prompt.id, index),
        # Logprobs only where a gate reads them: greedy identity takes the margins of each
        # prompt's first greedy record (first boot, first pass). Everywhere else they would
        # only add client work per token, and more per decoding step to a condition whose
        # steps carry several tokens.
        want_margins=want_margins,
        timeout_s=pilot.load.request_timeout_s,
    )


def occurrences(jobs: Sequence[tuple[Prompt, int]]) -> list[int]:
    """Per job, how many times its (prompt, sample) came earlier in the stretch."""
    seen: dict[tuple[str, int], int] = {}
    copies = []
    for p, i in jobs:
        copies.append(seen.get((p.id, i), 0))
        seen[(p.id, i)] = copies[-1] + 1
    return copies


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


BREAKER_TIMEOUTS = 3
"""Consecutive timed-out requests that stop a condition (more where a level holds more in
flight: a hung server times out every request it holds at once)."""


class TimeoutBreaker:
    """Counts one condition's timed-out requests in a row (any answered request resets it):
    a server that hangs would otherwise cost request_timeout_s per request of every pass."""

    def __init__(self) -> None:
        self.in_a_row = 0

    def note(self, ok: bool, e2e_s: float | None, timeout_s: float,
             in_flight: int = 1) -> str | None:
        """Count one ended request; the condition's error once the breaker trips, else None.
        A request timed out when it failed having run its whole timeout (data, not its
        error's words); other failures neither count nor reset."""
        if ok:
            self.in_a_row = 0
        elif e2e_s is not None and e2e_s >= timeout_s:
            self.in_a_row += 1
            if self.in_a_row == max(BREAKER_TIMEOUTS, in_flight):
                return (f"stopped: {self.in_a_row} requests in a row timed out "
                        f"(load.request_timeout_s {timeout_s:g} s); its other requests were "
                        "not sent and its verdict is withheld")
        return None
