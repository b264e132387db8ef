"""A convolution that writes the [maxpool] after it (`outputs_plan.fuse_pools`, inference with shared
outputs only): the same bits as the two layers run apart, on the direct and the Winograd paths, in
float32 and float64, serial and parallel kernels, and on the direct path across filters; and fused only where the convolution's output is
read by the maxpool alone and the pool is an aligned 2x2 one.
"""
from __future__ import annotations

import numpy as np
import pytest

import darkpy.layers.convolutional as conv
from benchmarks.engine import sane_weights
from darkpy import outputs_plan
from darkpy.kernels import direct as dk
from darkpy.network import network_from_text

#: conv (3 -> 16, direct) -> maxpool -> conv (16 -> 40, Winograd: `_pin_the_paths`)
#: -> maxpool -> conv 1x1 -> maxpool stride 1 (never fused) -> conv 1x1 (the output)
NET = """
[net]
width={s}
height={s}
channels=3
[convolutional]
batch_normalize=1
filters=16
size=3
pad=1
activation=leaky
[maxpool]
size=2
stride=2
[convolutional]
batch_normalize={bn}
filters=40
size=3
pad=1
activation={act}
[maxpool]
size=2
stride=2
[convolutional]
filters=8
size=1
activation=leaky
[maxpool]
size=2
stride=1
[convolutional]
filters=4
size=1
activation=linear
"""


