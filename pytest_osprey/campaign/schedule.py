"""The replay plan: which condition replays which prompts when (pure; no I/O, no asyncio).

Noise on a shared machine is shared in time: a slow second, a stall, a neighbour's job hit
every request in flight. The plan makes such noise hit every condition alike and keeps what
it cannot cancel inside a unit the statistics can count:

* For each boot, each pass over the trace and each load level, the trace's prompts are
  split afresh (seeded, stratified) into **blocks** of exactly ``block_prompts`` measured
  requests (by default the level's concurrency: at concurrency 1 a block is one prompt,
  i.e. request-level alternation between conditions). There are ``ceil(prompts / size)``
  blocks; each takes an equal share of the distinct prompts (sizes differing by <= 1) and
  cycles them to fill its size, so a level of 128 runs on a 50-prompt trace, every prompt is
  measured in every pass, and all copies of a prompt in a pass sit in one block.
* The blocks run in a seeded random order, and within a block every condition replays the
  block's requests as one short **stretch**, the conditions in a counterbalanced order
  (each first equally often over the passes). A shock during a stretch then lands in one
  block's comparison, never in all.
* The statistics count two kinds of unit: a **time unit** (one block in one pass of one
  boot: the conditions' stretches of it, adjacent in time) holds whatever noise is shared in
  time; a **prompt** holds its stable effect over passes. Re-partitioning every pass makes
  the time units grow with passes, not only with prompts / concurrency (see
  docs/speed-calibration.md). Boot-wide offsets need ``boots_per_condition`` >= 2 to be
  estimated; with one boot they are confounded with the drafter.
* ``order="sequential"`` (conditions that cannot be resident together, one server at a
  time): per boot each condition replays everything as one contiguous stretch, the
  condition order rotating over boots. Time-shared noise between the conditions' stretches is
  then a boot-level effect: it is estimable only with ``boots_per_condition`` >= 2.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..results.campaign_file import PlanFacts

Order = Literal["interleaved", "sequential"]


class PlanError(ValueError):
    """A replay plan that cannot be built (no prompts, no conditions, bad sizes)."""


@dataclass(frozen=True)
class Stretch:
    """One condition replaying one block's prompts, in execution order ``index``.

    ``stretch_id`` names the contiguous run of one condition the entry belongs to: in the
    interleaved order every entry is its own stretch; in the sequential order all entries of
    a condition within a boot share one id (one contiguous run). ``look`` is the first
    early-stopping look whose data include this entry (1-based). ``prompt_ids`` lists the
    stretch's measured requests in queue order; a prompt repeats when the level's block is
    larger than the share of the trace it holds (the runner records the occurrence as the
    record's ``copy``). ``block`` indexes the partition of this boot and pass.
    """

    index: int
    boot: int
    pass_index: int
    level: str
    block: int
    condition: str
    prompt_ids: tuple[str, ...]
    stretch_id: int
    look: int


@dataclass(frozen=True)
class ReplayPlan:
    """Every stretch of a campaign in execution order, and the blocks they replay.

    ``partitions[level][boot * passes + pass]`` is that pass's blocks; ``blocks`` the first
    pass's (what campaign.json records as the plan's blocks).
    """

    stretches: tuple[Stretch, ...]
    blocks: Mapping[str, tuple[tuple[str, ...], ...]]  # level -> block -> prompt ids
    conditions: tuple[str, ...]
    passes: int
    boots_per_condition: int
    order: Order
    looks: int
    seed: int | str
    partitions: Mapping[str, tuple[tuple[tuple[str, ...], ...], ...]] = field(
        default_factory=dict)
    level_passes: Mapping[str, int] = field(default_factory=dict)
    """Levels that run fewer passes over the campaign than passes x boots (see runs)."""

    def runs(self, level: str, boot: int, pass_index: int) -> bool:
        """Whether ``level`` runs that pass: the first pass of every boot first, then the
        second of every boot, and so on, up to its ``level_passes``."""
        every = self.passes * self.boots_per_condition
        return pass_index * self.boots_per_condition + boot < self.level_passes.get(level, every)

    def block_of(self, level: str, boot: int = 0, pass_index: int = 0) -> dict[str, int]:
        """Prompt id -> block index at ``level`` in that boot's pass."""
        blocks = (self.partitions[level][boot * self.passes + pass_index]
                  if level in self.partitions else self.blocks[level])
        return {pid: k for k, ids in enumerate(blocks) for pid in ids}


