"""The distribution gate's exact test on the embedded engine: the target scores the samples
(scores.jsonl), an honest drafter passes, and planted verification faults fail it with a
diagnosis that names the drafted positions and sizes the defect."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.campaign.runner import Campaign
from pytest_osprey.engines.base import GenerationRequest
from pytest_osprey.engines.embedded.engine import TransformersEngine
from pytest_osprey.engines.embedded.planted_faults import ENV
from pytest_osprey.judgement.gates.kinds import GateKind
from pytest_osprey.judgement.gates.spec import GateSpec
from pytest_osprey.judgement.quality.gates import judge_distribution
from pytest_osprey.judgement.verdict.diagnosis import short_text
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.pilot.trace import load_trace
from pytest_osprey.report.exact_table import exact_tables
from pytest_osprey.report.markdown import exact_section as markdown_section
from pytest_osprey.results.folder import SavedCampaign
from pytest_osprey.results.redact import json_ready
from pytest_osprey.results.scores import ScoreLine, classes_of, position_classes
from testkit import tiny_models
from testkit.factories import TINY_DRAFTER, TINY_TARGET, make_pilot, write_trace

tiny_models.need()
pytestmark = pytest.mark.slow  # boots the tiny models

SPEC = GateSpec(GateKind.DISTRIBUTION, "cand", "base")
T = 0.8


def _pilot(trace: Path, order: str = "sequential", prompts: int = 3, samples: int = 8,
           tokens: int = 12, temperature: float = T) -> Pilot:
    return make_pilot(
        target={"model": str(TINY_TARGET), "context_length": 512, "threads": 1},
        conditions={"base": {"role": "baseline"},
                    "cand": {"role": "candidate", "drafter": str(TINY_DRAFTER),
                             "speculation": {"algorithm": "assisted", "num_draft_tokens": 4}}},
        trace={"files": [str(trace)]},
        load={"levels": {"low": 8}, "passes": 1, "warmup_requests": 0, "order": order},
        sampling={"sampled": {"enabled": True, "temperature": temperature, "prompts": prompts,
                              "samples_per_prompt": samples, "max_new_tokens": tokens}},
        decision={"early_stop": False},
    )  # fmt: skip


def test_a_campaign_scores_its_samples_and_an_honest_drafter_passes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One engine at a time: the baseline boots once more at the end to score (and says so);
    scores.jsonl holds every sampled output, position for position, classed as the engine's
    verify steps say; the exact test decides the gate and the drafter passes."""
    monkeypatch.delenv(ENV, raising=False)
    trace = write_trace(tmp_path / "t.jsonl", 3, max_new_tokens=12)
    pilot = _pilot(trace)
    said: list[str] = []
    with tiny_models.one_thread():
        data = Campaign(pilot, load_trace([trace]), tmp_path / "res", ["base", "cand"],
                        progress=lambda e: said.append(e.line())).run()
    assert any("booting the baseline once more to score" in line for line in said)
    sampled = {(r.condition, r.prompt_id, r.sample_index): r for r in data.records
               if r.mode == "sampled" and r.ok}
    assert len(sampled) == 2 * 3 * 8
    assert {(s.condition, s.prompt_id, s.sample_index) for s in data.scores} == set(sampled)
    for line in data.scores:
        record = sampled[(line.condition, line.prompt_id, line.sample_index)]
        assert [p.token for p in line.positions] == record.output_ids
        assert line.scorer == "base"
        assert line.vocab is not None and line.vocab >= pilot.sampling.sampled.score_top_k
        assert all(len(p.top_ids) == pilot.sampling.sampled.score_top_k for p in line.positions)
        assert all(p.logprob <= p.top_logprobs[0] + 1e-3 for p in line.positions)
        assert list(line.classes) == classes_of(record)
        if line.condition == "cand":  # the embedded engine says which positions were drafted
            assert position_classes(record) is not None
            assert "drafted" in line.classes
        else:
            assert line.classes[0] == "first" and set(line.classes[1:]) <= {"later"}
    gate = judge_distribution(SPEC, pilot, data)
    assert gate.details["method"] == "exact"
    assert gate.outcome == "pass", gate.summary
    assert gate.details["control"]["outcome"] == "pass"
    drafted = gate.details["candidate"]["classes"]["drafted"]
    assert drafted["temperature_ci"][0] < T < drafted["temperature_ci"][1]


# ------------------------------------------------------------------- planted faults

PROMPTS = [f"Tell me about item {i}." for i in range(4)]
SAMPLES, TOKENS = 12, 12


