"""The campaign: boot each condition, warm up, replay the trace as the replay plan says.

Measurement only: every request becomes a record in records.jsonl (flushed as it goes) and
the run's facts go to campaign.json (:meth:`Campaign.meta`), rewritten as they change.
Judging reads those files and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..engines import BootSpec, Engine, EngineError, GenerationRequest, make_engine
from ..engines.base import Scorer
from ..engines.stopping import INTERRUPT_GRACE_S, stop_engines
from ..pilot.draw import Draw
from ..pilot.probes import SAMPLED_BY_NAME
from ..pilot.schema import Pilot
from ..pilot.selection import pass_draws
from ..pilot.trace import Prompt, Trace, render_prompt
from ..results.campaign_file import (
    CampaignFile,
    ConditionRun,
    DrawFacts,
    PinCheck,
    ScheduleEntry,
    SizeFacts,
    file_sha256,
    text_sha256,
)
from ..results.ending import greedy_runs, stop_text
from ..results.folder import SavedCampaign, load_campaign
from ..results.pins import recheck_pins
from ..results.records import Measurement, Mode, RecordWriter, RequestRecord
from ..results.scores import SCORES_FILE, ScoreLine, ScoreWriter, classes_of
from ..version import __version__
from .events import Progress, ProgressClock, ProgressEvent, StopRule, campaign_eta, pass_eta
from .probing import run_probes, run_sampled_probes
from .requests import (
    TimeoutBreaker,
    host_facts,
    host_load,
    max_new_tokens,
    occurrences,
    poisson_arrivals,
    replay_request,
    serving_seed,
    stop_reason,
)
from .schedule import ReplayPlan, Stretch, plan_facts, plan_replay
from .size import CampaignSize, campaign_size
from .steady import dispatch, filler_order, hold_load

# How long a server whose requests failed may take to be seen exited (the kernel reaps it
# after its sockets already refuse connections).
_EXIT_WAIT_S = 5.0
FILLER_CANCELLED = "cancelled: a filler no longer needed (the stretch's measured requests ended)"


async def _spec_counters(engine: Engine) -> dict[str, float] | None:
    """The engine's speculation counter snapshot, where it has one (reconciled per stretch)."""
    return await asyncio.to_thread(engine.spec_counters) or None


