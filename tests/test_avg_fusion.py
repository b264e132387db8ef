"""A linear 1x1 convolution that writes the global [avgpool] after it by averaging its input first
(layers/conv_averaged.py, inference with shared outputs only): the pool's output and the network's
are those of the two layers run apart within rounding, on each of its paths (one serial call for
small pairs; for larger ones the parallel pool, then a dot product per output or, from
BLOCKED_MIN_BATCH items, the filters-by-items microkernel), with and without batch norm, in
float32 and float64; and fused only where that is the same function.
"""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.engine import sane_weights
from darkpy import outputs_plan
from darkpy.layers import conv_averaged
from darkpy.network import network_from_text

#: conv 3x3 (the input of the pair) -> conv 1x1 {act} -> avgpool -> softmax
NET = """
[net]
width={s}
height={s}
channels=3
[convolutional]
batch_normalize=1
filters={c}
size=3
pad=1
activation=leaky
[convolutional]
batch_normalize={bn}
filters={n}
size={k}
padding={pad}
activation={act}
[avgpool]
[softmax]
"""


def _net(s=8, c=16, n=10, bn=1, act="linear", k=1, pad=0, batch=2, dtype=np.float32):
    net = network_from_text(NET.format(s=s, c=c, n=n, bn=bn, act=act, k=k, pad=pad),
                            batch=batch, dtype=dtype)
    sane_weights(net.layers)            # biases and batch-norm statistics that are not zeros
    return net


@pytest.mark.parametrize("dtype,s,c,n,batch,bn", [
    (np.float32, 4, 16, 10, 1, 1),      # 256 inputs: the one serial call
    (np.float32, 8, 64, 10, 3, 0),      # 12288 inputs: the pool and the GEMM
    (np.float32, 7, 96, 200, 4, 1),     # 76800 multiply-adds: the pool and the GEMM
    (np.float64, 4, 16, 10, 2, 0),
    (np.float64, 8, 64, 30, 3, 1),
    (np.float32, 8, 96, 44, 16, 1),     # filters by items: one vector of items, blocks overlapping
    (np.float32, 7, 96, 200, 20, 0),    # two vectors (zeros past the batch)
    (np.float32, 5, 64, 24, 48, 1),     # two vectors, then one
    (np.float64, 8, 64, 70, 17, 1)])
def test_averaging_first_gives_the_two_layers_values(dtype, s, c, n, batch, bn):
    net = _net(s, c, n, bn, batch=batch, dtype=dtype)
    small = batch * c * s * s <= conv_averaged.SMALL_VALUES and batch * c * n <= conv_averaged.SMALL_MACS
    assert small == (s == 4)
    x = np.random.default_rng(1).uniform(-1, 1, net.input.shape).astype(dtype)
    ref = net.forward(x).copy()
    pooled = net.layers[2].output.copy()
    net.share_outputs(keep=[2])
    assert net.layers[1].average_into is net.layers[2] and net.layers[2].pooled_by is net.layers[1]
    assert net.layers[1]._blocked == (batch >= conv_averaged.BLOCKED_MIN_BATCH
                                      and batch * c * n >= conv_averaged.PARALLEL_MIN_MACS)
    net._arena[...] = np.nan                            # a value read but not written shows
    tol = dict(rtol=2e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)
    for _ in range(2):
        np.testing.assert_allclose(net.forward(x), ref, **tol)
        np.testing.assert_allclose(net.layers[2].output, pooled, **tol)
    assert np.isnan(net.layers[1].output).all() or not np.shares_memory(net.layers[1].output, net._arena)
    net.unshare_outputs()
    assert net.layers[1].average_into is None and net.layers[2].pooled_by is None
    np.testing.assert_array_equal(net.forward(x), ref)


@pytest.mark.parametrize("kw", [dict(act="leaky"), dict(act="relu"), dict(k=3, pad=1),
                                dict(k=1, pad=1)])          # (padding=, not Darknet's pad flag)
def test_not_fused_where_averaging_first_changes_the_function(kw):
    """A nonlinear activation, a 3x3 filter (its border taps), padding (a 1x1 filter on a padded
    map: the border's outputs are the bias alone) would not average to the same values."""
    net = _net(**kw)
    x = np.random.default_rng(2).uniform(-1, 1, net.input.shape).astype(np.float32)
    ref = net.forward(x).copy()
    net.share_outputs()
    assert net.layers[1].average_into is None and net.layers[2].pooled_by is None
    np.testing.assert_array_equal(net.forward(x), ref)


