"""The one small protocol every engine implements (in-process, booted server, or endpoint)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pytest_osprey.results.records import Measurement
from pytest_osprey.results.scores import ScoredPosition


class EngineError(RuntimeError):
    """An engine could not start or serve; the message names the condition and the cause."""


# Sampling parameters beyond temperature/top-p, as the OpenAI and SGLang APIs name them
# (min_new_tokens is vLLM's min_tokens). An engine lists those it honours in SAMPLING_PARAMS:
# one it cannot honour fails the request by name, never dropped in silence (a timed pass at
# a serving top-k the engine ignored would time another workload).
EXTRA_PARAMS = ("frequency_penalty", "presence_penalty", "repetition_penalty", "stop",
                "min_new_tokens", "logit_bias", "json_schema", "regex", "top_k", "min_p",
                "ignore_eos")


@dataclass(frozen=True)
class GenerationRequest:
    prompt_id: str
    prompt: str
    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int | None = None  # keep the k most likely tokens
    min_p: float = 0.0  # drop tokens below min_p x the top token's probability
    ignore_eos: bool = False  # run to max_new_tokens whatever the model ends with
    seed: int | None = None
    want_margins: bool = True  # top-1 minus top-2 logprob (and their ids) per position
    timeout_s: float = 300.0
    frequency_penalty: float = 0.0  # OpenAI semantics: minus penalty x count so far
    presence_penalty: float = 0.0  # minus penalty once a token has appeared
    repetition_penalty: float = 1.0  # CTRL-style: divide positive logits of seen tokens
    stop: tuple[str, ...] = ()  # stop strings (not included in the output)
    min_new_tokens: int = 0  # no end of sequence before this many tokens
    logit_bias: Mapping[int, float] | None = None  # token id -> added to its logit
    json_schema: str | None = None  # constrained decoding: JSON valid against this schema
    regex: str | None = None  # constrained decoding: output matching this pattern

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def extra_params(self) -> dict[str, Any]:
        """The sampling parameters beyond the defaults that this request sets."""
        out: dict[str, Any] = {}
        for name in EXTRA_PARAMS:
            value = getattr(self, name)
            default = GenerationRequest.__dataclass_fields__[name].default
            if value != default and value is not None:
                out[name] = dict(value) if isinstance(value, Mapping) else (
                    list(value) if isinstance(value, tuple) else value)
        return out


def unsupported(request: GenerationRequest, supported: frozenset[str]) -> list[str]:
    """The parameters ``request`` sets that an engine honouring ``supported`` cannot."""
    return [name for name in request.extra_params() if name not in supported]


def acceptance_from_histogram(hist: Any) -> tuple[int, list[int]] | None:
    """(verify steps, accepted count per draft position) from an acceptance histogram
    (SGLang's spec_correct_drafts_histogram, vLLM's per-request acceptance_histogram): entry i
    counts the steps that accepted exactly i drafts, so position j was accepted by the steps
    with more than j."""
    if not isinstance(hist, list) or len(hist) < 2 or not all(
            isinstance(v, int) and v >= 0 for v in hist):
        return None
    return sum(hist), [sum(hist[j + 1:]) for j in range(len(hist) - 1)]


def reported(value: Any) -> int | float | None:
    """A number a server reported, as it is (its soundness is checked later, against the
    request); None for anything that is not a number (the field is then not reported)."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


# The engines' result is the saved record's measured part: one declaration.
GenerationResult = Measurement


@dataclass(frozen=True)
class BootSpec:
    """Everything an engine needs to stand up one condition."""

    condition: str
    log_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)


class ServerHandle(Protocol):
    """The process a booted engine serves from (engines/process.py's ServerProcess)."""

    log_path: Path
    grace_s: float  # SIGTERM-to-SIGKILL grace at stop

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has ended, else None."""
        ...


@runtime_checkable
class Engine(Protocol):
    """One condition's engine. ``start`` boots/loads once; ``stop`` must always be safe.
    A capability an engine lacks reads None (no server process, no tokenizer, no counters)."""

    condition: str

    @property
    def server(self) -> ServerHandle | None:
        """The server process this run booted for the condition (None: in process, or an
        endpoint this run did not start)."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The target's tokenizer, when it has a chat template (prompts are rendered with
        it); None until started or without one."""
        ...

    def spec_counters(self) -> dict[str, float] | None:
        """A snapshot of the server's cumulative speculation counters (reconciled per
        stretch); None where the engine keeps none."""
        ...

    def start(self) -> None: ...

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...

    def fingerprint(self) -> dict[str, Any]:
        """Engine + version, device, dtype, context length, resolved args, KV capacity..."""
        ...

    def memory_mb(self) -> float | None:
        """Current memory of what serves this condition (GPU if any, else resident), in MiB."""
        ...

    def flush(self) -> None:
        """Drop caches between blocks so blocks are independent (no-op where meaningless)."""
        ...

    def stop(self) -> None: ...


class InProcess:
    """What an engine serving in this process has of the protocol's server capabilities:
    no server process to watch, no server counters (acceptance is read per request)."""

    server = None

    def spec_counters(self) -> None:
        return None


@runtime_checkable
class Scorer(Protocol):
    """An engine's optional capability: the target's own distribution at every position of
    given outputs (the distribution gate's exact test reads it). An engine that knows the
    size of the distribution (its logits' width) says it as ``vocab_size`` (else None)."""

    @property
    def vocab_size(self) -> int | None: ...

    async def score(self, prompt: str, outputs: Sequence[Sequence[int]],
                    top_k: int) -> list[list[ScoredPosition]]:
        """Per output, per position: the raw (T=1, unprocessed) log-probability of the token
        there and the top ``top_k`` ids and log-probabilities, given ``prompt`` (the text
        generate() was sent) and the output's tokens before it. Raises EngineError."""
        ...
