"""What the campaign tells the outside while it runs: progress, and the early-stop rule it is
handed (the campaign measures; judging is not its business)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
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


ETA_MIN_DONE = 3
"""A pass's ETA is said once this many of its requests have finished: one request's time
says nothing of the rest (the first may still be warming the engine's caches)."""


def pass_eta(elapsed_s: float, done: int, total: int) -> float | None:
    """Seconds left in a pass, from the time its finished requests took; None before
    :data:`ETA_MIN_DONE` of them."""
    if done < min(ETA_MIN_DONE, total) or done <= 0:
        return None
    return elapsed_s / done * (total - done)


def campaign_eta(pass_s: Sequence[float], this_pass_left_s: float | None,
                 this_pass_s: float | None, passes_left: int, untimed_s: float) -> float | None:
    """Seconds left in the campaign: what is left of this timed pass, the timed passes still
    to run at the mean time of those finished (this one's projected time before any has),
    plus the untimed passes still to run (``untimed_s``). None while nothing is known."""
    mean = sum(pass_s) / len(pass_s) if pass_s else this_pass_s
    if mean is None or this_pass_left_s is None:
        return None
    return this_pass_left_s + passes_left * mean + untimed_s


@dataclass
class ProgressClock:
    """Where the pass being run stands: how many of its requests have ended, and since when
    it is clocked (a timed pass from its start, another from its first request's end); and
    each finished timed pass's seconds, which the campaign's ETA reads."""

    begun: dict[tuple[int, int], float] = field(default_factory=dict)  # timed pass -> start
    pass_s: dict[tuple[int, int], float] = field(default_factory=dict)  # finished -> seconds
    _key: tuple[str, int, int] | None = None
    _done: int = 0
    _t0: float = 0.0

    def begin(self, boot: int, pass_index: int) -> None:
        """A timed pass starts."""
        self.begun[(boot, pass_index)] = time.perf_counter()

    def tick(self, key: tuple[str, int, int]) -> int:
        """One more request of the pass ``key`` names has ended: how many have."""
        if key != self._key:
            self._key, self._done, self._t0 = key, 0, time.perf_counter()
        self._done += 1
        return self._done

    def elapsed(self, boot: int, pass_index: int, timed: bool) -> float:
        start = self.begun.get((boot, pass_index)) if timed else None
        return time.perf_counter() - (self._t0 if start is None else start)


def duration_text(seconds: float) -> str:
    """``45s``, ``4m 10s``."""
    s = round(seconds)
    return f"{s}s" if s < 60 else f"{s // 60}m {s % 60:02d}s"


@dataclass(frozen=True)
class ProgressEvent:
    condition: str
    phase: str  # boot | warmup | greedy | serving | greedy (untimed) | sampled | params | ...
    load: str = ""
    block: int = 0  # a timed pass: its number, boots counted on (0: the first); else the pass
    done: int = 0
    total: int = 0
    eta_s: float | None = None
    message: str = ""
    passes: int = 0  # timed passes planned (a timed pass's event)
    campaign_eta_s: float | None = None  # seconds left in the whole campaign

    @property
    def key(self) -> tuple[str, str, str, int, str]:
        """What makes an event news to a terminal that shows each phase once: its condition,
        phase, load and pass, and for the scoring phase its message (which condition's
        outputs are scored, or why they cannot be)."""
        return (self.condition, self.phase, self.load, self.block,
                self.message if self.phase == "score" else "")

    def line(self, finished: bool = False) -> str:
        """The event in words (the terminal of both adapters)."""
        if self.phase == "done":
            return f"[osprey] {self.message}"
        if self.phase in ("boot", "warmup", "error"):
            text = {"boot": "booting", "warmup": f"warming up ({self.total} requests)",
                    "error": f"FAILED: {self.message}"}[self.phase]
            return f"[osprey] {self.condition}: {text}"
        if self.phase == "score":  # the target scoring sampled outputs (scores.jsonl)
            count = f" ({self.done}/{self.total} samples)" if self.total else ""
            return f"[osprey] {self.condition}: {self.message}{count}"
        eta = (f", ETA {duration_text(self.eta_s)}" if self.eta_s is not None and not finished
               else "")
        extra = f", {self.message}" if self.message else ""
        if self.phase in ("greedy", "serving"):  # a timed pass: every condition's stretches
            of = f" of {self.passes}" if self.passes else ""
            whole = (f", campaign ETA {duration_text(self.campaign_eta_s)}"
                     if self.campaign_eta_s is not None else "")
            return (f"[osprey] {self.phase} pass {self.block + 1}{of}{extra}: "
                    f"{self.done}/{self.total} requests{eta}{whole}")
        return (f"[osprey] {self.condition} {self.phase} load {self.load}: "
                f"{self.done}/{self.total}{eta}")