async def _sample_and_score(engine: TransformersEngine, scorer: TransformersEngine,
                            name: str) -> list[ScoreLine]:
    requests = [GenerationRequest(f"p{i}", prompt, TOKENS, temperature=T, seed=1000 * i + j,
                                  ignore_eos=True, want_margins=False)
                for i, prompt in enumerate(PROMPTS) for j in range(SAMPLES)]
    results = await asyncio.gather(*(engine.generate(r) for r in requests))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    lines = []
    for i, prompt in enumerate(PROMPTS):
        mine = results[i * SAMPLES:(i + 1) * SAMPLES]
        scored = await scorer.score(prompt, [r.output_ids for r in mine], 20)
        lines += [ScoreLine(name, f"p{i}", j, "base", tuple(s), tuple(classes_of(r)))
                  for j, (r, s) in enumerate(zip(mine, scored, strict=True))]
    return lines


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The baseline up once, its own samples scored (the A/A control)."""
    tmp = tmp_path_factory.mktemp("exact")
    pilot = _pilot(write_trace(tmp / "t.jsonl", 1))
    with tiny_models.one_thread():
        base = tiny_models.started_engine(pilot, "base", tmp)
        try:
            control = asyncio.run(_sample_and_score(base, base, "base"))
            yield {"pilot": pilot, "base": base, "control": control, "tmp": tmp}
        finally:
            base.stop()


def _judged(scene: dict[str, Any], fault: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(ENV, fault)
    pilot = scene["pilot"]
    with tiny_models.one_thread():
        cand = tiny_models.started_engine(pilot, "cand", scene["tmp"])
        try:
            lines = asyncio.run(_sample_and_score(cand, scene["base"], "cand"))
        finally:
            cand.stop()
    data = SavedCampaign(Path("."), {"conditions": {"base": {}, "cand": {}}}, [],
                         scores=[*scene["control"], *lines])
    return judge_distribution(SPEC, pilot, data)


def test_greedy_verification_fails_naming_drafted_positions_near_temperature_zero(
        scene: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _judged(scene, "greedy_verification", monkeypatch)
    assert gate.outcome == "fail", gate.summary
    assert gate.summary.startswith("drafted positions sampled near greedily")
    drafted = gate.details["candidate"]["classes"]["drafted"]
    assert drafted["outcome"] == "fail" and drafted["temperature_ci"][1] < 0.05
    assert drafted["top1_observed"] == drafted["n"]  # every drafted token the argmax
    assert gate.details["control"]["outcome"] == "pass"
    # The reports' table, from summary.json as written (non-finite floats read null).
    summary = json.loads(json.dumps(json_ready({"gates": [gate.as_dict()]})))
    (control, _), (cand, cand_rows) = exact_tables(summary)
    assert control.startswith("base (the A/A control") and control.endswith("pass")
    assert cand == "cand, served T 0.8: fail"
    row = next(r for r in cand_rows if r[0].startswith("drafted"))
    assert row[0] == "drafted (FAIL)" and row[1] == str(drafted["n"])
    assert row[4] == f"{drafted['n']} / {drafted['top1_expected']:.1f}"
    assert row[6].startswith("0.00 [0.00, ")
    assert short_text(gate).startswith("drafted positions: effective temperature 0.00 [0.00, ")
    md = markdown_section(summary)
    assert md is not None and "| drafted (FAIL) |" in "\n".join(md[1])


def test_garbage_parameters_at_drafted_positions_fail(
        scene: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _judged(scene, "garbage_params", monkeypatch)
    assert gate.outcome == "fail", gate.summary
    assert gate.summary.startswith("drafted positions")
    assert gate.details["candidate"]["classes"]["drafted"]["outcome"] == "fail"


def test_a_failing_control_makes_the_gate_inconclusive(scene: dict[str, Any]) -> None:
    """Scores that do not describe the server's own samples (here: the baseline's samples
    judged at a temperature it did not sample at) cannot judge the candidate."""
    pilot = _pilot(scene["tmp"] / "t.jsonl", temperature=0.3)
    data = SavedCampaign(Path("."), {"conditions": {"base": {}, "cand": {}}}, [],
                         scores=[*scene["control"],
                                 *(ScoreLine("cand", s.prompt_id, s.sample_index, "base",
                                             s.positions, s.classes) for s in scene["control"])])
    gate = judge_distribution(SPEC, pilot, data)
    assert gate.outcome == "inconclusive"
    assert "A/A control fails" in gate.summary and "not trusted" in gate.summary
    assert "A/A control fails" in short_text(gate)
