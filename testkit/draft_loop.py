"""A drafting loop for transformers' own ``generate(assistant_model=...)``: the drafter's forward
pass once per draft token, on its own KV cache, as a serving engine's draft worker runs it.

transformers' assisted generation drafts by calling the drafter's whole ``generate()`` once per
verify step. On a small model that call's set-up (configuration copies, logits processors and
stopping criteria rebuilt, cache bookkeeping) costs more than the drafter's forward passes, and
is a cost no serving engine pays. The embedded engine now drafts in its own batching loop
(engines/embedded/batching.py); this loop is the reference it is held to with transformers' batch-1
generate (the same drafts, the same outputs), where verification stays transformers' own.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _candidate_base() -> type:
    from transformers.generation.candidate_generator import CandidateGenerator

    return CandidateGenerator


class DraftLoop:
    """Proposes up to ``k`` tokens per verify step with the drafter's forward pass.

    Greedy: the drafter's argmax. Sampling: a draw from the drafter's distribution after the
    request's logits processors (temperature, top-p, penalties), returned with the drafts so
    that speculative sampling can accept or resample against the target's.
    """

    requires_model_outputs = False

    def __init__(self, drafter: Any, k: int, generation_config: Any,
                 logits_processor: Any) -> None:
        self.drafter = drafter
        self.k = k
        self.max_length = int(generation_config.max_length)
        self.sample = bool(generation_config.do_sample)
        eos = generation_config.eos_token_id
        self.eos = set() if eos is None else {int(e) for e in
                                              (eos if isinstance(eos, list | tuple) else [eos])}
        # The request's processors act on the whole sequence, prompt included, so the same
        # list serves the drafter's positions as the target's.
        self.processors = logits_processor
        params = inspect.signature(drafter.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.cache: Any = None

    @property
    def num_drafting_tokens(self) -> int:
        """Tokens proposed per step: transformers >= 5.25 sizes the target's cache record by it."""
        return self.k

    def get_candidates(self, input_ids: torch.Tensor,
                       **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        import torch

        input_ids = input_ids.to(self.drafter.device)
        # Never past the request's length: the target adds one token of its own per step.
        n = min(self.k, self.max_length - input_ids.shape[1] - 1)
        if n <= 0:
            return input_ids, None
        keep = self._reuse(input_ids.shape[1] - 1)
        feed = input_ids[:, keep:]
        ids = input_ids
        scores: list[torch.Tensor] = []
        for _ in range(n):
            # The cache is extended in place.
            out = self.drafter(input_ids=feed, use_cache=True, logits_to_keep=1,
                               **{self.cache_arg: self.cache})
            logits = out.logits[:, -1, :].float()
            step = self.processors(ids, logits) if self.processors else logits
            if self.sample:
                token = torch.multinomial(torch.softmax(step, dim=-1), 1)
            else:
                token = step.argmax(dim=-1, keepdim=True)
            ids = torch.cat([ids, token], dim=1)
            scores.append(step)
            feed = token
            if int(token[0, 0]) in self.eos:
                break
        return ids, torch.stack(scores, dim=1)

    def _reuse(self, usable: int) -> int:
        """Keep the cached positions that are still the sequence's (the prompt, accepted drafts),
        at most ``usable``; return how many are kept."""
        if self.cache is None:
            self.cache = _new_cache(self.drafter)
            return 0
        have = int(self.cache.get_seq_length())
        keep = min(have, usable)
        if have > keep:
            self.cache.crop(keep - have)  # a negative count drops from the end
        return keep

    def update_candidate_strategy(self, input_ids: torch.Tensor, scores: torch.Tensor,
                                  num_matches: int) -> None:
        """A fixed draft length, as the pilot sets it: nothing to adapt."""


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers: no config argument
        return DynamicCache()


def install(model: Any, drafter: Any, k: int) -> bool:
    """Make ``model.generate(assistant_model=drafter)`` draft with :class:`DraftLoop`; other
    candidate generators (prompt lookup, other tokenizers) stay transformers' own. False when
    this transformers has no hook for it: assisted generation then drafts as it always did."""
    original = getattr(model, "_get_candidate_generator", None)
    try:
        base = _candidate_base()
    except ImportError:
        return False
    if original is None:
        return False
    loop_type = type("DraftLoop", (DraftLoop, base), {})

    def choose(*args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("generation_config")
        plain = (
            not args
            and kwargs.get("assistant_model") is drafter
            and kwargs.get("target_tokenizer") is None
            and config is not None
            and getattr(config, "prompt_lookup_num_tokens", None) is None
            and getattr(config, "assistant_early_exit", None) is None
        )
        if plain:
            return loop_type(drafter, k, config, kwargs.get("logits_processor"))
        return original(*args, **kwargs)

    model._get_candidate_generator = choose
    return True


def attach(model: Any, drafter: Any, k: int) -> bool:
    """A fixed draft length of ``k``, as a serving engine drafts (constant schedule, no
    confidence cut-off, should transformers draft), then :func:`install`."""
    config = drafter.generation_config
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0
    return install(model, drafter, k)


def describe(installed: bool) -> str:
    """The engine log's words for who drafts."""
    return ("; drafts with the engine's draft loop (one drafter forward per token)" if installed
            else "; drafts with transformers' assisted generation (a drafter generate() per step)")
