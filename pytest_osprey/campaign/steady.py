"""A closed-loop stretch that holds its load: ``concurrency`` requests in flight from the
first measured request's start to the last one's end.

Sending a block of ``c`` prompts and waiting for all of them drains the batch: as requests
finish, fewer remain, and the last ones ran nearly alone (a measured x4 averaged 3.3 in
flight). Here ``c`` workers take the measured requests in order; once none is left to send,
each worker sends fillers (recorded, never judged) until every measured request has
finished, and the fillers still in flight are then cancelled.

Cancelling rather than letting them finish: an HTTP engine aborts a request whose stream is
closed (SGLang and vLLM both abort on disconnect), and the embedded engine stops a
cancelled generation after its current step, so nothing of a filler runs on into the next
stretch beyond one decoding step, and the campaign does not spend a filler's whole length
per stretch waiting for output nobody reads.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def filler_order(items: Sequence[T], seed: str) -> Iterator[T]:
    """``items`` in a seeded shuffled order, cycled without end (every condition replaying
    the same stretch draws the same fillers in the same order)."""
    if not items:
        return
    rng = random.Random(seed)
    while True:
        order = list(items)
        rng.shuffle(order)
        yield from order


async def hold_load(
    concurrency: int,
    measured: int,
    send_measured: Callable[[int], Awaitable[None]],
    send_filler: Callable[[], Awaitable[bool]],
) -> None:
    """Send measured requests ``0 .. measured-1`` (``send_measured(k)``) with ``concurrency``
    workers, then fillers (``send_filler()``, False: stop filling, e.g. the engine fails
    them) until every measured request has finished; fillers still running are cancelled
    (``send_filler`` records its own cancellation)."""
    queue = list(range(measured))[::-1]
    left = measured
    done = asyncio.Event()
    failed: list[BaseException] = []
    if not measured:
        done.set()

    async def worker() -> None:
        nonlocal left
        try:
            while queue:
                await send_measured(queue.pop())
                left -= 1
                if left == 0:
                    done.set()
            while not done.is_set():
                if not await send_filler():
                    return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # raised (not a failed request): end the stretch
            failed.append(exc)
            done.set()

    workers = [asyncio.create_task(worker()) for _ in range(max(1, concurrency))]
    try:
        await done.wait()
    finally:
        # Once every measured request has finished only fillers are left running.
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    if failed:
        raise failed[0]


async def dispatch(
    count: int,
    concurrency: int,
    arrivals: Sequence[float] | None,
    send: Callable[[int, float | None], Coroutine[Any, Any, None]],
) -> None:
    """Send requests ``0 .. count-1`` (``send(k, arrival_s)``) without a task per pending
    request: closed loop, ``concurrency`` workers take the next index; open loop, each request
    is started at its arrival time (offsets in seconds from now; ``send`` applies any cap).

    Only requests already sent are tasks, so an interrupt with a long stretch still ahead
    cancels a handful of tasks, not one per request of the stretch."""
    if arrivals is None:
        indices = iter(range(count))

        async def worker() -> None:
            for k in indices:
                await send(k, None)

        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency or count, count)))))
        return
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    started: list[asyncio.Task[None]] = []
    try:
        for k in range(count):
            await asyncio.sleep(max(0.0, t0 + arrivals[k] - loop.time()))
            started.append(asyncio.create_task(send(k, arrivals[k])))
            # Finished requests are let go of: the list holds the ones in flight.
            if len(started) > 64:
                started = [t for t in started
                           if not t.done() or t.cancelled() or t.exception() is not None]
        await asyncio.gather(*started)
    finally:
        for t in started:
            t.cancel()
