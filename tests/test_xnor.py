"""`xnor=1` / `binary=1` convolutions (AlexeyAB's XNOR nets): forward against a float64 numpy
reference, the straight-through backward against float64 central differences of the function it
stands for, weights layout, the shared cfgs, and a few training steps that lower the loss."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy.errors import CfgError
from darkpy.layers.base import State
from darkpy.layers.xnor import XnorConvolutionalLayer
from darkpy.network import network_from_text
from helpers import assert_close, numerical_grad
from test_conv import ACT, ref_conv_raw

NET = "[net]\nbatch=2\nwidth=5\nheight=4\nchannels=3\n"


def ref_binary_weights(w):
    w = np.asarray(w, np.float64)
    mean = np.abs(w).reshape(w.shape[0], -1).mean(axis=1)[:, None, None, None]
    return np.where(w > 0, mean, -mean)


def ref_forward(layer, x):
    """Inference output of an xnor/binary layer from its parameters, float64."""
    wb = ref_binary_weights(layer.weights.value)
    xb = np.where(x >= 0, 1.0, -1.0) if layer.xnor else np.asarray(x, np.float64)
    out = []
    for item in xb:
        raw = ref_conv_raw(item, wb, layer.stride_y, layer.stride_x, layer.padding, 1, 1)
        if layer.bn is not None:
            bn = layer.bn
            raw = (bn.scales.value[:, None, None] * (raw - bn.rolling_mean[:, None, None])
                   / np.sqrt(bn.rolling_variance[:, None, None] + 1e-5))
        out.append(ACT[layer.activation](raw + layer.biases.value[:, None, None]))
    return np.stack(out)


@pytest.mark.parametrize("conv", [
    "xnor=1\nsize=3\npad=1\nactivation=linear",
    "xnor=1\nbin_output=1\nsize=3\nstride=2\nbatch_normalize=1\nactivation=leaky",
    "binary=1\nsize=1\nactivation=linear",
])
def test_forward_matches_numpy_reference(conv):
    net = network_from_text(NET + f"[convolutional]\nfilters=4\n{conv}\n", dtype=np.float64)
    layer = net.layers[0]
    assert isinstance(layer, XnorConvolutionalLayer)
    rng = np.random.default_rng(3)
    layer.biases.value[...] = rng.normal(size=4)
    if layer.bn is not None:
        layer.bn.rolling_mean[...] = rng.normal(size=4)
        layer.bn.rolling_variance[...] = rng.uniform(0.5, 2, size=4)
        layer.bn.scales.value[...] = rng.uniform(0.5, 2, size=4)
    x = rng.uniform(-1, 1, net.input.shape)
    real = layer.weights.value.copy()
    got = net.forward(x)
    assert_close(got, ref_forward(layer, x), 1e-12, 1e-12, "xnor forward")
    assert np.array_equal(layer.weights.value, real)       # the real weights are kept
    # binarised: the output depends on the input's signs only (xnor), not its magnitudes
    if layer.xnor:
        assert_close(net.forward(x * 0.3).copy(), ref_forward(layer, x), 1e-12, 1e-12, "sign only")


def _surrogate_check(conv: str, seed: int = 0):
    """The STE backward is the exact gradient of the convolution through the binarised weights
    and inputs; checked by central differences of L = sum(r · conv(W', x')) around W' = Wb, x' = xb
    (float64), with the input gradient masked by hardtanh's gradient of the real input."""
    net = network_from_text(NET + f"[convolutional]\nfilters=3\n{conv}\nactivation=linear\n",
                            dtype=np.float64)
    layer = net.layers[0]
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.5, 1.5, net.input.shape)
    net.forward(x, train=True)
    net.allocate_training()
    r = rng.standard_normal(layer.output.shape)
    prev_delta = np.zeros_like(x)
    layer.delta[...] = -r
    layer.weights.grad.fill(0)
    layer.biases.grad.fill(0)
    layer.backward(State(input=net.input, delta=prev_delta, truth=None, train=True, layers=net.layers))

    wb = ref_binary_weights(layer.weights.value)
    xb = np.where(x >= 0, 1.0, -1.0) if layer.xnor else x.copy()
    b = layer.biases.value.astype(np.float64)

    def L():
        return float(sum((r[i] * (ref_conv_raw(xb[i], wb, layer.stride_y, layer.stride_x, layer.padding,
                                               1, 1) + b[:, None, None])).sum() for i in range(len(x))))

    assert_close(layer.weights.grad, -numerical_grad(L, wb), 1e-6, 1e-8, "weights grad (STE)")
    assert_close(layer.biases.grad, -numerical_grad(L, b), 1e-6, 1e-8, "bias grad")
    dx = -numerical_grad(L, xb)
    if layer.xnor:
        dx *= (x > -1) & (x < 1)
    assert_close(prev_delta, dx, 1e-6, 1e-8, "input delta (STE)")
    return layer, x, prev_delta


