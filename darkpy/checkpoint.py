"""Checkpoints: a `.weights` file (Darknet's format) and the `.state` file beside it (momentum, Adam
moments, the update count, the seed and the running loss: what the `.weights` file cannot keep), their
names and periods, the pair written as one unit (`save_checkpoint`), the clean-up of temp files a killed
run left, and the lock that keeps a backup folder to one run (`BackupLock`)."""
from __future__ import annotations

import errno
import json
import os
import re
import sys
import zlib
from pathlib import Path

import numpy as np

try:
    import fcntl
except ImportError:  # pragma: no cover  (Windows: no folder lock)
    fcntl = None

from .atomic import atomic_write, commit, deferred_signals, fsync_dir, write_temp
from .errors import DarkpyError

SAVE_LAST = 100          # Darknet (AlexeyAB): `_last.weights` every 100 iterations
SAVE_WEIGHTS = 1000      # and `_<N>.weights` every 1000
STATE_VERSION = 1


def state_path(weights_path: str | os.PathLike) -> str:
    """The state file beside a checkpoint: backup/x_last.weights -> backup/x_last.state."""
    base, _ = os.path.splitext(os.fspath(weights_path))
    return base + ".state"


def file_crc(path: str | os.PathLike) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


_TEMP = re.compile(r"^(?P<target>.+)\.tmp(?P<pid>\d+)$")
_PENDING = re.compile(r"^(?P<stem>.+)\.(?P<crc>[0-9a-f]{8})\.state$")
#: files darkpy writes in a backup folder besides `<base>*` (their temp files are cleaned up too)
OTHER_OUTPUTS = ("chart.png", "bad_label.list")


