"""The campaign: boot each condition once, warm up, replay the trace per load level in blocks.

Measurement only: every request becomes a record in records.jsonl (flushed as it goes) and
the run's facts go to campaign.json. Judging reads those files and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import platform
import random
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import __version__
from ..engines import BootSpec, Engine, EngineError, GenerationRequest, make_engine
from ..pilot.schema import Pilot
from ..pilot.trace import Prompt, Trace, render_prompt
from ..results.campaign_file import CampaignFile, ConditionRun, ScheduleEntry
from ..results.folder import SavedCampaign, load_campaign
from ..results.records import RecordWriter, RequestRecord
from .probing import run_probes

Progress = Callable[["ProgressEvent"], None]
# Early stopping, handed in by the run (the campaign measures; judging is not its business):
# called with the records so far after each block, it answers whether every candidate's
# speed is decided, and notes its looks (candidate -> look facts) for campaign.json.
StopRule = Callable[[list[RequestRecord], int], "StopLook"]


@dataclass(frozen=True)
class StopLook:
    decided: bool
    looks: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ProgressEvent:
    condition: str
    phase: str  # boot | warmup | greedy | sampled | params | done | error
    load: str = ""
    block: int = 0
    done: int = 0
    total: int = 0
    eta_s: float | None = None
    message: str = ""

    def line(self, finished: bool = False) -> str:
        """The event in words (the terminal of both adapters)."""
        if self.phase == "done":
            return f"[osprey] {self.message}"
        if self.phase in ("boot", "warmup", "error"):
            text = {"boot": "booting", "warmup": f"warming up ({self.total} requests)",
                    "error": f"FAILED: {self.message}"}[self.phase]
            return f"[osprey] {self.condition}: {text}"
        eta = f", ETA {self.eta_s:.0f}s" if self.eta_s is not None and not finished else ""
        return (f"[osprey] {self.condition} {self.phase} block {self.block + 1} load "
                f"{self.load}: {self.done}/{self.total}{eta}")


def poisson_arrivals(n: int, rate: float, seed: str) -> list[float]:
    """Arrival times (seconds from the start) of ``n`` requests of a Poisson process.

    Seeded by the level, block and pass, so every condition sees the same arrival times in
    the same block: an open-loop comparison stays paired.
    """
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def sample_seed(base: int, condition: str, prompt_id: str, index: int) -> int:
    """The seed of a condition's ``index``-th sample of a prompt: distinct per condition,
    prompt and sample.

    The distribution check compares samples that must be independent. With seeds shared
    across conditions a candidate's draws reuse the baseline's random numbers and come out
    coupled (the test loses most of its power); with seeds shared across prompts, sample i of
    every prompt draws the same random numbers, and prompts that start alike come out alike
    (seen: one identical 16-token output in half the cells of a 4-prompt run), which breaks
    the independence between prompts that the stratified test assumes.
    """
    key = f"{base}\x1f{condition}\x1f{prompt_id}\x1f{index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % 2**31


def max_new_tokens(pilot: Pilot, prompt: Prompt, override: int | None = None) -> int:
    n = override or prompt.max_new_tokens or pilot.max_new_tokens
    if pilot.max_new_tokens_cap is not None:
        n = min(n, pilot.max_new_tokens_cap)
    return n


def block_order(conditions: Sequence[str], blocks: int, order: str) -> list[list[str]]:
    """ABBA: odd blocks reverse the order, so drift over time hits every condition alike."""
    names = list(conditions)
    if order == "sequential":
        return [names] * blocks
    return [names if b % 2 == 0 else names[::-1] for b in range(blocks)]


@dataclass
class _ConditionState:
    engine: Engine | None = None
    error: str | None = None
    boot_s: float | None = None
    peak_memory_mb: float | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)


class Campaign:
    """Runs one pilot's measurements into ``directory``."""

    def __init__(
        self,
        pilot: Pilot,
        trace: Trace,
        directory: Path,
        conditions: Sequence[str],
        skipped: dict[str, str] | None = None,
        progress: Progress | None = None,
        config_text: str | None = None,
        stop_rule: StopRule | None = None,
    ) -> None:
        self.pilot = pilot
        self.trace = trace
        self.directory = directory
        self.conditions = list(conditions)
        self.skipped = dict(skipped or {})
        self.progress = progress or (lambda _e: None)
        self.run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)
        self.states = {c: _ConditionState() for c in self.conditions}
        self.schedule: list[ScheduleEntry] = []
        self.status = "running"
        self.started_at = time.time()
        self.config_text = config_text
        self.stop_rule = stop_rule
        self._writer: RecordWriter | None = None
        self._records: list[RequestRecord] = []
        self.sequential: dict[str, list[dict[str, Any]]] = {}
        self.stopped_after_block: int | None = None

    # -- the run ------------------------------------------------------------------------
    def run(self) -> SavedCampaign:
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, why in self.skipped.items():
            if name in self.states:
                self.states[name].error = f"not booted: {why}"
        self._save_meta()
        self._writer = RecordWriter(self.directory / "records.jsonl")
        try:
            asyncio.run(self._run())
            self.status = "complete"
        except BaseException:
            self.status = "interrupted"
            raise
        finally:
            for state in self.states.values():
                self._stop(state)
            self._writer.close()
            self._save_meta()
        data = load_campaign(self.directory)
        data.prompts = self.trace.by_id()
        return data

    async def _run(self) -> None:
        if self.pilot.load.order == "sequential":
            await self._run_sequential()
        else:
            await self._run_interleaved()

    async def _run_sequential(self) -> None:
        """One engine up at a time (one GPU): boot, all blocks, sampled pass, stop."""
        for name in self.conditions:
            await self._boot(name)
            for block in range(self.pilot.load.blocks):
                await self._replay_block(name, block)
                self._end_block()
            await self._sampled_pass(name)
            await self._params_pass(name)
            self._stop(self.states[name])

    async def _run_interleaved(self) -> None:
        """ABBA: every condition up at once (each booted once), blocks interleaved, with a
        group-sequential look after each block when early stopping is on."""
        load = self.pilot.load
        for name in self.conditions:
            await self._boot(name)
        for block, names in enumerate(block_order(self.conditions, load.blocks, load.order)):
            for name in names:
                await self._replay_block(name, block)
            self._end_block()
            if self.stop_rule is not None and self._interim_look(block):
                self.stopped_after_block = block
                self._save_meta()
                self.progress(ProgressEvent("all", "done", message=(
                    f"every candidate's speed is decided after block {block + 1} of "
                    f"{load.blocks}: stopping early")))
                break
        for name in self.conditions:
            await self._sampled_pass(name)
            await self._params_pass(name)

    def _end_block(self) -> None:
        assert self._writer is not None
        self._writer.sync()
        self._save_meta()

    def _interim_look(self, block: int) -> bool:
        """Look after a block (the run's stop rule): True when every candidate is decided
        and blocks remain."""
        assert self.stop_rule is not None
        look = self.stop_rule(self._records, block)
        for cand, facts in look.looks.items():
            self.sequential.setdefault(cand, []).append(facts)
        return look.decided and block + 1 < self.pilot.load.blocks

    async def _boot(self, name: str) -> None:
        state = self.states[name]
        if state.error:
            return
        self.progress(ProgressEvent(name, "boot"))
        t0 = time.perf_counter()
        env = {**self.pilot.target.env, **self.pilot.conditions[name].env}
        boot = BootSpec(condition=name, log_dir=self.directory / "logs", env=env)
        boot.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            engine = make_engine(self.pilot, name, boot)
            state.engine = engine
            try:
                await asyncio.to_thread(engine.start)
            except asyncio.CancelledError:
                # Ctrl-C: asyncio.run would wait for the boot thread (up to boot_timeout_s);
                # stopping the server ends its wait for readiness at once.
                engine.stop()
                raise
            state.boot_s = time.perf_counter() - t0
            state.fingerprint = engine.fingerprint()
            await self._warmup(name, engine)
        except EngineError as exc:
            state.error = str(exc)
            self._stop(state)
            self.progress(ProgressEvent(name, "error", message=state.error))
        self._save_meta()

    async def _warmup(self, name: str, engine: Engine) -> None:
        n = self.pilot.load.warmup_requests
        if n == 0:
            return
        self.progress(ProgressEvent(name, "warmup", total=n))
        prompts = self.trace.prompts
        for i in range(n):
            p = prompts[i % len(prompts)]
            await engine.generate(
                GenerationRequest(
                    prompt_id=p.id,
                    prompt=self._text(p, engine),
                    max_new_tokens=min(16, max_new_tokens(self.pilot, p)),
                    want_margins=False,
                    timeout_s=self.pilot.load.request_timeout_s,
                )
            )

    def _text(self, prompt: Prompt, engine: Engine) -> str:
        return render_prompt(prompt, getattr(engine, "_tokenizer", None))

    async def _replay_block(self, name: str, block: int) -> None:
        state = self.states[name]
        if state.engine is None or state.error:
            return
        if block > 0:
            try:
                await asyncio.to_thread(state.engine.flush)
            except EngineError as exc:
                self._fail(name, state, f"cache flush before block {block + 1}: {exc}")
                return
        for level in self.pilot.load.levels:
            jobs = [(p, 0) for p in self.trace.prompts]
            await self._replay(name, state, level, block, "greedy", jobs)

    async def _sampled_pass(self, name: str) -> None:
        sampled = self.pilot.sampling.sampled
        state = self.states[name]
        if not sampled.enabled or state.engine is None or state.error:
            return
        prompts = self.trace.prompts[: sampled.prompts] if sampled.prompts else self.trace.prompts
        jobs = [(p, i) for p in prompts for i in range(sampled.samples_per_prompt)]
        await self._replay(name, state, self.pilot.load.lightest(), 0, "sampled", jobs)

    async def _params_pass(self, name: str) -> None:
        """The sampling-parameters pass (pilot sampling.params), one request at a time."""
        params = self.pilot.sampling.params
        state = self.states[name]
        if not params.enabled or state.engine is None or state.error:
            return
        engine, writer = state.engine, self._writer
        assert writer is not None
        level = self.pilot.load.lightest()
        entry = ScheduleEntry(block=0, condition=name, load=level, mode="params",
                              started=time.time())

        def emit(prompt: Prompt, probe: str, settings: dict[str, Any], result: Any) -> None:
            record = RequestRecord.from_measurement(
                result, run_id=self.run_id, condition=name, block=0, repetition=0, load=level,
                concurrency=1, prompt_id=prompt.id, slice=prompt.slice, domain=prompt.domain,
                mode="params", sample_index=0, probe=probe, request=settings or None,
            )
            writer.write(record)
            self._records.append(record)

        self.progress(ProgressEvent(name, "params", level, 0, 0,
                                    min(params.prompts, len(self.trace.prompts))))
        prompts = self.trace.prompts[: params.prompts]
        await run_probes(engine, prompts, lambda p: self._text(p, engine),
                         params.max_new_tokens, self.pilot.load.request_timeout_s, emit)
        self.progress(ProgressEvent(name, "params", level, 0, len(prompts), len(prompts)))
        entry.ended = time.time()
        self.schedule.append(entry)

    async def _replay(
        self,
        name: str,
        state: _ConditionState,
        level: str,
        block: int,
        mode: str,
        jobs: list[tuple[Prompt, int]],
    ) -> None:
        engine = state.engine
        assert engine is not None and self._writer is not None
        writer = self._writer
        sampled = self.pilot.sampling.sampled
        concurrency = self.pilot.load.concurrency(level)
        rate = self.pilot.load.rate(level)
        # Closed loop: a fixed number in flight. Open loop: only the optional cap.
        sem = asyncio.Semaphore(concurrency) if concurrency else contextlib.nullcontext()
        arrivals = (
            poisson_arrivals(len(jobs), rate, f"{self.pilot.sampling.seed}:{level}:{block}:{mode}")
            if rate is not None
            else None
        )
        done = 0
        entry = ScheduleEntry(block=block, condition=name, load=level, mode=mode,
                              started=time.time())

        async def one(prompt: Prompt, index: int, arrival_s: float | None) -> None:
            nonlocal done
            lag: float | None = None
            if arrival_s is not None:
                await asyncio.sleep(max(0.0, t_start + arrival_s - time.perf_counter()))
            greedy = mode == "greedy"
            request = GenerationRequest(
                prompt_id=prompt.id,
                prompt=self._text(prompt, engine),
                max_new_tokens=max_new_tokens(
                    self.pilot, prompt, None if greedy else sampled.max_new_tokens
                ),
                temperature=0.0 if greedy else sampled.temperature,
                top_p=1.0 if greedy else sampled.top_p,
                seed=None if greedy else sample_seed(self.pilot.sampling.seed, name, prompt.id,
                                                      index),
                want_margins=True,
                timeout_s=self.pilot.load.request_timeout_s,
            )
            async with sem:
                if arrival_s is not None:
                    # How late the request left: the generator's own fidelity, and under a cap
                    # the client-side wait (not in the engine's latency).
                    lag = time.perf_counter() - (t_start + arrival_s)
                started = time.time()
                result = await engine.generate(request)
            record = RequestRecord.from_measurement(
                result, run_id=self.run_id, condition=name, block=block, repetition=block,
                load=level, concurrency=concurrency, prompt_id=prompt.id, slice=prompt.slice,
                domain=prompt.domain, mode="greedy" if greedy else "sampled",
                sample_index=index, started_at=started, rate=rate, dispatch_lag_s=lag,
            )
            writer.write(record)
            self._records.append(record)
            done += 1
            elapsed = time.perf_counter() - t_start
            self.progress(
                ProgressEvent(
                    name, mode, level, block, done, len(jobs),
                    eta_s=elapsed / done * (len(jobs) - done),
                )
            )

        async def sample_memory() -> None:
            while True:
                self._note_memory(state)
                await asyncio.sleep(0.25)

        # What exists now lives through the replay: frozen, a full collection does not walk
        # it, so no 50-100 ms collector pause lands inside a measured request. Before the
        # clock starts: open-loop arrival times count from t_start.
        gc.collect()
        gc.freeze()
        t_start = time.perf_counter()
        sampler = asyncio.create_task(sample_memory())
        try:
            await asyncio.gather(*(
                one(p, i, None if arrivals is None else arrivals[k])
                for k, (p, i) in enumerate(jobs)
            ))
        finally:
            gc.unfreeze()
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            self._note_memory(state)
        entry.ended = time.time()
        self.schedule.append(entry)
        server = getattr(engine, "server", None)
        code = server.returncode if server is not None else None
        if server is not None and code is not None:
            self._fail(name, state, f"server exited with code {code} during block {block + 1} "
                       f"({mode}, load {level}); log: {server.log_path}")

    def _fail(self, name: str, state: _ConditionState, error: str) -> None:
        """The condition cannot go on: say why (campaign.json), stop what is left of it."""
        state.error = error
        self._stop(state)
        self.progress(ProgressEvent(name, "error", message=error))
        self._save_meta()

    def _note_memory(self, state: _ConditionState) -> None:
        if state.engine is None:
            return
        mb = state.engine.memory_mb()
        if mb is not None:
            state.peak_memory_mb = max(state.peak_memory_mb or 0.0, mb)

    @staticmethod
    def _stop(state: _ConditionState) -> None:
        if state.engine is not None:
            try:
                state.engine.stop()
            finally:
                state.engine = None

    # -- campaign.json ------------------------------------------------------------------
    def _save_meta(self) -> None:
        pilot = self.pilot
        CampaignFile(
            run_id=self.run_id,
            tool_version=__version__,
            pilot_name=pilot.name,
            config_hash=pilot.digest(),
            pilot_text=self.config_text,
            trace_hash=self.trace.sha256,
            trace_files=[str(f) for f in self.trace.files],
            prompt_ids=[p.id for p in self.trace.prompts],
            baseline=pilot.baseline,
            current=pilot.current,
            candidates=[c for c in pilot.candidates if c in self.conditions],
            load_levels={k: v if isinstance(v, int) else v.model_dump(mode="json")
                         for k, v in pilot.load.levels.items()},
            blocks=pilot.load.blocks,
            block_order=block_order(self.conditions, pilot.load.blocks, pilot.load.order),
            sampling=pilot.sampling.model_dump(mode="json"),
            conditions={
                name: ConditionRun(role=pilot.conditions[name].role, error=st.error,
                                   boot_s=st.boot_s, peak_memory_mb=st.peak_memory_mb,
                                   fingerprint=st.fingerprint)
                for name, st in self.states.items()
            },
            schedule=self.schedule,
            early_stop=self.stop_rule is not None,
            sequential=self.sequential,
            stopped_after_block=self.stopped_after_block,
            status=self.status,
            started_at=self.started_at,
            ended_at=time.time() if self.status != "running" else None,
            host={"machine": platform.machine(), "node": platform.node(),
                  "python": platform.python_version()},
        ).save(self.directory)
