"""The fused 1x1 convolution of inference over batches of large outputs (darkpy/blas.py,
`pointwise`): its OpenBLAS kernel (kernels/pointwise.py, `blas_forward`), how it cuts the work into
units, the kernel against a float64 product over units of every kind (runs of positions, blocks of
filters, both, last runs and blocks shorter), its epilogue against the separate pass, which layers
take it, and a network inferring on it (both kernels) against the same network on the GEMM
path."""
from __future__ import annotations

import numba
import numpy as np
import pytest

import darkpy.layers.convolutional as conv
from darkpy import blas
from darkpy.kernels import cblas, gemm
from darkpy.kernels import pointwise as pw
from darkpy.network import network_from_text

from helpers import assert_epilogue_is_the_separate_pass, same_random_parameters

pytestmark = [pytest.mark.skipif(not cblas.load(), reason="needs numpy's OpenBLAS (ILP64 sgemm)"),
              pytest.mark.usefixtures("blas_state")]         # the tests configure darkpy.blas


@pytest.fixture(autouse=True)
def _configured():
    blas.configure(2)


@pytest.mark.parametrize("B,N,C,P", [(64, 64, 64, 3136), (1, 256, 64, 3136), (1, 256, 1024, 196),
                                     (2, 48, 16, 5), (3, 1000, 3, 10816)])
def test_units_cover_the_output_in_cache_sized_runs(B, N, C, P):
    """Runs of whole multiples of 16 positions (or the whole map), each of at most
    BLAS_UNIT_FLOATS input and output values when positions can be cut, that together cover the
    map; all filters per unit unless there would be fewer than BLAS_MIN_UNITS units, then blocks
    of filters (multiples of 16), at least two."""
    cols, fblock = pw.blas_units(B, N, C, P)
    runs, blocks = -(-P // cols), -(-N // fblock)
    assert cols == P or cols % 16 == 0
    assert (runs - 1) * cols < P <= runs * cols
    assert cols * (N + C) <= pw.BLAS_UNIT_FLOATS or cols == 16
    if B * runs >= pw.BLAS_MIN_UNITS:
        assert fblock == N
    else:
        assert fblock % 16 == 0 and (blocks >= 2 or N <= 16)


def _call(y, x, w, *epilogue):
    blas.one_blas_thread(pw.blas_forward, y, x, w, *epilogue)


# (batch, channels, filters, positions per item, unit floats): one unit per item; runs of
# positions with a short last one; blocks of filters (one item) with a short last block; both
SHAPES = [(3, 16, 40, 100, 1 << 18), (2, 24, 40, 300, 1 << 12), (1, 64, 72, 49, 1 << 18),
          (1, 8, 50, 1000, 1 << 11)]


@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_float64_product(shape, monkeypatch):
    """Every output written (NaN-filled before), within float32 rounding of the float64 product
    (relative to the sum of the terms' magnitudes); the same bits on one thread."""
    B, C, N, P, unit = shape
    monkeypatch.setattr(pw, "BLAS_UNIT_FLOATS", unit)
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal((B, C, P)).astype(np.float32)
    w = rng.standard_normal((N, C)).astype(np.float32)
    ref = np.einsum("nc,bcp->bnp", w.astype(np.float64), x.astype(np.float64))
    scale = np.einsum("nc,bcp->bnp", np.abs(w).astype(np.float64), np.abs(x).astype(np.float64))
    y = np.full((B, N, P), np.nan, np.float32)
    _call(y, x, w)
    assert np.all(np.abs(y - ref) <= 4e-7 * C * scale + 1e-30)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)                    # the same units on one thread: the same bits
    try:
        one = np.full_like(y, np.nan)
        _call(one, x, w)
    finally:
        numba.set_num_threads(threads)
    assert np.array_equal(one, y)


@pytest.mark.parametrize("act", ["linear", "leaky", "logistic", "mish"])
def test_epilogue_is_the_separate_pass(act, monkeypatch):
    """With k and off each unit's rows (runs of positions) go through act(·k + off): the same bits
    as the product followed by the separate pass."""
    monkeypatch.setattr(pw, "BLAS_UNIT_FLOATS", 1 << 12)
    assert_epilogue_is_the_separate_pass(_call, 2, 24, 40, 300, act)


def test_which_layers_take_it():
    ok = dict(c=64, n=64, k=1, stride=1, pad=0, groups=1, dilation=1, positions=3136, batch=64,
              inference_only=True, dtype=np.float32)
    assert pw.supports_large(**ok)
    for change in ({"inference_only": False}, {"k": 3}, {"stride": 2}, {"pad": 1}, {"groups": 2},
                   {"dilation": 2}, {"dtype": np.float64}, {"positions": 1},
                   {"positions": 49, "n": 2048},    # per-item GEMMs repacking 4 MB of weights
                   {"batch": 1}):                   # 800 KB of output: the separate pass is cheap
        assert not pw.supports_large(**{**ok, **change}), change


NET = """
[net]
width=20
height=20
channels=3
[convolutional]
filters=16
size=3
pad=1
batch_normalize=1
activation=leaky
[convolutional]
filters=48
size=1
batch_normalize=1
activation=leaky
[convolutional]
filters=40
size=1
activation=linear
[convolutional]
filters=24
size=1
activation=linear
"""


def test_network_on_the_path_gives_the_gemm_paths_outputs(monkeypatch):
    """Inferring with shared outputs (any output size allowed, the small-layer kernel off), the
    1x1 layers take it: 48 and 40 filters on OpenBLAS, 24 on darkpy's own stacked GEMM;
    training forwards, a network without it and a run that cannot keep OpenBLAS on one thread
    take the GEMM path; the outputs agree within float32 rounding, before and after the weights
    change."""
    monkeypatch.setattr(pw, "LARGE_MIN_BYTES", 0)
    monkeypatch.setattr(conv, "POINTWISE", False)
    nets = [network_from_text(NET, batch=3) for _ in range(2)]
    rng = same_random_parameters(nets, 5)
    x = rng.random((3, 3, 20, 20), dtype=np.float32)
    nets[0].share_outputs()
    assert [layer.pointwise_large for layer in nets[0].layers] == [False, True, True, True]
    calls = []
    for name in ("blas_forward",):
        real = getattr(pw, name)
        monkeypatch.setattr(pw, name, lambda *a, real=real: (calls.append(a[0].shape[1]), real(*a)))
    real_stacked = gemm.stacked
    monkeypatch.setattr(gemm, "stacked", lambda *a: (calls.append(a[0].shape[1]), real_stacked(*a)))
    monkeypatch.setattr(conv, "POINTWISE_LARGE", False)
    nets[1].share_outputs()
    assert not any(layer.pointwise_large for layer in nets[1].layers)
    for _ in range(2):
        calls.clear()
        got = nets[0].predict(x)
        assert calls == [48, 40, 24]
        want = nets[1].predict(x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        for net in nets:
            net.layers[1].weights.value[...] *= -1.5
            net.weights_changed()
    monkeypatch.setitem(blas._state, "set", None)         # OpenBLAS's threads not settable
    np.testing.assert_allclose(nets[0].predict(x), nets[1].predict(x), rtol=1e-5, atol=1e-5)
    nets[0].unshare_outputs()
    assert not any(layer.pointwise_large for layer in nets[0].layers)
