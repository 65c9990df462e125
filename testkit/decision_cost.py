"""The cost of a decision at the serving twin's speeds: GPU-hours per plan and true effect,
with the decision's power and false KEEP from the calibration's simulated campaigns.

Wall time comes from the twin's schedule in virtual time (testkit/twin_model.py), never from
sleeping: for each condition and load level, one pass is the plan's closed-loop stretches (a
block of ``c`` requests sent together, each finished one replaced by a filler until the
block's requests are all done), with output lengths drawn once per prompt (256-512 tokens);
boots, warm-up, the greedy pass beside sampled timed passes and the sampled pass are added as
the runner runs them (campaign/runner.py, sequential order: one server at a time on one GPU).

The decision is the primary load's speed gate: its data are simulated by testkit/speed_sim.py
through the real replay planner under the calibration's reference noise (AR(1) within a
stretch, stretch shocks, a tenth of requests slowed 3x) plus a 5% per-boot offset, with the
true speedup planted, and judged as the gate judges (fixed test or group-sequential looks,
the drift rule). The true effect is the speedup over the gate's threshold (1.0: at the
threshold, where KEEP is a false KEEP). The candidate's own serving time is its reference's
divided by the effect.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np

from .speed_sim import KEEP, REFERENCE_NOISE, Design, fixed_outcomes, sequential_outcomes, simulate
from .twin_model import Profile, Request, Scheduler, profile

BOOT_NOISE_SD = 0.05


@dataclass(frozen=True)
class Example:
    """The campaign's shape: examples/pilot-osprey-vs-eagle3.yaml with 256-512-token outputs."""

    prompts: int = 50
    levels: tuple[tuple[str, int], ...] = (("low", 1), ("medium", 8), ("high", 32))
    primary: str = "medium"
    conditions: tuple[str, ...] = ("plain", "eagle3-like", "candidate")
    tokens: tuple[int, int] = (256, 512)
    prompt_tokens: int = 200
    boot_s: float = 120.0  # a boot of an 8B server (weights, CUDA graphs): the header's default
    warmup: int = 8
    greedy: bool = True  # timed at temperature 0.7: a greedy pass beside, every boot
    sampled_requests: int = 64  # 8 prompts x 8 samples, each condition's first boot
    seed: int = 0

    def output_tokens(self) -> list[int]:
        rng = np.random.default_rng(self.seed)
        return [int(x) for x in rng.integers(self.tokens[0], self.tokens[1] + 1, self.prompts)]


@dataclass(frozen=True)
class Plan:
    """Passes per boot, boots, early stopping, and the levels given fewer passes over the
    campaign (``load.level_passes``: the first pass of every boot first)."""

    name: str
    passes: int = 4
    boots: int = 2
    early_stop: bool = False
    level_passes: Mapping[str, int] = field(default_factory=dict)
    greedy_boots: int | None = None  # sampling.greedy_boots: the greedy pass's boots

    def runs(self, level: str, boot: int, pass_index: int) -> bool:
        every = self.passes * self.boots
        return pass_index * self.boots + boot < self.level_passes.get(level, every)


def stretch_s(prof: Profile, tokens: list[int], prompt_tokens: int, seed: int) -> float:
    """Seconds until a closed-loop block's requests (one per entry of ``tokens``) are all
    done, fillers keeping the level's concurrency (their lengths cycle through ``tokens``)."""
    sched = Scheduler(prof, seed=seed)
    measured = [Request(f"m{i}", prompt_tokens, n) for i, n in enumerate(tokens)]
    for req in measured:
        sched.add(req)
    now, left, k = 0.0, len(measured), 0
    mine = {id(r) for r in measured}
    while left:
        cost, moved = sched.step()
        now += cost
        for req, _ in moved:
            if req.done:
                if id(req) in mine:
                    mine.discard(id(req))
                    left -= 1
                if left:
                    sched.add(Request(f"f{k}", prompt_tokens, tokens[k % len(tokens)]))
                    k += 1
    return now


@cache
def pass_s(name: str, concurrency: int, example: Example = Example()) -> float:
    """One pass of one condition at one level: ceil(prompts / c) blocks, each cycled to ``c``
    requests, one stretch each (the runner's fillers keep the load)."""
    prof = profile(name)
    tokens = example.output_tokens()
    blocks = math.ceil(len(tokens) / concurrency)
    total = 0.0
    for b in range(blocks):
        chunk = tokens[b::blocks]
        block = (chunk * concurrency)[:concurrency]
        total += stretch_s(prof, block, example.prompt_tokens, seed=1000 * concurrency + b)
    return total


def request_s(name: str, example: Example = Example()) -> float:
    """The mean seconds of one request served alone (warm-up, greedy and sampled passes)."""
    return pass_s(name, 1, example) / example.prompts


@dataclass(frozen=True)
class Timing:
    """Seconds per boot of each condition's fixed phases and per pass of each level."""

    boot_phase: dict[str, float]  # boot + warm-up, per boot
    greedy: dict[str, float]  # the untimed greedy pass, per boot that runs it
    once: dict[str, float]  # the sampled pass, each condition's first boot
    per_pass: dict[tuple[str, str], float]  # (condition, level) -> one pass


