"""The direct convolution of few-channel layers (kernels/direct.py): the kernels against a float64
correlation, both branches (serial below PARALLEL_MIN, parallel above), and the layer's direct path
against its im2col path and central differences."""
from __future__ import annotations

import numpy as np
import pytest

import darkpy.layers.convolutional as conv
from darkpy.kernels import PARALLEL_MIN
from darkpy.kernels import direct as dk
from darkpy.kernels import direct_blocks as db
from darkpy.kernels import direct_wgrad as dwg
from darkpy.layers.base import State
from darkpy.network import network_from_text
from helpers import layer_gradcheck


@pytest.fixture(autouse=True)
def _no_direct_fv():
    """This file's small layers would otherwise take the direct convolution across filters first
    (kernels/direct_fv.py; tests/test_direct_fv.py checks which)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv, "DIRECT_FV", False)
        yield


def correlation(x, w, sy, sx, pad):
    """Darknet's convolution (a cross-correlation) in float64, by shifted slices."""
    B, C, H, W = x.shape
    N, _, k, _ = w.shape
    oh, ow = (H + 2 * pad - k) // sy + 1, (W + 2 * pad - k) // sx + 1
    xp = np.zeros((B, C, H + 2 * pad, W + 2 * pad))
    xp[:, :, pad:pad + H, pad:pad + W] = x
    y = np.zeros((B, N, oh, ow))
    for ky in range(k):
        for kx in range(k):
            patch = xp[:, :, ky:ky + sy * (oh - 1) + 1:sy, kx:kx + sx * (ow - 1) + 1:sx]
            y += np.einsum("bchw,nc->bnhw", patch, w[:, :, ky, kx])
    return y


def weight_grad(x, d, k, sy, sx, pad):
    """dL/dw of L = sum(d * correlation(x, w)), one basis filter at a time."""
    n, c = d.shape[1], x.shape[1]
    g = np.zeros((n, c, k, k))
    for ci in range(c):
        for ky in range(k):
            for kx in range(k):
                e = np.zeros((1, c, k, k))
                e[0, ci, ky, kx] = 1
                g[:, ci, ky, kx] = np.einsum("bnhw,bhw->n", d, correlation(x, e, sy, sx, pad)[:, 0])
    return g


