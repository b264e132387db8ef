"""Stand-alone [batchnorm] and the BN arithmetic shared with conv/connected (spec §2.14, §5).

Darknet's own [batchnorm] crashes on the CPU, so there is no golden; the tests compare with a numpy
reference of spec §5 and check the backward by central differences.
"""
from __future__ import annotations

import numpy as np
import pytest

from darkpy.layers.base import State
from darkpy.network import network_from_text
from helpers import assert_close, layer_gradcheck, numerical_grad

IMAGE = "[net]\nbatch=3\nwidth=4\nheight=3\nchannels=2\n[activation]\nactivation=linear\n[batchnorm]\n"
FLAT = "[net]\nbatch=4\ninputs=5\n[activation]\nactivation=linear\n[batchnorm]\n"


@pytest.mark.parametrize("text", [IMAGE, FLAT], ids=["image", "flat"])
def test_gradcheck(text):
    net = layer_gradcheck(text, 1)
    assert [p.name for p in net.layers[1].params] == ["biases", "scales"]


def test_gradcheck_with_nontrivial_scales():
    """γ ≠ 1, β ≠ 0 (the helper's fresh layer has γ = 1, β = 0): forward against the reference and
    backward against central differences, by hand."""
    net = network_from_text(IMAGE, dtype=np.float64)
    layer, prev = net.layers[1], net.layers[0]
    g, b = np.array([0.5, 2.0]), np.array([0.3, -0.7])
    layer.bn.scales.value[...], layer.biases.value[...] = g, b
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, net.input.shape)
    out = net.forward(x, train=True)
    e = lambda a: a[None, :, None, None]  # noqa: E731
    m, v = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3), ddof=1)
    assert_close(out, e(g) * (x - e(m)) / e(np.sqrt(v + 1e-5)) + e(b), 1e-12, 1e-12, "train forward")
    r = rng.standard_normal(out.shape)

    def loss():
        layer.forward(State(prev.output, None, None, True, net.layers))
        return float((layer.output * r).sum())

    num_x = numerical_grad(loss, prev.output)
    num_g = numerical_grad(loss, layer.bn.scales.value)
    num_b = numerical_grad(loss, layer.biases.value)
    loss()
    prev.delta.fill(0)
    layer.delta[...] = -r
    layer.backward(State(prev.output, prev.delta, None, True, net.layers))
    assert_close(prev.delta, -num_x, 1e-6, 1e-8, "input")
    assert_close(layer.bn.scales.grad, -num_g, 1e-6, 1e-8, "scales")
    assert_close(layer.biases.grad, -num_b, 1e-6, 1e-8, "biases")


def test_training_statistics_and_rolling_update():
    net = network_from_text(IMAGE, dtype=np.float64)
    layer = net.layers[1]
    layer.bn.rolling_mean[...] = [1.0, -1.0]
    layer.bn.rolling_variance[...] = [2.0, 0.5]
    x = np.random.default_rng(1).normal(3, 2, net.input.shape)
    net.forward(x, train=True)
    m = x.mean(axis=(0, 2, 3))
    v = x.var(axis=(0, 2, 3), ddof=1)                         # unbiased, N = batch·h·w
    assert_close(layer.bn.mean, m, 1e-12, 1e-12, "batch mean")
    assert_close(layer.bn.variance, v, 1e-12, 1e-12, "batch variance")
    assert_close(layer.bn.rolling_mean, 0.99 * np.array([1.0, -1.0]) + 0.01 * m, 1e-12, 1e-12, "rolling mean")
    assert_close(layer.bn.rolling_variance, 0.99 * np.array([2.0, 0.5]) + 0.01 * v, 1e-12, 1e-12,
                 "rolling variance")


@pytest.mark.parametrize("darknet_cpu", [False, True])
def test_inference_uses_rolling_statistics(darknet_cpu):
    net = network_from_text(IMAGE, dtype=np.float64)
    layer = net.layers[1]
    layer.darknet_cpu_bn = darknet_cpu
    rm, rv = np.array([0.2, -0.1]), np.array([1.5, 0.7])
    g, b = np.array([1.2, 0.8]), np.array([0.1, -0.3])
    layer.bn.rolling_mean[...], layer.bn.rolling_variance[...] = rm, rv
    layer.bn.scales.value[...], layer.biases.value[...] = g, b
    x = np.random.default_rng(2).uniform(-1, 1, net.input.shape)
    out = net.forward(x)
    den = np.sqrt(rv) + 1e-6 if darknet_cpu else np.sqrt(rv + 1e-5)
    e = lambda a: a[None, :, None, None]  # noqa: E731
    assert_close(out, e(g) * (x - e(rm)) / e(den) + e(b), 1e-12, 1e-12, "inference")
    assert_close(layer.bn.rolling_mean, rm, 0, 0, "rolling stats untouched at inference")


def test_backward_adds_into_previous_delta():
    """# darknet: its [batchnorm] backward overwrites the previous delta; darkpy adds."""
    net = network_from_text(IMAGE, dtype=np.float64)
    rng = np.random.default_rng(3)
    net.forward(rng.uniform(-1, 1, net.input.shape), train=True)
    layer, prev = net.layers[1], net.layers[0]
    d = rng.standard_normal(layer.delta.shape)
    layer.delta[...] = d
    layer.backward(State(prev.output, None, None, True, net.layers))
    expect = layer.delta.copy()
    net.forward(net.input, train=True)
    layer.delta[...] = d
    prev.delta[...] = 1.5
    layer.backward(State(prev.output, prev.delta, None, True, net.layers))
    assert_close(prev.delta, 1.5 + expect, 1e-12, 1e-12, "accumulated")


def test_file_layout_and_summary():
    net = network_from_text(IMAGE)
    layer = net.layers[1]
    arrays = layer.weight_arrays()
    assert [a.shape for a in arrays] == [(2,)] * 3
    assert arrays[0] is layer.bn.scales.value and arrays[1] is layer.bn.rolling_mean
    assert arrays[2] is layer.bn.rolling_variance
    assert (arrays[0] == 1).all() and (arrays[2] == 0).all()
    assert net.summary().splitlines()[2] == "    1 Batch Normalization Layer: 4 x 3 x 2 image"


def test_resize_keeps_channels():
    net = network_from_text(IMAGE)
    net.resize(7, 5)
    assert net.layers[1].out_shape == (2, 5, 7)
    out = net.forward(np.random.default_rng(0).uniform(-1, 1, (3, 2, 5, 7)).astype(np.float32), train=True)
    assert np.isfinite(out).all()
