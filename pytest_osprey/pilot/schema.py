"""The pilot file's schema (pilot.yaml): every key, its type, bounds, default and description."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .base import ConfigError, Fraction, PositiveFloat, Strict
from .load import _UNION_TAGS, Load, LoadLevel, OpenLoop, level_label

# The schema's public names, those defined in its parts included.
__all__ = ["_UNION_TAGS", "ConfigError", "Load", "LoadLevel", "OpenLoop", "Pilot", "Strict",
           "json_schema", "level_label"]

Engine = Literal["transformers", "sglang", "vllm", "endpoint"]
Role = Literal["baseline", "current", "candidate"]

class Speculation(Strict):
    """How a drafter condition speculates; names follow the engine's own flags."""

    algorithm: str | None = Field(
        None,
        description="transformers: assisted; sglang: EAGLE3|EAGLE|STANDALONE|NGRAM; "
        "vllm: draft_model|ngram|eagle|eagle3. Default: the engine's draft-model method",
    )
    num_draft_tokens: Annotated[int, Field(ge=1, le=64)] = 4
    """Tokens drafted per step (SGLang: includes the root; vLLM: num_speculative_tokens;
    transformers: num_assistant_tokens)."""
    num_steps: Annotated[int, Field(ge=1, le=64)] | None = None
    """SGLang --speculative-num-steps (with eagle_topk 1: num_draft_tokens - 1); vLLM ngram:
    prompt_lookup_max."""
    eagle_topk: Annotated[int, Field(ge=1, le=64)] | None = None
    """SGLang --speculative-eagle-topk (tree width)."""


class Endpoint(Strict):
    """An already running server: nothing is booted or killed for it."""

    url: str
    """Base URL, e.g. http://127.0.0.1:30000."""
    protocol: Literal["sglang", "openai"]
    """sglang: native /generate; openai: /v1/completions."""
    api_key_env: str | None = Field(
        None, description="Name of the environment variable holding the API key"
    )
    model: str | None = Field(None, description="Model name sent to an OpenAI-style server")


class ArtifactPins(Strict):
    sha256: dict[str, str] = Field(
        default_factory=dict, description="file (relative to the drafter) -> expected sha256"
    )
    engine_version: str | None = Field(
        None, description="Version prefix the engine must report, e.g. 0.5.23"
    )
    require_license: bool = False
    """Fail the artifact check when the drafter folder has no LICENSE/COPYING file."""


class Condition(Strict):
    role: Role
    """baseline (speculation off, exactly one), current (the drafter serving today, at most one) or
    candidate."""
    drafter: Path | None = Field(None, description="Drafter checkpoint folder")
    speculation: Speculation | None = None
    """Speculation settings; omit on the baseline."""
    endpoint: Endpoint | None = None
    """Serve this condition from an already running server."""
    dtype: str | None = Field(
        None, description="Override of target.dtype (breaks fairness; for negative controls)"
    )
    quantization: Literal["fp8", "int4"] | None = Field(
        None,
        description="transformers engine: the target's weights rounded to this format (fp8 "
        "e4m3 or symmetric int4, per output channel; compute stays in dtype), as a quantized "
        "deployment would serve them. Breaks fairness; for precision comparisons and negative "
        "controls. Server engines: pass their own flag in engine_args",
    )
    engine_args: list[str] = Field(default_factory=list)
    """Extra engine command-line arguments for this condition."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for this condition's engine."""
    pins: ArtifactPins = Field(default_factory=ArtifactPins)
    """Artifact pins checked before any boot."""

    @model_validator(mode="after")
    def _baseline_has_no_drafter(self) -> Condition:
        if self.role == "baseline" and (self.drafter is not None or self.speculation is not None):
            raise ValueError("the baseline runs with speculation off: remove drafter/speculation")
        return self

    @property
    def speculates(self) -> bool:
        return self.drafter is not None or self.speculation is not None


