"""Darknet `.weights` files (spec §7): a header, then every layer's arrays in cfg order, float32 LE.

Header: int32 major, minor, revision, then `seen` as uint64 when major*10+minor >= 2 (and both < 1000),
else int32 — 20 or 16 bytes. `major > 1000 or minor > 1000` flags connected matrices stored
`[in][out]`. darkpy writes 0.2.0 with a uint64 `seen`.

Two orders. AlexeyAB's fork stores `[gru]`, `[lstm]` and `[batchnorm]` in its own order (spec §7;
a layer's `alexeyab_weight_arrays()`); every other layer is the same in both. The rule: a file
whose header is version 0.2.5 or later (what AlexeyAB's fork writes; pjreddie writes 0.2.0) is read
in AlexeyAB's order, any other in pjreddie's; `order="pjreddie"` / `"alexeyab"` overrides it
(e.g. an old AlexeyAB file from before 0.2.5). `save_weights` writes the order of the file the
network was loaded from (pjreddie's for a fresh network), or the one asked for: pjreddie's with
header 0.2.0, AlexeyAB's with header 0.2.5, so a file reads back the same way it was written, in
darkpy and in the Darknet it was written for (a resumed AlexeyAB run keeps AlexeyAB checkpoints).

Unlike Darknet (which silently keeps random values for whatever a short file lacks, and ignores
trailing bytes) a file whose size does not fit the network is an error that says how many bytes were
expected and found. Partial loading, for backbones like `darknet53.conv.74`, is opt-in with `upto`.
"""
from __future__ import annotations

import os
import struct

import numpy as np

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


def read_header(data: bytes, path: str) -> tuple[int, int, int, int, int]:
    """Return (major, minor, revision, seen, header_size)."""
    if len(data) < 16:
        raise WeightsError(f"{path}: too short for a darknet weights header ({len(data)} bytes, expected >= 16)")
    major, minor, revision = HEADER.unpack_from(data, 0)
    if major < 0 or minor < 0:
        raise WeightsError(f"{path}: not a darknet weights file (header version {major}.{minor})")
    if (major * 10 + minor) >= 2 and major < 1000 and minor < 1000:
        if len(data) < 20:
            raise WeightsError(f"{path}: truncated header ({len(data)} bytes, expected 20)")
        (seen,) = struct.unpack_from("<Q", data, 12)
        return major, minor, revision, seen, 20
    (seen,) = struct.unpack_from("<i", data, 12)
    return major, minor, revision, max(seen, 0), 16


def load_weights(net, path: str | os.PathLike, upto: int | None = None, order: str | None = None) -> None:
    """Fill the network's parameters from `path`. `upto=N` loads layers [0, N) and allows a longer file.
    `order`: "pjreddie" or "alexeyab"; None chooses by the header (module docstring)."""
    _check_order(order)
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise WeightsError(f"{path}: no such weights file") from None
    except OSError as e:
        raise WeightsError(f"{path}: cannot read ({e.strerror})") from None
    major, minor, rev, seen, hsize = read_header(data, path)
    order = order or file_order(major, minor, rev)
    transpose = major > 1000 or minor > 1000
    layers = _layers_in_file(net, upto, "dontload")
    need = expected_bytes(net, upto, hsize, order=order)
    if len(data) < need or (len(data) > need and upto is None):
        what = "too short" if len(data) < need else "too long"
        raise WeightsError(
            f"{path}: file is {what} for {net.file}: expected {need} bytes "
            f"({(need - hsize) // 4} floats for {len(layers)} layers), found {len(data)}"
            + ("; pass upto=N (--upto) to load only the first N layers" if len(data) > need else ""))
    body = np.frombuffer(data, dtype="<f4", offset=hsize)
    pos = 0
    for layer in layers:
        for arr in layer_arrays(layer, order):
            chunk = body[pos:pos + arr.size]
            pos += arr.size
            if transpose and arr.ndim == 2:
                chunk = chunk.reshape(arr.shape[1], arr.shape[0]).T
            arr[...] = chunk.reshape(arr.shape)
        after = getattr(layer, "after_load", None)
        if after is not None:
            after()
    net.seen = int(seen)
    net.weights_order = order       # checkpoints are written back in the same order


def save_weights(net, path: str | os.PathLike, upto: int | None = None, order: str | None = None) -> None:
    """Write `path` atomically (temp file + rename): a crash never leaves a half-written file.
    `order="alexeyab"` writes AlexeyAB's order and its header version 0.2.5; None: the order of the
    file the network last loaded (`net.weights_order`), else pjreddie's."""
    _check_order(order)
    order = order or getattr(net, "weights_order", None) or "pjreddie"
    path = os.fspath(path)
    parts = [HEADER.pack(0, 2, 5 if order == "alexeyab" else 0), struct.pack("<Q", int(net.seen))]
    for layer in _layers_in_file(net, upto, "dontsave"):
        for arr in layer_arrays(layer, order):
            parts.append(np.ascontiguousarray(arr, dtype="<f4").tobytes())
    tmp = f"{path}.tmp{os.getpid()}"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(tmp, "wb") as f:
        for p in parts:
            f.write(p)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
