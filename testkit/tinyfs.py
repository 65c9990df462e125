"""A command run with a small tmpfs mounted at a folder (full disk, read-only file system),
in a user and mount namespace of its own: no root needed, nothing mounted outside it."""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


@functools.cache
def available() -> bool:
    """Whether this machine lets an unprivileged user namespace mount a tmpfs."""
    if shutil.which("unshare") is None:
        return False
    probe = "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d && rmdir $d"
    try:
        done = subprocess.run(["unshare", "-Urm", "sh", "-c", probe], capture_output=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def run_on_tmpfs(mount: Path, size_kib: int, argv: Sequence[str], *, seed: Path | None = None,
                 read_only: bool = False, env: Mapping[str, str] | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``argv`` with a ``size_kib`` tmpfs at ``mount`` (holding a copy of ``seed``'s content,
    then remounted read-only when asked)."""
    mount.mkdir(parents=True, exist_ok=True)
    steps = [f"mount -t tmpfs -o size={size_kib}k tmpfs {shlex.quote(str(mount))}"]
    if seed is not None:
        steps.append(f"cp -a {shlex.quote(str(seed))}/. {shlex.quote(str(mount))}/")
    if read_only:
        steps.append(f"mount -o remount,ro {shlex.quote(str(mount))}")
    script = " && ".join(steps) + ' && exec "$@"'
    return subprocess.run(["unshare", "-Urm", "sh", "-c", script, "sh", *argv],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def osprey(*args: str) -> list[str]:
    """``python -m pytest_osprey ARGS`` with this interpreter."""
    return [sys.executable, "-m", "pytest_osprey", *args]
