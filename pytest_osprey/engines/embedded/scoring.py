"""The embedded target scores text: its raw (temperature 1, unprocessed) next-token
distribution at every position of a sampled output, for the exact distribution test."""

from __future__ import annotations

from typing import Any

from pytest_osprey.results.scores import ScoredPosition

SCORE_BATCH = 16  # samples scored in one forward


def score_outputs(model: Any, device: str, prompt: list[int], outputs: list[list[int]],
                  top_k: int) -> list[list[ScoredPosition]]:
    """Per output position, the target's raw log-probability of the emitted token and its
    top-``top_k``: one forward over prompt + output per sample, similar lengths batched (right
    padding leaves a causal model's logits at real positions as they are). Runs on the thread
    the engine's batch runs on."""
    import torch

    out: list[list[ScoredPosition]] = [[] for _ in outputs]
    n = len(prompt)
    order = sorted((i for i, o in enumerate(outputs) if o), key=lambda i: len(outputs[i]))
    for chunk in (order[a: a + SCORE_BATCH] for a in range(0, len(order), SCORE_BATCH)):
        width = n + max(len(outputs[i]) for i in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            seq = prompt + outputs[i]
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
        with torch.inference_mode():
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        for row, i in enumerate(chunk):
            m = len(outputs[i])
            # The logits at position t predict token t + 1: the output's from n - 1 on.
            logp = torch.log_softmax(logits[row, n - 1: n - 1 + m].float(), dim=-1)
            token = torch.tensor(outputs[i], device=logp.device)
            own = logp.gather(1, token[:, None])[:, 0].tolist()
            top = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
            out[i] = [ScoredPosition(t, lp, tuple(ti), tuple(tv)) for t, lp, ti, tv in
                      zip(outputs[i], own, top.indices.tolist(), top.values.tolist(),
                          strict=True)]
    return out
