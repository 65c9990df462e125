"""The sampling-parameter probes: requests that set one parameter each, and what honouring it
means.

Real speculative-decoding bugs live here: penalties silently ignored while speculating (the
drafted tokens are verified without them), structured output broken or stuck under
speculation, stop strings or token limits applied to the drafted tokens and not the accepted
ones. Each probe runs greedily (temperature 0) on the baseline and on every other condition,
after a ``plain`` request of the same prompt that the probe's settings are derived from. A
probe is judged in one of two ways:

* ``same``: the condition must produce the baseline's tokens (greedy, so a condition honouring
  the parameter as the baseline does gives identical output), and the output must show the
  parameter's own effect where it has one (a stop string cut, a token limit, a banned token
  absent);
* ``valid``: constrained decoding must give output valid under the constraint (identical
  tokens are not required: constrained decoding may legitimately break near-ties apart).

Pure data and checks: the campaign sends the requests, the judgement applies the checks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

PLAIN = "plain"
CHOICE_SCHEMA = {"enum": ["yes", "no"]}
CHOICE_REGEX = "(yes|no)"


@dataclass(frozen=True)
class Probe:
    name: str
    kind: Literal["same", "valid"]
    settings: Callable[[str, Sequence[int], int], dict[str, Any] | None]
    """(plain output text, plain ids, max_new_tokens) -> the request's parameters; None:
    this prompt's plain output gives the probe nothing to work with."""
    check: Callable[[Mapping[str, Any], str, Sequence[int], str, Sequence[int]], str | None]
    """(settings, output text, output ids, plain text, plain ids) -> what is wrong, or
    None when the output honours the parameter."""
    informative: bool = True
    """False: the check alone shows the effect. True: the baseline's output must also differ
    from its plain output, or ignoring the parameter would go unseen."""


def _fixed(values: dict[str, Any]) -> Callable[[str, Sequence[int], int], dict[str, Any]]:
    return lambda _text, _ids, _n: dict(values)


def _no_check(*_: Any) -> str | None:
    return None


