"""Durable, atomic file writes: a temp file beside the target, fsync'd, renamed over it, and the folder
fsync'd, so a kill or a power cut leaves the old file or the new one, never a mix. A full disk is a
one-line `DiskFullError` naming the file and the free space, and the temp file is removed; SIGINT/SIGTERM
can be held back while a group of files is written (`deferred_signals`)."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import threading
from typing import IO, Callable, Iterator

from .errors import DarkpyError

_open = open            # tests patch this to inject a full disk


class DiskFullError(DarkpyError):
    """No space left on the device (or quota exceeded) while writing a file."""


def temp_name(path: str | os.PathLike) -> str:
    """`<path>.tmp<pid>`: the name every darkpy temp file has (stale ones are found by the pid)."""
    return f"{os.fspath(path)}.tmp{os.getpid()}"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} PiB"  # pragma: no cover


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename in `folder` durable (a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(os.fspath(folder) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def disk_full_error(path: str, e: OSError) -> DiskFullError:
    folder = os.path.dirname(os.path.abspath(path))
    try:
        free = human_bytes(shutil.disk_usage(folder).free)
    except OSError:
        free = "unknown"
    why = "no space left on device" if e.errno == errno.ENOSPC else "disk quota exceeded"
    return DiskFullError(f"{path}: {why} while writing it ({free} free in {folder}); "
                         f"the previous version of the file is kept")


def write_temp(path: str, write: Callable[[IO[bytes]], object]) -> str:
    """Write `path`'s temp file with `write(f)`, flushed and fsync'd; returns the temp name. On any
    failure (a full disk is a `DiskFullError`) the temp file is removed."""
    tmp = temp_name(path)
    try:
        with _open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        _unlink_quietly(tmp)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise disk_full_error(path, e) from None
        raise
    return tmp


def commit(tmp: str, path: str) -> None:
    """Rename `tmp` over `path` and fsync the folder."""
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> None:
    """Write `path` with `write(f)` (f is a binary file) atomically and durably."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    commit(write_temp(path, write), path)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back until the block ends, so a second Ctrl-C cannot stop a group of writes
    half-way: a signal that arrives meanwhile is recorded and raised again, to the handler that was
    in place, when the block ends. Only in the main thread (the only one Python signal handlers run
    in; a signal mask would not do, the kernel may hand the signal to a BLAS/numba thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum, frame):
        pending.append(signum)

    old = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, hold)
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(pending):
            signal.raise_signal(sig)
