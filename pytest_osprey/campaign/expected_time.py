"""The expected wall time and device-hours of a campaign, known before it starts: the design
(requests per level, concurrency, output-token budgets) times a per-request time model
(output tokens x time per token at that concurrency + a fixed overhead per request).

The model's source is named in the line. Without a measured one, a documented default per
engine kind is stated as an assumption; an endpoint (or a device with no reference figure) has
none, and the progress line's ETA after warm-up is the first estimate."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..engines.kinds import target_kind
from ..pilot.probes import PROBES, SAMPLED_PROBES
from ..pilot.schema import Pilot
from ..pilot.selection import pass_draws
from ..pilot.trace import Trace
from .requests import BREAKER_TIMEOUTS, max_new_tokens


@dataclass(frozen=True)
class TimeModel:
    """Seconds per output token of one request at batch 1, how the per-request time grows
    with concurrency (``1 + (c - 1) * slowdown``: 1 serves c at once at no cost, 1.0 serially),
    a fixed overhead per request and the seconds one boot takes."""

    source: str
    s_per_token: float
    slowdown: float
    overhead_s: float
    boot_s: float
    per_concurrency: dict[int, float] = field(default_factory=dict)
    """Measured seconds per token at these concurrencies (others: the linear rule)."""
    overheads: dict[int, float] = field(default_factory=dict)
    """Measured overhead (time to first token, queueing included) at these concurrencies."""
    base_concurrency: int = 1
    """The concurrency ``s_per_token`` was measured at."""
    fill: float = 1.0
    """The share of each request's output-token budget it produces (measured: outputs that
    end before their budget; a default assumes the whole budget)."""

    def token_s(self, concurrency: int) -> float:
        if concurrency in self.per_concurrency:
            return self.per_concurrency[concurrency]
        return self.s_per_token * (1 + (concurrency - self.base_concurrency) * self.slowdown)

    def request_s(self, budget: float, concurrency: int) -> float:
        """One request of ``budget`` output tokens: the overhead (to the first token), then
        each further token."""
        return max(budget * self.fill - 1, 0) * self.token_s(concurrency) \
            + self.overheads.get(concurrency, self.overhead_s)


# The shipped pilot's runs on 2 CPU cores: the tiny target decodes at ~19 ms per output token
# at one thread (time to first token ~50 ms); a closed-loop stretch at x4 takes about as long
# as its requests one after another (the batch's gain goes to the drafter's verify steps and
# the stretch's ramp and tail), so slowdown 1; a boot with its warm-up takes ~3 s.
CPU_TINY = TimeModel("default for the embedded engine on CPU (the tiny models' 19 ms/token)",
                     0.019, 1.0, 0.05, 3.0)
# Llama-3.1-8B on one H100 on SGLang without speculation: 158 tokens/s per request at batch 1
# (the EAGLE-3 paper's figure). Assumed: per-request speed falls as 1 + (c-1)/16, so the
# aggregate saturates near 16x batch 1; a boot (weights, CUDA graphs) takes about 2 minutes.
GPU_REFERENCE = TimeModel("assumed: Llama-3.1-8B on one H100 (158 tok/s per request at batch "
                          "1, rising aggregate with concurrency)", 1 / 158, 1 / 16, 0.03, 120.0)


def default_model(pilot: Pilot) -> TimeModel | None:
    """The documented default for the pilot's engine, or None (an endpoint, or the embedded
    engine on a GPU, whose speed no reference fixes)."""
    target = pilot.target
    if any(c.endpoint is not None for c in pilot.conditions.values()):
        return None
    kind = target_kind(pilot)
    if kind.in_process:
        return CPU_TINY if target.device == "cpu" else None
    if kind.server:
        return GPU_REFERENCE
    return None


@dataclass(frozen=True)
class ExpectedTime:
    """Expected wall time per phase (seconds, every condition), the time if early stopping
    ends the timed passes at the first look (None without early stopping, or where the plan
    has a single look), the worst case, the devices held and their price."""

    source: str
    phases: dict[str, float]
    first_look_s: float | None
    devices: int
    gpu: bool
    price: float = 0.0
    currency: str = "USD"
    per_level: dict[str, float] = field(default_factory=dict)
    worst_s: float = 0.0
    """The whole plan (no early stop), every output at its full token budget, and each
    condition losing once the longer of its boot timeout and the timeout breaker's requests
    (a server that hangs): what the campaign can bill at most under the time model."""

    @property
    def total_s(self) -> float:
        return sum(self.phases.values())

    @property
    def device_hours(self) -> float:
        return self.total_s / 3600 * self.devices

    @property
    def worst_device_hours(self) -> float:
        return max(self.worst_s, self.total_s) / 3600 * self.devices

    def money(self, device_hours: float) -> str:
        """``USD 2.55`` at the price set, "" without one."""
        return f"{self.currency} {device_hours * self.price:,.2f}" if self.price > 0 else ""

    def line(self) -> str:
        """E.g. ``expected time: up to 12 min (after the first look about 5 min), about 0.2
        GPU-hours (USD 0.50 at 2.50/h) [assumed: ...]``."""
        unit = "GPU-hours" if self.gpu else "device-hours"
        look = (f" (early stopping: about {duration(self.first_look_s)} if it stops at the "
                "first look)" if self.first_look_s is not None else "")
        money = (f" ({self.money(self.device_hours)} at {self.price:,.2f}/h)"
                 if self.price > 0 else "")
        worst = self.money(self.worst_device_hours)
        return (f"expected time: up to {duration(self.total_s)}{look}, about "
                f"{self.device_hours:,.2f} {unit}{money}; worst case "
                f"{self.worst_device_hours:,.2f} {unit}" + (f" ({worst})" if worst else "")
                + f" (full token budgets, a hung server per condition) [{self.source}]")

    def facts(self) -> dict[str, Any]:
        """campaign.json's ``size.expected``."""
        return {"source": self.source, "seconds": round(self.total_s, 1),
                "first_look_seconds": (None if self.first_look_s is None
                                       else round(self.first_look_s, 1)),
                "phases": {k: round(v, 1) for k, v in self.phases.items()},
                "devices": self.devices, "device_hours": round(self.device_hours, 4),
                "cost": round(self.device_hours * self.price, 4) if self.price > 0 else None,
                "worst_device_hours": round(self.worst_device_hours, 4),
                "worst_cost": (round(self.worst_device_hours * self.price, 4)
                               if self.price > 0 else None)}


