"""GPU memory through NVML (``pynvml``, from nvidia-ml-py): per process tree, or per device.

NVML is imported and initialised once, on first use. Without the library, the driver or a
GPU every query answers None and :func:`unavailable` says why in one line, for fingerprints
and reports; no NVML error ever reaches the caller.

Where NVML cannot give a process's own figure (``usedGpuMemory`` not available, or a
container whose pid namespace hides the host pids NVML lists), the figure falls back to the
used memory of the devices involved, and :class:`Usage.basis` says ``"device"``: that
figure includes whatever else runs on those devices.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import psutil

MIB = 2**20
_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long

Basis = Literal["process", "device"]


@dataclass(frozen=True)
class Device:
    """One GPU as NVML sees it (a MIG instance counts as one: index "gpu/instance")."""

    index: str
    name: str
    total_mib: float
    used_mib: float

    def describe(self) -> str:
        return f"{self.name} ({self.total_mib:.0f} MiB)"


@dataclass(frozen=True)
class Usage:
    """GPU memory of a set of processes, in MiB, and what the figure stands on."""

    mib: float
    basis: Basis
    devices: tuple[Device, ...]  # the devices the figure covers
    pids: tuple[int, ...]  # pids of the set that NVML lists on a GPU
    note: str = ""  # why the basis is "device"


_lock = threading.Lock()
_nvml: Any = None
_reason: str | None = None
_tried = False


def _load() -> Any:
    """The initialised pynvml module, or None (and the reason kept)."""
    global _nvml, _reason, _tried
    with _lock:
        if _tried:
            return _nvml
        _tried = True
        try:
            import pynvml
        except Exception as exc:  # ImportError, or a broken install
            _reason = f"nvidia-ml-py (module pynvml) is not importable: {_text(exc)}"
            return None
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            _reason = f"NVML did not start (no NVIDIA driver or GPU?): {_text(exc)}"
            return None
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except Exception as exc:
            count, _reason = 0, f"NVML cannot count devices: {_text(exc)}"
        if count <= 0:
            _reason = _reason or "NVML sees no GPU"
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
            return None
        _nvml = pynvml
        return _nvml


def _shutdown() -> None:
    with contextlib.suppress(Exception):
        if _nvml is not None:
            _nvml.nvmlShutdown()


atexit.register(_shutdown)


def reset() -> None:
    """Forget the NVML state so that the next query initialises again (tests)."""
    global _nvml, _reason, _tried
    _shutdown()
    with _lock:
        _nvml, _reason, _tried = None, None, False


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def unavailable() -> str | None:
    """Why NVML cannot be used here, in one line; None when it can."""
    _load()
    return _reason


def available() -> bool:
    return _load() is not None


# --------------------------------------------------------------------------- devices


def _handles(nv: Any) -> list[tuple[str, Any]]:
    """(index, handle) of every device; a GPU split by MIG is listed as its instances."""
    out: list[tuple[str, Any]] = []
    for i in range(int(nv.nvmlDeviceGetCount())):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
        except Exception:
            continue
        migs = _mig_handles(nv, handle)
        out += [(f"{i}/{j}", h) for j, h in migs] or [(str(i), handle)]
    return out


def _mig_handles(nv: Any, handle: Any) -> list[tuple[int, Any]]:
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(handle)
        if current != nv.NVML_DEVICE_MIG_ENABLE:
            return []
        slots = int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))
    except Exception:  # no MIG support (or an older binding): the whole GPU
        return []
    found = []
    for j in range(slots):
        with contextlib.suppress(Exception):  # empty slots answer NotFound
            found.append((j, nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)))
    return found


def _device(nv: Any, index: str, handle: Any) -> Device:
    name: Any = "unknown GPU"
    with contextlib.suppress(Exception):
        name = nv.nvmlDeviceGetName(handle)
    if isinstance(name, bytes):  # older bindings
        name = name.decode("utf-8", "replace")
    total = used = 0.0
    with contextlib.suppress(Exception):
        info = nv.nvmlDeviceGetMemoryInfo(handle)
        total, used = float(info.total) / MIB, float(info.used) / MIB
    return Device(index=index, name=str(name), total_mib=total, used_mib=used)


def devices() -> list[Device] | None:
    """Every device with its model name, total and used memory; None without NVML."""
    nv = _load()
    if nv is None:
        return None
    try:
        return [_device(nv, i, h) for i, h in _handles(nv)]
    except Exception:
        return None


# --------------------------------------------------------------------------- processes


def process_tree(pid: int) -> set[int]:
    """``pid`` and its live descendants (empty when ``pid`` is gone)."""
    try:
        root = psutil.Process(pid)
        return {pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:
        return set()


def usage(pids: Iterable[int]) -> Usage | None:
    """GPU memory used by ``pids`` summed over every device, or None: NVML unavailable, or
    none of the pids on a GPU (a CPU server), or no pids at all. Never raises."""
    wanted = set(pids)
    nv = _load() if wanted else None
    if nv is None:
        return None
    try:
        return _usage(nv, wanted)
    except Exception:
        return None


def _usage(nv: Any, wanted: set[int]) -> Usage | None:
    total = 0
    seen: set[int] = set()
    ours: list[Device] = []  # devices holding one of the pids
    unknown = False  # one of the pids without its own figure
    foreign: list[Device] = []  # devices listing pids this namespace cannot see
    for index, handle in _handles(nv):
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            continue
        here = hidden = False
        for proc in procs:
            pid = int(proc.pid)
            if pid in wanted:
                here = True
                seen.add(pid)
                used = getattr(proc, "usedGpuMemory", None)
                if used is None or int(used) >= _NOT_AVAILABLE:
                    unknown = True
                else:
                    total += int(used)
            elif not psutil.pid_exists(pid):
                hidden = True
        if here:
            ours.append(_device(nv, index, handle))
        elif hidden:
            foreign.append(_device(nv, index, handle))
    if ours and not unknown:
        return Usage(total / MIB, "process", tuple(ours), tuple(sorted(seen)))
    if ours:
        return _whole(
            ours, seen, "NVML gives no per-process figure here (usedGpuMemory not available)"
        )
    if foreign:
        return _whole(
            foreign,
            seen,
            "NVML lists processes by pids this pid namespace cannot see (a container?)",
        )
    return None


def _whole(devs: list[Device], seen: set[int], why: str) -> Usage:
    return Usage(
        sum(d.used_mib for d in devs), "device", tuple(devs), tuple(sorted(seen)),
        note=f"{why}: used memory of the whole device, other processes on it included",
    )  # fmt: skip
