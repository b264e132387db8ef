"""Winograd F(2x2, 3x3) (darkpy/kernels/winograd.py) against a direct correlation, and the
convolutional layer's Winograd path against its im2col path and against numerical gradients."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from numba import njit

import darkpy.layers.conv_winograd as cw
import darkpy.layers.convolutional as conv
from darkpy.kernels import direct as dk
from darkpy.kernels import direct_fv as dfv
from darkpy.kernels import simd
from darkpy.kernels import im2col as ic
from darkpy.kernels import activations as act
from darkpy.kernels import winograd as wg
from darkpy.kernels import winograd_fused as wf
from darkpy.kernels.pool2x2 import no_pool
from darkpy.layers.base import State

from darkpy.network import network_from_text
from helpers import layer_gradcheck


@pytest.fixture(autouse=True)
def _small_maps_keep_their_path():
    """This file's layers have small maps in small batches, which the direct paths would otherwise
    take (kernels/direct.py, SMALL_MAX_BATCH_POSITIONS; kernels/direct_fv.py). Its own
    MonkeyPatch: a test's `monkeypatch.undo()` leaves it in place."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dk, "SMALL_MAX_BATCH_POSITIONS", 0)
        mp.setattr(conv, "DIRECT_FV", False)
        yield


def direct_correlation(x, w, pad):
    """Slow reference: y[b, f, oy, ox] = Σ w[f, c, ky, kx] x[b, c, oy + ky − pad, ox + kx − pad]."""
    nb, c, h, width = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - 2, width + 2 * pad - 2
    y = np.zeros((nb, w.shape[0], oh, ow))
    for ky in range(3):
        for kx in range(3):
            y += np.einsum("fc,bchw->bfhw", w[:, :, ky, kx], xp[:, :, ky:ky + oh, kx:kx + ow])
    return y


def winograd_correlation(x, w, pad, y0=None):
    nb, c, h, width = x.shape
    n = w.shape[0]
    oh, ow = h + 2 * pad - 2, width + 2 * pad - 2
    th, tw = wg.tiles(oh, ow)
    u = np.empty((16, n, c), x.dtype)
    wg.filters(u, w)
    v = np.empty((16, c, nb * th * tw), x.dtype)
    wg.inputs(v.reshape(16, -1), x, pad)
    m = np.matmul(u, v)
    if y0 is None:
        y = np.full((nb, n, oh, ow), np.nan, x.dtype)
        wg.outputs(y, m, False)
    else:
        y = y0.copy()
        wg.outputs(y, m, True)
    return y


@pytest.mark.parametrize("shape", [(2, 3, 4, 5, 5, 1), (1, 5, 3, 6, 7, 1), (3, 4, 2, 7, 4, 0),
                                   (2, 3, 3, 4, 4, 2), (1, 2, 2, 1, 1, 1), (2, 8, 8, 2, 3, 1),
                                   (1, 2, 3, 9, 3, 2), (1, 3, 2, 3, 3, 0), (1, 2, 3, 5, 36, 1),
                                   (1, 2, 3, 4, 21, 0), (2, 3, 2, 5, 34, 1), (1, 2, 2, 3, 50, 1)])
def test_kernels_match_direct_correlation(shape):
    """Every padding Winograd takes (0-2), odd and even sizes (half-used edge tiles), 1-pixel
    images; rows of tiles whose output transform takes whole vectors of tiles (34-50 wide), half
    vectors (19) and then the rest tile by tile."""
    nb, c, n, h, w, pad = shape
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal((nb, c, h, w))
    wt = rng.standard_normal((n, c, 3, 3))
    ref = direct_correlation(x, wt, pad)
    np.testing.assert_allclose(winograd_correlation(x, wt, pad), ref, rtol=1e-12, atol=1e-12)
    y0 = rng.standard_normal(ref.shape)
    np.testing.assert_allclose(winograd_correlation(x, wt, pad, y0), y0 + ref, rtol=1e-12, atol=1e-12)
    # float32: within float rounding of the summed magnitudes
    x32, w32 = x.astype(np.float32), wt.astype(np.float32)
    scale = direct_correlation(np.abs(x32), np.abs(w32), pad).max()
    assert np.abs(winograd_correlation(x32, w32, pad) - ref).max() <= 1e-6 * scale


