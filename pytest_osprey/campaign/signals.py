"""SIGTERM as Ctrl-C: a CI cancel, ``timeout(1)`` or ``kill`` ends a run the way Ctrl-C does
(booted servers stopped, what was measured saved and reported as interrupted), and which of
the two it was is remembered for campaign.json's ``stop_reason``.

SIGINT itself is left alone: inside ``asyncio.run`` Python's own handler cancels the
campaign's task (a handler of ours would raise inside the event loop instead).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

_RECEIVED: list[str] = []


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    _RECEIVED.append("SIGTERM")
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)  # inside asyncio.run: cancels the campaign's task
    else:
        raise KeyboardInterrupt


def interrupt_reason() -> str:
    """What interrupted the run: SIGTERM when ours was seen, else Ctrl-C (SIGINT)."""
    return "SIGTERM" if _RECEIVED else "SIGINT (Ctrl-C)"


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within: SIGTERM acts as Ctrl-C (main thread only; a handler already set is kept)."""
    _RECEIVED.clear()
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL):
        yield
        return
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
