"""The 2x2 stride-2 max of an output plane, for kernels that finish an inference forward themselves
(Winograd's output transform, the direct convolution) when a `[maxpool]` that only they feed follows
(`outputs_plan.fuse_pools`): the plane, still in the cache, is pooled into the maxpool's output and
the full-size plane is never written to memory.

The same maxima as `[maxpool]`'s 2x2 path (layers/pooling.py): the four values in row-major window
order, a later one winning only when greater (Darknet's `>`), so ties keep the first and a NaN in
the first position stays.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from . import jit, simd
from .activations import LEAKY, LINEAR
from .bn import affine_act_row
from .epilogue import affine_act_vector


@jit(inline="always")
def max4(a, b, c, d):
    """The max of a, b, c, d in that order, a later value winning only when greater."""
    best = a
    if b > best:
        best = b
    if c > best:
        best = c
    if d > best:
        best = d
    return best


@jit(inline="always")
def max4v(a, b, c, d):
    """`max4` lane by lane on four vectors (`simd.greater_or`): the same bits, ties and NaNs."""
    best = simd.greater_or(b, a)
    best = simd.greater_or(c, best)
    return simd.greater_or(d, best)


@jit(inline="always")
def pool_pair(p, r0, r1):
    """p (w,) = the 2x2 stride-2 maxima of the two rows r0, r1 (2w+ values; the extra columns are
    left out), all three 1-D C-contiguous: LANES maxima at a time while 2·LANES values of both rows
    remain (each lane the four values compared in `max4`'s order, `simd.greater_or`: the same bits,
    ties and NaNs), then LANES/2 from one vector of each row where they remain (a 16-wide map's
    8-wide pooled rows: digits' first layer, 1 -> 16 on 16x16 with its pool, at b64 within the
    forward, 2 threads, 2-core AVX-512 Xeon: 147 -> 112 µs, the forward 0.89-0.94x the time), the
    rest one by one. Against `max4` alone, each layer's forward in one process,
    2 threads, 2-core AVX-512 Xeon: shapes-tiny's first layer (stride 2 on 128x128, pooled) at b64
    with the vector gather of its planes (kernels/direct.py) 0.93x the time."""
    n = min(p.shape[0], r0.shape[0] // 2, r1.shape[0] // 2) // simd.LANES * simd.LANES
    for t in range(0, n, simd.LANES):
        a0, a1 = simd.load(r0, 2 * t), simd.load(r0, 2 * t + simd.LANES)
        b0, b1 = simd.load(r1, 2 * t), simd.load(r1, 2 * t + simd.LANES)
        simd.store(p, t, max4v(simd.evens(a0, a1), simd.odds(a0, a1), simd.evens(b0, b1),
                               simd.odds(b0, b1)))
    if p.shape[0] - n >= simd.LANES // 2 and min(r0.shape[0], r1.shape[0]) >= 2 * n + simd.LANES:
        a, b = simd.load(r0, 2 * n), simd.load(r1, 2 * n)      # half a vector of maxima
        simd.store_low(p, n, max4v(simd.evens(a, a), simd.odds(a, a), simd.evens(b, b),
                                   simd.odds(b, b)))
        n += simd.LANES // 2
    for t in range(n, p.shape[0]):
        p[t] = max4(r0[2 * t], r0[2 * t + 1], r1[2 * t], r1[2 * t + 1])


@jit(inline="always")
def pools_first(k, off, act):
    """Whether the inference epilogue act(v·k + off), rounded to the output's dtype, may follow the
    2x2 maxima instead of preceding them with the same bits: for linear and leaky, non-decreasing
    when k > 0, so the greatest value maps to the greatest (ties stay ties) and a NaN stays a NaN
    in its place; an `off` of −0 is the one case where two equal sums could come out as −0 and
    +0. Not relu: it maps a NaN to 0, which a later value of the window then beats."""
    return ((act == LINEAR or act == LEAKY) and k > 0
            and not (off == 0 and math.copysign(1.0, off) < 0))


@jit(inline="always")
def pooled_epilogue_rows(p, p0, pw, h, x, lw, k, off, act):
    """p[p0:p0+h·pw] (h rows of pw values) := act(m·k + off) of the 2x2 stride-2 maxima m of x's
    rows (2h rows of lw ≥ 2·pw values from x[0]), for float32 p and x where `pools_first` holds
    (linear or leaky): the maxima in vectors as `pool_pair` takes them and the epilogue on them in
    the same registers, two pooled rows a vector when they are LANES/2 wide (rows 2r and 2r+2
    give the vector's halves, as one row's two halves would), then `pool_pair` and
    `affine_act_row` on what is left. The same bits as the maxima then `affine_act_row`; digits'
    first layer (1 -> 16 on 16x16, pooled to 8x8) at b64 in its forward, one thread: the maxima
    and the epilogue took 132 µs of its 176 as those two passes per plane."""
    kv = simd.splat(simd.widen(simd.zero(p)), k)
    ov = simd.splat(kv, off)
    L = simd.LANES
    first = 0
    if pw == L // 2 and lw >= L:
        for rr in range(h // 2):
            i = 4 * rr * lw
            a0, a2 = simd.load(x, i), simd.load(x, i + 2 * lw)
            b1, b3 = simd.load(x, i + lw), simd.load(x, i + 3 * lw)
            m = max4v(simd.evens(a0, a2), simd.odds(a0, a2), simd.evens(b1, b3), simd.odds(b1, b3))
            simd.store(p, p0 + 2 * rr * pw, simd.cast_like(p, affine_act_vector(m, kv, ov, act)))
        if h % 2 == 0:
            return
        first = h - 1
    for r in range(first, h):
        n = pw // L * L
        i = 2 * r * lw
        for t in range(0, n, L):
            a0, a1 = simd.load(x, i + 2 * t), simd.load(x, i + 2 * t + L)
            b0, b1 = simd.load(x, i + lw + 2 * t), simd.load(x, i + lw + 2 * t + L)
            m = max4v(simd.evens(a0, a1), simd.odds(a0, a1), simd.evens(b0, b1), simd.odds(b0, b1))
            simd.store(p, p0 + r * pw + t, simd.cast_like(p, affine_act_vector(m, kv, ov, act)))
        if n < pw:
            rest = p[p0 + r * pw + n:p0 + (r + 1) * pw]
            pool_pair(rest, x[i + 2 * n:i + lw], x[i + lw + 2 * n:i + 2 * lw])
            affine_act_row(rest, k, off, act)


@jit(inline="always")
def pool_rows(p, p0, pw, h, x, lw):
    """p[p0:p0+h·pw] (h rows of pw values) = the 2x2 stride-2 maxima of x's rows (2h rows of lw ≥
    2·pw values from x[0], 1-D): x's rows 2r, 2r+1 give row r (the columns past 2·pw are left
    out)."""
    for r in range(h):
        pool_pair(p[p0 + r * pw:p0 + (r + 1) * pw], x[2 * r * lw:(2 * r + 1) * lw],
                  x[(2 * r + 1) * lw:(2 * r + 2) * lw])


@jit(inline="always")
def epilogue_pool_flat(p, p0, pw, h, x, lw, k, off, act):
    """p[p0:p0+h·pw] (h rows of pw values) = the 2x2 stride-2 maxima of act(x·k + off), x a plane's
    sums in 2h rows of lw ≥ 2·pw values (p and x 1-D C-contiguous; x may be overwritten): where
    `pools_first` holds (linear and leaky, k > 0), the maxima of the sums and then the epilogue on
    them, a quarter of the values (digits' first layer at b64 in its forward, 2 threads, 2-core
    AVX-512 Xeon: 107 -> 88 µs), for float32 both in the same vectors (`pooled_epilogue_rows`);
    else the epilogue on x in place, then the maxima. The same bits every way."""
    if pools_first(k, off, act):
        if p.itemsize == 4:
            pooled_epilogue_rows(p, p0, pw, h, x, lw, k, off, act)
        else:
            pool_rows(p, p0, pw, h, x, lw)
            affine_act_row(p[p0:p0 + h * pw], k, off, act)
    else:
        affine_act_row(x[:2 * h * lw], k, off, act)
        pool_rows(p, p0, pw, h, x, lw)


@jit
def epilogue_pool_rows(p, x, k, off, act):
    """`epilogue_pool_flat` of 2-D planes: p (h, w) from x (2h, 2w+), both C-contiguous. Called
    once per plane or band (Winograd's paths), so compiled on its own: inlined, it was a large
    part of their kernels' cold compile (a call costs nothing next to a plane; the direct path,
    which pools a few rows at a time, inlines `epilogue_pool_flat` itself)."""
    epilogue_pool_flat(simd.flat(p), 0, p.shape[1], p.shape[0], simd.flat(x), x.shape[1], k, off,
                       act)


@functools.cache
def no_pool(dtype) -> np.ndarray:
    """The 'no pooled output' argument of the kernels that take one: an empty 4-d array (one per
    dtype, shared: nothing is ever written to it)."""
    return np.empty((0, 0, 0, 0), dtype)
