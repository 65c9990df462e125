"""What the in-process engine hooks into transformers' generate(): sampling-parameter logits
processors (OpenAI-style penalties, logit bias), a streamer that times each token, and a
stopping criterion that cancels."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


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


class StreamerClock:
    """A transformers streamer that timestamps every batch of tokens the model emits (with
    assisted generation: one batch per verify step, the accepted drafts plus one)."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.prompt_seen = False
        self.events: list[tuple[float, int]] = []  # (seconds since submission, tokens)

    def put(self, value: torch.Tensor) -> None:
        now = time.perf_counter()
        if not self.prompt_seen:  # generate() first hands the streamer the prompt
            self.prompt_seen = True
            return
        self.events.append((now - self.start, int(value.numel())))

    def end(self) -> None:
        pass

    def token_times(self) -> list[float]:
        """One time per token. The first chunk's tokens all arrive at once (they are the
        first thing a user sees); a later multi-token chunk's gap is split evenly."""
        if not self.events:
            return []
        first_t, first_n = self.events[0]
        times = [first_t] * first_n
        prev = first_t
        for t, n in self.events[1:]:
            step = (t - prev) / n
            times.extend(prev + step * (k + 1) for k in range(n))
            prev = t
        return times

    def acceptance(self, draft: int, max_new_tokens: int) -> tuple[int, list[int]] | None:
        """(verify steps that proposed all ``draft`` tokens, accepted count per draft
        position) from the steps' token batches; the drafter proposes min(draft, left - 1)."""
        if draft < 1 or not self.events:
            return None
        steps = 0
        accepted = [0] * draft
        produced = 0
        for _, n in self.events:
            if min(draft, max_new_tokens - produced - 1) == draft:
                steps += 1
                for j in range(min(n - 1, draft)):
                    accepted[j] += 1
            produced += n
        return steps, accepted


class StopStrings:
    """A stopping criterion that ends ``generate`` once the generated text contains one of
    ``stops``. transformers' own ``stop_strings`` cannot be used with a drafter of the same
    tokenizer (assisted generation then asks for a tokenizer it does not pass on), and one
    rule for every condition keeps their outputs comparable. The engine cuts the text at the
    first stop string afterwards, as the OpenAI/SGLang convention has it."""

    def __init__(self, tokenizer: Any, prompt_len: int, stops: list[str]) -> None:
        self.tokenizer = tokenizer
        self.prompt_len = prompt_len
        self.stops = stops

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor,
                 **kwargs: Any) -> torch.Tensor:
        import torch

        text = self.tokenizer.decode(input_ids[0, self.prompt_len:], skip_special_tokens=True)
        stop = any(s in text for s in self.stops)
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool,
                          device=input_ids.device)


class CancelCriterion:
    """A stopping criterion that ends ``generate`` after the current step once the request
    is cancelled or the engine stopped (checked by transformers after every step)."""

    def __init__(self, *flags: threading.Event) -> None:
        self.flags = flags

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor,
                 **kwargs: Any) -> torch.Tensor:
        import torch

        stop = any(f.is_set() for f in self.flags)
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool,
                          device=input_ids.device)
