"""Math helpers that let numba vectorise the loops of the softmax-like kernels (attention weights,
cross-entropy): an exp without libm, and row reductions with a fixed order.

numba here has no SVML, so `math.exp` in a loop is a scalar libm call (~3 ns per value), and a
float reduction (`tot += v`) is one long dependency chain that LLVM may not reorder into vector
lanes without fastmath. `exp_poly` is branch-free, so a loop of it vectorises; `row_sum` and
`row_max` keep 8 partial results (lane j % 8) and combine them in a fixed order: the same bits on
every machine and vector width, as fast as a vectorised reduction. Polynomials are evaluated with
`fma` (one rounding per step, one instruction where the CPU has FMA: numba does not contract a·b + c
without fastmath), which LLVM vectorises like any other operation.
"""
from __future__ import annotations

import math

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import jit, simd
from .simd import LANES


@intrinsic
def fma(typingctx, a, b, c):
    """a·b + c rounded once (LLVM's fma), for three floats of one type."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, sig, args):
        ty = context.get_value_type(sig.return_type)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3),
                                            f"llvm.fma.f{sig.return_type.bitwidth}")
        return builder.call(fn, args)
    return a(a, b, c), codegen


@jit(inline="always")
def exp_poly(y):
    """e^(−y) for 0 ≤ y ≤ 90.25 (float64), without libm: the degree-11 Taylor polynomial at y/128,
    squared 7 times (relative error below 1e-13 up to y = 30, 7.7e-9 at 90.25); branch-free, so
    loops vectorise. Horner steps as `fma`: a float32 gelu (kernels/activations.py) 2.2 -> 1.6 ns
    a value on one core."""
    u = -y * (1.0 / 128.0)
    p = fma(1.0 / 39916800, u, 1.0 / 3628800)
    p = fma(fma(fma(p, u, 1.0 / 362880), u, 1.0 / 40320), u, 1.0 / 5040)
    p = fma(fma(fma(p, u, 1.0 / 720), u, 1.0 / 120), u, 1.0 / 24)
    p = fma(fma(fma(p, u, 1.0 / 6), u, 0.5), u, 1.0)
    p = fma(p, u, 1.0)
    for _ in range(7):
        p = p * p
    return p


@jit(inline="always")
def exp_neg(y, fast):
    """e^(−y) for y ≥ 0, in float64. `fast` (the kernels of float32 layers): `exp_poly`, relative
    error ≤ 7.7e-9 (15× below float32's epsilon), and exactly 0 for y > 90.25, where e^(−y) < 6e-40
    is already below float32's smallest normal number. Otherwise (float64 layers, gradient checks)
    libm's exp."""
    if fast:
        e = exp_poly(min(y, 90.25))
        return e if y <= 90.25 else 0.0
    return math.exp(-y)


@jit(inline="always")
def row_sum(a, n):
    """Σ a[0:n] in float64, accumulated in 8 lanes combined in a fixed order."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    n8 = n - n % 8
    for j in range(0, n8, 8):
        s0 += a[j]
        s1 += a[j + 1]
        s2 += a[j + 2]
        s3 += a[j + 3]
        s4 += a[j + 4]
        s5 += a[j + 5]
        s6 += a[j + 6]
        s7 += a[j + 7]
    for j in range(n8, n):
        s0 += a[j]
    return ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7))


@jit(inline="always")
def row_max(a, n, scale):
    """max of a[0:n]·scale in float64 (−inf for n = 0; NaN-free inputs), in 8 lanes."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = -math.inf
    n8 = n - n % 8
    for j in range(0, n8, 8):
        m0 = max(m0, a[j] * scale)
        m1 = max(m1, a[j + 1] * scale)
        m2 = max(m2, a[j + 2] * scale)
        m3 = max(m3, a[j + 3] * scale)
        m4 = max(m4, a[j + 4] * scale)
        m5 = max(m5, a[j + 5] * scale)
        m6 = max(m6, a[j + 6] * scale)
        m7 = max(m7, a[j + 7] * scale)
    for j in range(n8, n):
        m0 = max(m0, a[j] * scale)
    return max(max(max(m0, m4), max(m1, m5)), max(max(m2, m6), max(m3, m7)))


@jit(inline="always")
def row_dot(a, b, n):
    """Σ a[0:n]·b[0:n] in float64 (each product of float64 values: exact for float32 inputs), in 8
    lanes as `row_sum`."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    n8 = n - n % 8
    for j in range(0, n8, 8):
        s0 += (1.0 * a[j]) * b[j]
        s1 += (1.0 * a[j + 1]) * b[j + 1]
        s2 += (1.0 * a[j + 2]) * b[j + 2]
        s3 += (1.0 * a[j + 3]) * b[j + 3]
        s4 += (1.0 * a[j + 4]) * b[j + 4]
        s5 += (1.0 * a[j + 5]) * b[j + 5]
        s6 += (1.0 * a[j + 6]) * b[j + 6]
        s7 += (1.0 * a[j + 7]) * b[j + 7]
    for j in range(n8, n):
        s0 += (1.0 * a[j]) * b[j]
    return ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7))


@jit(inline="always")
def row_sqdev(a, n, m):
    """Σ (a[0:n] − m)² in float64, in 8 lanes as `row_sum`."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    n8 = n - n % 8
    for j in range(0, n8, 8):
        t0, t1, t2, t3 = a[j] - m, a[j + 1] - m, a[j + 2] - m, a[j + 3] - m
        t4, t5, t6, t7 = a[j + 4] - m, a[j + 5] - m, a[j + 6] - m, a[j + 7] - m
        s0 += t0 * t0
        s1 += t1 * t1
        s2 += t2 * t2
        s3 += t3 * t3
        s4 += t4 * t4
        s5 += t5 * t5
        s6 += t6 * t6
        s7 += t7 * t7
    for j in range(n8, n):
        t = a[j] - m
        s0 += t * t
    return ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7))


