"""The pilot's limits (pilot.yaml limits): speed, latency, quality, memory, cost and goodput, each
judged as a gate."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .base import MAX_COUNT, MAX_ITEMS, Fraction, PositiveFloat, Ratio, Seconds, Strict, Text


class LatencyLimit(Strict):
    metric: Literal["ttft", "e2e", "tpot"]
    """ttft (first token), e2e (completion) or tpot (time per output token)."""
    percentile: Annotated[float, Field(gt=0, lt=100, allow_inf_nan=False)] = 95
    """Percentile bounded (its upper confidence bound must be within max_s)."""
    max_s: Seconds
    """Limit in seconds."""
    load: Text | None = Field(None, description="Load level it applies to (default: all)")


class QualityLimits(Strict):
    max_genuine_divergences: Annotated[int, Field(ge=0, le=MAX_COUNT)] = 0
    """Greedy outputs (per prompt and load level) that may diverge from the baseline other
    than at a near-tie."""
    near_tie_epsilon: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 0.05
    """A divergence is a near-tie when the candidate's token is the baseline's runner-up and
    the baseline's top-1 minus top-2 logprob there is at or below this."""
    max_near_tie_rate: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.002
    """Near-ties per compared token tolerated when the campaign holds no identical-condition
    control (one pass on one boot); otherwise the baseline's own rate against its
    rerun is the tolerance."""
    max_loss_rate: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0
    """Share of the answers the baseline got right that a candidate may get wrong (expect
    checks; exact binomial rule, one-sided at (1 - decision.confidence)/2). 0: any loss
    fails."""
    distribution_alpha: Fraction = 0.01
    """Significance level of the sampled-distribution test."""
    max_acceptance_drop: Annotated[float, Field(gt=0, lt=1)] = 0.5
    """A draft position whose acceptance rate falls below (1 - this) x the rate it is
    compared with (the current drafter, the same drafter at another load level, or in an
    earlier campaign) is a collapse."""


class MemoryLimits(Strict):
    max_peak_mb: PositiveFloat | None = None
    """Peak memory of a candidate (MiB)."""
    max_increase_pct: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)] | None = None
    """Peak memory increase over the baseline (%)."""


class CostLimits(Strict):
    max_cost_per_request: PositiveFloat | None = None
    """Cost per successful request at the primary load."""
    max_break_even_days: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] | None = None
    """Days of expected traffic to recover the setup cost."""


class GoodputTargets(Strict):
    """Service-level targets a request must meet to count as "good" (goodput); at least one."""

    ttft_s: PositiveFloat | None = None
    """Time to first token at most this (seconds)."""
    tpot_s: PositiveFloat | None = None
    """Mean inter-token latency, (e2e - ttft) / (tokens - 1), at most this (seconds)."""
    e2e_s: PositiveFloat | None = None
    """Completion latency at most this (seconds)."""
    min_share: Fraction | None = None
    """Share of a candidate's requests that must meet every target (its lower confidence
    bound); default: no absolute floor, only the comparison with the baseline."""
    margin: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.05
    """Non-inferiority margin: the candidate's share may fall at most this far below the
    baseline's (paired by prompt and block)."""

    @model_validator(mode="after")
    def _some_target(self) -> GoodputTargets:
        if self.ttft_s is None and self.tpot_s is None and self.e2e_s is None:
            raise ValueError("name at least one target: ttft_s, tpot_s or e2e_s")
        return self


class Limits(Strict):
    speedup_min: Ratio = 1.0
    """Completion-latency speedup over the baseline that KEEP requires (CI lower bound above it)."""
    latency: list[LatencyLimit] = Field(default_factory=list, max_length=MAX_ITEMS)
    """Latency limits."""
    quality: QualityLimits = Field(default_factory=QualityLimits)
    """Quality limits."""
    memory: MemoryLimits = Field(default_factory=MemoryLimits)
    """Memory limits."""
    cost: CostLimits = Field(default_factory=CostLimits)
    """Cost limits."""
    min_completed_fraction: Fraction = 1.0
    """Share of requests that must complete."""
    goodput: GoodputTargets | None = None
    """Goodput gate per candidate and load level: the share of requests meeting these targets,
    non-inferior to the baseline's (gating at the primary load); default: not judged."""
