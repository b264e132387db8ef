"""kernels/simd.py: the vector type and its operations, in float32 and float64, against
numpy; what it refuses at compile time."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from darkpy.kernels import simd

L = simd.LANES


@numba.njit(cache=False)
def _axpy_blocks(y, s, x):
    """y[i:i+L] = y[i:i+L] + s·x[i:i+L] for every whole block; returns the sum of a zero vector
    stored into the scratch tail (must be 0)."""
    for i in range(0, y.shape[0] - L + 1, L):
        simd.store(y, i, simd.fma(simd.load(y, i), s, simd.load(x, i)))
    tail = np.empty(L, y.dtype)
    simd.store(tail, 0, simd.zero(tail))
    return tail.sum()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_operations_match_numpy(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(5 * L + 3).astype(dtype)
    y = rng.standard_normal(5 * L + 3).astype(dtype)
    want = y.copy()
    want[:5 * L] += dtype(0.5) * x[:5 * L]       # an exact product: fused or not, the same bits
    assert _axpy_blocks(y, dtype(0.5), x) == 0
    np.testing.assert_array_equal(y, want)      # the partial block at the end untouched


@numba.njit(cache=False)
def _gather(a, idx):
    out = np.empty(idx.shape[0], a.dtype)
    for j in range(idx.shape[0]):
        out[j] = simd.get(a, idx[j])
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_get_reads_the_scalar(dtype):
    a = np.random.default_rng(1).standard_normal(37).astype(dtype)
    idx = np.array([0, 36, 5, 5, 17], np.int64)
    out = _gather(a, idx)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, a[idx])


def test_refuses_what_it_cannot_load():
    @numba.njit(cache=False)
    def load_2d(a):
        return simd.load(a, 0)
    with pytest.raises(numba.core.errors.TypingError):
        load_2d(np.zeros((2, L), np.float32))
    with pytest.raises(numba.core.errors.TypingError):
        load_2d(np.zeros(L, np.int32))
