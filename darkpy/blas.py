"""BLAS threads per GEMM: one OpenBLAS thread for each, large ones cut into blocks on numba's threads.

OpenBLAS splits a GEMM statically between its threads and the calling thread waits (spinning, then
yielding) for the slowest. On a busy machine the woken worker waits for a core behind other
processes, and every GEMM pays that wait: on 2 cores shared with two other jobs (load ~4), a
shapes-tiny training step at b32 with 2 numba threads took 637 ms (median; 10th percentile 221)
with 2 BLAS threads and 147 ms (86) with 1, alternating step by step in one process; 1 numba and
1 BLAS thread took 145 ms (96). Numba's own parallel regions degrade far better (their waiting
thread sleeps, so the worker can run on its core). Small GEMMs are cheap to keep on one thread:
OpenBLAS itself already runs those below 262,144 multiply-adds single-threaded.

`matmul(a, b, out)` runs a float32 GEMM (or each of a stack) on one OpenBLAS thread below
BLAS_PARALLEL_MIN_MACS multiply-adds per matrix, else cut into blocks on numba's threads, one
single-threaded OpenBLAS call per block (`SPLIT`, kernels/cblas.py). The blocks are fixed by the
shape and numba's pool size (`split_parts`), never by the thread count of the call, so a product
gives the same bits at any thread count whatever OpenBLAS's kernels (its Haswell ones round a
product cut into parts apart from the whole one). Other dtypes (or without the ILP64 sgemm) run
on the count `configure` was given (darkpy.runtime.configure_threads calls it), put back after.
A stack of medium GEMMs (Winograd's 16 per layer, the per-item GEMMs of small layers) instead runs
as runs of matrices on numba's threads, or as concurrent streams on helper threads, one BLAS thread
each: see `STREAM_MIN_MACS`; one of a convolution's few filters (at most OWN_STACK_MAX_ROWS) against
each item's columns runs on darkpy's own GEMM (`gemm.stacked`). A switch is one C call (a
set-1/set-2 pair took 0.33 µs through ctypes; threadpoolctl's context manager looks the libraries up each time, far slower).
Without threadpoolctl, or with a BLAS that is not OpenBLAS, it is plain np.matmul.
"""
from __future__ import annotations

import itertools
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from .kernels import PARALLEL_MIN, cblas, gemm
from .kernels import pointwise as pw
from .kernels import im2col as ic

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
    """`np.matmul(a, b, out=out)`, each GEMM of a float32 product on one OpenBLAS thread: small ones
    as they are, large ones (BLAS_PARALLEL_MIN_MACS) cut into a fixed number of parts on numba's
    threads (`_split`), a stack's matrices as runs on numba's threads or concurrent streams
    (`STREAM_MIN_MACS`), or on darkpy's own GEMM (`OWN_STACK_MAX_ROWS`). Other dtypes on
    `threads_for` BLAS threads (float32 too without the ILP64 sgemm, kernels/cblas.py), then back
    to the run's count, so GEMMs elsewhere are unaffected. A float32 matrix-vector product (one
    column of out, or one row against a transposed matrix) runs on darkpy's `gemm.gemv`.
    Plain np.matmul until `configure` has run (a library user's own settings stay) or without
    OpenBLAS."""
    macs = a.shape[-2] * a.shape[-1] * b.shape[-1]
    if not _state["set"]:
        return np.matmul(a, b, out=out)
    if _gemv(a, b, out):
        return out
    stack = math.prod(out.shape[:-2]) if out is not None and out.ndim >= 3 else 1
    if _own_stack(a, b, out, macs * stack):
        return out
    if stack > 1 and macs < STREAM_MAX_MACS and macs * stack >= STREAM_MIN_MACS:
        streams = min(_state["max"], stack, numba.get_num_threads())
        if not _split_stack(a, b, out, stack, streams):
            _streams(a, b, out, streams)
        return out
    if macs <= OPENBLAS_SERIAL_MAX_MACS:
        return np.matmul(a, b, out=out)
    if macs >= BLAS_PARALLEL_MIN_MACS and _split(a, b, out, stack):
        return out
    _set(threads_for(macs))
    try:
        return np.matmul(a, b, out=out)
    finally:
        _set(_state["max"])


