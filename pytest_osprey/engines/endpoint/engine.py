"""An already running server named by a condition: nothing is booted or killed for it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx

from pytest_osprey.results.records import checked
from pytest_osprey.results.scores import ScoredPosition

from ..base import BootSpec, EngineError, GenerationRequest, GenerationResult
from ..chat_template import load_chat_tokenizer, template_digest
from ..http.stream import bearer
from ..process import api_key_from
from ..scoring import prompt_ids
from ..sglang.engine import SGLangClient
from ..speculation import VLLM_METRICS, accept_length_most, spec_counters_of
from ..vllm.engine import OpenAIClient

if TYPE_CHECKING:
    from pytest_osprey.pilot.schema import Endpoint, Pilot

# What answers 200 when the server is up, per protocol.
_HEALTH = {"sglang": ("/health", "/health_generate"), "openai": ("/health", "/v1/models")}


class EndpointEngine:
    """Talks to ``conditions.<name>.endpoint`` with the SGLang or the OpenAI protocol."""

    def __init__(self, pilot: Pilot, condition: str, boot: BootSpec) -> None:
        endpoint = pilot.conditions[condition].endpoint
        if endpoint is None:
            raise EngineError(f"conditions.{condition}.endpoint: not set")
        self.pilot = pilot
        self.condition = condition
        self.boot = boot
        self.endpoint: Endpoint = endpoint
        self.url = endpoint.url.rstrip("/")
        self.sglang: SGLangClient | None = None
        self.openai: OpenAIClient | None = None
        self.tokenizer: Any = None  # the target's, when it has a chat template
        self.prompt_format: str | None = None
        self.server: None = None  # a server this run did not start: no process to watch

    def start(self) -> None:
        env = {**os.environ, **self.boot.env}
        key = api_key_from(
            env, self.endpoint.api_key_env, f"conditions.{self.condition}.endpoint.api_key_env"
        )
        if self.endpoint.protocol == "sglang":
            self.sglang = SGLangClient(self.url, self.condition, key)
        else:
            model = self.endpoint.model or self.pilot.target.model
            self.openai = OpenAIClient(self.url, self.condition, model, key)
        self._check_up(key)
        # The same chat rendering as a booted engine of this target: the one deployed.
        self.tokenizer, self.prompt_format = load_chat_tokenizer(self.pilot.target.model)

    def _check_up(self, key: str | None) -> None:
        problems = []
        with httpx.Client(base_url=self.url, headers=bearer(key), timeout=10.0) as client:
            for path in _HEALTH[self.endpoint.protocol]:
                try:
                    r = client.get(path)
                except httpx.HTTPError as exc:
                    problems.append(f"{path}: {type(exc).__name__}")
                    continue
                if r.status_code == 200:
                    return
                problems.append(f"{path}: HTTP {r.status_code}")
        raise EngineError(
            f"condition {self.condition!r}: endpoint {self.url} is not answering "
            f"({'; '.join(problems)})"
        )

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        client = self.sglang or self.openai
        if client is None:
            return GenerationResult.failure(f"condition {self.condition!r}: engine not started")
        return checked(await client.generate(request), request.max_new_tokens,
                       accept_length_most(self.pilot, self.condition))

    vocab_size: int | None = None  # a server does not say how wide its logits are

    async def score(self, prompt: str, outputs: Sequence[Sequence[int]],
                    top_k: int) -> list[list[ScoredPosition]]:
        """The target's raw distribution at every position of ``outputs`` (base.Scorer),
        asked of this endpoint; an EngineError where it returns no logprobs."""
        client = self.sglang or self.openai
        if client is None:
            raise EngineError(f"condition {self.condition!r}: engine not started")
        ids = prompt_ids(self.pilot.target.model, prompt, self.condition)
        return await client.score(ids, outputs, top_k)

    def fingerprint(self) -> dict[str, Any]:
        fp: dict[str, Any] = {"engine": f"endpoint/{self.endpoint.protocol}"}
        if self.sglang is not None:
            fp.update(self.sglang.fingerprint())
        elif self.openai is not None:
            fp.update(self.openai.fingerprint())
            fp["model"] = self.openai.model
        fp["endpoint"] = self.url
        fp["protocol"] = self.endpoint.protocol
        fp["chat_template"] = template_digest(self.tokenizer)
        fp["prompt_format"] = self.prompt_format
        return fp

    def spec_counters(self) -> dict[str, float]:
        """The server's speculation counters (SGLang or vLLM names on /metrics); empty
        without."""
        if self.sglang is not None:
            return self.sglang.spec_counters()
        if self.openai is not None:
            return spec_counters_of(self.openai.get_text("/metrics") or "", VLLM_METRICS)
        return {}

    def memory_mb(self) -> float | None:
        return None  # not ours to measure

    def flush(self) -> None:
        if self.sglang is not None:
            self.sglang.flush()

    def stop(self) -> None:
        self.sglang = self.openai = None
