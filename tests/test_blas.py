"""darkpy.blas: per-GEMM OpenBLAS threads. Values as np.matmul's; the run's count is put back."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy import blas
from helpers import assert_close

threadpoolctl = pytest.importorskip("threadpoolctl")


@pytest.fixture(autouse=True)
def _keep_blas_state():
    """The tests configure darkpy.blas; later tests in this process get its state back."""
    saved = dict(blas._state)
    yield
    blas._state.update(saved)


def _openblas_threads():
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"]


def test_threads_by_size():
    blas.configure(2)
    assert blas.threads_for(blas.BLAS_PARALLEL_MIN_MACS - 1) == 1
    assert blas.threads_for(blas.BLAS_PARALLEL_MIN_MACS) == 2


@pytest.mark.parametrize("m,k,n", [(8, 16, 8), (64, 256, 4096), (2, 128, 512)])
def test_matmul_equals_numpy_and_restores_the_run_count(m, k, n):
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    with threadpoolctl.threadpool_limits(limits=2):
        blas.configure(2)
        out = np.empty((m, n), np.float32)
        got = blas.matmul(a, b, out=out)
        assert got is out
        assert_close(out, a.astype(np.float64) @ b.astype(np.float64), 1e-5, 1e-4, "matmul")
        stacked = blas.matmul(np.stack([a, a]), b)
        assert np.array_equal(stacked[0], stacked[1])
        if _openblas_threads():
            assert set(_openblas_threads()) == {2}      # (torch, when installed, brings its own)


def test_unconfigured_is_plain_matmul(monkeypatch):
    monkeypatch.setitem(blas._state, "set", None)
    a = np.ones((3, 4), np.float32)
    assert np.array_equal(blas.matmul(a, a.T), a @ a.T)
