"""The correctness gate on the shipped pilot, with the real embedded engine and tiny models.

The tiny target is tuned on task families it can answer by copying and formatting (tool calls
as JSON, a Python function of a given signature, YAML as JSON; fixtures/tasks.py), and the
shipped pilot holds prompts of those families: its greedy answers pass part of the pilot's
checks, so the gate has answers to lose. Three conditions answer the pilot's checked prompts
greedily at the pilot's output cap:

* the baseline (speculation off): the share of checks it passes is the gate's reach;
* the tiny drafter, honest: lossless, so no answer is lost and the gate passes;
* the tiny drafter behind an engine that accepts every draft unverified
  (``OSPREY_PLANTED_FAULT=drafts_unverified``): the output is partly the drafter's, the
  answers the target got right come out wrong, and the gate fails.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pytest_osprey.engines.base import GenerationRequest
from pytest_osprey.engines.embedded.planted_faults import ENV
from pytest_osprey.judgement.quality.correctness import correctness_by_prompt, correctness_gate
from pytest_osprey.pilot.trace import Prompt, load_trace, render_prompt
from pytest_osprey.results.records import RequestRecord
from testkit import tiny_models
from testkit.factories import ROOT, make_record

tiny_models.need()
_MANIFEST = json.loads((ROOT / "fixtures" / "models" / "MANIFEST.json").read_text())
if "task_tuning" not in _MANIFEST["figures"]["target"]:
    pytest.skip("the shipped tiny target has no task stage yet (fixtures/build_models.py "
                "--tune-target fixtures/models)", allow_module_level=True)

MIN_SHARE = 0.30  # the share of the shipped pilot's checks the shipped target must answer


def _shipped() -> tuple[list[Prompt], int]:
    """The shipped pilot's checked prompts and its output cap."""
    pilot = yaml.safe_load((ROOT / "pilot.yaml").read_text(encoding="utf-8"))
    ids = set(pilot["trace"]["ids"])
    files = [ROOT / "prompts" / "pilot.jsonl", ROOT / "prompts" / "tasks.jsonl"]
    prompts = [p for p in load_trace(files).prompts if p.id in ids and p.expect is not None]
    return prompts, int(pilot["max_new_tokens_cap"])


def _answers(name: str, prompts: list[Prompt], cap: int, folder: Path) -> list[RequestRecord]:
    """``name``'s greedy answers (the embedded engine of the tiny pilot) as records."""
    engine = tiny_models.started_engine(tiny_models.drafted_pilot(threads=1), name, folder)
    records: list[RequestRecord] = []
    try:
        for p in prompts:
            text = render_prompt(p, engine._tokenizer)
            res = asyncio.run(engine.generate(GenerationRequest(
                p.id, text, min(p.max_new_tokens or cap, cap))))
            records.append(make_record(name, p.id, measured=False, slice=p.slice,
                                       domain=p.domain, ok=res.ok, error=res.error,
                                       output_ids=res.output_ids, output_text=res.output_text))
    finally:
        engine.stop()
    return records


@pytest.fixture(scope="module")
def answered(tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[list[Prompt], dict[str, list[RequestRecord]]]]:
    import torch

    prompts, cap = _shipped()
    folder = tmp_path_factory.mktemp("correct")
    threads = torch.get_num_threads()  # the engine sets target.threads process-wide
    with pytest.MonkeyPatch.context() as mp:
        try:
            out = {"baseline": _answers("baseline", prompts, cap, folder),
                   "drafted": _answers("drafted", prompts, cap, folder)}
            mp.setenv(ENV, "drafts_unverified")  # read when the engine boots
            out["unverified"] = _answers("drafted", prompts, cap, folder)
        finally:
            torch.set_num_threads(threads)
    yield prompts, out


@pytest.mark.slow
def test_the_shipped_target_answers_enough_of_the_pilots_checks(
    answered: tuple[list[Prompt], dict[str, list[RequestRecord]]],
) -> None:
    prompts, records = answered
    passed = correctness_by_prompt(records["baseline"], {p.id: p for p in prompts})
    assert len(passed) == len(prompts) >= 10
    assert sum(passed.values()) >= MIN_SHARE * len(prompts), passed


@pytest.mark.slow
def test_the_honest_drafter_passes_the_correctness_gate(
    answered: tuple[list[Prompt], dict[str, list[RequestRecord]]],
) -> None:
    prompts, records = answered
    gate = correctness_gate(records["baseline"], records["drafted"],
                            {p.id: p for p in prompts}, max_loss_rate=0.0, alpha=0.05)
    assert gate.outcome == "pass", gate.summary
    assert gate.reference_rate is not None and gate.reference_rate >= MIN_SHARE
    assert not gate.losses and "not evaluable" not in gate.summary


@pytest.mark.slow
def test_an_engine_accepting_drafts_unverified_fails_the_correctness_gate(
    answered: tuple[list[Prompt], dict[str, list[RequestRecord]]],
) -> None:
    prompts, records = answered
    outputs = {r.prompt_id: r.output_text for r in records["unverified"]}
    assert outputs != {r.prompt_id: r.output_text for r in records["baseline"]}
    gate = correctness_gate(records["baseline"], records["unverified"],
                            {p.id: p for p in prompts}, max_loss_rate=0.0, alpha=0.05)
    assert gate.outcome == "fail", gate.summary
    assert gate.losses and set(gate.losses) <= {p.id for p in prompts}
