"""The embedded engine's server loop: continuous batching, with speculation verified per sequence.

Requests join a running batch as they arrive and leave it as they finish. A sequence joins with
its prefill run on its own (with a drafter, the drafter drafts from the prompt first and the
prefill verifies those drafts, as assisted generation does), then its caches are merged into the
batch's. Each later step drafts up to ``k`` tokens for every sequence with the drafter (one
drafter forward per draft position, over the whole batch), then runs the target once over the
batch to verify them: greedy keeps the longest prefix the target agrees with plus the target's
own next token; sampling accepts or resamples by speculative sampling against the drafter's
distribution, so outputs are drawn from the target's. Without a drafter a step is one batched
decode. Each sequence keeps its own sampling state (processors, seeded generator), so what it
generates does not depend on who else is in the batch.

Everything runs on one thread (torch's threads belong to the thread that calls them); the loop
runs while sequences are in flight and hands the thread back when the batch drains.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..base import GenerationRequest
from .kv_rows import KVRows
from .planted_faults import PlantedFault

if TYPE_CHECKING:
    import torch

CANCELLED_BY_CLIENT = "cancelled by the client"
MAX_BATCH = 128
"""Sequences decoded together at most; later arrivals wait, first come first served."""

Processor = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""transformers' logits-processor call: (ids [1, length], scores [1, vocab]) -> scores."""


@dataclass(eq=False)
class Flight:
    """One request in flight: its tokens, the state of its caches, and what it measured."""

    request: GenerationRequest
    start: float  # perf_counter() at submission
    prompt: list[int]
    processors: list[Processor]
    warpers: list[Processor]  # temperature, top-p: sampled requests only
    generator: torch.Generator | None  # sampled requests only
    on_done: Callable[[Flight], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    ids: list[int] = field(default_factory=list)
    to_target: list[int] = field(default_factory=list)  # tokens not yet in the target's cache
    to_drafter: list[int] = field(default_factory=list)  # ... nor in the drafter's
    events: list[tuple[float, int]] = field(default_factory=list)  # (s from start, tokens)
    margins: list[float] = field(default_factory=list)
    top2: list[list[int]] = field(default_factory=list)
    verify: int = 0  # target forwards this sequence took part in
    full_drafts: int = 0  # verify steps that checked all k drafts
    accepted: list[int] = field(default_factory=list)  # per draft position, of those steps
    step_drafts: list[int] = field(default_factory=list)  # per verify step: drafts checked
    step_accepts: list[int] = field(default_factory=list)  # ... and of those, accepted
    finish: str | None = None  # "stop" or "length" once done
    error: str | None = None
    settled: bool = False

    def __post_init__(self) -> None:
        self.to_target = list(self.prompt)
        self.to_drafter = list(self.prompt)

    def settle(self) -> None:
        """Hand the finished flight to whoever waits for it, once."""
        if not self.settled:
            self.settled = True
            self.on_done(self)

    @property
    def done(self) -> bool:
        return self.finish is not None or self.error is not None


@dataclass
class Drafts:
    tokens: list[int] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)  # the drafter's q, when sampling
    columns: list[int] = field(default_factory=list)  # drafter cache columns of fed drafts
    proposed: int = 0  # the budget asked for (min(k, tokens left - 1))