class Target(Strict):
    engine: Engine = "transformers"
    """transformers (in-process), sglang, vllm, or endpoint."""
    model: str = Field(description="Target checkpoint folder (or a model id a server resolves)")
    dtype: str = "float32"
    """Precision of every condition (float32, bfloat16, float16)."""
    device: str = Field("cpu", description="transformers engine: cpu, cuda, cuda:1 ...")
    python: str | None = Field(
        None,
        description="Python executable of a server engine's venv (a path relative to the "
        "pilot file, or a name on PATH; $VARS expand)",
    )
    env: dict[str, str] = Field(default_factory=dict)
    """Environment for every condition's engine."""
    engine_args: list[str] = Field(default_factory=list)
    """Extra engine command-line arguments for every condition."""
    host: str = "127.0.0.1"
    """Interface servers bind to (127.0.0.1 keeps them off the network)."""
    port: Annotated[int, Field(ge=0, le=65535)] = 0
    """Server port; 0 picks a free one per condition."""
    boot_timeout_s: PositiveFloat = 600.0
    """Seconds a server may take to become healthy."""
    deterministic: bool = Field(
        False, description="Engine's deterministic mode on every condition (SGLang)"
    )
    context_length: Annotated[int, Field(ge=16)] = 2048
    """Context length (vLLM --max-model-len; transformers: prompt + output limit)."""
    tp_size: Annotated[int, Field(ge=1)] = 1
    """Tensor-parallel size of a server engine."""
    mem_fraction: Annotated[float, Field(gt=0, le=1)] | None = None
    """SGLang --mem-fraction-static / vLLM --gpu-memory-utilization."""
    api_key_env: str | None = None
    """Name of the environment variable holding the servers' API key (never the key itself)."""
    threads: Annotated[int, Field(ge=1)] | None = Field(
        None, description="transformers engine: torch threads (default: torch's own)"
    )


class TraceSpec(Strict):
    files: list[Path] = Field(min_length=1)
    """Prompt trace files (JSONL, see prompts/README.md)."""
    ids: list[str] | None = None
    """Use only these prompt ids (in trace order)."""
    slices: list[str] | None = None
    """Use only these slices."""
    limit_per_slice: Annotated[int, Field(ge=1)] | None = None
    """At most this many prompts per slice (first in trace order)."""
    limit: Annotated[int, Field(ge=1)] | None = None
    """At most this many prompts."""
    unusual_slice: str = Field("unusual", description="The slice reported (and gated) apart")


class SampledPass(Strict):
    enabled: bool = True
    """Run the sampled pass (distribution check)."""
    temperature: Annotated[float, Field(gt=0, le=10)] = 0.8
    """Sampling temperature."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling threshold."""
    samples_per_prompt: Annotated[int, Field(ge=1, le=10_000)] = 8
    """Samples per prompt and condition (independent draws per condition)."""
    prompts: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Use the first N prompts of the trace for the sampled pass"
    )
    max_new_tokens: Annotated[int, Field(ge=1)] | None = None
    """Output budget of the sampled pass (default: the prompt's)."""


class ParamsPass(Strict):
    enabled: bool = False
    """Run the sampling-parameters pass: penalties, stop strings, token limits, logit bias and
    constrained decoding on baseline and candidates (judged by the sampling_params gate)."""
    prompts: Annotated[int, Field(ge=1)] = 2
    """Use the first N prompts of the trace."""
    max_new_tokens: Annotated[int, Field(ge=4)] = 24
    """Output budget of each probe."""


class Sampling(Strict):
    greedy: bool = True
    """Run the greedy pass (speed, identity, correctness)."""
    sampled: SampledPass = Field(default_factory=lambda: SampledPass(enabled=False))
    """The sampled pass."""
    params: ParamsPass = Field(default_factory=ParamsPass)
    """The sampling-parameters pass."""
    seed: int = 0
    """Base seed: a sampled request's seed derives from it, the condition, the prompt and the
    sample index (distinct for each, so every sample is drawn independently)."""


class LatencyLimit(Strict):
    metric: Literal["ttft", "e2e", "tpot"]
    """ttft (first token), e2e (completion) or tpot (time per output token)."""
    percentile: Annotated[float, Field(gt=0, lt=100)] = 95
    """Percentile bounded (its upper confidence bound must be within max_s)."""
    max_s: PositiveFloat
    """Limit in seconds."""
    load: str | None = Field(None, description="Load level it applies to (default: all)")


