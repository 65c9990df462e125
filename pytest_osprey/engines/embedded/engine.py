"""The embedded engine: transformers models in-process, served as a server serves them.

Concurrent requests share one decoding loop (embedded/batching.py): they join a running
batch as they arrive and leave it as they finish, each step runs the target once over every
sequence in flight, with a drafter the drafts verified per sequence (greedy: the longest
prefix the target agrees with; sampled: speculative sampling), acceptance recorded per
sequence. Latency is timed from submission: a request that waits for a place in the batch
feels it, as users do."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import itertools
import os
import platform
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_osprey.results.scores import ScoredPosition

from .. import base, gpu_memory
from ..base import BootSpec, EngineError, GenerationRequest, GenerationResult, unsupported
from ..chat_template import template_digest
from ..speculation import fixed_k_facts
from .batching import CANCELLED_BY_CLIENT, MAX_BATCH, Batcher, Flight, Processor
from .generation_hooks import sampling_processors, sampling_warpers, token_times
from .planted_faults import planted_fault
from .quantize import round_weights
from .scoring import score_outputs

if TYPE_CHECKING:
    import torch

    from pytest_osprey.pilot.schema import Pilot

ALGORITHMS = ("assisted",)
# transformers has no constrained decoding of its own (json_schema, regex).
SAMPLING_PARAMS = frozenset({"frequency_penalty", "presence_penalty", "repetition_penalty",
                             "stop", "min_new_tokens", "logit_bias",
                             "top_k", "min_p", "ignore_eos"})


def _settle(future: asyncio.Future[GenerationResult], result: GenerationResult) -> None:
    if not future.done():  # a cancelled request's future is done already
        future.set_result(result)


def _dtype(name: str) -> torch.dtype:
    import torch

    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
             "fp16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float64": torch.float64}
    if name not in table:
        raise EngineError(f"unknown dtype {name!r}; valid: {', '.join(table)}")
    return table[name]


_TORCH_THREAD: concurrent.futures.ThreadPoolExecutor | None = None


def _torch_thread() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread every in-process generation runs on. torch's OpenMP pool belongs to the
    thread that calls it: requests spread over asyncio's default executor would each bring
    a team of threads, and a team left spinning after its request (OpenMP waits busily
    before sleeping) takes the cores from the next one. Small parallel regions, as a drafter
    runs by the hundred, then wait for the scheduler: measured, a 1.2x speedup read as 1.0x."""
    global _TORCH_THREAD
    if _TORCH_THREAD is None:
        _TORCH_THREAD = concurrent.futures.ThreadPoolExecutor(1, "osprey-torch")
    return _TORCH_THREAD


def _folder_digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("config.json")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


