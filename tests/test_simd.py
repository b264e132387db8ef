"""kernels/simd.py: the vector type and its operations, in float32 and float64, against
numpy; what it refuses at compile time."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from numba.core.codegen import get_host_cpu_features

from darkpy.kernels import microgemm, simd
from darkpy.kernels.pool2x2 import max4, pool_pair

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
def _lanewise(out, a, b):
    u, v = simd.load(a, 0), simd.load(b, 0)
    simd.store(out, 0, simd.add(u, v))
    simd.store(out, L, simd.sub(u, v))
    simd.store(out, 2 * L, simd.neg(u))
    simd.store(out, 3 * L, simd.mul(u, v))
    simd.store_low(out, 4 * L, u)


@numba.njit(cache=False)
def _widened(wide, lanes, a, s):
    """wide: a's values as float64 and s·(1 + a) in float64 lanes; lanes: each lane of the splat
    s read back one by one."""
    w = simd.widen(simd.load(a, 0))
    simd.store(wide, 0, w)
    sv = simd.splat(w, s)
    simd.store(wide, L, simd.mul(sv, simd.add(simd.splat(w, 1), w)))
    for i in range(L):
        lanes[i] = simd.lane(sv, i)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lanewise_operations_give_the_scalar_bits(dtype):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal(L).astype(dtype), rng.standard_normal(L).astype(dtype)
    a[0], b[1] = 0.0, -0.0
    out = np.full(5 * L, 7, dtype)
    _lanewise(out, a, b)
    for got, want in ((out[:L], a + b), (out[L:2 * L], a - b), (out[2 * L:3 * L], -a), (out[3 * L:4 * L], a * b),
                      (out[4 * L:], np.concatenate([a[:L // 2], np.full(L - L // 2, 7, dtype)]))):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))   # store_low: half


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_widen_splat_and_lane(dtype):
    a = np.random.default_rng(4).standard_normal(L).astype(dtype)
    a[0] = np.finfo(dtype).tiny / 4               # a subnormal survives the widening exactly
    wide, lanes = np.empty(2 * L), np.empty(L)
    _widened(wide, lanes, a, 0.1)
    a64 = a.astype(np.float64)
    np.testing.assert_array_equal(wide[:L], a64)
    np.testing.assert_array_equal(wide[L:], 0.1 * (1 + a64))
    np.testing.assert_array_equal(lanes, np.full(L, 0.1))


@numba.njit(cache=False)
def _cast_and_select(out32, out64, v, u):
    """out32 := v (float64) cast to float32; out64 := positive_or(v, u) and its cast to float64
    (v itself)."""
    a, b = simd.load(v, 0), simd.load(u, 0)
    simd.store(out32, 0, simd.cast_like(out32, a))
    simd.store(out64, 0, simd.positive_or(a, b))
    simd.store(out64, L, simd.cast_like(out64, a))


def test_cast_like_and_positive_or_give_the_scalar_values():
    """The cast rounds as numpy's float64 -> float32 (ties, the largest values, a NaN), the
    selection is `v if v > 0 else u` (zeros of both signs and NaN take u)."""
    v = np.random.default_rng(5).standard_normal(L)
    v[:6] = [1 + 2.0 ** -24, -0.0, np.nan, 3.5e38, 0.0, -1e-46]
    u = np.arange(L, dtype=np.float64) + 100
    out32, out64 = np.empty(L, np.float32), np.empty(2 * L)
    _cast_and_select(out32, out64, v, u)
    with np.errstate(over="ignore"):            # 3.5e38 rounds to inf
        want = v.astype(np.float32)
    np.testing.assert_array_equal(out32.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(out64[:L], np.array([a if a > 0 else b for a, b in zip(v, u)]))
    np.testing.assert_array_equal(out64[L:], v)


@numba.njit(cache=False)
def _picks(out, a, b):
    """out := evens(a0, a1), odds(a0, a1) and greater_or(a0, b0), a0, a1 the two vectors of a."""
    a0, a1 = simd.load(a, 0), simd.load(a, L)
    simd.store(out, 0, simd.evens(a0, a1))
    simd.store(out, L, simd.odds(a0, a1))
    simd.store(out, 2 * L, simd.greater_or(a0, simd.load(b, 0)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_evens_odds_and_greater_or(dtype):
    """evens/odds: every other value of 2·LANES in order; greater_or: `v if v > u else u` (equal
    values, zeros of both signs, a NaN on either side)."""
    a = np.random.default_rng(2).standard_normal(2 * L).astype(dtype)
    b = np.random.default_rng(3).standard_normal(L).astype(dtype)
    a[:5], b[:5] = [0.0, -0.0, np.nan, 1.0, 2.0], [-0.0, 0.0, 1.0, np.nan, 2.0]
    out = np.empty(3 * L, dtype)
    _picks(out, a, b)
    np.testing.assert_array_equal(out[:L], a[0::2])
    np.testing.assert_array_equal(out[L:2 * L], a[1::2])
    want = np.array([v if v > u else u for v, u in zip(a[:L], b)], dtype)
    np.testing.assert_array_equal(out[2 * L:].view(f"u{a.itemsize}"), want.view(f"u{a.itemsize}"))


@numba.njit(cache=False)
def _zips(out, a, half):
    """out := zip_low and zip_high of a's two vectors, then load_low of `half` (LANES/2 values,
    read from an array of exactly that many) stored whole, its lanes past LANES/2 whatever
    load_low left there."""
    a0, a1 = simd.load(a, 0), simd.load(a, L)
    simd.store(out, 0, simd.zip_low(a0, a1))
    simd.store(out, L, simd.zip_high(a0, a1))
    simd.store(out, 2 * L, simd.load_low(half, 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_zips_invert_evens_and_odds_and_load_low_reads_half(dtype):
    """zip_low/zip_high interleave the halves of two vectors: together the row whose even and odd
    values the vectors are; load_low fills a vector's first LANES/2 lanes from LANES/2 values."""
    a = np.random.default_rng(4).standard_normal(2 * L).astype(dtype)
    half = np.random.default_rng(5).standard_normal(L // 2).astype(dtype)
    out = np.empty(3 * L, dtype)
    _zips(out, a, half)
    row = np.empty(2 * L, dtype)
    row[0::2], row[1::2] = a[:L], a[L:]
    np.testing.assert_array_equal(out[:2 * L], row)
    np.testing.assert_array_equal(out[2 * L:2 * L + L // 2], half)


@numba.njit(cache=False)
def _pool_pairs(p, r0, r1, w):
    """p[:w] := pool_pair of rows r0, r1; the scalar max4 of the same windows, as the second row
    (written first: a store past p[0, :w] would change it)."""
    for t in range(w):
        p[1, t] = max4(r0[2 * t], r0[2 * t + 1], r1[2 * t], r1[2 * t + 1])
    pool_pair(p[0, :w], r0, r1)


@pytest.mark.parametrize("w", [1, L // 2, L // 2 + 1, L - 1, L, L + 3, L + L // 2, 3 * L])
@pytest.mark.parametrize("slack", [0, 3])
def test_pool_pair_is_max4_bit_for_bit(w, slack):
    """The vector 2x2 maxima (whole and half vectors) equal `max4`'s window by window, in bits:
    ties of signed zeros keep the first, a NaN in the first position stays, a NaN elsewhere loses;
    rows of exactly 2w values and longer."""
    rng = np.random.default_rng(w)
    for dtype in (np.float32, np.float64):
        r0, r1 = (rng.integers(-2, 3, 2 * w + slack).astype(dtype) for _ in range(2))
        r0[rng.random(r0.shape) < 0.2] = -0.0
        r1[rng.random(r1.shape) < 0.2] = np.nan
        r0[rng.random(r0.shape) < 0.1] = np.nan
        p = np.full((2, w), 7, dtype)
        _pool_pairs(p, r0, r1, w)
        np.testing.assert_array_equal(p[0].view(f"u{p.itemsize}"), p[1].view(f"u{p.itemsize}"))


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


@numba.njit(cache=False)
def _flat_of_plane(p, b, f):
    """p[b, f]'s values as a 1-D view: its first value set to -1, the view returned."""
    v = simd.flat(p[b, f])
    v[0] = -1.0
    return v


def test_flat_is_a_view_of_the_values():
    """`flat` of a C-contiguous plane of a 4-d array: its values in order, writes go through, and
    the view returned out of the kernel keeps the memory alive (its own reference)."""
    p = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    want = p[1, 2].ravel().copy()
    v = _flat_of_plane(p, 1, 2)
    want[0] = -1.0
    assert v.shape == (20,)
    np.testing.assert_array_equal(v, want)
    assert p[1, 2, 0, 0] == -1.0 and np.shares_memory(v, p)
    del p
    np.testing.assert_array_equal(v, want)
    with pytest.raises(numba.core.errors.TypingError):      # not C-contiguous: refused
        _flat_of_plane(np.zeros((2, 3, 4, 5), np.float32)[:, :, :, ::2], 0, 0)


def test_lanes_follow_the_cpu_features():
    assert simd._lanes("+64bit,+avx,+avx2,+fma,-avx512f,-avx512bw") == 8
    assert simd._lanes("+avx2,+avx512f,+avx512bw") == 16
    assert simd._lanes("+avx512fp16,-avx512f") == 8             # the exact feature, not a prefix
    features = (numba.config.CPU_FEATURES if numba.config.CPU_FEATURES is not None
                else get_host_cpu_features())
    assert L == simd._lanes(features)


@pytest.mark.slow
def test_kernels_at_the_avx2_width_on_an_avx512_machine(tmp_path):
    """The other tests check the vector kernels at this machine's width; on AVX-512 the 8-lane
    code is checked here too, with numba told the CPU lacks AVX-512 (a fresh kernel cache)."""
    features = get_host_cpu_features()
    if "+avx512f" not in features.split(","):
        pytest.skip("no AVX-512 here: 16-lane kernels cannot run, the other tests check 8 lanes")
    narrowed = ",".join("-" + f[1:] if f[:1] == "+" and ("avx512" in f or "avx10" in f) else f
                        for f in features.split(","))
    env = dict(os.environ, NUMBA_CPU_FEATURES=narrowed, NUMBA_CACHE_DIR=str(tmp_path))
    env.pop("PYTEST_XDIST_WORKER", None)
    here = Path(__file__).parent
    lanes = subprocess.run([sys.executable, "-c", "from darkpy.kernels import simd; print(simd.LANES)"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert lanes.stdout.strip() == "8", lanes.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         str(here / "test_direct_conv.py") + "::test_kernels_match_float64_correlation",
         str(here / "test_direct_fv.py") + "::test_kernel_matches_float64_correlation",
         str(here / "test_direct_fv.py") + "::test_gradients_match_float64_references"],
        env=env, cwd=here.parent, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout


@numba.njit(cache=False)
def _products(out8, out1, out4, lhs, rhs, k, cols, add):
    """The three microkernels of kernels/microgemm.py over a (8, k) @ (k, cols) product: rows8x2
    on the first CV columns, rows8x1 on the next LANES (both written or added), rows4x2 on rows
    4..7 (row 7 repeated)."""
    microgemm.rows8x2(out8, 0, cols, lhs, 0, k, rhs, 0, cols, 0, k, add)
    microgemm.rows8x1(out1, microgemm.CV, cols, lhs, 0, k, rhs, microgemm.CV, cols, 0, k, add)
    microgemm.rows4x2(out4, 0, cols, 2 * cols, 3 * cols, lhs, 4 * k, 5 * k, 7 * k, 7 * k,
                      rhs, 0, cols, 0, k)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_microkernels_match_numpy(dtype):
    rng = np.random.default_rng(3)
    k, cols = 37, microgemm.CV + L
    lhs = rng.standard_normal(8 * k).astype(dtype)
    rhs = rng.standard_normal(k * cols).astype(dtype)
    want = lhs.reshape(8, k).astype(np.float64) @ rhs.reshape(k, cols).astype(np.float64)
    out8, out1, out4 = (np.full(8 * cols, np.nan, dtype) for _ in range(3))
    _products(out8, out1, out4, lhs, rhs, k, cols, False)
    tol = 1e-12 if dtype == np.float64 else 1e-4
    cv = microgemm.CV
    np.testing.assert_allclose(out8.reshape(8, cols)[:, :cv], want[:, :cv], rtol=tol, atol=tol)
    assert np.isnan(out8.reshape(8, cols)[:, cv:]).all()            # only its two vectors
    np.testing.assert_allclose(out1.reshape(8, cols)[:, cv:], want[:, cv:], rtol=tol, atol=tol)
    assert np.isnan(out1.reshape(8, cols)[:, :cv]).all()
    got4 = out4.reshape(8, cols)[:4, :cv]
    np.testing.assert_allclose(got4, want[[4, 5, 7, 7], :cv], rtol=tol, atol=tol)
    base = rng.standard_normal(8 * cols).astype(dtype)          # accumulating into what is there
    out8, out1 = base.copy(), base.copy()
    _products(out8, out1, out4, lhs, rhs, k, cols, True)
    added = want + base.reshape(8, cols)
    np.testing.assert_allclose(out8.reshape(8, cols)[:, :cv], added[:, :cv], rtol=tol, atol=tol)
    np.testing.assert_allclose(out1.reshape(8, cols)[:, cv:], added[:, cv:], rtol=tol, atol=tol)


@numba.njit(cache=False)
def _operators(out, a, b):
    u, v = simd.load(a, 0), simd.load(b, 0)
    simd.store(out, 0, u + v)
    simd.store(out, L, u - v)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_plus_and_minus_on_vectors_are_the_scalar_operations(dtype):
    """`u + v` and `u - v` on vectors (what lets kernels/winograd_tiles.py's transforms run on
    vectors and scalars alike): the bits of the scalar operations, lane by lane."""
    a = np.random.default_rng(6).standard_normal(L).astype(dtype)
    b = np.random.default_rng(7).standard_normal(L).astype(dtype)
    out = np.empty(2 * L, dtype)
    _operators(out, a, b)
    bits = f"u{a.itemsize}"
    np.testing.assert_array_equal(out[:L].view(bits), (a + b).view(bits))
    np.testing.assert_array_equal(out[L:].view(bits), (a - b).view(bits))
