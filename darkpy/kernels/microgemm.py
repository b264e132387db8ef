"""Register-blocked SIMD microkernels for small matrix products inside numba kernels: 4 rows x 2
vectors of columns in eight vector accumulators (kernels/simd.py, `rows4x2`: rows anywhere), 8
rows x 2 vectors in sixteen (`rows8x2`: rows evenly spaced) and 8 rows x 1 vector (`rows8x1`),
summed over any range of the shared dimension, written or (8-row kernels) added to what the
output holds. Operands are flat arrays with offsets and strides, so a caller reads its matrices
in place (the fused attention, kernels/attention.py, reads a head's rows out of the layer's
time-major buffers; the fused Winograd bands, kernels/winograd_fused.py, the kept V).

Per step of the sum (`rows4x2`): two vector loads of the right operand's row, four scalars of the
left one broadcast, eight FMAs; with AVX-512 the eight accumulators are as many as two FMA ports
with a 4-cycle latency keep busy. `rows8x2` loads two vectors and eight scalars per sixteen FMAs:
on a 128 x 128 @ 128 x 128 product from L2 (one thread, 2-core AVX-512 Xeon) 177 GFLOP/s against
`rows4x2`'s 155, 156 against 118 at 256 x 256 @ 256 x 64.
"""
from __future__ import annotations

from . import jit, simd

#: Columns per microkernel: two vectors.
CV = 2 * simd.LANES


@jit(inline="always")
def rows4x2(out, o0, o1, o2, o3, lhs, l0, l1, l2, l3, rhs, r0, rstr, klo, khi, lk=1):
    """out[o_i : o_i + CV] := Σ_{k in [klo, khi)} lhs[l_i + k·lk] · rhs[r0 + k·rstr : … + CV] for
    the four rows i (a row may repeat: the same values are stored twice); lk > 1 reads a
    transposed left operand in place (its k-th row holds the four rows' values side by side)."""
    z = simd.zero(rhs)
    a0 = a1 = b0 = b1 = c0 = c1 = d0 = d1 = z
    for k in range(klo, khi):
        ri = r0 + k * rstr
        v0 = simd.load(rhs, ri)
        v1 = simd.load(rhs, ri + simd.LANES)
        kk = k * lk
        a0, a1 = fma2(a0, a1, simd.get(lhs, l0 + kk), v0, v1)
        b0, b1 = fma2(b0, b1, simd.get(lhs, l1 + kk), v0, v1)
        c0, c1 = fma2(c0, c1, simd.get(lhs, l2 + kk), v0, v1)
        d0, d1 = fma2(d0, d1, simd.get(lhs, l3 + kk), v0, v1)
    _store2(out, o0, a0, a1)
    _store2(out, o1, b0, b1)
    _store2(out, o2, c0, c1)
    _store2(out, o3, d0, d1)


