"""Per condition and load level: the measured figures every report shows (from records alone).

:class:`Figures` is declared once: it is both what judging computes and the `figures[]` entry
of summary.json (its docstrings are the reference's field descriptions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from ...pilot.schema import Pilot, level_label
from ...results.folder import SavedCampaign, level_concurrency
from ...results.records import RequestRecord
from ..cost.pricing import busy_seconds, condition_cost
from ..quality.acceptance import accept_length
from ..quality.correctness import correctness_by_prompt
from ..service.load import level_loads

MemoryKind = Literal["weights", "gpu_peak", "rss_peak"]
"""What a memory figure holds (`memory_kind`)."""


class Figures(BaseModel):
    """Measured figures of one condition at one load level (`figures[]`), from the completed
    greedy requests of that level; null where nothing was measured."""

    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True)

    condition: str
    """Condition name."""
    load: str
    """Load level name."""
    concurrency: int
    """Requests in flight at once (closed loop); for an open-loop level its cap, 0 when
    uncapped."""
    ok: int
    """Completed requests (count)."""
    total: int
    """Requests sent (count); `total - ok` failed."""
    ttft_p50_s: float | None
    """Median time to first token (seconds)."""
    ttft_p95_s: float | None
    """95th percentile time to first token (seconds)."""
    e2e_p50_s: float | None
    """Median completion latency, request sent to last token (seconds)."""
    e2e_p95_s: float | None
    """95th percentile completion latency (seconds)."""
    tpot_p50_s: float | None
    """Median time per output token after the first, (e2e - ttft) / (tokens - 1): the mean
    inter-token latency of a request (seconds per token)."""
    tpot_p95_s: float | None = None
    """95th percentile of that time per output token (seconds per token)."""
    ttft_p99_s: float | None = None
    """99th percentile time to first token (seconds); null below `P99_MIN_REQUESTS`
    completed requests, where the 99th percentile is only the largest value."""
    e2e_p99_s: float | None = None
    """99th percentile completion latency (seconds); null as `ttft_p99_s`."""
    tpot_p99_s: float | None = None
    """99th percentile time per output token (seconds per token); null as `ttft_p99_s`."""
    tokens_per_s: float | None
    """Aggregate throughput: output tokens of the completed requests / busy wall time of the
    level, summed over blocks (tokens per second)."""
    request_tokens_per_s_p50: float | None
    """Median per-request throughput, output tokens / completion latency (tokens per
    second)."""
    accept_length_pooled: float | None
    """Pooled accept length: all output tokens (the prefill's included) / all verify steps
    (tokens per step; docs/acceptance.md); null without speculation (always for the baseline,
    whose steps each yield one token)."""
    accept_length_mean: float | None
    """Per-request accept length, tokens / verify steps (SGLang's `spec_accept_length`),
    averaged over requests (tokens per step); null as `accept_length_pooled`."""
    peak_memory_mb: float | None
    """The condition's memory figure over the whole campaign, not per level (MiB), what
    `memory_kind` says it holds (`conditions.NAME.peak_memory_mb`)."""
    load_label: str = ""
    """How the load level reads in reports: `x4` (closed loop) or `Poisson 2/s` (open
    loop)."""
    dispatch_lag_p99_s: float | None = None
    """Open loop: 99th percentile of how late requests were sent after their Poisson arrival
    times, the client's own lag plus any wait under the in-flight cap (seconds); null for
    closed-loop levels."""
    cost_per_request: float | None = None
    """Serving cost per successful request at this level (`cost.currency`), as in the
    cost table; null when no request succeeded."""
    checked: int | None = None
    """Prompts with an `expect` check whose output was checked at this level (count; first
    completed greedy output of each); null when the trace could not be read."""
    correct: int | None = None
    """Of those, outputs that passed their check (count); null as `checked`."""
    correct_fraction: float | None = None
    """`correct / checked` (0-1); null when nothing was checked."""
    in_flight_mean: float | None = None
    """Measured in-flight load: requests in flight at the engine (fillers included), averaged
    over each completed measured request from its first token to its last, then over the
    requests (from records alone); a closed-loop level below 0.95 x its concurrency fails
    fairness. Null where the records carry no timings."""
    in_flight_min: float | None = None
    """The lowest of those per-request averages (requests)."""
    in_flight_within: float | None = None
    """Share of measured requests whose in-flight average is within +-5% of the level's
    concurrency (0-1); null for open-loop levels."""
    achieved_rate: float | None = None
    """Requests per second while the level ran, pooled over its stretches: for an open-loop
    level the achieved arrival rate ((arrivals - 1) / span of their start times), for a
    closed-loop level the measured requests' throughput (requests / span from a stretch's
    first start to its last measured end)."""
    fillers: int = 0
    """Fillers sent at this level to hold the load steady (recorded, never judged)."""
    requests_per_s: float | None = None
    """Request throughput: completed measured requests / busy wall time of the level, the
    same wall time as `tokens_per_s` (requests per second)."""
    input_tokens_mean: float | None = None
    """Mean prompt length of the completed requests, as the engine counted it (tokens); null
    when the engine reports no prompt token count."""
    output_tokens_mean: float | None = None
    """Mean output length of the completed requests (tokens)."""
    output_tokens_total: int | None = None
    """Output tokens of the completed requests (count)."""
    duration_s: float | None = None
    """Busy wall time of the level: the measured stretches' spans, summed (seconds)."""
    memory_kind: MemoryKind | None = None
    """What `peak_memory_mb` holds: `weights` (the embedded engine on CPU: weights + buffers
    loaded, not a peak), `gpu_peak` (peak GPU memory) or `rss_peak` (a server's peak
    resident memory); null where the engine did not say."""
    speedup: float | None = None
    """Completion-latency speedup over the baseline on the whole trace at this level, the
    estimate of its speed gate (`gates[]`: kind `speedup`, reference the baseline, no slice;
    ratio, > 1 faster); null for the baseline and where no such gate was judged."""
    speedup_ci: list[float | None] | None = None
    """[low, high] confidence interval of `speedup` at `decision.confidence` (ratio); null as
    `speedup`."""


def memory_kind(fingerprint: Mapping[str, Any]) -> MemoryKind | None:
    """What an engine's memory figure holds, from its fingerprint's ``memory`` facts."""
    facts = fingerprint.get("memory")
    if not isinstance(facts, Mapping):
        return None
    if facts.get("kind") == "gpu":
        return "gpu_peak"
    if facts.get("basis") == "weights":
        return "weights"
    return "rss_peak" if facts.get("basis") == "rss" else None


P99_MIN_REQUESTS = 100
"""Below this many values a 99th percentile is the largest one, or an interpolation toward it:
reports leave it out and say why."""


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _p99(values: list[float]) -> float | None:
    return _pct(values, 99) if len(values) >= P99_MIN_REQUESTS else None


def accept_lengths(records: Sequence[RequestRecord]) -> tuple[float | None, float | None]:
    """(pooled, per-request mean) accept length of the completed requests, tokens per verify
    step: :func:`judgement.quality.acceptance.accept_length`, the one definition."""
    got = accept_length(records)
    return (got.pooled, got.per_request_mean) if got is not None else (None, None)


def figures_for(
    data: SavedCampaign, condition: str, load: str, concurrency: int, label: str | None = None
) -> Figures:
    """The measured figures of one condition at one level (no cost, no correctness)."""
    recs = data.of(condition, load)
    ok = [r for r in recs if r.ok]
    tokens = [r.output_tokens or 0 for r in ok]
    wall = busy_seconds(ok)
    info = data.meta.conditions.get(condition)
    # Speculation is off for the baseline: its one token per step is no accept length.
    baseline = condition == data.meta.baseline or (info is not None and info.role == "baseline")
    pooled, mean = (None, None) if baseline else accept_lengths(ok)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    tpot = [t for r in ok if (t := r.tpot_s) is not None]
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return Figures(
        condition=condition,
        load=load,
        concurrency=concurrency,
        ok=len(ok),
        total=len(recs),
        ttft_p50_s=_pct(ttft, 50),
        ttft_p95_s=_pct(ttft, 95),
        ttft_p99_s=_p99(ttft),
        e2e_p50_s=_pct(e2e, 50),
        e2e_p95_s=_pct(e2e, 95),
        e2e_p99_s=_p99(e2e),
        tpot_p50_s=_pct(tpot, 50),
        tpot_p95_s=_pct(tpot, 95),
        tpot_p99_s=_p99(tpot),
        tokens_per_s=sum(tokens) / wall if wall else None,
        requests_per_s=len(ok) / wall if wall else None,
        input_tokens_mean=float(np.mean(prompt)) if prompt else None,
        output_tokens_mean=float(np.mean(tokens)) if tokens else None,
        output_tokens_total=sum(tokens) if ok else None,
        duration_s=wall or None,
        request_tokens_per_s_p50=_pct([t for r in ok if (t := r.tokens_per_s) is not None], 50),
        accept_length_pooled=pooled,
        accept_length_mean=mean,
        peak_memory_mb=info.peak_memory_mb if info is not None else None,
        memory_kind=memory_kind(info.fingerprint) if info is not None else None,
        load_label=label or f"x{concurrency}",
        dispatch_lag_p99_s=_pct([r.dispatch_lag_s for r in recs if r.dispatch_lag_s is not None],
                                99),
    )


def all_figures(data: SavedCampaign, pilot: Pilot | None = None) -> list[Figures]:
    """Every condition at every level; with the pilot, also cost per request and the
    prompts' expect checks."""
    out = []
    loads = {(lv.condition, lv.load): lv for lv in level_loads(data)}
    for cond in data.meta.conditions:
        for level, value in data.meta.load_levels.items():
            fig = figures_for(data, cond, level, level_concurrency(value), level_label(value))
            extra: dict[str, float | int | None] = {}
            if (lv := loads.get((cond, level))) is not None:
                extra |= {"in_flight_mean": lv.mean, "in_flight_min": lv.min,
                          "in_flight_within": lv.within, "achieved_rate": lv.achieved_rate,
                          "fillers": lv.fillers}
            if pilot is not None:
                extra["cost_per_request"] = condition_cost(pilot, data, cond, level) \
                    .cost_per_request
            if data.prompts is not None:
                passed = correctness_by_prompt(data.of(cond, level, "greedy"), data.prompts)
                n = len(passed)
                extra |= {"checked": n, "correct": sum(passed.values()),
                          "correct_fraction": sum(passed.values()) / n if n else None}
            out.append(fig.model_copy(update=extra) if extra else fig)
    return out
