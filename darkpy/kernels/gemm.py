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

`add`: C += A·B, read and written once (no scratch product and no second pass to add it).
Only where the shapes fit (`fits`): rows a multiple of 8, columns of whole vectors, and AVX-512
(LANES = 16; the 8 x 2 block's sixteen accumulators are all of AVX2's registers, where OpenBLAS's
own kernels are the better choice).
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import pjit
from .microgemm import CV, rows8x1, rows8x2
from .simd import LANES

#: Rows per unit of parallel work (a multiple of 8) and k per pass over a panel (B's panel of KB x
#: CV values stays in L1 across a block's rows).
MB = 64
KB = 256
#: Multiply-adds from which `fits` takes this GEMM (below, one OpenBLAS thread is as good).
MIN_MACS = 1 << 22


def fits(m: int, k: int, n: int) -> bool:
    """This GEMM takes an (m, k) @ (k, n) product."""
    return LANES == 16 and m % 8 == 0 and n % LANES == 0 and m * k * n >= MIN_MACS


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
def matmul(c, a, b, packed, add):
    """c (M, N) = (add: +=) a (M, K) @ B, all C-contiguous; B is b (K, N) itself, or (packed) the
    panels `pack_transposed` wrote (b flat). M % 8 == 0, N % LANES == 0 (`fits`)."""
    m, k = a.shape
    n = c.shape[1]
    a1, b1, c1 = a.reshape(-1), b.reshape(-1), c.reshape(-1)
    for blk in prange((m + MB - 1) // MB):
        m0 = blk * MB
        m1 = min(m0 + MB, m)
        for k0 in range(0, k, KB):
            k1 = min(k0 + KB, k)
            acc = add or k0 > 0
            for v in range(0, n, CV):
                width = min(CV, n - v)
                base, step = (v * k, width) if packed else (v, n)
                for i in range(m0, m1, 8):
                    if width == CV:
                        rows8x2(c1, i * n + v, n, a1, i * k, k, b1, base, step, k0, k1, acc)
                    else:
                        rows8x1(c1, i * n + v, n, a1, i * k, k, b1, base, step, k0, k1, acc)


def product(c: np.ndarray, a: np.ndarray, b: np.ndarray, add: bool = False) -> None:
    """c (M, N) = (add: +=) a (M, K) @ b (K, N) (b may be a transposed view of a weight matrix
    (N, K): it is packed first), on this module's GEMM; the caller checked `fits`."""
    if b.flags.c_contiguous:
        matmul(c, a, b, False, add)
        return
    w = b.T if b.T.flags.c_contiguous else np.ascontiguousarray(b.T)
    bp = np.empty(b.size, b.dtype)
    pack_transposed(bp, w)
    matmul(c, a, bp, True, add)
