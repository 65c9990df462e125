"""Where a run writes: results folders are never reused silently, and every filesystem problem
is one line.

- A run measures into a new folder: the default is ``osprey-results/<name>-<time>/`` (made
  exclusively: two runs in the same second get two folders); a folder named by the user must
  be empty or not exist yet. A non-empty one is refused, saying what is there and how to
  choose another, so an earlier run's records, campaign.json and reports are never replaced.
- The run claims its folder atomically: ``run.lock`` is created exclusively (``O_EXCL``) once
  the folder is seen empty, so of two runs started at once into one folder exactly one
  proceeds, and the other is refused before it records anything. The finished run removes
  its lock.
- Re-judging a saved campaign writes a marked copy into ``<folder>/rejudged-<UTC time>/``
  (or into a new folder the user names), so the original summary and reports stay as they
  were.
"""

from __future__ import annotations

import errno
import os
from datetime import UTC, datetime
from pathlib import Path


class FolderError(ValueError):
    """A results folder that cannot be used; the message is one line naming it."""


def why(exc: BaseException) -> str:
    """An OS error in words, without the Python noise (``[Errno 28] ...``)."""
    if isinstance(exc, OSError):
        text = exc.strerror or os.strerror(exc.errno or 0) or str(exc)
        if exc.errno == errno.ENOSPC:
            text += " (the disk is full)"
        return text
    return str(exc)


def one_line(exc: BaseException, what: str) -> str:
    """``what: problem`` on one line, for any exception a filesystem step raises."""
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{what}: {why(exc)}{where}"
    return f"{what}: {' '.join(str(exc).split())}"


def _stamp(utc: bool = False) -> str:
    now = datetime.now(UTC) if utc else datetime.now()
    return now.strftime("%Y%m%dT%H%M%SZ" if utc else "%Y%m%d-%H%M%S")


def _make_new(parent: Path, name: str) -> Path:
    """``parent/name`` made exclusively (``-2``, ``-3``... when taken)."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        raise FolderError(one_line(exc, f"cannot create {parent}")) from None
    for n in range(1, 1000):
        path = parent / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except (OSError, ValueError) as exc:
            raise FolderError(one_line(exc, f"cannot create {path}")) from None
        return path
    raise FolderError(f"{parent}: no free folder name for {name!r}")


def default_results(cwd: Path, name: str) -> Path:
    """A new ``osprey-results/<name>-<time>`` folder under ``cwd`` (``name`` is a safe slug:
    the folder cannot leave ``osprey-results/``)."""
    root = cwd / "osprey-results"
    path = _make_new(root, f"{name}-{_stamp()}")
    if path.resolve().parent != root.resolve():  # the slug guarantees it; a broken one must not
        raise FolderError(f"{path}: not inside {root}")
    claim(path)
    return path


def rejudged_results(saved: Path) -> Path:
    """A new ``rejudged-<UTC time>`` folder inside the saved campaign's folder."""
    return _make_new(saved, f"rejudged-{_stamp(utc=True)}")


def fresh_results(path: Path, reuse_hint: str) -> Path:
    """``path`` made ready for a new run: created if missing; refused when it is a file, is
    not writable or already holds something."""
    if path.exists() and not path.is_dir():
        raise FolderError(f"results folder {path}: it is a file, not a folder; choose a folder "
                          "that does not exist yet")
    try:
        path.mkdir(parents=True, exist_ok=True)
        entries = sorted(os.listdir(path))
    except (OSError, ValueError) as exc:
        raise FolderError(one_line(exc, f"results folder {path}: cannot create it")) from None
    if entries:
        shown = "campaign.json" if "campaign.json" in entries else entries[0]
        shown = shown if shown.isprintable() else repr(shown)  # the message stays one line
        more = f" and {len(entries) - 1} more" if len(entries) > 1 else ""
        raise FolderError(
            f"results folder {path} is not empty (it holds {shown}{more}); an earlier run's "
            "results are never written over: choose a new folder (or remove this one), or "
            f"re-judge it with {reuse_hint}")
    writable(path)
    claim(path)
    return path


LOCK = "run.lock"


def claim(path: Path) -> None:
    """Take ``path`` for this run: ``run.lock`` (this process's pid and start time) created
    exclusively, so a second run that saw the folder empty at the same moment is refused."""
    try:
        fd = os.open(path / LOCK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise FolderError(f"results folder {path}: another run has just claimed it ({LOCK}); "
                          "choose a new folder") from None
    except OSError as exc:
        raise FolderError(one_line(exc, f"results folder {path}: cannot claim it")) from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"pid {os.getpid()} started {_stamp(utc=True)}\n")


def release(path: Path) -> None:
    """Hand ``path`` back once this run has finished with it: its ``run.lock`` goes (only
    this process's own; a finished folder is not empty, so no later run claims it)."""
    lock = path / LOCK
    try:
        if lock.read_text(encoding="utf-8").startswith(f"pid {os.getpid()} "):
            lock.unlink()
    except OSError:  # never there, or gone: nothing to hand back
        pass


def writable(path: Path) -> None:
    """Refuse a folder this process cannot write into (a read-only file system included)."""
    if not os.access(path, os.W_OK | os.X_OK):
        raise FolderError(f"results folder {path}: not writable (read-only file system or "
                          "no permission); choose another folder")
