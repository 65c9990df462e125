"""The speculation an engine really ran, read back after its boot, beside what the pilot asked.

An engine may not run what the pilot names: SGLang chooses steps, top-k and draft tokens itself
where they are unset, and can adapt its depth at run time (``--speculative-adaptive``, newer
``--auto-spec``); vLLM can vary K with the batch size (``num_speculative_tokens_per_batch_size``).
So each boot stores, in its fingerprint under ``speculation``, both the settings the pilot asked
for (in the engine's own terms) and those the server resolved, read from the server itself. The
fairness gate compares the two (judgement/service/fairness.py); per-stretch counter snapshots
(``spec_counters`` of an engine) give K per stretch where the engine exposes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from pytest_osprey.pilot.schema import Pilot

# SGLang server_info keys for adaptive depth: 0.5.23 has speculative_adaptive; the others are
# the documented newer spellings (``--auto-spec``), read tolerantly.
_SGLANG_ADAPTIVE = ("speculative_adaptive", "auto_spec", "enable_auto_spec")
_SGLANG_SPEC_V2 = ("enable_spec_v2", "spec_v2")
SPEC_V2_ENV = "SGLANG_ENABLE_SPEC_V2"

# Per-stretch counters, under one set of names for every engine (see spec_counters_of).
SGLANG_METRICS = {
    "sglang:spec_verify_calls": "verify_steps",  # counter: verify steps of finished requests
    "sglang:generation_tokens": "output_tokens",  # counter: tokens of finished requests
    "sglang:spec_num_steps": "num_steps",  # gauge (adaptive depth): the active steps
    "sglang:spec_num_draft_tokens": "num_draft_tokens",  # gauge: the active draft tokens
}
VLLM_METRICS = {
    "vllm:spec_decode_num_drafts": "verify_steps",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}
_VLLM_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
GAUGES = frozenset({"num_steps", "num_draft_tokens"})
"""Snapshot keys that are levels, not running totals (never differenced)."""


@dataclass(frozen=True)
class EffectiveSpeculation:
    """Speculative settings as one side states them: ``asked`` (the pilot, in the engine's
    terms) or ``ran`` (read back from the engine); None where that side does not say."""

    algorithm: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    """SGLang: draft tokens per verify step, the root included; vLLM: num_speculative_tokens;
    transformers: num_assistant_tokens (the pilot's num_draft_tokens in every case)."""
    adaptive: bool | None = None
    """The depth changes at run time (SGLang adaptive/auto spec, vLLM K per batch size)."""
    overlap: bool | None = None
    """SGLang: the overlap scheduler runs with speculation (spec v2)."""
    k_by_batch_size: list[Any] | None = None
    """vLLM num_speculative_tokens_per_batch_size as resolved."""
    source: str | None = None
    """Where these values were read."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def speculation_facts(asked: EffectiveSpeculation, ran: EffectiveSpeculation,
                      adaptive_allowed: bool) -> dict[str, Any]:
    """The fingerprint's ``speculation`` entry."""
    return {"asked": asked.as_dict(), "ran": ran.as_dict(), "adaptive_allowed": adaptive_allowed}


def fixed_k_facts(k: int, spec: Any) -> dict[str, Any]:
    """The ``speculation`` entry of an engine that drafts exactly ``k`` per step and knows it
    (the embedded engine's constant schedule); ``spec``: the pilot's Speculation or None."""
    allowed = bool(spec is not None and spec.adaptive)
    asked = EffectiveSpeculation(algorithm="assisted", num_draft_tokens=k, adaptive=allowed,
                                 source="pilot")
    ran = EffectiveSpeculation(algorithm="assisted", num_draft_tokens=k, adaptive=False,
                               source="the engine itself (a fixed k per step)")
    return speculation_facts(asked, ran, allowed)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    return None


def sglang_ran(info: Mapping[str, Any], env: Mapping[str, str] | None = None,
               source: str = "/server_info") -> EffectiveSpeculation:
    """What an SGLang server resolved, from its /server_info (every resolved server argument).
    The spec-v2 switch is an environment variable: ``env`` is the server's, where known."""
    if not info:
        return EffectiveSpeculation(source=f"{source}: not answered")
    stated = [_flag(info[k]) for k in _SGLANG_ADAPTIVE if k in info]
    adaptive = any(stated) if stated else None  # on under any of its names
    spec_v2 = next((_flag(info[k]) for k in _SGLANG_SPEC_V2 if k in info), None)
    if spec_v2 is None and env is not None and SPEC_V2_ENV in env:
        spec_v2 = _flag(env[SPEC_V2_ENV])
    overlap = None
    if "disable_overlap_schedule" in info:
        overlap = not bool(info["disable_overlap_schedule"])
        if spec_v2 is False:
            overlap = False  # the overlap scheduler does not run with v1 speculation
    algorithm = info.get("speculative_algorithm")
    return EffectiveSpeculation(
        algorithm=str(algorithm).upper() if algorithm else None,
        num_steps=_int(info.get("speculative_num_steps")),
        eagle_topk=_int(info.get("speculative_eagle_topk")),
        num_draft_tokens=_int(info.get("speculative_num_draft_tokens")),
        adaptive=adaptive if algorithm else None,
        overlap=overlap if algorithm else None,
        source=source,
    )


def vllm_ran(server_info: Any, source: str = "/server_info?config_format=json"
             ) -> EffectiveSpeculation:
    """What a vLLM server resolved, from its dev-mode /server_info's vllm_config."""
    config = server_info.get("vllm_config") if isinstance(server_info, Mapping) else None
    if not isinstance(config, Mapping):
        return EffectiveSpeculation(source=f"{source}: not answered")
    spec = config.get("speculative_config")
    if not isinstance(spec, Mapping):
        return EffectiveSpeculation(source=f"{source}: no speculative_config")
    per_batch = spec.get("num_speculative_tokens_per_batch_size")
    method = spec.get("method")
    return EffectiveSpeculation(
        algorithm=str(method).lower() if method else None,
        num_steps=_int(spec.get("prompt_lookup_max")) if method == "ngram" else None,
        num_draft_tokens=_int(spec.get("num_speculative_tokens")),
        adaptive=bool(per_batch),
        k_by_batch_size=list(per_batch) if isinstance(per_batch, list | tuple) else None,
        source=source,
    )


def spec_counters_of(text: str, names: Mapping[str, str]) -> dict[str, float]:
    """A /metrics page's speculation counters and gauges under the names of ``names`` (summed
    over label sets; vLLM's accepted tokens per draft position as pos0, pos1...); empty when
    the page has none of them."""
    out: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return {}
    for family in families:
        for sample in family.samples:
            base = sample.name.removesuffix("_total")
            key = names.get(base)
            if key is None and base == _VLLM_PER_POSITION and names is VLLM_METRICS:
                try:
                    key = f"pos{int(sample.labels['position'])}"
                except (KeyError, ValueError):
                    continue
            if key is None or sample.name.endswith(("_created", "_bucket", "_count", "_sum")):
                continue
            value = float(sample.value)
            if not math.isfinite(value):
                continue  # NaN or inf counts nothing (campaign.json keeps numbers only)
            if key in GAUGES and value <= 0:
                continue  # SGLang 0.5.23 leaves the depth gauges at 0 unless depth adapts
            # A gauge per scheduler states the same level: the largest, never their sum.
            out[key] = (max(out.get(key, value), value) if key in GAUGES
                        else out.get(key, 0.0) + value)
    return out


# The schema's most draft tokens: the bound where the depth is the server's own to choose.
_MOST_DRAFT_TOKENS = 64


def accept_length_most(pilot: Pilot, condition: str) -> int | None:
    """The most tokens one verify step of ``condition`` can commit (its draft tokens + 1):
    the upper bound of a sound accept length; None where it runs without speculation.

    Where the pilot's settings may not be what the server runs (a running endpoint, an
    adaptive depth, engine_args naming speculative flags), the bound is the most a pilot
    can ask for: an answer is never failed for the pilot's own mistake."""
    cond = pilot.conditions[condition]
    spec = cond.speculation
    own = any("specul" in arg for arg in [*pilot.target.engine_args, *cond.engine_args])
    if spec is None or spec.adaptive or own or cond.endpoint is not None:
        if cond.speculates or own or cond.endpoint is not None:
            return _MOST_DRAFT_TOKENS + 1
        return None
    return max(spec.num_draft_tokens, spec.num_steps or 0) + 1
