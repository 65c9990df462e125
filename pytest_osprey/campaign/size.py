"""How big a campaign is, known from the pilot before anything runs: requests and output
tokens per condition, so that a legal pilot whose budget no run (or judge) could hold is
refused with the keys to change, and every run says its size before it starts."""

from __future__ import annotations

from dataclasses import dataclass

from ..pilot.probes import PROBES
from ..pilot.schema import Pilot
from ..pilot.trace import Trace
from .requests import max_new_tokens

# Every record is kept in memory by the judge (a few KiB each) and in records.jsonl: a
# million requests is days of serving for a pilot and gigabytes for the judge.
MAX_REQUESTS = 1_000_000


@dataclass(frozen=True)
class CampaignSize:
    """Measured requests (fillers and warm-up not counted) and their output-token budget;
    "timed" includes the untimed greedy pass that runs beside sampled timed passes."""

    conditions: int
    timed_per_condition: int
    sampled_per_condition: int
    params_per_condition: int
    tokens_per_condition: int

    @property
    def per_condition(self) -> int:
        return self.timed_per_condition + self.sampled_per_condition + self.params_per_condition

    @property
    def requests(self) -> int:
        return self.per_condition * self.conditions

    def line(self) -> str:
        return (f"campaign size: {self.requests:,} requests ({self.per_condition:,} per "
                f"condition: {self.timed_per_condition:,} timed, {self.sampled_per_condition:,} "
                f"sampled, {self.params_per_condition:,} parameter probes), up to "
                f"{self.tokens_per_condition * self.conditions:,} output tokens")


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
    return CampaignSize(conditions, timed, sampled, params, tokens)


def size_problem(size: CampaignSize) -> str | None:
    """Why a campaign this size is refused (naming the keys), or None."""
    if size.requests <= MAX_REQUESTS:
        return None
    return (f"{size.line()}: over the {MAX_REQUESTS:,} a run holds; lower trace.ids / the "
            "trace's prompts, load.levels, load.passes, load.boots_per_condition or "
            "sampling.sampled.samples_per_prompt / sampling.sampled.prompts")
