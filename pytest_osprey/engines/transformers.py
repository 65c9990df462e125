"""The embedded engine: transformers in-process, real speculative decoding via assisted generation.

Batch size 1: requests are served one at a time behind a lock, so under concurrency they
queue, and their latency (timed from submission) includes the queueing, as users feel it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import itertools
import os
import platform
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import draft_loop, gpu_memory
from .base import BootSpec, EngineError, GenerationRequest, GenerationResult, unsupported
from .chat_template import template_digest
from .generation_hooks import (
    CancelCriterion,
    LogitBias,
    OpenAIPenalties,
    StopStrings,
    StreamerClock,
)
from .quantize import round_weights

if TYPE_CHECKING:
    import torch

    from ..pilot.schema import Pilot

ALGORITHMS = ("assisted",)
# transformers has no constrained decoding of its own (json_schema, regex).
SAMPLING_PARAMS = frozenset({"frequency_penalty", "presence_penalty", "repetition_penalty",
                             "stop", "min_new_tokens", "logit_bias"})










def _dtype(name: str) -> torch.dtype:
    import torch

    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float64": torch.float64,
    }
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


class TransformersEngine:
    """One condition served by ``model.generate`` (with ``assistant_model`` when it drafts)."""

    def __init__(self, pilot: Pilot, condition: str, boot: BootSpec) -> None:
        self.pilot = pilot
        self.condition = condition
        self.cond = pilot.conditions[condition]
        self.boot = boot
        self.dtype_name = self.cond.dtype or pilot.target.dtype
        self._queue: asyncio.Lock | None = None
        self._queue_loop: asyncio.AbstractEventLoop | None = None
        self._model: Any = None
        self._drafter: Any = None
        self._draft_loop = False  # drafting with the engine's own loop (draft_loop.install)
        self._tokenizer: Any = None
        self._forwards = 0
        self._hook: Any = None
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
        self._served = self._failed = 0
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
                self._draft_loop = draft_loop.attach(self._model, self._drafter,
                                                     self._draft_tokens())
        except (OSError, ValueError, RuntimeError) as exc:
            self.log(f"cannot load models: {exc}")
            raise EngineError(f"{self.condition}: cannot load models: {exc}") from exc
        if self._cuda:
            self._weights_bytes = torch.cuda.memory_allocated(dev) - before

        def count(*_: Any) -> None:
            self._forwards += 1

        # Every target forward is one verify step (the prefill doubles as the first).
        self._hook = self._model.register_forward_hook(count)
        self.load_seconds = time.perf_counter() - t0
        self.log(f"ready after {self.load_seconds:.1f} s: torch {torch.__version__}, "
                 f"{torch.get_num_threads()} thread(s); serves one request at a time"
                 + (draft_loop.describe(self._draft_loop) if self._drafter is not None else ""))

    def stop(self) -> None:
        self._stopping.set()
        if self._model is not None:
            self.log(f"stopped: served {self._served} request(s), {self._failed} failed")
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
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
        loop = asyncio.get_running_loop()
        if self._queue is None or self._queue_loop is not loop:
            self._queue, self._queue_loop = asyncio.Lock(), loop
        # asyncio.Lock serves waiters first-come first-served, so a prompt's place in the
        # queue is the same in every condition: paired comparisons stay fair under load.
        async with self._queue:
            cancel = threading.Event()
            try:
                return await loop.run_in_executor(
                    _torch_thread(), self._generate_guarded, request, start, cancel)
            except asyncio.CancelledError:
                # Ctrl-C / SIGTERM: the thread would otherwise generate to the end (seconds
                # to minutes) while the run waits for it; it stops after its current step.
                cancel.set()
                raise

    def _generate_guarded(self, request: GenerationRequest, start: float,
                          cancel: threading.Event | None = None) -> GenerationResult:
        self._served += 1
        try:
            result = self._generate(request, start, cancel or threading.Event())
        except Exception as exc:  # one bad request must not end the campaign
            result = GenerationResult.failure(
                f"{type(exc).__name__}: {exc}", e2e_s=time.perf_counter() - start
            )
        if not result.ok:
            self._failed += 1
            self.log(f"request {request.prompt_id} failed: {result.error}")
        return result

    def _generate(self, request: GenerationRequest, start: float,
                  cancel: threading.Event) -> GenerationResult:
        import torch
        from transformers import StoppingCriteriaList

        if self._model is None:
            raise EngineError(f"{self.condition}: engine is not started")
        device = self.pilot.target.device
        enc = self._tokenizer(request.prompt, return_tensors="pt").to(device)
        n_prompt = int(enc["input_ids"].shape[1])
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
        clock = StreamerClock(start)
        kwargs: dict[str, Any] = {
            "max_new_tokens": request.max_new_tokens,
            "streamer": clock,
            "return_dict_in_generate": True,
            "output_logits": request.want_margins,
            "pad_token_id": self._tokenizer.pad_token_id,
            "stopping_criteria": StoppingCriteriaList([CancelCriterion(cancel, self._stopping)]),
        }
        if request.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=request.temperature, top_p=request.top_p)
            kwargs["top_k"] = 0  # transformers defaults to top-k 50; engines sample the full vocab
            if request.seed is not None:
                torch.manual_seed(request.seed)
        self._sampling_params(request, n_prompt, kwargs)
        if self._drafter is not None:
            kwargs["assistant_model"] = self._drafter
        self._forwards = 0
        track = self._cuda and self._shared
        if track:
            # The campaign runs one condition's requests at a time, so the peak over this
            # call is this condition's working memory (KV cache, activations, logits).
            dev = torch.device(device)
            torch.cuda.synchronize(dev)
            base = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        with torch.inference_mode():
            out = self._model.generate(**enc, **kwargs)
        if cancel.is_set() or self._stopping.is_set():
            return GenerationResult.failure("cancelled (the run was interrupted)",
                                            e2e_s=time.perf_counter() - start)
        if track:
            torch.cuda.synchronize(dev)
            self._work_bytes = max(self._work_bytes, torch.cuda.max_memory_allocated(dev) - base)
        e2e = time.perf_counter() - start
        ids = out.sequences[0, n_prompt:].tolist()
        if request.stop:
            ids = self._through_stop(ids, request.stop)
        margins = top2_ids = None
        if request.want_margins and out.logits is not None:
            lp = torch.log_softmax(torch.stack(out.logits)[:, 0, :].float(), dim=-1)
            top2 = lp.topk(2, dim=-1)
            margins = (top2.values[:, 0] - top2.values[:, 1]).tolist()[: len(ids)]
            top2_ids = top2.indices.tolist()[: len(ids)]
        times = clock.token_times()[: len(ids)]
        verify = self._forwards
        accepted = None
        if self._drafter is not None:
            accepted = clock.acceptance(self._draft_tokens(), request.max_new_tokens)
        eos = self._tokenizer.eos_token_id
        finish = "stop" if ids and eos is not None and ids[-1] == eos else "length"
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        cuts = [i for i in (text.find(s) for s in request.stop) if i >= 0]
        if cuts:  # the OpenAI/SGLang convention: the stop string is not part of the output
            text, finish = text[: min(cuts)], "stop"
        return GenerationResult(
            ok=True,
            ttft_s=times[0] if times else e2e,
            e2e_s=e2e,
            itl_s=[b - a for a, b in itertools.pairwise(times)],
            prompt_tokens=n_prompt,
            output_ids=ids,
            output_text=text,
            top2_margin=margins,
            top2_ids=top2_ids,
            spec_verify_ct=verify,
            accept_length=len(ids) / verify if verify else None,
            spec_drafts=accepted[0] if accepted else None,
            spec_accepted_per_position=accepted[1] if accepted else None,
            finish_reason=finish,
        )

    def _through_stop(self, ids: list[int], stops: tuple[str, ...] | list[str]) -> list[int]:
        """The tokens up to the one that completes the first stop string. A verify step can
        accept drafts past it: a server stops there, and so must the comparison."""
        for n in range(1, len(ids) + 1):
            text = self._tokenizer.decode(ids[:n], skip_special_tokens=True)
            if any(s in text for s in stops):
                return ids[:n]
        return ids

    def _draft_tokens(self) -> int:
        spec = self.cond.speculation
        return spec.num_draft_tokens if spec else 4

    def _sampling_params(self, request: GenerationRequest, n_prompt: int,
                         kwargs: dict[str, Any]) -> None:
        """Map the request's extra sampling parameters onto generate()."""
        from transformers import LogitsProcessorList

        processors: list[Any] = []
        if request.frequency_penalty or request.presence_penalty:
            processors.append(OpenAIPenalties(n_prompt, request.frequency_penalty,
                                               request.presence_penalty))
        if request.logit_bias:
            processors.append(LogitBias({int(k): float(v)
                                          for k, v in request.logit_bias.items()}))
        if processors:
            kwargs["logits_processor"] = LogitsProcessorList(processors)
        if request.repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = request.repetition_penalty
        if request.min_new_tokens:
            kwargs["min_new_tokens"] = request.min_new_tokens
        if request.stop:
            kwargs["stopping_criteria"].append(
                StopStrings(self._tokenizer, n_prompt, list(request.stop)))

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
        spec = self.cond.speculation
        memory = self.memory_facts()
        return {
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
            "num_draft_tokens": (spec.num_draft_tokens if spec else 4) if self._drafter else None,
            "draft_loop": (("engine" if self._draft_loop else "transformers")
                           if self._drafter is not None else None),
            "load_seconds": self.load_seconds,
            "chat_template": template_digest(self._tokenizer),
            # A dynamic KV cache per request: no fixed capacity to report.
            "kv_capacity_tokens": None,
            "memory": memory,
            "memory_method": memory["note"],
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
        """Nothing is cached across requests in-process (a fresh KV cache per generate)."""