class Batcher:
    """Serves flights of one condition on ``executor``'s thread, as one continuous batch."""

    def __init__(self, target: Any, drafter: Any | None, k: int, eos: set[int],
                 stop_hit: Callable[[list[int], Sequence[str]], bool],
                 executor: concurrent.futures.ThreadPoolExecutor, stopping: threading.Event,
                 max_batch: int = MAX_BATCH,
                 on_busy: Callable[[], None] | None = None,
                 on_idle: Callable[[], None] | None = None,
                 fault: PlantedFault | None = None) -> None:
        self.target, self.drafter, self.k = target, drafter, k
        self.fault = fault  # a planted verification fault (calibration only), or None
        self.eos = eos
        self.stop_hit = stop_hit  # whether these output ids' text contains a stop string
        self.executor = executor
        self.stopping = stopping
        self.max_batch = max_batch
        self.on_busy, self.on_idle = on_busy, on_idle
        self._lock = threading.Lock()
        self._waiting: collections.deque[Flight] = collections.deque()
        self._running = False
        self.largest = 0  # the most sequences decoded together so far

    def submit(self, flight: Flight) -> None:
        with self._lock:
            self._waiting.append(flight)
            if self._running:
                return
            self._running = True
        self.executor.submit(self._run)

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        import torch

        if self.on_busy:
            self.on_busy()
        flights: list[Flight] = []
        target = KVRows(self.target)
        drafter = KVRows(self.drafter) if self.drafter is not None else None
        with torch.inference_mode():
            while True:
                with self._lock:
                    joining = [self._waiting.popleft() for _ in
                               range(min(len(self._waiting), self.max_batch - len(flights)))]
                    if not flights and not joining:
                        self._running = False
                        break
                try:
                    self._join(joining, flights, target, drafter)
                    if flights:
                        self.largest = max(self.largest, len(flights))
                        self._step(flights, target, drafter)
                except Exception as exc:  # a failed step fails its batch, never later requests
                    for f in flights + joining:
                        if not f.done:
                            f.error = f"{type(exc).__name__}: {exc}"
                        f.settle()
                    flights = []
                    target = KVRows(self.target)
                    drafter = KVRows(self.drafter) if self.drafter is not None else None
                    continue
                self._leave(flights, target, drafter)
        if self.on_idle:
            self.on_idle()

    def _join(self, joining: list[Flight], flights: list[Flight], target: KVRows,
              drafter: KVRows | None) -> None:
        """Prefill each of ``joining`` on its own caches, then merge them into the batch's."""
        own: list[KVRows] = []
        own_draft: list[KVRows] = []
        for flight in joining:
            if self._interrupted(flight):
                flight.settle()
                continue
            caches = KVRows(self.target, 1), (KVRows(self.drafter, 1)
                                              if self.drafter is not None else None)
            try:
                self._step([flight], *caches)
            except Exception as exc:  # one bad request must not end the batch
                flight.error = f"{type(exc).__name__}: {exc}"
            if flight.done:
                flight.settle()
                continue
            own.append(caches[0])
            if caches[1] is not None:
                own_draft.append(caches[1])
            flights.append(flight)
        target.absorb(own)
        if drafter is not None:
            drafter.absorb(own_draft)

    def _leave(self, flights: list[Flight], target: KVRows, drafter: KVRows | None) -> None:
        for f in flights:
            self._interrupted(f)
        if not any(f.done for f in flights):
            return
        keep = [i for i, f in enumerate(flights) if not f.done]
        for f in flights:
            if f.done:
                f.settle()
        target.keep_rows(keep)
        if drafter is not None:
            drafter.keep_rows(keep)
        flights[:] = [flights[i] for i in keep]

    def _interrupted(self, flight: Flight) -> bool:
        if not flight.done and self.stopping.is_set():
            flight.error = "cancelled (the run was interrupted)"
        elif not flight.done and flight.cancel.is_set():
            # The client stopped waiting: a filler ended with its stretch, by design.
            flight.error = CANCELLED_BY_CLIENT
        return flight.done

    # -- one step ---------------------------------------------------------------------------
    def _step(self, flights: list[Flight], target: KVRows, drafter: KVRows | None) -> None:
        drafts = self._draft(flights, drafter) if drafter is not None else [
            Drafts() for _ in flights]
        feed = [f.to_target + d.tokens for f, d in zip(flights, drafts, strict=True)]
        logits, first, offset = target.forward(feed, [len(f.to_target) - 1 for f in flights])
        now = time.perf_counter()
        for b, (f, d) in enumerate(zip(flights, drafts, strict=True)):
            at = len(f.to_target) - 1 - offset
            raw = logits[b, at: at + len(d.tokens) + 1].float()
            m, token = self._verify(f, d, raw)
            target.drop(b, list(range(first + len(f.to_target) + m,
                                      first + len(f.to_target) + len(d.tokens))))
            emitted = [*d.tokens[:m], token]
            if drafter is not None:
                if d.proposed:
                    kept = min(m, len(d.columns))
                    drafter.drop(b, d.columns[kept:])
                    f.to_drafter = [*d.tokens[kept:m], token]
                else:
                    f.to_drafter = f.to_drafter + emitted
            f.to_target = [token]
            f.verify += 1
            f.step_drafts.append(len(d.tokens))
            f.step_accepts.append(m)
            if d.proposed == self.k and self.k > 0:
                f.full_drafts += 1
                if len(f.accepted) < self.k:
                    f.accepted = [0] * self.k
                for j in range(m):
                    f.accepted[j] += 1
            self._emit(f, emitted, raw, now)

    def _draft(self, flights: list[Flight], drafter: KVRows) -> list[Drafts]:
        """Up to ``k`` drafts per sequence, one drafter forward per draft position."""
        import torch

        out = [Drafts(proposed=max(0, min(self.k, f.request.max_new_tokens - len(f.ids) - 1)))
               for f in flights]
        feed = [f.to_drafter if d.proposed else [] for f, d in zip(flights, out, strict=True)]
        for j in range(self.k):
            if not any(feed):
                break
            logits, first, offset = drafter.forward(
                feed, [len(t) - 1 if t else None for t in feed])
            for b, (f, d) in enumerate(zip(flights, out, strict=True)):
                if not feed[b]:
                    continue
                if j > 0:
                    d.columns.append(first)  # the draft just fed
                scores = self._scores(f, f.ids + d.tokens, logits[b, len(feed[b]) - 1 - offset])
                if f.generator is None:
                    token, q = int(scores.argmax()), None
                else:
                    q = torch.softmax(scores, dim=-1)
                    token = int(torch.multinomial(q, 1, generator=f.generator))
                d.tokens.append(token)
                if q is not None:
                    d.probs.append(q)
                more = len(d.tokens) < d.proposed and (token not in self.eos
                                                       or f.request.ignore_eos)
                feed[b] = [token] if more else []
        return out

    def _scores(self, f: Flight, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        """The request's processors (and, sampling, its warpers) over one position's logits."""
        import torch

        scores = logits.float()[None]
        chain = f.processors + f.warpers
        if chain:
            ids = torch.tensor([f.prompt + generated], dtype=torch.long, device=scores.device)
            for p in chain:
                scores = p(ids, scores)
        return scores[0]

    def _faulty(self, f: Flight, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        """A drafted position's scores as the planted fault verifies it (sampled requests)."""
        import torch

        assert self.fault is not None
        ids = torch.tensor([f.prompt + generated], dtype=torch.long, device=logits.device)
        return self.fault.scores(ids, logits.float()[None], f.processors, f.warpers,
                                 f.generator)[0]

    def _verify(self, f: Flight, d: Drafts, raw: torch.Tensor) -> tuple[int, int]:
        """(drafts accepted, the target's own next token) from the target's logits at the
        position before each draft and after the last."""
        import torch

        for j, drafted in enumerate(d.tokens):
            if self.fault is not None and self.fault.unverified:
                continue
            scores = self._scores(f, f.ids + d.tokens[:j], raw[j])
            if f.generator is None or (self.fault is not None and self.fault.greedy):
                best = int(scores.argmax())
                if best != drafted:
                    return j, best
                continue
            if self.fault is not None:
                scores = self._faulty(f, f.ids + d.tokens[:j], raw[j])
            p = torch.softmax(scores, dim=-1)
            q = d.probs[j]
            u = float(torch.rand((), generator=f.generator, device=f.generator.device))
            if u * float(q[drafted]) < float(p[drafted]):
                continue
            residual = (p - q).clamp_min(0)
            if float(residual.sum()) <= 0:
                residual = p
            return j, int(torch.multinomial(residual, 1, generator=f.generator))
        n = len(d.tokens)
        scores = self._scores(f, f.ids + d.tokens, raw[n])
        if f.generator is None:
            return n, int(scores.argmax())
        return n, int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=f.generator))

    def _emit(self, f: Flight, tokens: list[int], raw: torch.Tensor, now: float) -> None:
        """Append the step's tokens up to the first that ends the sequence (end of sequence,
        a stop string completed, max_new_tokens), timing them as one chunk."""
        import torch

        n = 0
        for token in tokens:
            f.ids.append(token)
            n += 1
            if (token in self.eos and not f.request.ignore_eos) or (
                    f.request.stop and self.stop_hit(f.ids, f.request.stop)):
                f.finish = "stop"
            elif len(f.ids) >= f.request.max_new_tokens:
                f.finish = "length"
            if f.finish:
                break
        f.events.append((now - f.start, n))
        if f.request.want_margins:
            top = torch.log_softmax(raw[:n], dim=-1).topk(2, dim=-1)
            f.margins.extend((top.values[:, 0] - top.values[:, 1]).tolist())
            f.top2.extend(top.indices.tolist())
