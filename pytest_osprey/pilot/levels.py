"""Load levels of a pilot: closed loop (a concurrency) or open loop (Poisson arrivals)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from .base import MAX_COUNT, MAX_ITEMS, Seconds, Strict


class OpenLoop(Strict):
    """An open-loop load level: requests arrive as a Poisson process, whatever the server's pace
    (the same seeded arrival times for every condition in a block)."""

    rate: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)]
    """Mean arrival rate (requests per second)."""
    max_concurrency: Annotated[int, Field(ge=1, le=100_000)] | None = None
    """Cap on requests in flight; an arrival beyond it waits client-side (default: no cap)."""


Concurrency = Annotated[int, Field(ge=1, le=100_000)]


def _level_kind(value: Any) -> str:
    return "open-loop" if isinstance(value, Mapping | OpenLoop) else "concurrency"


# Tagged so that a wrong level reports one kind's error (a mapping is an open-loop level,
# anything else a concurrency), not both; the tags are dropped from error locations.
LoadLevel = Annotated[
    Annotated[Concurrency, Tag("concurrency")] | Annotated[OpenLoop, Tag("open-loop")],
    Discriminator(_level_kind),
]
UNION_TAGS = frozenset({"concurrency", "open-loop"})

# Orders by a name they no longer have -> that name: a pilot file using one is told the new
# name; a campaign's saved pilot, re-judged, is read as it was meant (see pilot.loading).
FORMER_ORDERS = {"abba": "interleaved"}


def _default_levels() -> dict[str, LoadLevel]:
    return {"low": 1, "concurrent": 8}


MAX_SWEEP = 4096
"""Highest concurrency a sweep may reach (it expands to about log2 of it levels)."""


class Sweep(Strict):
    """Closed-loop levels from x`min` doubling to x`max`, named `c1`, `c2`, `c4`, ...

    ``max`` itself is the last level even where it is no power of two. Three or more levels
    estimate where speculation stops paying (the crossover)."""

    max: Annotated[int, Field(ge=2, le=MAX_SWEEP)]
    """Highest concurrency of the sweep (the default primary load)."""
    min: Annotated[int, Field(ge=1, le=MAX_SWEEP)] = 1
    """Lowest concurrency of the sweep."""

    @model_validator(mode="after")
    def _ordered(self) -> Sweep:
        if self.min >= self.max:
            raise ValueError(f"min ({self.min}) must be below max ({self.max})")
        return self

    def levels(self) -> dict[str, int]:
        """Level name -> concurrency, lightest first."""
        out, c = {}, self.min
        while c < self.max:
            out[f"c{c}"] = c
            c *= 2
        out[f"c{self.max}"] = self.max
        return out


def _expand_sweep(data: Any) -> Any:
    """``sweep`` adds the concurrencies ``levels`` lacks (to the levels given; instead of the
    default ones when none are): one level per concurrency, whatever its name. Expanding
    again is a no-op, so a dumped pilot reads back alike."""
    if not isinstance(data, Mapping) or data.get("sweep") is None:
        return data
    sweep = Sweep.model_validate(data["sweep"])
    given = data.get("levels")
    if given is not None and not isinstance(given, Mapping):
        return data  # levels' own validation reports it
    levels: dict[Any, Any] = dict(given or {})
    for name, c in sweep.levels().items():
        if c in levels.values():
            continue
        if name in levels:
            raise ValueError(f"sweep: its level {name!r} (x{c}) is also in levels, as "
                             f"{levels[name]!r}: rename that level")
        levels[name] = c
    return {**data, "levels": levels, "sweep": sweep}


class Load(Strict):
    levels: dict[Annotated[str, Field(max_length=64)], LoadLevel] = Field(
        default_factory=_default_levels, min_length=1, max_length=32
    )
    """Load level name -> concurrency (closed loop: that many requests always in flight) or
    {rate, max_concurrency} (open loop, Poisson arrivals); each level is judged apart."""
    sweep: Sweep | None = None
    """Shorthand for closed-loop levels x1, x2, x4, ... up to `max`, named `c1`, `c2`, `c4`,
    ...: added to `levels` where no level has that concurrency yet (instead of the default
    levels when `levels` is not given)."""
    warmup_requests: Annotated[int, Field(ge=0, le=MAX_COUNT)] = 4
    """Requests per condition after boot, excluded from records."""
    passes: Annotated[int, Field(ge=1, le=64)] = 4
    """Passes over the whole trace per condition, boot and load level (each prompt is
    replayed this often; early stopping looks after each pass). Formerly `blocks`."""
    level_passes: dict[str, Annotated[int, Field(ge=1, le=64)]] = Field(
        default_factory=dict, max_length=MAX_ITEMS,
        description="Load level -> its timed passes over the whole campaign, at most `passes` "
        "x `boots_per_condition` (default: all of them). The first pass of every boot comes "
        "first, then the second of every boot, and so on (1: the first boot's first pass "
        "only). Only the primary load's speedup gates (decision.primary_load); a level that "
        "only informs (the crossover, the other levels' speedups) and costs much per pass (x1 "
        "serves one request at a time) may take fewer: the decision's power is unchanged, that "
        "level's intervals widen (on one boot, a boot's offset is not told from the drafter's "
        "effect there). Early stopping's looks are unchanged",
    )
    block_prompts: dict[str, Annotated[int, Field(ge=1, le=MAX_COUNT)]] = Field(
        default_factory=dict, max_length=MAX_ITEMS,
        description="Load level -> prompts per block (default: the level's concurrency, at "
        "least 1; open loop: 8). Within a pass every condition replays each block as one short "
        "stretch, conditions in a counterbalanced order, so that noise shared in time hits "
        "every condition alike; blocks are re-drawn every pass, and the statistics cluster "
        "by prompt and by time unit (boot, pass, block)",
    )
    boots_per_condition: Annotated[int, Field(ge=1, le=20)] = 1
    """Boots of each condition; the boots of all conditions alternate in time. With 1, a
    persistent per-boot offset cannot be told from the drafter's effect (the report says
    so); with 2 or more it is estimated and counted in the speed gates' variance."""
    order: Literal["interleaved", "sequential"] = "interleaved"
    """interleaved: every condition up at once, blocks alternating between conditions;
    sequential: one engine at a time (one GPU), each condition's boot one contiguous stretch
    (then boots_per_condition >= 2 is needed to judge speed honestly)."""
    request_timeout_s: Seconds = 300.0
    """Per-request timeout; a timed-out request is recorded as failed."""
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    """Seed of the replay plan (blocks, their order, the conditions' order per block)."""

    @model_validator(mode="before")
    @classmethod
    def _blocks_is_passes(cls, data: Any) -> Any:
        # Pilots written before `passes` name the same count `blocks`.
        if isinstance(data, Mapping) and "blocks" in data:
            if "passes" in data:
                raise ValueError("give either passes or its former name blocks, not both")
            data = {**data, "passes": data["blocks"]}
            del data["blocks"]
        return data

    @model_validator(mode="before")
    @classmethod
    def _sweep_levels(cls, data: Any) -> Any:
        try:
            return _expand_sweep(data)
        except ValidationError:
            return data  # the sweep field's own validation reports where

    @field_validator("order", mode="before")
    @classmethod
    def _former_order(cls, value: Any) -> Any:
        if isinstance(value, str) and value in FORMER_ORDERS:
            raise ValueError(f"order {value!r} is now called {FORMER_ORDERS[value]!r}")
        return value

    @property
    def interleaved(self) -> bool:
        return self.order != "sequential"

    def passes_at(self, level: str) -> int:
        """Timed passes at ``level`` over the whole campaign (see level_passes)."""
        every = self.passes * self.boots_per_condition
        return min(self.level_passes.get(level, every), every)

    def block_size(self, level: str) -> int:
        """Prompts per block at ``level`` (see block_prompts)."""
        if level in self.block_prompts:
            return self.block_prompts[level]
        value = self.levels[level]
        return max(1, value) if isinstance(value, int) else 8

    def concurrency(self, level: str) -> int:
        """Closed loop: its concurrency; open loop: its cap, 0 when uncapped."""
        value = self.levels[level]
        return value if isinstance(value, int) else value.max_concurrency or 0

    def rate(self, level: str) -> float | None:
        """Open loop: the arrival rate (requests/s); closed loop: None."""
        value = self.levels[level]
        return None if isinstance(value, int) else value.rate

    def label(self, level: str) -> str:
        return level_label(self.levels[level])

    def lightest(self) -> str:
        """The lowest-load level: the smallest closed-loop concurrency, else the lowest rate."""
        closed = [k for k, v in self.levels.items() if isinstance(v, int)]
        if closed:
            return min(closed, key=self.concurrency)
        return min(self.levels, key=lambda k: self.rate(k) or 0.0)

    def heaviest(self) -> str:
        """The highest-load level: the largest closed-loop concurrency, else the highest rate
        (open and closed loads are not comparable, so closed levels come first)."""
        closed = [k for k, v in self.levels.items() if isinstance(v, int)]
        if closed:
            return max(closed, key=self.concurrency)
        return max(self.levels, key=lambda k: self.rate(k) or 0.0)


def level_label(value: Any) -> str:
    """How a load level reads in reports: ``x4`` (closed loop) or ``Poisson 2/s`` (open loop);
    ``value`` is the pilot's level or its JSON form from campaign.json."""
    if isinstance(value, OpenLoop):
        value = value.model_dump()
    if isinstance(value, Mapping):
        text = f"Poisson {value.get('rate', 0):g}/s"
        cap = value.get("max_concurrency")
        return f"{text}, <=x{cap}" if cap else text
    return f"x{value}"