def timing(effect: float, example: Example = Example()) -> Timing:
    """The twin's times; the candidate serves its reference's (EAGLE-3-like) over ``effect``."""
    def of(cond: str) -> tuple[str, float]:
        return ("eagle3-like", effect) if cond == "candidate" else (
            "eagle3-like" if cond == "eagle3-like" else "plain", 1.0)

    boot_phase, greedy, once, per_pass = {}, {}, {}, {}
    for cond in example.conditions:
        name, speed = of(cond)
        one = request_s(name, example) / speed
        boot_phase[cond] = example.boot_s + one * example.warmup
        greedy[cond] = one * example.prompts if example.greedy else 0.0
        once[cond] = one * example.sampled_requests
        for level, c in example.levels:
            per_pass[(cond, level)] = pass_s(name, c, example) / speed
    return Timing(boot_phase, greedy, once, per_pass)


def boot_s(t: Timing, plan: Plan, boot: int, example: Example = Example()) -> float:
    """Boot round ``boot``: every condition boots, warms up, runs the passes the plan gives
    each level in that boot, and its greedy pass (on the plan's greedy boots)."""
    greedy = plan.greedy_boots is None or boot < plan.greedy_boots
    return sum(t.boot_phase[c] + (t.greedy[c] if greedy else 0.0)
               + sum(t.per_pass[(c, lv)] for lv, _ in example.levels
                     for p in range(plan.passes) if plan.runs(lv, boot, p))
               for c in example.conditions)


def campaign_s(t: Timing, plan: Plan, boots_run: int, example: Example = Example()) -> float:
    """Wall seconds of ``boots_run`` boot rounds and the sampled pass (one server at a time)."""
    return sum(boot_s(t, plan, b, example) for b in range(boots_run)) + sum(t.once.values())


@dataclass(frozen=True)
class Row:
    plan: str
    effect: float
    gpu_hours: float  # expected (mean over the simulated campaigns)
    worst_gpu_hours: float  # every look continuing
    keep: float  # share of KEEP: power, or false KEEP at effect 1.0
    drop: float
    sims: int


def decision_design(plan: Plan, example: Example = Example()) -> Design:
    """The primary level's share of the campaign as the calibration simulates it."""
    c = dict(example.levels)[example.primary]
    return Design(prompts=example.prompts, levels=((example.primary, c),),
                  primary=example.primary, passes=plan.passes, boots=plan.boots,
                  order="sequential")


def evaluate(plan: Plan, effect: float, sims: int, seed: int = 0, alpha: float = 0.025,
             example: Example = Example(), devices: int = 1) -> Row:
    """GPU-hours, KEEP and DROP shares of ``plan`` at a true ``effect`` over the threshold."""
    design = decision_design(plan, example)
    noise = replace(REFERENCE_NOISE, boot_sd=BOOT_NOISE_SD)
    camp = simulate(design, noise, effect, sims, seed, pool_size=64)
    t = timing(effect, example)
    if plan.early_stop:
        code, used = sequential_outcomes(camp, 1.0, alpha=alpha)
        # Look k sees the first k + 1 boots (several boots) or k passes (one boot; its
        # boot round is then paid whole: the sampled and greedy passes still run).
        rounds = (used + 1) if plan.boots > 1 else np.ones_like(used)
    else:
        code = fixed_outcomes(camp, 1.0, alpha=alpha)
        rounds = np.full(code.shape, plan.boots)
    spent = {r: campaign_s(t, plan, r, example) for r in range(1, plan.boots + 1)}
    hours = np.array([spent[int(r)] for r in rounds]) / 3600 * devices
    worst = campaign_s(t, plan, plan.boots, example) / 3600 * devices
    return Row(plan.name, effect, float(hours.mean()), worst, float(np.mean(code == KEEP)),
               float(np.mean(code == 0)), sims)


ONCE = {"low": 1, "high": 1}  # the informing levels measured on the first boot's first pass
PLANS = (
    Plan("fixed: 4 passes x 2 boots (shipped)"),
    Plan("early stop on the shipped design (its one look is the end)", early_stop=True),
    Plan("shipped + level_passes {low: 1, high: 1}", level_passes=ONCE),
    Plan("early stop, 1 pass x 4 boots + level_passes", passes=1, boots=4, early_stop=True,
         level_passes=ONCE),
    Plan("early stop, 1 pass x 6 boots + level_passes", passes=1, boots=6, early_stop=True,
         level_passes=ONCE),
    Plan("early stop, 1 pass x 8 boots + level_passes", passes=1, boots=8, early_stop=True,
         level_passes=ONCE),
    Plan("early stop, 1 pass x 6 boots + level_passes + greedy_boots 2", passes=1, boots=6,
         early_stop=True, level_passes=ONCE, greedy_boots=2),
    Plan("early stop, 1 pass x 6 boots + level_passes + greedy_boots 1", passes=1, boots=6,
         early_stop=True, level_passes=ONCE, greedy_boots=1),
)
EFFECTS = (1.0, 1.1, 1.2, 1.5)


__all__ = ["EFFECTS", "ONCE", "PLANS", "Example", "Plan", "Row", "Timing", "boot_s", "campaign_s",
           "decision_design", "evaluate", "pass_s", "request_s", "stretch_s", "timing"]
