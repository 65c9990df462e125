"""How steady the machine was during a campaign: the baseline against itself, and the load;
and whether a concurrency level measured a queue rather than batching.

The baseline (speculation off) does the same work in every pass, so its latency should not
move between passes; when it does, the machine changed speed (other work, clocks, thermal
state) and every comparison made across that change is less certain. Described here, not
judged: the speed gates own their decisions. Pure arithmetic over records and campaign.json.
"""

from __future__ import annotations

import math

from ...results.folder import SavedCampaign
from ..figures.measured import figures_for
from ..sheet import Sheet

DRIFT_WARN = 0.10
"""A pass-to-pass change of the baseline's latency above this (10%) is flagged."""

QUEUE_THROUGHPUT = 1.25
"""A closed-loop level whose baseline throughput grew less than this over the lowest level's
(while its time to first token grew :data:`QUEUE_TTFT`-fold) measured a queue, not a batch."""
QUEUE_TTFT = 3.0
"""The growth of the baseline's median time to first token that, with flat throughput, says
its requests waited in a queue."""


class BlockDrift(Sheet):
    """The baseline's latency in one pass against its first (`stability.drift[]`)."""

    load: str
    """Load level name."""
    block: int
    """Pass number (1 = the first; a later boot's passes count on)."""
    ratio: float
    """Geometric mean over prompts of this pass's completion latency over the first
    pass's, paired by prompt (1.0: unchanged; 1.73: 73% slower)."""
    prompts: int
    """Prompts paired (count)."""


class BlockLoad(Sheet):
    """The host's load while one stretch ran (`stability.load[]`)."""

    block: int
    """Pass number (1 = the first)."""
    condition: str
    """Condition replayed."""
    load: str
    """Load level name."""
    loadavg_1m: float | None
    """Highest 1-minute load average seen at the stretch's start or end; null: unknown."""
    started: float
    """Wall-clock start (Unix seconds)."""
    ended: float | None
    """Wall-clock end (Unix seconds)."""


class Stability(Sheet):
    """Environment stability (`stability`)."""

    baseline: str | None
    """The condition measured against itself."""
    drift: list[BlockDrift]
    """Per load level and later pass: the baseline's latency ratio to its first pass."""
    max_drift: float | None
    """Largest |ratio - 1| of `drift` (fraction); null with one pass."""
    load: list[BlockLoad]
    """Per replayed stretch (greedy pass): the host's load average."""
    cpus: int | None
    """CPUs of the host (count); null: unknown."""
    warnings: list[str]
    """What looks unsteady, in words; empty when nothing does."""


def baseline_drift(data: SavedCampaign, baseline: str) -> list[BlockDrift]:
    out = []
    for level in data.meta.load_levels:
        per_block: dict[int, dict[str, list[float]]] = {}
        passes = data.meta.plan.passes if data.meta.plan is not None else data.meta.blocks
        for r in data.of(baseline, level):
            if r.ok and r.e2e_s and r.e2e_s > 0:
                instance = r.boot * max(passes, 1) + r.repetition  # the pass, boots counted
                per_block.setdefault(instance, {}).setdefault(r.prompt_id, []).append(
                    math.log(r.e2e_s))
        if not per_block:
            continue
        first = min(per_block)
        for block in sorted(per_block):
            if block == first:
                continue
            common = [p for p in per_block[block] if p in per_block[first]]
            if not common:
                continue
            diffs = [sum(per_block[block][p]) / len(per_block[block][p])
                     - sum(per_block[first][p]) / len(per_block[first][p]) for p in common]
            out.append(BlockDrift(load=level, block=block + 1,
                                  ratio=math.exp(sum(diffs) / len(diffs)), prompts=len(common)))
    return out


def queueing(data: SavedCampaign, baseline: str) -> list[str]:
    """A warning per closed-loop level at which the baseline's aggregate throughput stayed
    within :data:`QUEUE_THROUGHPUT` of its lowest level's while its median time to first
    token grew :data:`QUEUE_TTFT`-fold or more: the engine served those requests one after
    another, so that level measured waiting in a queue rather than batching."""
    closed = sorted((c, level) for level, c in data.meta.load_levels.items()
                    if isinstance(c, int) and not isinstance(c, bool))
    if len(closed) < 2:
        return []
    low_c, low = closed[0]
    ref = figures_for(data, baseline, low, low_c)
    out = []
    for c, level in closed[1:]:
        f = figures_for(data, baseline, level, c)
        if not (ref.tokens_per_s and f.tokens_per_s and ref.ttft_p50_s and f.ttft_p50_s):
            continue
        tput, ttft = f.tokens_per_s / ref.tokens_per_s, f.ttft_p50_s / ref.ttft_p50_s
        if tput < QUEUE_THROUGHPUT and ttft >= QUEUE_TTFT:
            out.append(f"x{c} ({level}) measured queueing on this engine, not batching: "
                       f"baseline throughput {tput:.1f}x of x{low_c}'s, TTFT p50 {ttft:.0f}x")
    return out


def stability(data: SavedCampaign) -> Stability:
    """The baseline's drift between passes and the host's load per stretch, with warnings."""
    baseline = data.meta.baseline
    drift = baseline_drift(data, baseline) if baseline else []
    loads = []
    mode = data.timed_mode
    for e in data.meta.schedule:
        if e.mode != mode:
            continue
        seen = [v[0] for v in (e.loadavg, e.loadavg_end) if v]
        loads.append(BlockLoad(block=e.pass_index + 1, condition=e.condition, load=e.load,
                               loadavg_1m=max(seen) if seen else None, started=e.started,
                               ended=e.ended))
    cpus = data.meta.host.get("cpus")
    cpus = cpus if isinstance(cpus, int) and cpus > 0 else None
    warnings = []
    worst = max(drift, key=lambda d: abs(d.ratio - 1), default=None)
    max_drift = abs(worst.ratio - 1) if worst is not None else None
    if worst is not None and abs(worst.ratio - 1) > DRIFT_WARN:
        how = "slower" if worst.ratio > 1 else "faster"
        warnings.append(
            f"the baseline ran {abs(worst.ratio - 1):.0%} {how} in pass {worst.block} than in "
            f"pass 1 at load {worst.load} (same prompts, speculation off): the machine's "
            "speed changed during the campaign, so speed comparisons are less certain; run on "
            "a quieter machine")
    busy = [x for x in loads if x.loadavg_1m is not None and cpus and x.loadavg_1m > cpus]
    if busy:
        top = max(busy, key=lambda x: x.loadavg_1m or 0.0)
        warnings.append(
            f"load average up to {top.loadavg_1m:.1f} on {cpus} CPUs (pass {top.block}, "
            f"{top.condition}, load {top.load}): other work competed with the engines")
    if baseline:
        warnings += queueing(data, baseline)
    return Stability(baseline=baseline, drift=drift, max_drift=max_drift, load=loads,
                     cpus=cpus, warnings=warnings)
