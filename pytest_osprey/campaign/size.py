"""How big a campaign is, known from the pilot before anything runs: requests and output
tokens per condition, so that a legal pilot whose budget no run (or judge) could hold is
refused with the keys to change, and every run says its size before it starts."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from ..pilot.probes import PROBES
from ..pilot.schema import Pilot
from ..pilot.trace import Trace
from .requests import max_new_tokens

# Every record is kept in memory by the judge (a few KiB each) and in records.jsonl: a
# million requests is days of serving for a pilot and gigabytes for the judge.
MAX_REQUESTS = 1_000_000
# The judge's memory, measured on the records it keeps (about 4.4 KiB for a 64-token
# record with its text): a record's fixed part, each output token (id and text), doubled for
# the arrays judging builds beside them. The distribution check is bounded on its own
# (judgement.quality.distribution.MAX_SAMPLES_PER_SIDE).
RECORD_BYTES = 2048
TOKEN_BYTES = 40
JUDGE_COPIES = 2
JUDGE_SHARE = 0.5
"""The share of this machine's memory a judge may be estimated to need."""


@dataclass(frozen=True)
class CampaignSize:
    """Measured requests (fillers and warm-up not counted) and their output-token budget;
    "timed" includes the untimed greedy pass that runs beside sampled timed passes."""

    conditions: int
    timed_per_condition: int
    sampled_per_condition: int
    params_per_condition: int
    tokens_per_condition: int
    scoring: int = 0
    """Scoring requests, all sent to the baseline (the target scores every condition's
    sampled outputs, one request per sample)."""
    worst_case_s: float = 0.0
    """Wall time if every request ran to ``load.request_timeout_s`` (the timeout breaker stops
    a condition whose requests keep timing out long before)."""

    @property
    def judge_mib(self) -> float:
        """The judge's memory for these records, estimated (MiB)."""
        total = self.requests * RECORD_BYTES + self.tokens_per_condition * self.conditions \
            * TOKEN_BYTES
        return JUDGE_COPIES * total / 2**20

    @property
    def per_condition(self) -> int:
        return self.timed_per_condition + self.sampled_per_condition + self.params_per_condition

    @property
    def requests(self) -> int:
        return self.per_condition * self.conditions + self.scoring

    def line(self) -> str:
        return (f"campaign size: {self.requests:,} requests ({self.per_condition:,} per "
                f"condition: {self.timed_per_condition:,} timed, {self.sampled_per_condition:,} "
                f"sampled, {self.params_per_condition:,} parameter probes)"
                + (f" + {self.scoring:,} scoring requests to the baseline" if self.scoring
                   else "") + f", up to "
                f"{self.tokens_per_condition * self.conditions:,} output tokens; judge memory "
                f"about {self.judge_mib:,.0f} MiB; at most {_duration(self.worst_case_s)} if "
                "every request ran to its timeout")


def _duration(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:,.1f} h" if hours >= 1 else f"{seconds / 60:,.0f} min"


def campaign_size(pilot: Pilot, trace: Trace, conditions: int) -> CampaignSize:
    load, sampling = pilot.load, pilot.sampling
    prompts = trace.prompts
    budget = sum(max_new_tokens(pilot, p) for p in prompts)
    boots = load.boots_per_condition
    timed = len(prompts) * len(load.levels) * load.passes * boots
    tokens = budget * len(load.levels) * load.passes * boots
    if sampling.serving.sampled and sampling.greedy:  # the untimed greedy pass beside them
        timed += len(prompts) * boots
        tokens += budget * boots
    sampled = 0
    if sampling.sampled.enabled:
        chosen = prompts[: sampling.sampled.prompts or len(prompts)]
        sampled = len(chosen) * sampling.sampled.samples_per_prompt
        tokens += sum(max_new_tokens(pilot, p, sampling.sampled.max_new_tokens)
                      for p in chosen) * sampling.sampled.samples_per_prompt
    params = 0
    if sampling.params.enabled:
        params = min(sampling.params.prompts, len(prompts)) * len(PROBES)
        tokens += params * sampling.params.max_new_tokens
    # Closed loop: c at a time; open loop: up to its cap (uncapped: all of a stretch at once).
    waves = sum(len(prompts) * load.passes * boots / max(1, load.concurrency(level))
                for level in load.levels)
    waves += sampled + params + (timed - len(prompts) * len(load.levels) * load.passes * boots)
    worst = waves * conditions * load.request_timeout_s
    return CampaignSize(conditions, timed, sampled, params, tokens, worst_case_s=worst,
                        scoring=sampled * conditions)


_KEYS = ("lower trace.ids / the trace's prompts, load.levels, load.passes, "
         "load.boots_per_condition or sampling.sampled.samples_per_prompt / "
         "sampling.sampled.prompts")


def size_problem(size: CampaignSize, memory_bytes: int | None = None) -> str | None:
    """Why a campaign this size is refused (naming the keys), or None: more requests than a
    run holds, or a judge this machine's memory (``memory_bytes``, default: psutil's total)
    cannot hold."""
    if size.requests > MAX_REQUESTS:
        return f"{size.line()}: over the {MAX_REQUESTS:,} requests a run holds; {_KEYS}"
    if memory_bytes is None:
        memory_bytes = psutil.virtual_memory().total
    limit = JUDGE_SHARE * memory_bytes / 2**20
    if size.judge_mib > limit:
        return (f"{size.line()}: the judge would need more than {limit:,.0f} MiB, half this "
                f"machine's memory; {_KEYS}, or max_new_tokens_cap")
    return None
