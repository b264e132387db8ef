"""The inference epilogue act(v·k + off) in SIMD vectors, for kernels that finish a forward from
their own accumulators (kernels/pool2x2.py, kernels/direct.py).

Each value is widened to float64, multiplied by k and added to off (a product and a sum, not
fused) and rounded back to the output's dtype, as `bn.affine_act_row`'s scalar loop does: the same
bits. Linear and leaky only (`in_vectors`); the other activations take `affine_act_row`.
"""
from __future__ import annotations

from . import jit, simd, vjit
from .activations import LEAKY, LINEAR
from .bn import affine_act_row


@jit(inline="always")
def in_vectors(y, act):
    """Whether `affine_act_vector` serves float32 output y under activation act."""
    return y.itemsize == 4 and (act == LINEAR or act == LEAKY)


@jit(inline="always")
def affine_act_vector(v, kv, ov, act):
    """act(v·k + off) in a vector (k, off: float64 vectors of LANES values), in float64."""
    z = simd.add(simd.mul(simd.widen(v), kv), ov)
    if act == LEAKY:
        z = simd.positive_or(z, simd.mul(z, simd.splat(kv, 0.1)))
    return z


@vjit
def affine_act_rows_into(y, y0, ow, rows, x, lw, k, off, act, stream=False):
    """y[y0:y0+rows·ow] (rows of ow values, 1-D C-contiguous) := act(x·k + off) of x's rows (rows
    of lw ≥ ow values from x[0]): one pass from the accumulators instead of a copy and then the
    epilogue on the output in place. In vectors where `in_vectors` holds: a row's last vector may
    run past its ow values into the next row's (written right after, in order) but never past
    the block's rows·ow values; what no whole vector covers, one value at a time. With `stream`,
    a row's whole vectors that are aligned go past the caches (`simd.store_stream`: the caller
    fences them)."""
    vectors = in_vectors(y, act)
    kv = simd.splat(simd.widen(simd.zero(y)), k)
    ov = simd.splat(kv, off)
    L = simd.LANES
    end = y0 + rows * ow
    for r in range(rows):
        d0 = y0 + r * ow
        t = 0
        past = stream and simd.aligned(y, d0)       # (then every vector of the row is aligned)
        while vectors and t < ow and d0 + t + L <= end:
            v = simd.cast_like(y, affine_act_vector(simd.load(x, r * lw + t), kv, ov, act))
            if past and t + L <= ow:
                simd.store_stream(y, d0 + t, v)
            else:
                simd.store(y, d0 + t, v)
            t += L
        if t < ow:
            dst = y[d0 + t:d0 + ow]
            src = x[r * lw + t:r * lw + ow]
            for i in range(ow - t):
                dst[i] = src[i]
            affine_act_row(dst, k, off, act)
