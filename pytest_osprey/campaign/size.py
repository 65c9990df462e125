"""How big a campaign is, known from the pilot before anything runs: requests and output
tokens per condition, so that a legal pilot whose budget no run (or judge) could hold is
refused with the keys to change, and every run says its size before it starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..pilot.probes import PROBES, SAMPLED_PROBES
from ..pilot.schema import Pilot
from ..pilot.selection import pass_draws
from ..pilot.trace import Trace
from .expected_time import UNKNOWN, ExpectedTime, expected_time
from .measured_time import measured_model
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
    """Measured requests (fillers and warm-up not counted) and their output-token budget.
    The quality passes are those run only for quality evidence: the untimed greedy pass
    beside sampled timed passes, the sampled pass and the sampling-parameters pass."""

    conditions: int
    timed_per_condition: int
    sampled_per_condition: int
    params_per_condition: int
    tokens_per_condition: int
    worst_case_s: float = 0.0
    """Wall time if every request ran to ``load.request_timeout_s`` (the timeout breaker stops
    a condition whose requests keep timing out long before)."""
    greedy_per_condition: int = 0
    """The untimed greedy pass (identity, correctness) beside sampled timed passes."""
    scoring: int = 0
    """Scoring requests, all sent to the baseline (the target scores every condition's
    sampled outputs, one request per sample): quality evidence too."""
    expected: ExpectedTime | None = None
    """The expected time and device-hours (None: no time model before warm-up)."""

    @property
    def quality_per_condition(self) -> int:
        return self.greedy_per_condition + self.sampled_per_condition + self.params_per_condition

    @property
    def quality_requests(self) -> int:
        return self.quality_per_condition * self.conditions + self.scoring

    @property
    def quality_share(self) -> float:
        return self.quality_requests / self.requests if self.requests else 0.0

    @property
    def judge_mib(self) -> float:
        """The judge's memory for these records, estimated (MiB)."""
        total = self.requests * RECORD_BYTES + self.tokens_per_condition * self.conditions \
            * TOKEN_BYTES
        return JUDGE_COPIES * total / 2**20

    @property
    def per_condition(self) -> int:
        return self.timed_per_condition + self.quality_per_condition

    @property
    def requests(self) -> int:
        return self.per_condition * self.conditions + self.scoring

    def line(self) -> str:
        """Expected time first, then the requests and tokens, the quality share, the judge's
        memory; the worst case (every request to its timeout) only where no expectation
        exists: otherwise the timeout breaker stops a failing condition long before."""
        greedy = (f"{self.greedy_per_condition:,} greedy (untimed), "
                  if self.greedy_per_condition else "")
        expected = self.expected.line() if self.expected is not None else UNKNOWN
        worst = ("" if self.expected is not None else
                 f"; at most {_duration(self.worst_case_s)} if every request ran to its timeout")
        return (f"{expected}; campaign size: {self.requests:,} requests "
                f"({self.per_condition:,} per condition: {self.timed_per_condition:,} timed, "
                f"{greedy}"
                f"{self.sampled_per_condition:,} sampled, {self.params_per_condition:,} "
                f"parameter probes)"
                + (f" + {self.scoring:,} scoring requests to the baseline" if self.scoring
                   else "")
                + f", up to {self.tokens_per_condition * self.conditions:,} "
                f"output tokens; {self.quality_line()}; judge memory about "
                f"{self.judge_mib:,.0f} MiB{worst}")

    def quality_line(self) -> str:
        """The quality passes' share of the campaign, e.g. ``quality passes: 1,120 of 3,700
        requests, 30%``."""
        return (f"quality passes: {self.quality_requests:,} of {self.requests:,} requests, "
                f"{self.quality_share:.0%}")

    def facts(self) -> dict[str, Any]:
        """campaign.json's ``size``."""
        return {"conditions": self.conditions, "timed": self.timed_per_condition,
                "greedy": self.greedy_per_condition, "sampled": self.sampled_per_condition,
                "params": self.params_per_condition, "scoring": self.scoring,
                "requests": self.requests,
                "quality_requests": self.quality_requests,
                "quality_share": round(self.quality_share, 4),
                "output_tokens": self.tokens_per_condition * self.conditions,
                "expected": self.expected.facts() if self.expected is not None else None}


def _duration(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:,.1f} h" if hours >= 1 else f"{seconds / 60:,.0f} min"


def campaign_size(pilot: Pilot, trace: Trace, conditions: int,
                  results_root: Path | None = None) -> CampaignSize:
    """The campaign's size; its expected time from the last complete run of the same pilot
    under ``results_root`` (osprey-results/) where there is one, else the engine's default."""
    load, sampling = pilot.load, pilot.sampling
    prompts = trace.prompts
    budget = sum(max_new_tokens(pilot, p) for p in prompts)
    level_passes = sum(load.passes_at(level) for level in load.levels)  # boots counted
    timed = len(prompts) * level_passes
    tokens = budget * level_passes
    greedy = 0
    if sampling.serving.sampled and sampling.greedy:  # the untimed greedy pass beside them
        greedy = len(prompts) * pilot.greedy_boots
        tokens += budget * pilot.greedy_boots
    draws = pass_draws(pilot, prompts)  # the passes' own seeded draws, as the campaign's
    sampled = 0
    if "sampled" in draws:
        chosen = draws["sampled"].prompts
        sampled = len(chosen) * sampling.sampled.samples_per_prompt
        tokens += sum(max_new_tokens(pilot, p, sampling.sampled.max_new_tokens)
                      for p in chosen) * sampling.sampled.samples_per_prompt
    params = scored_probes = 0
    if "params" in draws:
        n, samples = len(draws["params"].prompts), sampling.params.samples
        # greedy: plain + each probe; sampled: each sampled probe's samples, and the seed
        # probe's two requests (where samples are asked for)
        scored_probes = n * len(SAMPLED_PROBES) * samples
        params = n * (1 + len(PROBES)) + scored_probes + (2 * n if samples else 0)
        tokens += params * sampling.params.max_new_tokens
    # Closed loop: c at a time; open loop: up to its cap (uncapped: all of a stretch at once).
    waves = sum(len(prompts) * load.passes_at(level) / max(1, load.concurrency(level))
                for level in load.levels)
    waves += sampled + params + greedy
    worst = waves * conditions * load.request_timeout_s
    model = (measured_model(results_root, pilot.name,
                            {p.id: max_new_tokens(pilot, p) for p in prompts})
             if results_root is not None else None)
    return CampaignSize(conditions, timed, sampled, params, tokens, worst, greedy,
                        scoring=(sampled + scored_probes) * conditions,
                        expected=expected_time(pilot, trace, conditions, model))


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
