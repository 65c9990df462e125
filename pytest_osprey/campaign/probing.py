"""The sampling-parameters pass: each probe of :mod:`pytest_osprey.pilot.probes` on a few
prompts, one request at a time: the greedy probes, then the sampled ones (what each probe
means is defined there)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..engines import Engine, GenerationRequest
from ..pilot.probes import PLAIN, PROBES, SAMPLED_PROBES, SEED_PROBE
from ..pilot.trace import Prompt
from ..results.records import Measurement
from .requests import sample_seed

Emit = Callable[[Prompt, str, int, GenerationRequest, dict[str, Any], Measurement], None]
"""(prompt, probe name, sample index, the request sent, the probe's settings, its
measurement)."""


def probe_request(prompt: Prompt, text: str, settings: dict[str, Any], max_new_tokens: int,
                  timeout_s: float) -> GenerationRequest:
    """The greedy request of one probe's ``settings`` (as derived by the probe)."""
    extra: dict[str, Any] = {k: tuple(v) if k == "stop" else v for k, v in settings.items()
                             if k != "max_new_tokens"}
    return GenerationRequest(prompt.id, text, int(settings.get("max_new_tokens", max_new_tokens)),
                             want_margins=True, timeout_s=timeout_s, **extra)


async def run_probes(engine: Engine, prompts: Sequence[Prompt], text_of: Callable[[Prompt], str],
                     max_new_tokens: int, timeout_s: float, emit: Emit) -> None:
    """Per prompt: the plain greedy request, then every probe derived from its output. An
    engine refuses what it cannot do (an error "unsupported ..."); that is recorded too."""
    for prompt in prompts:
        text = text_of(prompt)
        request = GenerationRequest(prompt.id, text, max_new_tokens, want_margins=True,
                                    timeout_s=timeout_s)
        plain = await engine.generate(request)
        emit(prompt, PLAIN, 0, request, {}, plain)
        if not plain.ok:
            continue
        for probe in PROBES:
            settings = probe.settings(plain.output_text, plain.output_ids, max_new_tokens)
            if settings is None:
                continue
            request = probe_request(prompt, text, settings, max_new_tokens, timeout_s)
            emit(prompt, probe.name, 0, request, settings, await engine.generate(request))


async def run_sampled_probes(engine: Engine, prompts: Sequence[Prompt],
                             text_of: Callable[[Prompt], str], temperature: float, samples: int,
                             max_new_tokens: int, timeout_s: float, seed: int,
                             emit: Emit) -> None:
    """Per prompt: ``samples`` draws of each sampled probe at ``temperature`` (or the
    probe's own), seeded per probe, prompt and sample and the same for every condition (a
    lossless candidate then draws what the baseline draws), run to ``max_new_tokens`` so
    every sample holds drafted positions; then the seed probe, one seeded request twice."""
    if samples <= 0:
        return
    for prompt in prompts:
        text = text_of(prompt)
        for probe in SAMPLED_PROBES:
            for i in range(samples):
                request = GenerationRequest(
                    prompt.id, text, max_new_tokens,
                    temperature=probe.temperature or temperature,
                    seed=sample_seed(seed, probe.name, prompt.id, i), ignore_eos=True,
                    want_margins=False, timeout_s=timeout_s, **probe.settings)
                emit(prompt, probe.name, i, request, dict(probe.settings),
                     await engine.generate(request))
        request = GenerationRequest(prompt.id, text, max_new_tokens, temperature=temperature,
                                    seed=sample_seed(seed, SEED_PROBE, prompt.id, 0),
                                    ignore_eos=True, want_margins=False, timeout_s=timeout_s)
        for i in range(2):
            emit(prompt, SEED_PROBE, i, request, {}, await engine.generate(request))
