"""Server process lifecycle shared by booted engines: launch, readiness, log capture, teardown.

A server is started from an argv list (never a shell) in its own session, so the whole tree
can be signalled as one process group. Teardown is SIGTERM to the group, a grace period,
then SIGKILL to whatever is left of the tree, found by pid with psutil (never by name).
Every live server sits in a module registry: ``stop_all()`` (called by the plugin at session
end) and an ``atexit`` backstop make sure nothing outlives the test session; a watchdog per
server (watchdog.py) ends its group even when this process is SIGKILLed.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import httpx
import psutil

from pytest_osprey.results import redact

from . import gpu_memory
from .base import BootSpec, EngineError
from .environment import engine_environ
from .watchdog import end_watchdog, start_watchdog

if TYPE_CHECKING:
    from pytest_osprey.pilot.schema import Pilot, Target

MASK = "***"
TAIL_LINES = 50

_LIVE: dict[int, ServerProcess] = {}
_LIVE_LOCK = threading.Lock()


def engine_python(target: Target) -> str:
    """The interpreter that runs a server engine: ``target.python`` or this one."""
    return target.python or sys.executable


def engine_env(pilot: Pilot, condition: str, boot: BootSpec) -> dict[str, str]:
    """This process's environment less anything like a credential (engines/environment.py),
    then target.env, then the condition's env, then the boot spec's env."""
    return engine_environ(pilot.target.env, pilot.conditions[condition].env, boot.env)


def api_key_from(env: Mapping[str, str], var: str | None, where: str) -> str | None:
    """The API key held by environment variable ``var``; a missing variable is an error."""
    if var is None:
        return None
    key = env.get(var)
    if not key:
        raise EngineError(f"{where}: environment variable {var} (the API key) is not set "
                          "or empty")
    redact.register(key)  # scrubbed from every record, report, log and terminal line
    return key


def choose_port(host: str, port: int, condition: str) -> int:
    """A free port on ``host`` when ``port`` is 0, else ``port`` after checking it is free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise EngineError(
                    f"condition {condition!r}: port {port} on {host} is already in use "
                    f"(another server?); free it or set target.port: 0 to pick a free one"
                ) from None
            raise EngineError(
                f"condition {condition!r}: cannot bind {host}:{port}: {exc}"
            ) from None
        return int(s.getsockname()[1])


def mask_argv(argv: Sequence[str], secrets: Sequence[str]) -> list[str]:
    """``argv`` fit for logs and records: every secret replaced by ***."""
    return [_redact(a, secrets) for a in argv]