def split_blocks(
    prompt_ids: Sequence[str],
    block_prompts: int,
    strata: Mapping[str, str] | None = None,
    seed: int | str = 0,
    fill: int | None = None,
) -> tuple[tuple[str, ...], ...]:
    """Split prompts into blocks of ``block_prompts``.

    Prompts are shuffled within their stratum (e.g. slice or domain) and interleaved in
    proportion, so strata spread evenly; the sequence is cut into chunks of distinct prompts
    (sizes differing by <= 1, larger chunks first). With ``fill`` (a closed-loop level's
    concurrency) there are ``ceil(len / block_prompts)`` chunks and each is cycled up to
    ``fill`` requests (whole repeats, then a seeded draw without replacement for the rest),
    so the level's concurrency is reached in every stretch even when the trace holds fewer
    prompts than that; with ``block_prompts == fill`` every block holds exactly that many.
    Without, ``len // block_prompts`` chunks (at least one) of at least ``block_prompts``
    prompts each. Each block keeps its requests in trace order (copies of a prompt adjacent).
    """
    ids = list(prompt_ids)
    if not ids:
        raise PlanError("no prompts to split into blocks")
    if len(set(ids)) != len(ids):
        raise PlanError("prompt ids must be unique")
    if block_prompts < 1:
        raise PlanError(f"block_prompts must be >= 1, got {block_prompts}")
    rng = random.Random(f"blocks:{seed}")
    groups: dict[str, list[str]] = {}
    for pid in ids:
        groups.setdefault((strata or {}).get(pid, ""), []).append(pid)
    keyed: list[tuple[float, float, str]] = []
    for key in sorted(groups):
        members = groups[key]
        rng.shuffle(members)
        keyed += [((j + 0.5) / len(members), rng.random(), pid) for j, pid in enumerate(members)]
    dealt = [pid for _, _, pid in sorted(keyed)]
    if fill is not None and fill < 1:
        raise PlanError(f"fill must be >= 1, got {fill}")
    n_blocks = (-(-len(ids) // block_prompts) if fill is not None
                else max(1, len(ids) // block_prompts))
    small, extra = divmod(len(ids), n_blocks)
    place = {pid: i for i, pid in enumerate(ids)}
    out: list[tuple[str, ...]] = []
    at = 0
    for k in range(n_blocks):
        chunk = dealt[at:at + small + (k < extra)]
        at += len(chunk)
        whole, rest = divmod(max(fill or 0, len(chunk)), len(chunk))
        members = chunk * whole + rng.sample(chunk, rest)
        # Within a block, prompts keep their trace order (the queue order of a stretch).
        out.append(tuple(sorted(members, key=place.__getitem__)))
    return tuple(out)


def _balanced_orders(conditions: Sequence[str], n: int, rng: random.Random) -> list[list[str]]:
    """``n`` condition orders, each condition first (and in each position) equally often.

    Rotations of one random permutation form a Latin square; full squares are used whole,
    the remainder takes distinct rotations at random, and the sequence is shuffled.
    """
    base = list(conditions)
    rng.shuffle(base)
    c = len(base)
    rotations = [base[r:] + base[:r] for r in range(c)]
    orders = [list(rot) for _ in range(n // c) for rot in rotations]
    orders += [list(rot) for rot in rng.sample(rotations, n % c)]
    rng.shuffle(orders)
    return orders


def plan_replay(
    prompt_ids: Sequence[str],
    conditions: Sequence[str],
    block_prompts: Mapping[str, int],
    passes: int,
    boots_per_condition: int = 1,
    order: Order = "interleaved",
    strata: Mapping[str, str] | None = None,
    seed: int | str = 0,
    fill: Mapping[str, int] | None = None,
    level_passes: Mapping[str, int] | None = None,
) -> ReplayPlan:
    """The campaign's stretches in execution order.

    ``block_prompts`` maps each load level (in the order levels run within a pass) to its
    block size; pass the level's concurrency for a closed-loop level. ``fill`` maps the
    closed-loop levels to their concurrency: their blocks are cycled up to it
    (:func:`split_blocks`); levels not in it (open loop) are not. By default every level is
    filled to its block size. Loop order: boot ->
    pass -> level -> blocks (seeded random order) -> conditions (counterbalanced over the
    passes of a boot). Early-stopping looks: with one boot, after each pass; with b >= 2 boots,
    after each boot from the second on (an earlier look could not see boot-to-boot variation).
    In the sequential order one look comes after each boot from the second on.
    ``level_passes`` maps levels to fewer passes over the campaign than passes x boots: such
    a level runs the first pass of every boot first, then the second of every boot, and so on
    (the partitions, hence the other levels' blocks, are unchanged).
    """
    conds = tuple(conditions)
    if not conds or len(set(conds)) != len(conds):
        raise PlanError(f"conditions must be non-empty and distinct, got {list(conds)}")
    if not block_prompts:
        raise PlanError("no load level")
    if passes < 1 or boots_per_condition < 1:
        raise PlanError(f"passes and boots_per_condition must be >= 1, got {passes}, "
                        f"{boots_per_condition}")
    if order not in ("interleaved", "sequential"):
        raise PlanError(f"order must be 'interleaved' or 'sequential', got {order!r}")
    # One partition per (boot, pass): the first keeps the seed of fixed-block plans.
    fills = dict(block_prompts) if fill is None else dict(fill)
    fewer = {lv: n for lv, n in (level_passes or {}).items()
             if n < passes * boots_per_condition}
    for lv, n in fewer.items():
        if lv not in block_prompts or n < 1:
            raise PlanError(f"level_passes: {lv!r} needs a load level and at least one pass")
    partitions = {
        level: tuple(
            split_blocks(prompt_ids, size, strata,
                         f"{seed}:{level}" + (f":{r}" if r else ""), fills.get(level))
            for r in range(boots_per_condition * passes))
        for level, size in block_prompts.items()
    }
    blocks = {level: parts[0] for level, parts in partitions.items()}
    rng = random.Random(f"plan:{seed}")
    boots = boots_per_condition
    looks = passes if boots == 1 and order == "interleaved" else max(1, boots - 1)
    out: list[Stretch] = []

    def look_of(boot: int, pass_index: int) -> int:
        if boots == 1:
            return pass_index + 1 if order == "interleaved" else 1
        return max(1, boot)

    def add(boot: int, p: int, level: str, block: int, cond: str, stretch_id: int) -> None:
        if p * boots + boot >= fewer.get(level, passes * boots):
            return
        ids = partitions[level][boot * passes + p][block]
        out.append(Stretch(len(out), boot, p, level, block, cond, ids, stretch_id,
                           look_of(boot, p)))

    if order == "interleaved":
        for boot in range(boots):
            per_block = {
                (level, k): _balanced_orders(conds, passes, rng)
                for level in blocks
                for k in range(len(blocks[level]))
            }
            for p in range(passes):
                for level, level_blocks in blocks.items():
                    sequence = list(range(len(level_blocks)))
                    rng.shuffle(sequence)
                    for k in sequence:
                        for cond in per_block[(level, k)][p]:
                            add(boot, p, level, k, cond, len(out))
    else:
        boot_orders = _balanced_orders(conds, boots, rng)
        stretch_id = 0
        for boot in range(boots):
            for cond in boot_orders[boot]:
                for p in range(passes):
                    for level, level_blocks in blocks.items():
                        sequence = list(range(len(level_blocks)))
                        rng.shuffle(sequence)
                        for k in sequence:
                            add(boot, p, level, k, cond, stretch_id)
                stretch_id += 1
    return ReplayPlan(tuple(out), blocks, conds, passes, boots, order, looks, seed, partitions,
                      fewer)


def plan_facts(plan: ReplayPlan) -> PlanFacts:
    """The plan as campaign.json records it."""
    return PlanFacts(
        passes=plan.passes, boots_per_condition=plan.boots_per_condition, order=plan.order,
        looks=plan.looks, seed=str(plan.seed), level_passes=dict(plan.level_passes),
        blocks={lvl: [list(b) for b in bs] for lvl, bs in plan.blocks.items()},
    )
