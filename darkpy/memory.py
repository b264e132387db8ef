"""Memory bounds: what a network needs, checked against the machine before anything big is allocated,
and a shapes-only build (`shapes_only()`) in which parameter arrays take no memory at all, for
`darkpy summary` and `darkpy cfg check`.

In a shapes-only build every parameter array is a read-only, zero-stride view of one scalar
(`numpy.broadcast_to`): it has its full shape and size, so sizes, parameter counts and the file
layout are right, but it holds no data and must not be written (the network is for reading shapes).
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import os
from typing import Iterator

import numpy as np

from .atomic import human_bytes
from .errors import DarkpyError

_SHAPES_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("darkpy_shapes_only", default=False)
#: numpy's limit on an array's byte size: not even a shapes-only array can be larger
MAX_BYTES = 2 ** 63 - 1


class MemoryLimitError(DarkpyError):
    """A network (or one of its arrays) needs more memory than the machine has."""


def physical_memory() -> int | None:
    """Bytes of physical memory (os.sysconf), None where the system does not say."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * size if pages > 0 and size > 0 else None


@contextlib.contextmanager
def shapes_only(on: bool = True) -> Iterator[None]:
    """Within the block, parameter arrays built by layers are zero-memory views (see the module doc)."""
    token = _SHAPES_ONLY.set(on)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def is_shapes_only() -> bool:
    return _SHAPES_ONLY.get()


def _numel(shape) -> int:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    n = 1
    for d in shape:
        n *= int(d)
    return n


def needs_message(nbytes: int, what: str) -> str:
    have = physical_memory()
    tail = f"; this machine has {human_bytes(have)}" if have else ""
    return f"needs {human_bytes(nbytes)} for {what}{tail}"


def param_array(shape, dtype, fill: float = 0.0, what: str = "its weights") -> np.ndarray:
    """A parameter array of `shape` filled with `fill`: a zero-memory view in a shapes-only build,
    else a real array, refused with a one-line MemoryLimitError when it cannot fit in memory."""
    dtype = np.dtype(dtype)
    n = _numel(shape)
    nbytes = n * dtype.itemsize
    if nbytes > MAX_BYTES:
        raise MemoryLimitError(needs_message(nbytes, what))
    if is_shapes_only():
        return np.broadcast_to(np.array(fill, dtype), shape)
    have = physical_memory()
    if have is not None and nbytes > have:
        raise MemoryLimitError(needs_message(nbytes, what))
    try:
        return np.full(shape, fill, dtype) if fill else np.zeros(shape, dtype)
    except (MemoryError, ValueError):
        tail = f" (this machine has {human_bytes(have)})" if have else ""
        raise MemoryLimitError(f"cannot allocate {human_bytes(nbytes)} for {what}: out of memory{tail}") from None


def param_zeros(shape, dtype) -> np.ndarray:
    return param_array(shape, dtype, 0.0)


def param_ones(shape, dtype) -> np.ndarray:
    return param_array(shape, dtype, 1.0)


def network_needs(layers, batch: int, dtype) -> tuple[int, int, str]:
    """(total bytes, largest item's bytes, what the largest is) for a network's parameters (values and
    gradients) and its inference buffers at `batch` (every output and the largest im2col workspace)."""
    itemsize = np.dtype(dtype).itemsize
    items: list[tuple[int, str]] = []
    for layer in layers:
        shape = layer.out_shape
        at = f" at {shape[2]}x{shape[1]}" if len(shape) == 3 else ""
        items.append((batch * _numel(shape) * itemsize, f"layer {layer.index}'s output{at}"))
        pbytes = sum(2 * p.value.size * p.value.dtype.itemsize for p in layer.params)
        if pbytes:
            items.append((pbytes, f"layer {layer.index}'s weights and their gradients"))
    cols = [getattr(layer, "col_shape", None) for layer in layers]
    sizes = [(_numel(c), i) for i, c in enumerate(cols) if c is not None and len(c) == 2]
    if sizes:
        n, i = max(sizes)
        items.append((n * itemsize, f"layer {layers[i].index}'s im2col workspace"))
    total = sum(b for b, _ in items)
    big, what = max(items, default=(0, "nothing"))
    return total, big, what


def check_network_fits(layers, batch: int, dtype, file: str) -> None:
    """Refuse, before allocating buffers, a network that needs more than the machine's memory."""
    have = physical_memory()
    total, big, what = network_needs(layers, batch, dtype)
    if have is not None and total > have:
        raise MemoryLimitError(f"{file}: the network needs {human_bytes(total)} at batch {batch} "
                               f"({human_bytes(big)} for {what}); this machine has {human_bytes(have)}")


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Give the C heap's free pages back to the system (glibc's `malloc_trim`); False where the C
    library cannot. Reallocating a network's buffers leaves garbage there: freeing an mmap-ed array
    raises glibc's mmap threshold to its size, so the next arrays below it come from the heap and
    are zero-filled there (resident) even when an arena replaces them at once. Measured, cifar at
    batch 64 sharing its outputs: 72 MB of free heap resident after `share_outputs`, peak RSS 365
    MB without this call after each allocation, 295 MB with it. Changes no allocator setting."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
