"""Negative controls for the quality gates with the real embedded engine and the tiny models.

What the shipped tiny models actually show (24 new tokens, the 50 pilot prompts; the tests
run int4 on the first 16 and the identical condition on the first 8):

* **Precision change, int4 weights** (the target's weights rounded to symmetric int4 per
  output channel, as a weight-only quantized deployment serves them): about half the greedy
  outputs change, most at positions where the float32 reference was confident (margins up to
  ~0.2 nats, above the near-tie epsilon): *genuine* divergences, so greedy identity fails, and
  the fairness gate names the quantization. fp8 weights change 3 of 50 (one genuine).
* **Precision change, bfloat16 compute**: some outputs flip (near-ties onto the baseline's
  runner-up and, on the current tiny target, genuine ones too). The control proves the
  classification: flips found, margins and the baseline's top-2 ids recorded, each flip
  classified by the near-tie rule, and a strict pilot (``max_near_tie_rate: 0``, no
  identical-condition control in this one-block run) fails the condition.
* **Assisted greedy decoding with the real tiny drafter** (transformers ``assistant_model``,
  k=4, constant schedule): token-for-token identical on every prompt (16 of 16 tried; the weak
  drafter too), with a real speculation effect (accept length > 1): the gate passes.
* **Lossy sampler**: an engine that leaves a top-k of 50 on (transformers' default) fails the
  sampled-distribution gate at half the default samples (16 prompts x 16 samples x 8
  positions, not 32: the test's time on 2 cores); the same engine passes it. Both halves of one
  32-sample draw gave p=0.001, the permutation floor (8 samples: p=0.003 and 0.010, too close
  to alpha 0.01 for a control). Each condition draws with its own seeds, as the campaign does.
  A sampler only slightly off (temperature 1.0 served for 0.8) is found on some draws, not
  all, on a flat target (the earlier tiny target, entropy ~6.5 nats): 2 of 3 independent
  realizations, p=0.003, 0.003, 0.19 (benchmarks/distribution_power.py measures it, slowly,
  on real trajectories);
  with seeds shared across conditions it went undetected (p=0.05: coupled samples).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_osprey.campaign.requests import sample_seed
from pytest_osprey.engines.base import BootSpec, GenerationRequest
from pytest_osprey.engines.embedded.engine import TransformersEngine
from pytest_osprey.judgement import GateSpec, evaluate
from pytest_osprey.judgement.quality.identity import greedy_identity
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.pilot.trace import load_trace, render_prompt
from pytest_osprey.results.folder import SavedCampaign
from pytest_osprey.results.preflight_file import Preflight
from pytest_osprey.results.records import RequestRecord
from testkit.factories import ROOT, make_pilot, make_record

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # boots the tiny models, five and three times
pytest.importorskip("transformers")

MODELS: Path | None = ROOT / "fixtures" / "models"
if not (MODELS / "tiny-target" / "config.json").is_file():
    MODELS = None
PROMPTS = 50  # the whole shipped trace: bf16 flips few tokens on the tiny models
DRAFTED = 4  # the drafter condition runs the first 4 of them (time: 2 shared cores)
# int4 changes about half the outputs (genuinely): 16 prompts hold ~8 where the gate fails on
# one; the identical condition needs no more than a few prompts to show it passes.
PER_CONDITION = {"drafter": DRAFTED, "int4": 16, "same": 8}
NEW_TOKENS = 24


def _pilot() -> Pilot:
    assert MODELS is not None
    return make_pilot(
        target={"model": str(MODELS / "tiny-target"), "dtype": "float32",
                "context_length": 1024, "threads": 1},
        conditions={
         "baseline": {"role": "baseline"},
         "bf16": {"role": "current", "dtype": "bfloat16"},
         "int4": {"role": "candidate", "quantization": "int4"},
         "same": {"role": "candidate"},
         "drafter": {"role": "candidate", "drafter": str(MODELS / "tiny-drafter"),
                     "speculation": {"algorithm": "assisted", "num_draft_tokens": 4}},
     },
        trace={"files": [str(ROOT / "prompts/pilot.jsonl")]},
        # Strict: any changed output fails, near-tie or not (the tiny models' bf16 flips are
        # all near-ties, see below).
        limits={"quality": {"max_near_tie_rate": 0.0}},
    )


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pilot, SavedCampaign]]:
    """Every condition's greedy records on the first prompts (one engine at a time)."""
    if MODELS is None:
        pytest.skip("tiny models not found (fixtures/models)")
    import torch

    threads = torch.get_num_threads()  # the engine sets target.threads process-wide
    pilot = _pilot()
    prompts = load_trace([ROOT / "prompts/pilot.jsonl"]).prompts[:PROMPTS]
    logs = tmp_path_factory.mktemp("logs")
    records: list[RequestRecord] = []
    fingerprints: dict[str, dict[str, object]] = {}
    try:
        for cond in pilot.conditions:
            engine = TransformersEngine(pilot, cond, BootSpec(cond, logs))
            engine.start()
            fingerprints[cond] = engine.fingerprint()
            try:
                for p in prompts[: PER_CONDITION.get(cond, PROMPTS)]:
                    text = render_prompt(p, engine._tokenizer)
                    res = asyncio.run(engine.generate(GenerationRequest(p.id, text, NEW_TOKENS)))
                    records.append(make_record(
                        cond, p.id, measured=False, run_id="controls", slice=p.slice,
                        domain=p.domain, ok=res.ok, error=res.error,
                        output_ids=res.output_ids, output_text=res.output_text,
                        top2_margin=res.top2_margin, top2_ids=res.top2_ids,
                        accept_length=res.accept_length, spec_drafts=res.spec_drafts,
                        spec_accepted_per_position=res.spec_accepted_per_position,
                    ))
            finally:
                engine.stop()
    finally:
        torch.set_num_threads(threads)
    meta = {"conditions": {c: {"error": None, "fingerprint": fingerprints[c]}
                           for c in pilot.conditions}}
    yield pilot, SavedCampaign(logs, meta, records)