@pytest.mark.parametrize("shape", [(2, 3, 5, 5, 5, 1, 3, 1), (1, 5, 13, 6, 7, 1, 2, 3), (3, 4, 6, 7, 4, 0, 3, 2),
                                   (2, 3, 3, 4, 4, 2, 3, 1), (1, 2, 2, 1, 1, 1, 1, 1), (2, 8, 9, 9, 10, 2, 4, 2),
                                   (2, 6, 8, 12, 12, 1, 1, 1), (1, 4, 16, 20, 20, 1, 1, 1),
                                   (1, 3, 4, 34, 36, 1, 2, 1), (2, 2, 9, 26, 28, 1, 3, 2)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fused_bands_match_the_direct_correlation(shape, dtype):
    """winograd_fused.conv3x3 (`bands` bands per item, filters in `fgroups` groups) written,
    added, with the inference epilogue and with the 2x2 maxpool, against the reference: bands of
    unequal rows, products one and two vectors wide, filters in eights and one by one."""
    nb, c, n, h, w, pad, bands, fgroups = shape
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal((nb, c, h, w)).astype(dtype)
    wt = rng.standard_normal((n, c, 3, 3)).astype(dtype)
    ref = direct_correlation(x.astype(np.float64), wt.astype(np.float64), pad)
    u = np.empty((16, n * c + cw.XI_PAD), dtype)
    wg.filters(u[:, :n * c].reshape(16, n, c), wt)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    scale = direct_correlation(np.abs(x), np.abs(wt), pad).max()

    def run(y, add=False, k=cw._NONE, off=cw._NONE, act=0, p=None, vk=np.empty(0, dtype), chunk=1):
        wf.conv3x3(y, x, u.reshape(-1)[:16 * (n * c + cw.XI_PAD) - cw.XI_PAD], n * c + cw.XI_PAD, pad,
                   add, k, off, act, no_pool(dtype) if p is None else p, bands, fgroups, vk, chunk)
        return y

    y = run(np.full(ref.shape, np.nan, dtype))
    assert np.abs(y - ref).max() <= tol * scale
    y0 = rng.standard_normal(ref.shape).astype(dtype)
    assert np.abs(run(y0.copy(), add=True) - (y0 + ref)).max() <= tol * (scale + np.abs(y0).max())
    k, off = rng.uniform(0.5, 2, n), rng.standard_normal(n)
    z = ref * k[:, None, None] + off[:, None, None]
    leaky = np.where(z > 0, z, 0.1 * z)
    y = run(np.full(ref.shape, np.nan, dtype), k=k, off=off, act=act.LEAKY)
    assert np.abs(y - leaky).max() <= tol * 4 * (scale + np.abs(off).max())
    oh, ow = ref.shape[2:]
    if oh % 2 == 0 and ow % 2 == 0:
        p = np.full((nb, n, oh // 2, ow // 2), np.nan, dtype)
        run(np.empty(ref.shape, dtype), k=k, off=off, act=act.LEAKY, p=p)
        pooled = leaky.reshape(nb, n, oh // 2, 2, ow // 2, 2).max(axis=(3, 5))
        assert np.abs(p - pooled).max() <= tol * 4 * (scale + np.abs(off).max())
    # the kept V: the chunked path's transform, chunk after chunk of `chunk` items
    per = np.prod(wg.tiles(oh, ow))
    for chunk in (1, 2, nb):
        sizes = [min(chunk, nb - b0) for b0 in range(0, nb, chunk)]
        want = np.concatenate([_chunk_v(x[b0:b0 + m], pad) for b0, m in zip(range(0, nb, chunk), sizes)])
        vk = np.full(want.shape, np.nan, dtype)
        run(np.empty(ref.shape, dtype), vk=vk, chunk=chunk)
        pads = np.concatenate([np.arange(16 * (c * m * per + cw.XI_PAD)).reshape(16, -1)[:, -cw.XI_PAD:].ravel()
                               + sum(16 * (c * s * per + cw.XI_PAD) for s in sizes[:j])
                               for j, m in enumerate(sizes)])
        body = np.setdiff1d(np.arange(want.size), pads)
        np.testing.assert_array_equal(vk[body], want[body])


@pytest.mark.parametrize("shape", [(2, 5, 3, 6, 7, 1, 2, 1), (3, 13, 20, 9, 9, 0, 3, 2),
                                   (1, 16, 8, 4, 4, 2, 1, 1), (2, 3, 5, 20, 37, 1, 2, 1)])
@pytest.mark.parametrize("kept", [False, True])
def test_fused_weight_gradient_matches_the_chunked_one(shape, kept):
    """winograd_fused.weight_grad3x3 (its slices summed) against dU = dM Vᵀ of the chunked
    kernels, float64: channels in eights and one by one, filters padded to a vector, bands of
    unequal rows, V made in the band or read from the kept V in chunks of `chunk` items."""
    nb, c, n, h, w, pad, bands, chunk = shape
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal((nb, c, h, w))
    oh, ow = h + 2 * pad - 2, w + 2 * pad - 2
    dy = rng.standard_normal((nb, n, oh, ow))
    t = nb * int(np.prod(wg.tiles(oh, ow)))
    v = np.zeros((16, c * t + cw.XI_PAD))
    wg.inputs(v, x, pad)
    m = np.empty((16, n, t))
    wg.outputs_adjoint(m, dy)
    want = m @ v[:, :c * t].reshape(16, c, t).transpose(0, 2, 1)        # (16, n, c)
    vk = np.concatenate([_chunk_v(x[b0:b0 + chunk], pad) for b0 in range(0, nb, chunk)]) if kept else np.empty(0)
    npd = -(-n // simd.LANES) * simd.LANES
    du = np.full((3, 16, c, npd), np.nan)
    wf.weight_grad3x3(du, x, dy, pad, bands, vk, chunk)
    got = du.sum(axis=0)[:, :, :n].transpose(0, 2, 1)
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


def _chunk_v(x, pad):
    """V of x as `wg.inputs` writes it: 16 rows of c·tiles values and XI_PAD after each, flat."""
    nb, c, h, w = x.shape
    t = nb * np.prod(wg.tiles(h + 2 * pad - 2, w + 2 * pad - 2))
    v = np.zeros((16, c * t + cw.XI_PAD), x.dtype)
    wg.inputs(v, x, pad)
    return v.ravel()


def test_fused_band_groups_rule():
    """Enough tasks for TASKS_PER_THREAD per thread on a map of few bands; whole groups of 8
    filters; bands within half an L2 (fewer rows over more input channels), their rows evened
    out."""
    assert wf.TASKS_PER_THREAD == 1
    assert wf.groups(512, 1, 2) == 2 and wf.groups(512, 2, 2) == 1 and wf.groups(512, 8, 2) == 1
    assert wf.groups(512, 1, 4) == 4 and wf.groups(6, 1, 4) == 1 and wf.groups(16, 1, 4) == 2
    assert wf.band_rows(13, 13, 32, 32) == 9 and wf.band_rows(200, 100, 32, 32) == 1
    assert wf.band_rows(14, 14, 128, 128) == 7 and wf.band_rows(13, 13, 512, 512) == 2
    assert wf.band_count(13, 13, 32, 32, 1, 2) == 2 and wf.band_count(13, 13, 512, 512, 1, 2) == 8
    assert wf.band_count(13, 13, 512, 512, 1, 1) == 7 and wf.band_count(13, 13, 512, 512, 64, 2) == 7
    assert wf.band_count(3, 3, 512, 512, 1, 2) == 2 and wf.band_count(3, 3, 512, 512, 1, 4) == 3


def test_fused_path_rule(monkeypatch):
    """Narrow correlations take the fused bands on enough tiles; wide ones only in small batches
    (where the chunked GEMMs are narrow), or in any batch on the CPUs where that won, and while U
    is small enough for every band to read."""
    monkeypatch.setattr(cw, "FUSED_WIDE_MAX_TILES", 1024)
    monkeypatch.setattr(cw, "FUSED_WIDE_MAX_WEIGHTS", 256 * 256)
    assert cw._fused(64, 128, 64, 64) and not cw._fused(64, 128, 16, 128)
    assert cw._fused(128, 128, 196, 1) and cw._fused(256, 256, 49, 1) and cw._fused(64, 128, 16, 64)
    assert not cw._fused(128, 128, 196, 64) and not cw._fused(384, 256, 169, 1)
    monkeypatch.setattr(cw, "FUSED_WIDE_MAX_TILES", None)
    assert cw._fused(128, 128, 196, 64) and cw._fused(256, 256, 49, 1024)
    assert cw._fused(64, 128, 16, 128) and not cw._fused(384, 256, 169, 1)
    monkeypatch.setattr(cw, "FUSED_WIDE_MAX_WEIGHTS", cw.FUSED_WIDER_MAX_WEIGHTS)    # as on Zen 5
    assert cw._fused(384, 256, 169, 1) and cw._fused(384, 256, 169, 64)
    assert not cw._fused(512, 256, 169, 1) and not cw._fused(384, 257, 169, 1)


@pytest.mark.parametrize("name, any_batch", [("znver5", True), ("sapphirerapids", False),
                                            ("znver4", False)])
def test_cpu_dependent_rules(name, any_batch):
    """The path rule that measured opposite ways on different CPUs (kernels/cpu.py) follows the
    CPU numba is told it runs on (NUMBA_CPU_NAME); the deep layers' rule holds on every CPU;
    importing compiles nothing."""
    code = ("import darkpy.kernels.cpu as c, darkpy.kernels.direct_fv as fv, "
            "darkpy.layers.conv_winograd as cw; "
            "print(c.HOST_CPU, fv.DEEP, cw.FUSED_WIDE_MAX_TILES is None, cw.FUSED_WIDE_MAX_WEIGHTS)")
    env = dict(os.environ, NUMBA_CPU_NAME=name)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == [name, "True", str(any_batch), str(384 * 256 if any_batch else 256 * 256)]


CFG = """[net]
batch={batch}
height={h}
width={w}
channels=16
[convolutional]
filters=8
size=3
stride=1
padding={padding}
batch_normalize={bn}
activation=leaky
"""


def _net(monkeypatch, winograd, dtype=np.float64, batch=3, h=7, w=6, padding=1, bn=0, chunk=None):
    monkeypatch.setattr(conv, "WINOGRAD", winograd)
    monkeypatch.setattr(conv, "WINOGRAD_MIN_TILES", 1)
    if chunk is not None:
        monkeypatch.setattr(ic, "CHUNK_VALUES", chunk)
    net = network_from_text(CFG.format(batch=batch, h=h, w=w, padding=padding, bn=bn), dtype=dtype)
    assert net.layers[0].winograd is winograd
    return net


@pytest.mark.parametrize("padding", [0, 1, 2])
@pytest.mark.parametrize("bn", [0, 1])
def test_layer_winograd_equals_im2col(monkeypatch, padding, bn):
    """Forward output, input delta and weight/bias/scale gradients of the Winograd path equal the
    im2col path's (float64), including with the batch split into chunks, with the forward's input
    transform kept for the weight gradient and recomputed there, and in fused bands (which also
    keep V, in the chunks' layout, and compute the weight gradient)."""
    rng = np.random.default_rng(padding + 10 * bn)
    results = []
    for winograd, chunk, keep, bands in ((False, None, 0, False), (True, None, 1 << 23, False),
                                         (True, 16 * 12 * 24, 1 << 23, False), (True, 16 * 12 * 24, 0, False),
                                         (True, None, 0, True), (True, None, 1 << 23, True),
                                         (True, 16 * 12 * 24, 1 << 23, True)):
        monkeypatch.setattr(cw, "WINOGRAD_KEEP_VALUES", keep)
        monkeypatch.setattr(cw, "FUSED_BANDS", bands)       # (forward without a kept V, input gradient)
        monkeypatch.setattr(cw, "FUSED_WGRAD", bands)
        monkeypatch.setattr(cw, "FUSED_MIN_TILES", 1)
        net = _net(monkeypatch, winograd, padding=padding, bn=bn, chunk=chunk)
        layer = net.layers[0]
        if chunk is not None:
            assert layer.wchunk < net.batch
        layer.init_weights(np.random.default_rng(1))
        x = np.random.default_rng(2).uniform(-1, 1, net.input.shape)
        net.forward(x, train=True)
        assert layer._v_kept == (winograd and keep > 0)
        out = layer.output.copy()
        layer.delta[...] = np.random.default_rng(3).standard_normal(layer.delta.shape)
        prev = np.full(x.shape, 0.5)
        for p in layer.params:
            p.grad.fill(0)
        layer.backward(State(input=x, delta=prev, truth=None, train=True, layers=net.layers, net=net))
        results.append([out, prev] + [p.grad.copy() for p in layer.params])
        monkeypatch.undo()
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_allclose(b, a, rtol=1e-11, atol=1e-11)
    assert not np.allclose(results[0][1], 0.5)      # the input delta was really added to


@pytest.mark.parametrize("channels,fused", [(96, True), (256, True), (320, False)])
def test_the_weight_gradient_takes_the_bands_up_to_its_channel_limit(monkeypatch, channels, fused):
    """A layer over at most FUSED_WGRAD_MAX_CHANNELS channels takes its weight gradient in bands
    (`wf.weight_grad3x3`), a wider one the chunked GEMMs; both give the same gradient (float64)."""
    cfg = CFG.replace("channels=16", f"channels={channels}").format(batch=2, h=8, w=8, padding=1,
                                                                    bn=1)
    grads = []
    for bands in (False, True):
        monkeypatch.setattr(cw, "FUSED_WGRAD", bands)
        calls = []
        monkeypatch.setattr(wf, "weight_grad3x3",
                            lambda *a, _f=wf.weight_grad3x3: (calls.append(1), _f(*a))[1])
        monkeypatch.setattr(conv, "WINOGRAD", True)
        monkeypatch.setattr(conv, "WINOGRAD_MIN_TILES", 1)
        net = network_from_text(cfg, dtype=np.float64)
        layer = net.layers[0]
        assert layer.winograd
        layer.init_weights(np.random.default_rng(1))
        x = np.random.default_rng(2).uniform(-1, 1, net.input.shape)
        net.forward(x, train=True)
        layer.delta[...] = np.random.default_rng(3).standard_normal(layer.delta.shape)
        layer.weights.grad.fill(0)
        layer.backward(State(input=x, delta=None, truth=None, train=True, layers=net.layers,
                             net=net))
        assert bool(calls) == (bands and fused)
        grads.append(layer.weights.grad.copy())
        monkeypatch.undo()
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-11, atol=1e-11)


def test_layer_winograd_gradcheck(monkeypatch):
    monkeypatch.setattr(conv, "WINOGRAD_MIN_TILES", 1)
    net = layer_gradcheck(CFG.format(batch=2, h=5, w=6, padding=1, bn=1), 0)
    assert net.layers[0].winograd


def test_layer_winograd_float32_close_to_im2col(monkeypatch):
    rng = np.random.default_rng(5)
    outs = []
    for winograd in (False, True):
        net = _net(monkeypatch, winograd, dtype=np.float32, batch=4, h=13, w=11)
        net.layers[0].init_weights(np.random.default_rng(1))
        outs.append(net.forward(rng.uniform(0, 1, net.input.shape).astype(np.float32)).copy())
        rng = np.random.default_rng(5)
        monkeypatch.undo()
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)


def test_winograd_only_where_it_applies(monkeypatch):
    """Strided, dilated, grouped, 1x1 and small-batch layers keep im2col."""
    monkeypatch.setattr(conv, "WINOGRAD_MIN_TILES", 1)
    base = "[net]\nbatch=2\nheight=8\nwidth=8\nchannels=16\n[convolutional]\nfilters=16\nactivation=linear\n"
    for extra, expected in (("size=3\npad=1\n", True), ("size=3\npad=1\nstride=2\n", False),
                            ("size=3\npad=1\ndilation=2\n", False), ("size=3\npad=1\ngroups=2\n", False),
                            ("size=1\n", False), ("size=5\npad=1\n", False)):
        net = network_from_text(base + extra)
        assert net.layers[0].winograd is expected, extra
    monkeypatch.setattr(conv, "WINOGRAD_MIN_TILES", 10 ** 6)
    assert not network_from_text(base + "size=3\npad=1\n").layers[0].winograd


@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (1, 2, 4, 7), (2, 2, 1, 1)])
def test_adjoint_kernels(shape):
    """<outputs(M), dY> = <M, outputs_adjoint(dY)> and <filters(w), dU> = <w, filters_adjoint(dU)>:
    the weight gradient's transforms are the exact adjoints of the forward's."""
    nb, n, oh, ow = shape
    rng = np.random.default_rng(oh * 10 + ow)
    th, tw = wg.tiles(oh, ow)
    m = rng.standard_normal((16, n, nb * th * tw))
    dy = rng.standard_normal(shape)
    y = np.zeros(shape)
    wg.outputs(y, m, False)
    dm = np.full_like(m, np.nan)
    wg.outputs_adjoint(dm, dy)
    assert np.isclose((y * dy).sum(), (m * dm).sum(), rtol=1e-12)
    w = rng.standard_normal((n, 4, 3, 3))
    du = rng.standard_normal((16, n, 4))
    u = np.empty_like(du)
    wg.filters(u, w)
    dw = np.ones_like(w)
    wg.filters_adjoint_add(dw, du)
    assert np.isclose((u * du).sum(), (w * (dw - 1)).sum(), rtol=1e-12)


def test_winograd_chunk_rule(monkeypatch):
    """Items per chunk: what fits WINOGRAD_CHUNK_VALUES, raised to WINOGRAD_MIN_GEMM_TILES tiles,
    within the batch and the workspace cap."""
    monkeypatch.setattr(cw, "WINOGRAD_CHUNK_VALUES", 1000)
    monkeypatch.setattr(cw, "WINOGRAD_MIN_GEMM_TILES", 40)
    assert cw._winograd_chunk(100, 4, 32) == 10          # fits 10 items (40 tiles)
    assert cw._winograd_chunk(300, 4, 32) == 10          # fits 3, raised to 40 tiles
    assert cw._winograd_chunk(300, 4, 6) == 6            # never more than the batch
    assert cw._winograd_chunk(5000, 100, 8) == 1         # at least one item
    monkeypatch.setattr(cw, "WINOGRAD_INFER_CHUNK_VALUES", 500)
    assert cw._winograd_chunk(50, 64, 32, inference_only=True) == 10     # its own cap
    assert cw._winograd_chunk(50, 64, 32) == 20
    monkeypatch.setattr(ic, "CHUNK_VALUES", 1500)
    assert cw._winograd_chunk(300, 4, 32) == 5           # the workspace cap wins
    net = network_from_text(CFG.format(batch=40, h=16, w=16, padding=1, bn=0))
    layer = net.layers[0]
    assert layer.winograd and 1 <= layer.wchunk <= 40


def inputs_reference(x, pad):
    """V (16, c, nb·th·tw) = Bᵀ d B of every tile's 4x4 patch d, from a zero-padded copy of x."""
    nb, c, h, w = x.shape
    th, tw = wg.tiles(h + 2 * pad - 2, w + 2 * pad - 2)
    xp = np.zeros((nb, c, 2 * th + 2, 2 * tw + 2))
    xp[:, :, pad:pad + h, pad:pad + w] = x[:, :, :2 * th + 2 - pad, :2 * tw + 2 - pad]
    bt = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float)
    v = np.empty((4, 4, c, nb, th, tw))
    for ty in range(th):
        for tx in range(tw):
            d = xp[:, :, 2 * ty:2 * ty + 4, 2 * tx:2 * tx + 4]            # (nb, c, 4, 4)
            v[:, :, :, :, ty, tx] = np.einsum("ik,bckl,jl->ijcb", bt, d, bt)
    return v.reshape(16, c, nb * th * tw)


@pytest.mark.parametrize("shape", [(1, 2, 90, 85, 1), (2, 40, 9, 9, 2), (3, 1, 5, 120, 0),
                                   (2, 24, 16, 16, 1), (2, 3, 26, 26, 1), (1, 5, 29, 32, 0),
                                   (2, 2, 32, 32, 1), (1, 3, 7, 18, 0)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_input_transform_matches_its_definition(shape, dtype):
    """The input transform against V = Bᵀ d B of every tile, on long rows, many channels and every
    padding, into rows longer than the 16 matrices (as the layer's padded workspace): the values
    past them are left alone. Rows of tiles of every kind `winograd_tiles.plane_inputs` has: whole vectors
    (16 tiles with AVX-512), whole vectors and an overlapping last one (43, 59), two overlapping
    half vectors (13, 15), one half vector (8), tile by tile (6, 7)."""
    nb, c, h, w, pad = shape
    x = np.random.default_rng(sum(shape)).standard_normal((nb, c, h, w)).astype(dtype)
    ref = inputs_reference(x.astype(np.float64), pad)
    rows = np.full((16, ref[0].size + 7), np.nan, dtype)
    wg.inputs(rows, x, pad)
    tol = 1e-12 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(rows[:, :ref[0].size].reshape(ref.shape), ref, rtol=tol, atol=tol)
    assert np.isnan(rows[:, ref[0].size:]).all()


def test_kept_transform_is_used_only_after_a_training_forward(monkeypatch):
    """The weight gradient reads the kept transform only when the last forward was a training one:
    after an inference forward on another input it transforms the input it is given."""
    net = _net(monkeypatch, True, batch=2)
    layer = net.layers[0]
    layer.init_weights(np.random.default_rng(1))
    rng = np.random.default_rng(7)
    x, other = rng.uniform(-1, 1, net.input.shape), rng.uniform(-1, 1, net.input.shape)
    delta = rng.standard_normal(layer.output.shape)
    grads = []
    for first in (x, other):
        net.forward(first, train=True)
        assert layer._v_kept
        if first is other:
            net.forward(x)          # inference on x: the kept transform (of `other`) is stale now
            assert not layer._v_kept
        layer.delta[...] = delta
        layer.weights.grad.fill(0)
        layer.backward(State(input=x, delta=None, truth=None, train=True, layers=net.layers, net=net))
        grads.append(layer.weights.grad.copy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12, atol=1e-12)


KEPT_CFG = """[net]
batch=1
height=14
width=14
channels=32
[convolutional]
filters=32
size=3
stride=1
pad=1
activation=leaky
[maxpool]
size=3
stride=1
padding=0
[convolutional]
filters=8
size=3
stride=1
pad=1
batch_normalize=1
activation=leaky
"""


def _kept_nets(dtype=np.float64):
    """The same two-layer network twice (14x14 and 12x12 maps at batch 1: 49 and 36 output tiles,
    too few for Winograd unless the filter transform is kept), one of them sharing its outputs."""
    nets = [network_from_text(KEPT_CFG, dtype=dtype) for _ in range(2)]
    for layer, twin in zip(*(n.layers for n in nets)):
        for p, q in zip(getattr(layer, "params", []), getattr(twin, "params", [])):
            p.value[...] = np.random.default_rng(p.value.size).uniform(-1, 1, p.value.shape)
            q.value[...] = p.value
    nets[1].share_outputs()
    return nets


def _same_forward(plain, shared, x, rtol=1e-11):
    want = plain.forward(x).copy()
    np.testing.assert_allclose(shared.forward(x), want, rtol=rtol, atol=rtol * np.abs(want).max())


def test_fixed_weights_keep_the_filter_transform():
    """With the weights fixed (share_outputs) the 49- and 36-tile layers keep their filter transform
    and run on Winograd, giving the im2col path's outputs; the transform is made once."""
    plain, shared = _kept_nets()
    convs = [l for l in shared.layers if l.kind == "convolutional"]
    assert not any(l.winograd for l in plain.layers if l.kind == "convolutional")
    assert all(l.keep_filters and l.winograd for l in convs)
    x = np.random.default_rng(3).uniform(-1, 1, plain.input.shape)
    _same_forward(plain, shared, x)
    kept = [l._kept_u for l in convs]
    assert all(u is not None for u in kept)
    _same_forward(plain, shared, np.random.default_rng(4).uniform(-1, 1, plain.input.shape))
    assert all(l._kept_u is u for l, u in zip(convs, kept))
    shared.unshare_outputs()            # training allowed again: no kept transform, im2col as before
    assert not any(l.keep_filters or l.winograd for l in convs)
    _same_forward(plain, shared, x)


def test_kept_transform_follows_the_weights(tmp_path):
    """A kept transform never outlives the weights it came from: loading weights, an update and
    `weights_changed()` after writing a weight array each give the new weights' outputs."""
    plain, shared = _kept_nets()
    x = np.random.default_rng(3).uniform(-1, 1, plain.input.shape)
    _same_forward(plain, shared, x)
    other = network_from_text(KEPT_CFG, dtype=np.float64)
    for layer in other.layers:
        if hasattr(layer, "init_weights"):
            layer.init_weights(np.random.default_rng(9))
    path = tmp_path / "other.weights"
    other.save_weights(path)
    for net in (plain, shared):
        net.load_weights(path)
    _same_forward(plain, shared, x)
    for net in (plain, shared):                 # the same step on both: grads set, then update
        for layer in net.layers:
            for p in getattr(layer, "params", []):
                p.grad[...] = np.random.default_rng(p.grad.size).standard_normal(p.grad.shape)
        net.update(0.1)
    _same_forward(plain, shared, x)
    for net in (plain, shared):
        net.layers[0].weights.value[:, :, 1, 1] *= -2
    shared.weights_changed()
    _same_forward(plain, shared, x)


def test_kept_transforms_stay_within_their_budget(monkeypatch):
    """Room for one transform: the layer with more output tiles (the 14x14 one) keeps it, the other
    stays on im2col; no room: neither."""
    room = cw._xi_size(32, 32)
    for budget, kept in ((room, [True, False]), (0, [False, False])):
        monkeypatch.setattr(cw, "KEPT_FILTER_VALUES", budget)
        plain, shared = _kept_nets()
        convs = [l for l in shared.layers if l.kind == "convolutional"]
        assert [l.keep_filters for l in convs] == kept
        assert [l.winograd for l in convs] == kept
        _same_forward(plain, shared, np.random.default_rng(3).uniform(-1, 1, plain.input.shape))


@pytest.mark.parametrize("budget, anyway, kept", [(None, True, [True, True]),
                                                   ("one", True, [True, False]),
                                                   (0, True, [False, False]),
                                                   (None, False, [False, False])])
def test_layers_on_winograd_anyway_keep_the_transform_in_the_room_left(monkeypatch, budget, anyway,
                                                                       kept):
    """At batch 4 both layers have enough tiles for Winograd without a kept transform (196 and 144);
    with fixed weights they keep it (KEEP_ANYWAY) as room allows, in network order, give the same
    outputs, and make the transform once."""
    if budget is not None:
        monkeypatch.setattr(cw, "KEPT_FILTER_VALUES", cw._xi_size(32, 32) if budget == "one" else 0)
    monkeypatch.setattr(cw, "KEEP_ANYWAY", anyway)
    nets = [network_from_text(KEPT_CFG.replace("batch=1", "batch=4"), dtype=np.float64)
            for _ in range(2)]
    for layer, twin in zip(*(n.layers for n in nets)):
        for p, q in zip(getattr(layer, "params", []), getattr(twin, "params", [])):
            p.value[...] = np.random.default_rng(p.value.size).uniform(-1, 1, p.value.shape)
            q.value[...] = p.value
    plain, shared = nets
    shared.share_outputs()
    convs = [l for l in shared.layers if l.kind == "convolutional"]
    assert all(l.winograd for l in plain.layers if l.kind == "convolutional")
    assert all(l.winograd for l in convs)
    assert [l.keep_filters for l in convs] == kept
    x = np.random.default_rng(3).uniform(-1, 1, plain.input.shape)
    _same_forward(plain, shared, x)
    made = [l._kept_u for l in convs]
    assert [u is not None for u in made] == kept
    _same_forward(plain, shared, np.random.default_rng(4).uniform(-1, 1, plain.input.shape))
    assert all(l._kept_u is u for l, u in zip(convs, made))


def test_a_layer_on_the_direct_path_keeps_no_filter_transform():
    """16 -> 32 on 32x32 at batch 4 has the tiles for Winograd but takes the row-vectorised direct
    path, so it is not among the layers on Winograd anyway (and takes none of their room)."""
    text = KEPT_CFG.replace("batch=1", "batch=4").replace("channels=32", "channels=16")
    net = network_from_text(text.replace("height=14", "height=32").replace("width=14", "width=32"))
    net.share_outputs()
    layer = net.layers[0]
    assert layer.winograd_tiles(4) >= conv.WINOGRAD_MIN_TILES
    assert layer.direct and not layer.winograd and not layer.keep_filters
    assert not layer.on_winograd_anyway(4)


@pytest.mark.parametrize("size, channels, kept", [(8, 32, True), (7, 32, False), (6, 32, False),
                                                   (8, 16, False)])
def test_kept_transform_needs_enough_whole_tiles(size, channels, kept):
    """An 8x8 map at batch 1 has 16 whole 2x2 tiles and keeps its transform; a 7x7 one (9 whole of
    16, a third of the work wasted) and a 6x6 one (9) stay on im2col, as does a 16-channel input."""
    text = KEPT_CFG.replace("height=14", f"height={size}").replace("width=14", f"width={size}")
    net = network_from_text(text.replace("channels=32", f"channels={channels}"))
    net.share_outputs()
    layer = net.layers[0]
    assert layer.keep_filters is kept and layer.winograd is kept


@pytest.mark.parametrize("n, chunked, kept", [(256, False, True), (512, False, False), (512, True, True)])
def test_kept_transform_only_where_the_fused_bands_take_the_layer(n, chunked, kept, monkeypatch):
    """At batch 1 a 256 -> 256 layer on 13x13 (a filter transform the fused bands take) keeps its
    transform and runs on Winograd; a 256 -> 512 one would run the chunked path's narrow GEMMs
    and stays on the GEMM path, unless WINOGRAD_KEPT_CHUNKED."""
    monkeypatch.setattr(conv, "WINOGRAD_KEPT_CHUNKED", chunked)
    monkeypatch.setattr(dfv, "DEEP", False)             # not the direct path across filters
    text = (KEPT_CFG.replace("height=14", "height=13").replace("width=14", "width=13")
            .replace("channels=32", "channels=256").replace("filters=32", f"filters={n}", 1))
    net = network_from_text(text, dtype=np.float32)
    net.share_outputs()
    layer = net.layers[0]
    assert layer.winograd_in_bands(1) is (n == 256)
    assert layer.keep_filters is kept and layer.winograd is kept


@njit
def _filters_pair_by_pair(u, w):
    """The filter transform one (filter, channel) pair at a time (`winograd._filter`, the scalar
    code the vector lanes must reproduce)."""
    for nc in range(w.shape[0] * w.shape[1]):
        wg._filter(u, w, nc)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("c", [3, 16, 37])
def test_filter_transform_in_lanes_is_the_pair_by_pair_one_bit_for_bit(dtype, c):
    """`filters` takes whole vectors of channels in lanes (G's halves in float64 where the scalar
    code widens) and the rest pair by pair: the same bits as the pair-by-pair code, for weights
    given as they are and flipped (the input gradient's strided view), into U rows padded apart."""
    rng = np.random.default_rng(c)
    n = 20                          # the flipped view's channels: a vector and 4 more
    w = (rng.standard_normal((n, c, 3, 3)) * 1e3 ** rng.integers(-2, 3, (n, c, 1, 1))).astype(dtype)
    for weights in (w, w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1]):
        a, b = weights.shape[:2]
        rows = np.full((2, 16, a * b + 7), np.nan, dtype)
        got, want = (r[:, :a * b].reshape(16, a, b) for r in rows)
        wg.filters(got, weights)
        _filters_pair_by_pair(want, weights)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@njit
def _adjoint_pair_by_pair(dw, du):
    """The filter transform's adjoint one (filter, channel) pair at a time
    (`winograd._filter_adjoint_add`, the scalar code the vector lanes must reproduce)."""
    for nc in range(dw.shape[0] * dw.shape[1]):
        wg._filter_adjoint_add(dw, du, nc)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, c", [(20, 3), (20, 37), (40, 16), (17, 35), (64, 48)])
def test_filter_adjoint_in_lanes_is_the_pair_by_pair_one_bit_for_bit(dtype, n, c):
    """`filters_adjoint_add` takes whole vectors of channels (dU's rows along c) or of filters (the
    fused weight gradient's transposed dU) in lanes, the rest pair by pair, and adds into dw: the
    same bits as the pair-by-pair code, whatever the values' magnitudes."""
    rng = np.random.default_rng(n * c)
    base = (rng.standard_normal((16, n, c)) * 1e3 ** rng.integers(-2, 3, (1, n, c))).astype(dtype)
    transposed = np.ascontiguousarray(base.transpose(0, 2, 1)).transpose(0, 2, 1)
    assert transposed.strides[1] == transposed.itemsize
    for du in (base, transposed, base[:, :, ::-1]):         # the last: neither in unit steps
        dw = rng.standard_normal((n, c, 3, 3)).astype(dtype)
        got, want = dw.copy(), dw.copy()
        wg.filters_adjoint_add(got, du)
        _adjoint_pair_by_pair(want, du)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_output_transform_refuses_an_output_it_cannot_write_in_place():
    """`outputs` writes each plane through a 1-D view: a y that is not C-contiguous is an error
    naming it, not a wrong result; M's tiles must be contiguous too."""
    m = np.zeros((16, 2, 4))
    y = np.zeros((1, 2, 4, 8))[:, :, :, ::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        wg.outputs(y, m, False)
    with pytest.raises(ValueError, match="contiguous"):
        wg.outputs(np.zeros((1, 2, 4, 4)), np.zeros((16, 2, 8))[:, :, ::2], False)
