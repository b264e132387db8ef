"""The direct convolution vectorised across filters (kernels/direct_fv.py): the forward kernel, the
weight gradient and the input gradient against float64 references (strides, paddings, kernel
sizes, filter counts that are not whole vectors, maps that are not whole microkernels or units,
both branches; the weight gradient the same bits at any thread count), its fused epilogue against
the separate pass, which layers take it, a layer on it against central differences, and a network
inferring on it against the same network on its other paths, before and after its weights
change."""
from __future__ import annotations

import numba
import numpy as np
import pytest

import darkpy.layers.convolutional as conv
from darkpy.kernels import PARALLEL_MIN
from darkpy.kernels import direct_fv as fv
from darkpy.kernels import direct_fv_grad as fvg
from darkpy.network import network_from_text
from helpers import layer_gradcheck
from test_direct_conv import correlation, weight_grad


def _run(x, w, sy, sx, pad, *epilogue):
    B, C, H, W = x.shape
    N, _, k, _ = w.shape
    y = np.full((B, N, (H + 2 * pad - k) // sy + 1, (W + 2 * pad - k) // sx + 1), np.nan, x.dtype)
    wt = np.full(C * k * k * fv.padded_filters(N), np.nan, x.dtype)
    fv.filters_last(wt, w)
    fv.conv_forward(y, x, wt, k, sy, sx, pad, *epilogue)
    return y


# (batch, channels, h, w, filters, k, stride_y, stride_x, pad)
SHAPES = [(1, 3, 5, 7, 5, 3, 1, 1, 1), (2, 32, 4, 4, 64, 3, 1, 1, 1), (3, 16, 8, 8, 33, 3, 1, 1, 1),
          (2, 64, 4, 4, 10, 1, 1, 1, 0), (1, 7, 9, 6, 17, 3, 2, 1, 1), (2, 5, 7, 7, 16, 1, 1, 1, 0),
          (2, 8, 9, 9, 16, 5, 2, 3, 2), (1, 4, 30, 31, 20, 3, 1, 1, 1), (2, 3, 6, 6, 1, 3, 1, 1, 2),
          (1, 2, 1, 1, 3, 1, 1, 1, 0), (2, 3, 5, 24, 8, 3, 1, 1, 1), (3, 4, 7, 7, 8, 3, 1, 1, 1),
          (2, 3, 13, 13, 8, 3, 2, 2, 1), (1, 5, 14, 14, 8, 3, 2, 2, 1)]


@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_float64_correlation(shape):
    """Every output written (NaN-filled before), equal to the correlation within float64 rounding:
    1x1, 3x3 and 5x5 kernels, strides 1-3 (also unequal), paddings 0-2, 1-64 filters, maps from
    1x1 to 30x31 (several units of UNIT_POSITIONS), rows copied into the padded planes in whole
    and half vectors and one by one (also the last input row of a 14x14 map, cut by stride 2)."""
    B, C, H, W, N, k, sy, sx, pad = shape
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal((B, C, H, W))
    w = rng.standard_normal((N, C, k, k))
    np.testing.assert_allclose(_run(x, w, sy, sx, pad), correlation(x, w, sy, sx, pad),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_gradients_match_float64_references(shape):
    """The weight gradient (added to what dw held) at every stride and padding; the input gradient
    (added to what dx held: the correlation of the delta with the filters turned and transposed)
    at stride 1 with padding at most k − 1, the training path's reach."""
    B, C, H, W, N, k, sy, sx, pad = shape
    rng = np.random.default_rng(sum(shape) + 1)
    x = rng.standard_normal((B, C, H, W))
    w = rng.standard_normal((N, C, k, k))
    d = rng.standard_normal(correlation(x, w, sy, sx, pad).shape)
    dw = np.full(w.shape, 0.25)
    fvg.weight_grad(dw, x, d, sy, sx, pad)
    np.testing.assert_allclose(dw, 0.25 + weight_grad(x, d, k, sy, sx, pad), rtol=1e-11, atol=1e-11)
    if sy == sx == 1 and pad <= k - 1:
        wt = np.full(N * k * k * fv.padded_filters(C), np.nan)
        fv.filters_last(wt, fvg.turned(w))
        dx = np.full(x.shape, 0.5)
        fvg.input_grad_add(dx, d, wt, k, pad)
        turned = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
        np.testing.assert_allclose(dx, 0.5 + correlation(d, turned, 1, 1, k - 1 - pad),
                                   rtol=1e-11, atol=1e-11)


def test_weight_grad_same_bits_at_any_thread_count():
    """float32, the parallel branch: one thread and two give the same bits (each block of 16
    filters x 4 taps is summed by one unit in a fixed order)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 16, 8, 8)).astype(np.float32)
    d = rng.standard_normal((64, 32, 8, 8)).astype(np.float32)
    assert d.size >= PARALLEL_MIN
    grads = []
    before = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            dw = np.zeros((32, 16, 3, 3), np.float32)
            fvg.weight_grad(dw, x, d, 1, 1, 1)
            grads.append(dw)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(grads[0], grads[1])
    want = weight_grad(x.astype(np.float64), d.astype(np.float64), 3, 1, 1, 1)
    assert np.abs(grads[0] - want).max() <= 1e-5 * np.abs(want).max()


def test_filters_last_blocks():
    """`filters_last`: the block of filters f0.. holds tap t's FV weights at block_at(f0, taps) +
    t·FV, the filters past n zero."""
    rng = np.random.default_rng(4)
    n, c, k = fv.FV + 3, 5, 3
    w = rng.standard_normal((n, c, k, k))
    taps = c * k * k
    wt = np.full(taps * fv.padded_filters(n), np.nan)
    fv.filters_last(wt, w)
    for f in (0, 1, fv.FV - 1, fv.FV, n - 1, fv.padded_filters(n) - 1):
        for t in (0, 7, taps - 1):
            want = w[f].reshape(-1)[t] if f < n else 0
            assert wt[fv.block_at(f // fv.FV * fv.FV, taps) + t * fv.FV + f % fv.FV] == want


@pytest.mark.parametrize("shape", [(1, 300, 7, 7, 40, 3, 1), (1, 700, 4, 4, 300, 1, 0),
                                   (1, 130, 8, 8, 64, 3, 1)])
def test_many_taps_in_chunks(monkeypatch, shape):
    """More taps than one CHUNK_BYTES chunk of a filter block (set small, so 2700, 700 and 1170
    taps make several chunks, the last partial), on a 7x7 map (whole 6-position tiles plus a
    partial one), a 4x4 one (4-position tiles) and an 8x8 one, float32 on the parallel branch by
    its multiply-adds: equal to the float64 correlation within float32 rounding, and the same bits
    with one chunk, without the prefetches and at one thread."""
    B, C, H, W, N, k, pad = shape
    rng = np.random.default_rng(C)
    x = rng.standard_normal((B, C, H, W)).astype(np.float32)
    w = rng.standard_normal((N, C, k, k)).astype(np.float32)
    assert N * H * W < PARALLEL_MIN and N * H * W * C * k * k >= fv.PARALLEL_MIN_MACS
    monkeypatch.setattr(fv, "CHUNK_BYTES", 64 * fv.FV * 4)         # 64 taps a chunk
    y = _run(x, w, 1, 1, pad)
    want = correlation(x.astype(np.float64), w.astype(np.float64), 1, 1, pad)
    assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max()
    monkeypatch.setattr(fv, "PREFETCH", False)
    np.testing.assert_array_equal(_run(x, w, 1, 1, pad), y)
    monkeypatch.setattr(fv, "CHUNK_BYTES", 1 << 30)
    np.testing.assert_array_equal(_run(x, w, 1, 1, pad), y)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        np.testing.assert_array_equal(_run(x, w, 1, 1, pad), y)
    finally:
        numba.set_num_threads(before)


def test_parallel_branch_float32():
    """Above PARALLEL_MIN output values (the parallel branch) in float32, within its rounding."""
    B, C, H, W, N = 64, 32, 4, 4, 64
    assert B * N * H * W > PARALLEL_MIN
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, C, H, W)).astype(np.float32)
    w = rng.standard_normal((N, C, 3, 3)).astype(np.float32)
    y = _run(x, w, 1, 1, 1)
    scale = correlation(np.abs(x), np.abs(w), 1, 1, 1).max()
    assert np.abs(y - correlation(x, w, 1, 1, 1)).max() <= 1e-6 * scale


@pytest.mark.parametrize("batch", [1, 64])
def test_epilogue_is_the_activation_of_the_affine(batch):
    """With k, off and an activation the kernel writes leaky(y·k + off) per filter, in both
    branches."""
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, 16, 8, 8)).astype(np.float32)
    w = rng.standard_normal((20, 16, 3, 3)).astype(np.float32)
    k, off = rng.uniform(0.5, 2, 20), rng.standard_normal(20)
    raw = _run(x, w, 1, 1, 1).astype(np.float64)
    z = raw * k[:, None, None] + off[:, None, None]
    from darkpy.kernels import activations as act
    y = _run(x, w, 1, 1, 1, k, off, act.kernel_code(act.code("leaky"), np.float32))
    np.testing.assert_allclose(y, np.where(z > 0, z, 0.1 * z), rtol=1e-5, atol=1e-5)


CFG = """[net]
batch={batch}
height={h}
width={h}
channels={c}
[convolutional]
filters={n}
size={k}
stride={s}
pad={pad}
batch_normalize={bn}
activation={activation}
[convolutional]
filters=8
size=1
stride=1
activation=linear
"""


def _nets(dtype=np.float64, **kw):
    """The same network twice, with the same random weights and BN statistics: the first built
    with DIRECT_FV off (its other paths), the second sharing its outputs (inference only)."""
    opts = dict(batch=3, h=8, c=16, n=24, k=3, s=1, pad=1, bn=1, activation="leaky") | kw
    text = CFG.format(**opts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv, "DIRECT_FV", False)
        nets = [network_from_text(text, dtype=dtype)]
    nets.append(network_from_text(text, dtype=dtype))
    rng = np.random.default_rng(7)
    for layer, twin in zip(*(n.layers for n in nets)):
        for p, q in zip(layer.params, twin.params):
            p.value[...] = rng.uniform(-1, 1, p.value.shape)
            q.value[...] = p.value
        if layer.bn is not None:
            for a, b in ((layer.bn.rolling_mean, twin.bn.rolling_mean),
                         (layer.bn.rolling_variance, twin.bn.rolling_variance)):
                a[...] = rng.uniform(0.5, 1.5, a.shape)
                b[...] = a
    nets[1].share_outputs()
    return nets


@pytest.mark.parametrize("kw", [dict(), dict(bn=0, activation="logistic"), dict(batch=64),
                                dict(k=1, pad=0, c=64, n=10, h=4),
                                dict(s=2, h=15, activation="mish"),
                                dict(batch=1, c=32, n=64, h=4)])
def test_network_on_the_path_gives_the_other_paths_outputs(kw):
    """An inferring network whose layers take the path gives what the unshared twin (im2col,
    Winograd or the row-vectorised direct path) gives, in float64; after a weight changes and
    `weights_changed()` it gives the new weights' outputs (the kept layout is made again)."""
    plain, shared = _nets(**kw)
    convs = [l for l in shared.layers if l.kind == "convolutional"]
    assert all(l.direct_fv for l in convs)
    assert not any(l.direct_fv for l in plain.layers if l.kind == "convolutional")
    x = np.random.default_rng(3).uniform(-1, 1, plain.input.shape)
    want = plain.forward(x).copy()
    np.testing.assert_allclose(shared.forward(x), want, rtol=1e-11, atol=1e-11 * np.abs(want).max())
    for net in (plain, shared):
        net.layers[0].weights.value[0] *= -2
        net.weights_changed()
    want = plain.forward(x).copy()
    np.testing.assert_allclose(shared.forward(x), want, rtol=1e-11, atol=1e-11 * np.abs(want).max())
    shared.unshare_outputs()            # training again: only what the training path takes stays
    assert [l.direct_fv for l in convs] == [
        l.stride_x == 1 and l.size ** 2 * max(l.n, l.in_shape[0]) <= fv.TRAINING_MAX_TAPS
        for l in convs]


@pytest.mark.parametrize("kw", [dict(batch=1, c=228, n=520, h=13),
                                dict(batch=1, c=256, n=33, h=19, s=2, activation="mish"),
                                dict(batch=2, c=240, n=512, h=11, k=5, pad=2, bn=0)])
def test_deep_layer_on_a_larger_map_gives_the_other_paths_outputs(kw, monkeypatch):
    """A deep k x k layer (DEEP_MIN_TAPS) on a map past MAX_POSITIONS, in a small inferring batch,
    takes the path (its 13x13 map's 169 positions padded to whole microkernels) and gives what
    the unshared twin gives, in float64 (with the rule on, whatever this CPU's default)."""
    monkeypatch.setattr(fv, "DEEP", True)
    plain, shared = _nets(**kw)
    assert shared.layers[0].direct_fv and not plain.layers[0].direct_fv
    assert shared.layers[0].out_shape[1] * shared.layers[0].out_shape[2] > fv.MAX_POSITIONS
    x = np.random.default_rng(5).uniform(-1, 1, plain.input.shape)
    want = plain.forward(x).copy()
    np.testing.assert_allclose(shared.forward(x), want, rtol=1e-11, atol=1e-11 * np.abs(want).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bn, activation", [(0, "leaky"), (1, "leaky"), (1, "relu"), (0, "linear"),
                                            (1, "logistic")])
def test_fused_epilogue_same_bits_as_the_separate_pass(monkeypatch, bn, activation, dtype):
    """The kernel's epilogue writes exactly what the separate bias/BN/activation pass does: on
    the tiles in vectors (linear, leaky, relu; 20 filters, part of a block) or on the rows written
    (the others)."""
    outs = []
    for fused in (True, False):
        monkeypatch.setattr(conv, "FUSED_EPILOGUE", fused)
        _, shared = _nets(dtype, bn=bn, batch=64, n=20, activation=activation)
        layer = shared.layers[0]
        x = np.random.default_rng(5).uniform(-1, 1, shared.input.shape).astype(np.float32)
        outs.append(shared.forward(x).copy())
        assert layer.direct_fv and layer._fused is fused
    np.testing.assert_array_equal(outs[0], outs[1])


def _max4_pool(y):
    """The 2x2 stride-2 maxima of y (B, N, H, W) in `max4`'s order: a later value wins only when
    greater (ties keep the first, a NaN first stays, a NaN later loses)."""
    a, b, c, d = y[:, :, 0::2, 0::2], y[:, :, 0::2, 1::2], y[:, :, 1::2, 0::2], y[:, :, 1::2, 1::2]
    best = a.copy()
    for v in (b, c, d):
        best = np.where(v > best, v, best)
    return best


@pytest.mark.parametrize("shape", [(1, 16, 8, 8, 40), (64, 16, 8, 8, 32), (3, 32, 4, 4, 64),
                                   (2, 8, 12, 16, 20)])
@pytest.mark.parametrize("act", [fv.LEAKY, fv.RELU, fv.LINEAR])
def test_pooled_output_is_the_pool_of_the_output_bit_for_bit(shape, act):
    """With a pooled output the kernel writes the 2x2 maxima of what it writes without (float32,
    the epilogue on the tiles), NaNs and ties included, and leaves y alone; elsewhere it refuses."""
    B, C, H, W, N = shape
    rng = np.random.default_rng(B + C + N)
    x = rng.uniform(-1, 1, (B, C, H, W)).astype(np.float32)
    x[0, 0, 1, 2] = np.nan                                  # NaNs in a few windows
    w = rng.uniform(-0.3, 0.3, (N, C, 3, 3)).astype(np.float32)
    w[:, :, 0, 0] = 0                                       # ties: equal values in some windows
    kk, off = rng.uniform(0.5, 1.5, N), rng.uniform(-0.2, 0.2, N)
    y = _run(x, w, 1, 1, 1, kk, off, act)
    wt = np.empty(C * 9 * fv.padded_filters(N), np.float32)
    fv.filters_last(wt, w)
    pool = np.full((B, N, H // 2, W // 2), 7, np.float32)
    untouched = np.full_like(y, 5)
    fv.conv_forward(untouched, x, wt, 3, 1, 1, 1, kk, off, act, pool=pool)
    np.testing.assert_array_equal(pool.view(np.uint32), _max4_pool(y).view(np.uint32))
    assert (untouched == 5).all()
    with pytest.raises(ValueError, match="pooled"):          # no epilogue: it would pool raw sums
        fv.conv_forward(untouched, x, wt, 3, 1, 1, 1, pool=pool)
    with pytest.raises(ValueError, match="pooled"):          # float64
        fv.conv_forward(untouched.astype(np.float64), x.astype(np.float64), wt.astype(np.float64),
                        3, 1, 1, 1, kk, off, act, pool=pool.astype(np.float64))


def test_which_layers_take_it(monkeypatch):
    """MIN_POSITIONS to MAX_POSITIONS output positions per item; no groups or dilation; inferring,
    at most MAX_TAPS taps per filter; training, stride 1, padding at most k − 1 and at most
    TRAINING_MAX_TAPS taps per filter of the forward and of the input gradient; never with DIRECT_FV
    off."""
    def takes(**kw):
        """(inferring, training): whether the first layer takes the path."""
        text = CFG.format(**(dict(batch=3, h=8, c=16, n=24, k=3, s=1, pad=1, bn=1,
                                  activation="leaky") | kw))
        training, shared = network_from_text(text), network_from_text(text)
        shared.share_outputs()
        return shared.layers[0].direct_fv, training.layers[0].direct_fv

    assert fv.MAX_TAPS == 288 and fv.TRAINING_MAX_TAPS == 576     # the limits the cases probe
    assert takes() == (True, True) and takes(n=64) == (True, True)
    assert takes(n=65) == (True, False)             # the input gradient's 585 taps
    assert takes(s=2, h=15) == (True, False)        # stride 2
    text = CFG.format(batch=1, h=6, c=16, n=24, k=1, s=1, pad=0, bn=0, activation="leaky")
    net = network_from_text(text.replace("pad=0\n", "padding=1\n", 1))     # padding past k - 1
    assert net.layers[0].out_shape[1:] == (8, 8) and not net.layers[0].direct_fv
    net.share_outputs()
    assert net.layers[0].direct_fv

    assert takes(c=32)[0] and takes(h=2, k=1, pad=0)[0] and takes(c=288, k=1, pad=0)[0]
    assert takes(c=33) == (False, True)             # 297 taps: too many to infer, not to train
    assert takes(c=289, k=1, pad=0) == (False, True)
    assert takes(c=65) == (False, False)            # 585 taps
    assert takes(c=577, k=1, pad=0, batch=5) == (False, False)    # (batch 3: the 1x1 rule below)
    assert takes(h=9) == (False, False)             # 81 positions
    # past MAX_TAPS an inferring batch of at most FEW_POSITIONS output positions takes it anyway
    assert fv.FEW_POSITIONS == 64
    assert takes(c=512, h=7, batch=1) == (True, False) and takes(c=512, h=8, batch=1)[0]
    assert takes(c=1024, k=1, pad=0, h=7, batch=1)[0]
    assert not takes(c=512, k=1, pad=0, h=7, batch=6)[0] and not takes(c=128, h=9, batch=1)[0]
    # and a deep k x k layer (DEEP_MIN_TAPS), strided or with DEEP_MIN_FILTERS filters, in a batch
    # of at most DEEP_MAX_POSITIONS positions, where the rule is on (DEEP)
    assert (fv.DEEP_MIN_TAPS, fv.DEEP_MIN_FILTERS, fv.DEEP_MAX_POSITIONS) == (2048, 512, 256)
    # and a 1x1 layer of at least DEEP_1X1_MIN_CHANNELS channels in such a batch
    assert fv.DEEP_1X1_MIN_CHANNELS == 512
    assert takes(c=512, k=1, pad=0, h=16, batch=1) == (True, False)
    assert not takes(c=511, k=1, pad=0, h=16, batch=1)[0]
    assert not takes(c=512, k=1, pad=0, h=17, batch=1)[0]
    assert not takes(c=512, k=1, pad=0, h=16, batch=2)[0]
    monkeypatch.setattr(fv, "DEEP", False)
    assert not takes(c=512, k=1, pad=0, h=16, batch=1)[0]
    assert not takes(c=512, n=512, h=9, batch=1)[0] and not takes(c=256, h=31, s=2, batch=1)[0]
    assert takes(c=512, h=7, batch=1)[0]                # FEW_POSITIONS still holds
    monkeypatch.setattr(fv, "DEEP", True)
    assert takes(c=512, n=512, h=9, batch=1) == (True, False)
    assert takes(c=228, n=512, h=16, batch=1)[0] and takes(c=256, n=600, h=8, batch=4)[0]
    assert takes(c=256, h=31, s=2, batch=1)[0]          # 16x16, strided: any filters
    assert not takes(c=256, n=511, h=13, batch=1)[0]    # fewer filters, stride 1
    assert not takes(c=227, n=512, h=16, batch=1)[0]    # 2043 taps
    assert not takes(c=512, n=512, h=17, batch=1)[0] and not takes(c=512, n=512, h=9, batch=4)[0]
    assert takes(c=2048, n=512, k=1, pad=0, h=9, batch=1)[0]      # 1x1: DEEP_1X1_MIN_CHANNELS
    # and a strided k x k layer of STRIDED_MIN_TAPS taps in a batch of at most
    # STRIDED_MAX_POSITIONS positions, where DEEP
    assert (fv.STRIDED_MIN_TAPS, fv.STRIDED_MAX_POSITIONS) == (1024, 1024)
    assert takes(c=128, h=56, s=2, batch=1) == (True, False)       # 28x28, 1152 taps
    assert not takes(c=113, h=56, s=2, batch=1)[0]                 # 1017 taps
    assert not takes(c=128, h=56, s=2, batch=2)[0]                 # 1568 positions
    assert not takes(c=128, h=28, batch=1)[0]                      # stride 1: not this rule
    monkeypatch.setattr(fv, "DEEP", False)
    assert not takes(c=128, h=56, s=2, batch=1)[0]
    monkeypatch.setattr(fv, "DEEP", True)
    assert takes(h=1, k=1, pad=0) == (False, False)     # one position: a connected layer
    for extra in ("groups=2\n", "dilation=2\n"):
        text = CFG.format(batch=1, h=8, c=16, n=24, k=3, s=1, pad=1, bn=0, activation="leaky")
        net = network_from_text(text.replace("activation=leaky\n", "activation=leaky\n" + extra, 1))
        assert not net.layers[0].direct_fv, extra
        net.share_outputs()
        assert not net.layers[0].direct_fv, extra
    monkeypatch.setattr(conv, "DIRECT_FV", False)
    assert takes() == (False, False)


GRAD_CFG = """[net]
batch=2
height={h}
width={h}
channels={c}
[maxpool]
size=1
stride=1
[convolutional]
filters={n}
size={k}
stride=1
pad={pad}
batch_normalize={bn}
activation={activation}
"""


@pytest.mark.parametrize("kw", [dict(), dict(bn=1, activation="mish"), dict(k=1, pad=0, c=24, n=10),
                                dict(k=3, pad=0, h=6), dict(k=5, pad=2, c=3, n=11, h=5),
                                dict(h=2, k=1, pad=0, n=17),
                                dict(h=4, c=40, n=36)])         # 360 and 324 taps: training only
def test_layer_gradcheck_on_the_training_path(kw):
    """A layer on the path in training (after a [maxpool] of size 1, so that its input gradient
    is checked too) against central differences in float64: weights, biases or BN scales, and
    the input."""
    opts = dict(h=7, c=5, n=6, k=3, pad=1, bn=0, activation="leaky") | kw
    net = layer_gradcheck(GRAD_CFG.format(**opts), 1)
    assert net.layers[1].direct_fv


def test_it_comes_before_the_other_small_map_paths():
    """A layer the row-vectorised direct path (an 8x8 map in a small batch, inferring) or a kept
    Winograd filter transform (32 channels on 8x8 at batch 1) would take takes this path instead,
    and keeps no filter transform."""
    from darkpy.kernels import direct as dk
    for batch, c in ((64, 16), (1, 32)):
        layer = _nets(batch=batch, c=c, n=32)[1].layers[0]
        assert dk.supports(c, 32, 3, 1, 1, 1, 64, batch, True) or c == 32
        assert layer.direct_fv and not (layer.direct or layer.winograd or layer.keep_filters)


ONE_BY_ONE = """[net]
batch=2
height=7
width=7
channels=24
[convolutional]
filters=24
size=3
pad=1
activation=linear
[convolutional]
filters=10
size=1
batch_normalize=1
activation=leaky
[cost]
type=sse
"""


@pytest.mark.parametrize("shared", [False, True])
def test_1x1_input_gradient_is_the_stacked_gemm(shared, monkeypatch):
    """A 1x1 layer on the path takes its input gradient as Wᵀ @ d per item (written into a fresh
    previous delta when the deltas share an arena, else added): the kernel's gradient within
    rounding, seen in the layer before's weight gradient; a 3x3 layer keeps the kernel (which
    adds into the previous delta)."""
    from darkpy.layers import conv_direct_fv
    rng = np.random.default_rng(0)
    x = rng.random((2, 24, 7, 7), dtype=np.float32)
    truth = rng.random((2, 10 * 49), dtype=np.float32)
    grads = {}
    for by_gemm in (True, False):
        monkeypatch.setattr(conv_direct_fv, "GEMM_INPUT_GRAD_1X1", by_gemm)
        net = network_from_text(ONE_BY_ONE)
        if shared:
            net.share_deltas()
        layer = net.layers[1]
        assert layer.direct_fv and layer.assigns_fresh_delta == by_gemm
        assert net.layers[0].direct_fv and not net.layers[0].assigns_fresh_delta
        net.forward(x, truth, train=True)
        net.backward()
        grads[by_gemm] = net.layers[0].weights.grad.copy(), layer.weights.grad.copy()
    np.testing.assert_array_equal(grads[True][1], grads[False][1])      # the same weight gradient
    want = grads[False][0]
    assert np.abs(grads[True][0] - want).max() <= 1e-5 * np.abs(want).max()