@pytest.fixture(autouse=True)
def _pin_the_paths():
    """The second convolution (16 -> 40 on 24x24 or 56x56) on Winograd, the first on the direct
    path, whatever the direct path's reach (kernels/direct.py: MAX_FILTERS_3X3, small maps); the
    1x1 ones on the GEMM path with shared outputs too: the pointwise kernel's in-order sums equal
    OpenBLAS's only where its kernel sums in that order (not on a Zen 5 EPYC)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dk, "SMALL_MAX_BATCH_POSITIONS", 0)
        mp.setattr(dk, "MAX_FILTERS_3X3", 32)
        mp.setattr(conv, "POINTWISE", False)
        yield


def _net(s=48, bn=1, act="leaky", batch=2, dtype=np.float32, extra="", flip=False):
    """With `flip`, every other filter of the batch-normalised layers has a negative scale: its
    epilogue decreasing, so the kernels take it before the maxima (`pool2x2.pools_first`)."""
    net = network_from_text(NET.format(s=s, bn=bn, act=act) + extra, batch=batch, dtype=dtype)
    sane_weights(net.layers)            # biases and batch-norm statistics that are not zeros
    for layer in net.layers:
        if flip and getattr(layer, "bn", None) is not None:
            layer.bn.scales.value[1::2] *= -1
    return net


@pytest.mark.parametrize("dtype,s,batch,bn,act,flip", [           # 112: the parallel kernels
    (np.float32, 48, 1, 1, "leaky", False), (np.float32, 48, 3, 0, "mish", False),
    (np.float32, 112, 2, 1, "leaky", False), (np.float32, 112, 1, 0, "linear", False),
    (np.float64, 48, 3, 1, "leaky", False), (np.float64, 112, 2, 0, "mish", False),
    (np.float32, 48, 2, 1, "leaky", True), (np.float32, 112, 1, 1, "relu", True),
    (np.float64, 112, 1, 1, "linear", True)])
def test_fused_pools_give_the_same_bits(dtype, s, batch, bn, act, flip):
    net = _net(s, bn, act, batch, dtype, flip=flip)
    x = np.random.default_rng(1).uniform(-1, 1, net.input.shape).astype(dtype)
    pools = [1, 3]
    ref = net.forward(x).copy()
    want = [net.layers[i].output.copy() for i in pools]
    net.share_outputs(keep=pools)
    assert [l.index for l in net.layers if getattr(l, "pool_into", None)] == [0, 2]
    assert net.layers[0].direct and net.layers[2].winograd
    assert net.layers[5].pooled_by is None              # stride 1: not an aligned 2x2 pool
    net._arena[...] = np.nan                            # a value read but not written shows
    for _ in range(2):
        np.testing.assert_array_equal(net.forward(x), ref)
        for i, w in zip(pools, want):
            np.testing.assert_array_equal(net.layers[i].output, w)
    net.unshare_outputs()
    assert not any(getattr(l, "pool_into", None) or getattr(l, "pooled_by", None) for l in net.layers)
    np.testing.assert_array_equal(net.forward(x), ref)


@pytest.mark.parametrize("dtype,batch,bn,act,flip", [
    (np.float32, 1, 1, "leaky", False), (np.float32, 64, 0, "relu", False),
    (np.float32, 3, 1, "linear", False), (np.float32, 2, 1, "mish", False),
    (np.float64, 2, 1, "leaky", False), (np.float32, 5, 1, "leaky", True),
    (np.float32, 2, 1, "relu", True)])
def test_direct_across_filters_writes_its_pool_too(dtype, batch, bn, act, flip):
    """On a 16x16 input the second convolution (16 -> 40 on 8x8) takes the direct path across
    filters (kernels/direct_fv.py): it writes its pool in float32 with linear, leaky or relu (the
    epilogue on its tiles), the same bits as the two layers apart; otherwise the pool runs. With
    `flip`, a block of filters with a negative scale takes the epilogue before the maxima."""
    net = _net(16, bn, act, batch, dtype, flip=flip)
    x = np.random.default_rng(2).uniform(-1, 1, net.input.shape).astype(dtype)
    ref = net.forward(x).copy()
    want = net.layers[3].output.copy()
    net.share_outputs(keep=[3])
    assert net.layers[2].direct_fv
    fused = dtype == np.float32 and act != "mish"
    assert (net.layers[2].pool_into is net.layers[3]) is fused
    net._arena[...] = np.nan
    for _ in range(2):
        np.testing.assert_array_equal(net.forward(x), ref)
        np.testing.assert_array_equal(net.layers[3].output, want)


def test_fused_only_where_the_pool_alone_reads_the_convolution():
    route = "[route]\nlayers=0\n[convolutional]\nfilters=2\nsize=1\nactivation=linear\n"
    cases = [
        (dict(), [0, 2]),
        (dict(batch=1), [0, 2]),
        (dict(extra=route), [2]),              # layer 0 is read by the route too
        (dict(s=50), [0]),                     # 25x25: the second maxpool does not halve its map
        (dict(s=47), [2]),                     # 47x47: nor the first
        (dict(s=24), [0]),                     # layer 2's 12x12 map is under POOLED_MIN_POSITIONS
    ]
    for kw, fused in cases:
        net = _net(**kw)
        net.share_outputs()
        assert [l.index for l in net.layers if getattr(l, "pool_into", None)] == fused, kw
    net = _net()
    net.share_outputs(keep=[0])                # the caller reads layer 0 after the forward
    assert [l.index for l in net.layers if getattr(l, "pool_into", None)] == [2]


def test_switches_and_training_leave_the_pools_apart(monkeypatch):
    net = _net()
    x = np.random.default_rng(1).uniform(-1, 1, net.input.shape).astype(np.float32)
    net.forward(x, train=True)                  # no sharing: nothing fused, the pool runs
    assert net.layers[1].pooled_by is None and net.layers[1]._indexed
    ref = net.forward(x).copy()                 # (after: training moved the rolling statistics)
    monkeypatch.setattr(outputs_plan, "FUSE_POOLS", False)
    net.share_outputs()
    assert not any(getattr(l, "pool_into", None) for l in net.layers)
    monkeypatch.setattr(outputs_plan, "FUSE_POOLS", True)
    monkeypatch.setattr(conv, "FUSED_EPILOGUE", False)
    net.share_outputs()
    assert not any(getattr(l, "pool_into", None) for l in net.layers)
    monkeypatch.undo()
    net.resize(64, 64)                           # the plan is made again at the new size
    net.share_outputs()
    assert [l.index for l in net.layers if getattr(l, "pool_into", None)] == [0, 2]
    net.resize(48, 48)
    np.testing.assert_array_equal(net.forward(x), ref)


def _pooled_reference(x, h, pw, k, off, code):
    """The epilogue on every value of x (2h rows), then each window's maxima in row-major order."""
    from darkpy.kernels import jit
    from darkpy.kernels.bn import affine_act_row

    @jit
    def epilogue(x, k, off, act):
        affine_act_row(x.reshape(x.size), k, off, act)

    ref = x.copy()
    epilogue(ref, k, off, code)
    want = np.empty((h, pw), x.dtype)
    for r in range(h):
        for c in range(pw):
            window = [ref[2 * r, 2 * c], ref[2 * r, 2 * c + 1], ref[2 * r + 1, 2 * c],
                      ref[2 * r + 1, 2 * c + 1]]
            best = window[0]
            for v in window[1:]:
                best = v if v > best else best
            want[r, c] = best
    return want


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ["linear", "leaky", "relu", "logistic"])
@pytest.mark.parametrize("k,off", [(0.7, 0.25), (0.7, -0.0), (0.7, 0.0), (-0.7, 0.25), (0.0, 0.5),
                                   (3e38, 1.0)])
