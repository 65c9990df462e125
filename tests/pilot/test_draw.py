"""The prompts a pass uses are a seeded draw stratified by slice and domain across the whole
trace: every stratum represented while the budget allows, the unusual slice always, the same
draw for the same seed, and no prompt favoured for its place in the file (checked against
each prompt's expected rate, a planted head-of-file draw failing the same check)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from pytest_osprey.campaign import runner
from pytest_osprey.pilot.draw import (
    ALL,
    FEWER_THAN_STRATA,
    PROPORTIONAL,
    Draw,
    draw_prompts,
    limited,
)
from pytest_osprey.pilot.selection import pass_draws, select_trace
from pytest_osprey.pilot.trace import Prompt, load_trace
from pytest_osprey.preflight.held_out import trace_prompts
from pytest_osprey.results.campaign_file import read_campaign_file
from testkit.factories import make_pilot
from testkit.serving_sim import Planted, TemperatureEngine

# (slice, domain) -> prompts; written grouped by stratum, as hand-made traces are.
LAYOUT = {("core", "chat"): 40, ("core", "code"): 20, ("core", "math"): 10,
          ("unusual", "legal"): 6, ("unusual", "clinical"): 4}


def _prompts(layout: dict[tuple[str, str], int] = LAYOUT) -> list[Prompt]:
    out: list[Prompt] = []
    for (slice_, domain), n in layout.items():
        out += [Prompt(f"{domain}-{i:02d}", domain, slice_, f"{domain} {i}", None, 8, None,
                       "t.jsonl", len(out) + 1) for i in range(n)]
    return out


def _counts(draw: Draw) -> Counter[tuple[str, str]]:
    return Counter((p.slice, p.domain) for p in draw.prompts)


@pytest.mark.parametrize("budget", [5, 8, 16, 33, 79])
def test_every_stratum_is_represented_and_the_rest_is_proportional(budget: int) -> None:
    prompts = _prompts()
    for seed in range(20):
        draw = draw_prompts(prompts, budget, seed, "sampled")
        counts = _counts(draw)
        assert len(draw.prompts) == budget and draw.allocation == PROPORTIONAL
        assert set(counts) == set(LAYOUT)
        for stratum, n in LAYOUT.items():
            share = budget * n / len(prompts)
            # At least one; otherwise its proportional share, rounded (one off at most).
            assert counts[stratum] >= 1 and counts[stratum] <= n
            assert counts[stratum] == 1 or abs(counts[stratum] - share) < 1 + 1e-9
        # The facts say the same.
        assert {(s.slice, s.domain): s.drawn for s in draw.strata} == dict(counts)
        assert {(s.slice, s.domain): s.available for s in draw.strata} == LAYOUT


def test_the_same_seed_draws_the_same_prompts_and_other_seeds_others() -> None:
    prompts = _prompts()
    first = draw_prompts(prompts, 12, 7, "sampled")
    assert draw_prompts(list(prompts), 12, 7, "sampled").ids == first.ids
    others = {tuple(draw_prompts(prompts, 12, s, "sampled").ids) for s in range(30)}
    assert len(others) > 20
    # The passes draw independently of one another under one seed.
    assert draw_prompts(prompts, 12, 7, "params").ids != first.ids
    # Drawn prompts keep trace order.
    order = {p.id: i for i, p in enumerate(prompts)}
    assert [order[i] for i in first.ids] == sorted(order[i] for i in first.ids)


@pytest.mark.parametrize("budget", [1, 2, 3, 4])
def test_the_unusual_slice_is_always_drawn_even_below_the_strata(budget: int) -> None:
    prompts = _prompts()
    for seed in range(200):
        draw = draw_prompts(prompts, budget, seed, "sampled")
        assert len(draw.prompts) == budget and draw.allocation == FEWER_THAN_STRATA
        assert sum(p.slice == "unusual" for p in draw.prompts) >= 1
        assert len(_counts(draw)) == budget  # one per stratum: as many domains as prompts
    # A trace without the slice draws what it has.
    core = [p for p in prompts if p.slice == "core"]
    assert len(draw_prompts(core, 2, 0, "sampled").prompts) == 2


def test_a_budget_covering_the_trace_takes_all_of_it() -> None:
    prompts = _prompts()
    for budget in (None, len(prompts), len(prompts) + 5):
        draw = draw_prompts(prompts, budget, 3, "sampled")
        assert draw.ids == [p.id for p in prompts] and draw.allocation == ALL
        assert "all 80 prompts" in draw.reason


Drawer = Callable[[Sequence[Prompt], int, int], list[str]]


def _rates_match(prompts: Sequence[Prompt], budget: int, drawer: Drawer,
                 expected: dict[str, float], seeds: int) -> float:
    """Chi-square p-value of every prompt's draw count across ``seeds`` against its
    expectation (``expected``: id -> probability per draw)."""
    hits = Counter(pid for seed in range(seeds) for pid in drawer(prompts, budget, seed))
    observed = np.array([hits[p.id] for p in prompts], dtype=float)
    want = np.array([expected[p.id] * seeds for p in prompts])
    # Each draw has a fixed size, so the counts sum to seeds * budget on both sides.
    return float(stats.chisquare(observed, want, ddof=0).pvalue)


def test_no_prompt_is_favoured_for_its_place_in_the_file() -> None:
    prompts, budget, seeds = _prompts(), 16, 1500
    first = draw_prompts(prompts, budget, 0, "sampled")
    # With every stratum represented the allocation is fixed: a prompt of stratum s is
    # drawn with probability drawn_s / available_s.
    rate = {(s.slice, s.domain): s.drawn / s.available for s in first.strata}
    expected = {p.id: rate[(p.slice, p.domain)] for p in prompts}

    def seeded(ps: Sequence[Prompt], n: int, seed: int) -> list[str]:
        return draw_prompts(ps, n, seed, "sampled").ids

    assert _rates_match(prompts, budget, seeded, expected, seeds) > 0.001
    # The head of each stratum is not drawn more than its tail.
    heads = [p.id for p in prompts if int(p.id[-2:]) < 2]
    hits = Counter(i for s in range(seeds) for i in seeded(prompts, budget, s))
    assert abs(sum(hits[i] for i in heads) / seeds - sum(expected[i] for i in heads)) < 0.25

    # A planted fault: a draw with the right strata sizes that takes each stratum's first
    # prompts (the head of the file) fails the same check.
    def head_of_stratum(ps: Sequence[Prompt], n: int, seed: int) -> list[str]:
        want = _counts(draw_prompts(ps, n, seed, "sampled"))
        seen: Counter[tuple[str, str]] = Counter()
        out = []
        for p in ps:
            seen[(p.slice, p.domain)] += 1
            if seen[(p.slice, p.domain)] <= want[(p.slice, p.domain)]:
                out.append(p.id)
        return out

    assert _rates_match(prompts, budget, head_of_stratum, expected, 200) < 1e-6


def test_below_the_strata_prompts_of_a_stratum_are_drawn_alike() -> None:
    # Two prompts, five strata: which strata vary, but within each stratum every prompt is
    # equally likely, whatever its line.
    prompts, seeds = _prompts(), 3000
    draws = [draw_prompts(prompts, 2, s, "sampled") for s in range(seeds)]
    hits = Counter(i for d in draws for i in d.ids)
    for stratum in LAYOUT:
        members = [p.id for p in prompts if (p.slice, p.domain) == stratum]
        counts = np.array([hits[i] for i in members], dtype=float)
        assert counts.sum() > 0
        assert stats.chisquare(counts).pvalue > 0.001, stratum
    # Larger strata are drawn more often (weighted by size); unusual in every draw.
    chat = sum(hits[p.id] for p in prompts if p.domain == "chat")
    math = sum(hits[p.id] for p in prompts if p.domain == "math")
    assert chat > math
    assert all(any(p.slice == "unusual" for p in d.prompts) for d in draws)


def test_limit_and_limit_per_slice_draw_across_the_trace() -> None:
    prompts = _prompts()
    draw = limited(prompts, None, 10, 5)
    assert len(draw.prompts) == 10 and set(_counts(draw)) == set(LAYOUT)
    per = limited(prompts, 6, None, 5)
    slices = Counter(p.slice for p in per.prompts)
    assert slices == {"core": 6, "unusual": 6}
    assert {p.domain for p in per.prompts if p.slice == "core"} == {"chat", "code", "math"}
    both = limited(prompts, 6, 4, 5)
    assert len(both.prompts) == 4 and {p.slice for p in both.prompts} == {"core", "unusual"}
    assert both.facts()["population"] == len(prompts)


def _write(path: Path, prompts: Sequence[Prompt]) -> Path:
    path.write_text("".join(json.dumps({"id": p.id, "domain": p.domain, "slice": p.slice,
                                        "prompt": p.prompt, "max_new_tokens": 8}) + "\n"
                            for p in prompts), "utf-8")
    return path


def test_the_pilot_and_the_held_out_check_see_the_same_drawn_prompts(tmp_path: Path) -> None:
    trace = _write(tmp_path / "t.jsonl", _prompts())
    pilot = make_pilot(trace={"files": [str(trace)], "limit": 9},
                       sampling={"seed": 3})
    path = tmp_path / "pilot.yaml"
    chosen, draw = select_trace(pilot, path)
    assert draw is not None and chosen.ids == draw.ids and len(chosen.ids) == 9
    assert chosen.ids != [p.id for p in _prompts()][:9]  # not the head
    assert {p.domain for p in chosen.prompts} == {d for _, d in LAYOUT}
    assert [p.id for p in trace_prompts(pilot)] == chosen.ids
    # Another seed, another draw, for both.
    other = make_pilot(trace={"files": [str(trace)], "limit": 9}, sampling={"seed": 4})
    assert select_trace(other, path)[0].ids != chosen.ids
    assert [p.id for p in trace_prompts(other)] == select_trace(other, path)[0].ids
    # Without a limit nothing is drawn.
    plain = make_pilot(trace={"files": [str(trace)]})
    assert select_trace(plain, path)[1] is None


def test_the_pass_draws_follow_the_pilot() -> None:
    prompts = _prompts()
    pilot = make_pilot(sampling={"sampled": {"enabled": True, "prompts": 7},
                                 "params": {"enabled": True, "prompts": 2}, "seed": 11})
    draws = pass_draws(pilot, prompts)
    assert len(draws["sampled"].prompts) == 7 and len(draws["params"].prompts) == 2
    assert draws["sampled"].ids == draw_prompts(prompts, 7, 11, "sampled").ids
    assert any(p.slice == "unusual" for p in draws["params"].prompts)
    facts: dict[str, Any] = draws["sampled"].facts()
    assert facts["seed"] == 11 and facts["drawn"] == 7 and facts["prompt_ids"] == \
        draws["sampled"].ids
    assert sum(s["drawn"] for s in facts["strata"]) == 7
    off = make_pilot(sampling={"sampled": {"enabled": False}})
    assert "sampled" not in pass_draws(off, prompts)


def test_campaign_json_records_the_draws_and_the_size_the_records_bear_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = {("core", "chat"): 4, ("core", "code"): 3, ("unusual", "legal"): 2}
    trace_path = _write(tmp_path / "t.jsonl", _prompts(layout))
    pilot = make_pilot(trace={"files": [str(trace_path)], "limit": 6},
                       load={"levels": {"c1": 1}, "passes": 1, "warmup_requests": 0},
                       sampling={"serving": {"temperature": 0.8}, "seed": 2,
                                 "sampled": {"prompts": 3, "samples_per_prompt": 2}})
    monkeypatch.setattr(runner, "make_engine", lambda p, c, b: TemperatureEngine(
        c, p.conditions[c].speculates, Planted()))
    trace, draw = select_trace(pilot, tmp_path / "pilot.yaml")
    data = runner.Campaign(pilot, trace, tmp_path / "res", ["base", "cand"],
                           trace_draw=draw).run()
    meta = read_campaign_file(tmp_path / "res" / "campaign.json")
    assert set(meta.draws) == {"trace", "sampled"}
    assert meta.draws["trace"].prompt_ids == trace.ids == meta.prompt_ids
    sampled = meta.draws["sampled"]
    assert sampled.seed == 2 and sampled.drawn == 3 and sampled.population == 6
    assert any(s.slice == "unusual" and s.drawn for s in sampled.strata)
    assert sampled.reason and sampled.allocation == PROPORTIONAL
    # The sampled pass sent exactly the drawn prompts.
    sent = {r.prompt_id for r in data.records if r.mode == "sampled"}
    assert sent == set(sampled.prompt_ids)
    # The planned size is what ran: timed, greedy (untimed) and sampled requests ...
    size = meta.size
    assert size is not None
    modes = Counter(r.mode for r in data.records if not r.filler)
    assert modes == {"serving": 2 * size.timed, "greedy": 2 * size.greedy,
                     "sampled": 2 * size.sampled}
    # ... and the baseline's scoring of every sampled output (requests, not records).
    assert size.scoring == modes["sampled"]
    assert size.requests == sum(modes.values()) + size.scoring
    assert size.quality_requests == modes["greedy"] + modes["sampled"] + size.scoring
    assert size.quality_share == pytest.approx(size.quality_requests / size.requests, abs=1e-4)
    assert load_trace([trace_path]).ids[:6] != trace.ids  # the limit drew, not the head


def test_campaign_json_from_before_draws_is_still_read(tmp_path: Path) -> None:
    (tmp_path / "campaign.json").write_text(json.dumps(
        {"schema": 1, "run_id": "r", "prompt_ids": ["a"], "status": "complete"}), "utf-8")
    meta = read_campaign_file(tmp_path / "campaign.json")
    assert meta.draws == {} and meta.size is None
