"""kernels/gemm.py and blas.product: darkpy's own GEMM (A in place, as it is or transposed; B
packed from a transposed weight matrix or read in place) against float64 products, written and added, with a last partial
block of rows, a last single vector of columns and more than one pass over k; the same bits on one
thread as on two; blas.product's BLAS fallback for shapes the kernel does not take; and the stacked
GEMM of a convolution's few filters (`gemm.stacked`, blas.matmul's stacks)."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from darkpy import blas
from darkpy.kernels import gemm
from darkpy.kernels.simd import LANES

from helpers import assert_epilogue_is_the_separate_pass


def _run(c, a, b, add, threads):
    saved = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        gemm.product(c, a, b, add)
    finally:
        numba.set_num_threads(saved)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, k, n", [(8, 3, LANES), (72, 300, 3 * LANES), (128, 2 * gemm.KB + 5, 4 * LANES)])
@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("a_transposed", [False, True])
def test_product_against_float64(m, k, n, transposed, add, a_transposed, dtype):
    rng = np.random.default_rng(m + k)
    a = rng.standard_normal((m, k)).astype(dtype)
    if a_transposed:            # a weight gradient's dᵀ: the transposed view of a (k, m) array
        a = np.ascontiguousarray(a.T).T
        assert not a.flags.c_contiguous
    w = rng.standard_normal((n, k)).astype(dtype)
    b = w.T if transposed else np.ascontiguousarray(w.T)      # a weight's transpose: packed first
    c0 = rng.standard_normal((m, n)).astype(dtype)
    outs = []
    for threads in (1, 2):
        c = c0.copy() if add else np.full((m, n), np.nan, dtype)
        _run(c, a, b, add, threads)
        outs.append(c)
    np.testing.assert_array_equal(outs[0], outs[1])
    want = a.astype(np.float64) @ w.T.astype(np.float64) + (c0 if add else 0)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert np.abs(outs[0] - want).max() <= tol * np.abs(want).max()


def test_fits_and_the_blas_fallback():
    assert not gemm.fits(1001, 128, 128)                    # rows not a multiple of 8
    assert not gemm.fits(1024, 128, LANES + 1)              # columns not whole vectors
    assert not gemm.fits(8, 8, LANES)                       # too small to be worth it
    assert gemm.fits(1024, 128, 512) == (LANES == 16)       # AVX-512 only
    rng = np.random.default_rng(1)
    for (m, k, n), a_t in [((1001, 128, 128), False), ((1024, 128, 512), False),
                           ((1001, 128, 128), True), ((1024, 128, 512), True)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        a = np.ascontiguousarray(a.T).T if a_t else a          # dᵀ of a weight gradient
        w = rng.standard_normal((n, k)).astype(np.float32)
        c0 = rng.standard_normal((m, n)).astype(np.float32)
        c = c0.copy()
        blas.product(c, a, w.T, add=True, scratch=np.empty((m, n), np.float32))
        want = c0 + a.astype(np.float64) @ w.T.astype(np.float64)
        assert np.abs(c - want).max() <= 1e-5 * np.abs(want).max()
        blas.product(c, a, w.T)
        assert np.abs(c - (want - c0)).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("m, k, n", [(72, 300, 3 * LANES), (1001, 128, 128)])    # own GEMM, BLAS fallback
def test_bias_is_added_to_every_row(m, k, n):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    blas.product(c, a, w.T, bias=bias)
    want = a.astype(np.float64) @ w.T.astype(np.float64) + bias
    assert np.abs(c - want).max() <= 1e-5 * np.abs(want).max()
    with pytest.raises(AssertionError, match="bias"):
        blas.product(c, a, w.T, add=True, bias=bias)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("count, m, k, n", [(3, 8, 3, LANES), (2, 32, 300, 3 * LANES),
                                            (1, 16, 40, 5 * LANES),
                                            (2, 27, 70, 3 * LANES)])      # a partial block of rows
@pytest.mark.parametrize("kb", [blas.OWN_STACK_KB, 7])
def test_stacked_against_float64_and_the_same_bits_in_any_units(count, m, k, n, kb, dtype):
    """c[i] = a @ b[i] for every matrix of the stack, with more than one pass over k and a last
    single vector of columns, and rows not a multiple of 8; runs of one panel of columns or of all
    of them, on one thread or two,
    give the same bits (each value is one unit's, summed over k in order)."""
    rng = np.random.default_rng(count + m + k)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((count, k, n)).astype(dtype)
    want = np.einsum("mk,ikn->imn", a.astype(np.float64), b.astype(np.float64))
    outs = []
    for cols, threads in [(gemm.CV, 1), (gemm.CV, 2), (-(-n // gemm.CV) * gemm.CV, 2)]:
        c = np.full((count, m, n), np.nan, dtype)
        saved = numba.get_num_threads()
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        try:
            gemm.stacked(c, a, b, cols, kb, gemm.NO_AFFINE, gemm.NO_AFFINE, 0)
        finally:
            numba.set_num_threads(saved)
        outs.append(c)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert np.abs(outs[0] - want).max() <= tol * np.abs(want).max()
    for c in outs[1:]:
        assert np.array_equal(c, outs[0])


@pytest.mark.parametrize("act", ["linear", "leaky", "mish"])
@pytest.mark.parametrize("cols", [gemm.CV, 3 * gemm.CV])
def test_stacked_epilogue_is_the_separate_pass(act, cols):
    """With k, off each unit's rows (runs of columns, 27 rows: a partial block of eight) go through
    act(·k + off) after their last pass over k: the same bits as the product followed by the
    separate pass."""
    def forward(y, x, w, *epilogue):
        gemm.stacked(y, w, x, cols, 32, *(epilogue or (gemm.NO_AFFINE, gemm.NO_AFFINE, 0)))
    assert_epilogue_is_the_separate_pass(forward, 3, 70, 27, 5 * LANES, act, seed=11)


def test_matmul_takes_the_stacked_gemm_for_few_filters(monkeypatch, blas_state):
    """blas.matmul gives a stack of products of at most OWN_STACK_MAX_ROWS rows (whole vectors of
    columns, C-contiguous, one dtype, one left matrix) to `gemm.stacked` (AVX-512 only) and every
    other stack to BLAS, with the same products either way."""
    blas.configure(2)
    calls = []
    real = gemm.stacked
    monkeypatch.setattr(gemm, "stacked", lambda *args: (calls.append(args[0].shape), real(*args)))
    rng = np.random.default_rng(5)
    s = 784
    cases = [((16, 128), (4, 128, s), True),
             ((32, 64), (1, 64, s), True),                    # one item: runs of columns
             ((40, 128), (4, 128, s), False),                 # more rows than OWN_STACK_MAX_ROWS
             ((27, 128), (4, 128, s), True),                  # rows not a multiple of 8
             ((4, 128), (4, 128, s), False),                  # fewer than 8 rows
             ((16, 128), (4, 128, s - 1), False),             # columns not whole vectors
             ((2, 16, 128), (2, 128, s), False),              # a stack of left matrices
             ((16, 8), (2, 8, 64), False)]                    # below STREAM_MIN_MACS
    for ashape, bshape, own in cases:
        a = rng.standard_normal(ashape).astype(np.float32)
        b = rng.standard_normal(bshape).astype(np.float32)
        out = np.full(bshape[:-2] + (ashape[-2], bshape[-1]), np.nan, np.float32)
        calls.clear()
        assert blas.matmul(a, b, out=out) is out
        assert calls == ([out.shape] if own and LANES == 16 else []), (ashape, bshape)
        want = np.matmul(a.astype(np.float64), b.astype(np.float64))
        assert np.abs(out - want).max() <= 1e-5 * np.abs(want).max()
    b = rng.standard_normal((4, s, 128)).astype(np.float32).transpose(0, 2, 1)   # not C-contiguous
    calls.clear()
    a = rng.standard_normal((16, 128)).astype(np.float32)
    blas.matmul(a, b, out=np.empty((4, 16, s), np.float32))
    assert calls == []


@pytest.mark.parametrize("m, k", [(10, 512), (33, 7), (1000, 1024), (gemm.GEMV_ROWS * 3 + 5, 700)])
def test_gemv_against_float64_and_the_same_bits_on_any_threads(m, k):
    """Each value one dot product: within float32 rounding of the float64 product, in the serial
    branch (below GEMV_PARALLEL_MIN values) and the parallel one (a last partial block of rows),
    with the same bits on one thread as on two."""
    rng = np.random.default_rng(m + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32)
    ref = a.astype(np.float64) @ x.astype(np.float64)
    ys = []
    for threads in (1, 2):
        saved = numba.get_num_threads()
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        try:
            y = np.full(m, np.nan, np.float32)
            gemm.gemv(y, a, x)
        finally:
            numba.set_num_threads(saved)
        ys.append(y)
    bound = 4 * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(x)) * np.sqrt(k)
    assert np.all(np.abs(ys[0] - ref) <= bound)
    assert np.array_equal(ys[0], ys[1])
    assert (m * k >= gemm.GEMV_PARALLEL_MIN) == (m == 1000 or k == 700)


def test_matmul_takes_gemv_for_a_column_or_a_row(monkeypatch, blas_state):
    """blas.matmul gives a float32 matrix times a column (a 1x1 convolution on a 1x1 map at batch 1,
    its column possibly a (1, K, 1) stack) and a row times a transposed C-contiguous matrix (a
    connected layer at batch 1) to `gemm.gemv`, everything else to the other paths, with numpy's
    products either way."""
    blas.configure(2)
    calls = []
    real = gemm.gemv
    monkeypatch.setattr(gemm, "gemv", lambda y, a, x: (calls.append(a.shape), real(y, a, x)))
    rng = np.random.default_rng(9)
    w = rng.standard_normal((300, 200)).astype(np.float32)
    cases = [(w, rng.standard_normal((200, 1)), (300, 1), True),
             (w, rng.standard_normal((1, 200, 1)), (1, 300, 1), True),
             (rng.standard_normal((1, 300)).astype(np.float32), w, (1, 200), False),  # w as it is
             (rng.standard_normal((1, 200)).astype(np.float32), w.T, (1, 300), True),  # x @ wᵀ
             (w, rng.standard_normal((200, 2)), (300, 2), False),            # two columns
             (w[:, :100], rng.standard_normal((100, 1)), (300, 1), False),   # w not contiguous
             (w.astype(np.float64), rng.standard_normal((200, 1)), (300, 1), False)]
    for a, b, shape, taken in cases:
        b = b.astype(a.dtype)
        out = np.full(shape, np.nan, a.dtype)
        calls.clear()
        blas.matmul(a, b, out=out)
        assert bool(calls) == taken, (a.shape, b.shape)
        np.testing.assert_allclose(out, np.matmul(a.astype(np.float64), b), rtol=1e-4, atol=1e-4)
