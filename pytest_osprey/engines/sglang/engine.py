"""SGLang: command line, native /generate streaming client, server info, flush (the dry run's
checks by SGLang itself are in sglang_check)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
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
from ..http.stream import ClientPool, TokenClock, bearer, guarded, read_json, stream_json
from ..process import engine_python
from ..scoring import post_json, sglang_body, sglang_scores
from ..speculation import (
    SGLANG_METRICS,
    SPEC_V2_ENV,
    EffectiveSpeculation,
    sglang_ran,
    spec_counters_of,
    speculation_facts,
)
from .stream import (
    SGLangStream,
    abort_message,
    finish_reason_of,
    margins_of,
    max_running_of,
    top2_ids_of,
    verification_of,
)

if TYPE_CHECKING:
    from pytest_osprey.pilot.schema import Pilot

ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM")
DEFAULT_ALGORITHM = "STANDALONE"  # a plain draft model
_NEEDS_DRAFTER = ("EAGLE", "EAGLE3", "STANDALONE")
_ARGS_KEPT = ("model_path", "dtype", "context_length", "tp_size", "mem_fraction_static", "device")
FLUSH_RETRY_S = 30.0
# Every extra sampling parameter maps onto SGLang 0.5.23's sampling_params (same names,
# top_k, min_p and ignore_eos included).
SAMPLING_PARAMS = frozenset({"frequency_penalty", "presence_penalty", "repetition_penalty",
                             "stop", "min_new_tokens", "logit_bias", "json_schema", "regex",
                             "top_k", "min_p", "ignore_eos"})
INCREMENTAL = "--incremental-streaming-output"
SEED_IGNORED = ("ignored: SGLang honours sampling_seed only with --enable-deterministic-inference "
                "(target.deterministic); sampled outputs are not reproducible")


def sglang_argv(
    pilot: Pilot, condition: str, port: int, *, key_file: str | None = None
) -> list[str]:
    """``python -m sglang.launch_server ...`` for one condition; ``key_file`` is the config
    file holding the API key (see :class:`KeyFile`): the key itself is never in argv."""
    target = pilot.target
    cond = pilot.conditions[condition]
    argv = [
        engine_python(target), "-m", "sglang.launch_server",
        "--model-path", target.model,
        "--host", target.host,
        "--port", str(port),
        "--dtype", cond.dtype or target.dtype,
    ]  # fmt: skip
    if target.tp_size > 1:
        argv += ["--tp-size", str(target.tp_size)]
    if target.mem_fraction is not None:
        argv += ["--mem-fraction-static", f"{target.mem_fraction:g}"]
    if target.deterministic:
        argv.append("--enable-deterministic-inference")
    # Chunks carry only what is new (text, ids, logprob rows): by default each one resends
    # everything so far, a client cost quadratic in the output's length that a condition
    # streaming one token per chunk (the baseline) pays far more of than one streaming
    # several (a drafter).
    argv += ["--enable-metrics", INCREMENTAL]
    if cond.speculates:
        argv += speculation_args(pilot, condition)
    extra = list(target.engine_args) + list(cond.engine_args)
    if key_file:
        if "--config" in extra:
            raise EngineError(
                f"conditions.{condition}: engine_args give SGLang a --config file and "
                "target.api_key_env is set, but SGLang reads one config file: put api-key in "
                "yours and drop api_key_env, or drop your --config")
        argv += ["--config", key_file]
    return argv + extra


class KeyFile:
    """SGLang 0.5.23 takes its API key from ``--api-key`` (argv: visible to every local user
    in ``ps``) or from a ``--config`` YAML file (server_args.prepare_server_args merges it),
    and from no environment variable. So the key goes in a config file of its own: mode 0600
    in a fresh 0700 temporary folder, removed as soon as the server is healthy (SGLang has
    read it by then) and, failing that, when the server stops."""

    def __init__(self, key: str) -> None:
        self.folder = tempfile.mkdtemp(prefix="osprey-sglang-")  # 0700
        self.path = os.path.join(self.folder, "api-key.yaml")  # SGLang wants .yaml
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"api-key": key}) + "\n")  # JSON is YAML (and escapes all)

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)


def speculation_args(pilot: Pilot, condition: str) -> list[str]:
    """The --speculative-* flags, made consistent the way SGLang would resolve them."""
    cond = pilot.conditions[condition]
    spec = cond.speculation
    where = f"conditions.{condition}.speculation"
    raw = (spec.algorithm if spec else None) or DEFAULT_ALGORITHM
    algorithm = raw.upper()
    if algorithm not in ALGORITHMS:
        raise EngineError(
            f"{where}.algorithm: {raw!r} is not an SGLang speculative algorithm "
            f"(valid: {', '.join(ALGORITHMS)})"
        )
    args = ["--speculative-algorithm", algorithm]
    if algorithm in _NEEDS_DRAFTER:
        if cond.drafter is None:
            raise EngineError(f"conditions.{condition}.drafter: {algorithm} needs a drafter")
        args += ["--speculative-draft-model-path", str(cond.drafter)]
    draft_tokens = spec.num_draft_tokens if spec else 4
    if algorithm == "NGRAM":
        return [*args, "--speculative-num-draft-tokens", str(draft_tokens)]
    topk = (spec.eagle_topk if spec else None) or 1
    steps = spec.num_steps if spec else None
    draft_set = spec is not None and "num_draft_tokens" in spec.model_fields_set
    if topk == 1:
        # SGLang forces num_draft_tokens = num_steps + 1 with topk 1: say so up front.
        if steps is None:
            if draft_tokens < 2:
                raise EngineError(
                    f"{where}.num_draft_tokens: needs at least 2 with eagle_topk 1 "
                    f"(num_steps = num_draft_tokens - 1)"
                )
            steps = draft_tokens - 1
        elif draft_set and draft_tokens != steps + 1:
            raise EngineError(
                f"{where}: with eagle_topk 1 SGLang uses num_draft_tokens = num_steps + 1 "
                f"= {steps + 1}, not {draft_tokens}; drop num_draft_tokens or make it agree"
            )
        draft_tokens = steps + 1
    elif steps is None:
        raise EngineError(f"{where}.num_steps: required when eagle_topk > 1")
    return [
        *args,
        "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(draft_tokens),
    ]  # fmt: skip


def sglang_asked(pilot: Pilot, condition: str) -> EffectiveSpeculation:
    """The speculation the pilot asks of SGLang, as the flags this engine passes say it."""
    args = speculation_args(pilot, condition)
    flags = dict(zip(args[::2], args[1::2], strict=True))

    def number(flag: str) -> int | None:
        return int(flags[flag]) if flag in flags else None

    spec = pilot.conditions[condition].speculation
    return EffectiveSpeculation(
        algorithm=flags["--speculative-algorithm"],
        num_steps=number("--speculative-num-steps"),
        eagle_topk=number("--speculative-eagle-topk"),
        num_draft_tokens=number("--speculative-num-draft-tokens"),
        adaptive=bool(spec and spec.adaptive),
        source="pilot",
    )


# --------------------------------------------------------------------------- client


class SGLangClient:
    """The native SGLang HTTP API of one server (booted here or an endpoint)."""

    def __init__(self, base_url: str, condition: str, api_key: str | None = None) -> None:
        self.condition = condition
        self.pool = ClientPool(base_url, bearer(api_key))

    def body(self, req: GenerationRequest) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": req.max_new_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
        }
        if req.seed is not None:
            params["sampling_seed"] = req.seed  # honoured with deterministic inference
        for name, value in req.extra_params().items():
            if name == "logit_bias":
                value = {str(k): float(v) for k, v in value.items()}
            params[name] = value  # json_schema is already a JSON string, as SGLang wants
        body: dict[str, Any] = {"text": req.prompt, "sampling_params": params, "stream": True}
        if req.want_margins:
            body.update(return_logprob=True, top_logprobs_num=2, logprob_start_len=-1)
        return body

    async def generate(self, req: GenerationRequest) -> GenerationResult:
        refused = unsupported(req, SAMPLING_PARAMS)
        if refused:
            return GenerationResult.failure(f"unsupported by sglang: {', '.join(refused)}")
        return await guarded(lambda clock: self._generate(req, clock), req.timeout_s,
                             req.max_new_tokens)

    async def _generate(self, req: GenerationRequest, clock: TokenClock) -> GenerationResult:
        stream = SGLangStream()
        async for now, chunk in stream_json(self.pool.get(), "/generate", self.body(req)):
            added, content = stream.take(chunk)
            if added:
                clock.add(added, now)
            elif content:
                clock.first_content(now)
        e2e = clock.elapsed()
        meta, count, ids, tops = stream.meta, stream.count, stream.ids, stream.tops
        finish = meta.get("finish_reason")
        if finish_reason_of(finish) == "abort":
            # An abort (out of memory, a full queue, an admin's /abort_request) ends the stream
            # like a finish: the request did not complete.
            return GenerationResult.failure(abort_message(finish), ttft_s=clock.ttft_s,
                                            e2e_s=e2e, itl_s=list(clock.itl_s))
        if ids and count != len(ids):
            return GenerationResult.failure(impossible(
                "completion_tokens", count, f"{len(ids)} output ids came"), e2e_s=e2e)
        # Numbers as the server sent them: checked against the request (records.checked),
        # never quietly dropped or clipped into plausible ones.
        verify = reported(meta.get("spec_verify_ct"))
        accept: float | None = None
        if isinstance(verify, int) and verify > 0:
            accept = count / verify  # bonus token included, as SGLang defines it
        else:
            accept = reported(meta.get("spec_accept_length"))
        margins = margins_of(tops) if req.want_margins else None
        if margins is not None and len(margins) != count:
            margins = None
        top2 = top2_ids_of(tops) if margins is not None else None
        accepted = acceptance_from_histogram(
            meta.get("spec_correct_drafts_histogram", meta.get("spec_accept_histogram")))
        # The totals beside the histogram (0.5.23 names; older ones where those are absent):
        # the accepted count where no histogram came, checked against it where one did.
        correct = meta.get("spec_num_correct_drafts", meta.get("spec_accepted_drafts"))
        proposed = meta.get("spec_num_proposed_drafts", meta.get("spec_proposed_drafts"))
        prompt_tokens = meta.get("prompt_tokens")
        return GenerationResult(
            ok=True,
            ttft_s=clock.ttft_s,
            e2e_s=e2e,
            itl_s=clock.itl_s,
            prompt_tokens=reported(prompt_tokens),  # type: ignore[arg-type]
            output_ids=list(ids),
            output_text="".join(stream.pieces),
            top2_margin=margins,
            top2_ids=top2,
            spec_verify_ct=verify,  # type: ignore[arg-type]  # a float is impossible
            accept_length=accept,
            spec_drafts=accepted[0] if accepted else None,
            spec_accepted_per_position=accepted[1] if accepted else None,
            spec_accepted=reported(correct),  # type: ignore[arg-type]  # records.checked
            spec_proposed=reported(proposed),  # type: ignore[arg-type]
            finish_reason=finish_reason_of(finish),
        )

    async def score(self, prompt: Sequence[int], outputs: Sequence[Sequence[int]],
                    top_k: int) -> list[list[ScoredPosition]]:
        """Per output, the target's raw distribution at each of its positions
        (engines/scoring.py): one /generate per output, generating nothing."""
        out: list[list[ScoredPosition]] = []
        for output in outputs:
            if not output:
                out.append([])
                continue
            answer = await post_json(self.pool, "/generate", sglang_body(prompt, output, top_k),
                                     self.condition)
            out.append(sglang_scores(answer, output, top_k, self.condition))
        return out

    def server_info(self) -> dict[str, Any]:
        """Every resolved server argument (bounded: see httpstream.bounded); {} where neither
        route answers. An answer that is not JSON is an EngineError naming the URL."""
        with self.pool.sync() as client:
            for path in ("/server_info", "/get_server_info"):
                try:
                    data = read_json(client, path, self.condition)
                except httpx.HTTPError:
                    continue
                if data is not None:
                    return data if isinstance(data, dict) else {}
        return {}

    def spec_counters(self) -> dict[str, float]:
        """Verify steps and output tokens of finished requests so far, and the active depth
        where the server adapts it, from /metrics (--enable-metrics); empty without."""
        try:
            with self.pool.sync() as client:
                r = client.get("/metrics")
        except httpx.HTTPError:
            return {}
        return spec_counters_of(r.text, SGLANG_METRICS) if r.status_code == 200 else {}

    def served_context_length(self) -> int | None:
        """The context length the server resolved (its /v1/models max_model_len): server
        args keep context_length null unless --context-length was given."""
        try:
            with self.pool.sync() as client:
                r = client.get("/v1/models")
            entries = r.json().get("data") if r.status_code == 200 else None
            value = entries[0].get("max_model_len") if entries else None
        except (httpx.HTTPError, ValueError, AttributeError, IndexError, TypeError):
            return None
        return value if isinstance(value, int) else None

    def fingerprint(self) -> dict[str, Any]:
        info = self.server_info()
        args = {
            k: v
            for k, v in info.items()
            if k in _ARGS_KEPT or (k.startswith("speculative_") and not isinstance(v, dict))
        }
        states = info.get("internal_states")
        first = states[0] if isinstance(states, list) and states else {}
        first = first if isinstance(first, dict) else {}
        # Top level where the scheduler's init info is merged in; else a scheduler's state.
        kv_tokens = info.get("max_total_num_tokens") or first.get("max_total_num_tokens")
        context = info.get("context_length")
        if not isinstance(context, int) and info:
            context = self.served_context_length()
        streaming = None
        if "incremental_streaming_output" in info:
            streaming = "incremental" if info["incremental_streaming_output"] else "cumulative"
        seed = None
        if "enable_deterministic_inference" in info:
            seed = "honoured" if info["enable_deterministic_inference"] else SEED_IGNORED
        return {
            "engine": "sglang",
            "version": info.get("version"),
            "device": info.get("device_name") or info.get("device"),
            "dtype": info.get("dtype"),
            # server_info carries every server argument: null there means unquantized.
            "quantization": (info.get("quantization") or "none") if "quantization" in info
            else None,
            "context_length": context,
            "kv_capacity_tokens": kv_tokens,
            "max_running_requests": max_running_of(info, first),
            "verification": verification_of(info),
            "streaming": streaming,
            "sampling_seed": seed,
            "args": args,
        }

    def flush(self) -> None:
        """POST /flush_cache; it answers 400 while requests run, so retry (bounded)."""
        deadline = time.monotonic() + FLUSH_RETRY_S
        with self.pool.sync() as client:
            while True:
                try:
                    r = client.post("/flush_cache")
                except httpx.HTTPError as exc:
                    raise EngineError(
                        f"condition {self.condition!r}: /flush_cache failed: "
                        f"{type(exc).__name__}: {exc}"
                    ) from None
                if r.status_code == 200:
                    return
                if r.status_code != 400 or time.monotonic() >= deadline:
                    raise EngineError(
                        f"condition {self.condition!r}: /flush_cache answered {r.status_code}"
                        f" ({r.text[:200].strip()})"
                        + (f" for {FLUSH_RETRY_S:g} s (busy)" if r.status_code == 400 else "")
                    )
                time.sleep(0.5)


# --------------------------------------------------------------------------- engine


class SGLangEngine(BootedServer[SGLangClient]):
    """A booted SGLang server serving one condition."""

    ENGINE = "sglang"
    HEALTH_PATH = "/health_generate"

    def __init__(self, pilot: Pilot, condition: str, boot: BootSpec) -> None:
        super().__init__(pilot, condition, boot)
        self.key_file: KeyFile | None = None
        self.spec_env: dict[str, str] = {}  # the server's spec-v2 switch, where set

    def command(self, env: dict[str, str], key: str | None, port: int) -> list[str]:
        self.spec_env = {k: env[k] for k in (SPEC_V2_ENV,) if k in env}
        self.key_file = KeyFile(key) if key else None
        return sglang_argv(self.pilot, self.condition, port,
                           key_file=self.key_file.path if self.key_file else None)

    def connect(self, base_url: str, key: str | None) -> SGLangClient:
        return SGLangClient(base_url, self.condition, key)

    def release_boot_secrets(self) -> None:
        if self.key_file is not None:
            self.key_file.remove()
            self.key_file = None

    def served_facts(self) -> dict[str, Any]:
        cond = self.pilot.conditions[self.condition]
        if not cond.speculates or self.client is None:
            return {}
        ran = sglang_ran(self.client.server_info(), self.spec_env)
        adaptive = bool(cond.speculation and cond.speculation.adaptive)
        return {"speculation": speculation_facts(sglang_asked(self.pilot, self.condition),
                                                 ran, adaptive)}

    def spec_counters(self) -> dict[str, float]:
        """The server's counter snapshot (see :meth:`SGLangClient.spec_counters`)."""
        return self.client.spec_counters() if self.client is not None else {}

    def flush(self) -> None:
        if self.client is not None:
            self.client.flush()
