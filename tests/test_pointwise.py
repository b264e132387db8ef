"""The fused 1x1 convolution of inference (kernels/pointwise.py): the kernel against a float64
product (maps of whole panels, of a last vector, of a tail shorter than a vector; filter counts that
are not whole blocks of eight; one and many runs per item; both branches, the same bits), its
epilogue against the separate pass, which layers take it, and a network inferring on it against
the same network on its other paths."""
from __future__ import annotations

import numpy as np
import pytest

import darkpy.layers.convolutional as conv
from darkpy.kernels import pointwise as pw
from darkpy.kernels import simd

from helpers import assert_epilogue_is_the_separate_pass, assert_path_infers_as_the_others

pytestmark = pytest.mark.skipif(simd.LANES != 16, reason="the kernel is for AVX-512 machines")


def _inputs(B, C, N, P, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, C, P)).astype(np.float32)
    w = rng.standard_normal((N, C)).astype(np.float32)
    return x, w


# (batch, channels, filters, positions per item): whole panels of 32, a last vector of 16, tails of
# 9 and 1 value, 13x13 and 7x7 maps; 8, 10, 27 and 64 filters; 1 to 256 channels
SHAPES = [(1, 64, 64, 1024), (3, 16, 10, 48), (2, 3, 27, 169), (1, 256, 8, 49), (2, 1, 9, 16),
          (1, 128, 64, 33), (4, 32, 16, 64)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cols", [pw.CV, 1 << 20])        # many runs per item, or one
def test_kernel_matches_float64_product_on_both_branches(shape, cols):
    """Every output written (NaN-filled before), within float32 rounding of the float64 product
    (relative to the sum of the terms' magnitudes), the same bits on both branches."""
    B, C, N, P = shape
    x, w = _inputs(B, C, N, P, sum(shape))
    ref = np.einsum("nc,bcp->bnp", w.astype(np.float64), x.astype(np.float64))
    scale = np.einsum("nc,bcp->bnp", np.abs(w).astype(np.float64), np.abs(x).astype(np.float64))
    outs = []
    for run in (pw._forward_serial, pw._forward_parallel):
        y = np.full((B, N, P), np.nan, np.float32)
        run(y, x, w, pw._NO_AFFINE, pw._NO_AFFINE, 0, cols)
        assert np.all(np.abs(y - ref) <= 4e-7 * C * scale + 1e-30), run
        outs.append(y)
    assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("act", ["linear", "leaky", "relu", "logistic", "mish"])
def test_epilogue_is_the_separate_pass(act):
    """With k and off the product goes through act(·k + off) row by row: the same bits as the
    product followed by the separate pass."""
    assert_epilogue_is_the_separate_pass(pw.conv_forward, 2, 24, 12, 100, act, seed=8)


def test_which_layers_take_it():
    ok = dict(c=64, n=32, k=1, stride=1, pad=0, groups=1, dilation=1, positions=169, batch=1,
              inference_only=True, dtype=np.float32)
    assert pw.supports(**ok)
    assert pw.supports(**{**ok, "positions": 256, "batch": 64})             # b64 up to 16x16 maps
    for change in ({"inference_only": False}, {"k": 3}, {"stride": 2}, {"pad": 1}, {"groups": 2},
                   {"dilation": 2}, {"dtype": np.float64}, {"n": 7}, {"c": 257},
                   {"c": 256, "n": 256},                # past MAX_WEIGHTS
                   {"positions": 15}, {"positions": 784, "batch": 64}, {"positions": 3136}):
        assert not pw.supports(**{**ok, **change}), change


NET = """
[net]
width={s}
height={s}
channels=3
[convolutional]
filters=16
size=3
pad=1
batch_normalize=1
activation=leaky
[convolutional]
filters=27
size=1
batch_normalize=1
activation=leaky
[convolutional]
filters=10
size=1
activation=linear
[convolutional]
filters=4
size=1
activation=linear
"""


@pytest.mark.parametrize("size,batch", [(13, 1), (16, 3)])
def test_network_on_the_path_gives_the_other_paths_outputs(size, batch, monkeypatch):
    """Inferring with shared outputs, the 1x1 layers of 16 -> 27 and 27 -> 10 take the path (the
    last, 4 filters, does not), training forwards and a network without it take the others; the
    outputs agree within float32 rounding, before and after the weights change."""
    assert_path_infers_as_the_others(NET.format(s=size), batch, size, "pointwise",
                                     [False, True, True, False], (conv, "POINTWISE"), monkeypatch)
