"""Checkpoints: a `.weights` file (Darknet's format) and the `.state` file beside it (momentum, Adam
moments, the update count, the seed and the running loss: what the `.weights` file cannot keep), their
names and periods, and the clean-up of temp files a killed run left."""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np

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


def remove_stale_temp_files(folder: str | os.PathLike, base: str) -> None:
    """Temp files `<base>_*.tmp<pid>` left by a killed run (their process is gone) are removed."""
    for p in Path(folder).glob(f"{base}*.tmp*"):
        pid = p.name.rsplit(".tmp", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            try:
                p.unlink()
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
    return True


# -- optimiser state beside a checkpoint ----------------------------------------------------------------

def write_state(path: str, net, meta: dict) -> None:
    """Write the optimiser state of `net` plus `meta` (JSON-able) to `path`, atomically."""
    arrays: dict[str, np.ndarray] = {}
    for layer in net.layers:
        for p in layer.params:
            arrays[f"{layer.index}:{p.name}:grad"] = p.grad
            for key, value in p.state.items():
                arrays[f"{layer.index}:{p.name}:state:{key}"] = value
    for layer in net.layers:             # recurrent state carried between updates (char-RNN streams)
        if getattr(layer, "carry_state", False):
            for i, arr in enumerate(layer._initial_state()):
                arrays[f"{layer.index}:carry:{i}"] = arr
    blob = json.dumps({"version": STATE_VERSION, **meta}).encode()
    arrays["meta"] = np.frombuffer(blob, np.uint8)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_state(path: str, net, weights_crc: int | None) -> tuple[dict | None, str]:
    """Restore the optimiser state saved at `path` into `net`. Returns (meta, "") on success, or
    (None, reason) when there is no usable state (then nothing in `net` was changed)."""
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
            for i, arr in enumerate(layer._initial_state()):
                saved = arrays.get(f"{layer.index}:carry:{i}")
                if saved is not None and saved.shape == arr.shape:
                    arr[...] = saved
    net.updates = int(meta.get("updates", 0))
    return meta, ""


def save_checkpoint(net, path: str, meta: dict) -> None:
    """`.weights` (Darknet's format) and its `.state` beside it, each atomically."""
    net.save_weights(path)
    write_state(state_path(path), net, {**meta, "seen": int(net.seen), "updates": int(net.updates),
                                         "weights_crc": file_crc(path)})


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