UNKNOWN = "expected time: known after warm-up (the progress line's ETA)"


def duration(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:,.1f} h" if hours >= 1 else f"{max(seconds / 60, 1):,.0f} min"


def expected_time(pilot: Pilot, trace: Trace, conditions: int,
                  model: TimeModel | None = None) -> ExpectedTime | None:
    """The campaign's expected time under ``model`` (default: :func:`default_model`), or None
    where no model exists. Conditions boot one after another on the same device(s), so the
    devices held are one server's (``cost.devices_per_server``) for the whole time."""
    model = model or default_model(pilot)
    if model is None:
        return None
    expected = _phases(pilot, trace, conditions, model)
    full = _phases(pilot, trace, conditions, replace(model, fill=1.0))
    load, target = pilot.load, pilot.target
    hung = max(target.boot_timeout_s, BREAKER_TIMEOUTS * load.request_timeout_s)
    return replace(expected, worst_s=full.total_s + conditions * hung)


def _phases(pilot: Pilot, trace: Trace, conditions: int, model: TimeModel) -> ExpectedTime:
    load, sampling = pilot.load, pilot.sampling
    prompts = trace.prompts
    boots = load.boots_per_condition
    mean = sum(max_new_tokens(pilot, p) for p in prompts) / max(1, len(prompts))
    per_level: dict[str, float] = {}
    for level in load.levels:
        c = max(1, load.concurrency(level))
        # c requests at a time: waves of c, each as long as one request at that concurrency.
        waves = len(prompts) * boots / c
        per_level[level] = waves * model.request_s(mean, c) * conditions  # per pass
    phases = {"boots": model.boot_s * boots * conditions,
              "warm-up": model.request_s(mean, 1) * boots * conditions,
              "timed": sum(t * load.passes_at(level) / boots for level, t in per_level.items())}
    if sampling.serving.sampled and sampling.greedy:
        phases["greedy"] = len(prompts) * pilot.greedy_boots * model.request_s(mean, 1) \
            * conditions
    draws = pass_draws(pilot, prompts)
    if "sampled" in draws:
        chosen = draws["sampled"].prompts
        n = sampling.sampled.samples_per_prompt
        tokens = sum(max_new_tokens(pilot, p, sampling.sampled.max_new_tokens) for p in chosen)
        phases["sampled"] = (max(tokens * model.fill - len(chosen), 0) * n * model.token_s(1)
                             + len(chosen) * n * model.overhead_s) * conditions
        # Scoring is a prefill of each sample on the baseline: about one overhead each.
        phases["scoring"] = len(chosen) * n * conditions * 2 * model.overhead_s
    if "params" in draws:
        # The greedy probes (and the plain request), each sampled probe's samples and the
        # seed probe's pair, one at a time; the samples are scored like the sampled pass's.
        n, samples = len(draws["params"].prompts), sampling.params.samples
        scored = n * len(SAMPLED_PROBES) * samples
        requests = n * (1 + len(PROBES)) + scored + (2 * n if samples else 0)
        phases["params"] = requests * model.request_s(
            sampling.params.max_new_tokens, 1) * conditions
        phases["scoring"] = phases.get("scoring", 0.0) + scored * conditions * 2 \
            * model.overhead_s
    # The first look as the replay plan places it (campaign/schedule.py): after the first
    # pass with one interleaved boot; after the second boot with several (every per-boot
    # phase that far); none where the plan's only look is its end.
    first = None
    rest = sum(v for k, v in phases.items() if k not in ("timed", "boots", "warm-up", "greedy"))
    if pilot.decision.early_stop and boots == 1 and load.interleaved and load.passes > 1:
        first = sum(per_level.values()) + phases["boots"] + phases["warm-up"] \
            + phases.get("greedy", 0.0) + rest
    elif pilot.decision.early_stop and boots >= 3:
        first = 2 / boots * sum(phases.get(k, 0.0) for k in ("timed", "boots", "warm-up",
                                                             "greedy")) + rest
    return ExpectedTime(model.source, phases, first, pilot.cost.devices_per_server,
                        gpu=not target_kind(pilot).in_process or pilot.target.device != "cpu",
                        price=pilot.cost.device_hour_price, currency=pilot.cost.currency,
                        per_level=per_level)
