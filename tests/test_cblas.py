"""kernels/cblas.py and blas.matmul's split path: a large float32 GEMM (or a stack of them) as
single-threaded OpenBLAS calls on numba's threads, split by rows or by columns, with either operand
transposed in place; against float64, the same bits for any number of parts where OpenBLAS's
kernels split exactly, and the same bits at any thread count always (the parts fixed by the
shape); what it copies first (strided operands and outputs) and leaves to numpy (float64)."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from darkpy import blas
from darkpy.kernels import cblas
from helpers import blas_splits_exactly

pytestmark = [pytest.mark.skipif(not cblas.load(),
                                 reason="numpy's OpenBLAS has no ILP64 cblas_sgemm (a numpy built on "
                                        "another BLAS): the split path is off there"),
              pytest.mark.usefixtures("blas_state")]


def _operands(rng, m, k, n, ta, tb):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a = np.ascontiguousarray(a.T).T if ta else a            # a transposed view, read in place
    b = np.ascontiguousarray(b.T).T if tb else b
    return a, b


# parts past OpenBLAS's small-matrix kernels (100³ multiply-adds), as blas.SPLIT_MIN_PART_MACS keeps them
def _split(c, a, b, parts, by_rows):
    """c := a @ b by `cblas.split_stacked_sgemm`, one matrix in `parts` blocks, OpenBLAS on one
    thread (as darkpy.blas calls it)."""
    m, k = a.shape
    opa, opb = blas._operand(a), blas._operand(b)
    blas.configure(2)
    blas.one_blas_thread(cblas.split_stacked_sgemm, c.ctypes.data, a.ctypes.data, opa[1], opa[2], 0,
                         b.ctypes.data, opb[1], opb[2], 0, m, b.shape[1], k, 1, parts, by_rows)


# parts past OpenBLAS's small-matrix kernels (100³ multiply-adds), as blas.SPLIT_MIN_PART_MACS keeps them
@pytest.mark.parametrize("m, k, n", [(144, 300, 100), (40, 512, 330), (264, 200, 64)])
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("by_rows", [True, False])
def test_split_sgemm_against_float64_and_the_same_bits_in_any_parts(m, k, n, ta, tb, by_rows):
    rng = np.random.default_rng(m + n)
    a, b = _operands(rng, m, k, n, ta, tb)
    outs = []
    for parts in (1, 2, 3, 40):                 # 40: more parts than blocks (empty ones are skipped)
        c = np.full((m, n), np.nan, np.float32)
        _split(c, a, b, parts, by_rows)
        outs.append(c)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(outs[0] - want).max() <= 1e-5 * np.abs(want).max()
    for parts, c in zip((2, 3, 40), outs[1:]):
        # exact where OpenBLAS's kernels split exactly and every block stays past its small-matrix
        # kernels (100³ multiply-adds; its SkylakeX ones sum a block of 8 rows in another order)
        block = (m // parts // 8 * 8 or 8) * k * n if by_rows else m * k * (n // parts // 16 * 16 or 16)
        exact = blas_splits_exactly() and block >= 100 ** 3
        tol = 0 if exact else 1e-5 * np.abs(want).max()
        assert np.abs(c - outs[0]).max() <= tol, f"{parts} parts"


def test_a_stack_split_into_blocks_is_each_matrix_split_alone():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 96, 200)).astype(np.float32)
    b = rng.standard_normal((200, 72)).astype(np.float32)          # one matrix for all three
    out = np.full((3, 96, 72), np.nan, np.float32)
    blas.configure(2)
    blas.one_blas_thread(cblas.split_stacked_sgemm, out.ctypes.data, a.ctypes.data, cblas.NO_TRANS,
                         200, 96 * 200, b.ctypes.data, cblas.NO_TRANS, 72, 0, 96, 72, 200, 3, 2, True)
    for i in range(3):
        c = np.empty((96, 72), np.float32)
        _split(c, a[i], b, 2, True)
        np.testing.assert_array_equal(out[i], c, err_msg=f"matrix {i}")


def test_matmul_takes_the_split_path_for_large_float32_products(monkeypatch):
    blas.configure(2)
    calls = []
    real = cblas.split_stacked_sgemm

    def spy(*args):
        calls.append(args[-1])            # by_rows
        real(*args)

    monkeypatch.setattr(cblas, "split_stacked_sgemm", spy)
    rng = np.random.default_rng(3)
    saved = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        for (m, k, n), stacked in [((256, 1152, 169), False), ((64, 288, 4096), False),
                                   ((256, 1152, 169), True)]:
            a, b = _operands(rng, m, k, n, False, True)
            out = np.empty((1, m, n) if stacked else (m, n), np.float32)    # a stack of one
            blas.matmul(a, b, out=out)
            np.testing.assert_allclose(out.reshape(m, n), a @ b, rtol=1e-4, atol=1e-3)
    finally:
        numba.set_num_threads(saved)
    assert calls == [True, False, True]          # rows when m >= n, else columns


def test_the_parts_follow_the_shape_and_the_pool_not_the_thread_count():
    pool = numba.config.NUMBA_NUM_THREADS
    assert blas.split_parts(256, 169, 1152) == min(pool, 256 * 169 * 1152 // blas.SPLIT_MIN_PART_MACS, 32)
    assert blas.split_parts(16, 4096, 4096, count=pool) == 1            # whole matrices
    assert blas.split_parts(8, 8, 1 << 30) == 1                         # one block of rows
    assert blas.split_parts(1024, 1024, 1024, count=2) == max(1, min(-(-pool // 2), 512, 128))


@pytest.mark.parametrize("shape", [(256, 1152, 169), (64, 288, 4096), (6, 256, 1024, 512),
                                   (3, 512, 256, 1024)])
def test_matmul_gives_the_same_bits_at_any_thread_count(shape):
    """Whatever OpenBLAS's kernels (the Haswell ones round a product split into parts apart from
    the whole one): large products, 2-D and stacked, at 1 and 2 numba threads and with the run
    configured for 1 and 2 BLAS threads, bit for bit."""
    rng = np.random.default_rng(len(shape))
    *stack, m, k, n = shape
    a = rng.standard_normal((*stack, m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    outs = []
    saved = numba.get_num_threads()
    try:
        for blas_threads, numba_threads in ((1, 1), (2, 1), (1, 2), (2, 2)):
            blas.configure(blas_threads)
            numba.set_num_threads(min(numba_threads, numba.config.NUMBA_NUM_THREADS))
            out = np.full((*stack, m, n), np.nan, np.float32)
            blas.matmul(a, b, out=out)
            outs.append(out)
    finally:
        numba.set_num_threads(saved)
    np.testing.assert_allclose(outs[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


def test_what_the_split_path_copies_first_and_leaves_to_numpy():
    blas.configure(2)
    rng = np.random.default_rng(4)
    a, b = _operands(rng, 256, 1152, 169, False, False)
    assert not blas._split(a.astype(np.float64), b.astype(np.float64), np.empty((256, 169)))
    want = a.astype(np.float64) @ b
    out = np.full((256, 338), np.nan, np.float32)
    assert blas._split(a, b, out[:, ::2])                               # a strided output
    np.testing.assert_allclose(out[:, ::2], want, rtol=1e-4, atol=1e-3)
    assert np.isnan(out[:, 1::2]).all()
    a2, b2 = np.repeat(a, 2, axis=1), np.repeat(b, 2, axis=0)
    out = np.empty((256, 169), np.float32)
    assert blas._split(a2[:, ::2], b2[::2], out)                        # strided operands
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)
    stack = np.empty((2, 256, 169), np.float32)
    assert blas._split(np.stack([a, 2 * a]), b, stack, 2)               # two matrices
    np.testing.assert_allclose(stack[1], 2 * want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("shapes", [((16, 32, 16), (16, 16, 2048)),     # Winograd's 16 GEMMs
                                    ((32, 8), (5, 8, 4096)),             # a broadcast matrix
                                    ((7, 64, 96), (96, 700)),
                                    ((4, 3, 64, 32), (4, 3, 32, 64))])   # attention's (S, H) stacks
def test_a_stack_on_numbas_threads_gives_each_matrix_its_own_gemm_bits(shapes, monkeypatch):
    """blas.matmul's stacks run as `cblas.stacked_sgemm` (one single-threaded sgemm per matrix, runs
    of matrices on numba's threads) and give what one product after the other gives."""
    blas.configure(2)
    monkeypatch.setattr(blas, "OWN_STACK_MAX_ROWS", 0)     # not the own GEMM (tests/test_gemm.py)
    calls = []
    real = cblas.stacked_sgemm
    monkeypatch.setattr(cblas, "stacked_sgemm", lambda *args: (calls.append(args[-1]), real(*args)))
    rng = np.random.default_rng(3)
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes[1]).astype(np.float32)
    stack = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out = np.full(stack + (a.shape[-2], b.shape[-1]), np.nan, np.float32)
    saved = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        assert blas.matmul(a, b, out=out) is out
    finally:
        numba.set_num_threads(saved)
    assert calls == [min(2, numba.config.NUMBA_NUM_THREADS)]      # parts: the numba threads
    sa, sb = np.broadcast_to(a, stack + a.shape[-2:]), np.broadcast_to(b, stack + b.shape[-2:])
    for i in np.ndindex(stack):
        c = np.empty_like(out[i])
        _split(c, sa[i], sb[i], 1, True)                            # one matrix, one call
        np.testing.assert_array_equal(out[i], c, err_msg=f"matrix {i}")
