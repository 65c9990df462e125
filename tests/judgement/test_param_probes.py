"""Sampling parameters judged at drafted positions, one verdict per parameter: on the embedded
engine each planted fault is caught and named for its own parameter only, a lossless drafter
honours every parameter, and a refusal is named as such."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.campaign.runner import Campaign
from pytest_osprey.engines.embedded.planted_faults import ENV
from pytest_osprey.judgement.gates.kinds import GateKind
from pytest_osprey.judgement.gates.spec import GateSpec
from pytest_osprey.judgement.quality.gates import judge_sampling_params
from pytest_osprey.judgement.quality.param_verdicts import is_refusal
from pytest_osprey.pilot.probes import PARAMETERS, SAMPLED_BY_NAME
from pytest_osprey.pilot.sampling import Serving
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.pilot.trace import load_trace
from pytest_osprey.results.folder import SavedCampaign
from testkit import tiny_models
from testkit.factories import TINY_DRAFTER, TINY_TARGET, make_pilot, write_trace
from testkit.param_probes import probe_condition

tiny_models.need()
pytestmark = pytest.mark.slow  # boots the tiny models

SPEC = GateSpec(GateKind.SAMPLING_PARAMS, "cand", "base")
PROMPTS, SAMPLES, TOKENS = 1, 3, 10


def _pilot(trace: Path) -> Pilot:
    return make_pilot(
        target={"model": str(TINY_TARGET), "context_length": 512, "threads": 1},
        conditions={"base": {"role": "baseline"},
                    "cand": {"role": "candidate", "drafter": str(TINY_DRAFTER),
                             "speculation": {"algorithm": "assisted", "num_draft_tokens": 4}}},
        trace={"files": [str(trace)]},
        load={"levels": {"low": 8}, "passes": 1, "warmup_requests": 0},
        sampling={"params": {"enabled": True, "prompts": PROMPTS, "samples": SAMPLES,
                             "max_new_tokens": TOKENS}},
        decision={"early_stop": False},
    )  # fmt: skip


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The baseline up once, its own params pass run and scored."""
    tmp = tmp_path_factory.mktemp("params")
    trace = write_trace(tmp / "t.jsonl", PROMPTS, max_new_tokens=TOKENS)
    pilot = _pilot(trace)
    prompts = list(load_trace([trace]).prompts)
    with tiny_models.one_thread():
        base = tiny_models.started_engine(pilot, "base", tmp)
        try:
            records, lines = asyncio.run(probe_condition(base, base, "base", pilot, prompts,
                                                           SAMPLES, TOKENS))
            yield {"pilot": pilot, "base": base, "records": records, "lines": lines,
                   "tmp": tmp, "prompts": prompts}
        finally:
            base.stop()


