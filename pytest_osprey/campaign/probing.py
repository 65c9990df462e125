"""The sampling-parameters pass: each probe of :mod:`pytest_osprey.pilot.probes` on a few
prompts, one request at a time, greedy (what each probe means is defined there)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..engines import Engine, GenerationRequest
from ..pilot.probes import PLAIN, PROBES
from ..pilot.trace import Prompt
from ..results.records import Measurement

Emit = Callable[[Prompt, str, dict[str, Any], Measurement], None]


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
        plain = await engine.generate(GenerationRequest(
            prompt.id, text, max_new_tokens, want_margins=True, timeout_s=timeout_s))
        emit(prompt, PLAIN, {}, plain)
        if not plain.ok:
            continue
        for probe in PROBES:
            settings = probe.settings(plain.output_text, plain.output_ids, max_new_tokens)
            if settings is None:
                continue
            request = probe_request(prompt, text, settings, max_new_tokens, timeout_s)
            emit(prompt, probe.name, settings, await engine.generate(request))