def _stop_settings(text: str, _ids: Sequence[int], _n: int) -> dict[str, Any] | None:
    """A 3-character stop string first seen a third of the way into the plain output."""
    for i in range(max(1, len(text) // 3), len(text) - 2):
        piece = text[i:i + 3]
        if piece.strip() and text.find(piece) == i:
            return {"stop": [piece]}
    return None


def _stop_check(s: Mapping[str, Any], text: str, _ids: Sequence[int], plain: str,
                _plain_ids: Sequence[int]) -> str | None:
    stop = s["stop"][0]
    if stop in text:
        return f"the stop string {stop!r} is in the output"
    cut = plain[: plain.find(stop)]
    if text.rstrip() != cut.rstrip():
        return f"output {text[:60]!r} is not the plain output up to {stop!r} ({cut[:60]!r})"
    return None


def _max_check(s: Mapping[str, Any], _text: str, ids: Sequence[int], _plain: str,
               plain_ids: Sequence[int]) -> str | None:
    n = int(s["max_new_tokens"])
    if len(ids) > n:
        return f"{len(ids)} tokens past max_new_tokens {n}"
    if list(ids) != list(plain_ids[:n]):
        return "not the first tokens of the plain output"
    return None


def _min_settings(_text: str, ids: Sequence[int], n: int) -> dict[str, Any] | None:
    # Informative only where the plain output ended before the budget (end of sequence).
    return {"min_new_tokens": n} if len(ids) < n else None


def _min_check(s: Mapping[str, Any], _text: str, ids: Sequence[int], _plain: str,
               _plain_ids: Sequence[int]) -> str | None:
    n = int(s["min_new_tokens"])
    return None if len(ids) >= n else f"ended after {len(ids)} tokens, min_new_tokens {n}"


def _bias_settings(_text: str, ids: Sequence[int], _n: int) -> dict[str, Any] | None:
    return {"logit_bias": {ids[0]: -100.0}} if ids else None


def _bias_check(s: Mapping[str, Any], _text: str, ids: Sequence[int], _plain: str,
                _plain_ids: Sequence[int]) -> str | None:
    banned = {int(k) for k in s["logit_bias"]}
    seen = sorted(banned & set(ids))
    return f"banned token(s) {seen} in the output" if seen else None


def _json_check(_s: Mapping[str, Any], text: str, *_: Any) -> str | None:
    try:
        value = json.loads(text)
    except ValueError:
        return f"not JSON: {text[:60]!r}"
    return None if value in CHOICE_SCHEMA["enum"] else f"{value!r} is not one of yes/no"


def _regex_check(_s: Mapping[str, Any], text: str, *_: Any) -> str | None:
    return None if re.fullmatch(CHOICE_REGEX, text) else f"{text[:60]!r} does not match"


PROBES: tuple[Probe, ...] = (
    Probe("frequency_penalty", "same", _fixed({"frequency_penalty": 1.0}), _no_check),
    Probe("presence_penalty", "same", _fixed({"presence_penalty": 1.0}), _no_check),
    Probe("repetition_penalty", "same", _fixed({"repetition_penalty": 1.3}), _no_check),
    Probe("stop", "same", _stop_settings, _stop_check, informative=False),
    Probe("max_new_tokens", "same", _fixed({"max_new_tokens": 3}), _max_check,
          informative=False),
    Probe("min_new_tokens", "same", _min_settings, _min_check, informative=False),
    Probe("logit_bias", "same", _bias_settings, _bias_check, informative=False),
    Probe("json_schema", "valid", _fixed({"json_schema": json.dumps(CHOICE_SCHEMA)}),
          _json_check, informative=False),
    Probe("regex", "valid", _fixed({"regex": CHOICE_REGEX}), _regex_check, informative=False),
)
BY_NAME = {p.name: p for p in PROBES}


# --------------------------------------------------------------------------- sampled probes
#
# The greedy probes above cannot see a parameter that acts only when sampling (temperature,
# top-p, top-k, min-p) and see a penalty only where it flips an argmax. The sampled probes
# send each parameter alone, bound tight enough to act on most positions, at the sampled
# pass's temperature; the target scores every sample (scores.jsonl, with the probe named)
# and the exact test judges the drafted positions under that request's own sampling.

SAMPLED_PREFIX = "sampled:"
SEED_PROBE = "sampled:seed"
"""The same seeded sampled request twice: a seed honoured gives the same tokens twice."""


@dataclass(frozen=True)
class SampledProbe:
    parameter: str  # the request field it sets ("temperature": none beyond it)
    label: str  # how a verdict names it ("top-p")
    settings: Mapping[str, Any]  # the fields beyond the temperature
    temperature: float | None = None  # None: the sampled pass's

    @property
    def name(self) -> str:
        """The probe's name in records.jsonl and scores.jsonl."""
        return SAMPLED_PREFIX + self.parameter


PENALTY_TEMPERATURE = 0.3
"""The penalty probes sample cool: a penalty binds where the model would repeat itself, which
it does at a low temperature (the tiny target's drafted positions: log-likelihood ratio +11
without the penalties at T 0.3 over 42 tokens, none at T 0.8)."""

# A repetition penalty divides raw logits, which a score (log-probabilities) does not give
# back, so the exact test cannot rebuild its distribution: it is judged by its greedy probe.
SAMPLED_PROBES: tuple[SampledProbe, ...] = (
    SampledProbe("temperature", "temperature", {}),
    SampledProbe("top_p", "top-p", {"top_p": 0.5}),
    SampledProbe("top_k", "top-k", {"top_k": 3}),
    SampledProbe("min_p", "min-p", {"min_p": 0.2}),
    SampledProbe("frequency_penalty", "frequency penalty", {"frequency_penalty": 1.0},
                 PENALTY_TEMPERATURE),
    SampledProbe("presence_penalty", "presence penalty", {"presence_penalty": 1.0},
                 PENALTY_TEMPERATURE),
)
SAMPLED_BY_NAME = {p.name: p for p in SAMPLED_PROBES}
PARAMETERS: tuple[tuple[str, str], ...] = (
    ("temperature", "temperature"), ("top_p", "top-p"), ("top_k", "top-k"), ("min_p", "min-p"),
    ("repetition_penalty", "repetition penalty"), ("frequency_penalty", "frequency penalty"),
    ("presence_penalty", "presence penalty"), ("seed", "seed"),
)
"""Every sampling parameter a verdict is given for, and its words."""