def remove_stale_temp_files(folder: str | os.PathLike, base: str | None = None) -> list[str]:
    """Remove the temp files `<name>.tmp<pid>` a killed run left (their process is gone): those of
    `<base>*` checkpoints and logs and of the folder's other outputs (chart.png, bad_label.list), or
    every one when `base` is None; and settle a checkpoint a kill interrupted between its two renames
    (`pending_state_path`). Returns the names removed."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for p in folder.iterdir():
        m = _TEMP.match(p.name)
        if m is None:
            continue
        target = m["target"]
        ours = base is None or target.startswith(base) or target in OTHER_OUTPUTS
        if ours and not _pid_alive(int(m["pid"])):
            try:
                p.unlink()
                removed.append(p.name)
            except OSError:
                pass
    for p in folder.glob(f"{base or ''}*.state"):
        m = _PENDING.match(p.name)
        if m is not None:
            _settle_pending(folder / f"{m['stem']}.weights", p, int(m["crc"], 16))
    return removed


def _settle_pending(weights: Path, pending: Path, crc: int) -> None:
    """A `<stem>.<crc>.state` is the state of a checkpoint whose weights were being renamed: when the
    weights have that CRC it becomes `<stem>.state`, else (the weights never got renamed) it goes."""
    try:
        if weights.is_file() and file_crc(weights) == crc:
            os.replace(pending, state_path(weights))
            fsync_dir(weights.parent)
        else:
            pending.unlink()
    except OSError:
        pass


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


# -- optimiser state beside a checkpoint ----------------------------------------------------------------

def _state_arrays(net, meta: dict) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for layer in net.layers:
        for p in layer.params:
            arrays[f"{layer.index}:{p.name}:grad"] = p.grad
            for key, value in p.state.items():
                arrays[f"{layer.index}:{p.name}:state:{key}"] = value
    for layer in net.layers:             # recurrent state carried between updates (char-RNN streams)
        if getattr(layer, "carry_state", False):     # `carried`: every stream's (darkpy/textdata.py)
            for i, arr in enumerate(getattr(layer, "carried", None) or layer._initial_state()):
                arrays[f"{layer.index}:carry:{i}"] = arr
    blob = json.dumps({"version": STATE_VERSION, **meta}).encode()
    arrays["meta"] = np.frombuffer(blob, np.uint8)
    return arrays


def write_state(path: str, net, meta: dict) -> None:
    """Write the optimiser state of `net` plus `meta` (JSON-able) to `path`, atomically."""
    arrays = _state_arrays(net, meta)
    atomic_write(path, lambda f: np.savez(f, **arrays))


def pending_state_path(weights_path: str | os.PathLike, crc: int) -> str:
    """`x_last.<crc>.state`: the state of the `x_last.weights` whose CRC is `crc`, before it is renamed
    to `x_last.state` (see `save_checkpoint`)."""
    base, _ = os.path.splitext(os.fspath(weights_path))
    return f"{base}.{crc:08x}.state"


def read_state(path: str, net, weights_crc: int | None) -> tuple[dict | None, str]:
    """Restore the optimiser state saved at `path` into `net`. Returns (meta, "") on success, or
    (None, reason) when there is no usable state (then nothing in `net` was changed)."""
    if weights_crc is not None:                 # a kill between the checkpoint's renames left it here
        pending = pending_state_path(os.path.splitext(path)[0] + ".weights", weights_crc)
        if os.path.isfile(pending):
            path = pending
    if not os.path.isfile(path):
        return None, f"no state file {path}"
    try:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except Exception as e:  # noqa: BLE001  (a damaged state file only means an approximate resume)
        return None, f"{path} is unreadable ({type(e).__name__})"
    if meta.get("version") != STATE_VERSION:
        return None, f"{path} has state version {meta.get('version')}, expected {STATE_VERSION}"
    if weights_crc is not None and meta.get("weights_crc") != weights_crc:
        return None, f"{path} belongs to another version of the weights file"
    grads, states = {}, {}
    for layer in net.layers:
        for p in layer.params:
            key = f"{layer.index}:{p.name}"
            g = arrays.get(f"{key}:grad")
            if g is None or g.shape != p.grad.shape or g.dtype != p.grad.dtype:
                return None, f"{path} does not fit this network (parameter {key})"
            grads[key] = g
            states[key] = {k.rsplit(":", 1)[1]: v for k, v in arrays.items()
                           if k.startswith(f"{key}:state:")}
    for layer in net.layers:
        for p in layer.params:
            key = f"{layer.index}:{p.name}"
            p.grad[...] = grads[key]
            p.state.clear()
            p.state.update({k: v.copy() for k, v in states[key].items()})
    for layer in net.layers:
        if hasattr(layer, "carry_state"):
            saved = [arrays.get(f"{layer.index}:carry:{i}") for i in range(len(layer._initial_state()))]
            if all(a is not None for a in saved):
                layer.carried = saved                 # every stream's state, for TextData.carried_state
            for arr, a in zip(layer._initial_state(), saved):
                if a is not None and a.shape == arr.shape:
                    arr[...] = a
    net.updates = int(meta.get("updates", 0))
    return meta, ""


class _CrcFile:
    """A binary file wrapper that keeps the CRC-32 of what was written through it."""

    def __init__(self, f):
        self.f, self.crc = f, 0

    def write(self, b) -> int:
        self.crc = zlib.crc32(b, self.crc)
        return self.f.write(b)


def save_checkpoint(net, path: str, meta: dict) -> None:
    """`.weights` (Darknet's format) and its `.state` beside it, written as one unit.

    Order: the weights' temp file (its CRC computed while writing), the state (which records that CRC)
    renamed to `x.<crc>.state`, the weights renamed to `x.weights`, then the state renamed to `x.state`;
    every file and the folder are fsync'd before each rename, and SIGINT/SIGTERM wait until the end. A
    kill at any instant leaves the previous pair (`x.weights` + `x.state`) or the new one (`x.weights`
    + `x.state` or `x.<crc>.state`, which `read_state` finds); a failure (a full disk) removes every
    temp file and leaves the previous pair."""
    from .weights import write_weights

    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with deferred_signals():
        box: dict = {}

        def weights_writer(f):
            w = _CrcFile(f)
            write_weights(net, w)
            box["crc"] = w.crc

        wtmp = write_temp(path, weights_writer)
        pending = pending_state_path(path, box["crc"])
        try:
            arrays = _state_arrays(net, {**meta, "seen": int(net.seen), "updates": int(net.updates),
                                         "weights_crc": box["crc"]})
            commit(write_temp(pending, lambda f: np.savez(f, **arrays)), pending)
            commit(wtmp, path)
        except BaseException:
            for leftover in (wtmp, pending):
                try:
                    os.unlink(leftover)
                except OSError:
                    pass
            raise
        os.replace(pending, state_path(path))
        fsync_dir(folder)


def newest_checkpoint(folder: str | os.PathLike, base: str) -> tuple[str, dict] | None:
    """The consistent pair (`<base>_*.weights` whose state matches its CRC) of the highest iteration in
    `folder`, as (weights path, state meta); None when there is none."""
    best = None
    for w in Path(folder).glob(f"{base}_*.weights"):
        meta = peek_state(str(w))
        if meta is not None and (best is None or meta.get("iteration", -1) > best[1].get("iteration", -1)):
            best = (str(w), meta)
    return best


def peek_state(weights_path: str) -> dict | None:
    """The meta of the state that matches `weights_path` (None if there is no consistent one)."""
    try:
        crc = file_crc(weights_path)
    except OSError:
        return None
    for p in (pending_state_path(weights_path, crc), state_path(weights_path)):
        try:
            with np.load(p) as z:
                meta = json.loads(z["meta"].tobytes().decode())
        except Exception:  # noqa: BLE001
            continue
        if meta.get("weights_crc") == crc:
            return meta
    return None


def checkpoint_names(base: str, k: int, save_last: int, save_every: int, done: bool, stopping: bool) -> list[str]:
    """The checkpoint files written after iteration k (Darknet's names and periods)."""
    names = []
    if k % save_last == 0 or (stopping and not done):
        names.append(f"{base}_last.weights")
    if k % save_every == 0:
        names.append(f"{base}_{k}.weights")
    if done:
        names.append(f"{base}_final.weights")
    return names



# -- the backup folder's lock ---------------------------------------------------------------------------

LOCK_NAME = ".darkpy.lock"


class BackupLockedError(DarkpyError):
    """Another live run holds the backup folder."""


class BackupLock:
    """An exclusive lock on a backup folder for a run's lifetime: `<folder>/.darkpy.lock`, locked with
    flock (so the kernel releases it when the process dies, even by SIGKILL) and holding the owner's
    pid and command line; removed when the run ends. A second run is refused naming them; a lock file
    left by a killed run (it still names its pid, but nobody holds the flock) is taken over with a
    notice."""

    def __init__(self, folder: str | os.PathLike, notify=None):
        self.path = os.path.join(os.fspath(folder), LOCK_NAME)
        self._fd: int | None = None
        if fcntl is None:  # pragma: no cover
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                owner = _read_owner(fd)
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise BackupLockedError(
                    f"{os.fspath(folder)}: backup folder in use by another training run "
                    f"({owner or 'owner unknown'}); wait for it to end or pass --backup DIR for a folder "
                    f"of this run's own") from None
            try:                 # the owner may have removed the file between our open and flock
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = _read_owner(fd)
        if previous and notify is not None:
            notify(f"Note: took over the stale lock of {self.path} left by a run that ended without "
                   f"releasing it ({previous})")
        me = f"pid {os.getpid()}: {_command_line()}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, (me + "\n").encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file and unlock it (a waiting opener sees the file gone and retries)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(fd)             # closing the last descriptor releases the flock

    def __enter__(self) -> "BackupLock":
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False

    def __del__(self):
        self.release()


def _command_line(limit: int = 300) -> str:
    """This process's command line, on one line (from /proc where there is one)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            args = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        args = [sys.executable, *sys.argv]
    text = " ".join(" ".join(args).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _read_owner(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
