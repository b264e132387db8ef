"""The weight gradient of the direct convolution (kernels/direct.py), on the same row blocks.

Per filter and tap, the dot product of the block's delta (laid out as the phase planes' runs, zero
at ox ≥ OW) with the tap's run of the block's phase planes (`direct_blocks._fill`). The sum runs over
WGRAD_GROUPS fixed groups of blocks (independent of the thread count, so any machine and thread
count gives the same result), whose partial sums are then added in order.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import PARALLEL_MIN, njit
from .borrow import borrowed
from .direct import FILTERS_PER_PASS, _four, _jit, _serial
from .direct_blocks import (PREFETCH_ROWS, _fill, _run, block_input_rows, prefetch_block,
                            prefetch_rows)

#: Groups of row blocks whose weight-gradient partial sums are added in order at the end.
WGRAD_GROUPS = 16
#: The weight gradient's dot products may be reassociated: that is what lets them vectorise.
_fast = {"reassoc", "contract"}
_pjit = njit(cache=True, nogil=True, parallel=True)


@njit(cache=True, nogil=True, fastmath=_fast)   # not inlined: it would lose fastmath
def _wgrad_block(pw, pf, dd, d, b, oy0, rows, sy, sx, lw):
    """pw (N, C, k, k) += the weight gradient over output rows oy0..oy0+rows−1 of item b, from the
    block's planes pf and the delta d (B, N, OH, OW); dd: scratch of N·rows·lw values."""
    pw, pf, dd, d = borrowed(pw), borrowed(pf), borrowed(dd), borrowed(d)
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
    if k == 3:
        for f0 in range(0, N, FILTERS_PER_PASS):
            _wgrad_filters3(pw, pf, dd, f0, C, R, sy, sx, lw, M)
        return
    for f in range(N):
        df = dd[f * M:(f + 1) * M]
        for c in range(C):
            for ky in range(k):
                for kx in range(k):
                    r0 = _run(pf, c, ky, kx, sy, sx, R, lw, M)
                    s0 = zero
                    for j in range(M):
                        s0 += df[j] * r0[j]
                    pw[f, c, ky, kx] += s0


@njit(cache=True, nogil=True, fastmath=_fast)
def _wgrad_filters3(pw, pf, dd, f0, C, R, sy, sx, lw, M):
    """`_wgrad_block`'s dot products of 3x3 filters f0..f0+3 (those below N): per channel and
    kernel row, the three taps' runs are read once for the four filters' deltas (1.5x faster
    than filter by filter)."""
    pw, pf, dd = borrowed(pw), borrowed(pf), borrowed(dd)
    _, f1, f2, f3 = _four(f0, pw.shape[0])     # past the last: computed, never added (_add_row)
    d0 = dd[f0 * M:(f0 + 1) * M]
    d1 = dd[f1 * M:(f1 + 1) * M]
    d2 = dd[f2 * M:(f2 + 1) * M]
    d3 = dd[f3 * M:(f3 + 1) * M]
    zero = np.zeros(1, pw.dtype)[0]
    for c in range(C):
        for ky in range(3):
            r0 = _run(pf, c, ky, 0, sy, sx, R, lw, M)
            r1 = _run(pf, c, ky, 1, sy, sx, R, lw, M)
            r2 = _run(pf, c, ky, 2, sy, sx, R, lw, M)
            s00 = s01 = s02 = s10 = s11 = s12 = zero
            s20 = s21 = s22 = s30 = s31 = s32 = zero
            for j in range(M):
                t0, t1, t2 = r0[j], r1[j], r2[j]
                e0, e1, e2, e3 = d0[j], d1[j], d2[j], d3[j]
                s00 += e0 * t0
                s01 += e0 * t1
                s02 += e0 * t2
                s10 += e1 * t0
                s11 += e1 * t1
                s12 += e1 * t2
                s20 += e2 * t0
                s21 += e2 * t1
                s22 += e2 * t2
                s30 += e3 * t0
                s31 += e3 * t1
                s32 += e3 * t2
            _add_row(pw, f0, c, ky, s00, s01, s02)
            _add_row(pw, f0 + 1, c, ky, s10, s11, s12)
            _add_row(pw, f0 + 2, c, ky, s20, s21, s22)
            _add_row(pw, f0 + 3, c, ky, s30, s31, s32)


@_jit
def _add_row(pw, f, c, ky, s0, s1, s2):
    """pw[f, c, ky, :] += (s0, s1, s2) when filter f exists (f < N)."""
    if f < pw.shape[0]:
        pw[f, c, ky, 0] += s0
        pw[f, c, ky, 1] += s1
        pw[f, c, ky, 2] += s2


@_serial        # on its own: once for both twins, and outside the parallel one's parfor passes
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
    lo, hi = g * units // ngroups, (g + 1) * units // ngroups
    for t in range(lo, hi):
        oy0 = (t % nblk) * rows
        n = min(rows, OH - oy0)
        if PREFETCH_ROWS and t + 1 < hi:        # the next block's input and delta rows
            prefetch_block(x, t + 1, nblk, rows, sy, pad, k)
            b, r0, r1 = block_input_rows(t + 1, nblk, rows, 1, 0, 1)
            prefetch_rows(d, b, r0, r1)
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
    """dw += each partial sum, in order (whichever branch computed them). Loops: the array
    expression `dw += part[g]` took numba 2.8 s to compile."""
    N, C, K1, K2 = dw.shape
    for g in range(part.shape[0]):
        for f in range(N):
            for c in range(C):
                for i in range(K1):
                    for j in range(K2):
                        dw[f, c, i, j] += part[g, f, c, i, j]


@njit(cache=True, nogil=True)
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
