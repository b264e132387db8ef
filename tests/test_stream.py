"""Outputs written past the caches (`simd.store_stream`, from `simd.STREAM_MIN_BYTES` on): the
direct convolution's epilogue rows (kernels/direct.py, `_act_out`) and a [route]'s copies
(layers/route.py, `stream_parts`) give the same bits as the stores through the caches, aligned
or not.
"""
from __future__ import annotations

import numba
import numpy as np
import pytest

from darkpy.kernels import direct as dk
from darkpy.kernels import direct_blocks as db
from darkpy.kernels import simd
from darkpy.kernels.activations import LEAKY
from darkpy.layers import route
from darkpy.network import network_from_text


@pytest.mark.parametrize("d0,s0,n", [(0, 0, 4096), (3, 0, 100), (0, 5, 33), (7, 11, 1),
                                     (16, 16, route.SPAN + 37), (1, 2, 15)])
def test_stream_parts_copies_the_part(d0, s0, n):
    """Every value of the part, whatever the alignment of its start in each row, and nothing
    around it."""
    rng = np.random.default_rng(n)
    src = rng.standard_normal((3, s0 + n + 9)).astype(np.float32)
    dst = np.full((3, d0 + n + 13), np.nan, np.float32)
    route.stream_parts(dst, d0, src, s0, n)
    np.testing.assert_array_equal(dst[:, d0:d0 + n], src[:, s0:s0 + n])
    assert np.isnan(dst[:, :d0]).all() and np.isnan(dst[:, d0 + n:]).all()


def test_a_large_route_streams_its_parts(monkeypatch):
    """A route over the threshold takes `stream_parts` (threshold lowered here) and gives the
    copies' output."""
    cfg = ("[net]\nbatch=3\nwidth=9\nheight=7\nchannels=5\n[convolutional]\nfilters=6\nsize=1\n"
           "activation=leaky\n[convolutional]\nfilters=4\nsize=3\npad=1\nactivation=linear\n"
           "[route]\nlayers=-1,-2\n")
    net = network_from_text(cfg)
    x = np.random.default_rng(3).standard_normal(net.input.shape).astype(np.float32)
    want = net.forward(x).copy()
    seen = []
    real = route.stream_parts
    monkeypatch.setattr(simd, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(route, "stream_parts", lambda *a: (seen.append(a[1]), real(*a)))
    net.layers[2].output[...] = np.nan
    np.testing.assert_array_equal(net.forward(x), want)
    assert seen == [0, 4 * 63]                      # both parts, at their offsets


@pytest.mark.parametrize("width", [512, 528])     # rows of whole vectors, on whole cache lines
def test_direct_forward_streams_a_large_output(width):
    """A batch whose output passes the threshold (8 x 16 x 512 x w: 128+ MB) streams its rows
    and gives each item's output as computed alone (17 MB, through the caches), epilogue
    included."""
    B, C, N, H = 8, 3, 16, 512
    rng = np.random.default_rng(width)
    x = rng.standard_normal((B, C, H, width)).astype(np.float32)
    w = rng.standard_normal((N, C, 3, 3)).astype(np.float32)
    k, off = rng.random(N) + 0.5, rng.standard_normal(N)
    raw = np.full(B * N * H * width + 16, np.nan, np.float32)     # rows on 64-byte lines
    y = raw[(-raw.ctypes.data % 64) // 4:][:B * N * H * width].reshape(B, N, H, width)
    assert y.nbytes >= simd.STREAM_MIN_BYTES > y[0].nbytes
    dk.conv_forward(y, x, w, 1, 1, 1, db.forward_rows(B, H, width, 3, 1), k, off, LEAKY)
    for b in range(B):
        alone = np.full((1, N, H, width), np.nan, np.float32)
        dk.conv_forward(alone, x[b:b + 1], w, 1, 1, 1, db.forward_rows(1, H, width, 3, 1), k, off,
                        LEAKY)
        np.testing.assert_array_equal(y[b], alone[0])


@pytest.mark.parametrize("x86", [True, False])
def test_store_stream_and_its_fence_compile_on_either_branch(x86, monkeypatch):
    """The fence is x86's sfence there and a sequentially consistent fence on other machines (no
    x86 intrinsic to fail to compile); a streamed vector lands where it is aligned."""
    monkeypatch.setattr(simd, "_X86", x86)

    @numba.njit(cache=False)
    def copy_first_vector(a):
        if simd.aligned(a, 0) and not simd.aligned(a, 1):
            simd.store_stream(a, 0, simd.load(a, simd.LANES))
        simd.store_fence()

    raw = np.arange(3 * simd.LANES, dtype=np.float32)
    a = raw[(-raw.ctypes.data % (4 * simd.LANES)) // 4:][:2 * simd.LANES]
    want = a[simd.LANES:].copy()
    copy_first_vector(a)
    np.testing.assert_array_equal(a[:simd.LANES], want)
