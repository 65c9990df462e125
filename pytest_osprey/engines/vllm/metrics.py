"""What a vLLM server reports beside the text: logprob margins and top-2 ids of a completion, the
speculative-decoding counters and KV capacity of /metrics, and what they give per request."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"  # label: position


def margins_of(top: Any) -> list[float] | None:
    """Top-1 minus top-2 logprob per position from OpenAI ``top_logprobs`` dicts."""
    if not isinstance(top, list):
        return None
    out = []
    for row in top:
        if not isinstance(row, Mapping) or len(row) < 2:
            return None
        values = sorted((float(v) for v in row.values()), reverse=True)
        out.append(values[0] - values[1])
    return out


def top2_ids_of(top: Any) -> list[list[int]] | None:
    """Top-1 and top-2 token ids per position from ``top_logprobs`` dicts keyed
    ``token_id:N`` (``return_tokens_as_token_ids``); None when the keys are not ids."""
    if not isinstance(top, list):
        return None
    out = []
    for row in top:
        if not isinstance(row, Mapping) or len(row) < 2:
            return None
        ranked = sorted(row.items(), key=lambda kv: float(kv[1]), reverse=True)[:2]
        try:
            out.append([int(str(k).rsplit(":", 1)[1]) for k, _ in ranked])
        except (IndexError, ValueError):
            return None
    return out


def counters_from(text: str) -> dict[str, float]:
    """Spec-decode counter totals (summed over label sets) from a /metrics page, with the
    per-position accepted counts as ``pos0``, ``pos1``... where the engine exports them."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    wanted = {f"{name}_total": key for key, name in COUNTERS.items()}
    found = set()
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return {}  # not a metrics page: no counters, as from a server without them
    for family in families:
        for sample in family.samples:
            if not math.isfinite(sample.value):
                continue  # NaN or inf counts nothing (and would poison every difference)
            key = wanted.get(sample.name)
            if key is None and sample.name == f"{PER_POSITION}_total":
                try:
                    key = f"pos{int(sample.labels['position'])}"
                except (KeyError, ValueError):
                    continue
                totals.setdefault(key, 0.0)
            if key is not None:
                totals[key] += float(sample.value)
                found.add(key)
    return totals if found else {}


def acceptance_from(
    before: Mapping[str, float], after: Mapping[str, float]
) -> tuple[int, list[int]] | None:
    """(drafts, accepted per position) between two counter snapshots; None without the
    per-position counters or drafts."""
    positions = sorted(int(k[3:]) for k in after if k.startswith("pos"))
    if not before or not after or not positions or positions != list(range(len(positions))):
        return None
    drafts = int(after["drafts"] - before["drafts"])
    if drafts <= 0:
        return None
    return drafts, [int(after[f"pos{j}"] - before.get(f"pos{j}", 0.0)) for j in positions]


def kv_capacity_from(text: str) -> int | None:
    """KV cache capacity in tokens from vllm:cache_config_info (num_gpu_blocks x block_size)."""
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return None
    for family in families:
        if family.name != "vllm:cache_config_info":
            continue
        for sample in family.samples:
            try:
                return int(sample.labels["num_gpu_blocks"]) * int(sample.labels["block_size"])
            except (KeyError, ValueError):
                return None
    return None


def accept_from(before: Mapping[str, float], after: Mapping[str, float]) -> float | None:
    """1 + accepted/drafts between two counter snapshots (None when nothing was drafted)."""
    if not before or not after:
        return None
    drafts = after["drafts"] - before["drafts"]
    if drafts <= 0:
        return None
    return 1.0 + (after["accepted"] - before["accepted"]) / drafts


def max_num_seqs_of(server_info: Any, argv: list[str] | None = None) -> int | None:
    """The most requests the server runs at once (``scheduler_config.max_num_seqs``): from
    its dev-mode ``/server_info?config_format=json`` (the resolved value: vLLM picks a
    default per device, 128 per CPU socket for the OpenAI server), else from a
    ``--max-num-seqs`` on its command line; None when neither tells."""
    config = server_info.get("vllm_config") if isinstance(server_info, Mapping) else None
    scheduler = config.get("scheduler_config") if isinstance(config, Mapping) else None
    value = scheduler.get("max_num_seqs") if isinstance(scheduler, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    args = argv or []
    for i, arg in enumerate(args):
        given = (arg.partition("=")[2] if arg.startswith("--max-num-seqs=")
                 else args[i + 1] if arg == "--max-num-seqs" and i + 1 < len(args) else None)
        if given is not None and given.strip().isdigit():
            return int(given)
    return None
