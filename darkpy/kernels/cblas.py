"""numpy's OpenBLAS sgemm called from numba kernels, so that a large GEMM runs split between
numba's own threads (`split_stacked_sgemm`), one single-threaded OpenBLAS call per part, instead
of on OpenBLAS's thread pool.

Why: after a parallel region numba's OpenMP workers spin a while before they sleep (the `darkpy`
command's GOMP_SPINCOUNT, darkpy/process.py). The longer they spin, the cheaper the next region's
start, which a network of small layers pays once per layer; but while they spin they hold the
cores OpenBLAS's own workers need for the GEMM that follows. Run on numba's threads, the GEMM's
second part goes to the very worker that is spinning.

The function is numpy's own OpenBLAS (found through threadpoolctl, as darkpy/blas.py finds it), the
ILP64 build numpy's wheels ship (`scipy_cblas_sgemm64_`, 64-bit integers). The compiled kernels
call it through a fixed name that `load` binds to the address found in this process, so kernels
cached on disk stay valid whatever the library's path. Without that library (`load()` False)
nothing here is called and darkpy/blas.py keeps OpenBLAS's threads.
"""
from __future__ import annotations

import ctypes

from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import njit

#: The name the compiled kernels call; `load` points it at the library's sgemm.
NAME = "darkpy_cblas_sgemm64"
#: The ILP64 CBLAS sgemm symbols looked for, in order.
SYMBOLS = ("scipy_cblas_sgemm64_", "cblas_sgemm64_")
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112

_state = {"available": None}


def load() -> bool:
    """Bind NAME to numpy's ILP64 OpenBLAS sgemm, once; whether there is one."""
    if _state["available"] is None:
        _state["available"] = _bind()
    return _state["available"]


def _bind() -> bool:
    try:
        import llvmlite.binding as ll
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return False
    for lib in ThreadpoolController().lib_controllers:
        if lib.internal_api != "openblas":
            continue
        for symbol in SYMBOLS:
            fn = getattr(lib.dynlib, symbol, None)
            if fn is not None:
                ll.add_symbol(NAME, ctypes.cast(fn, ctypes.c_void_p).value)
                return True
    return False


@intrinsic
def sgemm(typingctx, ta, tb, m, n, k, a, lda, b, ldb, c, ldc):
    """c (row-major, ldc) := op(a) @ op(b), op = transposed when ta / tb is TRANS; a, b, c are
    addresses (int64), the rest int64."""
    sig = types.void(*([types.int64] * 11))

    def codegen(context, builder, signature, args):
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        ptr = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, f32, ptr, i64, ptr, i64,
                                               f32, ptr, i64])
        fn = cgutils.get_or_insert_function(builder.module, fnty, NAME)
        ta_, tb_, m_, n_, k_, a_, lda_, b_, ldb_, c_, ldc_ = args
        builder.call(fn, [ir.Constant(i32, ROW_MAJOR), builder.trunc(ta_, i32), builder.trunc(tb_, i32),
                          m_, n_, k_, ir.Constant(f32, 1.0), builder.inttoptr(a_, ptr), lda_,
                          builder.inttoptr(b_, ptr), ldb_, ir.Constant(f32, 0.0),
                          builder.inttoptr(c_, ptr), ldc_])
        return context.get_dummy_value()

    return sig, codegen


#: Bytes per float32.
_F = 4


@njit(cache=True, nogil=True, parallel=True)
def stacked_sgemm(pc, pa, ta, lda, sa, pb, tb, ldb, sb, m, n, k, count, parts):
    """C_i := op(A_i) @ op(B_i) for the `count` matrices of a stack, in `parts` runs of consecutive
    matrices on numba's threads, one sgemm call each: C_i (m, n) C-contiguous from the address pc,
    one after the other; A_i at pa + i·sa floats (sa 0: one matrix for all), transposed or not by
    ta, rows lda floats apart; B_i likewise. Addresses are the arrays' (`ctypes.data`), the caller
    keeps them alive."""
    for p in prange(parts):
        for i in range(count * p // parts, count * (p + 1) // parts):
            sgemm(ta, tb, m, n, k, pa + i * sa * _F, lda, pb + i * sb * _F, ldb, pc + i * m * n * _F, n)


@njit(cache=True, nogil=True, parallel=True)
def split_stacked_sgemm(pc, pa, ta, lda, sa, pb, tb, ldb, sb, m, n, k, count, splits, by_rows):
    """C_i := op(A_i) @ op(B_i) for the `count` matrices of a stack (addresses and strides as in
    `stacked_sgemm`), each cut into `splits` blocks of rows of C_i (whole multiples of 8 but the
    last) or, not by_rows, of columns (of 16): count · splits single-threaded sgemm calls, spread
    over numba's current threads. Which calls there are depends only on the arguments, never on
    the thread count, so every thread count gives the same bits, whatever OpenBLAS's kernels do
    with a product cut into parts."""
    for u in prange(count * splits):
        i, p = u // splits, u % splits
        a0, b0, c0 = pa + i * sa * _F, pb + i * sb * _F, pc + i * m * n * _F
        if by_rows:
            lo = m * p // splits // 8 * 8
            hi = m if p == splits - 1 else m * (p + 1) // splits // 8 * 8
            if hi > lo:
                at = a0 + lo * (lda if ta == NO_TRANS else 1) * _F
                sgemm(ta, tb, hi - lo, n, k, at, lda, b0, ldb, c0 + lo * n * _F, n)
        else:
            lo = n * p // splits // 16 * 16
            hi = n if p == splits - 1 else n * (p + 1) // splits // 16 * 16
            if hi > lo:
                at = b0 + lo * (1 if tb == NO_TRANS else ldb) * _F
                sgemm(ta, tb, m, hi - lo, k, a0, lda, at, ldb, c0 + lo * _F, n)
