"""The pilot file's schema (pilot.yaml): every key, its type, bounds, default and description."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .base import (
    MAX_COUNT,
    MAX_ITEMS,
    Amount,
    ConfigError,
    Count,
    EnvName,
    Fraction,
    PathText,
    Seconds,
    ShortText,
    Slug,
    Strict,
    Text,
)
from .endpoint_url import check_url
from .held_out import HeldOut
from .levels import Load, LoadLevel, OpenLoop, level_label
from .limits import Limits
from .sampling import SAMPLED_PROMPTS, SAMPLES_PER_PROMPT, Sampling

# The schema's public names, those defined in its parts included.
__all__ = ["SAMPLED_PROMPTS", "SAMPLES_PER_PROMPT", "ConfigError", "Load", "LoadLevel",
           "OpenLoop", "Pilot", "Sampling", "Strict", "cross_field_problems", "json_schema",
           "level_label"]

Engine = Literal["transformers", "sglang", "vllm", "endpoint"]
# Server flags that choose where a booted engine listens (SGLang and vLLM spell them alike;
# --uds / --unix-socket bind elsewhere altogether).
BIND_FLAGS = frozenset({"--host", "--port", "--uds", "--unix-socket"})
Role = Literal["baseline", "current", "candidate"]


class Speculation(Strict):
    """How a drafter condition speculates; names follow the engine's own flags."""

    algorithm: ShortText | None = Field(
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
    adaptive: bool = False
    """Allow the engine to change the speculation depth at run time (SGLang adaptive/auto
    spec, vLLM K per batch size): the depth is then reported per stretch. Otherwise a server
    found adapting it fails the fairness gate."""


class Endpoint(Strict):
    """An already running server: nothing is booted or killed for it."""

    url: Text
    """Base URL, e.g. http://127.0.0.1:30000 (http or https, a host, no user:password)."""
    protocol: Literal["sglang", "openai"]
    """sglang: native /generate; openai: /v1/completions."""
    api_key_env: EnvName | None = Field(
        None, description="Name of the environment variable holding the API key (checked "
        "before anything runs: set and not empty)"
    )
    model: Text | None = Field(None, description="Model name sent to an OpenAI-style server")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_url(v)


class ArtifactPins(Strict):
    sha256: dict[Text, Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]] = Field(
        default_factory=dict, max_length=MAX_ITEMS,
        description="file (relative to the drafter) -> expected sha256; hashed again after "
        "each boot and after the campaign (a change fails the artifact gate)",
    )
    engine_version: ShortText | None = Field(
        None, description="Version prefix the engine must report, e.g. 0.5.23"
    )
    require_license: bool = False
    """Fail the artifact check when the drafter folder has no LICENSE/COPYING file."""


class Condition(Strict):
    role: Role
    """baseline (speculation off, exactly one), current (the drafter serving today, at most one) or
    candidate."""
    drafter: PathText | None = Field(None, description="Drafter checkpoint folder")
    speculation: Speculation | None = None
    """Speculation settings; omit on the baseline."""
    endpoint: Endpoint | None = None
    """Serve this condition from an already running server."""
    dtype: ShortText | None = Field(
        None, description="Override of target.dtype (breaks fairness; for negative controls)"
    )
    quantization: Literal["fp8", "int4"] | None = Field(
        None,
        description="transformers engine: the target's weights rounded to this format (fp8 "
        "e4m3 or symmetric int4, per output channel; compute stays in dtype), as a quantized "
        "deployment would serve them. Breaks fairness; for precision comparisons and negative "
        "controls. Server engines: pass their own flag in engine_args",
    )
    engine_args: list[Text] = Field(default_factory=list, max_length=MAX_ITEMS)
    """Extra engine command-line arguments for this condition."""
    env: dict[EnvName, Text] = Field(default_factory=dict, max_length=MAX_ITEMS)
    """Extra environment for this condition's engine."""
    pins: ArtifactPins = Field(default_factory=ArtifactPins)
    """Artifact pins checked before any boot."""
    held_out: HeldOut | None = None
    """Check the trace's prompts against the drafter's adaptation data."""

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
    model: Text = Field(description="Target checkpoint folder (or a model id a server resolves)")
    dtype: ShortText = "float32"
    """Precision of every condition (float32, bfloat16, float16)."""
    device: ShortText = Field("cpu", description="transformers engine: cpu, cuda, cuda:1 ...")
    python: Text | None = Field(
        None,
        description="Python executable of a server engine's venv (a path relative to the "
        "pilot file, or a name on PATH; $VARS expand)",
    )
    env: dict[EnvName, Text] = Field(default_factory=dict, max_length=MAX_ITEMS)
    """Environment for every condition's engine."""
    engine_args: list[Text] = Field(default_factory=list, max_length=MAX_ITEMS)
    """Extra engine command-line arguments for every condition."""
    host: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:][A-Za-z0-9_.:-]{0,254}$")] = "127.0.0.1"
    """Interface servers bind to: an address or host name (127.0.0.1 keeps them off the
    network; any other address draws a warning)."""
    port: Annotated[int, Field(ge=0, le=65535)] = 0
    """Server port; 0 picks a free one per condition."""
    boot_timeout_s: Seconds = 600.0
    """Seconds a server may take to become healthy."""
    deterministic: bool = Field(
        False, description="Engine's deterministic mode on every condition (SGLang)"
    )
    context_length: Annotated[int, Field(ge=16, le=100_000_000)] = 2048
    """Context length (vLLM --max-model-len; transformers: prompt + output limit)."""
    tp_size: Annotated[int, Field(ge=1, le=1024)] = 1
    """Tensor-parallel size of a server engine."""
    mem_fraction: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    """SGLang --mem-fraction-static / vLLM --gpu-memory-utilization."""
    api_key_env: EnvName | None = None
    """Name of the environment variable holding the servers' API key (never the key itself;
    checked before anything runs: set and not empty)."""
    threads: Annotated[int, Field(ge=1, le=4096)] | None = Field(
        None, description="transformers engine: torch threads (default: torch's own)"
    )