@dataclass
class _ConditionState:
    engine: Engine | None = None
    error: str | None = None
    boot_s: float | None = None
    peak_memory_mb: float | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)
    boot: int = 0
    pass_index: int | None = None  # the pass its engine is in (None: fresh boot)
    pins: list[PinCheck] = field(default_factory=list)
    breaker: TimeoutBreaker = field(default_factory=TimeoutBreaker)


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
        trace_draw: Draw | None = None,
        size: CampaignSize | None = None,
    ) -> None:
        self.pilot = pilot
        self.trace = trace
        # Which prompts each pass uses, drawn across the trace (recorded in campaign.json):
        # ``trace`` (trace.limit, drawn by the caller), ``sampled``, ``params``.
        self.draws = pass_draws(pilot, trace.prompts)
        if trace_draw is not None:
            self.draws = {"trace": trace_draw, **self.draws}
        self.directory = directory
        self.conditions = list(conditions)
        # The header's size and expectation, as said before the run (default: from the pilot).
        self.size = size or campaign_size(pilot, trace, len(self.conditions))
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
        self._scores = ScoreWriter(directory / SCORES_FILE)
        self._scoring_off: str | None = None  # why the sampled outputs cannot be scored
        self._records: list[RequestRecord] = []
        self.sequential: dict[str, list[dict[str, Any]]] = {}
        self.stopped_after_block: int | None = None
        self.plan = self._make_plan()
        self._look: int | None = None
        self._clock = ProgressClock()
        # condition -> (seconds, requests) of its timed requests at the lightest level: what
        # one request of its untimed passes (run there, one at a time) is expected to take
        self._request_s: dict[str, tuple[float, int]] = {}
        self.stop_reason: str | None = None
        self.records_sha256: str | None = None

    @property
    def measured(self) -> list[RequestRecord]:
        """The measured records written so far (all of them once the campaign has ended);
        fillers, written beside them to records.jsonl, are not measured work."""
        return [r for r in self._records if not r.filler]

    # -- the run ------------------------------------------------------------------------
    def _make_plan(self) -> ReplayPlan:
        load = self.pilot.load
        return plan_replay(
            [p.id for p in self.trace.prompts], self.conditions,
            {level: load.block_size(level) for level in load.levels}, load.passes,
            load.boots_per_condition, "interleaved" if load.interleaved else "sequential",
            strata={p.id: p.slice for p in self.trace.prompts}, seed=load.seed,
            fill={level: max(1, load.concurrency(level)) for level in load.levels
                  if load.rate(level) is None},  # closed loop: c measured requests a block
            level_passes=load.level_passes,
        )

    def run(self) -> SavedCampaign:
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, why in self.skipped.items():
            if name in self.states:
                self.states[name].error = f"not booted: {why}"
        self._save_meta()
        self._writer = RecordWriter(self.directory / "records.jsonl")
        try:
            asyncio.run(self._run())
            self._recheck_pins("after the campaign")
            self.status = "complete"
        except BaseException as exc:
            self.status = "interrupted"
            self.stop_reason = stop_reason(exc)
            raise
        finally:
            # Interrupted: every engine at once, with a short grace (CI kills after ~10 s).
            stop_engines([s.engine for s in self.states.values() if s.engine is not None],
                         grace_s=None if self.status == "complete" else INTERRUPT_GRACE_S)
            for state in self.states.values():
                state.engine = None
            self._writer.close()
            self._scores.close()
            # The records as this run leaves them: a merge refuses them changed afterwards.
            with contextlib.suppress(OSError):  # unreadable now: left unverified, not raised
                self.records_sha256 = file_sha256(self.directory / "records.jsonl")
            self._save_meta()
        data = load_campaign(self.directory)
        data.prompts = self.trace.by_id()
        return data

    async def _run(self) -> None:
        sampler = asyncio.create_task(self._sample_memory())
        try:
            if self.plan.order == "interleaved":
                await self._run_interleaved()
            else:
                await self._run_sequential()
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler

    async def _run_interleaved(self) -> None:
        """Every condition up at once, per boot; the plan's short stretches alternate between
        conditions; the sampled pass after the last greedy stretch."""
        boots = self.plan.boots_per_condition
        for boot in range(boots):
            for name in self.conditions:
                await self._boot(name, boot)
            stopped = await self._replay_plan([s for s in self.plan.stretches if s.boot == boot])
            for name in self.conditions:
                await self._greedy_pass(name)
            if stopped or boot == boots - 1:
                for name in self.conditions:
                    await self._sampled_pass(name)
                    await self._params_pass(name)
                # The baseline is up: it scores every condition's samples, its own included.
                scorer = self.states[self.pilot.baseline].engine
                for name in self.conditions:
                    await self._score_samples(name, scorer)
            for name in self.conditions:
                self._stop(self.states[name])
            if stopped:
                break

    async def _run_sequential(self) -> None:
        """One engine up at a time (one GPU): per boot, each condition boots, replays all its
        stretches (and, on its first boot, the sampled pass), and stops."""
        for boot in range(self.plan.boots_per_condition):
            stretches = [s for s in self.plan.stretches if s.boot == boot]
            for name in dict.fromkeys(s.condition for s in stretches):
                await self._boot(name, boot)
                stopped = await self._replay_plan([s for s in stretches if s.condition == name])
                await self._greedy_pass(name)
                if stopped:
                    self._stop(self.states[name])
                    return
                if boot == 0:
                    await self._sampled_pass(name)
                    await self._params_pass(name)
                self._stop(self.states[name])
        await self._score_after()

    async def _score_after(self) -> None:
        """One engine at a time: the baseline has stopped by the end, so it boots once more
        to score every condition's sampled outputs (the embedded engine loads the target in
        process), then stops."""
        base = self.pilot.baseline
        if not any(_to_score(r) for r in self._records) or base not in self.states:
            return
        self.progress(ProgressEvent(base, "score", message="booting the baseline once more to "
                                    "score the sampled outputs with the target"))
        boot = BootSpec(condition=base, log_dir=self.directory / "logs",
                        env={**self.pilot.target.env, **self.pilot.conditions[base].env})
        try:
            engine = make_engine(self.pilot, base, boot)
        except EngineError as exc:
            self._scoring_off = f"the baseline could not boot to score: {exc}"
            self.progress(ProgressEvent(base, "score", message=self._scoring_off))
            return
        try:
            try:
                await asyncio.to_thread(engine.start)
            except EngineError as exc:
                self._scoring_off = f"the baseline could not boot to score: {exc}"
                self.progress(ProgressEvent(base, "score", message=self._scoring_off))
                return
            for name in self.conditions:
                await self._score_samples(name, engine)
        finally:
            engine.stop()

    async def _score_samples(self, name: str, scorer: Engine | None) -> None:
        """The condition's sampled outputs (the sampled pass's and the sampled probes') scored
        by ``scorer`` (the baseline, i.e. the target) into scores.jsonl: per sample, per
        position the target's raw log-probability of the token and its top-K, and the
        position's class. Where the baseline cannot score
        (an endpoint without logprobs) nothing is written and the distribution gate keeps
        its two-sample check; the progress says why."""
        samples = [r for r in self._records if r.condition == name and _to_score(r)]
        base = self.pilot.baseline
        if not samples or self._scoring_off is not None:
            return
        if scorer is None or not isinstance(scorer, Scorer):
            self._scoring_off = ("the baseline is not up" if scorer is None
                                 else "the baseline's engine cannot score outputs")
            self.progress(ProgressEvent(base, "score", message=f"sampled outputs not scored: "
                                        f"{self._scoring_off}"))
            return
        by_prompt: dict[str, list[RequestRecord]] = {}
        for r in samples:
            by_prompt.setdefault(r.prompt_id, []).append(r)
        prompts = self.trace.by_id()
        top_k = self.pilot.sampling.sampled.score_top_k
        done = 0
        self.progress(ProgressEvent(base, "score", message=f"scoring {name}'s sampled outputs",
                                    total=len(samples)))
        for pid, records in by_prompt.items():
            try:
                scored = await scorer.score(self._text(prompts[pid], scorer),
                                            [r.output_ids for r in records], top_k)
            except EngineError as exc:
                self._scoring_off = str(exc)
                self.progress(ProgressEvent(base, "score", message=f"sampled outputs not "
                                            f"scored: {exc}"))
                return
            self._scores.write([
                ScoreLine(name, pid, r.sample_index, base, tuple(positions),
                          tuple(classes_of(r)), self.run_id, scorer.vocab_size,
                          probe=r.probe if r.mode == "params" else None)
                for r, positions in zip(records, scored, strict=True)
                if len(positions) == len(r.output_ids)])
            done += len(records)
        self.progress(ProgressEvent(base, "score", message=f"scored {name}'s sampled outputs",
                                    done=done, total=len(samples)))

    async def _replay_plan(self, stretches: Sequence[Stretch]) -> bool:
        """Replay ``stretches`` in order; True when early stopping ended the greedy passes.

        Between passes (outside any measured request) the garbage collector runs and what
        exists is frozen; within a pass it is off, so no 50-100 ms collector pause lands
        inside a measured request."""
        passes: set[tuple[int, int]] = set()
        try:
            for s in stretches:
                if self._look is not None and s.look > self._look and self._interim_look():
                    return True
                self._look = s.look
                if (s.boot, s.pass_index) not in passes:
                    passes.add((s.boot, s.pass_index))
                    self._clock.begin(s.boot, s.pass_index)
                    self._end_pass()
                    gc.enable()
                    gc.collect()
                    gc.freeze()
                    gc.disable()
                await self._replay_stretch(s)
        finally:
            gc.unfreeze()
            gc.enable()
            self._end_pass()
        return False

    def _end_pass(self) -> None:
        assert self._writer is not None
        self._writer.sync()
        self._save_meta()

    def _interim_look(self) -> bool:
        """Look after ``self._look`` (the run's stop rule): True when every candidate is
        decided and greedy passes remain."""
        assert self.stop_rule is not None or self._look is not None
        if self.stop_rule is None or self._look is None or self._look >= self.plan.looks:
            return False
        look = self.stop_rule(self._records, self._look)
        for cand, facts in look.looks.items():
            self.sequential.setdefault(cand, []).append(facts)
        if look.decided:
            self.stopped_after_block = self._look
            decisions = {c: str(f.get("decision")) for c, f in look.looks.items()}
            self.progress(ProgressEvent("all", "done", message=stop_text(
                len(self._clock.begun), self._planned_passes, decisions,
                greedy_runs(self._records))))
        self._save_meta()
        return look.decided

    async def _boot(self, name: str, boot_index: int = 0) -> None:
        state = self.states[name]
        if state.error:
            return
        self.progress(ProgressEvent(name, "boot", message=(
            f"boot {boot_index + 1} of {self.plan.boots_per_condition}"
            if self.plan.boots_per_condition > 1 else "")))
        t0 = time.perf_counter()
        env = {**self.pilot.target.env, **self.pilot.conditions[name].env}
        boot = BootSpec(condition=name, log_dir=self.directory / "logs", env=env)
        boot.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            engine = make_engine(self.pilot, name, boot)
            state.engine = engine
            state.boot = boot_index
            state.pass_index = None
            try:
                await asyncio.to_thread(engine.start)
            except asyncio.CancelledError:
                # Ctrl-C: asyncio.run would wait for the boot thread (up to boot_timeout_s);
                # stopping the server ends its wait for readiness at once.
                engine.stop()
                raise
            state.boot_s = state.boot_s or time.perf_counter() - t0
            # The pinned files as this boot loaded them: one swapped since preflight is not
            # served under the pin's name.
            state.pins += await asyncio.to_thread(recheck_pins, self.pilot, name,
                                                  f"boot {boot_index + 1}")
            if changed := [c for c in state.pins if not c.ok]:
                raise EngineError("; ".join(c.text() for c in changed))
            state.fingerprint = engine.fingerprint()
            await self._warmup(name, engine)
        except EngineError as exc:
            state.error = str(exc)
            self._stop(state)
            self.progress(ProgressEvent(name, "error", message=state.error))
        self._save_meta()

    def _recheck_pins(self, when: str) -> None:
        """Pinned files hashed once more: a change during the campaign fails the artifact
        gate (campaign.json keeps every check)."""
        for name, state in self.states.items():
            if state.error is None and self.pilot.conditions[name].pins.sha256:
                state.pins += recheck_pins(self.pilot, name, when)

    async def _warmup(self, name: str, engine: Engine) -> None:
        n = self.pilot.load.warmup_requests
        if n == 0:
            return
        self.progress(ProgressEvent(name, "warmup", total=n))
        prompts = self.trace.prompts
        serving = self.pilot.sampling.serving
        breaker = self.states[name].breaker
        for i in range(n):
            p = prompts[i % len(prompts)]
            # At the serving sampling where the timed passes run at it (its sampling kernels
            # warmed too); seeded apart from every timed request.
            sampled = serving.sampled
            result = await engine.generate(
                GenerationRequest(
                    prompt_id=p.id,
                    prompt=self._text(p, engine),
                    max_new_tokens=min(16, max_new_tokens(self.pilot, p)),
                    temperature=serving.temperature if sampled else 0.0,
                    top_p=serving.top_p if sampled else 1.0,
                    top_k=serving.top_k if sampled else None,
                    min_p=serving.min_p if sampled else 0.0,
                    ignore_eos=sampled and serving.fixed_length,
                    seed=serving_seed(self.pilot.sampling.seed, p.id, -1, -1, i)
                    if sampled else None,
                    want_margins=False,
                    timeout_s=self.pilot.load.request_timeout_s,
                )
            )
            tripped = breaker.note(result.ok, result.e2e_s, self.pilot.load.request_timeout_s)
            if tripped:
                raise EngineError(f"warm-up {tripped}")

    def _text(self, prompt: Prompt, engine: Engine) -> str:
        return render_prompt(prompt, engine.tokenizer)

    async def _replay_stretch(self, s: Stretch) -> None:
        state = self.states[s.condition]
        if state.engine is None or state.error:
            return
        if state.pass_index != s.pass_index:
            if state.pass_index is not None or s.pass_index > 0:
                # A new pass starts cold for every condition: caches of earlier passes
                # (prefix caches, KV reuse) would make later passes faster than a user sees.
                try:
                    await asyncio.to_thread(state.engine.flush)
                except EngineError as exc:
                    # A refused flush usually means the server has just died: say so.
                    died = await self._server_exit(state.engine, wait_s=_EXIT_WAIT_S)
                    self._fail(s.condition, state,
                               died or f"cache flush before pass {s.pass_index + 1}: {exc}")
                    return
            state.pass_index = s.pass_index
        prompts = self.trace.by_id()
        jobs = [(prompts[pid], 0) for pid in s.prompt_ids]
        await self._replay(s.condition, state, s.level, self.timed_mode, jobs, s)

    @property
    def timed_mode(self) -> Mode:
        """The timed passes' mode: "serving" where the pilot serves sampled, else "greedy"."""
        return "serving" if self.pilot.sampling.serving.sampled else "greedy"

    async def _greedy_pass(self, name: str) -> None:
        """Where the timed passes run at a sampled serving setting: one greedy pass of the
        trace at the lightest level, on every boot, for what only greedy output can show
        (identity against the baseline, correctness, boot consistency; margins on the first
        boot). Untimed for the verdict: a greedy speed is not the served one."""
        state = self.states[name]
        if (self.timed_mode == "greedy" or not self.pilot.sampling.greedy
                or state.engine is None or state.error
                or state.boot >= self.pilot.greedy_boots):
            return
        jobs = [(p, 0) for p in self.trace.prompts]
        await self._replay(name, state, self.pilot.load.lightest(), "greedy", jobs, None)

    async def _sampled_pass(self, name: str) -> None:
        sampled = self.pilot.sampling.sampled
        state = self.states[name]
        if not sampled.enabled or state.engine is None or state.error:
            return
        prompts = self.draws["sampled"].prompts
        jobs = [(p, i) for p in prompts for i in range(sampled.samples_per_prompt)]
        await self._replay(name, state, self.pilot.load.lightest(), "sampled", jobs, None)

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

        def emit(prompt: Prompt, probe: str, index: int, request: GenerationRequest,
                 settings: dict[str, Any], result: Any) -> None:
            record = RequestRecord.from_measurement(
                result, run_id=self.run_id, condition=name, block=0, repetition=0, load=level,
                concurrency=1, prompt_id=prompt.id, slice=prompt.slice, domain=prompt.domain,
                mode="params", sample_index=index, probe=probe, request=settings or None,
                temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
                min_p=request.min_p, seed=request.seed, ignore_eos=request.ignore_eos,
            )
            writer.write(record)
            self._records.append(record)

        prompts = self.draws["params"].prompts
        self.progress(ProgressEvent(name, "params", level, 0, 0, len(prompts)))
        await run_probes(engine, prompts, lambda p: self._text(p, engine),
                         params.max_new_tokens, self.pilot.load.request_timeout_s, emit)
        await run_sampled_probes(engine, prompts, lambda p: self._text(p, engine),
                                 self.pilot.sampling.sampled.temperature, params.samples,
                                 params.max_new_tokens, self.pilot.load.request_timeout_s,
                                 self.pilot.sampling.seed, emit)
        self.progress(ProgressEvent(name, "params", level, 0, len(prompts), len(prompts)))
        entry.ended = time.time()
        self.schedule.append(entry)

    async def _replay(
        self,
        name: str,
        state: _ConditionState,
        level: str,
        mode: Mode,
        jobs: list[tuple[Prompt, int]],
        stretch: Stretch | None,
    ) -> None:
        """One stretch: ``jobs`` of one condition at one level, ``concurrency`` in flight
        (closed loop) or arriving as a seeded Poisson process (open loop)."""
        engine = state.engine
        assert engine is not None and self._writer is not None
        writer = self._writer
        concurrency = self.pilot.load.concurrency(level)
        rate = self.pilot.load.rate(level)
        # Closed loop: a fixed number in flight. Open loop: only the optional cap.
        sem = asyncio.Semaphore(concurrency) if concurrency else contextlib.nullcontext()
        block = stretch.block if stretch is not None else 0
        pass_index = stretch.pass_index if stretch is not None else 0
        where = (f"{self.pilot.sampling.seed}:{level}:{state.boot}:{pass_index}:{block}:{mode}")
        arrivals = poisson_arrivals(len(jobs), rate, where) if rate is not None else None
        stretch_id = stretch.index if stretch is not None else -1 - len(self.schedule)
        entry = ScheduleEntry(block=block, condition=name, load=level, mode=mode,
                              started=time.time(), boot=state.boot, pass_index=pass_index,
                              stretch=stretch_id, loadavg=host_load(),
                              spec_counters=await _spec_counters(engine))

        margins = mode == "greedy" and state.boot == 0 and pass_index == 0
        failures: list[str] = []
        copies = occurrences(jobs)

        def request_for(prompt: Prompt, index: int, want_margins: bool,
                        copy: int = 0) -> GenerationRequest:
            return replay_request(self.pilot, mode, name, prompt, self._text(prompt, engine),
                                  index, want_margins=want_margins, boot=state.boot,
                                  pass_index=pass_index, copy=copy)

        def keep(result: Any, prompt: Prompt, index: int, started: float,
                 request: GenerationRequest, *, copy: int = 0, lag: float | None = None,
                 filler: bool = False) -> RequestRecord:
            record = RequestRecord.from_measurement(
                result, run_id=self.run_id, condition=name, block=block,
                repetition=pass_index, load=level, concurrency=concurrency,
                prompt_id=prompt.id, slice=prompt.slice, domain=prompt.domain,
                mode=mode, sample_index=index,
                started_at=started, rate=rate, dispatch_lag_s=lag, boot=state.boot,
                stretch=stretch_id, copy=copy, filler=filler,
                temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
                min_p=request.min_p, seed=request.seed, ignore_eos=request.ignore_eos,
            )
            writer.write(record)
            self._records.append(record)
            tripped = state.breaker.note(record.ok, record.e2e_s, request.timeout_s,
                                         concurrency or 1)
            if tripped and not state.error:
                state.error = tripped  # no more are sent; the condition stops after the stretch
            return record

        async def one(k: int, arrival_s: float | None = None) -> None:
            prompt, index = jobs[k]
            lag: float | None = None
            if arrival_s is not None:
                await asyncio.sleep(max(0.0, t_start + arrival_s - time.perf_counter()))
            request = request_for(prompt, index, margins and copies[k] == 0, copies[k])
            async with sem:
                if state.error:  # the breaker tripped: what is left of the stretch is not sent
                    unfinished[0] -= 1
                    return
                if arrival_s is not None:
                    # How late the request left: the generator's own fidelity, and under a cap
                    # the client-side wait (not in the engine's latency).
                    lag = time.perf_counter() - (t_start + arrival_s)
                started = time.time()
                result = await engine.generate(request)
            record = keep(result, prompt, index, started, request, copy=copies[k], lag=lag)
            unfinished[0] -= 1
            if not record.ok:
                failures.append(record.prompt_id)
            self._tick(name, mode, level, pass_index, record.e2e_s if record.ok else None)

        fillers = filler_order(self.trace.prompts, f"filler:{where}")
        unfinished = [len(jobs)]  # measured requests not yet ended

        async def filler() -> bool:
            """One filler (sampled like the measured requests); False once one fails (an
            engine that fails requests is not kept busy with more)."""
            if state.error:
                return False
            prompt = next(fillers)
            request = request_for(prompt, 0, False, -1)
            started, t0 = time.time(), time.perf_counter()
            try:
                result = await engine.generate(request)
            except asyncio.CancelledError:
                # Recorded as it ended, so the records stay complete.
                why = (FILLER_CANCELLED if unfinished[0] <= 0
                       else "cancelled (the run was interrupted)")
                keep(Measurement.failure(why, e2e_s=time.perf_counter() - t0), prompt, 0,
                     started, request, filler=True)
                raise
            return keep(result, prompt, 0, started, request, filler=True).ok

        # Open-loop arrival times count from t_start.
        t_start = time.perf_counter()
        if stretch is not None and mode == self.timed_mode and concurrency and rate is None:
            # Closed loop: the load held at ``concurrency`` until the last measured request
            # ends (fillers), not a block that drains as its requests finish.
            await hold_load(concurrency, len(jobs), one, filler)
        else:
            await dispatch(len(jobs), concurrency, arrivals, one)
        await self._end_stretch(name, state, engine, entry, failed=bool(failures))

    async def _end_stretch(self, name: str, state: _ConditionState, engine: Engine,
                           entry: ScheduleEntry, failed: bool) -> None:
        """After a stretch: its schedule entry closed (memory, host load, counters), and the
        condition stopped if its breaker tripped or its server died."""
        self._note_memory(state)
        entry.ended = time.time()
        entry.loadavg_end = host_load()
        entry.spec_counters_end = await _spec_counters(engine)
        self.schedule.append(entry)
        if state.error:  # the breaker tripped: the condition stops, the campaign goes on
            self._fail(name, state, state.error)
            return
        # A dying server refuses connections before the kernel reports its exit: after failed
        # requests, give it a moment, so the condition's error names the exit, not a symptom.
        died = await self._server_exit(engine, wait_s=_EXIT_WAIT_S if failed else 0.0,
                                       where=f" during pass {entry.pass_index + 1} "
                                             f"({entry.mode}, load {entry.load})")
        if died:
            self._fail(name, state, died)

    @staticmethod
    async def _server_exit(engine: Engine, wait_s: float, where: str = "") -> str | None:
        """"server exited with code N" if the engine's server process has ended (waiting up
        to ``wait_s`` for it to be reaped), else None; None for in-process engines."""
        server = engine.server
        if server is None:
            return None
        deadline = time.monotonic() + wait_s
        while (code := server.returncode) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if code is None:
            return None
        return f"server exited with code {code}{where}; log: {server.log_path}"

    @property
    def _planned_passes(self) -> int:
        return self.plan.passes * self.plan.boots_per_condition

    def _untimed_left_s(self, boot: int) -> float:
        """Expected seconds of the untimed passes still to run from ``boot`` on: the greedy
        pass beside each boot's timed passes and the sampled pass, at each condition's mean
        request time so far (the few requests of the parameters pass are not counted)."""
        sampled = self.pilot.sampling.sampled
        # The sampled pass runs after the last boot's timed passes (one engine at a time:
        # after each condition's first boot's).
        later = self.plan.order == "interleaved" or boot == 0
        n_sampled = (len(self.draws["sampled"].prompts) * sampled.samples_per_prompt
                     if sampled.enabled and later else 0)
        greedy = (len(self.trace.prompts) * max(0, self.pilot.greedy_boots - boot)
                  if self.timed_mode != "greedy" and self.pilot.sampling.greedy else 0)
        total = 0.0
        for name, (seconds, n) in self._request_s.items():
            if n and not self.states[name].error:
                total += seconds / n * (greedy + n_sampled)
        return total

    def _tick(self, name: str, mode: str, level: str, pass_index: int,
              e2e_s: float | None) -> None:
        """Progress: requests done in this timed pass (every condition), or in one
        condition's greedy (untimed) or sampled pass; a timed pass's event carries the
        whole campaign's ETA."""
        state_boot = self.states[name].boot
        timed = mode == self.timed_mode
        key = (mode if timed else f"{mode}:{name}", state_boot, pass_index)
        ended = self._clock.tick(key)
        if timed:
            total = sum(len(s.prompt_ids) for s in self.plan.stretches
                        if s.boot == state_boot and s.pass_index == pass_index)
            who = "all"
            if e2e_s is not None and level == self.pilot.load.lightest():
                seconds, n = self._request_s.get(name, (0.0, 0))
                self._request_s[name] = (seconds + e2e_s, n + 1)
        elif mode == "greedy":
            total, who = len(self.trace.prompts), name
        else:
            sampled = self.pilot.sampling.sampled
            total = len(self.draws["sampled"].prompts) * sampled.samples_per_prompt
            who = name
        done = min(ended, total)
        elapsed = self._clock.elapsed(state_boot, pass_index, timed)
        phase = "greedy (untimed)" if mode == "greedy" and not timed else mode
        eta = pass_eta(elapsed, done, total)
        whole = None
        ordinal = pass_index
        if timed:
            ordinal = state_boot * self.plan.passes + pass_index
            if done == total:
                self._clock.pass_s[(state_boot, pass_index)] = elapsed
            whole = campaign_eta(
                list(self._clock.pass_s.values()), 0.0 if done == total else eta,
                None if eta is None else elapsed + eta, self._planned_passes - ordinal - 1,
                self._untimed_left_s(state_boot))
        self.progress(ProgressEvent(
            who, phase, level if not timed else "", ordinal, done, total, eta_s=eta,
            message=f"boot {state_boot + 1}" if self.plan.boots_per_condition > 1 else "",
            passes=self._planned_passes if timed else 0, campaign_eta_s=whole))

    async def _sample_memory(self) -> None:
        while True:
            for state in self.states.values():
                self._note_memory(state)
            await asyncio.sleep(0.25)

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
    def meta(self) -> CampaignFile:
        """campaign.json as the campaign stands: the pilot, the plan, each condition's boots,
        the schedule and the status."""
        pilot = self.pilot
        return CampaignFile(
            run_id=self.run_id,
            tool_version=__version__,
            pilot_name=pilot.name,
            config_hash=pilot.digest(),
            pilot_text=self.config_text,
            pilot_text_sha256=text_sha256(self.config_text),
            trace_hash=self.trace.sha256,
            records_sha256=self.records_sha256,
            trace_files=[str(f) for f in self.trace.files],
            prompt_ids=[p.id for p in self.trace.prompts],
            baseline=pilot.baseline,
            current=pilot.current,
            candidates=[n for n in pilot.candidates if n in self.conditions],
            load_levels={k: v if isinstance(v, int) else v.model_dump(mode="json")
                         for k, v in pilot.load.levels.items()},
            blocks=self.plan.passes,
            plan=plan_facts(self.plan),
            warmup_requests=pilot.load.warmup_requests,
            order=pilot.load.order,
            sampling=pilot.sampling.model_dump(mode="json"),
            conditions={
                name: ConditionRun(role=pilot.conditions[name].role, error=st.error,
                                   boot_s=st.boot_s, peak_memory_mb=st.peak_memory_mb,
                                   fingerprint=st.fingerprint, pins=st.pins)
                for name, st in self.states.items()
            },
            schedule=self.schedule,
            early_stop=self.stop_rule is not None,
            sequential=self.sequential,
            stopped_after_block=self.stopped_after_block,
            draws={k: DrawFacts.model_validate(d.facts()) for k, d in self.draws.items()},
            size=SizeFacts.model_validate(self.size.facts()),
            status=self.status,
            stop_reason=self.stop_reason,
            writer_pid=os.getpid(),
            started_at=self.started_at,
            ended_at=time.time() if self.status != "running" else None,
            host=host_facts(),
        )

    def _save_meta(self) -> None:
        self.meta().save(self.directory)


def _to_score(r: RequestRecord) -> bool:
    """A sampled output the target scores: the sampled pass's, or a sampled probe's."""
    return r.ok and bool(r.output_ids) and (
        r.mode == "sampled" or (r.mode == "params" and r.probe in SAMPLED_BY_NAME))
