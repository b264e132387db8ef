"""The inference epilogue (layers/convolutional.py: `inference_epilogue`): on the Winograd and the
direct paths an inference forward applies bias or batch norm and the activation to each block of
output as the kernel writes it; the result must be the same bits as the separate pass
(`FUSED_EPILOGUE = False`), for every activation family, with and without batch norm, pjreddie's
CPU batch norm, the batch in chunks, and the kernels' serial and parallel branches."""
from __future__ import annotations

import numpy as np
import pytest

import darkpy.layers.convolutional as conv
from darkpy.kernels import PARALLEL_MIN
from darkpy.kernels import direct as dk
from darkpy.kernels import im2col as ic
from darkpy.network import network_from_text

CFG = """[net]
batch=3
height={h}
width={h}
channels={c}
[convolutional]
filters={n}
size={k}
stride={s}
pad=1
batch_normalize={bn}
activation={activation}
"""
#: path -> (input channels, filters, stride, kernel size)
PATHS = {"winograd": (33, 8, 1, 3), "direct": (3, 6, 1, 3), "direct stride 2": (2, 32, 2, 3),
         "direct 16 channels": (16, 8, 1, 3), "direct 5x5": (3, 6, 1, 5)}


@pytest.fixture(autouse=True)
def _no_direct_fv():
    """The paths of PATHS, not the direct convolution across filters that 7x7 maps would take
    (tests/test_direct_fv.py checks its epilogue)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv, "DIRECT_FV", False)
        yield


def _forward(monkeypatch, path, fused, h, bn, darknet_cpu, activation, seed):
    c, n, s, k = PATHS[path]
    monkeypatch.setattr(conv, "FUSED_EPILOGUE", fused)
    monkeypatch.setattr(conv, "WINOGRAD_MIN_TILES", 1)
    monkeypatch.setattr(ic, "CHUNK_VALUES", 16 * 40 * 40)     # several Winograd chunks at 40x40
    monkeypatch.setattr(dk, "MID_MIN_POSITIONS", 1)            # 16 channels direct at 7x7 too
    net = network_from_text(CFG.format(h=h, c=c, n=n, s=s, k=k, bn=bn, activation=activation),
                            dtype=np.float32)
    layer = net.layers[0]
    assert (layer.winograd, layer.direct) == (path == "winograd", path != "winograd")
    layer.darknet_cpu_bn = darknet_cpu
    rng = np.random.default_rng(seed)
    layer.init_weights(rng)
    layer.biases.value[...] = rng.standard_normal(n)
    if bn:
        layer.bn.rolling_mean[...] = rng.standard_normal(n)
        layer.bn.rolling_variance[...] = rng.uniform(0.1, 2, n)
        layer.bn.scales.value[...] = rng.uniform(0.5, 1.5, n)
    assert (layer.output.size >= PARALLEL_MIN) == (h > 7)
    out = net.forward(rng.uniform(-1, 1, net.input.shape).astype(np.float32)).copy()
    assert layer._fused is fused and not layer._trained
    return out


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("activation", ["leaky", "linear", "relu", "logistic", "mish", "gelu"])
@pytest.mark.parametrize("bn,darknet_cpu", [(0, False), (1, False), (1, True)])
def test_fused_epilogue_gives_the_separate_passes_bits(monkeypatch, path, activation, bn, darknet_cpu):
    for h in (7, 48):                       # below and above PARALLEL_MIN output values
        args = (h, bn, darknet_cpu, activation, h + bn)
        fused = _forward(monkeypatch, path, True, *args)
        np.testing.assert_array_equal(fused, _forward(monkeypatch, path, False, *args))


def test_training_forward_keeps_the_separate_pass(monkeypatch):
    """Batch statistics need every plane first: a training forward never fuses."""
    monkeypatch.setattr(conv, "WINOGRAD_MIN_TILES", 1)
    net = network_from_text(CFG.format(h=8, c=16, n=8, s=1, k=3, bn=1, activation="leaky"))
    layer = net.layers[0]
    assert layer.winograd
    net.forward(np.ones(net.input.shape), train=True)
    assert layer._trained and not layer._fused


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ["leaky", "linear", "relu", "logistic"])
@pytest.mark.parametrize("rows,ow,lw", [(1, 5, 7), (3, 7, 9), (2, 16, 18), (4, 17, 19), (5, 28, 30),
                                        (2, 40, 42), (1, 48, 48), (6, 3, 5)])
def test_epilogue_from_the_accumulators_gives_the_in_place_bits(dtype, act, rows, ow, lw):
    """`epilogue.affine_act_rows_into` (what the direct path's blocks write, `direct._act_out`):
    the bits of copying the rows out and then `affine_act_row` on them in place, with NaNs, signed
    zeros and an overflowing product, for rows narrower than a vector (one vector spanning rows),
    whole vectors, and whole vectors with a tail; the values around the written rows untouched."""
    from darkpy.kernels import jit
    from darkpy.kernels.activations import code as act_code
    from darkpy.kernels.bn import affine_act_row
    from darkpy.kernels.epilogue import affine_act_rows_into

    @jit
    def in_place(y, k, off, act):
        affine_act_row(y, k, off, act)

    rng = np.random.default_rng(rows * ow)
    x = rng.normal(0, 1, (rows, lw)).astype(dtype)
    x[0, 0] = np.nan
    x[-1, ow - 1] = -0.0
    x[rows // 2, ow // 2] = 3.0                          # k·x overflows in float32
    code = act_code(act)
    want = x[:, :ow].copy().reshape(-1)
    in_place(want, 3e38, 0.25, code)
    got = np.full(3 + rows * ow + 20, 7.0, dtype)
    affine_act_rows_into(got, 3, ow, rows, x.reshape(-1).copy(), lw, 3e38, 0.25, code)
    bits = np.uint32 if dtype == np.float32 else np.uint64
    np.testing.assert_array_equal(got[3:3 + rows * ow].view(bits), want.view(bits))
    assert (got[:3] == 7).all() and (got[3 + rows * ow:] == 7).all()
