"""The direct convolution across filters that computes each output position's taps inside the input
only (kernels/direct_fv_border.py): which calls take it; every output written and equal to a
float64 correlation; the same bits as the padded path, with and without the epilogue, added into
the output, and writing a 2x2 maxpool (the epilogue before or after the maxima); the same bits at
one and two threads; and a network on it against itself on the padded path."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from benchmarks.engine import sane_weights
from darkpy import outputs_plan
from darkpy.kernels import direct_fv as fv
from darkpy.kernels import direct_fv_border as border
from darkpy.kernels.activations import LEAKY, LINEAR, RELU
from darkpy.network import network_from_text
from test_direct_conv import correlation


def _weights(w):
    wt = np.full(w[0].size * fv.padded_filters(w.shape[0]), np.nan, w.dtype)
    fv.filters_last(wt, w)
    return wt


def _forward(x, w, pad, *epilogue, add=None, pool=None, on=True, monkeypatch=None):
    """y from `fv.conv_forward` (stride 1) with the border path on or off; `add`: the y it adds to."""
    B, _, H, W = x.shape
    N, _, k, _ = w.shape
    y = (np.full((B, N, H + 2 * pad - k + 1, W + 2 * pad - k + 1), np.nan, x.dtype) if add is None
         else add.copy())
    monkeypatch.setattr(border, "BORDER", on)
    monkeypatch.setattr(fv, "PARALLEL_MIN", 0)         # the small shapes too (parallel kernels only)
    fv.conv_forward(y, x, _weights(w), k, 1, 1, pad, *epilogue, add=add is not None, pool=pool)
    return y


def _taken(monkeypatch):
    """Counts the calls `border.conv_forward` takes."""
    calls = []
    real = border.conv_forward

    def spy(*args):
        calls.append(1)
        return real(*args)
    monkeypatch.setattr(border, "conv_forward", spy)
    return calls


# (batch, channels, h, w, filters, k, pad): 3x3 'same', 5x5 at padding 1 and 2, padding k − 1 (the
# input gradient's), maps narrower than the kernel, batches that are not whole blocks of items,
# filters that are not whole vectors
SHAPES = [(64, 32, 4, 4, 64, 3, 1), (13, 16, 8, 8, 33, 3, 1), (9, 6, 7, 5, 40, 5, 2),
          (21, 8, 9, 6, 16, 5, 1), (11, 12, 3, 5, 70, 3, 2), (8, 40, 2, 2, 8, 3, 1)]


@pytest.mark.parametrize("shape", SHAPES)
def test_every_output_is_the_correlation(shape, monkeypatch):
    B, C, H, W, N, k, pad = shape
    rng = np.random.default_rng(sum(shape))
    x, w = rng.standard_normal((B, C, H, W)), rng.standard_normal((N, C, k, k))
    calls = _taken(monkeypatch)
    y = _forward(x, w, pad, monkeypatch=monkeypatch)
    assert calls, "the border path did not take the call"
    np.testing.assert_allclose(y, correlation(x, w, 1, 1, pad), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("act", [LEAKY, RELU, LINEAR, None])
def test_same_bits_as_the_padded_path(shape, act, monkeypatch):
    """float32, the epilogue on the tiles (or none), into NaN-filled outputs; and added into y."""
    B, C, H, W, N, k, pad = shape
    rng = np.random.default_rng(sum(shape) + 1)
    x = rng.standard_normal((B, C, H, W)).astype(np.float32)
    w = rng.standard_normal((N, C, k, k)).astype(np.float32)
    epi = () if act is None else (rng.uniform(-1, 1, N), rng.normal(0, 0.1, N), act)
    calls = _taken(monkeypatch)
    got = _forward(x, w, pad, *epi, monkeypatch=monkeypatch)
    assert calls
    np.testing.assert_array_equal(got, _forward(x, w, pad, *epi, on=False, monkeypatch=monkeypatch))
    if act is None:
        y0 = rng.standard_normal(got.shape).astype(np.float32)
        np.testing.assert_array_equal(
            _forward(x, w, pad, add=y0, monkeypatch=monkeypatch),
            _forward(x, w, pad, add=y0, on=False, monkeypatch=monkeypatch))


@pytest.mark.parametrize("batch,h", [(64, 4), (10, 8), (16, 6)])
@pytest.mark.parametrize("act", [LEAKY, RELU, LINEAR])
def test_pooled_output_same_bits_as_the_padded_path(batch, h, act, monkeypatch):
    """The 2x2 maxima written instead of the output: scales of both signs (the epilogue after the
    maxima for the positive ones where `pools_first`), with NaNs and ties in the input."""
    rng = np.random.default_rng(batch + h)
    C, N = 16, 40
    x = rng.standard_normal((batch, C, h, h)).astype(np.float32)
    x[0, :, :2, :2] = 0.25
    x[1, 3, 1, 1] = np.nan
    w = rng.standard_normal((N, C, 3, 3)).astype(np.float32)
    kk, off = rng.uniform(-1, 1, N), rng.normal(0, 0.1, N)
    kk[:fv.FV] = np.abs(kk[:fv.FV])       # the first group of filters all positive
    pools = [np.full((batch, N, h // 2, h // 2), np.nan, np.float32) for _ in range(2)]
    calls = _taken(monkeypatch)
    for pool, on in zip(pools, (True, False)):
        _forward(x, w, 1, kk, off, act, pool=pool, on=on, monkeypatch=monkeypatch)
    assert calls
    np.testing.assert_array_equal(pools[0], pools[1])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("border_on", [True, False])
def test_means_are_the_output_maps_means(shape, border_on, monkeypatch):
    """The maps' means written instead of the output (for a following layer that averages its
    input first): each the mean of the padded path's output map, summed in another order. On
    the border path y is not written; elsewhere y is written, then averaged."""
    B, C, H, W, N, k, pad = shape
    rng = np.random.default_rng(sum(shape) + 2)
    x = rng.standard_normal((B, C, H, W)).astype(np.float32)
    w = rng.standard_normal((N, C, k, k)).astype(np.float32)
    epi = (rng.uniform(-1, 1, N), rng.normal(0, 0.1, N), LEAKY)
    y = _forward(x, w, pad, *epi, on=False, monkeypatch=monkeypatch)
    mean = np.full((B, N), np.nan, np.float32)
    calls = _taken(monkeypatch)
    out = np.full_like(y, np.nan)
    monkeypatch.setattr(border, "BORDER", border_on)
    fv.conv_forward(out, x, _weights(w), k, 1, 1, pad, *epi, mean=mean)
    assert bool(calls) == border_on
    assert np.isnan(out).all() if border_on else np.array_equal(out, y)
    np.testing.assert_allclose(mean, y.mean(axis=(2, 3), dtype=np.float64), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="means"):
        fv.conv_forward(out, x, _weights(w), k, 1, 1, pad, mean=mean)      # no epilogue


def test_same_bits_at_one_and_two_threads(monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((24, 32, 4, 4)).astype(np.float32)
    w = rng.standard_normal((64, 32, 3, 3)).astype(np.float32)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _forward(x, w, 1, monkeypatch=monkeypatch)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = _forward(x, w, 1, monkeypatch=monkeypatch)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(one, two)


def test_which_calls_it_takes():
    taps = 32 * 9
    assert border.applies(1, 1, 1, 3, 8, taps, 4)
    assert not border.applies(2, 2, 1, 3, 64, taps, 4)          # strided
    assert not border.applies(1, 1, 0, 3, 64, taps, 4)          # no padding: nothing to leave out
    assert not border.applies(1, 1, 3, 3, 64, taps, 4)          # a position with no tap inside
    assert not border.applies(1, 1, 1, 3, 7, taps, 4)           # a small batch
    assert not border.applies(1, 1, 1, 3, 64, border.CHUNK_BYTES // (fv.FV * 4) + 1, 4)


def test_network_gives_the_padded_paths_outputs(monkeypatch):
    """digits' layers at b16: inference (with its pools written by the convolutions) and a training
    step's forward, backward (the input gradient is this forward with padding k − 1) and update.
    (Not its last 3x3 convolution writing its maps' means: both paths sum them in their own order,
    tests/test_avg_fusion.py.)"""
    monkeypatch.setattr(outputs_plan, "WRITE_MEANS", False)
    with open("cfg/digits.cfg") as f:
        text = f.read()
    outs = {}
    calls = _taken(monkeypatch)
    for on in (True, False):
        monkeypatch.setattr(border, "BORDER", on)
        if not on:
            taken, calls[:] = len(calls), []
        net = network_from_text(text, batch=16)
        sane_weights(net.layers)
        x = np.random.default_rng(0).random((16, *net.input_shape), dtype=np.float32)
        truth = np.eye(10, dtype=np.float32)[np.arange(16) % 10]
        inferred = net.forward(x).copy()
        net.share_outputs(keep=[net.output_layer.index])
        shared = net.forward(x).copy()
        net.unshare_outputs()
        net.forward(x, truth, train=True)
        net.backward()
        grads = [p.grad.copy() for l in net.layers for p in l.params]
        outs[on] = inferred, shared, grads
    assert taken >= 5 and not calls   # 2 convolutions x 2 forwards, then their training passes
    for a, b in zip(outs[True][:2], outs[False][:2]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(outs[True][2], outs[False][2]):
        np.testing.assert_array_equal(a, b)