@jit(inline="always")
def rows8x2(out, ob, ostr, lhs, lb, lstr, rhs, r0, rstr, klo, khi, add, lk=1):
    """out[ob + i·ostr : … + CV] := (add: +=) Σ_{k in [klo, khi)} lhs[lb + i·lstr + k·lk] ·
    rhs[r0 + k·rstr : … + CV] for the eight rows i = 0..7, in sixteen accumulators: two vector loads
    and eight broadcasts per sixteen FMAs (`rows4x2`'s six per eight), so the FMAs, not the loads,
    set the pace. lk > 1 reads a transposed left operand in place, as `rows4x2`."""
    a0, a1 = _start2(out, ob, add)
    b0, b1 = _start2(out, ob + ostr, add)
    c0, c1 = _start2(out, ob + 2 * ostr, add)
    d0, d1 = _start2(out, ob + 3 * ostr, add)
    e0, e1 = _start2(out, ob + 4 * ostr, add)
    f0, f1 = _start2(out, ob + 5 * ostr, add)
    g0, g1 = _start2(out, ob + 6 * ostr, add)
    h0, h1 = _start2(out, ob + 7 * ostr, add)
    for k in range(klo, khi):
        ri = r0 + k * rstr
        v0 = simd.load(rhs, ri)
        v1 = simd.load(rhs, ri + simd.LANES)
        li = lb + k * lk
        a0, a1 = fma2(a0, a1, simd.get(lhs, li), v0, v1)
        b0, b1 = fma2(b0, b1, simd.get(lhs, li + lstr), v0, v1)
        c0, c1 = fma2(c0, c1, simd.get(lhs, li + 2 * lstr), v0, v1)
        d0, d1 = fma2(d0, d1, simd.get(lhs, li + 3 * lstr), v0, v1)
        e0, e1 = fma2(e0, e1, simd.get(lhs, li + 4 * lstr), v0, v1)
        f0, f1 = fma2(f0, f1, simd.get(lhs, li + 5 * lstr), v0, v1)
        g0, g1 = fma2(g0, g1, simd.get(lhs, li + 6 * lstr), v0, v1)
        h0, h1 = fma2(h0, h1, simd.get(lhs, li + 7 * lstr), v0, v1)
    _store2(out, ob, a0, a1)
    _store2(out, ob + ostr, b0, b1)
    _store2(out, ob + 2 * ostr, c0, c1)
    _store2(out, ob + 3 * ostr, d0, d1)
    _store2(out, ob + 4 * ostr, e0, e1)
    _store2(out, ob + 5 * ostr, f0, f1)
    _store2(out, ob + 6 * ostr, g0, g1)
    _store2(out, ob + 7 * ostr, h0, h1)


@jit(inline="always")
def _start2(out, at, add):
    """The two accumulators of a row: out[at : at + CV] with `add`, else zeros."""
    if add:
        return simd.load(out, at), simd.load(out, at + simd.LANES)
    z = simd.zero(out)
    return z, z


@jit(inline="always")
def fma2(acc0, acc1, x, v0, v1):
    """(acc0 + x·v0, acc1 + x·v1)."""
    return simd.fma(acc0, x, v0), simd.fma(acc1, x, v1)


@jit(inline="always")
def _store2(out, at, u0, u1):
    """out[at : at + CV] := u0, u1."""
    simd.store(out, at, u0)
    simd.store(out, at + simd.LANES, u1)


@jit(inline="always")
def rows8x1(out, ob, ostr, lhs, lb, lstr, rhs, r0, rstr, klo, khi, add, lk=1):
    """`rows8x2` for one vector of columns (LANES): the last columns of a product whose width is a
    multiple of LANES but not of CV."""
    a = _start1(out, ob, add)
    b = _start1(out, ob + ostr, add)
    c = _start1(out, ob + 2 * ostr, add)
    d = _start1(out, ob + 3 * ostr, add)
    e = _start1(out, ob + 4 * ostr, add)
    f = _start1(out, ob + 5 * ostr, add)
    g = _start1(out, ob + 6 * ostr, add)
    h = _start1(out, ob + 7 * ostr, add)
    for k in range(klo, khi):
        v = simd.load(rhs, r0 + k * rstr)
        li = lb + k * lk
        a = simd.fma(a, simd.get(lhs, li), v)
        b = simd.fma(b, simd.get(lhs, li + lstr), v)
        c = simd.fma(c, simd.get(lhs, li + 2 * lstr), v)
        d = simd.fma(d, simd.get(lhs, li + 3 * lstr), v)
        e = simd.fma(e, simd.get(lhs, li + 4 * lstr), v)
        f = simd.fma(f, simd.get(lhs, li + 5 * lstr), v)
        g = simd.fma(g, simd.get(lhs, li + 6 * lstr), v)
        h = simd.fma(h, simd.get(lhs, li + 7 * lstr), v)
    simd.store(out, ob, a)
    simd.store(out, ob + ostr, b)
    simd.store(out, ob + 2 * ostr, c)
    simd.store(out, ob + 3 * ostr, d)
    simd.store(out, ob + 4 * ostr, e)
    simd.store(out, ob + 5 * ostr, f)
    simd.store(out, ob + 6 * ostr, g)
    simd.store(out, ob + 7 * ostr, h)


@jit(inline="always")
def _start1(out, at, add):
    """The accumulator of a row of `rows8x1`: out[at : at + LANES] with `add`, else zeros."""
    return simd.load(out, at) if add else simd.zero(out)