class TransformersEngine(base.InProcess):
    """One condition served by a continuous batch of its target (and drafter, if it drafts)."""

    def __init__(self, pilot: Pilot, condition: str, boot: BootSpec) -> None:
        self.pilot = pilot
        self.condition = condition
        self.cond = pilot.conditions[condition]
        self.boot = boot
        self.dtype_name = self.cond.dtype or pilot.target.dtype
        self._model: Any = None
        self._drafter: Any = None
        self._batcher: Batcher | None = None
        self._tokenizer: Any = None
        self._work_base = 0  # allocated on the GPU when the batch last started
        self.load_seconds: float | None = None
        self._cuda = False
        # All conditions run in this one process. Under ABBA they are loaded at once, and a
        # process-wide figure (NVML, torch's peaks) would be the same for every condition:
        # each is then given its own share (see memory_mb). One at a time, the process is it.
        embedded = [c for c in pilot.conditions.values() if c.endpoint is None]
        self._shared = pilot.load.order != "sequential" and len(embedded) > 1
        self._weights_bytes = 0  # allocated on the GPU by loading this condition's models
        self._work_bytes = 0  # most allocated on the GPU during one of its requests
        self._gpu_basis: str | None = None  # NVML's basis ("process"/"device") or "allocator"
        self.log_path = boot.log_dir / f"{condition}.log"
        self._served = self._failed = self._cancelled = 0
        self._stopping = threading.Event()  # stop(): every request in flight ends at once
        self.validate(pilot, condition)

    @staticmethod
    def validate(pilot: Pilot, condition: str) -> None:
        """Settings this engine cannot honour, found before anything loads."""
        cond = pilot.conditions[condition]
        spec = cond.speculation
        if spec is not None and spec.algorithm not in (None, *ALGORITHMS):
            raise EngineError(
                f"{condition}: speculation.algorithm {spec.algorithm!r} is not supported by the "
                f"transformers engine; valid: {', '.join(ALGORITHMS)}"
            )
        if cond.speculates and cond.drafter is None:
            raise EngineError(f"{condition}: the transformers engine needs a drafter checkpoint")
        _dtype(cond.dtype or pilot.target.dtype)

    # -- log ----------------------------------------------------------------------------------
    def log(self, message: str) -> None:
        """One line in logs/<condition>.log, as a booted server's log would have: what was
        loaded, how, failures, and what was served. Best effort: a log must never fail a
        request."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as fh:
                fh.write(f"{stamp} {message}\n")
        except OSError:
            pass

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        self._stopping.clear()
        hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        t0 = time.perf_counter()
        target = self.pilot.target
        spec = self.cond.speculation
        self.log(f"{self.condition}: loading target {target.model} ({self.dtype_name} on "
                 f"{target.device}, quantization {self.cond.quantization or 'none'})"
                 + (f", drafter {self.cond.drafter} drafting "
                    f"{spec.num_draft_tokens if spec else 4} tokens per step"
                    if self.cond.drafter else ", speculation off"))
        fault = planted_fault()  # calibration only; a bad value is an EngineError: no boot
        if fault is not None and self.cond.drafter is not None:
            self.log(f"{self.condition}: {fault.describe()}")
        if target.threads:
            torch.set_num_threads(target.threads)
        dtype = _dtype(self.dtype_name)
        self._cuda = target.device.startswith("cuda") and torch.cuda.is_available()
        before = 0
        if self._cuda:
            dev = torch.device(target.device)
            before = torch.cuda.memory_allocated(dev)
            if not self._shared:
                torch.cuda.reset_peak_memory_stats(dev)  # peaks from this condition on
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(target.model)
            self._model = AutoModelForCausalLM.from_pretrained(target.model, dtype=dtype)
            if self.cond.quantization:
                round_weights(self._model, self.cond.quantization)
            self._model.to(target.device).eval()
            if self.cond.drafter is not None:
                self._drafter = AutoModelForCausalLM.from_pretrained(
                    str(self.cond.drafter), dtype=dtype
                )
                self._drafter.to(target.device).eval()
        except (OSError, ValueError, RuntimeError) as exc:
            self.log(f"cannot load models: {exc}")
            raise EngineError(f"{self.condition}: cannot load models: {exc}") from exc
        if self._cuda:
            self._weights_bytes = torch.cuda.memory_allocated(dev) - before

        track = self._cuda and self._shared
        self._batcher = Batcher(
            self._model, self._drafter, self._draft_tokens() if self._drafter is not None else 0,
            self._eos(), self._stop_hit, _torch_thread(), self._stopping,
            on_busy=self._work_started if track else None,
            on_idle=self._work_ended if track else None, fault=fault)
        self.load_seconds = time.perf_counter() - t0
        self.log(f"ready after {self.load_seconds:.1f} s: torch {torch.__version__}, "
                 f"{torch.get_num_threads()} thread(s); serves requests in one continuous "
                 f"batch of up to {MAX_BATCH}"
                 + ("; drafts with the engine's draft loop (one drafter forward per token)"
                    if self._drafter is not None else ""))

    def _work_started(self) -> None:
        """The batch starts: the campaign runs one condition's requests at a time, so the
        peak until it drains is this condition's working memory (KV cache, activations)."""
        import torch

        dev = torch.device(self.pilot.target.device)
        torch.cuda.synchronize(dev)
        self._work_base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)

    def _work_ended(self) -> None:
        import torch

        dev = torch.device(self.pilot.target.device)
        torch.cuda.synchronize(dev)
        self._work_bytes = max(self._work_bytes,
                               torch.cuda.max_memory_allocated(dev) - self._work_base)

    def stop(self) -> None:
        self._stopping.set()
        if self._model is not None:
            largest = self._batcher.largest if self._batcher is not None else 0
            ended = f", {self._cancelled} ended early by the client" if self._cancelled else ""
            self.log(f"stopped: served {self._served} request(s), {self._failed} failed"
                     f"{ended}; at most {largest} decoded together")
        self._batcher = None
        self._model = self._drafter = self._tokenizer = None
        if self._cuda:
            import gc

            import torch

            # Hand the cached blocks back, so that the next condition's figures (one at a
            # time) do not include this one's.
            gc.collect()
            torch.cuda.empty_cache()

    # -- serving ----------------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        start = time.perf_counter()
        admitted = self._admit(request, start)
        if isinstance(admitted, GenerationResult):
            self._served += 1
            return self._counted(request, admitted)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenerationResult] = loop.create_future()

        def done(flight: Flight) -> None:  # on the torch thread
            self._served += 1
            try:
                result = self._result(flight)
            except Exception as exc:  # one bad request must not end the campaign
                result = GenerationResult.failure(f"{type(exc).__name__}: {exc}")
            result = self._counted(request, result)
            with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody waits
                loop.call_soon_threadsafe(_settle, future, result)

        admitted.on_done = done
        assert self._batcher is not None
        self._batcher.submit(admitted)
        try:
            return await future
        except asyncio.CancelledError:
            # Ctrl-C / SIGTERM: the sequence leaves the batch after the current step.
            admitted.cancel.set()
            raise

    async def score(self, prompt: str, outputs: Sequence[Sequence[int]],
                    top_k: int) -> list[list[ScoredPosition]]:
        """The target's raw distribution at every position of ``outputs`` (base.py Scorer)."""
        if self._model is None:
            raise EngineError(f"{self.condition}: engine is not started")
        ids = self._tokenizer(prompt)["input_ids"]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            _torch_thread(), score_outputs, self._model, self.pilot.target.device, list(ids),
            [list(o) for o in outputs], top_k)

    @property
    def vocab_size(self) -> int | None:
        head = self._model.get_output_embeddings() if self._model is not None else None  # width
        return int(head.weight.shape[0]) if head is not None else None

    def _counted(self, request: GenerationRequest, result: GenerationResult) -> GenerationResult:
        if result.error == CANCELLED_BY_CLIENT:
            self._cancelled += 1  # a filler its stretch no longer needed: not a failure
        elif not result.ok:
            self._failed += 1
            self.log(f"request {request.prompt_id} failed: {result.error}")
        return result

    def _admit(self, request: GenerationRequest, start: float) -> Flight | GenerationResult:
        """The request as a flight for the batch, or why it cannot be served."""
        import torch

        if self._model is None or self._batcher is None:
            return GenerationResult.failure(f"{self.condition}: engine is not started")
        prompt = self._tokenizer(request.prompt)["input_ids"]
        n_prompt = len(prompt)
        if n_prompt + request.max_new_tokens > self.pilot.target.context_length:
            return GenerationResult.failure(
                f"prompt ({n_prompt} tokens) + max_new_tokens ({request.max_new_tokens}) exceeds "
                f"target.context_length ({self.pilot.target.context_length})",
                prompt_tokens=n_prompt,
            )
        refused = unsupported(request, SAMPLING_PARAMS)
        if refused:
            return GenerationResult.failure(
                f"unsupported by the transformers engine: {', '.join(refused)}")
        generator = None
        if not request.greedy:
            generator = torch.Generator(self.pilot.target.device)
            # Seeded per request, so a sample does not depend on who shares its batch.
            generator.manual_seed(request.seed if request.seed is not None
                                  else int(torch.randint(2**62, ())))
        return Flight(request, start, list(prompt), self._processors(request, n_prompt),
                      self._warpers(request), generator, on_done=lambda _: None)

    def _result(self, flight: Flight) -> GenerationResult:
        e2e = time.perf_counter() - flight.start
        if flight.error is not None:
            return GenerationResult.failure(flight.error, e2e_s=e2e,
                                            prompt_tokens=len(flight.prompt))
        request, ids = flight.request, flight.ids
        times = token_times(flight.events)[: len(ids)]
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        cuts = [i for i in (text.find(s) for s in request.stop) if i >= 0]
        finish = flight.finish
        if cuts:  # the OpenAI/SGLang convention: the stop string is not part of the output
            text, finish = text[: min(cuts)], "stop"
        verify = flight.verify
        drafting = self._drafter is not None
        return GenerationResult(
            ok=True,
            ttft_s=times[0] if times else e2e,
            e2e_s=e2e,
            itl_s=[b - a for a, b in itertools.pairwise(times)],
            prompt_tokens=len(flight.prompt),
            output_ids=ids,
            output_text=text,
            top2_margin=flight.margins[: len(ids)] if request.want_margins else None,
            top2_ids=flight.top2[: len(ids)] if request.want_margins else None,
            spec_verify_ct=verify,
            accept_length=len(ids) / verify if verify else None,
            spec_drafts=flight.full_drafts if drafting else None,
            spec_accepted_per_position=(flight.accepted or [0] * self._draft_tokens())
            if drafting else None,
            spec_step_accepts=list(flight.step_accepts) if drafting else None,
            spec_step_drafts=list(flight.step_drafts) if drafting else None,
            finish_reason=finish,
        )

    def _stop_hit(self, ids: list[int], stops: Sequence[str]) -> bool:
        """Whether the text of ``ids`` contains a stop string: the sequence ends with the
        token that completes it, drafts accepted past it dropped, as a server stops."""
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        return any(s in text for s in stops)

    def _draft_tokens(self) -> int:
        spec = self.cond.speculation
        return spec.num_draft_tokens if spec else 4

    def _processors(self, request: GenerationRequest, n_prompt: int) -> list[Processor]:
        return sampling_processors(request, n_prompt, self._eos(), self.pilot.target.device)

    def _warpers(self, request: GenerationRequest) -> list[Processor]:
        return sampling_warpers(request)

    def _eos(self) -> set[int]:
        ids: set[int] = set()
        for eos in (self._tokenizer.eos_token_id, self._model.generation_config.eos_token_id):
            if eos is not None:
                ids.update(eos if isinstance(eos, list | tuple) else [eos])
        return {int(i) for i in ids}

    # -- facts --------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        import torch
        import transformers

        target = self.pilot.target
        device = target.device
        if device.startswith("cuda") and torch.cuda.is_available():
            device_name = torch.cuda.get_device_name(torch.device(device))
        else:
            device_name = platform.processor() or platform.machine()
        spec, memory = self.cond.speculation, self.memory_facts()
        k = (spec.num_draft_tokens if spec else 4) if self._drafter else None
        return ({} if k is None else {"speculation": fixed_k_facts(k, spec)}) | {
            "engine": "transformers",
            "version": transformers.__version__,
            "torch": torch.__version__,
            "device": device,
            "device_name": device_name,
            "dtype": self.dtype_name,
            "quantization": self.cond.quantization or "none",
            "context_length": target.context_length,
            "threads": torch.get_num_threads(),
            "model": target.model,
            "model_digest": _folder_digest(Path(target.model)),
            "drafter": str(self.cond.drafter) if self.cond.drafter else None,
            "drafter_digest": _folder_digest(self.cond.drafter) if self.cond.drafter else None,
            "num_draft_tokens": k,
            "draft_loop": "engine" if self._drafter is not None else None,
            "batching": "continuous",
            "max_batch": MAX_BATCH,
            # Read by the fairness gate as SGLang's and vLLM's caps are: above it, requests
            # wait for a place in the batch, and a level asking more is not what ran.
            "max_running_requests": MAX_BATCH,
            "load_seconds": self.load_seconds,
            "chat_template": template_digest(self._tokenizer),
            # A KV cache that grows with the batch: no fixed capacity to report.
            "kv_capacity_tokens": None,
            "memory": memory, "memory_method": memory["note"],
        }

    @property
    def tokenizer(self) -> Any:
        """The target's tokenizer (chat prompts are rendered with its template)."""
        return self._tokenizer

    def memory_facts(self) -> dict[str, Any]:
        """What :meth:`memory_mb` measures, for the fingerprint."""
        if not self._cuda:
            why = gpu_memory.unavailable() if self.pilot.target.device.startswith("cuda") else None
            return {"kind": "host", "basis": "weights", "scope": "condition", "device": None,
                    "nvml": why, "nvml_mib": None,
                    "note": "weights + buffers of the loaded models"}  # fmt: skip
        import torch

        self.memory_mb()  # fixes the basis
        dev = torch.device(self.pilot.target.device)
        props = torch.cuda.get_device_properties(dev)
        nvml = gpu_memory.usage([os.getpid()])
        basis = self._gpu_basis or "allocator"
        source = {
            "process": "NVML for this process",
            "device": "NVML for the whole device",
            "allocator": "torch's allocator only",
        }[basis]
        if self._shared:
            note = (
                f"this condition's GPU share: its weights + its peak working memory + the "
                f"process's memory outside torch's allocator ({source})"
            )
        else:
            note = f"GPU memory of this process: max of torch's reserved peak and {source}"
        return {
            "kind": "gpu",
            "basis": basis,
            "scope": "condition" if self._shared else "engine",
            "device": f"{props.name} ({props.total_memory / 2**20:.0f} MiB)",
            "nvml": gpu_memory.unavailable()
            or (nvml.note or None if nvml is not None else "NVML does not list this process"),
            "nvml_mib": nvml.mib if nvml is not None else None,
            "weights_mib": self._weights_bytes / 2**20,
            "note": note,
        }

    def memory_mb(self) -> float | None:
        if self._model is None:
            return None
        if self._cuda:
            return self._gpu_mb()
        # In-process conditions share one process, so its RSS cannot tell them apart:
        # report what each condition holds (target + drafter weights and buffers).
        total = 0
        for m in (self._model, self._drafter):
            if m is not None:
                total += sum(t.numel() * t.element_size() for t in m.parameters())
                total += sum(t.numel() * t.element_size() for t in m.buffers())
        return total / 2**20

    def _gpu_mb(self) -> float:
        import torch

        dev = torch.device(self.pilot.target.device)
        nvml = gpu_memory.usage([os.getpid()])
        if self._gpu_basis is None:
            self._gpu_basis = nvml.basis if nvml is not None else "allocator"
        nvml_mib = nvml.mib if nvml is not None and nvml.basis == self._gpu_basis else None
        if self._shared:
            # NVML minus torch's pool: the CUDA context and libraries' workspaces, which
            # this condition would need alone too.
            outside = 0.0
            if nvml_mib is not None:
                outside = max(0.0, nvml_mib - torch.cuda.memory_reserved(dev) / 2**20)
            return outside + (self._weights_bytes + self._work_bytes) / 2**20
        return max(torch.cuda.max_memory_reserved(dev) / 2**20, nvml_mib or 0.0)

    def flush(self) -> None:
        """Nothing is cached across requests in-process (a sequence's KV cache leaves the
        batch with it)."""
