"""SIMD vectors inside numba kernels: LANES values of one float dtype held as one LLVM vector.

numba's loop vectoriser vectorises an innermost loop over an array, but it keeps the array in
memory: a convolution that accumulates four filters over a run of positions loads and stores every
accumulator once per tap (measured ~1 FMA per memory operation), and numba turns LLVM's SLP
vectoriser off (numba issue #8705), so explicit scalar accumulators stay scalar. A `Vector` is a
plain value, so LLVM keeps a kernel's few vectors in registers across a whole loop of taps — a
register-blocked microkernel (kernels/direct.py: 4 filters x 16 positions in 8 accumulators).

Inside a kernel only: `load(a, i)` (a[i:i+LANES] of a 1-D C-contiguous array), `store(a, i, v)`,
`store_low(a, i, v)` (v's first LANES/2 lanes at a[i:]), `get(a, i)` (the scalar a[i], of an
integer array too),
`zero(a)` (a vector of a's dtype), `u + v` and `u - v` (as `add` and `sub`), `fma(acc, s, v)`
(acc + s·v per lane, rounded once: LLVM's fma, one instruction where the CPU has FMA), `add(u, v)`,
`sub(u, v)`, `mul(u, v)`, `neg(v)` (per lane, IEEE: each lane the bits of the scalar operation),
`widen(v)` (as float64), `cast_like(a, v)`
(as a's dtype, rounded as the scalar cast), `positive_or(v, u)` (v's lane where it is > 0,
else u's), `greater_or(v, u)` (v's lane where it is > u's, else u's), `evens(u, v)` and
`odds(u, v)` (the even or odd lanes of u then of v: a row's every other value), `zip_low(u, v)` and
`zip_high(u, v)` (their inverse: the first or last halves of u and v interleaved), `load_low(a, i)`
(a[i:i+LANES/2] in the first half of a vector), `splat(v, s)` (s in every lane of a vector like v)
and `lane(v, i)`. Beside them `flat(a)`: a C-contiguous array's
values as a 1-D view, no copy and no call (numba's reshape calls a helper: ~0.1 µs each, per plane
of a small map).
`store_stream(a, i, v)` stores past the caches (a non-temporal store) where `aligned(a, i)`, and
`store_fence()` orders such stores before whatever follows (for outputs of at least
STREAM_MIN_BYTES).
**load, load_low, store, store_low, store_stream and get check no bounds**: the caller guarantees
a[i:i+LANES] lies inside the array. float32 is the real work, float64 the gradient checks (the
same source, like every kernel here). LANES is the float32 width of the widest vector register of
the CPU numba compiles for (`_lanes`): 16 where it has AVX-512F, else 8; float64 and
SSE-only machines use several registers per vector (LLVM splits it). The kernels' cached machine
code is keyed on that CPU too, so a cache never mixes the two widths.
"""
from __future__ import annotations

import operator
import platform

from llvmlite import ir
from numba import config, types
from numba.core import cgutils
from numba.core.codegen import get_host_cpu_features
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic, models, overload, register_model
from numba.np.arrayobj import populate_array


def _lanes(features: str) -> int:
    """Values per vector for numba's CPU features (LLVM's '+avx512f,-sse4a,...' form): 16 with
    AVX-512F, else 8 (AVX2's width; narrower machines split each vector)."""
    return 16 if "+avx512f" in features.split(",") else 8


#: Values per vector. On AVX-512 (2-core Xeon VM, 2 threads, each suite network's step in processes
#: alternating with LANES = 8, 3 rounds): digits b64 inference 0.89-0.93x the time, b1 0.91-0.96x,
#: shapes-tiny b64 0.93-0.97x, its training step at b32 0.89-1.05x, digits' at b32 0.92-0.99x.
LANES = _lanes(config.CPU_FEATURES if config.CPU_FEATURES is not None
               else get_host_cpu_features())
_I32 = ir.IntType(32)


class Vector(types.Type):
    """LANES values of `dtype` (float32 or float64), one LLVM vector value."""

    def __init__(self, dtype):
        self.dtype = dtype
        super().__init__(name=f"Vector({dtype} x {LANES})")


