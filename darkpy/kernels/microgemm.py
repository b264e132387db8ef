"""A register-blocked SIMD microkernel for small matrix products inside numba kernels: 4 rows ×
2 vectors of columns in eight vector accumulators (kernels/simd.py), summed over any range of the
shared dimension. Operands are flat arrays with offsets and strides, so a caller reads its
matrices in place (the fused attention, kernels/attention.py, reads a head's rows out of the
layer's time-major buffers).

Per step of the sum: two vector loads of the right operand's row, four scalars of the left one
broadcast, eight FMAs; with AVX-512 the eight accumulators are as many as two FMA ports with a
4-cycle latency keep busy.
"""
from __future__ import annotations

from . import jit, simd

#: Columns per microkernel: two vectors.
CV = 2 * simd.LANES


@jit(inline="always")
def rows4x2(out, o0, o1, o2, o3, lhs, l0, l1, l2, l3, rhs, r0, rstr, klo, khi):
    """out[o_i : o_i + CV] := Σ_{k in [klo, khi)} lhs[l_i + k] · rhs[r0 + k·rstr : … + CV] for the
    four rows i (a row may repeat: the same values are stored twice)."""
    z = simd.zero(rhs)
    a0 = a1 = b0 = b1 = c0 = c1 = d0 = d1 = z
    for k in range(klo, khi):
        ri = r0 + k * rstr
        v0 = simd.load(rhs, ri)
        v1 = simd.load(rhs, ri + simd.LANES)
        x = simd.get(lhs, l0 + k)
        a0 = simd.fma(a0, x, v0)
        a1 = simd.fma(a1, x, v1)
        x = simd.get(lhs, l1 + k)
        b0 = simd.fma(b0, x, v0)
        b1 = simd.fma(b1, x, v1)
        x = simd.get(lhs, l2 + k)
        c0 = simd.fma(c0, x, v0)
        c1 = simd.fma(c1, x, v1)
        x = simd.get(lhs, l3 + k)
        d0 = simd.fma(d0, x, v0)
        d1 = simd.fma(d1, x, v1)
    simd.store(out, o0, a0)
    simd.store(out, o0 + simd.LANES, a1)
    simd.store(out, o1, b0)
    simd.store(out, o1 + simd.LANES, b1)
    simd.store(out, o2, c0)
    simd.store(out, o2 + simd.LANES, c1)
    simd.store(out, o3, d0)
    simd.store(out, o3 + simd.LANES, d1)
