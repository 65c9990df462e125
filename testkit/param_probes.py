"""One condition's sampling-parameters pass on an embedded engine, its sampled probes scored
by the baseline's engine, as the campaign runs and scores them (for tests and benchmarks that
plant a fault per engine without a whole campaign)."""

from __future__ import annotations

from typing import Any

from pytest_osprey.campaign.probing import run_probes, run_sampled_probes
from pytest_osprey.engines.base import GenerationRequest
from pytest_osprey.engines.embedded.engine import TransformersEngine
from pytest_osprey.pilot.probes import SAMPLED_BY_NAME
from pytest_osprey.pilot.schema import Pilot
from pytest_osprey.pilot.trace import Prompt, render_prompt
from pytest_osprey.results.records import Measurement, RequestRecord
from pytest_osprey.results.scores import ScoreLine, classes_of


async def probe_condition(engine: TransformersEngine, scorer: TransformersEngine, name: str,
                          pilot: Pilot, prompts: list[Prompt], samples: int, tokens: int
                          ) -> tuple[list[RequestRecord], list[ScoreLine]]:
    """The records of ``name``'s params pass and the score lines of its sampled probes."""
    records: list[RequestRecord] = []
    base = pilot.baseline

    def emit(prompt: Prompt, probe: str, index: int, request: GenerationRequest,
             settings: dict[str, Any], result: Measurement) -> None:
        records.append(RequestRecord.from_measurement(
            result, run_id="r", condition=name, block=0, repetition=0, load="low",
            concurrency=1, prompt_id=prompt.id, slice=prompt.slice, domain=prompt.domain,
            mode="params", sample_index=index, probe=probe, request=settings or None,
            temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
            min_p=request.min_p, seed=request.seed, ignore_eos=request.ignore_eos))

    def text(p: Prompt) -> str:
        return render_prompt(p, engine.tokenizer)

    await run_probes(engine, prompts, text, tokens, 60.0, emit)
    await run_sampled_probes(engine, prompts, text, pilot.sampling.sampled.temperature,
                             samples, tokens, 60.0, pilot.sampling.seed, emit)
    lines: list[ScoreLine] = []
    top_k = pilot.sampling.sampled.score_top_k
    for prompt in prompts:
        mine = [r for r in records if r.prompt_id == prompt.id and r.probe in SAMPLED_BY_NAME
                and r.ok]
        scored = await scorer.score(text(prompt), [r.output_ids for r in mine], top_k)
        lines += [ScoreLine(name, r.prompt_id, r.sample_index, base, tuple(s),
                            tuple(classes_of(r)), "r", scorer.vocab_size, probe=r.probe)
                  for r, s in zip(mine, scored, strict=True)]
    return records, lines
