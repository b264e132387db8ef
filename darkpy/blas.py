"""BLAS threads per GEMM: one thread for small and medium GEMMs, the run's BLAS threads for large ones.

OpenBLAS splits a GEMM statically between its threads and the calling thread waits (spinning, then
yielding) for the slowest. On a busy machine the woken worker waits for a core behind other
processes, and every GEMM pays that wait: on 2 cores shared with two other jobs (load ~4), a
shapes-tiny training step at b32 with 2 numba threads took 637 ms (median; 10th percentile 221)
with 2 BLAS threads and 147 ms (86) with 1, alternating step by step in one process; 1 numba and
1 BLAS thread took 145 ms (96). Numba's own parallel regions degrade far better (their waiting
thread sleeps, so the worker can run on its core). Small GEMMs are cheap to keep on one thread:
OpenBLAS itself already runs those below 262,144 multiply-adds single-threaded.

`matmul(a, b, out)` runs one (stacked) GEMM on one OpenBLAS thread below BLAS_PARALLEL_MIN_MACS
multiply-adds per matrix, else on the count `configure` was given (darkpy.runtime.configure_threads
calls it), and puts that count back after. A stack of medium GEMMs (Winograd's 16 per layer, the
per-item GEMMs of small layers) instead runs as concurrent streams, one BLAS thread each: see
`STREAM_MIN_MACS`. A switch is one C call (a set-1/set-2 pair took 0.33 µs
through ctypes; threadpoolctl's context manager looks the libraries up each time, far slower).
Without threadpoolctl, or with a BLAS that is not OpenBLAS, it is plain np.matmul.
"""
from __future__ import annotations

import itertools
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from .kernels import gemm

#: Multiply-adds (m·n·k) from which a GEMM runs on the run's BLAS threads instead of one. On a busy
#: machine a woken worker waits behind other processes (measured 3-8 ms per 2-thread GEMM of 2-17M
#: multiply-adds at load ~3.5), so the smaller the better there; on a quiet 2-core machine (the
#: benchmark's), alternating thresholds step by step in one process at 2 threads, 2^22 against
#: OpenBLAS's own rule (2^18): shapes-tiny training b32 0.88-0.91x the time, digits training b32
#: 1.04x, b1/b64 inference of shapes-tiny, yolov3-tiny and cifar 0.99-1.03x; 2^27 was 1.15x at b1
#: on shapes-tiny and yolov3-tiny and 1.25x on cifar b64 (its 2-17M GEMMs lost their second thread).
BLAS_PARALLEL_MIN_MACS = 1 << 22
#: OpenBLAS runs GEMMs up to this many multiply-adds on one thread by itself (its interface/gemm.c,
#: SMP_THRESHOLD_MIN 65536 x GEMM_MULTITHREAD_THRESHOLD 4): no switch needed (a switch pair costs
#: ~1.7 µs from Python, a 64x128x64 GEMM 7.5 µs).
OPENBLAS_SERIAL_MAX_MACS = 1 << 18

#: A stack of GEMMs (numpy calls BLAS once per matrix) with at least STREAM_MIN_MACS multiply-adds
#: in all and below STREAM_MAX_MACS per matrix is cut into as many contiguous parts as the calling
#: thread's numba thread count (so a layer that darkpy/threadplan.py keeps on one thread stays on
#: one), at most the run's BLAS count, computed at the same time on one BLAS thread each: this
#: thread takes the first part, helper threads the others. A stack's GEMMs are independent, and
#: such a stack's matrices always get one BLAS thread (also when there is one stream), so each
#: gets the same bits at any thread count. Measured
#: on a 2-core Zen 3 (2026-12-02), 2 streams against one matrix after the other on
#: `threads_for`'s BLAS threads: Winograd stacks of shapes-tiny and digits 1.25-1.6x faster (e.g. 16
#: x 64x96 @ 96x1600: 5.5 -> 3.5 ms; 16 x 32x16 @ 16x1024: 366 -> 246 µs), digits' per-item stack
#: at b64 (64 x 32x144 @ 144x64) 1.7x, 16 x 128x512 @ 512x64 (4.2M per matrix) 1.07x; handing a
#: part to a helper thread costs ~40 µs there.
STREAM_MIN_MACS = 1 << 20
STREAM_MAX_MACS = 1 << 25

_state = {"set": None, "max": 1, "current": None}
_helpers = {"pool": None, "size": 0, "pid": None}


