"""The replay plan: balance, counterbalancing, determinism, contiguity (campaign.schedule)."""

from __future__ import annotations

from collections import Counter
from itertools import groupby

import pytest

from pytest_osprey.campaign.schedule import PlanError, ReplayPlan, plan_replay, split_blocks

IDS = [f"{d}-{i:02d}" for d in ("chat", "code", "math") for i in range(7)]  # 21 prompts
STRATA = {pid: pid.split("-")[0] for pid in IDS}
LEVELS = {"low": 1, "concurrent": 4}


def plan(**kw: object) -> ReplayPlan:
    args: dict[str, object] = {"prompt_ids": IDS, "conditions": ["base", "cand", "alt"],
                               "block_prompts": LEVELS, "passes": 3, "strata": STRATA,
                               "seed": 7}
    args.update(kw)
    return plan_replay(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize("order", ["interleaved", "sequential"])
@pytest.mark.parametrize(("passes", "boots"), [(1, 1), (2, 1), (3, 2), (4, 3)])
def test_every_condition_sees_every_prompt_in_every_pass(order: str, passes: int,
                                                         boots: int) -> None:
    p = plan(order=order, passes=passes, boots_per_condition=boots)
    cells = Counter((s.condition, s.level, s.boot, s.pass_index, pid)
                    for s in p.stretches for pid in s.prompt_ids)
    # Every prompt in every (condition, level, boot, pass): the data layout has no holes ...
    assert len(cells) == 3 * len(LEVELS) * boots * passes * len(IDS)
    # ... and the conditions replay the very same requests (copies included) in each.
    per_cond: dict[str, Counter[tuple[str, int, int, int, str]]] = {}
    for s in p.stretches:
        per_cond.setdefault(s.condition, Counter()).update(
            (s.level, s.boot, s.pass_index, s.block, pid) for pid in s.prompt_ids)
    assert per_cond["base"] == per_cond["cand"] == per_cond["alt"]


def test_blocks_hold_exactly_the_level_and_are_stratified() -> None:
    blocks = split_blocks(IDS, 4, STRATA, seed=1, fill=4)
    assert [len(b) for b in blocks] == [4] * 6  # ceil(21 / 4) blocks of 4 in flight
    assert sorted(len(set(b)) for b in blocks) == [3, 3, 3, 4, 4, 4]  # equal shares of prompts
    assert sorted({pid for b in blocks for pid in b}) == sorted(IDS)
    owner = {pid: k for k, b in enumerate(blocks) for pid in b}
    assert all(owner[pid] == k for k, b in enumerate(blocks) for pid in b)  # copies stay home
    for b in blocks:  # 7 prompts per domain over 6 blocks of 3-4 prompts: 2+ domains each
        assert len({STRATA[pid] for pid in b}) >= 2
    assert {len(b) for b in split_blocks(IDS, 1, STRATA, fill=1)} == {1}  # one prompt a block


def test_unfilled_blocks_hold_at_least_their_size_and_never_repeat() -> None:
    """Open-loop levels (no concurrency to reach): blocks of >= block_prompts distinct
    prompts, one block when the size exceeds the trace."""
    blocks = split_blocks(IDS, 4, STRATA, seed=1)
    assert sorted(len(b) for b in blocks) == [4, 4, 4, 4, 5]
    assert sorted(pid for b in blocks for pid in b) == sorted(IDS)
    assert split_blocks(IDS, 100, STRATA) == (tuple(IDS),)
    p = plan(block_prompts={"open": 100, "x": 4}, fill={"x": 4}, passes=1)
    assert {len(s.prompt_ids) for s in p.stretches if s.level == "open"} == {21}
    assert {len(s.prompt_ids) for s in p.stretches if s.level == "x"} == {4}
    closed_large = split_blocks(IDS, 100, STRATA, fill=4)  # a block larger than c: no repeats
    assert closed_large == (tuple(IDS),)


@pytest.mark.parametrize("size", [32, 64, 128])
def test_a_level_above_the_trace_cycles_it(size: int) -> None:
    blocks = split_blocks(IDS, size, STRATA, seed=2, fill=size)
    assert len(blocks) == 1 and len(blocks[0]) == size
    counts = Counter(blocks[0])
    assert set(counts) == set(IDS)  # every prompt, repeats differing by at most one
    assert max(counts.values()) - min(counts.values()) <= 1
    p = plan(block_prompts={"x": size}, passes=2)
    for s in p.stretches:
        assert len(s.prompt_ids) == size


def test_blocks_are_drawn_afresh_every_pass_and_boot() -> None:
    p = plan(passes=3, boots_per_condition=2)
    for s in p.stretches:
        assert s.prompt_ids == p.partitions[s.level][s.boot * 3 + s.pass_index][s.block]
        assert p.block_of(s.level, s.boot, s.pass_index)[s.prompt_ids[0]] == s.block
    assert p.blocks["concurrent"] == p.partitions["concurrent"][0]
    seen = {frozenset(frozenset(b) for b in part) for part in p.partitions["concurrent"]}
    assert len(seen) == 6  # membership changes every pass: time units grow with passes
    assert plan(seed=5).partitions == plan(seed=5).partitions


def test_interleaved_stretches_are_one_block_of_one_condition_in_a_row() -> None:
    p = plan(passes=2)
    assert [s.index for s in p.stretches] == list(range(len(p.stretches)))
    assert len({s.stretch_id for s in p.stretches}) == len(p.stretches)
    # Within a (boot, pass, level) each block's conditions run back to back.
    for _, group in groupby(p.stretches, key=lambda s: (s.boot, s.pass_index, s.level)):
        items = list(group)
        runs = [k for k, _ in groupby(items, key=lambda s: s.block)]
        assert len(runs) == len(set(runs)) == len(p.blocks[items[0].level])
        for _, members in groupby(items, key=lambda s: s.block):
            assert sorted(s.condition for s in members) == ["alt", "base", "cand"]


@pytest.mark.parametrize("passes", [3, 6])
def test_each_condition_first_equally_often_over_passes(passes: int) -> None:
    p = plan(passes=passes)
    first: Counter[tuple[str, int, str]] = Counter()
    position: Counter[tuple[str, int, str, int]] = Counter()
    for (_, _, level, block), group in groupby(
            p.stretches, key=lambda s: (s.boot, s.pass_index, s.level, s.block)):
        order = [s.condition for s in group]
        first[(level, block, order[0])] += 1
        for i, cond in enumerate(order):
            position[(level, block, cond, i)] += 1
    # 3 conditions, passes a multiple of 3: each first (and in each position) passes/3 times.
    assert set(first.values()) == {passes // 3}
    assert set(position.values()) == {passes // 3}
    assert len(first) == 3 * sum(len(b) for b in p.blocks.values())


def test_two_conditions_two_passes_alternate_which_goes_first() -> None:
    p = plan(conditions=["base", "cand"], passes=2)
    firsts: dict[tuple[str, int], list[str]] = {}
    for (_, _, level, block), group in groupby(
            p.stretches, key=lambda s: (s.boot, s.pass_index, s.level, s.block)):
        firsts.setdefault((level, block), []).append(next(group).condition)
    assert all(sorted(v) == ["base", "cand"] for v in firsts.values())


def test_block_order_is_randomised_per_pass() -> None:
    p = plan(passes=4)
    orders = set()
    for (_, _, level), group in groupby(p.stretches,
                                        key=lambda s: (s.boot, s.pass_index, s.level)):
        if level == "low":
            orders.add(tuple(k for k, _ in groupby(s.block for s in group)))
    assert len(orders) == 4  # 21! orders: four passes never repeat one


def test_deterministic_by_seed() -> None:
    assert plan(seed=3) == plan(seed=3)
    assert plan(seed=3).stretches != plan(seed=4).stretches
    assert plan(seed="a").stretches == plan(seed="a").stretches


def test_sequential_mode_runs_each_condition_contiguously_per_boot() -> None:
    p = plan(order="sequential", passes=2, boots_per_condition=3)
    runs = [(k, list(g)) for k, g in groupby(p.stretches, key=lambda s: (s.boot, s.condition))]
    assert len(runs) == 3 * 3  # one contiguous run per condition per boot
    for (_, _), members in runs:
        assert len({s.stretch_id for s in members}) == 1
    ids = [members[0].stretch_id for _, members in runs]
    assert ids == sorted(set(ids))
    # The condition order rotates over boots: each condition first once in 3 boots.
    first = [next(m for (b, _), m in runs if b == boot)[0].condition for boot in range(3)]
    assert sorted(first) == ["alt", "base", "cand"]


def test_looks_after_each_pass_or_each_boot() -> None:
    one = plan(passes=3)
    assert one.looks == 3
    assert [s.look for s in one.stretches] == [s.pass_index + 1 for s in one.stretches]
    three = plan(passes=2, boots_per_condition=3)
    assert three.looks == 2
    assert {(s.boot, s.look) for s in three.stretches} == {(0, 1), (1, 1), (2, 2)}
    assert plan(order="sequential", boots_per_condition=1).looks == 1


@pytest.mark.parametrize("kw", [{"prompt_ids": []}, {"conditions": []},
                                {"conditions": ["a", "a"]}, {"passes": 0},
                                {"boots_per_condition": 0}, {"block_prompts": {}},
                                {"block_prompts": {"low": 0}}, {"order": "abba"},
                                {"fill": {"low": 0}},
                                {"prompt_ids": ["x", "x"]}])
def test_bad_plans_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(PlanError):
        plan(**kw)
