"""Darknet `.weights` files (spec §7): a header, then every layer's arrays in cfg order, float32 LE.

Header: int32 major, minor, revision, then `seen` as uint64 when major*10+minor >= 2 (and both < 1000),
else int32 — 20 or 16 bytes. `major > 1000 or minor > 1000` flags connected matrices stored
`[in][out]`. darkpy writes 0.2.0 with a uint64 `seen`.

Unlike Darknet (which silently keeps random values for whatever a short file lacks, and ignores
trailing bytes) a file whose size does not fit the network is an error that says how many bytes were
expected and found. Partial loading, for backbones like `darknet53.conv.74`, is opt-in with `upto`.
Two orders. AlexeyAB's fork stores `[gru]`, `[lstm]` and `[batchnorm]` in its own order (spec §7;
a layer's `alexeyab_weight_arrays()`); every other layer is the same in both. The rule: a file
whose header is version 0.2.5 or later (what AlexeyAB's fork writes; pjreddie writes 0.2.0) is read
in AlexeyAB's order, any other in pjreddie's; `order="pjreddie"` / `"alexeyab"` overrides it
(e.g. an old AlexeyAB file from before 0.2.5). `save_weights` writes the order of the file the
network was loaded from (pjreddie's for a fresh network), or the one asked for: pjreddie's with
header 0.2.0, AlexeyAB's with header 0.2.5, so a file reads back the same way it was written, in
darkpy and in the Darknet it was written for (a resumed AlexeyAB run keeps AlexeyAB checkpoints).

The size is checked before the body is read, and the body is read straight into the layers' arrays;
a file that is not a regular file (a FIFO, /dev/zero) or holds a NaN/inf is refused.
"""
from __future__ import annotations

import os
import stat
import struct

import numpy as np

from .atomic import atomic_write
from .errors import WeightsError

HEADER = struct.Struct("<iii")


def _layers_in_file(net, upto: int | None, skip_attr: str):
    layers = net.layers if upto is None else net.layers[:upto]
    return [l for l in layers if not getattr(l, skip_attr)]


ORDERS = ("pjreddie", "alexeyab")


def layer_arrays(layer, order: str = "pjreddie") -> list[np.ndarray]:
    """A layer's arrays in `order` (see the module docstring)."""
    if order == "alexeyab":
        arrays = getattr(layer, "alexeyab_weight_arrays", None)
        if arrays is not None:
            return arrays()
    return layer.weight_arrays()


def file_order(major: int, minor: int, revision: int) -> str:
    """The order a file with this header version uses: AlexeyAB's from 0.2.5 on."""
    return "alexeyab" if (major, minor, revision) >= (0, 2, 5) and major < 1000 and minor < 1000 else "pjreddie"


def _check_order(order: str | None) -> None:
    if order is not None and order not in ORDERS:
        raise WeightsError(f"unknown weights order {order!r} (expected one of {', '.join(ORDERS)})")


def expected_bytes(net, upto: int | None = None, header: int = 20, skip_attr: str = "dontload",
                   order: str = "pjreddie") -> int:
    n = sum(a.size for l in _layers_in_file(net, upto, skip_attr) for a in layer_arrays(l, order))
    return header + 4 * n


def read_header(data: bytes, path: str, size: int | None = None) -> tuple[int, int, int, int, int]:
    """Return (major, minor, revision, seen, header_size). `size` is the file's (default len(data))."""
    size = len(data) if size is None else size
    if len(data) < 16:
        raise WeightsError(f"{path}: too short for a darknet weights header ({size} bytes, expected >= 16)")
    major, minor, revision = HEADER.unpack_from(data, 0)
    if major < 0 or minor < 0:
        raise WeightsError(f"{path}: not a darknet weights file (header version {major}.{minor})")
    if (major * 10 + minor) >= 2 and major < 1000 and minor < 1000:
        if len(data) < 20:
            raise WeightsError(f"{path}: truncated header ({size} bytes, expected 20)")
        (seen,) = struct.unpack_from("<Q", data, 12)
        return major, minor, revision, seen, 20
    (seen,) = struct.unpack_from("<i", data, 12)
    return major, minor, revision, max(seen, 0), 16