def test_not_fused_when_the_convolution_is_read_after_the_forward(monkeypatch):
    net = _net()
    net.share_outputs(keep=[1])                 # the caller reads the convolution's own output
    assert net.layers[1].average_into is None
    monkeypatch.setattr(outputs_plan, "AVERAGE_FIRST", False)
    net.share_outputs()
    assert net.layers[1].average_into is None
    monkeypatch.undo()
    net.share_outputs()
    assert net.layers[1].average_into is net.layers[2]
    x = np.random.default_rng(3).uniform(-1, 1, net.input.shape).astype(np.float32)
    net.unshare_outputs()
    net.forward(x, train=True)                  # training: the two layers run apart
    assert net.layers[2].pooled_by is None
    np.testing.assert_allclose(net.layers[2].output.reshape(2, -1),
                               net.layers[1].output.reshape(2, 10, -1).mean(axis=2), rtol=1e-5)


@pytest.mark.parametrize("batch", [16, 3])          # the border path's sums; y, then its means
def test_the_convolution_before_writes_the_means(batch, monkeypatch):
    """The 3x3 convolution before the pair (on the direct path across filters) writes the means
    of its maps into the pair, which then only takes the product: the pool's output is the three
    layers' run apart within rounding; not where the 3x3 convolution's output is kept."""
    net = _net(s=4, c=32, batch=batch)
    x = np.random.default_rng(4).uniform(-1, 1, net.input.shape).astype(np.float32)
    ref = net.forward(x).copy()
    pooled = net.layers[2].output.copy()
    averaged = []
    monkeypatch.setattr(conv_averaged, "avgpool_forward", lambda *a: averaged.append(1))
    net.share_outputs(keep=[2])
    assert net.layers[0].direct_fv
    assert net.layers[0].means_into is net.layers[1] and net.layers[1].means_by is net.layers[0]
    net._arena[...] = np.nan
    np.testing.assert_allclose(net.forward(x), ref, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(net.layers[2].output, pooled, rtol=2e-5, atol=1e-6)
    assert not averaged
    net.share_outputs(keep=[0, 2])
    assert net.layers[0].means_into is None and net.layers[1].means_by is None
    monkeypatch.setattr(outputs_plan, "WRITE_MEANS", False)
    net.share_outputs(keep=[2])
    assert net.layers[0].means_into is None and net.layers[1].average_into is net.layers[2]
    net.unshare_outputs()
    assert net.layers[0].means_into is None and net.layers[1].means_by is None
    np.testing.assert_array_equal(net.forward(x), ref)


#: conv 3x3 3 -> 16, then the pair's producer: conv 3x3 16 -> {c} ({act}), conv 1x1 -> avgpool
WIDE = """
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
[convolutional]
batch_normalize=1
filters={c}
size=3
pad=1
activation={act}
[convolutional]
filters=10
size=1
activation=linear
[avgpool]
[softmax]
"""


@pytest.mark.parametrize("path,s,c,batch,act", [
    ("winograd", 15, 48, 6, "leaky"),       # chunked Winograd: odd maps, cropped tiles
    ("winograd", 8, 32, 40, "mish"),        # more planes than one task's group, a mish
    ("gemm", 7, 48, 8, "leaky")])           # BLAS's product: the pair averages itself
def test_winograd_producer_writes_the_means(path, s, c, batch, act, monkeypatch):
    """The producer before the pair writes the means of its maps on Winograd's chunked path (each
    plane's as it is finished; its output is not written): the pool's output is that of the layers
    run apart within rounding. On the GEMM path it writes its output, and the pair averages it."""
    from darkpy.layers import conv_winograd, convolutional
    monkeypatch.setattr(convolutional, "DIRECT_FV", False)
    monkeypatch.setattr(convolutional, "DIRECT", False)
    monkeypatch.setattr(conv_winograd, "FUSED_BANDS", False)
    if path == "gemm":
        monkeypatch.setattr(convolutional, "WINOGRAD", False)
    else:                                   # several chunks of items (each's means)
        monkeypatch.setattr(convolutional, "WINOGRAD_MIN_TILES", 1)
        monkeypatch.setattr(conv_winograd, "WINOGRAD_INFER_CHUNK_VALUES", 1 << 16)
    net = network_from_text(WIDE.format(s=s, c=c, act=act), batch=batch)
    sane_weights(net.layers)
    x = np.random.default_rng(5).uniform(-1, 1, net.input.shape).astype(np.float32)
    ref = net.forward(x).copy()
    pooled = net.layers[3].output.copy()
    averaged = []
    real = conv_averaged.avgpool_forward
    monkeypatch.setattr(conv_averaged, "avgpool_forward", lambda *a: (averaged.append(1), real(*a)))
    net.share_outputs(keep=[3])
    producer, writes = net.layers[1], path == "winograd"
    assert producer.wchunk < batch or not writes
    assert producer.winograd == writes and net.layers[2].average_into is net.layers[3]
    assert (producer.means_into is net.layers[2]) == writes
    net._arena[...] = np.nan
    for _ in range(2):
        np.testing.assert_allclose(net.forward(x), ref, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(net.layers[3].output, pooled, rtol=2e-5, atol=1e-6)
    assert bool(averaged) != writes
    if writes:                              # the maps themselves were never written
        assert np.isnan(producer.output).all()
    net.unshare_outputs()