class TraceSpec(Strict):
    """The campaign's prompts: a limit draws them across the trace, never its first lines.

    The draw is seeded (``sampling.seed``) and stratified by slice and domain
    (pilot/draw.py); campaign.json ``draws.trace`` records it."""

    files: list[PathText] = Field(min_length=1, max_length=MAX_ITEMS)
    """Prompt trace files (JSONL, see prompts/README.md)."""
    ids: list[Text] | None = Field(None, max_length=MAX_COUNT)
    """Use only these prompt ids (in trace order)."""
    slices: list[Text] | None = Field(None, max_length=MAX_ITEMS)
    """Use only these slices."""
    limit_per_slice: Count | None = None
    """At most this many prompts per slice, drawn across the slice's domains (every domain
    represented while the count allows, the rest in proportion; seeded by
    ``sampling.seed``)."""
    limit: Count | None = None
    """At most this many prompts (after ``limit_per_slice``), drawn across the trace: every
    (slice, domain) represented while the limit allows, the rest in proportion (largest
    remainders), the unusual slice at least one; seeded by ``sampling.seed``."""
    unusual_slice: Text = Field("unusual", description="The slice reported (and gated) apart")


class Decision(Strict):
    primary_load: Text | None = Field(
        None,
        description="The load level that must improve (default: the highest closed-loop "
        "concurrency, else the highest open-loop rate)",
    )
    gate_unusual_slice: bool = False
    """Gate (not just report) the unusual slice's speedup."""
    confidence: Annotated[float, Field(gt=0.5, lt=1, allow_inf_nan=False)] = 0.95
    """Two-sided confidence of intervals (one-sided error (1 - confidence)/2)."""
    inconclusive: Literal["fail", "pass", "skip"] = "fail"
    """How an INCONCLUSIVE gate ends its test: fail, pass or skip."""
    early_stop: bool = Field(
        True,
        description="Look after each pass (group-sequential, power alpha spending, three "
        "outcomes at every look) and stop the greedy passes once every candidate is "
        "decided on its primary speed gates (against the baseline and, where the pilot has "
        "one, the current drafter): KEEP on all of them, DROP on one (confidently below its "
        "minimum) or INCONCLUSIVE on one (more passes would very likely not settle it)",
    )
    futility_power: Annotated[float, Field(ge=0, lt=0.5)] = 0.2
    """With early_stop: at an interim look, stop INCONCLUSIVE when the chance that the
    remaining passes reach a decision (conditional power under the trend so far) is below
    this; 0 never stops inconclusive early."""
    speedup_metric: Literal["per_prompt", "total_time"] = "per_prompt"
    """What the speed gates judge: per_prompt (geometric mean of per-prompt speedups, every
    prompt counts equally; calibrated under time-correlated noise) or total_time (ratio of
    summed latencies: the GPU time saved, long prompts weigh more). Both are reported."""
    drift_tolerance: Fraction = 0.2
    """A pass or boot whose latencies run off the others by more than this (each condition
    against itself, significant at 1%) marks the environment unstable: a speed gate's KEEP or
    DROP then stands only if it also holds without each pass that changed the comparison
    (one condition changed and not the other, or their ratio moved by more than this); a
    change every condition shared cancels in the pairs."""
    bootstrap_resamples: Annotated[int, Field(ge=100, le=1_000_000)] = 2000
    """Bootstrap resamples per speedup CI."""
    regression_tolerance: Fraction = 0.05
    """With --osprey-compare: how much worse than the earlier campaign a kept drafter may get
    (speedup, its own latency, accept length) before it is flagged as a regression."""


class SetupCosts(Strict):
    pretraining: Amount = 0.0
    """Pretraining cost (currency)."""
    adaptation: Amount = 0.0
    """Target-adaptation cost (currency)."""
    adaptation_device_hours: Amount = 0.0
    """Device-hours the adaptation to this target took, priced at `device_hour_price` (added
    to `adaptation`): the card's result sheet states adaptation cost as device-hours x price."""
    idle_device_hours: Amount = 0.0
    """Idle device-hours charged to the drafter."""


