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
calls it), and puts that count back after. A switch is one C call (a set-1/set-2 pair took 0.33 µs
through ctypes; threadpoolctl's context manager looks the libraries up each time, far slower).
Without threadpoolctl, or with a BLAS that is not OpenBLAS, it is plain np.matmul.
"""
from __future__ import annotations

import itertools

import numpy as np

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

_state = {"set": None, "max": 1, "current": None}


def _find_setter():
    """OpenBLAS's set_num_threads function (any of its exported spellings), or None."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    for lib in ThreadpoolController().lib_controllers:
        if lib.internal_api != "openblas":
            continue
        for prefix, suffix in itertools.product(("", "scipy_"), ("", "64_", "_64")):
            fn = getattr(lib.dynlib, f"{prefix}openblas_set_num_threads{suffix}", None)
            if fn is not None:
                return fn
    return None


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
    calls BLAS per matrix), then back to the run's count, so GEMMs elsewhere are unaffected. Plain
    np.matmul until `configure` has run (a library user's own settings stay) or without OpenBLAS."""
    macs = a.shape[-2] * a.shape[-1] * b.shape[-1]
    if not _state["set"] or macs <= OPENBLAS_SERIAL_MAX_MACS:
        return np.matmul(a, b, out=out)
    _set(threads_for(macs))
    try:
        return np.matmul(a, b, out=out)
    finally:
        _set(_state["max"])
