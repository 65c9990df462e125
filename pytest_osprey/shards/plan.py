"""Shards: one seeded replay plan split over machines, every condition on every machine.

A shard takes a disjoint share of the plan's **passes** (pass p goes to shard p mod N, in
every boot): a pass is a whole partition of the trace into blocks, stratified by slice, so
each shard measures every prompt of every slice, and every comparison of a block stays
within one machine (the conditions' stretches of a block are adjacent there). The plan is
built exactly as on one machine (same seed, same partitions, same condition orders); a shard
replays the stretches of its passes in the plan's order. Records keep the plan's pass index,
so the shards' records pool into one plan without renumbering, and a time unit (boot, pass,
block) is always one machine's.

The sampling and sampling-parameter passes (quality, not speed) run on shard 1 alone: they
would only be repeated on the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from ..campaign.runner import Campaign
from ..campaign.schedule import ReplayPlan
from ..results.campaign_file import CampaignFile, ShardFacts

__all__ = ["Shard", "ShardCampaign", "ShardError", "parse_shard", "shard_plan"]

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$", re.ASCII)


class ShardError(ValueError):
    """A shard that cannot be run (bad ``K/N``, fewer passes than shards)."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 1 <= self.index <= self.count:
            raise ShardError(f"shard {self.index}/{self.count}: K/N needs 1 <= K <= N")

    @property
    def text(self) -> str:
        return f"{self.index}/{self.count}"

    def passes(self, passes: int) -> list[int]:
        """The plan's passes (0-based) this shard replays."""
        return [p for p in range(passes) if p % self.count == self.index - 1]


def parse_shard(text: str) -> Shard:
    """``"K/N"`` (1-based K) as a :class:`Shard`; a :class:`ShardError` names what is wrong."""
    m = _SPEC.match(text)
    if not m:
        empty = " (empty: a variable that is not set?)" if not text.strip() else ""
        raise ShardError(f"--shard {text!r}: expected K/N, e.g. 1/4{empty}")
    return Shard(int(m.group(1)), int(m.group(2)))


def shard_plan(plan: ReplayPlan, shard: Shard) -> ReplayPlan:
    """``plan`` cut to ``shard``'s passes (every boot, every condition), in the plan's order."""
    if plan.passes < shard.count:
        raise ShardError(f"shard {shard.text}: the plan has {plan.passes} passes, fewer than "
                         f"{shard.count} shards (each shard takes whole passes: raise "
                         "load.passes or run fewer shards)")
    mine = set(shard.passes(plan.passes))
    return replace(plan, stretches=tuple(s for s in plan.stretches if s.pass_index in mine))


class ShardCampaign(Campaign):
    """A :class:`Campaign` replaying one shard of the plan; campaign.json names the shard."""

    def __init__(self, *args: Any, shard: Shard, **kwargs: Any) -> None:
        self.shard = shard
        super().__init__(*args, **kwargs)

    def _make_plan(self) -> ReplayPlan:
        return shard_plan(super()._make_plan(), self.shard)

    async def _sampled_pass(self, name: str) -> None:
        if self.shard.index == 1:
            await super()._sampled_pass(name)

    async def _params_pass(self, name: str) -> None:
        if self.shard.index == 1:
            await super()._params_pass(name)

    def meta(self) -> CampaignFile:
        meta = super().meta()
        meta.shard = ShardFacts(index=self.shard.index, count=self.shard.count,
                                passes=self.shard.passes(self.plan.passes),
                                hardware=hardware_facts(
                                    {n: st.fingerprint for n, st in self.states.items()}))
        return meta


def hardware_facts(fingerprints: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What a merge compares across shards: per condition, the engine, its version, the
    device it ran on and the model and drafter digests (from the engine's fingerprint)."""
    keys = ("engine", "version", "device", "device_name", "dtype", "model_digest",
            "drafter_digest", "gpu", "gpus")
    return {name: {k: fp[k] for k in keys if k in fp} for name, fp in fingerprints.items()
            if fp}