class Cost(Strict):
    device_hour_price: Amount = 0.0
    """Price per device-hour."""
    devices_per_server: Annotated[int, Field(ge=1, le=4096)] = 1
    """Devices one server occupies."""
    currency: Annotated[str, Field(max_length=16)] = "USD"
    """Currency name in reports."""
    expected_requests_per_day: Amount | None = None
    """Expected traffic, for break-even days."""
    setup: dict[Text, SetupCosts] = Field(
        default_factory=dict, max_length=MAX_ITEMS, description="condition name -> its setup costs"
    )


class ReportSettings(Strict):
    title: ShortText = "Drafter pilot"
    """Report title."""
    markdown: bool = True
    """Write report.md (and $GITHUB_STEP_SUMMARY)."""
    html: bool = True
    """Write report.html with plots."""
    markdown_max_kib: Annotated[int, Field(ge=4, le=1000)] = 64
    """Size cap of report.md (KiB): details beyond it are cut with a note (GitHub refuses a
    step summary over 1 MiB)."""


class Pilot(Strict):
    """The whole pilot file."""

    name: Slug = "pilot"
    """Pilot name, the results folder's prefix: letters, digits, '-', '_', '.' (at most 64
    characters, not '.' or '..')."""
    target: Target
    """The target model and engine."""
    conditions: dict[str, Condition] = Field(min_length=1, max_length=64)
    """Condition name -> condition."""
    trace: TraceSpec
    """The prompt trace."""
    max_new_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    """Output budget of prompts that name none."""
    max_new_tokens_cap: Count | None = Field(
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
            # A condition name becomes a log file's name and a test id.
            shown = name if len(name) <= 40 else name[:37] + "..."
            if (not name or len(name) > 64 or name in (".", "..")
                    or not all(c.isalnum() or c in "-_." for c in name)):
                raise ValueError(f"condition name {shown!r}: use letters, digits, '-', '_', '.' "
                                 "(at most 64 characters, not '.' or '..')")
        return v

    @model_validator(mode="after")
    def _roles(self, info: ValidationInfo) -> Pilot:
        # load_pilot runs these itself, to point at the offending field's line.
        if not (info.context or {}).get("defer_cross_checks"):
            for loc, msg in cross_field_problems(self):
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

    @property
    def greedy_boots(self) -> int:
        """Boots that run the untimed greedy pass beside sampled timed passes (the first N;
        ``sampling.greedy_boots``, at most the boots there are)."""
        boots = self.load.boots_per_condition
        return min(self.sampling.greedy_boots or boots, boots)

    def references(self, candidate: str) -> list[str]:
        """What a candidate is judged against: the baseline, then the current drafter if any."""
        return [self.baseline] + ([self.current] if self.current else [])

    def digest(self) -> str:
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def cross_field_problems(pilot: Pilot) -> list[tuple[tuple[str | int, ...], str]]:
    """Checks spanning several sections, each with the location of the field at fault."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    baselines = [n for n, c in pilot.conditions.items() if c.role == "baseline"]
    if not baselines:
        roles = ", ".join(f"{n} ({c.role})" for n, c in pilot.conditions.items())
        out.append((("conditions",), f"no condition has role: baseline; one must (speculation "
                    f"off, the kill switch). The conditions are: {roles}"))
    elif len(baselines) > 1:
        out.append((("conditions", baselines[1], "role"),
                    f"exactly one condition may have role: baseline (speculation off, the kill "
                    f"switch); {', '.join(baselines)} all do"))
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
    where += [(("load", "block_prompts", name), name) for name in pilot.load.block_prompts]
    where += [(("load", "level_passes", name), name) for name in pilot.load.level_passes]
    every = pilot.load.passes * pilot.load.boots_per_condition
    out += [(("load", "level_passes", name),
             f"{n} passes at {name!r} is more than the campaign's {every} (load.passes x "
             "load.boots_per_condition)")
            for name, n in pilot.load.level_passes.items() if n > every]
    for loc, level in where:
        if level is not None and level not in pilot.load.levels:
            out.append((loc, f"load level {level!r} is not in load.levels ({levels})"))
    for name, cond in pilot.conditions.items():
        if cond.quantization and (pilot.target.engine != "transformers" or cond.endpoint):
            out.append((("conditions", name, "quantization"),
                        "only the embedded transformers engine rounds weights itself; for "
                        "sglang/vllm pass the engine's flag (e.g. engine_args: [--quantization, "
                        "fp8])"))
    # The bind address and port are the tool's: a flag later on the command line would win
    # over its --host 127.0.0.1 and put the server on the network without a word.
    args_at = [(("target", "engine_args"), pilot.target.engine_args)] + [
        (("conditions", name, "engine_args"), cond.engine_args)
        for name, cond in pilot.conditions.items()]
    for loc, args in args_at:
        for i, arg in enumerate(args):
            flag = arg.split("=", 1)[0]
            if flag in BIND_FLAGS:
                out.append(((*loc, i), f"{flag} is set by the tool: use target.host / "
                            "target.port (a bind beyond loopback then draws a warning)"))
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
