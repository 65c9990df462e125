"""Stopping several engines at once.

One after the other, each server's SIGTERM grace adds up (two servers, 10 s each, were
21-32 s after a SIGTERM; CI runners escalate to SIGKILL after about 10 s). Here every
engine stops in its own thread, and an interrupted run gives servers a short grace before
SIGKILL, so the whole run ends within a few seconds.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

from .base import Engine

INTERRUPT_GRACE_S = 2.0
"""SIGTERM-to-SIGKILL grace of a server when the run itself is interrupted."""


def stop_engines(engines: Sequence[Engine], grace_s: float | None = None) -> None:
    """Stop every engine, in parallel; ``grace_s`` caps a server's SIGTERM grace. Never
    raises (a stop that fails is the backstop's to retry)."""
    for engine in engines:
        server = engine.server
        if grace_s is not None and server is not None:
            server.grace_s = min(server.grace_s, grace_s)

    def stop(engine: Engine) -> None:
        with contextlib.suppress(Exception):
            engine.stop()

    if len(engines) == 1:
        stop(engines[0])
        return
    threads = [threading.Thread(target=stop, args=(e,), name=f"osprey-stop-{e.condition}",
                                daemon=True) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
