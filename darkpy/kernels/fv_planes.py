"""What the kernels of the direct convolution across filters (kernels/direct_fv.py,
direct_fv_grad.py) read besides the layer's own arrays: the taps' and positions' offsets into the
input's planes, zero-padded copies of those planes, and the inference epilogue padded to whole
microkernels. The forward makes them once for a kernel call it keeps (kernels/kernel_call.py,
`prepared`), else at each call.
"""
from __future__ import annotations

import numpy as np

from . import simd
from .fv_tiles import FV, _jit, _serial


@_jit
def _tables(x, k, sy, sx, pad, oh, ow):
    """(plane values, row length, tap offsets, position offsets) of the source: x's own planes
    without padding, else zero-padded copies; the positions padded to whole microkernels by
    repeating the last (computed again, written once)."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    if pad == 0:
        hp, wp = H, W
    else:
        hp, wp = (oh - 1) * sy + k, (ow - 1) * sx + k
    toff = np.empty(C * k * k, np.int64)
    for c in range(C):
        for ky in range(k):
            for kx in range(k):
                toff[(c * k + ky) * k + kx] = c * hp * wp + ky * wp + kx
    S = oh * ow
    pos = np.empty(-(-S // 24) * 24, np.int64)     # whole microkernels of 4, 6 and 8 positions
    for p in range(pos.shape[0]):
        q = min(p, S - 1)
        pos[p] = (q // ow) * sy * wp + (q % ow) * sx
    return hp * wp, wp, toff, pos


@_jit
def _source(x, pad, plane):
    """What the kernels read: x itself (flat) without padding, else a buffer of B·C padded planes
    of `plane` values."""
    n = x.shape[0] * x.shape[1] * plane
    return x.reshape(n) if pad == 0 else np.empty(n, x.dtype)


@_jit
def _pad_item(xp, x, b, pad, hp, wp):
    """xp[b] (C·hp·wp values from b·C·hp·wp) := item b's planes, zero-padded by `pad` before: the
    item's values zeroed in one pass, then its rows copied in (`_fill_item`; testing each value
    for the border, or slicing each short row, took as long as a 4x4 map's microkernels: digits'
    32 -> 64 layer at b64, one thread, 77 µs of 453, now 35)."""
    base = b * x.shape[1] * hp * wp
    xp[base:base + x.shape[1] * hp * wp] = 0
    _fill_item(xp, x, b, pad, hp, wp)


@_jit
def _fill_item(xp, x, b, pad, hp, wp):
    """The inside of xp[b]'s padded planes (see `_pad_item`) := item b's rows, the border left as
    it is: in vectors and half vectors where they fit (digits' 16 -> 32 on 8x8 at b64, one
    thread: the copy 49 -> 27 µs of the layer's 345)."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    base = b * C * hp * wp
    rows, cols = min(H, hp - pad), min(W, wp - pad)     # the input inside the padded planes
    xf = x.reshape(x.size)
    for c in range(C):
        for iy in range(rows):
            d = base + (c * hp + iy + pad) * wp + pad
            s = ((b * C + c) * H + iy) * W
            ix = 0
            while ix + simd.LANES <= cols:
                simd.store(xp, d + ix, simd.load(xf, s + ix))
                ix += simd.LANES
            if cols - ix >= simd.LANES // 2 and s + ix + simd.LANES <= xf.shape[0]:
                simd.store_low(xp, d + ix, simd.load(xf, s + ix))     # an 8-wide row
                ix += simd.LANES // 2
            for j in range(ix, cols):
                xp[d + j] = xf[s + j]


@_serial               # on its own: in the parallel twin its array expressions were parallel regions
def _padded(k, n):
    """k (N,) float64 zero-padded to n values (empty when k is). A loop: the slice assignment
    `kp[:N] = k` took numba 2 s to compile (a cold start's)."""
    kp = np.zeros(n if k.shape[0] else 0, np.float64)
    for i in range(k.shape[0]):
        kp[i] = k[i]
    return kp


@_serial
def prepared(x, k, sy, sx, pad, oh, ow, kk, off, n):
    """What the twins read besides the layer's arrays, made once for a kept call
    (kernels/kernel_call.py), else at each: (src, row length, tap offsets, position offsets, k
    and off zero-padded to the n filters' whole FV). src is x itself (flat) without padding, else
    B·C zeroed padded planes (`_tables`), whose insides the twins fill at each call and whose
    borders stay zero. Made at each call inside the twins, these took shapes-tiny's 64 -> 128 on
    8x8 at b1 29.5 µs against 25.5 (2 threads, 2-core Zen 5), digits' 16 -> 32 and 32 -> 64 on
    8x8 and 4x4 4.3 and 4.6 µs against 3.95 and 4.2 (one thread): the tables, the padded epilogue
    and the padding's own parallel region."""
    plane, wp, toff, pos = _tables(x, k, sy, sx, pad, oh, ow)
    n_src = x.shape[0] * x.shape[1] * plane
    src = x.reshape(n_src) if pad == 0 else np.zeros(n_src, x.dtype)
    groups = -(-n // FV)
    return src, wp, toff, pos, _padded(kk, groups * FV), _padded(off, groups * FV)
