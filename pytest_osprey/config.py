"""The pilot file (pilot.yaml): schema, loading, and errors that name the file, line and field."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

Engine = Literal["transformers", "sglang", "vllm", "endpoint"]
Role = Literal["baseline", "current", "candidate"]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class ConfigError(ValueError):
    """A pilot-file problem, worded for the user: ``file:line: dotted.field: message``."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


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


class Sampling(Strict):
    greedy: bool = True
    """Run the greedy pass (speed, identity, correctness)."""
    sampled: SampledPass = Field(default_factory=lambda: SampledPass(enabled=False))
    """The sampled pass."""
    seed: int = 0
    """Base seed: a sampled request's seed derives from it, the condition and the sample
    index (distinct per condition, so the conditions' samples are independent)."""


class OpenLoop(Strict):
    """An open-loop load level: requests arrive as a Poisson process, whatever the server's pace
    (the same seeded arrival times for every condition in a block)."""

    rate: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)]
    """Mean arrival rate (requests per second)."""
    max_concurrency: Annotated[int, Field(ge=1, le=100_000)] | None = None
    """Cap on requests in flight; an arrival beyond it waits client-side (default: no cap)."""


Concurrency = Annotated[int, Field(ge=1, le=100_000)]


def _level_kind(value: Any) -> str:
    return "open-loop" if isinstance(value, Mapping | OpenLoop) else "concurrency"


# Tagged so that a wrong level reports one kind's error (a mapping is an open-loop level,
# anything else a concurrency), not both; the tags are dropped from error locations.
LoadLevel = Annotated[
    Annotated[Concurrency, Tag("concurrency")] | Annotated[OpenLoop, Tag("open-loop")],
    Discriminator(_level_kind),
]
_UNION_TAGS = frozenset({"concurrency", "open-loop"})


def _default_levels() -> dict[str, LoadLevel]:
    return {"low": 1, "concurrent": 8}


class Load(Strict):
    levels: dict[str, LoadLevel] = Field(
        default_factory=_default_levels, min_length=1
    )
    """Load level name -> concurrency (closed loop: that many requests always in flight) or
    {rate, max_concurrency} (open loop, Poisson arrivals); each level is judged apart."""
    warmup_requests: Annotated[int, Field(ge=0)] = 4
    """Requests per condition after boot, excluded from records."""
    blocks: Annotated[int, Field(ge=1, le=1000)] = 2
    """Repetitions of the whole trace per condition and load level."""
    order: Literal["abba", "sequential"] = "abba"
    """abba: conditions interleaved, all up at once; sequential: one engine at a time (one GPU)."""
    request_timeout_s: PositiveFloat = 300.0
    """Per-request timeout; a timed-out request is recorded as failed."""

    def concurrency(self, level: str) -> int:
        """Closed loop: its concurrency; open loop: its cap, 0 when uncapped."""
        value = self.levels[level]
        return value if isinstance(value, int) else value.max_concurrency or 0

    def rate(self, level: str) -> float | None:
        """Open loop: the arrival rate (requests/s); closed loop: None."""
        value = self.levels[level]
        return None if isinstance(value, int) else value.rate

    def label(self, level: str) -> str:
        return level_label(self.levels[level])

    def lightest(self) -> str:
        """The lowest-load level: the smallest closed-loop concurrency, else the lowest rate."""
        closed = [k for k, v in self.levels.items() if isinstance(v, int)]
        if closed:
            return min(closed, key=self.concurrency)
        return min(self.levels, key=lambda k: self.rate(k) or 0.0)

    def heaviest(self) -> str:
        """The highest-load level: the largest closed-loop concurrency, else the highest rate
        (open and closed loads are not comparable, so closed levels come first)."""
        closed = [k for k, v in self.levels.items() if isinstance(v, int)]
        if closed:
            return max(closed, key=self.concurrency)
        return max(self.levels, key=lambda k: self.rate(k) or 0.0)