def _open_regular(path: str):
    """Open `path` for reading, refusing what is not a regular file (a FIFO would block, /dev/zero
    never ends) before reading a byte."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise WeightsError(f"{path}: no such weights file") from None
    except OSError as e:
        raise WeightsError(f"{path}: cannot read ({e.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise WeightsError(f"{path}: not a regular file (a {_file_kind(st.st_mode)}); a weights file is a "
                           f"plain file")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), st.st_size


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"  # pragma: no cover


def load_weights(net, path: str | os.PathLike, upto: int | None = None, order: str | None = None) -> None:
    """Fill the network's parameters from `path`. `upto=N` loads layers [0, N) and allows a longer file.
    `order`: "pjreddie" or "alexeyab"; None chooses by the header (module docstring).

    The file's size is checked against the network's before its body is read, and the body is read
    straight into the layers' arrays. A non-finite value (NaN, inf) is refused, naming the layer; the
    layers before it are then already loaded."""
    _check_order(order)
    path = os.fspath(path)
    f, size = _open_regular(path)
    with f:
        major, minor, rev, seen, hsize = read_header(f.read(20), path, size)
        order = order or file_order(major, minor, rev)
        transpose = major > 1000 or minor > 1000
        layers = _layers_in_file(net, upto, "dontload")
        need = expected_bytes(net, upto, hsize, order=order)
        if size < need or (size > need and upto is None):
            what = "too short" if size < need else "too long"
            raise WeightsError(
                f"{path}: file is {what} for {net.file}: expected {need} bytes "
                f"({(need - hsize) // 4} floats for {len(layers)} layers), found {size}"
                + ("; to load only the first N layers (a backbone), pass upto=N to load_weights "
                   "(`darkpy train --upto N`)" if size > need else ""), mismatch=True)
        f.seek(hsize)
        for layer in layers:
            for arr in layer_arrays(layer, order):
                _read_array(f, arr, transpose and arr.ndim == 2, path)
                if not np.isfinite(arr).all():
                    bad = int(np.count_nonzero(~np.isfinite(arr)))
                    raise WeightsError(f"{path}: layer {layer.index} [{layer.kind}] has {bad} non-finite "
                                       f"value{'s' if bad != 1 else ''} (NaN/inf) of {arr.size}; the file is "
                                       f"damaged or comes from a run that diverged")
            after = getattr(layer, "after_load", None)
            if after is not None:
                after()
    net.seen = int(seen)
    net.weights_order = order       # checkpoints are written back in the same order


def _read_array(f, arr: np.ndarray, transpose: bool, path: str) -> None:
    """Read arr.size float32 values from f into arr (directly when arr is a contiguous float32 array)."""
    if not transpose and arr.dtype == np.dtype("<f4") and arr.flags.c_contiguous and arr.flags.writeable:
        n = f.readinto(memoryview(arr.reshape(-1)).cast("B"))
        if n != arr.nbytes:
            raise WeightsError(f"{path}: the file ended early (it changed while being read?)")
        return
    data = f.read(4 * arr.size)
    if len(data) != 4 * arr.size:
        raise WeightsError(f"{path}: the file ended early (it changed while being read?)")
    chunk = np.frombuffer(data, dtype="<f4")
    if transpose:
        chunk = chunk.reshape(arr.shape[1], arr.shape[0]).T
    arr[...] = chunk.reshape(arr.shape)


def write_weights(net, f, upto: int | None = None, order: str | None = None) -> None:
    """Write the header and every saved layer's arrays to the binary file `f`. `order="alexeyab"`
    writes AlexeyAB's order and its header version 0.2.5; None: the order of the file the network
    last loaded (`net.weights_order`), else pjreddie's."""
    _check_order(order)
    order = order or getattr(net, "weights_order", None) or "pjreddie"
    f.write(HEADER.pack(0, 2, 5 if order == "alexeyab" else 0) + struct.pack("<Q", int(net.seen)))
    for layer in _layers_in_file(net, upto, "dontsave"):
        for arr in layer_arrays(layer, order):
            f.write(np.ascontiguousarray(arr, dtype="<f4").tobytes())


def save_weights(net, path: str | os.PathLike, upto: int | None = None, order: str | None = None) -> None:
    """Write `path` atomically (temp file, fsync, rename, fsync of the folder): a crash never leaves a
    half-written file; a full disk is a one-line error and leaves the previous file."""
    _check_order(order)
    atomic_write(path, lambda f: write_weights(net, f, upto, order))