@register_model(Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        lane = dmm.lookup(fe_type.dtype).get_value_type()
        super().__init__(dmm, fe_type, ir.VectorType(lane, LANES))


def _float_array(a) -> bool:
    return (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C"
            and isinstance(a.dtype, types.Float))


def _address(context, builder, arrty, arr, idx):
    """Pointer to arr[idx] as a pointer to a vector."""
    data = context.make_array(arrty)(context, builder, arr).data
    lane = context.get_value_type(arrty.dtype)
    ptr = builder.gep(data, [idx], inbounds=True)
    return builder.bitcast(ptr, ir.VectorType(lane, LANES).as_pointer())


@intrinsic
def flat(typingctx, a):
    """a's values (a C-contiguous array of any rank) as a 1-D array sharing them."""
    if not (isinstance(a, types.Array) and a.layout == "C"):
        return None

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, args[0])
        dst = context.make_array(sig.return_type)(context, builder)
        populate_array(dst, data=src.data, shape=[src.nitems], strides=[src.itemsize],
                       itemsize=src.itemsize, meminfo=src.meminfo, parent=src.parent)
        return impl_ret_borrowed(context, builder, sig.return_type, dst._getvalue())
    return types.Array(a.dtype, 1, "C")(a), codegen


@intrinsic
def unit_stride(typingctx, a):
    """A 1-D float array whose stride is its item size (the caller's to check) typed as the
    C-contiguous array `load` and `store` take: a row of an array padded between rows."""
    if not (isinstance(a, types.Array) and a.ndim == 1 and isinstance(a.dtype, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        return impl_ret_borrowed(context, builder, sig.return_type, args[0])
    return types.Array(a.dtype, 1, "C")(a), codegen


@intrinsic
def load(typingctx, a, i):
    """a[i:i+LANES] as a vector (no bounds check)."""
    if not (_float_array(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _address(context, builder, sig.args[0], args[0], args[1])
        return builder.load(ptr, align=sig.args[0].dtype.bitwidth // 8)
    return Vector(a.dtype)(a, i), codegen


@intrinsic
def store(typingctx, a, i, v):
    """a[i:i+LANES] = v (no bounds check)."""
    if not (_float_array(a) and isinstance(i, types.Integer) and isinstance(v, Vector)
            and v.dtype == a.dtype):
        return None

    def codegen(context, builder, sig, args):
        ptr = _address(context, builder, sig.args[0], args[0], args[1])
        builder.store(args[2], ptr, align=sig.args[0].dtype.bitwidth // 8)
        return context.get_dummy_value()
    return types.void(a, i, v), codegen


#: Outputs of at least this many bytes (four times the 32 MB L3 cache of the 2-core Zen 5 EPYC)
#: are written with `store_stream` where a kernel can (kernels/direct.py, layers/route.py): a store
#: through the caches first reads each line from memory, and the next layer finds little of so
#: large an output still in them. A 16 MB buffer filled at 86 GB/s through the caches and 41 past
#: them (2 threads); 354 MB at 27 and 40 GB/s. At 64 MB tiny.cfg's 128-filter layers on 56x56 at
#: b64 (102 MB each) took 20.7-21.5 ms against 19.8-20.1 (their next 1x1 layers read less from the
#: L3 cache), its forward 1.02x the time.
STREAM_MIN_BYTES = 128 << 20


@intrinsic
def store_stream(typingctx, a, i, v):
    """a[i:i+LANES] = v past the caches (a non-temporal store: no read of the line first, and the
    line not kept), for outputs far larger than the caches that nothing reads before they have
    left them. **a[i] must be aligned to the vector's size** (`aligned`); `store_fence()` after
    the last of them, before another thread reads what they wrote."""
    if not (_float_array(a) and isinstance(i, types.Integer) and isinstance(v, Vector)
            and v.dtype == a.dtype):
        return None

    def codegen(context, builder, sig, args):
        ptr = _address(context, builder, sig.args[0], args[0], args[1])
        st = builder.store(args[2], ptr, align=LANES * sig.args[0].dtype.bitwidth // 8)
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(_I32, 1)]))
        return context.get_dummy_value()
    return types.void(a, i, v), codegen


@intrinsic
def aligned(typingctx, a, i):
    """Whether a[i] lies on a vector's size (a `store_stream` may go there)."""
    if not (_float_array(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        addr = builder.ptrtoint(_address(context, builder, sig.args[0], args[0], args[1]),
                                ir.IntType(64))
        size = LANES * sig.args[0].dtype.bitwidth // 8
        low = builder.and_(addr, ir.Constant(ir.IntType(64), size - 1))
        return builder.icmp_unsigned("==", low, ir.Constant(ir.IntType(64), 0))
    return types.boolean(a, i), codegen


_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


@intrinsic
def store_fence(typingctx):
    """Order the non-temporal stores before it ahead of every store after it: x86's sfence (LLVM's
    release fence does not cover them there), elsewhere a sequentially consistent fence."""
    def codegen(context, builder, sig, args):
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse.sfence")
            builder.call(fn, [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def store_low(typingctx, a, i, v):
    """a[i:i+LANES//2] = v's first LANES/2 lanes (no bounds check): half a vector, one store."""
    if not (_float_array(a) and isinstance(i, types.Integer) and isinstance(v, Vector)
            and v.dtype == a.dtype):
        return None

    def codegen(context, builder, sig, args):
        half = LANES // 2
        low = builder.shuffle_vector(args[2], args[2], ir.Constant(ir.VectorType(_I32, half),
                                                                    list(range(half))))
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]], inbounds=True), low.type.as_pointer())
        builder.store(low, ptr, align=sig.args[0].dtype.bitwidth // 8)
        return context.get_dummy_value()
    return types.void(a, i, v), codegen


@intrinsic
def get(typingctx, a, i):
    """a[i], a scalar of a float or integer array (no bounds check and no wraparound of a negative
    i: numba's indexing tests the sign of every index, which in a microkernel's inner loop costs
    more than the load)."""
    if not (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C"
            and isinstance(a.dtype, (types.Float, types.Integer)) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        return builder.load(builder.gep(data, [args[1]], inbounds=True))
    return a.dtype(a, i), codegen


@intrinsic
def prefetch(typingctx, a, i):
    """Ask the core to bring a[i]'s cache line in for reading (LLVM's prefetch, kept in every
    cache level; no bounds check: a hint, it never faults)."""
    if not (_float_array(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ptr.type] + [ir.IntType(32)] * 3),
            "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), 3),
                          ir.Constant(ir.IntType(32), 1)])
        return context.get_dummy_value()
    return types.void(a, i), codegen


@intrinsic
def zero(typingctx, a):
    """A vector of zeros of a's dtype."""
    if not _float_array(a):
        return None

    def codegen(context, builder, sig, args):
        return ir.Constant(context.get_value_type(sig.return_type), [0.0] * LANES)
    return Vector(a.dtype)(a), codegen


def _splat(context, builder, sig, args):
    """The scalar args[1] (cast to the result's dtype) in every lane of a vector of sig's result."""
    vty = context.get_value_type(sig.return_type)
    scalar = context.cast(builder, args[1], sig.args[1], sig.return_type.dtype)
    undef = ir.Constant(vty, ir.Undefined)
    lane0 = builder.insert_element(undef, scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(lane0, undef, ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))


@intrinsic
def fma(typingctx, acc, s, v):
    """acc + s·v in every lane, s a scalar (cast to the vectors' dtype), one rounding per lane."""
    if not (isinstance(acc, Vector) and acc == v and isinstance(s, (types.Float, types.Integer))):
        return None

    def codegen(context, builder, sig, args):
        vty = context.get_value_type(sig.return_type)
        name = f"llvm.fma.v{LANES}f{sig.return_type.dtype.bitwidth}"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3), name)
        return builder.call(fn, [_splat(context, builder, sig, args), args[2], args[0]])
    return acc(acc, s, v), codegen


def _binary(op):
    """An intrinsic applying the IR builder's `op` (fadd, fsub) to two vectors of one type."""
    def typer(typingctx, u, v):
        if not (isinstance(u, Vector) and u == v):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])
        return u(u, v), codegen
    return intrinsic(typer)


