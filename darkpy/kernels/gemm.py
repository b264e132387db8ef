"""A row-blocked GEMM on the 8-row microkernel (microgemm.rows8x2) for the connected layers' and the
attention projections' products, C (+)= A · B, on AVX-512 machines.

Those products are tall and thin (a Transformer's 1024 rows x 128 → 512 values): OpenBLAS's
SkylakeX sgemm reaches 230-250 GFLOP/s on them at 2 threads (127 on one), packing both operands
for a K of 128-512; this one leaves A in place, walks B in panels of CV columns (packed once per
call when B is a transposed weight matrix, read in place when B's rows are whole vectors), and
gives each thread whole blocks of MB rows, so each value of C is one thread's, summed over k in
order (KB at a time): the same bits at any thread count. Measured on the 2-core AVX-512 Xeon
(2 threads, same process, alternating): 1024x128 @ 128x384 0.35 against 0.42 ms, 1024x128 @ 128x512
0.47 against 0.55, 1024x512 @ 512x128 0.47 against 0.57.

`add`: C += A·B, read and written once (no scratch product and no second pass to add it). A may
be the transpose of an array, read in place (a weight gradient's dᵀ: dW += dᵀ·x, straight into the
gradient), and a bias is where the sums start (C = bias + A·B, no pass of its own).
Only where the shapes fit (`fits`): rows a multiple of 8, columns of whole vectors, and AVX-512
(LANES = 16; the 8 x 2 block's sixteen accumulators are all of AVX2's registers, where OpenBLAS's
own kernels are the better choice).
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import jit, njit, pjit
from .bn import affine_act_row
from .microgemm import CV, rows8x1, rows8x2
from .simd import LANES

#: Rows per unit of parallel work (a multiple of 8) and k per pass over a panel (B's panel of KB x
#: CV values stays in L1 across a block's rows).
MB = 64
KB = 256
#: ... and with a transposed A (`matmul`'s a_t: a weight gradient's dᵀ), where each k reads a line
#: of A of its own besides B's row. tiny-gpt's four weight-gradient shapes (K = 1024 rows), 15
#: rounds alternating in one process (2 threads, 2-core AVX-512 Xeon): 0.90-0.97x the time of 256.
KB_T = 64
#: Multiply-adds from which `fits` takes this GEMM (below, one OpenBLAS thread is as good).
MIN_MACS = 1 << 22


def fits(m: int, k: int, n: int) -> bool:
    """This GEMM takes an (m, k) @ (k, n) product."""
    return LANES == 16 and m % 8 == 0 and n % LANES == 0 and m * k * n >= MIN_MACS


def fits_stacked(m: int, n: int) -> bool:
    """`stacked` takes products of m rows of n columns (whatever the size)."""
    return LANES == 16 and m >= 8 and n % LANES == 0


@pjit
def pack_transposed(bp, w):
    """bp (N·K,) <- wᵀ (K, N) of w (N, K), in panels of CV columns: bp[p·K·CV + k·CV + j] =
    w[p·CV + j, k]; a last panel of LANES columns when N is an odd number of vectors."""
    n, k = w.shape
    for p in prange((n + CV - 1) // CV):
        width = min(CV, n - p * CV)
        base = p * k * CV
        for kk in range(k):
            for j in range(width):
                bp[base + kk * width + j] = w[p * CV + j, kk]


@pjit
def matmul(c, a, b, packed, add, a_t, kb, bias):
    """c (M, N) = (add: +=) A @ B, all C-contiguous; A is a (M, K) itself, or (a_t) the transpose of
    a (K, M), read in place (a weight gradient's delta); B is b (K, N) itself, or (packed) the panels
    `pack_transposed` wrote (b flat); kb values of k per pass over a panel. Without `add`, a bias
    (N,) (empty: none) is where each row's sums start: c = bias + A @ B with no pass of its own.
    M % 8 == 0, N % LANES == 0 (`fits`)."""
    m = a.shape[1] if a_t else a.shape[0]
    for blk in prange((m + MB - 1) // MB):
        _block(c, a, b, packed, add, a_t, kb, bias, blk)


#: `matmul`'s work per block of rows, and `_rows`, compiled on their own: numba copies an inlined
#: function's IR at each call site and runs its parallel passes over the whole body, and the four
#: microkernels inlined here made the kernel's first call 16.9 s (7.9 s now).
@jit
def _block(c, a, b, packed, add, a_t, kb, bias, blk):
    """Rows blk·MB .. of `matmul`'s C."""
    m, k = (a.shape[1], a.shape[0]) if a_t else (a.shape[0], a.shape[1])
    n = c.shape[1]
    a1, b1, c1 = a.reshape(-1), b.reshape(-1), c.reshape(-1)
    m0 = blk * MB
    m1 = min(m0 + MB, m)
    for k0 in range(0, k, kb):
        k1 = min(k0 + kb, k)
        start = k0 == 0 and not add and bias.shape[0] > 0
        acc = add or k0 > 0 or start
        for v in range(0, n, CV):
            base, step = (v * k, min(CV, n - v)) if packed else (v, n)
            # A[i, kk] at a1[i·lstr + kk·lk] (run-time strides: `_rows` is compiled once for
            # both; tiny-gpt's products measured level with the inlined version's literal 1)
            if a_t:
                _rows(c1, a1, b1, m0, m1, n, v, 1, m, base, step, k0, k1, acc, start, bias)
            else:
                _rows(c1, a1, b1, m0, m1, n, v, k, 1, base, step, k0, k1, acc, start, bias)


@jit
def _rows(c1, a1, b1, m0, m1, n, v, lstr, lk, base, step, k0, k1, acc, start, bias):
    """`matmul`'s rows m0..m1−1 of C at columns v.. (CV, or the last LANES) over k0..k1−1."""
    width = min(CV, n - v)
    for i in range(m0, m1, 8):
        if start:
            _bias_rows(c1, i * n + v, n, bias, v, width)
        if width == CV:
            rows8x2(c1, i * n + v, n, a1, i * lstr, lstr, b1, base, step, k0, k1, acc, lk)
        else:
            rows8x1(c1, i * n + v, n, a1, i * lstr, lstr, b1, base, step, k0, k1, acc, lk)


@jit(inline="always")
def _bias_rows(c1, at, n, bias, v, width):
    """The eight rows of C from c1[at] (n apart), `width` columns from v := the bias's."""
    for r in range(8):
        for j in range(width):
            c1[at + r * n + j] = bias[v + j]


_NO_BIAS = np.empty(0, np.float32)


@pjit
def stacked(c, a, b, cols, kb, k_aff, off, act):
    """c[i] (M, N) = a (M, K) @ b[i] (K, N) for each matrix i of the stacks c and b (C-contiguous,
    3-D): a convolution's weights against each item's columns. Parallel over (matrix, run of
    `cols` columns, a multiple of CV) units, each summing over k in order, kb at a time: the same
    bits at any thread count. M ≥ 8, N % LANES == 0; when M is not a multiple of 8, the last
    block of 8 rows starts at M − 8 (its first rows computed twice, the same values) and k is summed
    in one pass (a second pass would add those rows twice). With k_aff, off (M,) float64 not empty,
    each unit's rows then go through act(·k_aff + off) (the inference epilogue) while they are in
    the cache."""
    runs = (c.shape[2] + cols - 1) // cols
    for u in prange(c.shape[0] * runs):
        _stacked_unit(c, a, b, cols, kb, k_aff, off, act, u)


@jit
def _stacked_unit(c, a, b, cols, kb, k_aff, off, act, u):
    """`stacked`'s unit u: matrix u // runs, its run u % runs of columns (compiled on its own, as
    `_block`)."""
    m, n = c.shape[1], c.shape[2]
    k = a.shape[1]
    kb = kb if m % 8 == 0 else k
    a1 = a.reshape(-1)
    runs = (n + cols - 1) // cols
    i = u // runs
    v0 = (u % runs) * cols
    v1 = min(v0 + cols, n)
    ci, bi = c[i].reshape(-1), b[i].reshape(-1)
    for k0 in range(0, k, kb):
        k1 = min(k0 + kb, k)
        for v in range(v0, v1, CV):
            for r8 in range(0, m, 8):
                r = min(r8, m - 8)
                if n - v >= CV:
                    rows8x2(ci, r * n + v, n, a1, r * k, k, bi, v, n, k0, k1, k0 > 0)
                else:
                    rows8x1(ci, r * n + v, n, a1, r * k, k, bi, v, n, k0, k1, k0 > 0)
    if k_aff.shape[0]:
        for r in range(m):
            affine_act_row(c[i, r, v0:v1], k_aff[r], off[r], act)


NO_AFFINE = np.empty(0)


def product(c: np.ndarray, a: np.ndarray, b: np.ndarray, add: bool = False,
            bias: np.ndarray | None = None) -> None:
    """c (M, N) = (add: +=) a (M, K) @ b (K, N) (+ bias (N,), without add) on this module's GEMM;
    a is C-contiguous or the transposed view of a C-contiguous array (read in place); b may be a
    transposed view of a weight matrix (N, K): it is packed first. The caller checked `fits`."""
    a_t = not a.flags.c_contiguous
    a = a.T if a_t else a
    kb = KB_T if a_t else KB
    bias = _NO_BIAS.astype(c.dtype) if bias is None else bias
    if b.flags.c_contiguous:
        matmul(c, a, b, False, add, a_t, kb, bias)
        return
    w = b.T if b.T.flags.c_contiguous else np.ascontiguousarray(b.T)
    bp = np.empty(b.size, b.dtype)
    pack_transposed(bp, w)
    matmul(c, a, bp, True, add, a_t, kb, bias)


# -- matrix-vector products ------------------------------------------------------------------------
#: Values of A from which `gemv` runs on all threads: a classifier head at batch 1 reads its weights
#: from memory, which one core does at about half the rate two do. darknet.cfg's 1024 -> 1000 (4 MB)
#: with its weights out of the caches (2-core AVX-512 Zen 5, 2 threads): 148 µs through numpy's
#: matmul (OpenBLAS's sgemv, one thread), 82 here; resnet50's 2048 -> 1000 253 -> 128 µs; with the
#: weights in the caches 55 -> 34 and 82 -> 61 µs.
GEMV_PARALLEL_MIN = 1 << 16
#: Rows per unit of parallel work.
GEMV_ROWS = 32


def gemv(y: np.ndarray, a: np.ndarray, x: np.ndarray) -> None:
    """y (M,) := a (M, K) @ x (K,), float32, a C-contiguous: each y[m] one dot product on one thread
    (vectorised, its sum in an order fixed by the machine, never by the thread count), blocks of
    GEMV_ROWS rows on numba's threads from GEMV_PARALLEL_MIN values of a."""
    if a.size >= GEMV_PARALLEL_MIN:
        _gemv_parallel(y, a, x)
    else:
        _gemv_rows(y, a, x, 0, a.shape[0])


@pjit
def _gemv_parallel(y, a, x):
    for u in prange((a.shape[0] + GEMV_ROWS - 1) // GEMV_ROWS):
        _gemv_rows(y, a, x, u * GEMV_ROWS, min(a.shape[0], (u + 1) * GEMV_ROWS))


# reassociated (vectorised) sums, not inlined into its callers, which would drop the flag
@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
def _gemv_rows(y, a, x, lo, hi):
    """Rows lo .. hi − 1 of `gemv`."""
    for m in range(lo, hi):
        acc = np.float32(0.0)
        for k in range(a.shape[1]):
            acc += a[m, k] * x[k]
        y[m] = acc
