"""What the in-process engine adds to transformers' logits processors (OpenAI-style penalties,
logit bias), the sampling warpers of a request, and per-token times from the times of the
steps that emitted them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from ..base import GenerationRequest

if TYPE_CHECKING:
    import torch

Warper = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


def sampling_warpers(request: GenerationRequest) -> list[Warper]:
    """Temperature, top-k, top-p and min-p of a sampled request, in generate()'s order; the
    full vocabulary where none is set; none for a greedy request."""
    from transformers import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    if request.greedy:
        return []
    warpers: list[Warper] = [TemperatureLogitsWarper(float(request.temperature))]
    if request.top_k is not None:
        warpers.append(TopKLogitsWarper(int(request.top_k)))
    if request.top_p < 1.0:
        warpers.append(TopPLogitsWarper(float(request.top_p)))
    if request.min_p > 0.0:
        # Typed for LongTensor ids; called like every other warper.
        warpers.append(cast(Warper, MinPLogitsWarper(float(request.min_p))))
    return warpers


class OpenAIPenalties:
    """Frequency/presence penalties with the OpenAI semantics (as SGLang and vLLM apply them):
    over the *generated* tokens only, logit -= frequency x count + presence x (count > 0)."""

    def __init__(self, prompt_len: int, frequency: float, presence: float) -> None:
        self.prompt_len = prompt_len
        self.frequency = frequency
        self.presence = presence

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import torch

        generated = input_ids[:, self.prompt_len:]
        counts = torch.zeros_like(scores).scatter_add_(
            1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


class LogitBias:
    """Adds a bias to given token ids' logits (OpenAI logit_bias)."""

    def __init__(self, bias: dict[int, float]) -> None:
        self.bias = bias

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        for token, value in self.bias.items():
            if 0 <= token < out.shape[-1]:
                out[:, token] += value
        return out


def token_times(events: Sequence[tuple[float, int]]) -> list[float]:
    """One time per token from (time, tokens emitted) per step. The first step's tokens all
    arrive at once (they are the first thing a user sees); a later multi-token step's gap is
    split evenly."""
    if not events:
        return []
    first_t, first_n = events[0]
    times = [first_t] * first_n
    prev = first_t
    for t, n in events[1:]:
        step = (t - prev) / n
        times.extend(prev + step * (k + 1) for k in range(n))
        prev = t
    return times


def sampling_processors(request: GenerationRequest, n_prompt: int, eos: set[int],
                        device: str) -> list[Warper]:
    """The request's extra sampling parameters as logits processors, in generate()'s order
    (repetition penalty, min_new_tokens, then the engine's own: penalties, logit bias)."""
    from transformers import MinNewTokensLengthLogitsProcessor, RepetitionPenaltyLogitsProcessor

    processors: list[Warper] = []
    if request.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(float(request.repetition_penalty)))
    if request.min_new_tokens:
        processors.append(MinNewTokensLengthLogitsProcessor(
            n_prompt, request.min_new_tokens, sorted(eos), device=device))
    if request.frequency_penalty or request.presence_penalty:
        processors.append(OpenAIPenalties(n_prompt, request.frequency_penalty,
                                          request.presence_penalty))
    if request.logit_bias:
        processors.append(LogitBias({int(k): float(v) for k, v in request.logit_bias.items()}))
    return processors