class QualityLimits(Strict):
    max_genuine_divergences: Annotated[int, Field(ge=0)] = 0
    """Greedy outputs (per prompt and load level) that may diverge from the baseline other
    than at a near-tie."""
    near_tie_epsilon: Annotated[float, Field(ge=0)] = 0.05
    """A divergence is a near-tie when the candidate's token is the baseline's runner-up and
    the baseline's top-1 minus top-2 logprob there is at or below this."""
    max_near_tie_rate: Annotated[float, Field(ge=0, lt=1)] = 0.002
    """Near-ties per compared token tolerated when the campaign holds no identical-condition
    control (a single block and load level); otherwise the baseline's own rate against its
    rerun is the tolerance."""
    max_loss_rate: Annotated[float, Field(ge=0, lt=1)] = 0.0
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
    max_increase_pct: Annotated[float, Field(ge=0)] | None = None
    """Peak memory increase over the baseline (%)."""


class CostLimits(Strict):
    max_cost_per_request: PositiveFloat | None = None
    """Cost per successful request at the primary load."""
    max_break_even_days: PositiveFloat | None = None
    """Days of expected traffic to recover the setup cost."""


class Limits(Strict):
    speedup_min: PositiveFloat = 1.0
    """Completion-latency speedup over the baseline that KEEP requires (CI lower bound above it)."""
    latency: list[LatencyLimit] = Field(default_factory=list)
    """Latency limits."""
    quality: QualityLimits = Field(default_factory=QualityLimits)
    """Quality limits."""
    memory: MemoryLimits = Field(default_factory=MemoryLimits)
    """Memory limits."""
    cost: CostLimits = Field(default_factory=CostLimits)
    """Cost limits."""
    min_completed_fraction: Fraction = 1.0
    """Share of requests that must complete."""


class Decision(Strict):
    primary_load: str | None = Field(
        None,
        description="The load level that must improve (default: the highest closed-loop "
        "concurrency, else the highest open-loop rate)",
    )
    primary_slice: str | None = Field(None, description="Slice that must improve (default: all)")
    gate_unusual_slice: bool = False
    """Gate (not just report) the unusual slice's speedup."""
    confidence: Annotated[float, Field(gt=0.5, lt=1)] = 0.95
    """Two-sided confidence of intervals (one-sided error (1 - confidence)/2)."""
    inconclusive: Literal["fail", "pass", "skip"] = "fail"
    """How an INCONCLUSIVE gate ends its test: fail, pass or skip."""
    early_stop: bool = Field(
        False,
        description="Look after each block (O'Brien-Fleming alpha spending) and stop the "
        "campaign once every candidate's primary speed gate is decided",
    )
    futility_speedup: PositiveFloat | None = Field(
        1.0, description="With early_stop: drop early a candidate shown slower than this"
    )
    bootstrap_resamples: Annotated[int, Field(ge=100, le=1_000_000)] = 2000
    """Bootstrap resamples per speedup CI."""
    regression_tolerance: Fraction = 0.05
    """With --osprey-compare: how much worse than the earlier campaign a kept drafter may get
    (speedup, its own latency, accept length) before it is flagged as a regression."""


class SetupCosts(Strict):
    pretraining: Annotated[float, Field(ge=0)] = 0.0
    """Pretraining cost (currency)."""
    adaptation: Annotated[float, Field(ge=0)] = 0.0
    """Target-adaptation cost (currency)."""
    idle_device_hours: Annotated[float, Field(ge=0)] = 0.0
    """Idle device-hours charged to the drafter."""


class Cost(Strict):
    device_hour_price: Annotated[float, Field(ge=0)] = 0.0
    """Price per device-hour."""
    devices_per_server: Annotated[int, Field(ge=1)] = 1
    """Devices one server occupies."""
    currency: str = "USD"
    """Currency name in reports."""
    expected_requests_per_day: Annotated[float, Field(ge=0)] | None = None
    """Expected traffic, for break-even days."""
    setup: dict[str, SetupCosts] = Field(
        default_factory=dict, description="condition name -> its setup costs"
    )


class ReportSettings(Strict):
    title: str = "Drafter pilot"
    """Report title."""
    markdown: bool = True
    """Write report.md (and $GITHUB_STEP_SUMMARY)."""
    html: bool = True
    """Write report.html with plots."""