#: u + v, u − v and u·v in every lane.
add = _binary("fadd")
sub = _binary("fsub")
mul = _binary("fmul")


def _operator(op, lane_op):
    """`u op v` between two vectors of one type as `lane_op`: the same source then runs on scalars
    and on vectors (kernels/winograd_tiles.py's transforms)."""
    @overload(op)
    def impl(u, v):
        if isinstance(u, Vector) and u == v:
            return lambda u, v: lane_op(u, v)
        return None


_operator(operator.add, add)
_operator(operator.sub, sub)


@intrinsic
def widen(typingctx, v):
    """v's values as a float64 vector (exact: every float32 is a float64; a float64 v as it is)."""
    if not (isinstance(v, Vector) and v.dtype in (types.float32, types.float64)):
        return None

    def codegen(context, builder, sig, args):
        if sig.args[0].dtype == types.float64:
            return args[0]
        return builder.fpext(args[0], context.get_value_type(sig.return_type))
    return Vector(types.float64)(v), codegen


@intrinsic
def cast_like(typingctx, a, v):
    """v's values as a vector of array a's dtype: a float64 v rounded to float32 as the scalar cast
    rounds it, or v itself when the dtypes agree."""
    if not (_float_array(a) and isinstance(v, Vector)
            and {a.dtype, v.dtype} <= {types.float32, types.float64}):
        return None

    def codegen(context, builder, sig, args):
        if sig.args[1].dtype == sig.return_type.dtype:
            return args[1]
        target = context.get_value_type(sig.return_type)
        if sig.return_type.dtype == types.float32:
            return builder.fptrunc(args[1], target)
        return builder.fpext(args[1], target)
    return Vector(a.dtype)(a, v), codegen


