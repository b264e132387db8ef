"""`[conv_lstm]`: forward against a float64 numpy reference of the recurrence, BPTT against central
differences, the .weights order, refusals, and a few training steps that lower a loss."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy.errors import CfgError
from darkpy.layers.conv_lstm import ORDER, ConvLSTMLayer
from darkpy.network import network_from_text
from helpers import assert_close, layer_gradcheck
from test_conv import ref_conv_raw

NET = "[net]\nbatch=2\ntime_steps=3\nwidth=3\nheight=4\nchannels=2\n"
LAYER = "[conv_lstm]\noutput=3\nsize=3\npad=1\n"


def _sig(x):
    return 1 / (1 + np.exp(-x))


def ref_forward(layer, x):
    steps, b = layer.steps, layer.seq_batch
    inner = {i.name: i.layer for i in layer.inner}

    def conv(name, v):
        L = inner[name]
        return np.stack([ref_conv_raw(item, L.weights.value, 1, 1, L.padding, 1, 1) for item in v]) + \
            L.biases.value[None, :, None, None]

    xs = x.reshape(steps, b, *layer.in_shape)
    h = np.zeros((b, *layer.out_shape))
    c = np.zeros_like(h)
    out = []
    for t in range(steps):
        f = _sig(conv("wf", h) + conv("uf", xs[t]))
        i = _sig(conv("wi", h) + conv("ui", xs[t]))
        g = np.tanh(conv("wg", h) + conv("ug", xs[t]))
        o = _sig(conv("wo", h) + conv("uo", xs[t]))
        c = f * c + i * g
        h = o * np.tanh(c)
        out.append(h)
    return np.concatenate(out)


def test_forward_matches_numpy_reference():
    net = network_from_text(NET + LAYER, dtype=np.float64)
    layer = net.layers[0]
    assert isinstance(layer, ConvLSTMLayer) and layer.out_shape == (3, 4, 3)
    rng = np.random.default_rng(0)
    for inner in layer.inner:
        inner.layer.biases.value[...] = rng.normal(scale=0.3, size=3)
    x = rng.normal(size=net.input.shape)
    assert_close(net.forward(x), ref_forward(layer, x), 1e-10, 1e-12, "conv_lstm")


@pytest.mark.parametrize("extra", ["", "batch_normalize=1\n"])
def test_bptt_gradcheck(extra):
    layer_gradcheck(NET + "[convolutional]\nfilters=2\nsize=1\nactivation=linear\n" + LAYER + extra, 1,
                    rtol=1e-5, atol=1e-7)


def test_weights_order_is_alexeyabs(tmp_path):
    net = network_from_text(NET + LAYER, seed=1)
    layer = net.layers[0]
    by_name = {i.name: i.layer for i in layer.inner}
    want = np.concatenate([a.reshape(-1) for n in ORDER for a in by_name[n].weight_arrays()])
    net.save_weights(tmp_path / "c.weights")
    assert np.array_equal(np.fromfile(tmp_path / "c.weights", "<f4")[5:], want.astype("<f4"))
    other = network_from_text(NET + LAYER, seed=2)
    other.load_weights(tmp_path / "c.weights")
    assert all(np.array_equal(a, b) for a, b in zip(layer.weight_arrays(), other.layers[0].weight_arrays()))


@pytest.mark.parametrize("extra,key", [("peephole=1\n", "peephole"), ("stride=2\n", "stride"),
                                       ("lstm_activation=relu\n", "lstm_activation")])
def test_unsupported_options_are_refused(extra, key):
    with pytest.raises(CfgError) as e:
        network_from_text(NET + LAYER + extra)
    assert e.value.key == key
    with pytest.raises(CfgError, match="keep the 3x4 size") as e:
        network_from_text(NET + "[conv_lstm]\noutput=3\nsize=3\n")


def test_a_few_iterations_lower_the_loss():
    text = ("[net]\nbatch=4\ntime_steps=2\nwidth=3\nheight=3\nchannels=1\nlearning_rate=0.3\nmomentum=0.5\n"
            "decay=0\n[conv_lstm]\noutput=4\nsize=3\npad=1\n[convolutional]\nfilters=2\nsize=1\n"
            "activation=linear\n[avgpool]\n[softmax]\n")
    net = network_from_text(text, seed=0)
    rng = np.random.default_rng(5)
    x = rng.normal(size=net.input.shape).astype(np.float32)
    truth = np.zeros((8, 2), np.float32)
    truth[:4, 0] = 1
    truth[4:] = np.eye(2, dtype=np.float32)[(x[:4].mean(axis=(1, 2, 3)) > 0).astype(int)]
    losses = []
    for _ in range(30):
        net.forward(x, truth, train=True)
        losses.append(net.cost)
        net.backward()
        net.update()
    assert np.mean(losses[-3:]) < 0.6 * losses[0], losses
