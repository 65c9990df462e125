"""The time model measured by the last complete campaign of the same pilot: per concurrency,
seconds per output token and the fixed part of a request, fitted on its timed records; its
conditions' boot times. The best source of a campaign's expected time (expected_time.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..results.folder import load_campaign
from ..results.records import RequestRecord
from .expected_time import TimeModel


def fit_model(records: Sequence[RequestRecord], boot_s: float, source: str,
              budgets: dict[str, int] | None = None) -> TimeModel | None:
    """A time model from measured records (timed, complete, not fillers), or None where
    there are none. Per concurrency c: overhead = mean time to first token (means: durations
    add up), per token =
    the rest of each request over its remaining tokens (pooled: the sum over the sum, so long
    requests weigh as they cost). ``budgets`` (prompt id -> output-token budget): the share
    of it the outputs filled."""
    timed = [r for r in records if r.ok and not r.filler and r.mode in ("greedy", "serving")
             and r.e2e_s is not None and _tokens(r)]
    if not timed:
        return None
    per_c: dict[int, float] = {}
    overheads: dict[int, float] = {}
    for c in sorted({r.concurrency for r in timed}):
        at = [r for r in timed if r.concurrency == c]
        ttft = np.array([r.ttft_s if r.ttft_s is not None else 0.0 for r in at])
        e2e = np.array([float(r.e2e_s or 0.0) for r in at])
        tokens = np.array([max(1, _tokens(r) - 1) for r in at])
        per_c[c] = float(np.sum(e2e - ttft) / np.sum(tokens))
        overheads[c] = float(np.mean(ttft))
    fill = 1.0
    if budgets:
        known = [r for r in timed if r.prompt_id in budgets]
        asked = sum(budgets[r.prompt_id] for r in known)
        fill = min(1.0, sum(_tokens(r) for r in known) / asked) if asked else 1.0
    low = min(per_c)
    high = max(per_c)
    slowdown = ((per_c[high] / per_c[low] - 1) / (high - low) if high > low else 0.0)
    return TimeModel(source, per_c[low], max(0.0, slowdown), overheads[low], boot_s,
                     per_concurrency=per_c, overheads=overheads, base_concurrency=low, fill=fill)


def _tokens(record: RequestRecord) -> int:
    return record.output_tokens if record.output_tokens is not None else len(record.output_ids)


def last_complete(root: Path, name: str) -> Path | None:
    """The newest complete campaign of pilot ``name`` under ``root`` (osprey-results/), or
    None. Folders are ``<name>-<local time>``: newest by its campaign.json's end time."""
    best: tuple[float, Path] | None = None
    if not root.is_dir():
        return None
    for folder in root.glob(f"{name}-*"):
        try:
            meta = json.loads((folder / "campaign.json").read_text("utf-8"))
        except (OSError, ValueError):
            continue  # a folder still running, killed or unreadable says nothing
        if not isinstance(meta, dict) or meta.get("status") != "complete" \
                or meta.get("pilot_name") != name or meta.get("shard") is not None:
            continue
        ended = meta.get("ended_at")
        when = float(ended) if isinstance(ended, (int, float)) else 0.0
        if best is None or when > best[0]:
            best = (when, folder)
    return best[1] if best else None


def measured_model(root: Path, name: str,
                   budgets: dict[str, int] | None = None) -> TimeModel | None:
    """The time model of the last complete campaign of ``name`` under ``root``, or None."""
    folder = last_complete(root, name)
    if folder is None:
        return None
    try:
        data = load_campaign(folder)
    except (OSError, ValueError):
        return None  # an unreadable earlier run: the default model serves
    boots = [c.boot_s for c in data.meta.conditions.values() if c.boot_s is not None]
    boot = float(np.mean(boots)) if boots else 0.0
    return fit_model(data.records, boot, f"measured by the last run, {folder.name}",
                     budgets)
