"""Direct convolution for layers with few input channels (first layers: 1-4 channels).

A first layer's im2col matrix is thin (K = c·k·k = 9 or 27 rows) but as long as the image, so
im2col + GEMM spends much of its time writing and re-reading that matrix, and BLAS runs a 16x27
by 27xN product far below its rate. These kernels work on blocks of output rows instead:

- a block's input rows are gathered into small zero-padded planes split by phase,
  `P[c, qy, qx, r, t] = x_padded[c, (oy0 + r)·sy + qy, t·sx + qx]`, each row `Lw = OW + (k−1)//sx`
  values long, so that over the block's flattened positions `j = r·Lw + ox` every tap (c, ky, kx)
  reads ONE contiguous run of a plane, at offset `(ky//sy)·Lw + kx//sx` — whatever the stride and
  padding, with no bounds tests in the inner loops (positions with ox ≥ OW are computed and
  dropped: a few percent more work);
- forward: per filter, the block's outputs are the sum over the taps of weight × run, three taps
  of a kernel row per pass (3x3 layers: one pass per channel row instead of three), a contiguous
  loop the compiler vectorises;
- weight gradient: per filter and tap, the dot product of the block's delta (laid out the same way,
  zero at ox ≥ OW) with the tap's run. The sum runs over `WGRAD_GROUPS` fixed groups of blocks
  (independent of the thread count, so any machine and thread count gives the same result),
  whose partial sums are then added in order.

Like im2col these compute Darknet's cross-correlation.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from . import PARALLEL_MIN

#: Groups of row blocks whose weight-gradient partial sums are added in order at the end.
WGRAD_GROUPS = 16
#: Output positions per row block (rows of Lw values): its planes and sums stay in the L1/L2 caches.
BLOCK_POSITIONS = 1024

_jit = numba.njit(cache=True, nogil=True, inline="always")
_pjit = numba.njit(cache=True, nogil=True, parallel=True)
#: A helper of both twins that a parallel caller must not inline (see `_weight_grad_parts`).
_serial = numba.njit(cache=True, nogil=True)
#: The weight gradient's dot products may be reassociated: that is what lets them vectorise.
_fast = {"reassoc", "contract"}


#: Most filters for which the direct forward beat im2col + GEMM (single core, float32): 1.1-1.6x
#: faster at 16-32 filters on 1-3 channels; at 128 filters (cifar's first layer) GEMM is 1.4x faster.
MAX_FILTERS = 32


def supports(c: int, n: int, k: int, groups: int, dilation: int) -> bool:
    """Which layers these kernels handle: ungrouped, undilated, at most 4 input channels and
    MAX_FILTERS filters, kernel at most 7x7."""
    return groups == 1 and dilation == 1 and c <= 4 and n <= MAX_FILTERS and k <= 7


def block_rows(oh: int, ow: int, k: int, sx: int) -> int:
    """Output rows per block."""
    return max(1, min(oh, BLOCK_POSITIONS // (ow + (k - 1) // sx)))


@_jit
def _fill(pf, x, b, oy0, rows, sy, sx, pad, k, lw):
    """pf (C·sy·sx planes of R·lw values, R = rows + (k−1)//sy + 1): the phase planes of the
    input rows that output rows oy0..oy0+rows−1 of item b read (0 outside the image)."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    R = rows + (k - 1) // sy + 1
    for c in range(C):
        for qy in range(sy):
            for qx in range(sx):
                p0 = ((c * sy + qy) * sx + qx) * R * lw
                for r in range(R):
                    iy = (oy0 + r) * sy + qy - pad
                    dst = pf[p0 + r * lw:p0 + (r + 1) * lw]
                    if iy < 0 or iy >= H:
                        dst[:] = 0
                        continue
                    row = x[b, c, iy]
                    for t in range(lw):
                        ix = t * sx + qx - pad
                        dst[t] = row[ix] if 0 <= ix < W else 0


@_jit
def _run(pf, c, ky, kx, sy, sx, R, lw, M):
    """Tap (c, ky, kx)'s run of M values in the planes pf."""
    a = ((c * sy + ky % sy) * sx + kx % sx) * R * lw + (ky // sy) * lw + kx // sx
    return pf[a:a + M]


@_jit
def _forward_block(y, pf, acc, w, b, oy0, rows, sy, sx, lw):
    """y[b, :, oy0:oy0+rows, :] from the block's planes pf; acc: scratch of 2·rows·lw values."""
    N, C, k = w.shape[0], w.shape[1], w.shape[2]
    OW = y.shape[3]
    R = rows + (k - 1) // sy + 1
    M = rows * lw
    a0 = acc[:M]
    a1 = acc[M:2 * M]
    for f0 in range(0, N, 2):
        f1 = min(f0 + 1, N - 1)          # an odd last filter is computed twice
        a0[:] = 0
        a1[:] = 0
        for c in range(C):
            if k == 3:
                # two filters and the 9 taps of a channel per pass; slices, so that every index
                # is a loop counter (numba then emits no negative-index wraparound and the loop
                # vectorises: measured 9x)
                s0 = _run(pf, c, 0, 0, sy, sx, R, lw, M)
                s1 = _run(pf, c, 0, 1, sy, sx, R, lw, M)
                s2 = _run(pf, c, 0, 2, sy, sx, R, lw, M)
                s3 = _run(pf, c, 1, 0, sy, sx, R, lw, M)
                s4 = _run(pf, c, 1, 1, sy, sx, R, lw, M)
                s5 = _run(pf, c, 1, 2, sy, sx, R, lw, M)
                s6 = _run(pf, c, 2, 0, sy, sx, R, lw, M)
                s7 = _run(pf, c, 2, 1, sy, sx, R, lw, M)
                s8 = _run(pf, c, 2, 2, sy, sx, R, lw, M)
                g = w[f0, c]
                u0, u1, u2, u3, u4 = g[0, 0], g[0, 1], g[0, 2], g[1, 0], g[1, 1]
                u5, u6, u7, u8 = g[1, 2], g[2, 0], g[2, 1], g[2, 2]
                g = w[f1, c]
                v0, v1, v2, v3, v4 = g[0, 0], g[0, 1], g[0, 2], g[1, 0], g[1, 1]
                v5, v6, v7, v8 = g[1, 2], g[2, 0], g[2, 1], g[2, 2]
                for j in range(M):
                    t0, t1, t2, t3, t4 = s0[j], s1[j], s2[j], s3[j], s4[j]
                    t5, t6, t7, t8 = s5[j], s6[j], s7[j], s8[j]
                    a0[j] += ((u0 * t0 + u1 * t1 + u2 * t2) + (u3 * t3 + u4 * t4 + u5 * t5)
                              + (u6 * t6 + u7 * t7 + u8 * t8))
                    a1[j] += ((v0 * t0 + v1 * t1 + v2 * t2) + (v3 * t3 + v4 * t4 + v5 * t5)
                              + (v6 * t6 + v7 * t7 + v8 * t8))
                continue
            for ky in range(k):
                for kx in range(k):
                    s0 = _run(pf, c, ky, kx, sy, sx, R, lw, M)
                    u0 = w[f0, c, ky, kx]
                    v0 = w[f1, c, ky, kx]
                    for j in range(M):
                        a0[j] += u0 * s0[j]
                        a1[j] += v0 * s0[j]
        for r in range(rows):
            o0 = y[b, f0, oy0 + r]
            o1 = y[b, f1, oy0 + r]
            r0 = a0[r * lw:r * lw + OW]
            r1 = a1[r * lw:r * lw + OW]
            for ox in range(OW):
                o0[ox] = r0[ox]
                o1[ox] = r1[ox]


# The serial and parallel versions are separate functions: in a `parallel=True` function every
# array expression of the inlined helpers (`a0[:] = 0`, ...) outside a prange becomes a parallel
# region of its own, so a small layer's "serial" branch woke the thread pool hundreds of times per
# call (1.9 ms instead of 0.03 ms for digits' first layer at 2 threads).
@_jit
def _forward_plan(y, w, sy, sx, rows):
    """(lw, R, nblk, planes size, scratch size) of `conv_forward`'s row blocks."""
    OH, OW = y.shape[2], y.shape[3]
    C, k = w.shape[1], w.shape[2]
    lw = OW + (k - 1) // sx
    R = rows + (k - 1) // sy + 1
    return lw, (OH + rows - 1) // rows, C * sy * sx * R * lw, 2 * rows * lw


@_jit
def _forward_unit(y, x, w, pf, acc, t, nblk, sy, sx, pad, rows, lw):
    """Row block t (item t // nblk) of `conv_forward`."""
    oy0 = (t % nblk) * rows
    n = min(rows, y.shape[2] - oy0)
    _fill(pf, x, t // nblk, oy0, n, sy, sx, pad, w.shape[2], lw)
    _forward_block(y, pf, acc, w, t // nblk, oy0, n, sy, sx, lw)


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _conv_forward_serial(y, x, w, sy, sx, pad, rows):
    lw, nblk, npf, nacc = _forward_plan(y, w, sy, sx, rows)
    pf = np.empty(npf, y.dtype)
    acc = np.empty(nacc, y.dtype)
    for t in range(y.shape[0] * nblk):
        _forward_unit(y, x, w, pf, acc, t, nblk, sy, sx, pad, rows, lw)


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"contract"})
def _conv_forward_parallel(y, x, w, sy, sx, pad, rows):
    lw, nblk, npf, nacc = _forward_plan(y, w, sy, sx, rows)
    for t in prange(y.shape[0] * nblk):
        pf = np.empty(npf, y.dtype)
        acc = np.empty(nacc, y.dtype)
        _forward_unit(y, x, w, pf, acc, t, nblk, sy, sx, pad, rows, lw)


def conv_forward(y, x, w, sy, sx, pad, rows):
    """y: (B, N, OH, OW) := the correlation of x (B, C, H, W) with w (N, C, k, k), stride (sy, sx),
    zero padding `pad` on every side, `rows` output rows per block (`block_rows`). Serial below
    PARALLEL_MIN output values."""
    run = _conv_forward_serial if y.size < PARALLEL_MIN else _conv_forward_parallel
    run(y, x, w, sy, sx, pad, rows)


@numba.njit(cache=True, nogil=True, fastmath=_fast)   # not inlined: it would lose fastmath
def _wgrad_block(pw, pf, dd, d, b, oy0, rows, sy, sx, lw):
    """pw (N, C, k, k) += the weight gradient over output rows oy0..oy0+rows−1 of item b, from the
    block's planes pf and the delta d (B, N, OH, OW); dd: scratch of N·rows·lw values."""
    N, C, k = pw.shape[0], pw.shape[1], pw.shape[2]
    OW = d.shape[3]
    R = rows + (k - 1) // sy + 1
    M = rows * lw
    zero = np.zeros(1, pw.dtype)[0]
    for f in range(N):
        for r in range(rows):
            src = d[b, f, oy0 + r]
            dst = dd[(f * rows + r) * lw:(f * rows + r + 1) * lw]
            for ox in range(OW):
                dst[ox] = src[ox]
            dst[OW:] = 0
    for f in range(N):
        df = dd[f * M:(f + 1) * M]
        for c in range(C):
            for ky in range(k):
                if k == 3:
                    r0 = _run(pf, c, ky, 0, sy, sx, R, lw, M)
                    r1 = _run(pf, c, ky, 1, sy, sx, R, lw, M)
                    r2 = _run(pf, c, ky, 2, sy, sx, R, lw, M)
                    s0 = zero
                    s1 = zero
                    s2 = zero
                    for j in range(M):
                        dv = df[j]
                        s0 += dv * r0[j]
                        s1 += dv * r1[j]
                        s2 += dv * r2[j]
                    pw[f, c, ky, 0] += s0
                    pw[f, c, ky, 1] += s1
                    pw[f, c, ky, 2] += s2
                else:
                    for kx in range(k):
                        r0 = _run(pf, c, ky, kx, sy, sx, R, lw, M)
                        s0 = zero
                        for j in range(M):
                            s0 += df[j] * r0[j]
                        pw[f, c, ky, kx] += s0


@numba.njit(cache=True, nogil=True, inline="always")
def _wgrad_group(pw, x, d, g, ngroups, sy, sx, pad, rows):
    """Group g of `conv_weight_grad`: its share of the (item, row block) units, into pw."""
    B, N, OH, OW = d.shape
    C, k = pw.shape[1], pw.shape[2]
    lw = OW + (k - 1) // sx
    R = rows + (k - 1) // sy + 1
    nblk = (OH + rows - 1) // rows
    units = B * nblk
    pf = np.empty(C * sy * sx * R * lw, pw.dtype)
    dd = np.empty(N * rows * lw, pw.dtype)
    for t in range(g * units // ngroups, (g + 1) * units // ngroups):
        oy0 = (t % nblk) * rows
        n = min(rows, OH - oy0)
        _fill(pf, x, t // nblk, oy0, n, sy, sx, pad, k, lw)
        _wgrad_block(pw, pf, dd, d, t // nblk, oy0, n, sy, sx, lw)


# The two below are compiled on their own, not inlined: inlined into `_weight_grad_parallel`, the
# np.zeros and each `dw += part[g]` became parallel regions of their own (1 + WGRAD_GROUPS pool
# wake-ups per call besides the prange loop's).
@_serial
def _weight_grad_parts(dw, d, rows):
    """The zeroed partial sums of `conv_weight_grad`: one per group of row blocks."""
    B, N, OH = d.shape[0], d.shape[1], d.shape[2]
    ngroups = min(WGRAD_GROUPS, B * ((OH + rows - 1) // rows))
    return np.zeros((ngroups, N, dw.shape[1], dw.shape[2], dw.shape[3]), dw.dtype)


@_serial
def _add_parts(dw, part):
    for g in range(part.shape[0]):      # in order, whichever branch computed them
        dw += part[g]


@numba.njit(cache=True, nogil=True)
def _weight_grad_serial(dw, x, d, sy, sx, pad, rows):
    part = _weight_grad_parts(dw, d, rows)     # the same partial sums as in parallel
    for g in range(part.shape[0]):
        _wgrad_group(part[g], x, d, g, part.shape[0], sy, sx, pad, rows)
    _add_parts(dw, part)


@_pjit
def _weight_grad_parallel(dw, x, d, sy, sx, pad, rows):
    part = _weight_grad_parts(dw, d, rows)
    for g in prange(part.shape[0]):
        _wgrad_group(part[g], x, d, g, part.shape[0], sy, sx, pad, rows)
    _add_parts(dw, part)


def conv_weight_grad(dw, x, d, sy, sx, pad, rows):
    """dw (N, C, k, k) += the weight gradient of `conv_forward`: the correlation of the input
    x (B, C, H, W) with the delta d (B, N, OH, OW) (w.r.t. the raw product), `rows` as there.
    Serial (one group of row blocks) below PARALLEL_MIN delta values."""
    run = _weight_grad_serial if d.size < PARALLEL_MIN else _weight_grad_parallel
    run(dw, x, d, sy, sx, pad, rows)