def level_label(value: Any) -> str:
    """How a load level reads in reports: ``x4`` (closed loop) or ``Poisson 2/s`` (open loop);
    ``value`` is the pilot's level or its JSON form from campaign.json."""
    if isinstance(value, OpenLoop):
        value = value.model_dump()
    if isinstance(value, Mapping):
        text = f"Poisson {value.get('rate', 0):g}/s"
        cap = value.get("max_concurrency")
        return f"{text}, <=x{cap}" if cap else text
    return f"x{value}"


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
    """Greedy outputs that may diverge from the baseline where the reference margin exceeds
    near_tie_epsilon."""
    near_tie_epsilon: Annotated[float, Field(ge=0)] = 0.05
    """Top-1 minus top-2 logprob at or below which a divergence is a near-tie."""
    max_near_tie_fraction: Fraction = 0.1
    """Share of prompts that may diverge at near-ties."""
    correctness_margin: Fraction = 0.05
    """Non-inferiority margin of the expect-check pass rate (paired, exact McNemar)."""
    distribution_alpha: Fraction = 0.01
    """Significance level of the sampled-distribution test."""


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


# --------------------------------------------------------------------------- loading


class _Loader(yaml.SafeLoader):
    """SafeLoader whose value errors (bad dates, over-long ints, bad tags, lone surrogates
    from escapes like "\\ud800") carry a line instead of escaping as raw exceptions."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            data = super().construct_object(node, deep)
            if isinstance(data, str):
                data.encode("utf-8")  # reports are written as UTF-8 later
            return data
        except yaml.YAMLError:
            raise
        except Exception as exc:  # PyYAML's own: ValueError, KeyError ("!!bool maybe"), ...
            value = str(node.value)
            short = value if len(value) <= 40 else value[:37] + "..."
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {node.tag} value {short!r}: {exc}", node.start_mark
            ) from None


def _parse(text: str) -> tuple[Any, dict[tuple[str, ...], int]]:
    """The YAML's data and its line map, from one parse (pure-Python PyYAML is slow)."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
    return data, _line_map(root)


def _line_map(root: yaml.Node | None) -> dict[tuple[str, ...], int]:
    """Dotted path (parts as strings) -> 1-based line of its YAML node (keys and items)."""
    lines: dict[tuple[str, ...], int] = {}
    seen: set[int] = set()

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if id(node) in seen:  # an alias: walked once (recursive and "billion laughs" safe)
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = (*path, str(key.value))
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, str(i)))

    if root is not None:
        walk(root, ())
    return lines


