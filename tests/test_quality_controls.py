"""Negative controls for greedy identity with the real embedded engine and the tiny models.

What the shipped tiny models actually show (24-32 new tokens, the 50 pilot prompts):

* **Precision change** (target in bfloat16 vs the float32 baseline): greedy outputs diverge on
  a few prompts (3-4 of 50), every time at a near-tie (baseline top-1/top-2 margin < 0.01);
  float16 and int8 dynamic quantization change nothing. The tiny target is confident almost
  everywhere, so no precision change we can run here produces a *genuine* divergence. What
  this control proves is the classification: the flips are found, their margins recorded and
  classed as near-ties, and a strict pilot (``max_near_tie_fraction: 0``) fails the condition.
* **Assisted greedy decoding with the real tiny drafter** (transformers ``assistant_model``,
  k=4, constant schedule): token-for-token identical on every prompt (16 of 16 tried; the weak
  drafter too), with a real speculation effect (accept length > 1): the gate passes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_osprey.campaign import CampaignData
from pytest_osprey.config import Pilot
from pytest_osprey.decision import GateSpec, evaluate
from pytest_osprey.engines.base import BootSpec, GenerationRequest
from pytest_osprey.engines.transformers import TransformersEngine
from pytest_osprey.quality import greedy_identity
from pytest_osprey.records import RequestRecord
from pytest_osprey.trace import load_trace, render_prompt

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
MODELS: Path | None = ROOT / "fixtures" / "models"
if not (MODELS / "tiny-target" / "config.json").is_file():
    MODELS = None
PROMPTS = 50  # the whole shipped trace: bf16 flips few tokens on the tiny models
DRAFTED = 4  # the drafter condition runs the first 4 of them (time: 2 shared cores)
NEW_TOKENS = 24


def _pilot() -> Pilot:
    assert MODELS is not None
    return Pilot.model_validate({
        "target": {"model": str(MODELS / "tiny-target"), "dtype": "float32",
                   "context_length": 1024, "threads": 1},
        "conditions": {
            "baseline": {"role": "baseline"},
            "bf16": {"role": "current", "dtype": "bfloat16"},
            "drafter": {"role": "candidate", "drafter": str(MODELS / "tiny-drafter"),
                        "speculation": {"algorithm": "assisted", "num_draft_tokens": 4}},
        },
        "trace": {"files": [str(ROOT / "prompts/pilot.jsonl")]},
        # Strict: any changed output fails, near-tie or not (the tiny models' bf16 flips are
        # all near-ties, see below).
        "limits": {"quality": {"max_near_tie_fraction": 0.0}},
    })


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pilot, CampaignData]]:
    """Every condition's greedy records on the first prompts (one engine at a time)."""
    if MODELS is None:
        pytest.skip("tiny models not found (fixtures/models)")
    import torch

    threads = torch.get_num_threads()  # the engine sets target.threads process-wide
    pilot = _pilot()
    prompts = load_trace([ROOT / "prompts/pilot.jsonl"]).prompts[:PROMPTS]
    logs = tmp_path_factory.mktemp("logs")
    records: list[RequestRecord] = []
    try:
        for cond in pilot.conditions:
            engine = TransformersEngine(pilot, cond, BootSpec(cond, logs))
            engine.start()
            try:
                for p in prompts[: DRAFTED if cond == "drafter" else PROMPTS]:
                    text = render_prompt(p, engine._tokenizer)
                    res = asyncio.run(engine.generate(GenerationRequest(p.id, text, NEW_TOKENS)))
                    records.append(RequestRecord(
                        run_id="controls", condition=cond, block=0, repetition=0, load="low",
                        concurrency=1, prompt_id=p.id, slice=p.slice, domain=p.domain,
                        mode="greedy", sample_index=0, ok=res.ok, error=res.error,
                        output_ids=res.output_ids, output_text=res.output_text,
                        top2_margin=res.top2_margin, accept_length=res.accept_length,
                    ))
            finally:
                engine.stop()
    finally:
        torch.set_num_threads(threads)
    meta = {"conditions": {c: {"error": None} for c in pilot.conditions}}
    yield pilot, CampaignData(logs, meta, records)


def _gate(pilot: Pilot, data: CampaignData, cond: str) -> tuple[str, str]:
    res = evaluate(GateSpec("greedy_identity", cond, reference="baseline"), pilot, data, {})
    return res.outcome, res.summary


def test_precision_change_fails_greedy_identity(campaign: tuple[Pilot, CampaignData]) -> None:
    pilot, data = campaign
    assert all(r.ok for r in data.records), [r.error for r in data.records if not r.ok]
    q = pilot.limits.quality
    res = greedy_identity(data.of("baseline"), data.of("bf16"), q.near_tie_epsilon)
    assert res.compared == PROMPTS
    assert res.divergences, "bf16 changed no greedy output: the control shows nothing"
    assert all(d.margin is not None for d in res.divergences)  # margins recorded, judged
    # Measured on the shipped tiny models: every bf16 flip sits at a near-tie (margin < 0.01).
    assert all(d.near_tie for d in res.divergences), res.genuine
    # The tiny models give near-ties only (module docstring); the near-tie limit catches them.
    assert len(res.genuine) > q.max_genuine_divergences or (
        res.near_tie_fraction > q.max_near_tie_fraction), res
    outcome, summary = _gate(pilot, data, "bf16")
    assert outcome == "fail", summary


def test_assisted_greedy_with_the_real_drafter_is_identical(
    campaign: tuple[Pilot, CampaignData],
) -> None:
    pilot, data = campaign
    res = greedy_identity(data.of("baseline"), data.of("drafter"), 0.0)
    assert res.compared == DRAFTED and res.identical == DRAFTED, res.divergences
    accepted = [r.accept_length or 0.0 for r in data.of("drafter")]
    assert max(accepted) > 1.5, accepted  # drafts were really accepted: speculation ran
    outcome, summary = _gate(pilot, data, "drafter")
    assert outcome == "pass", summary
