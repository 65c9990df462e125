"""A campaign's size is known from the pilot: counted as the runner sends them, and a budget
no run could hold is refused before anything starts, naming the keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_osprey.campaign.size import MAX_REQUESTS, campaign_size, size_problem
from pytest_osprey.pilot.probes import PROBES, SAMPLED_PROBES
from pytest_osprey.pilot.trace import load_trace
from testkit.factories import make_pilot, write_trace


def test_size_counts_every_pass_the_pilot_asks_for(tmp_path: Path) -> None:
    trace = load_trace([write_trace(tmp_path / "t.jsonl", 10, max_new_tokens=8)])
    pilot = make_pilot(
        {"base": {"role": "baseline"}, "cand": {"role": "candidate", "drafter": "d"}},
        load={"levels": {"low": 1, "busy": 4}, "passes": 3, "boots_per_condition": 2},
        sampling={"sampled": {"enabled": True, "prompts": 4, "samples_per_prompt": 5,
                              "max_new_tokens": 6},
                  "params": {"enabled": True, "prompts": 2, "max_new_tokens": 4,
                             "samples": 3}})
    size = campaign_size(pilot, trace, conditions=2)
    assert size.timed_per_condition == 10 * 2 * 3 * 2
    assert size.sampled_per_condition == 4 * 5
    # per prompt: plain + the greedy probes, 3 samples of each sampled probe, the seed twice
    params = 2 * (1 + len(PROBES) + 3 * len(SAMPLED_PROBES) + 2)
    assert size.params_per_condition == params
    assert size.tokens_per_condition == 8 * 10 * 2 * 3 * 2 + 6 * 4 * 5 + 4 * params
    # The baseline scores every condition's sampled outputs (the sampled probes' too), one
    # request per sample.
    assert size.scoring == 2 * (4 * 5 + 2 * 3 * len(SAMPLED_PROBES))
    assert size.requests == 2 * size.per_condition + size.scoring
    assert size_problem(size) is None and f"{size.requests:,} requests" in size.line()
    assert f"{size.scoring:,} scoring requests to the baseline" in size.line()


def test_a_budget_no_run_can_hold_is_refused_naming_the_keys(tmp_path: Path) -> None:
    trace = load_trace([write_trace(tmp_path / "t.jsonl", 50)])
    pilot = make_pilot(
        {"base": {"role": "baseline"}, "cand": {"role": "candidate", "drafter": "d"}},
        sampling={"sampled": {"enabled": True, "prompts": 50, "samples_per_prompt": 10_000}})
    size = campaign_size(pilot, trace, conditions=2)
    assert size.requests > MAX_REQUESTS
    why = size_problem(size)
    assert why is not None and "sampling.sampled.samples_per_prompt" in why
    assert "load.passes" in why and "\n" not in why


@pytest.mark.slow  # over a second on 2 busy cores
@pytest.mark.parametrize("samples", [10_000])
def test_the_cli_refuses_it_with_exit_4(tmp_path: Path, samples: int) -> None:
    from testkit.endpoint_pilot import run_cli, write_endpoint_pilot

    pilot = write_endpoint_pilot(tmp_path, "http://127.0.0.1:9", 50, extra={
        "sampling": {"sampled": {"enabled": True, "prompts": 50, "samples_per_prompt": samples}}})
    assert run_cli(["run", str(pilot), "--dry-run"]) == 4


def test_the_judges_memory_and_the_worst_case_time_are_estimated_and_bounded(
        tmp_path: Path) -> None:  # fmt: skip
    from pytest_osprey.campaign.size import JUDGE_COPIES, RECORD_BYTES, TOKEN_BYTES

    trace = load_trace([write_trace(tmp_path / "t.jsonl", 10, max_new_tokens=8)])
    pilot = make_pilot(
        {"base": {"role": "baseline"}, "cand": {"role": "candidate", "drafter": "d"}},
        load={"levels": {"low": 1, "busy": 4}, "passes": 2, "request_timeout_s": 60},
        sampling={"greedy": True, "serving": {"temperature": 0.0}})
    size = campaign_size(pilot, trace, conditions=2)
    records = size.requests
    assert size.judge_mib == pytest.approx(
        JUDGE_COPIES * (records * RECORD_BYTES + 2 * size.tokens_per_condition * TOKEN_BYTES)
        / 2**20)
    # Per condition and pass: 10 waves at x1, 10/4 at x4, each up to 60 s.
    waves = (10 + 10 / 4) * 2 + size.sampled_per_condition + size.params_per_condition
    assert size.worst_case_s == pytest.approx(waves * 2 * 60)
    # An expectation exists (the embedded engine's default): the worst case is left out.
    assert "judge memory about" in size.line() and "if every request ran to its timeout" \
        not in size.line()
    assert size_problem(size, memory_bytes=64 * 2**30) is None
    # On a machine with a sliver of memory the same campaign is refused, naming the keys.
    why = size_problem(size, memory_bytes=int(size.judge_mib * 2**20))
    assert why is not None and "the judge would need more than" in why
    assert "load.passes" in why and "max_new_tokens_cap" in why


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_the_size_line_gives_the_quality_passes_share(tmp_path: Path,
                                                      temperature: float) -> None:
    trace = load_trace([write_trace(tmp_path / "t.jsonl", 10, max_new_tokens=8)])
    pilot = make_pilot(
        {"base": {"role": "baseline"}, "cand": {"role": "candidate", "drafter": "d"}},
        load={"levels": {"low": 1, "busy": 4}, "passes": 2},
        sampling={"serving": {"temperature": temperature},
                  "sampled": {"enabled": True, "prompts": 4, "samples_per_prompt": 5},
                  "params": {"enabled": True, "prompts": 2}})
    size = campaign_size(pilot, trace, conditions=2)
    timed = 10 * 2 * 2
    # Served sampled: a greedy pass of the trace runs beside the timed ones, for quality only.
    greedy = 10 if temperature else 0
    # ... and the baseline scores both conditions' samples (one request per sample).
    params = 2 * (1 + len(PROBES) + 8 * len(SAMPLED_PROBES) + 2)  # 8 samples by default
    quality = greedy + 4 * 5 + params + 4 * 5 + 2 * 8 * len(SAMPLED_PROBES)
    assert (size.timed_per_condition, size.greedy_per_condition) == (timed, greedy)
    assert size.quality_requests == 2 * quality and size.requests == 2 * (timed + quality)
    share = quality / (timed + quality)
    assert size.quality_share == pytest.approx(share)
    assert (f"quality passes: {2 * quality:,} of {2 * (timed + quality):,} requests, "
            f"{share:.0%}") in size.line()
    assert size.facts()["scoring"] == 2 * (4 * 5 + 2 * 8 * len(SAMPLED_PROBES))
    assert ("greedy (untimed)" in size.line()) == bool(temperature)
    facts = size.facts()
    assert facts["quality_requests"] == size.quality_requests
    assert facts["requests"] == size.requests and facts["greedy"] == greedy