def _model_at(path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model whose fields live at ``path`` (for 'did you mean')."""
    ann: Any = Pilot
    for part in path:
        ann = _unwrap(ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            field = ann.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return None
            ann = field.annotation
        elif get_origin(ann) in (dict, list):
            ann = get_args(ann)[-1]  # a user's key or a list index: step into the values
        else:
            return None
    ann = _unwrap(ann)
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _unwrap(ann: Any) -> Any:
    """``X | None`` -> X, ``Annotated[X, ...]`` -> X, ``int | Model`` -> Model."""
    while True:
        origin = get_origin(ann)
        if origin is Annotated:
            ann = get_args(ann)[0]
        elif origin in (Union, UnionType):
            args = [a for a in get_args(ann) if a is not type(None)]
            if len(args) != 1:
                # A scalar-or-model union (a load level): keys can only be the model's.
                models = [m for a in args if isinstance(m := _unwrap(a), type)
                          and issubclass(m, BaseModel)]
                return models[0] if len(models) == 1 else ann
            ann = args[0]
        else:
            return ann


def _where(source: str, lines: Mapping[tuple[str, ...], int], loc: tuple[Any, ...]) -> str:
    """``file:line`` of the deepest part of ``loc`` the YAML has (or just ``file``)."""
    parts = tuple(str(p) for p in loc)
    for n in range(len(parts), -1, -1):
        if parts[:n] in lines:
            return f"{source}:{lines[parts[:n]]}"
    return source


def _format_errors(err: ValidationError, source: str, lines: Mapping[tuple[str, ...], int]) -> str:
    out = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and (
            p.startswith("function-") or p in _UNION_TAGS)))
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        where = _where(source, lines, loc)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden" and loc:
            model = _model_at(loc[:-1])
            known = list(model.model_fields) if model else []
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            msg = "unknown key" + (f"; did you mean {close[0]!r}?" if close else "")
            if known:
                msg += f" (valid: {', '.join(known)})"
        elif e["type"] == "missing":
            msg = "required field is missing"
        out.append(f"{where}: {dotted}: {msg}")
    return "\n".join(out)


def _resolve_paths(
    pilot: Pilot, base: Path, source: str, lines: Mapping[tuple[str, ...], int]
) -> Pilot:
    """Relative paths resolve against the pilot file's folder; missing paths are errors."""

    def fail(loc: tuple[str | int, ...], msg: str) -> ConfigError:
        return ConfigError(f"{_where(source, lines, loc)}: {'.'.join(map(str, loc))}: {msg}")

    def local(p: str | Path) -> Path:
        path = Path(os.path.expanduser(str(p)))
        return path if path.is_absolute() else (base / path)

    files = []
    for i, f in enumerate(pilot.trace.files):
        path = local(f)
        if not os.path.isfile(path):
            raise fail(("trace", "files", i), f"no such file: {path}")
        files.append(path)
    target = pilot.target
    model = target.model
    if target.engine == "transformers" or model.startswith((".", "/", "~")):
        path = local(model)
        if not os.path.isdir(path):
            raise fail(("target", "model"), f"no such directory: {path}")
        model = str(path)
    python = target.python
    if python is not None:
        expanded = os.path.expandvars(os.path.expanduser(python))
        if "$" in expanded:
            raise fail(("target", "python"), f"unset environment variable in {python!r}")
        if os.sep in expanded:
            path = local(expanded)
            if not path.is_file():
                raise fail(("target", "python"), f"no such file: {path}")
            expanded = str(path)
        python = expanded
    conditions = {}
    for name, cond in pilot.conditions.items():
        drafter = cond.drafter
        if drafter is not None:
            drafter = local(drafter)
            if not os.path.isdir(drafter):
                raise fail(("conditions", name, "drafter"), f"no such directory: {drafter}")
        if cond.endpoint is None and target.engine == "endpoint":
            raise fail(("conditions", name), "target.engine is endpoint: give endpoint.url")
        conditions[name] = cond.model_copy(update={"drafter": drafter})
    return pilot.model_copy(
        update={
            "trace": pilot.trace.model_copy(update={"files": files}),
            "target": target.model_copy(update={"model": model, "python": python}),
            "conditions": conditions,
        }
    )


def load_pilot_unchecked(path: str | os.PathLike[str]) -> Pilot:
    """A pilot whose limits are all that matter (re-judging a saved campaign): validated like
    :func:`load_pilot`, but its paths are neither resolved nor required to exist."""
    return load_pilot(path, check_paths=False)


def load_pilot(path: str | os.PathLike[str], *, check_paths: bool = True) -> Pilot:
    """Read, validate and resolve a pilot file; every problem is a :class:`ConfigError`."""
    p = Path(path)
    source = str(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such pilot file") from None
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or a NUL in the path
        raise ConfigError(f"{source}: cannot read: {exc}") from None
    try:
        data, lines = _parse(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the pilot file must be a mapping (key: value) at top level")
    try:
        pilot = Pilot.model_validate(data, context={"defer_cross_checks": True})
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source, lines)) from None
    problems = _cross_field_problems(pilot)
    if problems:
        raise ConfigError(
            "\n".join(
                f"{_where(source, lines, loc)}: {'.'.join(map(str, loc))}: {msg}"
                for loc, msg in problems
            )
        )
    if not check_paths:
        return pilot
    return _resolve_paths(pilot, p.resolve().parent, source, lines)


def json_schema() -> dict[str, Any]:
    return Pilot.model_json_schema()
