"""The packed 1x1 convolution of inference (kernels/pointwise.py, `packed_forward`): the kernel
against a float64 product (panels of 32 positions and tails of a vector, a part of one and a single
value; units of all filters and of groups of them with the input packed ahead; more channels than
one pass over a panel sums; both branches, the same bits), its epilogue against the separate pass,
which layers take it, and a network inferring on it against the same network on the GEMM path."""
from __future__ import annotations

import numpy as np
import pytest

import darkpy.layers.convolutional as conv
from darkpy.kernels import pointwise as pw
from darkpy.kernels import simd

from helpers import assert_epilogue_is_the_separate_pass, assert_path_infers_as_the_others

pytestmark = pytest.mark.skipif(simd.LANES != 16, reason="the kernel is for AVX-512 machines")

# (batch, channels, filters, positions per item): whole panels (3136 = 98 x 32), a last vector
# (784), tails of 4, 17 and 1 values (196, 49, 33), 8 to 272 filters (one group or groups of
# PACKED_ROWS), 3 to 600 channels (one pass of PACKED_KB or three)
SHAPES = [(1, 64, 64, 3136), (1, 128, 16, 784), (1, 600, 272, 196), (1, 300, 136, 49),
          (3, 3, 8, 33), (2, 40, 24, 512)]


@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_float64_product_on_both_branches(shape):
    """Every output written (NaN-filled before), within float32 rounding of the float64 product
    (relative to the sum of the terms' magnitudes), the same bits on both branches; the input
    packed ahead exactly where a panel's units are groups of filters."""
    B, C, N, P = shape
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal((B, C, P)).astype(np.float32)
    w = rng.standard_normal((N, C)).astype(np.float32)
    ref = np.einsum("nc,bcp->bnp", w.astype(np.float64), x.astype(np.float64))
    scale = np.einsum("nc,bcp->bnp", np.abs(w).astype(np.float64), np.abs(x).astype(np.float64))
    rows, panels = pw.packed_plan(B, N, P)
    scratch = pw.packed_scratch(B, N, C, P)
    assert (scratch > 0) == (rows < N)
    outs = []
    for run in (pw._packed_serial, pw._packed_parallel):
        y = np.full((B, N, P), np.nan, np.float32)
        xp = np.full(scratch, np.nan, np.float32)
        run(y, x, w, pw._NO_AFFINE, pw._NO_AFFINE, 0, xp, pw.PACKED_KB, rows, panels,
            pw.PACKED_FILTERS_FIRST)
        assert np.all(np.abs(y - ref) <= 4e-7 * C * scale + 1e-30), run
        outs.append(y)
    assert np.array_equal(outs[0], outs[1])


def test_groups_of_filters_where_an_item_has_few_runs():
    """A 7x7 map at batch 1 (two panels) is cut by filters too, its input packed ahead; a 56x56
    map takes all filters per unit and packs nothing ahead."""
    assert pw.packed_plan(1, 512, 49) == (pw.PACKED_ROWS, 1) and pw.packed_scratch(1, 512, 64, 49)
    rows, panels = pw.packed_plan(1, 256, 3136)
    assert rows == 256 and panels == pw.PACKED_PANELS and pw.packed_scratch(1, 256, 64, 3136) == 0


@pytest.mark.parametrize("act", ["linear", "leaky", "logistic", "mish"])
@pytest.mark.parametrize("shape", [(1, 24, 16, 100), (1, 40, 160, 70)])
def test_epilogue_is_the_separate_pass(act, shape):
    """With k and off the product goes through act(·k + off) on each unit's rows: the same bits as
    the product followed by the separate pass (all filters per unit, and groups of them)."""
    B, C, N, P = shape
    assert_epilogue_is_the_separate_pass(pw.packed_forward, B, C, N, P, act, seed=5)


def test_which_layers_take_it():
    ok = dict(c=300, n=16, k=1, stride=1, pad=0, groups=1, dilation=1, inference_only=True,
              dtype=np.float32)
    assert pw.supports_packed(**ok)
    for change in ({"inference_only": False}, {"k": 3}, {"stride": 2}, {"pad": 1}, {"groups": 2},
                   {"dilation": 2}, {"dtype": np.float64}, {"n": 12}):
        assert not pw.supports_packed(**{**ok, **change}), change


NET = """
[net]
width={s}
height={s}
channels=3
[convolutional]
filters=300
size=3
pad=1
activation=leaky
[convolutional]
filters=16
size=1
batch_normalize=1
activation=leaky
[convolutional]
filters=12
size=1
activation=linear
"""


@pytest.mark.parametrize("size,batch", [(24, 1), (23, 2)])
def test_network_on_the_path_gives_the_other_paths_outputs(size, batch, monkeypatch):
    """Inferring with shared outputs, the 300 -> 16 layer takes the path (the 16 -> 12 after it, 12
    filters, does not); training forwards and a network without it take the GEMM path; the outputs
    agree within float32 rounding, before and after the weights change. Past PACKED_MAX_INPUT_BYTES
    of input the GEMM path takes the layer again."""
    nets = assert_path_infers_as_the_others(NET.format(s=size), batch, size, "pointwise_packed",
                                            [False, True, False], (conv, "POINTWISE_PACKED"),
                                            monkeypatch, tol=2e-5)
    monkeypatch.setattr(conv, "POINTWISE_PACKED", True)
    monkeypatch.setattr(conv, "PACKED_MAX_INPUT_BYTES", 300 * size * size * 4 * batch - 4)
    nets[0].share_outputs()
    assert not nets[0].layers[1].pointwise_packed