# (batch, channels, h, w, filters, k, stride_y, stride_x, pad)
SHAPES = [(2, 3, 9, 11, 5, 3, 2, 2, 1), (3, 1, 16, 16, 16, 3, 1, 1, 1), (2, 3, 8, 7, 4, 3, 1, 1, 0),
          (1, 2, 5, 5, 3, 1, 1, 1, 0), (2, 4, 13, 10, 6, 5, 3, 3, 2), (2, 3, 6, 6, 4, 3, 1, 1, 2),
          (1, 1, 1, 1, 2, 3, 1, 1, 1), (2, 2, 7, 9, 3, 2, 1, 2, 0), (1, 3, 9, 9, 7, 7, 2, 1, 3),
          (2, 16, 12, 10, 42, 3, 1, 1, 1),
          # rows long enough for the stride-2 planes' vector gather (simd.evens), paddings 0-2
          (1, 3, 6, 70, 4, 3, 2, 2, 1), (1, 2, 5, 75, 3, 3, 2, 2, 0), (1, 2, 7, 80, 3, 5, 1, 2, 2)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", [0, 1, 2])
def test_kernels_match_float64_correlation(shape, rows):
    """Forward and weight gradient, for strides 1-3 (also unequal), paddings 0-3, kernels 1-7,
    odd sizes and a 1-pixel image, with the default row blocks and with 1- and 2-row blocks."""
    B, C, H, W, N, k, sy, sx, pad = shape
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal((B, C, H, W))
    w = rng.standard_normal((N, C, k, k))
    ref = correlation(x, w, sy, sx, pad)
    rows = rows or db.block_rows(ref.shape[2], ref.shape[3], k, sx)
    y = np.full(ref.shape, np.nan)
    dk.conv_forward(y, x, w, sy, sx, pad, rows)
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
    d = rng.standard_normal(ref.shape)
    dw = np.full(w.shape, 0.25)
    dwg.conv_weight_grad(dw, x, d, sy, sx, pad, rows)
    np.testing.assert_allclose(dw, 0.25 + weight_grad(x, d, k, sy, sx, pad), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("stride, k", [(1, 3), (2, 3), (2, 7)])
def test_parallel_branch_equals_reference(stride, k):
    """Above PARALLEL_MIN output values (the parallel branches), float32 within rounding; a 7x7
    kernel at stride 2 (its size and stride constants of the microkernel: `dk.SIZED`)."""
    B, C, H, W, N = 4, 3, 50, 46, 16
    assert B * N * (H // stride) * (W // stride) > PARALLEL_MIN
    assert (dk.kind_of(C, k, stride, stride) >= dk.SIZED) == (k != 3)
    rng = np.random.default_rng(stride)
    x = rng.standard_normal((B, C, H, W)).astype(np.float32)
    w = rng.standard_normal((N, C, k, k)).astype(np.float32)
    pad = k // 2
    ref = correlation(x, w, stride, stride, pad)
    y = np.zeros(ref.shape, np.float32)
    rows = db.block_rows(ref.shape[2], ref.shape[3], k, stride)
    dk.conv_forward(y, x, w, stride, stride, pad, rows)
    scale = correlation(np.abs(x), np.abs(w), stride, stride, pad).max()
    assert np.abs(y - ref).max() <= 1e-6 * scale
    d = rng.standard_normal(ref.shape).astype(np.float32)
    dw = np.zeros(w.shape, np.float32)
    dwg.conv_weight_grad(dw, x, d, stride, stride, pad, rows)
    g = weight_grad(x.astype(np.float64), d.astype(np.float64), k, stride, stride, pad)
    assert np.abs(dw - g).max() <= 1e-5 * np.abs(g).max()


@pytest.mark.parametrize("k,sy,pad", [(3, 1, 1), (3, 2, 1), (7, 2, 3), (1, 1, 0), (5, 3, 0)])
def test_the_prefetched_rows_are_the_rows_a_block_reads(k, sy, pad):
    """`block_input_rows` (what a thread asks for ahead of its next row block): exactly the input
    rows that the block's output rows read through its taps, over every block and item."""
    H, rows = 29, 4
    OH = (H + 2 * pad - k) // sy + 1
    nblk = -(-OH // rows)
    for t in range(3 * nblk):
        b, r0, r1 = db.block_input_rows(t, nblk, rows, sy, pad, k)
        oy0 = (t % nblk) * rows
        read = {oy * sy - pad + ky for oy in range(oy0, oy0 + rows) for ky in range(k)}
        assert b == t // nblk and set(range(r0, r1)) == read


def test_an_odd_batch_gets_an_even_count_of_equal_blocks_where_one_fits():
    # tiny.cfg's 56x56 maps at b1: 17 rows a block (17, 17, 17, 5: 34 against 22 rows per thread)
    # become 14; an even batch splits whole items, so it keeps its blocks; a fused pool wants even
    # rows; no size from the rows down to MIN_FORWARD_ROWS cuts 104 rows into an even count
    assert db.block_rows(56, 56, 3, 1) == 17 and db.forward_rows(1, 56, 56, 3, 1) == 14
    assert db.forward_rows(3, 56, 56, 3, 1) == 14 and db.forward_rows(2, 56, 56, 3, 1) == 17
    assert db.balanced_rows(1, 64, 14, even=True) == 8          # shapes-tiny's pooled 64x64
    assert db.balanced_rows(1, 60, 15, even=False) == 15        # 4 blocks of 15 already
    assert db.balanced_rows(1, 60, 15, even=True) == 10         # 6 blocks of 10
    assert db.balanced_rows(1, 104, 8, even=False) == 8         # 13 blocks: nothing better fits
    assert db.MIN_FORWARD_ROWS == 8


@pytest.mark.parametrize("shape", [(1, 32, 16, 16, 64, 1), (1, 16, 32, 32, 32, 1), (1, 3, 128, 128, 16, 2),
                                   (2, 16, 32, 32, 8, 1), (1, 16, 8, 8, 32, 1), (1, 16, 56, 56, 16, 1)])
def test_forward_rows_change_no_value(shape):
    """A small batch's forward splits into at least FORWARD_UNITS blocks where its rows allow it,
    and, also with the fused maxpool, gives the same bits as with the weight gradient's blocks
    (which stay as they are): forward values do not depend on the blocks. The first shape has
    fewer than PARALLEL_MIN outputs but enough taps to run in parallel."""
    B, C, H, W, N, s = shape
    rng = np.random.default_rng(C)
    x = rng.standard_normal((B, C, H, W)).astype(np.float32)
    w = rng.standard_normal((N, C, 3, 3)).astype(np.float32)
    oh, ow = (H - 1) // s + 1, (W - 1) // s + 1
    rows = db.forward_rows(B, oh, ow, 3, s)
    units = B * -(-oh // rows)
    assert units >= db.FORWARD_UNITS or rows in (oh, db.MIN_FORWARD_ROWS)
    assert rows == db.forward_rows(B, oh, ow, 3, s, even=True)      # (all of these are even)
    assert rows <= db.block_rows(oh, ow, 3, s)
    k, off = rng.random(N) + 0.5, rng.standard_normal(N)
    for pool in (None, np.full((B, N, oh // 2, ow // 2), np.nan, np.float32)):
        ys = [np.full((B, N, oh, ow), np.nan, np.float32) for _ in range(2)]
        for y, r in zip(ys, (rows, db.block_rows(oh, ow, 3, s))):
            dk.conv_forward(y, x, w, s, s, 1, r, k, off, 1, pool=pool)
            if pool is not None:
                y[:, :, :oh // 2, :ow // 2] = pool
        np.testing.assert_array_equal(ys[0], ys[1])
    ref = correlation(x.astype(np.float64), w.astype(np.float64), s, s, 1)
    y = np.empty(ref.shape, np.float32)
    dk.conv_forward(y, x, w, s, s, 1, rows)
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


CFG = """[net]
batch={batch}
height={h}
width={w}
channels={c}
[convolutional]
filters={n}
size={k}
stride={s}
padding={pad}
batch_normalize={bn}
activation=leaky
"""


def _net(monkeypatch, direct, dtype=np.float64, **kw):
    monkeypatch.setattr(conv, "DIRECT", direct)
    opts = dict(batch=3, h=9, w=8, c=3, n=6, k=3, s=1, pad=1, bn=0) | kw
    net = network_from_text(CFG.format(**opts), dtype=dtype)
    assert net.layers[0].direct is direct
    return net


@pytest.mark.parametrize("kw", [dict(c=16, n=24, h=64, w=66, bn=1), dict(c=32, n=40, h=65, w=64),
                                dict(c=3, n=64, k=7, pad=3, h=38, w=41, bn=1)])
def test_inferring_stride_2_layer_equals_im2col(kw):
    """A 3x3 stride-2 layer over 5-32 channels on a large map (MID_STRIDE_2), and a 7x7 one over
    3 channels with more than MAX_FILTERS filters (resnet50's first layer), take the direct path
    only in a network that only infers, and give the im2col path's outputs (float64)."""
    opts = dict(batch=2, k=3, s=2, pad=1, bn=0) | kw
    net = network_from_text(CFG.format(**opts), dtype=np.float64)
    assert not net.layers[0].direct
    net.layers[0].init_weights(np.random.default_rng(1))
    if net.layers[0].bn is not None:
        net.layers[0].bn.rolling_variance[...] = np.random.default_rng(4).uniform(0.5, 2, opts["n"])
    x = np.random.default_rng(2).uniform(-1, 1, net.input.shape)
    want = net.forward(x).copy()
    net.share_outputs()
    assert net.layers[0].direct
    np.testing.assert_allclose(net.forward(x), want, rtol=1e-11, atol=1e-11 * np.abs(want).max())


@pytest.mark.parametrize("own_input_grad", [True, False])
@pytest.mark.parametrize("kw", [dict(), dict(bn=1), dict(s=2, pad=1), dict(k=1, pad=0, c=1),
                                dict(k=5, pad=2, s=2, c=4), dict(c=32, n=8, h=32, w=33, bn=1),
                                dict(pad=0), dict(k=5, pad=1, c=4), dict(k=1, pad=1, c=2)])
def test_layer_direct_equals_im2col(monkeypatch, kw, own_input_grad):
    """Output, input delta (stride 1: the direct kernel on the turned filters, with
    DIRECT_INPUT_GRAD; else col2im's) and weight/bias/scale gradients of the direct path equal
    the im2col path's (float64)."""
    results = []
    for direct in (False, True):
        net = _net(monkeypatch, direct, **kw)
        monkeypatch.setattr(conv, "DIRECT_INPUT_GRAD", own_input_grad)
        layer = net.layers[0]
        layer.init_weights(np.random.default_rng(1))
        x = np.random.default_rng(2).uniform(-1, 1, net.input.shape)
        net.forward(x, train=True)
        out = layer.output.copy()
        layer.delta[...] = np.random.default_rng(3).standard_normal(layer.delta.shape)
        for p in layer.params:
            p.grad.fill(0.5)
        grads = []
        for prev in (np.full(x.shape, 0.5), None):      # with an input gradient, and without one
            layer.backward(State(input=x, delta=prev, truth=None, train=True, layers=net.layers, net=net))
            grads += [prev] + [p.grad.copy() for p in layer.params]
            layer.delta[...] = np.random.default_rng(3).standard_normal(layer.delta.shape)
            net.forward(x, train=True)
            layer.delta[...] = np.random.default_rng(3).standard_normal(layer.delta.shape)
        results.append([out] + [g for g in grads if g is not None])
        monkeypatch.undo()
    for a, b in zip(*results):
        np.testing.assert_allclose(b, a, rtol=1e-11, atol=1e-11)
    assert not np.allclose(results[0][1], 0.5)      # the input delta was really added to


@pytest.mark.parametrize("kw", [dict(bn=1), dict(s=2, c=1, n=4)])
def test_layer_direct_gradcheck(kw):
    opts = dict(batch=2, h=7, w=6, c=3, n=5, k=3, s=1, pad=1, bn=0) | kw
    net = layer_gradcheck(CFG.format(**opts), 0)
    assert net.layers[0].direct


def test_direct_only_where_it_applies():
    """More than 4 channels (but for 3x3 stride-1 layers on large maps, or on small maps in a small
    batch of a network that only infers, up to 32), more than 32 filters (128 for 3x3 kernels, and
    for any kernel in a network that only infers), groups and dilation keep im2col or Winograd."""
    base = dict(batch=2, h=8, w=8, c=4, n=16, k=3, s=1, pad=1, bn=0)
    for kw, expected in ((dict(), True), (dict(c=3), True), (dict(c=5), False),
                         (dict(n=128), True), (dict(n=129), False), (dict(n=32, c=1), True),
                         (dict(k=5, pad=2, n=32), True), (dict(k=5, pad=2, n=33), False)):
        net = network_from_text(CFG.format(**(base | kw)))
        assert net.layers[0].direct is expected, kw
    # only inferring, up to MAX_FILTERS_3X3 filters whatever the kernel
    for kw, expected in ((dict(k=5, pad=2, n=33), True), (dict(k=7, pad=3, s=2, n=128), True),
                         (dict(k=7, pad=3, s=2, n=129), False), (dict(k=1, pad=1, n=64), True)):
        net = network_from_text(CFG.format(**(base | kw)))
        net.share_outputs()
        assert net.layers[0].direct is expected, kw
    for extra in ("groups=2\n", "dilation=2\n"):
        net = network_from_text(CFG.format(**base) + extra)
        assert not net.layers[0].direct, extra
    # 5-32 channels, 3x3 stride 1: maps of at least MID_MIN_POSITIONS (32x32) outputs, or, only
    # inferring, of at least SMALL_MIN_POSITIONS (8x8), at most SMALL_MAX_BATCH_POSITIONS in a batch;
    # stride 2 only inferring, on maps of at least MID_MIN_POSITIONS
    mid = base | dict(c=16, n=32, h=32, w=32)
    for kw, expected, inferring in (
            (dict(), True, True), (dict(c=5), True, True), (dict(c=32), True, True),
            (dict(c=33), False, False), (dict(n=128), True, True), (dict(n=129), False, False),
            (dict(w=31), False, True), (dict(w=31, batch=5), False, False),
            (dict(h=8, w=8, batch=64), False, True), (dict(h=8, w=8, batch=65), False, False),
            (dict(h=7, w=8, batch=1), False, False),
            (dict(k=5, pad=2), False, False),
            # stride 2 (MID_STRIDE_2): inferring only, outputs of at least MID_MIN_POSITIONS
            (dict(s=2, h=64, w=64), False, True), (dict(s=2, h=64, w=64, c=32, n=64), False, True),
            (dict(s=2, h=64, w=62), False, False), (dict(s=2, h=64, w=64, c=33), False, False),
            (dict(s=3, h=96, w=96), False, False)):
        net = network_from_text(CFG.format(**(mid | kw)))
        assert net.layers[0].direct is expected, kw
        net.share_outputs()
        assert net.layers[0].direct is inferring, kw
        net.unshare_outputs()
        assert net.layers[0].direct is expected, kw
        assert not (net.layers[0].direct and net.layers[0].winograd)