def _gate(pilot: Pilot, data: SavedCampaign, cond: str) -> tuple[str, str]:
    res = evaluate(GateSpec("greedy_identity", cond, reference="baseline"), pilot, data,
                   Preflight())
    return res.outcome, res.summary


def test_precision_change_fails_greedy_identity(campaign: tuple[Pilot, SavedCampaign]) -> None:
    pilot, data = campaign
    assert all(r.ok for r in data.records), [r.error for r in data.records if not r.ok]
    q = pilot.limits.quality
    res = greedy_identity(data.of("baseline"), data.of("bf16"), q.near_tie_epsilon,
                          max_near_tie_rate=q.max_near_tie_rate)
    divergences = res.candidate.divergences
    assert res.compared == PROMPTS and res.control is None  # one block, one level
    assert divergences, "bf16 changed no greedy output: the control shows nothing"
    assert all(d.margin is not None and d.runner_up is not None for d in divergences)
    # Each flip is classified by the rule: a near-tie only onto the baseline's runner-up at a
    # margin within epsilon; anything else is genuine.
    eps = q.near_tie_epsilon
    assert all(d.near_tie == (d.margin <= eps and d.candidate_token == d.runner_up)
               for d in divergences if d.margin is not None), divergences
    outcome, summary = _gate(pilot, data, "bf16")
    assert outcome == "fail", summary  # genuine flips, or near-ties beyond a zero rate


def test_int4_weights_fail_greedy_identity_with_genuine_divergences(
    campaign: tuple[Pilot, SavedCampaign],
) -> None:
    pilot, data = campaign
    q = pilot.limits.quality
    res = greedy_identity(data.of("baseline"), data.of("int4"), q.near_tie_epsilon)
    assert res.compared == PER_CONDITION["int4"]
    assert len(res.genuine) > q.max_genuine_divergences, res.divergences
    assert all(d.margin is not None and (d.margin > q.near_tie_epsilon
                                         or d.candidate_token != d.runner_up)
               for d in res.genuine)
    outcome, summary = _gate(pilot, data, "int4")
    assert outcome == "fail" and f"{len(res.genuine)} genuine divergence" in summary, summary
    fair = evaluate(GateSpec("fairness", "int4", reference="baseline"), pilot, data, Preflight())
    assert fair.outcome == "fail"
    assert "quantization differs: baseline='none'" in fair.summary, fair.summary
    assert "int4='int4'" in fair.summary, fair.summary


def test_an_identical_condition_passes_greedy_identity(
    campaign: tuple[Pilot, SavedCampaign],
) -> None:
    pilot, data = campaign
    res = evaluate(GateSpec("greedy_identity", "same", reference="baseline"), pilot, data,
                   Preflight())
    assert res.outcome == "pass", res.summary
    fair = evaluate(GateSpec("fairness", "same", reference="baseline"), pilot, data, Preflight())
    # Judged against the current condition too (bf16): that dtype is the only difference.
    differences = [d for d in fair.summary.split("not shown")[0].splitlines() if "differs" in d]
    assert len(differences) == 1 and "dtype differs" in differences[0], fair.summary