def _judged(scene: dict[str, Any], fault: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    if fault:
        monkeypatch.setenv(ENV, fault)
    else:
        monkeypatch.delenv(ENV, raising=False)
    pilot = scene["pilot"]
    started = time.monotonic()
    with tiny_models.one_thread():
        cand = tiny_models.started_engine(pilot, "cand", scene["tmp"])
        try:
            records, lines = asyncio.run(probe_condition(cand, scene["base"], "cand", pilot,
                                                         scene["prompts"], SAMPLES, TOKENS))
        finally:
            cand.stop()
    print(f"{fault or 'lossless'}: {time.monotonic() - started:.1f} s")
    data = SavedCampaign(Path("."), {"conditions": {"base": {}, "cand": {}}},
                         [*scene["records"], *records], scores=[*scene["lines"], *lines])
    gate = judge_sampling_params(SPEC, pilot, data)
    print(gate.summary)
    return gate


def _status(gate: Any) -> dict[str, str]:
    return {n: v["status"] for n, v in gate.details["parameters"].items() if n in
            dict(PARAMETERS)}


def test_a_lossless_drafter_honours_every_parameter(
        scene: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _judged(scene, "", monkeypatch)
    assert gate.outcome == "pass", gate.summary
    assert set(_status(gate).values()) == {"honoured"}, gate.summary


@pytest.mark.parametrize(("fault", "broken", "words"), [
    ("top_p_ignored", {"top_p"}, "top-p ignored at drafted positions"),
    ("top_k_ignored", {"top_k"}, "top-k ignored at drafted positions"),
    ("min_p_ignored", {"min_p"}, "min-p ignored at drafted positions"),
    ("penalties_dropped", {"frequency_penalty", "presence_penalty", "repetition_penalty"},
     "frequency penalty ignored at drafted positions"),
])
def test_a_planted_fault_is_named_for_its_own_parameter_only(
        scene: dict[str, Any], monkeypatch: pytest.MonkeyPatch, fault: str, broken: set[str],
        words: str) -> None:
    gate = _judged(scene, fault, monkeypatch)
    assert gate.outcome == "fail", gate.summary
    status = _status(gate)
    named = {n for n, s in status.items() if s == "not_honoured"}
    # The fault's parameters only, and every other one honoured. A repetition penalty is seen
    # by its greedy probe alone, only where it flips an argmax: not required. Dropped
    # penalties: 3 samples of 10 tokens see each of the frequency and presence probes' drop
    # only in part of the campaigns on the tiny target (both at 6 samples, LLR +10), so one
    # of the two is required.
    seen = broken - {"repetition_penalty"}
    if fault == "penalties_dropped":
        assert named & seen, gate.summary
    else:
        assert seen <= named, gate.summary
    assert named <= broken, gate.summary
    assert all(s == "honoured" for n, s in status.items() if n not in named), gate.summary
    assert words in gate.summary


def test_a_refused_parameter_is_named_refused_not_a_wrong_output(
        scene: dict[str, Any]) -> None:
    """The candidate answers HTTP 400 to min-p (as vLLM does under speculation) and is
    otherwise the baseline itself: min-p reads "refused under speculation", every other
    parameter honoured; the gate fails on it only where the service samples with min-p."""
    error = ("HTTP 400 from http://127.0.0.1:8000/v1/completions: min_p is not supported "
             "with speculative decoding")
    cand = [replace(r, condition="cand") if r.probe != "sampled:min_p" else
            replace(r, condition="cand", ok=False, error=error, output_ids=[], output_text="")
            for r in scene["records"]]
    lines = [replace(s, condition="cand") for s in scene["lines"] if s.probe != "sampled:min_p"]
    data = SavedCampaign(Path("."), {"conditions": {"base": {}, "cand": {}}},
                         [*scene["records"], *cand], scores=[*scene["lines"], *lines])
    gate = judge_sampling_params(SPEC, scene["pilot"], data)
    status = _status(gate)
    assert status.pop("min_p") == "refused", gate.summary
    assert set(status.values()) == {"honoured"}, gate.summary
    assert gate.summary.startswith("min-p refused under speculation (HTTP 400 from "), gate.summary
    assert gate.outcome == "pass"  # the service does not use min-p
    serving = scene["pilot"].model_copy(update={"sampling": scene["pilot"].sampling.model_copy(
        update={"serving": Serving(temperature=0.8, min_p=0.1)})})
    served = judge_sampling_params(SPEC, serving, data)
    assert served.outcome == "fail" and served.details["refused"]["min_p"].startswith("HTTP 400")


def test_a_campaign_runs_and_scores_the_sampled_probes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's params pass sends the sampled probes and the seed probe, the baseline
    scores the probes' samples into scores.jsonl (named by probe, apart from the sampled
    pass's), and the gate gives every parameter a verdict from them."""
    monkeypatch.delenv(ENV, raising=False)
    trace = write_trace(tmp_path / "t.jsonl", 1, max_new_tokens=4)
    pilot = make_pilot(
        target={"model": str(TINY_TARGET), "context_length": 512, "threads": 1},
        conditions={"base": {"role": "baseline"},
                    "cand": {"role": "candidate", "drafter": str(TINY_DRAFTER),
                             "speculation": {"algorithm": "assisted", "num_draft_tokens": 4}}},
        trace={"files": [str(trace)]},
        load={"levels": {"low": 1}, "passes": 1, "warmup_requests": 0},
        sampling={"params": {"enabled": True, "prompts": 1, "samples": 2, "max_new_tokens": 6}},
        decision={"early_stop": False},
    )  # fmt: skip
    with tiny_models.one_thread():
        data = Campaign(pilot, load_trace([trace]), tmp_path / "res", ["base", "cand"]).run()
    params = [r for r in data.records if r.mode == "params"]
    assert sum(r.probe == "sampled:seed" for r in params) == 4  # twice per condition
    sampled = [r for r in params if r.probe in SAMPLED_BY_NAME and r.ok]
    assert len(sampled) == 2 * 2 * len(SAMPLED_BY_NAME)
    assert {(s.condition, s.probe, s.sample_index) for s in data.scores} == {
        (r.condition, r.probe, r.sample_index) for r in sampled}
    assert data.scores_of("cand") == []  # the sampled pass's own: none ran
    assert all(r.top_p == 0.5 for r in sampled if r.probe == "sampled:top_p")
    gate = judge_sampling_params(SPEC, pilot, data)
    assert gate.outcome == "pass", gate.summary
    assert set(_status(gate)) == set(dict(PARAMETERS))


@pytest.mark.parametrize(("error", "refusal"), [
    ("unsupported by this server: min_p", True),
    ("HTTP 400 from http://h/v1/completions: min_p is not supported with speculative decoding",
     True),
    ("HTTP 500 from http://h/generate: CUDA error", False),
    ("request timed out after 30 s", False),
    (None, False),
])
def test_a_refusal_is_told_from_a_broken_request(error: str | None, refusal: bool) -> None:
    assert is_refusal(error) is refusal
