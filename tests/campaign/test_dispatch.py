"""Sending a stretch: only requests already sent exist as tasks, so an interrupt with a long
stretch ahead has a handful of tasks to cancel, and every request is still sent in order."""

from __future__ import annotations

import asyncio

import pytest

from pytest_osprey.campaign.steady import dispatch


class _Server:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.sent: list[int] = []
        self.in_flight = 0
        self.most = 0

    async def send(self, k: int, _arrival: float | None) -> None:
        self.sent.append(k)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1


def test_closed_loop_sends_every_request_in_order_at_its_concurrency() -> None:
    server = _Server(0.001)
    asyncio.run(dispatch(40, 3, None, server.send))
    assert server.sent == list(range(40)) and server.most == 3


@pytest.mark.parametrize("open_loop", [False, True])
def test_an_interrupt_cancels_only_what_was_sent(open_loop: bool) -> None:
    pending = 500_000
    server = _Server(0.05)
    arrivals = [k * 0.002 for k in range(pending)] if open_loop else None
    tasks_seen: list[int] = []

    async def main() -> None:
        run = asyncio.create_task(dispatch(pending, 4, arrivals, server.send))
        for _ in range(5):
            await asyncio.sleep(0.04)
            tasks_seen.append(len(asyncio.all_tasks()))
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        tasks_seen.append(len(asyncio.all_tasks()))

    asyncio.run(main())
    # A task per request in flight (about delay / spacing = 25 open loop, 4 closed loop),
    # never one per pending request; none left once cancelled (the main task only).
    assert max(tasks_seen) < 80, tasks_seen
    assert tasks_seen[-1] == 1 and server.in_flight == 0
    assert len(server.sent) < 200


def test_a_raised_error_ends_the_stretch_and_cancels_the_rest() -> None:
    server = _Server(0.5)

    async def send(k: int, arrival: float | None) -> None:
        if k == 3:
            raise RuntimeError("the engine's client broke")
        await server.send(k, arrival)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="client broke"):
            await dispatch(10, 0, [0.001 * k for k in range(10)], send)
        await asyncio.sleep(0)
        assert len(asyncio.all_tasks()) == 1  # nothing of the stretch runs on

    asyncio.run(main())
    assert server.in_flight == 0
