"""A campaign's expected time, stated before it starts: a per-request time model (measured by
the last complete run of the same pilot, else a documented default per engine) over the
design, checked against known truths; device-hours and their price."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pytest_osprey.campaign.expected_time import CPU_TINY, UNKNOWN, expected_time
from pytest_osprey.campaign.measured_time import fit_model
from pytest_osprey.campaign.size import campaign_size
from pytest_osprey.pilot.loading import load_pilot
from pytest_osprey.pilot.trace import load_trace
from pytest_osprey.results.records import RequestRecord
from testkit.factories import make_pilot, make_record, write_trace
from testkit.recorded_campaign import RUN_ID, campaign_records, record_campaign, write_project

CONDS = {"base": {"role": "baseline"}, "cand": {"role": "candidate", "drafter": "d"}}
# The truth: seconds per token at each concurrency, time to first token, tokens per output.
TRUTH = {1: 0.020, 4: 0.030}
TTFT, TOKENS, PROMPTS, BOOTS = 0.15, 40, 30, 2


def _simulated_run(seed: int) -> tuple[list[RequestRecord], float]:
    """Records of a run under the truth with drifting (AR(1), machine-wide) multiplicative
    noise, and its timed duration: closed loop keeps c in flight, so a stretch lasts its
    requests' summed time over c."""
    rng = np.random.default_rng(seed)
    records, total, drift = [], 0.0, 0.0
    for boot in range(BOOTS):
        for cond in CONDS:
            for level, c in (("low", 1), ("busy", 4)):
                e2es = []
                for k in range(PROMPTS):
                    drift = 0.8 * drift + float(rng.normal(0, 0.06))
                    tokens = int(rng.integers(TOKENS // 2, TOKENS + 1))  # some end early
                    e2e = (TTFT + (tokens - 1) * TRUTH[c]) * float(np.exp(drift))
                    e2es.append(e2e)
                    records.append(make_record(
                        cond, f"p{k}", measured=False, run_id="r", block=boot, boot=boot,
                        load=level, concurrency=c, ok=True, e2e_s=e2e, ttft_s=TTFT,
                        output_ids=list(range(tokens)), output_text="x"))
                total += sum(e2es) / c
    return records, total


def test_a_measured_time_model_predicts_the_next_runs_duration_within_20_percent(
        tmp_path: Path) -> None:  # fmt: skip
    trace = load_trace([write_trace(tmp_path / "t.jsonl", PROMPTS, max_new_tokens=TOKENS)])
    pilot = make_pilot(CONDS, load={"levels": {"low": 1, "busy": 4}, "passes": 1,
                                    "boots_per_condition": BOOTS},
                       sampling={"greedy": True, "serving": {"temperature": 0.0}})
    before, _ = _simulated_run(1)
    model = fit_model(before, 0.0, "measured", {p.id: TOKENS for p in trace.prompts})
    assert model is not None
    assert model.token_s(1) == pytest.approx(TRUTH[1], rel=0.15)
    assert model.token_s(4) == pytest.approx(TRUTH[4], rel=0.15)
    assert model.fill == pytest.approx(0.75, abs=0.05)  # outputs of 20..40 tokens of 40
    expected = expected_time(pilot, trace, 2, model)
    assert expected is not None
    for seed in (2, 3, 4):
        _, actual = _simulated_run(seed)
        assert expected.phases["timed"] == pytest.approx(actual, rel=0.2)


def test_the_last_run_of_the_same_pilot_reproduces_a_recorded_campaigns_stretches(
        tmp_path: Path) -> None:  # fmt: skip
    project = write_project(tmp_path)
    pilot = load_pilot(project / "pilot.yaml")
    root = tmp_path / "osprey-results"
    record_campaign(project, root / f"{pilot.name}-20250101-000000")
    (root / "other-20250102-000000").mkdir()  # another pilot's folder: not read
    trace = load_trace(pilot.trace.files)
    size = campaign_size(pilot, trace, 4, root)
    assert size.expected is not None
    assert size.expected.source == f"measured by the last run, {pilot.name}-20250101-000000"
    assert size.line().startswith("expected time: up to ")
    # The recorded campaign is one pass per boot: its timed stretches at each level, from
    # the first request's start to the last one's end, summed.
    records = [r for r in campaign_records(np.random.default_rng(7))
               if not r.filler and r.mode == "greedy" and r.run_id == RUN_ID]
    for level in ("low", "busy"):
        spans = 0.0
        for key in {(r.block, r.condition) for r in records if r.load == level}:
            at = [r for r in records if (r.block, r.condition) == key and r.load == level]
            spans += max(float(r.started_at or 0) + float(r.e2e_s or 0) for r in at if r.ok) \
                - min(float(r.started_at or 0) for r in at)
        assert size.expected.per_level[level] == pytest.approx(spans, rel=0.2), level


def test_the_header_states_the_expected_time_first_and_the_timeout_bound_only_without_one(
        tmp_path: Path) -> None:  # fmt: skip
    from testkit.factories import endpoint_conditions

    trace = load_trace([write_trace(tmp_path / "t.jsonl", 10, max_new_tokens=8)])
    load = {"levels": {"low": 1, "busy": 4}, "passes": 3, "request_timeout_s": 60}
    embedded = campaign_size(make_pilot(CONDS, load=load), trace, 2, tmp_path / "none")
    assert embedded.expected is not None and embedded.expected.source == CPU_TINY.source
    line = embedded.line()
    assert line.startswith("expected time: up to ") and "if every request ran" not in line
    assert line.index("expected time") < line.index("campaign size") < line.index("judge")
    # Early stopping (on by default) can end after the first of 3 passes: sooner.
    assert embedded.expected.first_look_s is not None
    assert embedded.expected.first_look_s < embedded.expected.total_s
    assert "if it stops at the first look" in line
    # An endpoint, no earlier run: nothing to expect; the worst case is the only bound.
    remote = make_pilot(endpoint_conditions({"base": "http://127.0.0.1:9",
                                             "cand": "http://127.0.0.1:10"}), load=load)
    size = campaign_size(remote, trace, 2, tmp_path / "none")
    assert size.expected is None and size.facts()["expected"] is None
    assert size.line().startswith(UNKNOWN)
    assert size.line().endswith(" if every request ran to its timeout")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_device_hours_and_their_price_from_the_pilots_cost(tmp_path: Path, engine: str) -> None:
    trace = load_trace([write_trace(tmp_path / "t.jsonl", 20, max_new_tokens=64)])
    pilot = make_pilot(CONDS, target={"engine": engine, "model": "m"},
                       load={"levels": {"x1": 1, "x8": 8}, "passes": 2},
                       cost={"device_hour_price": 2.5, "devices_per_server": 2})
    size = campaign_size(pilot, trace, 2)
    exp = size.expected
    assert exp is not None and exp.gpu and exp.devices == 2
    assert exp.device_hours == pytest.approx(exp.total_s / 3600 * 2)
    facts = size.facts()["expected"]
    assert facts["cost"] == pytest.approx(exp.device_hours * 2.5, abs=1e-4)
    assert f"GPU-hours (USD {exp.device_hours * 2.5:,.2f} at 2.50/h)" in size.line()
    # Batch 1 at the reference 158 tok/s: x1's pass is 20 prompts x 63 tokens after the first
    # per condition (2 conditions, 1 boot), plus each request's overhead.
    x1 = 2 * 20 * (63 / 158 + exp_overhead(engine))
    assert exp.per_level["x1"] == pytest.approx(x1)
    # At x8 the aggregate rises: a pass takes less than at x1.
    assert exp.per_level["x8"] < exp.per_level["x1"]


def exp_overhead(engine: str) -> float:
    from pytest_osprey.campaign.expected_time import GPU_REFERENCE

    return GPU_REFERENCE.overhead_s
