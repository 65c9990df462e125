"""An in-process engine whose drafter's edge falls with the sampling temperature.

Acceptance of a draft falls as sampling spreads the target's distribution, so a drafter
that is well ahead greedy can be behind at the temperatures assistants serve with: here its
per-token time is the baseline's divided by ``speedup(T)`` (linear between the two planted
points). Requests really take their time (asyncio sleep) and report the time planned, so
the runner's clocks and the in-flight load are those of a real campaign, the noise is the
model's (per request, and a slow wave over wall time that every condition meets), and the
truth is known. Outputs: greedy, one fixed sequence per prompt;
sampled, one per seed (the same seed draws the same tokens on every condition); without
ignore_eos a sampled output ends early, at a length drawn from its seed.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

from pytest_osprey.engines.base import GenerationRequest, GenerationResult

TOKEN_S = 0.0015  # the baseline's time per output token
PREFILL_S = 0.001
# The wave's origin is one clock for every engine: noise shared in time is the same for all
# conditions at the same moment (an engine's own origin would put each in its own phase).
ORIGIN = time.perf_counter()


@dataclass(frozen=True)
class Planted:
    """The drafter's true speedup at temperature 0 and at ``hot``, linear between."""

    greedy: float = 1.4
    hot: float = 0.85
    at: float = 0.8

    def speedup(self, temperature: float) -> float:
        return self.greedy + (self.hot - self.greedy) * min(temperature, self.at) / self.at


def _unit(*key: object) -> float:
    """A uniform draw in [0, 1) from ``key`` (reproducible, independent across keys)."""
    digest = hashlib.blake2b("\x1f".join(map(str, key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass
class TemperatureEngine:
    """One condition: the baseline (``drafter`` False) or the planted drafter."""

    condition: str
    drafter: bool
    planted: Planted = field(default_factory=Planted)
    seen: list[GenerationRequest] = field(default_factory=list)

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def flush(self) -> None: ...

    def fingerprint(self) -> dict[str, Any]:
        return {"engine": "temperature-sim", "drafter": self.drafter}

    def memory_mb(self) -> float | None:
        return None

    # What a real engine may have and this one does not (the Engine protocol reads None).
    @property
    def server(self) -> None:
        return None

    @property
    def tokenizer(self) -> None:
        return None

    def spec_counters(self) -> None:
        return None

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.seen.append(request)
        n = request.max_new_tokens
        key = request.prompt_id if request.greedy else request.seed
        if not request.greedy and not request.ignore_eos:
            n = max(1, math.ceil(n * (0.3 + 0.7 * _unit("eos", key))))
        ids = [int(_unit("tok", key, i) * 1000) for i in range(n)]
        speedup = self.planted.speedup(request.temperature) if self.drafter else 1.0
        # Noise: per request (its own draw) and a wave over wall time both sides meet.
        wave = 1.0 + 0.25 * math.sin(2 * math.pi * (time.perf_counter() - ORIGIN) / 0.7)
        jitter = math.exp(0.08 * (_unit("noise", self.condition, key, len(self.seen)) - 0.5))
        tpt = TOKEN_S / speedup * wave * jitter
        # The request takes its time (the runner's clocks and in-flight load are real) and
        # reports the planned time: an event loop late on a busy machine blurs neither side.
        e2e = PREFILL_S + n * tpt
        await asyncio.sleep(e2e)
        ttft = PREFILL_S + tpt
        # At least one token per verify step: a slower drafter is slower per step, never
        # fewer tokens than steps (no server reports that).
        steps = max(1, min(n, round(n / speedup))) if self.drafter else None
        return GenerationResult(
            ok=True, ttft_s=ttft, e2e_s=e2e,
            itl_s=[(e2e - ttft) / max(1, n - 1)] * (n - 1), prompt_tokens=8, output_ids=ids,
            output_text=" ".join(map(str, ids)),
            top2_margin=[1.0] * n if request.want_margins else None,
            top2_ids=[[i, i + 1] for i in ids] if request.want_margins else None,
            spec_verify_ct=steps, accept_length=n / steps if steps else None,
            finish_reason="length" if n == request.max_new_tokens else "stop",
        )