def _redact(text: str, secrets: Sequence[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, MASK)
    return redact.scrub(text)


class ServerProcess:
    """One server process tree for one condition."""

    def __init__(
        self,
        condition: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        health_url: str,
        boot_timeout_s: float,
        secrets: Sequence[str] = (),
        health_headers: Mapping[str, str] | None = None,
        grace_s: float = 10.0,
    ) -> None:
        self.condition = condition
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.health_url = health_url
        self.boot_timeout_s = boot_timeout_s
        self.secrets = tuple(s for s in secrets if s)
        self.health_headers = dict(health_headers or {})
        self.grace_s = grace_s
        self.boot_s: float | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._pump: threading.Thread | None = None
        self._known: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self._t_launch = 0.0
        # "process" | "device" (GPU, NVML) or "rss": fixed by the first reading once the
        # server is ready, so one condition's samples never mix kinds of figure.
        self._memory_basis: str | None = None
        self._gpu: gpu_memory.Usage | None = None

    @property
    def printable_argv(self) -> list[str]:
        return mask_argv(self.argv, self.secrets)

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    # ------------------------------------------------------------------ launch

    def start(self) -> None:
        """Launch and wait until the health URL answers 200; on failure nothing is left running."""
        self.launch()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def launch(self) -> None:
        if self._popen is not None:
            raise EngineError(f"condition {self.condition!r}: server already launched")
        exe = self.argv[0]
        if shutil.which(exe, path=self.env.get("PATH")) is None:
            raise EngineError(
                f"condition {self.condition!r}: executable not found or not executable: {exe} "
                f"(check target.python)"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        header = f"# osprey: {self.condition}: {' '.join(self.printable_argv)}\n"
        self._log.write(header.encode())
        self._log.flush()
        # A secret in the server's own output (SGLang logs its args) is masked by a pump
        # thread; without secrets the server writes straight to the file.
        out: IO[bytes] | int = subprocess.PIPE if self.secrets else self._log
        self._t_launch = time.perf_counter()
        try:
            self._popen = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            self._close_log()
            raise EngineError(
                f"condition {self.condition!r}: cannot start {exe}: {exc.strerror or exc}"
            ) from None
        self._remember(self._popen.pid)
        self._watchdog = start_watchdog(self._popen.pid, self.env)
        if self.secrets:
            self._pump = threading.Thread(
                target=self._pump_output, name=f"osprey-log-{self.condition}", daemon=True
            )
            self._pump.start()
        with _LIVE_LOCK:
            _LIVE[id(self)] = self

    def _pump_output(self) -> None:
        assert self._popen is not None and self._popen.stdout is not None
        secrets = [s.encode() for s in self.secrets]
        for line in iter(self._popen.stdout.readline, b""):
            for s in secrets:
                line = line.replace(s, MASK.encode())
            line = redact.scrub_bytes(line)
            log = self._log
            if log is None:
                continue  # stopped: drain so the server never blocks on a full pipe
            with contextlib.suppress(ValueError, OSError):
                log.write(line)
                log.flush()

    def wait_ready(self) -> None:
        """Poll the health URL until 200; EngineError on early exit or timeout."""
        assert self._popen is not None
        deadline = self._t_launch + self.boot_timeout_s
        with httpx.Client(timeout=5.0, headers=self.health_headers) as client:
            while True:
                code = self._popen.poll()
                if code is not None:
                    raise EngineError(self._boot_failure(f"exited with code {code} during boot"))
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.health_url).status_code == 200:
                        self.boot_s = time.perf_counter() - self._t_launch
                        return
                self._remember_tree()
                if time.perf_counter() >= deadline:
                    raise EngineError(
                        self._boot_failure(
                            f"not healthy after {self.boot_timeout_s:g} s "
                            f"(target.boot_timeout_s; health URL {self.health_url}); "
                            f"exit code: none (still running, now stopped)"
                        )
                    )
                time.sleep(0.25)

    def _boot_failure(self, what: str) -> str:
        return (
            f"condition {self.condition!r}: server {what}\n"
            f"command: {' '.join(self.printable_argv)}\n"
            f"log: {self.log_path}\n"
            f"last {TAIL_LINES} log lines:\n{self.log_tail()}"
        )

    def log_tail(self, n: int = TAIL_LINES) -> str:
        if self._log is not None:
            with contextlib.suppress(ValueError, OSError):
                self._log.flush()
        try:
            with open(self.log_path, "rb") as f:
                lines = deque(f, maxlen=n)
        except OSError:
            return "(no log)"
        return _redact(b"".join(lines).decode("utf-8", "replace").rstrip("\n"), self.secrets)

    # ------------------------------------------------------------------ tree

    def _remember(self, pid: int) -> None:
        with contextlib.suppress(psutil.Error):
            self._known.setdefault(pid, psutil.Process(pid))

    def _remember_tree(self) -> None:
        """Record descendants while the tree is intact: a child re-parented after its
        parent died can no longer be found through the tree."""
        for proc in list(self._known.values()):
            with contextlib.suppress(psutil.Error):
                for child in proc.children(recursive=True):
                    self._known.setdefault(child.pid, child)

    def processes(self) -> list[psutil.Process]:
        """Live processes of the tree (psutil checks identity by pid and start time)."""
        self._remember_tree()
        return [p for p in self._known.values() if _alive(p)]

    def pids(self) -> set[int]:
        return {p.pid for p in self.processes()}

    def rss_mb(self) -> float | None:
        total = 0
        found = False
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
                found = True
        return total / 2**20 if found else None

    def memory_mb(self) -> float | None:
        """GPU memory of the tree where NVML sees it on a GPU, else its resident memory (MiB);
        None for a sample of another kind than the first reading's, which never mixes in."""
        pids = self.pids()
        if not pids:
            return None
        gpu = gpu_memory.usage(pids) if self._memory_basis != "rss" else None
        basis = gpu.basis if gpu is not None else "rss"
        if self._memory_basis is None and self.boot_s is not None:
            self._memory_basis = basis
        if self._memory_basis not in (None, basis):
            return None
        if gpu is not None:
            self._gpu = gpu
            return gpu.mib
        return self.rss_mb()

    def memory_facts(self) -> dict[str, Any]:
        """What :meth:`memory_mb` measures, for the engine's fingerprint."""
        self.memory_mb()
        basis = self._memory_basis or "rss"
        gpu = self._gpu
        if basis == "rss" or gpu is None:
            why = gpu_memory.unavailable() or "NVML sees none of the server's processes on a GPU"
            return {"kind": "host", "basis": "rss", "scope": "engine", "device": None,
                    "nvml": why, "nvml_mib": None,
                    "note": "resident memory of the server's process tree"}  # fmt: skip
        note = "GPU memory of the server's process tree (NVML, per process)"
        if basis == "device":
            note = f"GPU memory used on the server's devices (NVML; {gpu.note})"
        return {
            "kind": "gpu",
            "basis": basis,
            "scope": "engine",
            "device": ", ".join(d.describe() for d in gpu.devices),
            "nvml": None,
            "nvml_mib": gpu.mib,
            "gpu_pids": list(gpu.pids),
            "note": note,
        }

    # ------------------------------------------------------------------ stop

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM the group, wait ``grace_s``, SIGKILL what is left; safe to call twice."""
        grace_s = self.grace_s if grace_s is None else grace_s
        with self._lock:
            popen = self._popen
            if popen is None or self._stopped:
                self._close_log()
                return
            self._stopped = True
            procs = self.processes()
            self._signal_group(popen, signal.SIGTERM)
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    p.terminate()  # also members that left the group (setsid)
            alive = _wait_gone(procs, popen, grace_s)
            left = alive + [p for p in self.processes() if p not in alive]
            if left:
                self._signal_group(popen, signal.SIGKILL)
                for p in left:
                    with contextlib.suppress(psutil.Error):
                        p.kill()
                _wait_gone(left, popen, 5.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=5.0)
            end_watchdog(self._watchdog)
            if self._pump is not None:
                self._pump.join(timeout=5.0)
            if popen.stdout is not None:
                popen.stdout.close()
            self._close_log()
            with _LIVE_LOCK:
                _LIVE.pop(id(self), None)

    def _signal_group(self, popen: subprocess.Popen[bytes], sig: int) -> None:
        # The leader's pid is the group id (start_new_session); it stays reserved while any
        # member lives, so this cannot reach an unrelated group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, sig)

    def _close_log(self) -> None:
        log, self._log = self._log, None
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()


def _wait_gone(procs: list[psutil.Process], popen: subprocess.Popen[bytes],
               timeout: float) -> list[psutil.Process]:
    """Wait until every process is gone or a zombie; those still alive after ``timeout``.

    Not psutil.wait_procs: it waits on a zombie that is not our child (a server's own child,
    re-parented to a PID 1 that may be slow to reap, or never does) until the timeout, which
    cost every stop its whole grace period."""
    deadline = time.monotonic() + timeout
    step = 0.005
    while True:
        popen.poll()  # reaps the server itself (our child) as soon as it exits
        alive = [p for p in procs if _alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(step)
        step = min(step * 2, 0.05)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def live_servers() -> list[ServerProcess]:
    with _LIVE_LOCK:
        return list(_LIVE.values())


def stop_all(grace_s: float | None = None) -> None:
    """Stop every server this process started and has not stopped (plugin session end), all
    at once; ``grace_s`` caps each one's SIGTERM grace (an interrupted run)."""

    def stop(server: ServerProcess) -> None:
        with contextlib.suppress(Exception):
            server.stop(grace_s if grace_s is None else min(grace_s, server.grace_s))

    threads = [threading.Thread(target=stop, args=(s,), daemon=True) for s in live_servers()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


atexit.register(stop_all)
