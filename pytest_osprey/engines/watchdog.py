"""A server dies with the process that booted it, even when that process is SIGKILLed.

A SIGKILLed runner runs no ``finally``, no ``atexit``: its servers (each in a session of
its own, so a terminal's Ctrl-C does not reach them half-way) would live on, holding GPUs
and ports. So beside each server runs a tiny watchdog, a child of the runner in a session of
its own (a kill of the runner's process group spares it): it polls its parent pid, and when
that changes (the runner is gone, the watchdog re-parented) it SIGKILLs the server's whole
process group. It exits by itself once that group is gone, and the runner ends it when it
stops the server.

Why not ``prctl(PR_SET_PDEATHSIG)`` on the server: Linux sends that signal when the *thread*
that forked the child exits, and servers are booted from worker threads (the campaign's
``asyncio.to_thread``); a worker thread ending would kill a healthy server. Polling the
parent pid is tied to the process only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Mapping

POLL_S = 0.2

# -I -S: isolated, no site: starts in ~20 ms and reads nothing from the environment.
_CODE = """
import os, signal, sys, time
parent, group, poll = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
signal.signal(signal.SIGINT, signal.SIG_IGN)
try:
    while os.getppid() == parent:
        os.killpg(group, 0)  # ProcessLookupError once the group is gone: nothing to guard
        time.sleep(poll)
    os.killpg(group, signal.SIGKILL)
except (ProcessLookupError, PermissionError):
    pass
"""


def start_watchdog(server_pid: int, env: Mapping[str, str] | None = None
                   ) -> subprocess.Popen[bytes] | None:
    """A watchdog for the process group of ``server_pid`` (a session leader); None when it
    cannot start."""
    argv = [sys.executable, "-I", "-S", "-c", _CODE, str(os.getpid()), str(server_pid),
            str(POLL_S)]
    try:
        return subprocess.Popen(argv, env=dict(env) if env is not None else None,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                close_fds=True)
    except (OSError, subprocess.SubprocessError):
        return None


def end_watchdog(proc: subprocess.Popen[bytes] | None) -> None:
    """End and reap the watchdog (its server has been stopped)."""
    if proc is None:
        return
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
