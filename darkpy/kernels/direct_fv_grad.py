"""The gradients of the direct convolution across filters (kernels/direct_fv.py), for training.

- weight gradient (`weight_grad`): the forward's scheme with the delta transposed to filters last
  as the vectors and the input broadcast, FV filters x TV taps per microkernel summed over the
  whole batch (one unit per block: the same bits at any thread count);
- input gradient of a stride-1 layer (`input_grad_add`): the forward again, the delta correlated
  with the filters turned 180 degrees and transposed (`turned`), padding k − 1 − pad, added into
  the previous delta.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import PARALLEL_MIN, njit, simd
from .borrow import borrowed
from .direct_fv import _unit_jit, conv_forward
from .fv_planes import _pad_item, _source, _tables
from .fv_tiles import FV, _jit, _serial, _store2, _store8
from .microgemm import fma2


def turned(w):
    """The filters of the input gradient: w (n, c, k, k) turned 180 degrees and transposed to
    (c, n, k, k), contiguous (for `filters_last`)."""
    return np.ascontiguousarray(w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])


def input_grad_add(dx, d, wt, k, pad):
    """dx (B, C, H, W) += the input gradient of a stride-1 `conv_forward` whose delta (w.r.t. the
    raw product) is d (B, N, OH, OW): the correlation of d, padded by k − 1 − pad, with the filters
    turned 180 degrees and transposed (`turned`), laid out by `filters_last` in wt."""
    conv_forward(dx, d, wt, k, 1, 1, k - 1 - pad, add=True)


#: Taps per weight-gradient microkernel (`_wtile`): 6 taps x FV filters in twelve vectors. Against 4
#: taps (8 vectors), each layer's weight gradient alone at b32 (2 threads, Zen 3): 0.87-0.94x the time
#: on shapes-tiny's 1x1 layers on 8x8, digits' 16 -> 32 on 8x8 and 64 -> 10 on 4x4; 0.88x on a
#: 32 -> 16 3x3 on 8x8 at b128. The same sums in the same order: the same bits.
TV = 6


@_serial
def _wtile(out, src, item, dt, npad, S, B, toff, t0, pos, f0):
    """out (TV·FV,) := for taps t0..t0+TV−1 and filters f0..f0+FV−1 the sum over the batch's
    items b and output positions p of dt[(b·S + p)·npad + f] · src[b·item + pos[p] + toff[t]]."""
    o0, o1, o2, o3 = toff[t0], toff[t0 + 1], toff[t0 + 2], toff[t0 + 3]
    o4, o5 = toff[t0 + 4], toff[t0 + 5]
    z = simd.zero(dt)
    a00, a01, a10, a11, a20, a21, a30, a31, a40, a41, a50, a51 = z, z, z, z, z, z, z, z, z, z, z, z
    for b in range(B):
        for p in range(S):
            q = b * item + pos[p]
            r = (b * S + p) * npad + f0
            w0 = simd.load(dt, r)
            w1 = simd.load(dt, r + simd.LANES)
            a00, a01 = fma2(a00, a01, simd.get(src, q + o0), w0, w1)
            a10, a11 = fma2(a10, a11, simd.get(src, q + o1), w0, w1)
            a20, a21 = fma2(a20, a21, simd.get(src, q + o2), w0, w1)
            a30, a31 = fma2(a30, a31, simd.get(src, q + o3), w0, w1)
            a40, a41 = fma2(a40, a41, simd.get(src, q + o4), w0, w1)
            a50, a51 = fma2(a50, a51, simd.get(src, q + o5), w0, w1)
    _store8(out, a00, a01, a10, a11, a20, a21, a30, a31)
    _store2(out, 8, a40, a41)
    _store2(out, 10, a50, a51)


@_serial                # compiled on its own: inlined into the parallel twin it ran 5x slower
def _wgrad_tables(x, d, k, sy, sx, pad):
    """(source, plane values, row length, delta buffer, npad, tap offsets padded to whole TV by
    repeating the last, position offsets) of `weight_grad`; the source is x itself without
    padding, else a buffer for the padded planes; the buffers are filled by `_wgrad_fill`."""
    B = x.shape[0]
    N, oh, ow = d.shape[1], d.shape[2], d.shape[3]
    plane, wp, toff0, pos = _tables(x, k, sy, sx, pad, oh, ow)
    K = toff0.shape[0]
    toff = np.empty(-(-K // TV) * TV, np.int64)
    for t in range(toff.shape[0]):
        toff[t] = toff0[min(t, K - 1)]
    src = _source(x, pad, plane)
    npad = -(-N // FV) * FV
    return src, plane, wp, np.empty(B * oh * ow * npad, d.dtype), npad, toff, pos


@_jit
def _wgrad_fill(src, dt, x, d, b, pad, plane, wp, npad):
    """Item b's share of the buffers: its padded planes (when padded) and its delta transposed to
    (S, npad), filters last and zero past N."""
    src, dt, x, d = borrowed(src), borrowed(dt), borrowed(x), borrowed(d)
    if pad:
        _pad_item(src, x, b, pad, plane // wp, wp)
    N = d.shape[1]
    S = d.shape[2] * d.shape[3]
    d2 = d[b].reshape(N, S)
    for p in range(S):
        row = dt[(b * S + p) * npad:(b * S + p + 1) * npad]
        for f in range(N):
            row[f] = d2[f, p]
        for f in range(N, npad):
            row[f] = 0


@_unit_jit
def _wgrad_unit(dw, src, item, dt, npad, S, B, toff, pos, u, tgroups):
    """Unit u of `weight_grad`: filters FV·(u // tgroups)..., taps TV·(u % tgroups)..., added into
    dw (N, K)."""
    N, K = dw.shape
    f0 = (u // tgroups) * FV
    t0 = (u % tgroups) * TV
    out = np.empty(TV * FV, dw.dtype)
    _wtile(out, src, item, dt, npad, S, B, toff, t0, pos, f0)
    for j in range(min(TV, K - t0)):
        for f in range(min(FV, N - f0)):
            dw[f0 + f, t0 + j] += out[j * FV + f]


@njit(cache=True, nogil=True, fastmath={"contract"})
def _wgrad_serial(dw, x, d, k, sy, sx, pad):
    src, plane, wp, dt, npad, toff, pos = _wgrad_tables(x, d, k, sy, sx, pad)
    for b in range(x.shape[0]):
        _wgrad_fill(src, dt, x, d, b, pad, plane, wp, npad)
    item, tgroups = x.shape[1] * plane, toff.shape[0] // TV
    for u in range(npad // FV * tgroups):
        _wgrad_unit(dw, src, item, dt, npad, d.shape[2] * d.shape[3], d.shape[0], toff, pos, u,
                    tgroups)


@njit(cache=True, nogil=True, parallel=True, fastmath={"contract"})
def _wgrad_parallel(dw, x, d, k, sy, sx, pad):
    src, plane, wp, dt, npad, toff, pos = _wgrad_tables(x, d, k, sy, sx, pad)
    for b in prange(x.shape[0]):
        _wgrad_fill(src, dt, x, d, b, pad, plane, wp, npad)
    item, tgroups = x.shape[1] * plane, toff.shape[0] // TV
    for u in prange(npad // FV * tgroups):
        _wgrad_unit(dw, src, item, dt, npad, d.shape[2] * d.shape[3], d.shape[0], toff, pos, u,
                    tgroups)


def weight_grad(dw, x, d, sy, sx, pad):
    """dw (N, C, k, k) += the weight gradient of `conv_forward`: per filter and tap, the sum over
    the batch and the output positions of the delta d (B, N, OH, OW) (w.r.t. the raw product) times
    the input x (B, C, H, W) the tap reads. Each (FV filters, TV taps) block is one unit of work
    summed in a fixed order, so the result does not depend on the thread count. Serial below
    PARALLEL_MIN delta values."""
    N, k = dw.shape[0], dw.shape[2]
    run = _wgrad_serial if d.size < PARALLEL_MIN else _wgrad_parallel
    run(dw.reshape(N, -1), x, d, k, sy, sx, pad)