@jit(inline="always")
def row_dot3(a, b, c, n):
    """Σ a[0:n]·b[0:n]·c[0:n] in float64 ((a·b)·c per value, from float64 values), in 8 lanes as
    `row_sum`."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    n8 = n - n % 8
    for j in range(0, n8, 8):
        s0 += (1.0 * a[j]) * b[j] * c[j]
        s1 += (1.0 * a[j + 1]) * b[j + 1] * c[j + 1]
        s2 += (1.0 * a[j + 2]) * b[j + 2] * c[j + 2]
        s3 += (1.0 * a[j + 3]) * b[j + 3] * c[j + 3]
        s4 += (1.0 * a[j + 4]) * b[j + 4] * c[j + 4]
        s5 += (1.0 * a[j + 5]) * b[j + 5] * c[j + 5]
        s6 += (1.0 * a[j + 6]) * b[j + 6] * c[j + 6]
        s7 += (1.0 * a[j + 7]) * b[j + 7] * c[j + 7]
    for j in range(n8, n):
        s0 += (1.0 * a[j]) * b[j] * c[j]
    return ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7))


# -- float64 sums in SIMD lanes: one lane per position modulo LANES, the lanes added in lane order
# after (so the order depends on LANES, not on the thread count): a 64-value row is four vector
# operations, where `row_dot` makes 64 scalar ones.
@jit(inline="always")
def lanes_total(acc):
    """Σ of a float64 vector's lanes, in lane order."""
    s = 0.0
    for lane in range(LANES):
        s += simd.lane(acc, lane)
    return s


@jit(inline="always")
def dot_lanes(a, b, n):
    """Σ a[0:n]·b[0:n] in float64 (products of float64 values: exact for float32 inputs), whole
    vectors in LANES lanes, then the tail in order. a, b: 1-D C-contiguous, of one dtype."""
    nv = n - n % LANES
    acc = simd.widen(simd.zero(a))
    for j in range(0, nv, LANES):
        acc = simd.add(acc, simd.mul(simd.widen(simd.load(a, j)), simd.widen(simd.load(b, j))))
    s = lanes_total(acc)
    for j in range(nv, n):
        s += (1.0 * a[j]) * b[j]
    return s
