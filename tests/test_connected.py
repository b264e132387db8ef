"""[connected]: Darknet goldens (plain and BN), a numpy reference, float64 gradient checks, layout."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy import CfgError, StateError, load_network
from darkpy.layers.base import State
from darkpy.network import network_from_text
from helpers import assert_close, golden_dir, layer_gradcheck, read_f32

ACT = {
    "linear": lambda x: x,
    "leaky": lambda x: np.where(x > 0, x, 0.1 * x),
    "relu": lambda x: np.maximum(x, 0),
    "logistic": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh,
}


def ref_connected(layer, x, darknet_cpu):
    """Inference output of a connected layer in float64; BN epsilon as Darknet's CPU or darkpy's."""
    z = np.asarray(x, np.float64).reshape(-1) @ layer.weights.value.astype(np.float64).T
    if layer.bn is not None:
        bn = layer.bn
        v = bn.rolling_variance.astype(np.float64)
        den = np.sqrt(v) + 1e-6 if darknet_cpu else np.sqrt(v + 1e-5)
        z = bn.scales.value * (z - bn.rolling_mean) / den
    return ACT[layer.activation](z + layer.biases.value)


def load_golden(name):
    d = golden_dir("forward", name)
    if not d.is_dir():
        pytest.skip(f"golden {d} missing")
    net = load_network(d / "net.cfg", d / "net.weights")
    x = read_f32(d / "input.f32").reshape(net.input.shape)
    return net, x, [read_f32(d / f"layer_{i:03d}.f32") for i in range(len(net.layers))]


@pytest.mark.parametrize("name", ["connected", "connected_bn"])
def test_golden_forward(name):
    """Whole network with Darknet's BN epsilon: every layer exact. With darkpy's epsilon each connected
    layer, fed Darknet's input, is within 1e-5 plus the bound the epsilon gap implies
    (|γ·(z − μ)|·|1/sqrt(v + 1e-5) − 1/(sqrt(v) + 1e-6)|, activations here are 1-Lipschitz)."""
    net, x, outs = load_golden(name)
    for layer in net.layers:
        layer.darknet_cpu_bn = True
    net.forward(x)
    for i, layer in enumerate(net.layers):
        assert_close(layer.output.reshape(-1), outs[i], 1e-5, 1e-5, f"{name} layer {i} (darknet eps)")
    for layer in net.layers:
        layer.darknet_cpu_bn = False
    for i, layer in enumerate(net.layers):
        if layer.kind != "connected":
            continue
        xin = outs[i - 1][None]
        layer.forward(State(input=xin, delta=None, truth=None, train=False, layers=net.layers))
        got = layer.output.reshape(-1)
        tol = 1e-5 + 1e-5 * np.abs(outs[i])
        if layer.bn is not None:
            bn = layer.bn
            z = xin.astype(np.float64) @ layer.weights.value.T.astype(np.float64)
            v = bn.rolling_variance.astype(np.float64)
            gap = np.abs(1 / np.sqrt(v + 1e-5) - 1 / (np.sqrt(v) + 1e-6))
            tol = tol + (np.abs(bn.scales.value * (z - bn.rolling_mean)) * gap).reshape(-1)
        err = np.abs(got - outs[i])
        assert (err <= tol).all(), f"{name} layer {i}: worst excess {(err - tol).max():.3g}"
        # and the numpy reference agrees with both conventions
        assert_close(ref_connected(layer, xin, True), outs[i], 1e-5, 1e-5, f"{name} ref {i} vs golden")
        assert_close(got, ref_connected(layer, xin, False), 1e-5, 1e-6, f"{name} darkpy {i} vs ref")


HOLDER = "[net]\nbatch=3\nwidth=3\nheight=2\nchannels=2\n[activation]\nactivation=linear\n"
CASES = ["output=5\nactivation=leaky", "output=4\nactivation=logistic", "output=1\nactivation=tanh",
         "output=4\nactivation=mish", "output=4\nactivation=swish",
         "output=5\nbatch_normalize=1\nactivation=leaky", "output=4\nbatch_normalize=1\nactivation=mish",
         "output=3\nbatch_normalize=1\nactivation=linear"]


@pytest.mark.parametrize("conn", CASES, ids=[c.replace("\n", ",") for c in CASES])
def test_gradcheck(conn):
    layer_gradcheck(HOLDER + f"[connected]\n{conn}\n", 1)


def test_gradcheck_after_conv_image_input():
    """A connected layer flattens a CHW image (the conv before it keeps its own layout)."""
    text = ("[net]\nbatch=2\nwidth=4\nheight=3\nchannels=2\n[convolutional]\nfilters=2\nsize=3\npad=1\n"
            "activation=linear\n[connected]\noutput=3\nbatch_normalize=1\nactivation=leaky\n")
    layer_gradcheck(text, 1)


def test_batch_one_bn_training_is_finite():
    """One row: N−1 = 0. darkpy guards the division (variance 0, x̂ 0) instead of producing NaN."""
    net = network_from_text("[net]\nbatch=1\ninputs=4\n[connected]\noutput=3\nbatch_normalize=1\n"
                            "activation=linear\n")
    out = net.forward(np.ones((1, 4), np.float32), train=True)
    assert np.isfinite(out).all()


def test_file_order_and_params():
    net = network_from_text("[net]\ninputs=7\n[connected]\noutput=5\nbatch_normalize=1\n")
    layer = net.layers[0]
    arrays = layer.weight_arrays()
    assert [a.shape for a in arrays] == [(5,), (5, 7), (5,), (5,), (5,)]
    assert arrays[1] is layer.weights.value and arrays[2] is layer.bn.scales.value
    assert [(p.name, p.decay) for p in layer.params] == [("biases", False), ("weights", True),
                                                         ("scales", False)]
    w = layer.weights.value
    assert np.abs(w).max() <= np.sqrt(2 / 7) and w.std() > 0.2 * np.sqrt(2 / 7)
    assert layer.activation == "logistic"           # darknet's default
    assert layer.flops() == 2 * 7 * 5
    assert net.summary().splitlines()[1] == "    0 connected                               7  ->     5"


def test_not_resizable_and_bad_output():
    net = network_from_text("[net]\nwidth=4\nheight=4\nchannels=1\n[connected]\noutput=2\n")
    with pytest.raises(CfgError, match="cannot resize"):
        net.resize(6, 6)
    with pytest.raises(CfgError, match=">= 1"):
        network_from_text("[net]\ninputs=3\n[connected]\noutput=0\n")


def test_bn_backward_needs_training_forward():
    net = network_from_text(HOLDER + "[connected]\noutput=2\nbatch_normalize=1\n")
    net.forward(np.zeros(net.input.shape, np.float32))
    layer = net.layers[1]
    with pytest.raises(Exception, match="training-mode forward"):
        layer.backward(State(net.layers[0].output, net.layers[0].delta, None, True, net.layers))
    with pytest.raises(StateError):
        net.backward()
