"""kernels/cblas.py and blas.matmul's split path: a large float32 GEMM as single-threaded OpenBLAS
calls on numba's threads, split by rows or by columns, with either operand transposed in place;
the same bits for any number of parts (and as numpy's own product), and the cases it leaves to
numpy (float64, a strided output, a stack of several matrices)."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from darkpy import blas
from darkpy.kernels import cblas
from helpers import assert_same_bits

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
@pytest.mark.parametrize("m, k, n", [(144, 300, 100), (40, 512, 330), (264, 200, 64)])
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("by_rows", [True, False])
def test_split_sgemm_against_float64_and_the_same_bits_in_any_parts(m, k, n, ta, tb, by_rows):
    rng = np.random.default_rng(m + n)
    a, b = _operands(rng, m, k, n, ta, tb)
    opa, opb = blas._operand(a), blas._operand(b)
    outs = []
    for parts in (1, 2, 3):
        c = np.full((m, n), np.nan, np.float32)
        cblas.split_sgemm(c, *opa, *opb, m, n, k, parts, by_rows)
        outs.append(c)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(outs[0] - want).max() <= 1e-5 * np.abs(want).max()
    for parts, c in enumerate(outs[1:], 2):
        assert_same_bits(c, outs[0], f"{parts} parts")


def test_matmul_takes_the_split_path_for_large_float32_products(monkeypatch):
    blas.configure(2)
    calls = []
    real = cblas.split_sgemm

    def spy(c, *args):
        calls.append(args[-1])            # by_rows
        real(c, *args)

    monkeypatch.setattr(cblas, "split_sgemm", spy)
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


def test_what_the_split_path_leaves_to_numpy():
    blas.configure(2)
    rng = np.random.default_rng(4)
    a, b = _operands(rng, 256, 1152, 169, False, False)
    assert not blas._split(a.astype(np.float64), b.astype(np.float64), np.empty((256, 169)))
    assert not blas._split(a, b, np.empty((256, 338), np.float32)[:, ::2])     # strided output
    assert not blas._split(a[:, ::2], b[::2], np.empty((256, 169), np.float32))   # strided operand
    stack = np.empty((2, 256, 169), np.float32)
    assert not blas._split(np.stack([a, a]), b, stack)                         # two matrices


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
        cblas.split_sgemm(c, *blas._operand(sa[i]), *blas._operand(sb[i]), c.shape[0], c.shape[1],
                          a.shape[-1], 1, True)                    # one matrix, one call
        assert_same_bits(out[i], c, f"matrix {i}")