def test_epilogue_and_pool_commute_only_where_the_bits_agree(dtype, act, k, off):
    """`epilogue_pool_rows` against the epilogue on every value, then each window's maxima in
    row-major order (a later value winning only when greater): ties, NaNs in every window
    position, signed zeros, values that round together and a product that overflows, for every
    sign of k and off = −0 (where `pools_first` must say no). Rows wider than the pool (the
    padding columns a block carries) are left out."""
    from darkpy.kernels import jit
    from darkpy.kernels.activations import code as act_code
    from darkpy.kernels.pool2x2 import epilogue_pool_rows

    @jit
    def run(p, x, k, off, act):
        epilogue_pool_rows(p, x, k, off, act)

    rng = np.random.default_rng(3)
    h, w = 6, 21                                        # a 6x20 plane in rows of 21
    x = rng.normal(0, 1, (h, w)).astype(dtype)
    x[0, 0:4] = 0.5                                     # ties
    x[2, 2:4] = [-0.0, 0.0]
    x[3, 2:4] = [0.0, -0.0]
    for r, c in [(0, 4), (0, 7), (1, 8), (1, 11)]:     # a NaN in each place of a window
        x[r, c] = np.nan
    one, up = dtype(1), dtype(2)
    x[4, 0:4] = [one, np.nextafter(one, up), np.nextafter(np.nextafter(one, up), up), one]  # may
    # round together after the epilogue
    x[4, 4:8] = [3.0, -3.0, 2.0, 1.0]                   # k·x overflows in float32
    code = act_code(act)
    want = _pooled_reference(x, h // 2, 10, k, off, code)
    got = np.full((h // 2, 10), 7.0, dtype)
    run(got, x.copy(), k, off, code)
    np.testing.assert_array_equal(got.view(np.uint32 if dtype == np.float32 else np.uint64),
                                  want.view(np.uint32 if dtype == np.float32 else np.uint64))


@pytest.mark.parametrize("act", ["linear", "leaky"])
@pytest.mark.parametrize("k,off", [(0.7, 0.25), (0.7, 0.0), (3e38, 1.0)])
@pytest.mark.parametrize("h,pw,lw", [(8, 8, 18), (7, 8, 18), (1, 8, 16), (4, 4, 10), (3, 16, 34),
                                     (5, 21, 44), (2, 40, 81), (3, 5, 12)])
def test_pooled_epilogue_rows_in_vectors_gives_the_same_bits(act, k, off, h, pw, lw):
    """`pooled_epilogue_rows` (float32, where `pools_first` holds): the maxima and the epilogue in
    vectors — two pooled rows a vector at LANES/2 wide (an odd last row alone), whole vectors with
    a tail, and narrow rows — the bits of the epilogue on every value and then the maxima, with
    ties, NaNs in every window place, signed zeros and an overflowing product; the values around
    the written rows untouched."""
    from darkpy.kernels import jit, simd
    from darkpy.kernels.activations import code as act_code
    from darkpy.kernels.pool2x2 import pooled_epilogue_rows

    if pw == 8 and simd.LANES == 8:
        pw, lw = 4, lw // 2 + 1                          # the paired rows at this CPU's width

    @jit
    def run(p, p0, pw, h, x, lw, k, off, act):
        pooled_epilogue_rows(p, p0, pw, h, x, lw, k, off, act)

    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, (2 * h, lw)).astype(np.float32)
    x[0, 0:4] = 0.5
    x[-1, -4:] = [-0.0, 0.0, 0.0, -0.0]
    for i in range(4):                                   # a NaN in each place of some window
        r, c = 2 * (i % h) + i // 2, 2 * (i % pw) + i % 2
        x[r, c] = np.nan
    x[-2, 0:4] = [3.0, -3.0, 2.0, 1.0]                   # k·x overflows in float32
    code = act_code(act)
    want = _pooled_reference(x, h, pw, k, off, code)
    got = np.full(3 + h * pw + 5, 7.0, np.float32)
    run(got, 3, pw, h, x.reshape(x.size).copy(), lw, k, off, code)
    np.testing.assert_array_equal(got[3:3 + h * pw].reshape(h, pw).view(np.uint32),
                                  want.view(np.uint32))
    assert (got[:3] == 7).all() and (got[3 + h * pw:] == 7).all()


@pytest.mark.parametrize("dtype,batch,act,flip", [
    (np.float32, 1, "leaky", False), (np.float32, 3, "mish", False),
    (np.float64, 2, "leaky", True), (np.float32, 2, "linear", True)])
def test_direct_layer_of_another_kernel_size_writes_its_pool_too(dtype, batch, act, flip):
    """A 5x5 first layer (the direct path's kernel for sizes other than 3x3, `_forward_block`)
    writes its 2x2 maxpool through the same out-step as the 3x3 one: the same bits as the two
    layers apart, serial (24x24) and parallel (64x64), with the epilogue before the maxima where a
    filter's scale is negative (`flip`)."""
    text = ("[net]\nwidth={s}\nheight={s}\nchannels=3\n[convolutional]\nbatch_normalize=1\n"
            "filters=12\nsize=5\npad=1\nactivation={act}\n[maxpool]\nsize=2\nstride=2\n"
            "[convolutional]\nfilters=4\nsize=1\nactivation=linear\n")
    for s in (24, 64):
        net = network_from_text(text.format(s=s, act=act), batch=batch, dtype=dtype)
        sane_weights(net.layers)
        if flip:
            net.layers[0].bn.scales.value[1::2] *= -1
        x = np.random.default_rng(s).uniform(-1, 1, net.input.shape).astype(dtype)
        ref = net.forward(x).copy()
        want = net.layers[1].output.copy()
        net.share_outputs(keep=[1])
        assert net.layers[0].direct and net.layers[0].pool_into is net.layers[1]
        net._arena[...] = np.nan
        for _ in range(2):
            np.testing.assert_array_equal(net.forward(x), ref)
            np.testing.assert_array_equal(net.layers[1].output, want)
