"""The pilot's sampling: what the service serves with (the timed passes), the greedy pass, the
distribution check's sampled pass (following the service unless named) and the
sampling-parameters pass."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from .base import Count, Strict

SAMPLED_PROMPTS = 8
"""Default prompts of the sampled pass (a seeded stratified draw from the trace)."""
SAMPLES_PER_PROMPT = 8
"""Default samples per prompt and condition of the sampled pass."""


class SampledPass(Strict):
    enabled: bool | None = None
    """Run the sampled pass (distribution check). Unset: on when the service samples
    (``sampling.serving.temperature`` > 0) or the pilot names another key of this pass, off
    otherwise."""
    temperature: Annotated[float, Field(gt=0, le=10, allow_inf_nan=False)] = 0.8
    """Sampling temperature; unset while the service samples: ``sampling.serving``'s."""
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    """Nucleus sampling threshold; unset while the service samples: ``sampling.serving``'s."""
    top_k: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    """Keep only the k most likely tokens (None: off); unset while the service samples:
    ``sampling.serving``'s."""
    min_p: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0
    """Drop tokens below this share of the most likely one's probability (0: off); unset
    while the service samples: ``sampling.serving``'s."""
    samples_per_prompt: Annotated[int, Field(ge=1, le=10_000)] = SAMPLES_PER_PROMPT
    """Samples per prompt and condition (independent draws per condition). With the default
    8 prompts, output collapsed to 3 or 5 distinct sequences per prompt (as drafts verified
    greedily at temperature > 0 give) was caught in 60 of 60 simulated pilots each at alpha
    0.01 (power 95% CI [0.94, 1]), with no false alarm in 60 (benchmarks/distribution_power.py
    on real samples of the tiny target)."""
    prompts: Count | None = Field(
        SAMPLED_PROMPTS, description="Prompts of the sampled pass (None: all of them), drawn "
        "seeded (sampling.seed) and stratified across the trace: every (slice, domain) "
        "represented while N allows, the rest in proportion (largest remainders); the "
        "unusual slice always at least one; below the number of strata, the other strata "
        "drawn at random weighted by size. campaign.json draws.sampled records which and why"
    )
    max_new_tokens: Count | None = None
    """Output budget of the sampled pass (default: the prompt's)."""
    score_top_k: Annotated[int, Field(ge=1, le=1000)] = 20
    """Top-K log-probabilities the baseline (the target) returns per sampled token when it
    scores the samples (scores.jsonl) for the distribution gate's exact test; the tail
    beyond K is bounded by its mass, never ignored."""


class ParamsPass(Strict):
    enabled: bool = False
    """Run the sampling-parameters pass: penalties, stop strings, token limits, logit bias and
    constrained decoding greedily, then temperature, top-p, top-k, min-p, penalties and seed
    sampled, on baseline and candidates (judged by the sampling_params gate, one verdict per
    parameter)."""
    prompts: Annotated[int, Field(ge=1, le=10_000)] = 2
    """Prompts of the pass, drawn as ``sampling.sampled.prompts`` are (independently of
    them); campaign.json ``draws.params`` records which and why."""
    max_new_tokens: Annotated[int, Field(ge=4, le=1_000_000)] = 24
    """Output budget of each probe."""
    samples: Annotated[int, Field(ge=0, le=10_000)] = 8
    """Samples per prompt of each sampled probe (temperature, top-p, top-k, min-p, frequency
    and presence penalties, each alone at ``sampling.sampled.temperature``, run to
    ``max_new_tokens``), scored by the target and judged at the drafted positions; with them
    the seed probe (one seeded request twice). 0: greedy probes only."""


class Serving(Strict):
    """The sampling the service runs with: the timed passes (speed) are sent with it."""

    temperature: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)] = 0.0
    """Temperature of the timed requests (0: greedy)."""
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    """Nucleus sampling threshold."""
    top_k: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    """Keep only the k most likely tokens (None: off)."""
    min_p: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0
    """Drop tokens below this share of the most likely one's probability (0: off)."""
    fixed_length: bool = True
    """At temperature > 0, timed requests ignore end of sequence and run to their budget, so
    that every condition times the same number of tokens for a prompt (serving benchmarks do
    the same); at temperature 0 outputs already agree."""

    @property
    def sampled(self) -> bool:
        return self.temperature > 0


class Sampling(Strict):
    """The passes; one that uses part of the trace draws it across the trace (``seed``).

    The draw is stratified by slice and domain (pilot/draw.py), never the trace's first
    prompts; campaign.json ``draws`` records each."""

    greedy: bool = True
    """Run the greedy pass (speed, identity, correctness)."""
    greedy_boots: Annotated[int | None, Field(ge=1, le=64)] = None
    """Where the timed passes run at a sampled serving setting: the boots (the first N) that
    also run the untimed greedy pass; default every boot. What only greedy output shows
    (identity against the baseline, correctness, boot consistency of outputs) is read on
    those boots: 1 leaves boot consistency to accept length and identity without its
    near-tie control (a second greedy pass of the baseline), 2 keeps both. The greedy pass
    serves every prompt one at a time on every condition, so with many boots it can cost
    more than the timed pass (docs/scale.md). Ignored where the timed passes are greedy."""
    sampled: SampledPass = Field(default_factory=SampledPass)
    """The sampled pass (on by default when ``serving`` samples or a key of it is set)."""
    params: ParamsPass = Field(default_factory=ParamsPass)
    """The sampling-parameters pass."""
    serving: Serving = Field(default_factory=Serving)
    """The sampling the timed passes (speed, load) run with; greedy by default."""
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    """Base seed: a sampled request's seed derives from it, the condition, the prompt and the
    sample index (distinct for each, so every sample is drawn independently). It also seeds
    which prompts ``trace.limit``, ``trace.limit_per_slice``, the sampled and the
    parameters passes draw (the same trace and seed: the same prompts)."""

    @model_validator(mode="after")
    def _resolve_sampled(self) -> Sampling:
        # What was left unset follows the service: a sampled service is checked at the
        # sampling it serves with; a pilot that names a key keeps it.
        given, serving = self.sampled.model_fields_set, self.serving
        update: dict[str, Any] = {}
        if self.sampled.enabled is None:  # naming a key of the pass asks for it
            update["enabled"] = serving.sampled or bool(given - {"enabled"})
        if serving.sampled:
            update |= {k: getattr(serving, k) for k in ("temperature", "top_p", "top_k",
                                                          "min_p") if k not in given}
        if not update:
            return self
        sampled = SampledPass.model_validate({**self.sampled.model_dump(exclude_unset=True),
                                              **update})
        object.__setattr__(self, "sampled", sampled)  # frozen: resolved once, here
        return self