@intrinsic
def positive_or(typingctx, v, u):
    """Per lane: v where v > 0, else u (the scalar `v if v > 0 else u`; a NaN in v gives u)."""
    if not (isinstance(v, Vector) and v == u):
        return None

    def codegen(context, builder, sig, args):
        zero = ir.Constant(context.get_value_type(sig.return_type), [0.0] * LANES)
        return builder.select(builder.fcmp_ordered(">", args[0], zero), args[0], args[1])
    return v(v, u), codegen


@intrinsic
def splat(typingctx, v, s):
    """A vector of v's type with s (cast to its dtype) in every lane."""
    if not (isinstance(v, Vector) and isinstance(s, (types.Float, types.Integer))):
        return None

    def codegen(context, builder, sig, args):
        return _splat(context, builder, sig, args)
    return v(v, s), codegen


@intrinsic
def lane(typingctx, v, i):
    """Lane i of v, a scalar (i a compile-time-free integer below LANES; not checked)."""
    if not (isinstance(v, Vector) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        idx = context.cast(builder, args[1], sig.args[1], types.int32)
        return builder.extract_element(args[0], idx)
    return v.dtype(v, i), codegen


@intrinsic
def neg(typingctx, v):
    """−v in every lane (the sign flipped, as the scalar −x)."""
    if not isinstance(v, Vector):
        return None

    def codegen(context, builder, sig, args):
        return builder.fneg(args[0])
    return v(v), codegen


def _pick(first):
    """An intrinsic taking lanes first, first + 2, ... of u followed by v (2·LANES values): a row's
    every other value (one permute instruction on AVX-512)."""
    def typer(typingctx, u, v):
        if not (isinstance(u, Vector) and u == v):
            return None

        def codegen(context, builder, sig, args):
            mask = ir.Constant(ir.VectorType(_I32, LANES), [first + 2 * i for i in range(LANES)])
            return builder.shuffle_vector(args[0], args[1], mask)
        return u(u, v), codegen
    return intrinsic(typer)


#: The even (odd) lanes of u, then of v, in order.
evens = _pick(0)
odds = _pick(1)


def _zip(first):
    """An intrinsic interleaving lanes first.. first + LANES/2 − 1 of u and of v: u[first],
    v[first], u[first + 1], ... (the inverse of `evens` / `odds`: a row from its every other
    value)."""
    def typer(typingctx, u, v):
        if not (isinstance(u, Vector) and u == v):
            return None

        def codegen(context, builder, sig, args):
            lanes = [x for i in range(LANES // 2) for x in (first + i, LANES + first + i)]
            return builder.shuffle_vector(args[0], args[1], ir.Constant(ir.VectorType(_I32, LANES),
                                                                        lanes))
        return u(u, v), codegen
    return intrinsic(typer)


#: u's and v's first (last) LANES/2 lanes, interleaved.
zip_low = _zip(0)
zip_high = _zip(LANES // 2)


@intrinsic
def load_low(typingctx, a, i):
    """a[i:i+LANES//2] in a vector's first LANES/2 lanes, its others undefined (no bounds check):
    half a vector, one load, nothing read past it."""
    if not (_float_array(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        half = LANES // 2
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        lane = context.get_value_type(sig.args[0].dtype)
        ptr = builder.bitcast(builder.gep(data, [args[1]], inbounds=True),
                              ir.VectorType(lane, half).as_pointer())
        low = builder.load(ptr, align=sig.args[0].dtype.bitwidth // 8)
        return builder.shuffle_vector(low, low, ir.Constant(ir.VectorType(_I32, LANES),
                                                            list(range(half)) * 2))
    return Vector(a.dtype)(a, i), codegen


@intrinsic
def greater_or(typingctx, v, u):
    """Per lane: v where v > u, else u (the scalar `v if v > u else u`: a NaN in v gives u, a NaN in
    u stays)."""
    if not (isinstance(v, Vector) and v == u):
        return None

    def codegen(context, builder, sig, args):
        return builder.select(builder.fcmp_ordered(">", args[0], args[1]), args[0], args[1])
    return v(v, u), codegen
