"""What the speed gate can see before the campaign starts: per load level, the smallest true
speedup the design keeps with 80% power against ``speedup_min``.

The variance of the log speedup follows from the design (prompts, passes, boots, the time
units a level's blocks give) and a documented reference noise level (:data:`REFERENCE`):
prompt-to-prompt variation of the drafter's gain, which only more prompts reduce; request
noise, which every replay reduces; and stretch shocks, shared by the requests of a block.
The degrees of freedom are the deciding test's: min(prompts, time units) - 1, the serial
term's effective clusters standing for the units at low load (:mod:`.variance`). Power is
the t-test's (noncentral t), fixed design; validated by simulation
(tests/judgement/test_speed_design_power.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...pilot.schema import Pilot
from .variance import serial_clusters


@dataclass(frozen=True)
class ReferenceNoise:
    """Noise on the log scale the statement assumes: the setting of the shipped claims
    (docs/speed-statistics.md, "What the speed gate can see, said before the campaign")."""

    interaction_sd: float = 0.15  # a prompt's gain around the drafter's mean gain
    request_sd: float = 0.10  # every request, AR(1) within a stretch
    request_ar: float = 0.3
    slow_share: float = 0.10  # requests slowed slow_factor x
    slow_factor: float = 3.0
    stretch_sd: float = 0.03  # a shock shared by a stretch's requests

    def request_var(self) -> float:
        """Variance of one request's log latency beyond its prompt's."""
        p = self.slow_share
        return self.request_sd**2 + p * (1 - p) * math.log(self.slow_factor) ** 2


REFERENCE = ReferenceNoise()


@dataclass(frozen=True)
class LevelSees:
    """What one load level's speed test can see. ``detectable``: the smallest true speedup
    kept with ``power`` (inf: none is, e.g. df < 1)."""

    level: str
    concurrency: int  # 0: open loop without a cap
    prompts: int
    passes: int
    boots: int
    time_units: int
    df: float
    serial: bool  # the serial term's effective clusters stand for the units
    detectable: float
    speedup_min: float
    power: float

    def phrase(self, with_passes: bool = False) -> str:
        load = f"x{self.concurrency}" if self.concurrency else self.level
        keeps = (f"{self.detectable:.2f}x" if math.isfinite(self.detectable)
                 else "no speedup")
        passes = f"{self.passes} pass{'es' if self.passes != 1 else ''}, " if with_passes else ""
        return f"at {load} ({passes}{self.time_units} time units, df {self.df:.0f}) {keeps}"


@dataclass(frozen=True)
class SpeedSees:
    """Every level's statement; ``line()`` says them in one sentence."""

    levels: tuple[LevelSees, ...]

    def line(self) -> str:
        if not self.levels:
            return ""
        first = self.levels[0]
        # Levels may take fewer passes (load.level_passes): then each level says its own.
        same = len({s.passes for s in self.levels}) == 1
        design = (f"{first.prompts} prompts"
                  + (f", {first.passes} passes" if same else "")
                  + (f", {first.boots} boots" if first.boots > 1 else ""))
        return (f"this design ({design}) keeps a true speedup against speedup_min "
                f"{first.speedup_min:g}x with {first.power:.0%} power from: "
                + "; ".join(s.phrase(with_passes=not same) for s in self.levels)
                + " (reference noise, fixed design)")


def level_sees(
    level: str, concurrency: int, block: int, closed_loop: bool, prompts: int, passes: int,
    boots: int, speedup_min: float, alpha: float, power: float = 0.8,
    noise: ReferenceNoise = REFERENCE,
) -> LevelSees:
    """One level's statement. ``block``: prompts per block (its time unit within a pass);
    closed loop: ``ceil(prompts / block)`` blocks a pass, else ``prompts // block``."""
    prompts = max(prompts, 1)  # an empty trace is refused before; said as "no speedup"
    per_pass = math.ceil(prompts / block) if closed_loop else max(1, prompts // block)
    units = per_pass * passes * boots
    cells = prompts / per_pass  # distinct prompts a unit (copies combine into one cell)
    replays = passes * boots
    # Requests of one stretch share its shock and their AR(1) correlation: the variance a
    # block adds to the mean of its cells, per cell (m = cells of one condition a stretch).
    m = max(cells, 1.0)
    ar = noise.request_ar
    ar_sum = sum((m - k) * ar**k for k in range(1, int(m))) * 2 / m if m > 1 else 0.0
    # A closed-loop block is cycled up to the concurrency: copies of a prompt combine (their
    # mean log), which divides their request noise by the copies.
    copies = _copies_factor(prompts, per_pass, concurrency) if closed_loop else 1.0
    per_cell = (copies * (noise.request_var() + noise.request_sd**2 * ar_sum)
                + noise.stretch_sd**2 * m)
    var = noise.interaction_sd**2 / prompts + 2 * per_cell / (prompts * replays)
    eff = float(serial_clusters(np.asarray([cells]), np.asarray([float(units)]))[0])
    df = min(prompts, eff if eff > 0 else units) - 1.0
    detectable = speedup_min * math.exp(_ncp_for(power, df, alpha) * math.sqrt(var))
    return LevelSees(level, concurrency, prompts, passes, boots, units, df, eff > 0,
                     detectable, speedup_min, power)


def _copies_factor(prompts: int, per_pass: int, fill: int) -> float:
    """Mean of 1 / copies over a pass's cells, blocks of sizes differing by <= 1 each cycled
    up to ``fill`` requests."""
    big, n_big = -(-prompts // per_pass), prompts % per_pass or per_pass
    total = 0.0
    for size, count in ((big, n_big), (prompts // per_pass, per_pass - n_big)):
        if count and size:
            q, r = divmod(max(fill, size), size)
            total += count * (r / (q + 1) + (size - r) / q)
    return total / prompts


def _ncp_for(power: float, df: float, alpha: float) -> float:
    """Noncentrality at which the one-sided t-test at ``alpha`` has ``power`` (inf: df < 1)."""
    from scipy import optimize, special, stats

    if df < 1:
        return math.inf
    crit = float(special.stdtrit(df, 1 - alpha))
    return float(optimize.brentq(lambda d: float(stats.nct.sf(crit, df, d)) - power,
                                 0.0, 200.0))


def design_sees(pilot: Pilot, trace_prompts: int, power: float = 0.8) -> SpeedSees:
    """Every load level's statement for ``pilot`` replaying ``trace_prompts`` prompts."""
    load = pilot.load
    alpha = (1 - pilot.decision.confidence) / 2
    return SpeedSees(tuple(
        level_sees(name, load.concurrency(name), load.block_size(name),
                   load.rate(name) is None, trace_prompts,
                   max(1, load.passes_at(name) // load.boots_per_condition),
                   load.boots_per_condition, pilot.limits.speedup_min, alpha, power)
        for name in load.levels))