def test_assisted_greedy_with_the_real_drafter_is_identical(
    campaign: tuple[Pilot, SavedCampaign],
) -> None:
    pilot, data = campaign
    res = greedy_identity(data.of("baseline"), data.of("drafter"), 0.0)
    assert res.compared == DRAFTED and res.identical == DRAFTED, res.candidate.divergences
    accepted = [r.accept_length or 0.0 for r in data.of("drafter")]
    assert max(accepted) > 1.5, accepted  # drafts were really accepted: speculation ran
    # Per-position acceptance from the verify steps: a later draft position is accepted only
    # after the earlier ones, and every accepted draft is an output token.
    for r in data.of("drafter"):
        per = r.spec_accepted_per_position
        assert r.spec_drafts and per is not None and len(per) == 4, r
        assert all(a >= b for a, b in itertools.pairwise(per)), per
        assert sum(per) + r.spec_drafts <= len(r.output_ids), (per, r.spec_drafts)
        assert per[0] <= r.spec_drafts
    assert not any(r.spec_drafts for r in data.of("baseline"))
    outcome, summary = _gate(pilot, data, "drafter")
    assert outcome == "pass", summary


SAMPLED_PROMPTS, SAMPLES, POSITIONS = 16, 32, 8  # twice the default prompts, four times its samples


class _TopK50(TransformersEngine):
    """The embedded engine with a real-world sampler bug: transformers' default top-k of 50
    left on, so the tail of the distribution is never sampled."""

    def _warpers(self, request: Any) -> list[Any]:
        from transformers import TopKLogitsWarper

        warpers = super()._warpers(request)
        return [*warpers, TopKLogitsWarper(50)] if warpers else warpers


async def together(engine: TransformersEngine, reqs: list[GenerationRequest]) -> list[Any]:
    """A prompt's samples in one batch: each sequence keeps its own seeded generator and
    warpers in the engine's batch (engines/embedded/batching.py), so each draw is the one it
    would be alone, several times faster than one at a time."""
    return list(await asyncio.gather(*(engine.generate(r) for r in reqs)))


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pilot, SavedCampaign]:
    """Sampled records at temperature 0.8 from three real engines, one at a time."""
    if MODELS is None:
        pytest.skip("tiny models not found (fixtures/models)")
    import torch

    threads = torch.get_num_threads()
    pilot = make_pilot(
        target={"model": str(MODELS / "tiny-target"), "dtype": "float32",
                "context_length": 1024, "threads": 1},
        conditions={"baseline": {"role": "baseline"}, "same": {"role": "candidate"},
                    "lossy": {"role": "candidate"}},
        trace={"files": [str(ROOT / "prompts/pilot.jsonl")]},
        sampling={"sampled": {"enabled": True, "temperature": 0.8,
                              "samples_per_prompt": SAMPLES, "prompts": SAMPLED_PROMPTS,
                              "max_new_tokens": POSITIONS}},
    )  # fmt: skip
    prompts = load_trace([ROOT / "prompts/pilot.jsonl"]).prompts[:SAMPLED_PROMPTS]
    logs = tmp_path_factory.mktemp("sampled")
    engines: dict[str, type[TransformersEngine]] = {
        "baseline": TransformersEngine, "same": TransformersEngine, "lossy": _TopK50}
    records: list[RequestRecord] = []
    try:
        for cond, cls in engines.items():
            engine = cls(pilot, cond, BootSpec(cond, logs))
            engine.start()
            try:
                for p in prompts:
                    text = render_prompt(p, engine._tokenizer)
                    reqs = [GenerationRequest(p.id, text, POSITIONS, temperature=0.8,
                                              seed=sample_seed(0, cond, p.id, i),
                                              want_margins=False) for i in range(SAMPLES)]
                    for i, res in enumerate(asyncio.run(together(engine, reqs))):
                        records.append(make_record(
                            cond, p.id, measured=False, run_id="controls", slice=p.slice,
                            domain=p.domain, mode="sampled", sample_index=i, ok=res.ok,
                            error=res.error, output_ids=res.output_ids,
                        ))  # fmt: skip
            finally:
                engine.stop()
    finally:
        torch.set_num_threads(threads)
    return pilot, SavedCampaign(logs, {"conditions": {c: {"error": None} for c in engines}},
                               records)


def test_lossy_sampler_fails_the_distribution_check(
    sampled: tuple[Pilot, SavedCampaign],
) -> None:
    """top-k 50 left on: caught, each condition drawing with its own
    seeds as the campaign does."""
    pilot, data = sampled
    assert all(r.ok for r in data.records)
    res = evaluate(GateSpec("distribution", "lossy", reference="baseline"), pilot, data,
                   Preflight())
    assert res.outcome == "fail", res.summary
    assert res.evidence == "tested"


def test_same_sampler_passes_the_distribution_check(
    sampled: tuple[Pilot, SavedCampaign],
) -> None:
    pilot, data = sampled
    same = [r.output_ids for r in data.of("same", mode="sampled")]
    base = [r.output_ids for r in data.of("baseline", mode="sampled")]
    assert same != base  # independent draws, not a replay of the baseline's
    res = evaluate(GateSpec("distribution", "same", reference="baseline"), pilot, data, Preflight())
    assert res.outcome == "pass", res.summary
