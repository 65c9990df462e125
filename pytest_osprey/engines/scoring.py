"""Scoring outputs by a server's target: the raw distribution at every output position.

Servers score any token sequence without generating (docs/design facts):

- SGLang ``/generate`` with ``input_ids`` (prompt + output), ``max_new_tokens`` 0,
  ``return_logprob``, ``logprob_start_len`` and ``top_logprobs_num`` K:
  ``meta_info.input_token_logprobs`` holds ``[logprob, id, text]`` per position from the start
  on, ``meta_info.input_top_logprobs`` the top K there in the same form. The entry at the
  start position itself has no logprob (``null``: 0.5.23 computes none for it, as recorded in
  tests/fixtures/sglang-0.5.23-cpu/score_input_logprobs.json), so the start is the prompt's
  last token, one before the output;
- vLLM ``/v1/completions`` with the token ids as the prompt, ``max_tokens`` 1,
  ``prompt_logprobs`` K and ``echo``: ``choices[0].prompt_logprobs`` holds per prompt position
  (None for the first) ``{id: {"logprob", "rank", ...}}``, the token there and the top K.

Both are the target's raw log-probabilities (temperature 1, no processors). The prompt is
tokenized here with the target's tokenizer, as the server tokenizes the text it is sent.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from pytest_osprey.results.scores import ScoredPosition

from .base import EngineError
from .http.stream import ClientPool

SCORE_TIMEOUT_S = 300.0


@functools.cache
def _tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    return AutoTokenizer.from_pretrained(model, local_files_only=True)


def prompt_ids(model: str, prompt: str, condition: str) -> list[int]:
    """``prompt`` as the server tokenizes it (the target's tokenizer, special tokens added)."""
    try:
        tok = _tokenizer(model)
    except (OSError, ValueError) as exc:
        raise EngineError(f"{condition}: cannot score: no local tokenizer for target.model "
                          f"{model!r} ({exc})") from None
    return [int(i) for i in tok(prompt)["input_ids"]]


async def post_json(pool: ClientPool, path: str, body: Mapping[str, Any],
                    condition: str) -> Any:
    """The JSON answer of one non-streamed POST; EngineError naming the route otherwise."""
    url = f"{pool.base_url}{path}"
    try:
        r = await pool.get().post(path, json=dict(body), timeout=SCORE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise EngineError(f"{condition}: scoring at {url}: {type(exc).__name__}: {exc}") from None
    if r.status_code != 200:
        raise EngineError(f"{condition}: scoring at {url} answered HTTP {r.status_code}: "
                          f"{r.text[:200]}")
    try:
        return json.loads(r.content)
    except ValueError:
        raise EngineError(f"{condition}: scoring at {url} answered no JSON") from None


def _bad(condition: str, route: str, why: str) -> EngineError:
    return EngineError(f"{condition}: scoring at {route}: {why}")


def _number(x: Any) -> float:
    # -inf is a log-probability (a token masked out); NaN, +inf and positives are not.
    if not isinstance(x, int | float) or isinstance(x, bool) or math.isnan(x) or x > 1e-3:
        raise ValueError(f"not a log-probability: {x!r}")
    return float(x)


def _top(pairs: list[tuple[float, int]], k: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    pairs = sorted(pairs, key=lambda p: -p[0])[:k]
    return tuple(i for _, i in pairs), tuple(lp for lp, _ in pairs)


def sglang_body(prompt: Sequence[int], output: Sequence[int], top_k: int) -> dict[str, Any]:
    return {"input_ids": [*prompt, *output],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
            # One before the output: the start position's own entry carries no logprob.
            "return_logprob": True, "logprob_start_len": max(len(prompt) - 1, 0),
            "top_logprobs_num": top_k, "stream": False}


def sglang_scores(answer: Any, output: Sequence[int], top_k: int,
                  condition: str) -> list[ScoredPosition]:
    """The output's positions from SGLang's answer (the last ``len(output)`` input logprobs,
    their ids checked against the output)."""
    route = "/generate"
    meta = answer.get("meta_info") if isinstance(answer, Mapping) else None
    if not isinstance(meta, Mapping):
        raise _bad(condition, route, "no meta_info in the answer")
    own, tops = meta.get("input_token_logprobs"), meta.get("input_top_logprobs")
    m = len(output)
    if not isinstance(own, list) or not isinstance(tops, list) or len(own) < m or len(tops) < m:
        raise _bad(condition, route, "no input_token_logprobs / input_top_logprobs for every "
                   "output position (return_logprob and top_logprobs_num not honoured)")
    out = []
    try:
        for token, entry, top in zip(output, own[len(own) - m:], tops[len(tops) - m:],
                                     strict=True):
            if int(entry[1]) != token:
                raise ValueError(f"token {entry[1]} where the output has {token}")
            pairs = [(_number(t[0]), int(t[1])) for t in top]
            ids, lps = _top(pairs, top_k)
            out.append(ScoredPosition(token, _number(entry[0]), ids, lps))
    except (TypeError, ValueError, IndexError) as exc:
        raise _bad(condition, route, str(exc)) from None
    return out


def openai_body(model: str, prompt: Sequence[int], output: Sequence[int],
                top_k: int) -> dict[str, Any]:
    return {"model": model, "prompt": [*prompt, *output], "max_tokens": 1,
            "temperature": 0.0, "prompt_logprobs": top_k, "echo": True}


def openai_scores(answer: Any, n_prompt: int, output: Sequence[int], top_k: int,
                  condition: str) -> list[ScoredPosition]:
    """The output's positions from vLLM's ``prompt_logprobs`` (positions ``n_prompt`` on)."""
    route = "/v1/completions"
    choices = answer.get("choices") if isinstance(answer, Mapping) else None
    per = choices[0].get("prompt_logprobs") if (
        isinstance(choices, list) and choices and isinstance(choices[0], Mapping)) else None
    if not isinstance(per, list) or len(per) != n_prompt + len(output):
        raise _bad(condition, route, "no prompt_logprobs for every position (prompt_logprobs "
                   "not honoured)")
    out = []
    try:
        for token, entry in zip(output, per[n_prompt:], strict=True):
            if not isinstance(entry, Mapping):
                raise ValueError("a position without logprobs")
            pairs: list[tuple[float, int]] = []
            own: float | None = None
            for key, v in entry.items():
                lp = _number(v["logprob"] if isinstance(v, Mapping) else v)
                tid = int(key)
                pairs.append((lp, tid))
                if tid == token:
                    own = lp
            if own is None:
                raise ValueError(f"the output's token {token} is not among its logprobs")
            ids, lps = _top(pairs, top_k)
            out.append(ScoredPosition(token, own, ids, lps))
    except (TypeError, ValueError, KeyError) as exc:
        raise _bad(condition, route, str(exc)) from None
    return out
