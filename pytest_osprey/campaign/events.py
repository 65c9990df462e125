"""What the campaign tells the outside while it runs: progress, and the early-stop rule it is
handed (the campaign measures; judging is not its business)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..results.records import RequestRecord

Progress = Callable[["ProgressEvent"], None]
# Early stopping, handed in by the run (the campaign measures; judging is not its business):
# called with the records so far after each block, it answers whether every candidate's
# speed is decided, and notes its looks (candidate -> look facts) for campaign.json.
StopRule = Callable[[list[RequestRecord], int], "StopLook"]


@dataclass(frozen=True)
class StopLook:
    decided: bool
    looks: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ProgressEvent:
    condition: str
    phase: str  # boot | warmup | greedy | serving | greedy (untimed) | sampled | params | ...
    load: str = ""
    block: int = 0  # greedy: the pass
    done: int = 0
    total: int = 0
    eta_s: float | None = None
    message: str = ""

    def line(self, finished: bool = False) -> str:
        """The event in words (the terminal of both adapters)."""
        if self.phase == "done":
            return f"[osprey] {self.message}"
        if self.phase in ("boot", "warmup", "error"):
            text = {"boot": "booting", "warmup": f"warming up ({self.total} requests)",
                    "error": f"FAILED: {self.message}"}[self.phase]
            return f"[osprey] {self.condition}: {text}"
        eta = f", ETA {self.eta_s:.0f}s" if self.eta_s is not None and not finished else ""
        extra = f", {self.message}" if self.message else ""
        if self.phase in ("greedy", "serving"):  # a timed pass: every condition's stretches
            return (f"[osprey] {self.phase} pass {self.block + 1}{extra}: "
                    f"{self.done}/{self.total} requests{eta}")
        return (f"[osprey] {self.condition} {self.phase} load {self.load}: "
                f"{self.done}/{self.total}{eta}")