def _gemv(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> bool:
    """out := a @ b by `gemm.gemv` where it is one float32 matrix-vector product: a (M, K)
    C-contiguous and b K values in a column (out M values), or a: one row of K values and b the
    transpose of a C-contiguous (N, K) matrix (out N values), each operand a contiguous array (out
    too, any shape); whether it ran. (numpy runs either on OpenBLAS's sgemv, on one thread here.)"""
    if not (GEMV and out is not None and out.flags.c_contiguous
            and a.dtype == b.dtype == out.dtype == np.float32):
        return False
    k = a.shape[-1]
    if (a.ndim == 2 and a.flags.c_contiguous and b.size == k == b.shape[-2]
            and b.flags.c_contiguous and out.size == a.shape[0]):
        gemm.gemv(out.reshape(-1), a, b.reshape(-1))
        return True
    if (b.ndim == 2 and b.T.flags.c_contiguous and a.size == k == b.shape[0]
            and a.flags.c_contiguous and out.size == b.shape[1]):
        gemm.gemv(out.reshape(-1), b.T, a.reshape(-1))
        return True
    return False


#: `matmul` runs a float32 matrix-vector product on `gemm.gemv` (False: numpy's, to compare).
GEMV = True


#: A float32 GEMM of at least BLAS_PARALLEL_MIN_MACS multiply-adds, or a stack of them, runs cut
#: into blocks on numba's threads (kernels/cblas.py: one single-threaded OpenBLAS call per block,
#: on the numba workers that are still spinning from the layer before), by blocks of rows of the
#: output when it has at least as many rows as columns, else of columns. Stacks of such GEMMs ran
#: each matrix on OpenBLAS's two threads until 2026-12-06; on numba's threads, whole forwards or
#: steps alternating in one process (2 threads, 2-core Zen 5 EPYC, SkylakeX kernels): resnet50 at
#: b4 0.76x the time, darknet19 at b64 0.93x, cifar at b64 0.94x (its 512 -> 512 Winograd layers
#: 31.1 -> 26.6 ms), yolov3-tiny at b64 0.96x, yolov4-tiny at b64 0.97x, cifar's training step at
#: b128 0.96x; resnet50 at b1 and b64, yolov3-tiny at b1, tiny.cfg, darknet19's, shapes-tiny's,
#: digits' and tiny-gpt's training level (within 2 %). False: numpy's product on the run's BLAS
#: threads.
SPLIT = True
#: Fewest multiply-adds per block: OpenBLAS runs products of up to 100³ on small-matrix kernels,
#: which are slow for a part of a large product.
SPLIT_MIN_PART_MACS = 1 << 21


def _operand(x: np.ndarray):
    """(array, CBLAS transpose flag, leading dimension) that reads the 2-D x in place, or None."""
    if x.flags.c_contiguous:
        return x, cblas.NO_TRANS, x.shape[1]
    if x.T.flags.c_contiguous:
        return x.T, cblas.TRANS, x.shape[0]
    return None


def _matrices(x: np.ndarray, count: int):
    """(address, CBLAS transpose flag, leading dimension, floats from one matrix to the next) that
    read x in place as `count` matrices (a 2-D x: the same one for all), or None."""
    if x.ndim == 2:
        op = _operand(x)
        return None if op is None else (x.ctypes.data, op[1], op[2], 0)
    flat = x.view()
    try:
        flat.shape = (-1, *x.shape[-2:])            # without a copy, or AttributeError
    except AttributeError:
        return None
    op = _operand(flat[0])
    if flat.shape[0] != count or op is None or flat.strides[0] % x.itemsize:
        return None
    return flat.ctypes.data, op[1], op[2], flat.strides[0] // x.itemsize


def _split_stack(a: np.ndarray, b: np.ndarray, out: np.ndarray, count: int, parts: int) -> bool:
    """out := a @ b, a stack of `count` float32 GEMMs, by `cblas.stacked_sgemm` in `parts` runs of
    matrices on numba's threads (what `_streams` does on helper threads, without handing work to
    another pool), when SPLIT, the sgemm is there and every operand reads in place; whether it ran."""
    if not _splittable(a, b, out):
        return False
    ma, mb = _matrices(a, count), _matrices(b, count)
    if ma is None or mb is None:
        return False
    m, n, k = out.shape[-2], out.shape[-1], a.shape[-1]
    one_blas_thread(cblas.stacked_sgemm, out.ctypes.data, *ma, *mb, m, n, k, count, parts)
    return True


def _split(a: np.ndarray, b: np.ndarray, out: np.ndarray | None, count: int = 1) -> bool:
    """out := a @ b, one float32 GEMM or a stack of `count` (a or b possibly one matrix for all), by
    `cblas.split_stacked_sgemm`: each matrix cut into `split_parts` blocks of rows of out (when it
    has at least as many rows as columns, else of columns), count · parts single-threaded sgemm
    calls on numba's current threads. Operands that do not read in place are copied first, an out
    that is not C-contiguous is written through a copy. Whether it ran: when SPLIT, float32 and
    the sgemm is there."""
    if not (SPLIT and out is not None and a.dtype == b.dtype == out.dtype == np.float32
            and cblas.load()):
        return False
    m, n, k = out.shape[-2], out.shape[-1], a.shape[-1]
    target = out
    if not out.flags.c_contiguous:
        out = np.empty(out.shape, out.dtype)
    if _matrices(a, count) is None:     # (the copies stay referenced until the call returns)
        a = np.ascontiguousarray(np.broadcast_to(a, out.shape[:-2] + a.shape[-2:]))
    if _matrices(b, count) is None:
        b = np.ascontiguousarray(np.broadcast_to(b, out.shape[:-2] + b.shape[-2:]))
    ma, mb = _matrices(a, count), _matrices(b, count)
    one_blas_thread(cblas.split_stacked_sgemm, out.ctypes.data, *ma, *mb, m, n, k, count,
                    split_parts(m, n, k, count), m >= n)
    if target is not out:
        target[...] = out
    return True


def split_parts(m: int, n: int, k: int, count: int = 1) -> int:
    """Blocks each matrix of a large GEMM (m x k @ k x n, a stack of `count`) is cut into by
    `_split`: enough, with the stack's other matrices, for every thread of numba's pool
    (NUMBA_NUM_THREADS), each block past SPLIT_MIN_PART_MACS multiply-adds and at least a block of
    8 rows (or 16 columns) of the output; whole matrices for a stack of at least as many matrices
    as the pool has threads. Fixed by the shape and the pool's size, never by the thread count the
    call runs on: OpenBLAS's Haswell kernels round a product cut into parts apart from the whole
    one, so a count that followed the threads gave each thread count its own bits."""
    pool = numba.config.NUMBA_NUM_THREADS
    if count >= pool:
        return 1
    blocks = m // 8 if m >= n else n // 16
    return max(1, min(-(-pool // count), m * n * k // SPLIT_MIN_PART_MACS, blocks))


def _splittable(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> bool:
    """What both splits need: SPLIT, float32 operands, a C-contiguous out, and the sgemm."""
    return (SPLIT and out is not None and out.flags.c_contiguous
            and a.dtype == b.dtype == out.dtype == np.float32 and cblas.load())


def sets_threads() -> bool:
    """Whether `configure` has run and found how to set OpenBLAS's thread count (what
    `one_blas_thread` needs)."""
    return bool(_state["set"])


def one_blas_thread(kernel, *args) -> None:
    """kernel(*args) with OpenBLAS on one thread (each of its calls is single-threaded: a kernel
    calling OpenBLAS from numba's threads), then the run's count back, so GEMMs elsewhere are
    unaffected. Only where `sets_threads()`."""
    _set(1)
    try:
        kernel(*args)
    finally:
        _set(_state["max"])


#: A convolution's GEMMs of few filters, its weights (M, K) against each item's columns (K, N),
#: M at most OWN_STACK_MAX_ROWS, run on darkpy's own GEMM (`gemm.stacked`, OWN_GEMM): OpenBLAS packs
#: the whole column matrix for a product of 16 or 32 rows. Its k runs OWN_STACK_KB at a time, so
#: that the rows of the columns it streams stay few. Each stack alone, 2 threads, min of 15 calls
#: alternating in one process (2-core AVX-512 Xeon), against `matmul`'s OpenBLAS calls (same bits):
#: tiny.cfg's 1x1 layers at b64, 32 -> 16 and 128 -> 16 on 56x56 0.72x and 0.69x the time, 128 -> 32
#: and 256 -> 32 on 28x28 0.80x and 0.87x; 128 -> 16 at b1 0.71x. 64 rows lost (1.2-1.7x).
OWN_STACK_MAX_ROWS = 32
OWN_STACK_KB = 32


def _own_stack(a: np.ndarray, b: np.ndarray, out: np.ndarray | None, macs: int) -> bool:
    """out (…, M, N) := a (M, K) @ b (…, K, N) by `gemm.stacked` where it applies (OWN_GEMM, at
    least STREAM_MIN_MACS in all, M ≤ OWN_STACK_MAX_ROWS, `gemm.fits_stacked`, one dtype,
    C-contiguous operands); whether it ran. Parallel over items and, for a small batch, over runs of columns."""
    if not (OWN_GEMM and out is not None and out.ndim >= 3 and a.ndim == 2 and b.ndim == out.ndim
            and macs >= STREAM_MIN_MACS):
        return False
    (m, k), n = a.shape, out.shape[-1]
    if (m > OWN_STACK_MAX_ROWS or not gemm.fits_stacked(m, n) or b.shape[-2:] != (k, n)
            or b.shape[:-2] != out.shape[:-2] or not a.dtype == b.dtype == out.dtype
            or not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous)):
        return False
    count = out.size // (m * n)
    gemm.stacked(out.reshape(count, m, n), a, b.reshape(count, k, n), _stack_cols(count, n),
                 OWN_STACK_KB, gemm.NO_AFFINE, gemm.NO_AFFINE, 0)
    return True


def _stack_cols(count: int, n: int) -> int:
    """Columns per unit of `gemm.stacked` over `count` matrices of n columns: at least 4 units per
    thread (runs of columns for a small batch)."""
    runs = max(1, -(-4 * numba.get_num_threads() // count))
    return max(gemm.CV, -(-n // runs // gemm.CV) * gemm.CV)


def pointwise(y: np.ndarray, x: np.ndarray, w: np.ndarray, k: np.ndarray = gemm.NO_AFFINE,
              off: np.ndarray = gemm.NO_AFFINE, act: int = 0) -> None:
    """y (B, N, P) := act(w (N, C) @ x[b] (C, P) · k + off) for each item b, float32, C-contiguous:
    a 1x1 convolution's inference forward over a batch of large outputs with its epilogue fused
    (kernels/pointwise.py: `blas_forward`, OpenBLAS on one thread per call from numba's threads),
    or, up to OWN_STACK_MAX_ROWS filters where it fits, on darkpy's own stacked GEMM (as `matmul`
    would run the product), the epilogue applied to each of its units. Only where
    `sets_threads()`."""
    B, N, P = y.shape
    if OWN_GEMM and N <= OWN_STACK_MAX_ROWS and gemm.fits_stacked(N, P):
        gemm.stacked(y, w, x, _stack_cols(B, P), OWN_STACK_KB, k, off, act)
    else:
        one_blas_thread(pw.blas_forward, y, x, w, k, off, act)


#: `product` takes darkpy's own GEMM where it fits (False: BLAS for every product, to compare).
#: tiny-gpt's training step at b16 (2 threads, alternating in one process): 0.93x the time.
OWN_GEMM = True


def product(out: np.ndarray, a: np.ndarray, b: np.ndarray, add: bool = False,
            scratch: np.ndarray | None = None, bias: np.ndarray | None = None) -> np.ndarray:
    """out (M, N) = (add: +=) a (M, K) @ b (K, N), 2-D, out C-contiguous: on darkpy's own GEMM
    (kernels/gemm.py: tall products on AVX-512, adding in place; a may be a transposed view, as a
    weight gradient's dᵀ) where it `fits`, else `matmul` (into `scratch`, shaped like out, then
    added in parallel, when `add`). A `bias` (N,), only without `add`, is added to every row (by
    the own GEMM as where its sums start)."""
    assert bias is None or not add, "a bias only for a product that is written, not added"
    m, k = a.shape
    n = b.shape[1]
    a_ok = a.flags.c_contiguous or a.T.flags.c_contiguous
    if OWN_GEMM and gemm.fits(m, k, n) and a_ok and out.flags.c_contiguous:
        gemm.product(out, a, b, add, bias)
    elif add and out.size >= PARALLEL_MIN:
        ic.add_into(out.reshape(-1), matmul(a, b, out=scratch).reshape(-1))
    elif add:
        out += matmul(a, b, out=scratch)
    else:
        matmul(a, b, out=out)
        if bias is not None:
            out += bias
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