def _find_setter():
    """A function setting the thread count of every OpenBLAS loaded in the process (each through
    any of its exported spellings), or None. Every one, not the first: other packages bring their
    own (opencv-python's wheel does), and when one of those loads first, switching only it would
    leave numpy's on the run's count (as `configure_threads` does, through threadpoolctl, for all)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    setters = []
    for lib in ThreadpoolController().lib_controllers:
        if lib.internal_api != "openblas":
            continue
        for prefix, suffix in itertools.product(("", "scipy_"), ("", "64_", "_64")):
            fn = getattr(lib.dynlib, f"{prefix}openblas_set_num_threads{suffix}", None)
            if fn is not None:
                setters.append(fn)
                break
    if len(setters) <= 1:
        return setters[0] if setters else None

    def set_all(n: int) -> None:
        for fn in setters:
            fn(n)
    return set_all


def configure(threads: int) -> None:
    """The most BLAS threads a GEMM may use (the run's thread count); finds OpenBLAS once."""
    if _state["set"] is None:
        _state["set"] = _find_setter() or False
    _state["max"] = max(int(threads), 1)
    _state["current"] = None


def threads_for(macs: int) -> int:
    """BLAS threads for a GEMM of `macs` multiply-adds."""
    return _state["max"] if macs >= BLAS_PARALLEL_MIN_MACS else 1


def _set(n: int) -> None:
    if n != _state["current"]:
        _state["set"](n)
        _state["current"] = n


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`np.matmul(a, b, out=out)` on `threads_for` BLAS threads (counting one GEMM of a stack: numpy
    calls BLAS per matrix), then back to the run's count, so GEMMs elsewhere are unaffected; or,
    for a stack, as concurrent streams (`STREAM_MIN_MACS`). Plain np.matmul until `configure` has
    run (a library user's own settings stay) or without OpenBLAS."""
    macs = a.shape[-2] * a.shape[-1] * b.shape[-1]
    if not _state["set"]:
        return np.matmul(a, b, out=out)
    stack = math.prod(out.shape[:-2]) if out is not None and out.ndim >= 3 else 1
    if stack > 1 and macs < STREAM_MAX_MACS and macs * stack >= STREAM_MIN_MACS:
        _streams(a, b, out, min(_state["max"], stack, numba.get_num_threads()))
        return out
    if macs <= OPENBLAS_SERIAL_MAX_MACS:
        return np.matmul(a, b, out=out)
    _set(threads_for(macs))
    try:
        return np.matmul(a, b, out=out)
    finally:
        _set(_state["max"])


#: `product` takes darkpy's own GEMM where it fits (False: BLAS for every product, to compare).
#: tiny-gpt's training step at b16 (2 threads, alternating in one process): 0.93x the time.
OWN_GEMM = True


def product(out: np.ndarray, a: np.ndarray, b: np.ndarray, add: bool = False,
            scratch: np.ndarray | None = None) -> np.ndarray:
    """out (M, N) = (add: +=) a (M, K) @ b (K, N), 2-D, out C-contiguous: on darkpy's own GEMM
    (kernels/gemm.py: tall products on AVX-512, adding in place) where it `fits`, else `matmul`
    (into `scratch`, shaped like out, then added, when `add`)."""
    m, k = a.shape
    n = b.shape[1]
    if OWN_GEMM and gemm.fits(m, k, n) and a.flags.c_contiguous and out.flags.c_contiguous:
        gemm.product(out, a, b, add)
    elif add:
        out += matmul(a, b, out=scratch)
    else:
        matmul(a, b, out=out)
    return out


def _streams(a: np.ndarray, b: np.ndarray, out: np.ndarray, streams: int) -> None:
    """out = a @ b in `streams` contiguous parts of the stack's first axis at the same time (1: all
    on this thread), one BLAS thread each; a or b may have fewer axes (broadcast over the stack)."""
    _set(1)
    n = out.shape[0]
    streams = min(streams, n)
    cuts = [n * i // streams for i in range(streams + 1)]

    def cut(m, lo, hi):             # a stacked operand's part; a broadcast one whole
        return m[lo:hi] if m.ndim == out.ndim and m.shape[0] == n else m

    def part(i):
        lo, hi = cuts[i], cuts[i + 1]
        np.matmul(cut(a, lo, hi), cut(b, lo, hi), out=out[lo:hi])

    pending = [_pool(streams - 1).submit(part, i) for i in range(1, streams)] if streams > 1 else []
    try:
        part(0)
    finally:
        errors = [f.exception() for f in pending]       # waits for every part
        _set(_state["max"])
    for error in errors:
        if error is not None:
            raise error


def _pool(size: int) -> ThreadPoolExecutor:
    """The helper threads of `_streams` (at least `size`), made on first use, and again in a
    forked child (which has none of its parent's threads)."""
    h = _helpers
    if h["pool"] is None or h["size"] < size or h["pid"] != os.getpid():
        h["pool"] = ThreadPoolExecutor(max_workers=size, thread_name_prefix="darkpy-gemm")
        h["size"], h["pid"] = size, os.getpid()
    return h["pool"]
