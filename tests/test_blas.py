"""darkpy.blas: per-GEMM OpenBLAS threads. Values as np.matmul's; the run's count is put back."""
from __future__ import annotations

import math

import numpy as np
import pytest

from darkpy import blas
from helpers import assert_close

threadpoolctl = pytest.importorskip("threadpoolctl")
pytestmark = pytest.mark.usefixtures("blas_state")     # the tests configure darkpy.blas


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


@pytest.fixture
def _streams_only(monkeypatch):
    """The stacks below go to `_streams` (helper threads), not to numba's threads (SPLIT,
    tests/test_cblas.py) nor to darkpy's own GEMM (OWN_STACK_MAX_ROWS, tests/test_gemm.py)."""
    monkeypatch.setattr(blas, "SPLIT", False)
    monkeypatch.setattr(blas, "OWN_STACK_MAX_ROWS", 0)


@pytest.fixture
def _two_numba_threads():
    import numba
    saved = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    yield numba.get_num_threads()
    numba.set_num_threads(saved)


@pytest.mark.parametrize("shapes", [((16, 32, 16), (16, 16, 2048)),     # Winograd's 16 GEMMs
                                    ((32, 8), (5, 8, 4096)),             # a broadcast matrix
                                    ((7, 64, 96), (96, 700)),
                                    ((4, 3, 64, 32), (4, 3, 32, 64)),    # attention's (S, H) stacks
                                    ((3, 64, 32), (4, 3, 32, 64))])      # broadcast over the first axis
def test_streamed_stack_gives_each_matrix_its_own_gemm_bits(shapes, _two_numba_threads, _streams_only):
    """A stack split into concurrent streams gives, bit for bit, what one matrix product after the
    other on one BLAS thread gives, and leaves OpenBLAS on the run's count."""
    if _two_numba_threads < 2 or not _openblas_threads():
        pytest.skip("needs 2 numba threads and OpenBLAS")
    rng = np.random.default_rng(3)
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes[1]).astype(np.float32)
    out = np.full(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), np.nan,
                  np.float32)
    macs = a.shape[-2] * a.shape[-1] * b.shape[-1]
    assert macs * math.prod(out.shape[:-2]) >= blas.STREAM_MIN_MACS and macs < blas.STREAM_MAX_MACS
    with threadpoolctl.threadpool_limits(limits=2):
        blas.configure(2)
        blas._helpers["pool"] = None
        assert blas.matmul(a, b, out=out) is out
        assert blas._helpers["pool"] is not None, "the stack was not split"
        assert set(_openblas_threads()) == {2}
        with threadpoolctl.threadpool_limits(limits=1):
            stack = out.shape[:-2]
            sa, sb = np.broadcast_to(a, stack + a.shape[-2:]), np.broadcast_to(b, stack + b.shape[-2:])
            for i in np.ndindex(stack):
                assert np.array_equal(out[i], np.matmul(sa[i], sb[i])), f"matrix {i}"


def test_streams_read_and_write_strided_views(_two_numba_threads, _streams_only):
    """Attention's stacks: the operands and the output are (S, H, T, dh) views of time-major rows;
    streamed, they give np.matmul's bits on one BLAS thread, and the rows outside stay untouched."""
    if _two_numba_threads < 2 or not _openblas_threads():
        pytest.skip("needs 2 numba threads and OpenBLAS")
    T, S, H, dh = 64, 16, 4, 32

    def heads(rows, part, parts):
        return rows.reshape(T, S, parts, H, dh)[:, :, part].transpose(1, 2, 0, 3)

    rows = np.random.default_rng(4).standard_normal((T * S, 3 * H * dh)).astype(np.float32)
    q, k, v = (heads(rows, i, 3) for i in range(3))
    a = np.empty((S, H, T, T), np.float32)
    out = np.full((T * S, 2 * H * dh), np.nan, np.float32)
    with threadpoolctl.threadpool_limits(limits=2):
        blas.configure(2)
        blas._helpers["pool"] = None
        blas.matmul(q, k.transpose(0, 1, 3, 2), out=a)
        blas.matmul(a, v, out=heads(out, 0, 2))
        assert blas._helpers["pool"] is not None, "the stacks were not split"
        with threadpoolctl.threadpool_limits(limits=1):
            assert np.array_equal(a, np.matmul(q, k.transpose(0, 1, 3, 2)))
            assert np.array_equal(heads(out, 0, 2), np.matmul(a, v))
    assert np.isnan(heads(out, 1, 2)).all()


def test_streams_follow_the_calling_threads_numba_count(_two_numba_threads, _streams_only):
    """A thread whose numba count is 1 (a layer the thread plan keeps on one thread) computes the
    stack itself; an error in any stream reaches the caller."""
    import numba
    a = np.ones((16, 32, 16), np.float32)
    b = np.ones((16, 16, 4096), np.float32)
    blas.configure(2)
    blas._helpers["pool"] = None
    numba.set_num_threads(1)
    blas.matmul(a, b, out=np.empty((16, 32, 4096), np.float32))
    assert blas._helpers["pool"] is None
    if _two_numba_threads < 2 or not blas._state["set"]:
        return
    numba.set_num_threads(2)
    with pytest.raises(ValueError):
        blas.matmul(a, b, out=np.empty((16, 32, 4095), np.float32))


def test_switches_numpys_openblas_when_another_package_brought_its_own():
    """opencv-python's wheel carries its own OpenBLAS; loaded before darkpy finds OpenBLAS, it must
    not be the only one darkpy switches: numpy's follows every switch too."""
    pytest.importorskip("cv2")
    libs = [i for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"]
    if len(libs) < 2:
        pytest.skip("only one OpenBLAS loaded")
    numpy_lib = [i["filepath"] for i in threadpoolctl.threadpool_info(  # the one numpy's matmul calls
    ) if i["internal_api"] == "openblas" and "numpy" in i["filepath"]]
    with threadpoolctl.threadpool_limits(limits=2):
        blas._state["set"] = None
        blas.configure(2)
        blas._set(1)
        counts = {i["filepath"]: i["num_threads"] for i in threadpoolctl.threadpool_info()
                  if i["internal_api"] == "openblas"}
        blas._set(2)
    assert numpy_lib and all(counts[path] == 1 for path in numpy_lib), counts
    assert set(counts.values()) == {1}, counts