class Pilot(Strict):
    """The whole pilot file."""

    name: str = "pilot"
    """Pilot name (results folder prefix)."""
    target: Target
    """The target model and engine."""
    conditions: dict[str, Condition] = Field(min_length=1)
    """Condition name -> condition."""
    trace: TraceSpec
    """The prompt trace."""
    max_new_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    """Output budget of prompts that name none."""
    max_new_tokens_cap: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Cap on every prompt's max_new_tokens (keeps small pilots short)"
    )
    sampling: Sampling = Field(default_factory=Sampling)
    """Greedy and sampled passes."""
    load: Load = Field(default_factory=Load)
    """Load levels and blocks."""
    limits: Limits = Field(default_factory=Limits)
    """Limits the gates judge against."""
    decision: Decision = Field(default_factory=Decision)
    """How gates become a verdict."""
    cost: Cost = Field(default_factory=Cost)
    """Cost inputs."""
    report: ReportSettings = Field(default_factory=ReportSettings)
    """Report settings."""

    @field_validator("conditions")
    @classmethod
    def _names(cls, v: dict[str, Condition]) -> dict[str, Condition]:
        for name in v:
            if not name or not all(c.isalnum() or c in "-_." for c in name):
                raise ValueError(f"condition name {name!r}: use letters, digits, '-', '_', '.'")
        return v

    @model_validator(mode="after")
    def _roles(self, info: ValidationInfo) -> Pilot:
        # load_pilot runs these itself, to point at the offending field's line.
        if not (info.context or {}).get("defer_cross_checks"):
            for loc, msg in _cross_field_problems(self):
                raise ValueError(f"{'.'.join(map(str, loc))}: {msg}")
        return self

    # Convenience views used across the library.
    @property
    def baseline(self) -> str:
        return next(n for n, c in self.conditions.items() if c.role == "baseline")

    @property
    def current(self) -> str | None:
        return next((n for n, c in self.conditions.items() if c.role == "current"), None)

    @property
    def candidates(self) -> list[str]:
        return [n for n, c in self.conditions.items() if c.role == "candidate"]

    @property
    def primary_load(self) -> str:
        if self.decision.primary_load:
            return self.decision.primary_load
        return self.load.heaviest()

    def references(self, candidate: str) -> list[str]:
        """What a candidate is judged against: the baseline, then the current drafter if any."""
        return [self.baseline] + ([self.current] if self.current else [])

    def digest(self) -> str:
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def _cross_field_problems(pilot: Pilot) -> list[tuple[tuple[str | int, ...], str]]:
    """Checks spanning several sections, each with the location of the field at fault."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    baselines = [n for n, c in pilot.conditions.items() if c.role == "baseline"]
    if len(baselines) != 1:
        out.append(
            (
                ("conditions", baselines[1], "role") if baselines else ("conditions",),
                f"exactly one condition must have role: baseline (speculation off, the kill "
                f"switch); found {len(baselines)}",
            )
        )
    currents = [n for n, c in pilot.conditions.items() if c.role == "current"]
    if len(currents) > 1:
        out.append(
            (
                ("conditions", currents[1], "role"),
                f"at most one condition may have role: current; found {len(currents)}",
            )
        )
    levels = ", ".join(pilot.load.levels)
    where: list[tuple[tuple[str | int, ...], str | None]] = [
        (("decision", "primary_load"), pilot.decision.primary_load)
    ]
    where += [
        (("limits", "latency", i, "load"), lim.load) for i, lim in enumerate(pilot.limits.latency)
    ]
    for loc, level in where:
        if level is not None and level not in pilot.load.levels:
            out.append((loc, f"load level {level!r} is not in load.levels ({levels})"))
    for name, cond in pilot.conditions.items():
        if cond.quantization and (pilot.target.engine != "transformers" or cond.endpoint):
            out.append((("conditions", name, "quantization"),
                        "only the embedded transformers engine rounds weights itself; for "
                        "sglang/vllm pass the engine's flag (e.g. engine_args: [--quantization, "
                        "fp8])"))
    for name in pilot.cost.setup:
        if name not in pilot.conditions:
            out.append(
                (
                    ("cost", "setup", name),
                    f"cost.setup names unknown condition {name!r} "
                    f"(conditions: {', '.join(pilot.conditions)})",
                )
            )
    return out


def json_schema() -> dict[str, Any]:
    """The JSON Schema of pilot.yaml (for editor completion)."""
    return Pilot.model_json_schema()