@pytest.mark.parametrize("conv", ["xnor=1\nsize=3\npad=1", "xnor=1\nsize=2\nstride=2",
                                  "binary=1\nsize=3\npad=1"])
def test_straight_through_backward_is_the_binarised_convolutions_gradient(conv):
    layer, x, prev_delta = _surrogate_check(conv)
    if layer.xnor:
        outside = (x <= -1) | (x >= 1)
        assert outside.any() and np.all(prev_delta[outside] == 0)


def test_backward_adds_into_the_previous_delta():
    net = network_from_text(NET + "[convolutional]\nfilters=2\nsize=3\npad=1\nxnor=1\nactivation=linear\n",
                            dtype=np.float64)
    layer = net.layers[0]
    x = np.random.default_rng(1).uniform(-0.9, 0.9, net.input.shape)
    net.forward(x, train=True)
    net.allocate_training()
    layer.delta[...] = 1
    d1 = np.zeros_like(x)
    layer.backward(State(input=net.input, delta=d1, truth=None, train=True, layers=net.layers))
    d2 = np.full_like(x, 5.0)
    layer.backward(State(input=net.input, delta=d2, truth=None, train=True, layers=net.layers))
    assert_close(d2, d1 + 5, 1e-12, 1e-12, "accumulates")


def test_weights_layout_and_summary(tmp_path):
    text = NET + "[convolutional]\nfilters=4\nsize=3\npad=1\nbatch_normalize=1\nxnor=1\n"
    net = network_from_text(text)
    layer = net.layers[0]
    arrays = layer.weight_arrays()
    assert [a.size for a in arrays] == [4, 4, 4, 4, 4 * 3 * 9]     # plain conv: real weights stored
    net.save_weights(tmp_path / "x.weights")
    other = network_from_text(text, seed=7)
    other.load_weights(tmp_path / "x.weights")
    assert np.array_equal(other.layers[0].weights.value, layer.weights.value)
    assert layer.summary().startswith("convX")
    assert layer.flops() == pytest.approx(2 * 4 * 27 * 20 / 32)


def test_xnor_with_groups_is_refused():
    with pytest.raises(CfgError, match="xnor=1 with groups > 1") as e:
        network_from_text("[net]\nwidth=4\nheight=4\nchannels=4\n[convolutional]\nfilters=4\ngroups=2\nxnor=1\n")
    assert e.value.key == "groups"


def test_a_few_iterations_lower_the_loss():
    text = ("[net]\nbatch=8\nwidth=6\nheight=6\nchannels=2\nlearning_rate=0.05\nmomentum=0.9\ndecay=0\n"
            "[convolutional]\nfilters=6\nsize=3\npad=1\nbatch_normalize=1\nactivation=leaky\n"
            "[convolutional]\nfilters=8\nsize=3\npad=1\nbatch_normalize=1\nxnor=1\nactivation=leaky\n"
            "[convolutional]\nfilters=2\nsize=1\nactivation=linear\n"
            "[avgpool]\n[softmax]\n")
    net = network_from_text(text, seed=1)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, net.input.shape).astype(np.float32)
    labels = (x[:, 0].mean(axis=(1, 2)) > x[:, 1].mean(axis=(1, 2))).astype(int)
    x[np.arange(8), labels] += 0.5
    truth = np.eye(2, dtype=np.float32)[labels]
    losses = []
    for _ in range(25):
        net.forward(x, truth, train=True)
        losses.append(net.cost)
        net.backward()
        net.update()
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:3]), losses
