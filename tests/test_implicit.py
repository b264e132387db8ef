"""`[implicit]` (AlexeyAB) and the YOLOR dialect: `[implicit_add]`, `[implicit_mul]`,
`[shift_channels]`, `[control_channels]`, its `[reorg]` (Focus) and `activation=silu`.
Forward against float64 numpy references, backward against float64 central differences, the
weights layout, and a tiny YOLOR-style network whose loss a few iterations lower."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy.errors import CfgError
from darkpy.layers.yolor import FocusLayer
from darkpy.network import network_from_text
from helpers import assert_close, layer_gradcheck

IMG = "[net]\nbatch=2\nwidth=4\nheight=4\nchannels=3\n"


def test_implicit_is_its_weights_whatever_the_input():
    net = network_from_text(IMG + "[implicit]\nfilters=5\natoms=2\nmean=1\nstd=0.1\n", dtype=np.float64)
    layer = net.layers[0]
    assert layer.out_shape == (5, 2, 1) and [a.size for a in layer.weight_arrays()] == [10]
    w = layer.weights.value
    assert np.all(np.abs(w - 1) <= 0.1) and w.std() > 0        # mean + uniform(-std, std)
    out = net.forward(np.random.default_rng(0).normal(size=net.input.shape)).copy()
    assert_close(out, np.broadcast_to(w, out.shape), 0, 0, "implicit forward")
    assert_close(net.forward(np.zeros(net.input.shape)), out, 0, 0, "input ignored")


def test_implicit_negative_std_is_its_magnitude():
    """Darknet's rand_uniform swaps reversed bounds: std=-0.5 draws from [mean - 0.5, mean + 0.5]
    (the fuzz test found numpy refusing it)."""
    net = network_from_text(IMG + "[implicit]\nfilters=400\nmean=2\nstd=-0.5\n", seed=0)
    w = net.layers[0].weights.value
    assert 1.5 <= w.min() < 1.6 and 2.4 < w.max() <= 2.5


def test_implicit_gradcheck():
    net = layer_gradcheck(IMG + "[maxpool]\nsize=1\nstride=1\n[implicit]\nfilters=3\n", 1)
    assert np.all(net.layers[0].delta == 0)       # no gradient into the input


def test_yolor_implicit_inits_and_defaults():
    net = network_from_text(IMG + "[implicit_add]\nfilters=400\n[implicit_mul]\nfilters=400\n", seed=0)
    a, m = net.layers[0].weights.value, net.layers[1].weights.value
    assert a.shape == m.shape == (400, 1, 1)
    assert abs(a.mean()) < 0.01 and abs(a.std() - 0.02) < 0.005
    assert abs(m.mean() - 1) < 0.01 and abs(m.std() - 0.02) < 0.005
    with pytest.raises(CfgError, match="missing required key") as e:
        network_from_text(IMG + "[implicit_add]\n")
    assert e.value.key == "filters"


YOLOR_HEAD = IMG + ("[convolutional]\nfilters=3\nsize=1\nactivation=linear\n"
                    "[implicit_add]\nfilters=3\n[implicit_mul]\nfilters=3\n[route]\nlayers=-3\n")


@pytest.mark.parametrize("op,ref", [("shift_channels", 1), ("control_channels", 2)])
def test_channel_ops_match_numpy_and_gradcheck(op, ref):
    text = YOLOR_HEAD + f"[{op}]\nfrom={ref}\n"
    net = network_from_text(text, dtype=np.float64)
    x = np.random.default_rng(2).normal(size=net.input.shape)
    net.forward(x)
    prev, vec = net.layers[3].output, net.layers[ref].output.reshape(2, 3, 1, 1)
    want = prev + vec if op == "shift_channels" else prev * vec
    assert_close(net.layers[4].output, want, 1e-15, 0, op)
    layer_gradcheck(text, 4)      # input and the implicit layer's output, by central differences


def test_channel_op_needs_one_value_per_channel():
    with pytest.raises(CfgError, match="needs one per input channel") as e:
        network_from_text(IMG + "[maxpool]\nsize=1\nstride=1\n[implicit_add]\nfilters=4\n[route]\nlayers=0\n"
                          "[shift_channels]\nfrom=1\n")
    assert e.value.key == "from"


def test_yolor_reorg_is_focus_and_darknets_reorg_is_untouched():
    text = "[net]\nbatch=1\nwidth=4\nheight=6\nchannels=2\n[reorg]\n[convolutional]\nfilters=2\nactivation=silu\n"
    net = network_from_text(text, dtype=np.float64)
    layer = net.layers[0]
    assert isinstance(layer, FocusLayer) and layer.out_shape == (8, 3, 2)
    assert net.layers[1].activation == "swish"
    x = np.arange(48, dtype=np.float64).reshape(1, 2, 6, 4)
    net.forward(x)
    want = np.concatenate([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1)
    assert_close(layer.output, want, 0, 0, "focus")
    layer_gradcheck(text, 0)
    # without the YOLOR dialect (no silu, no YOLOR section) a stride-less [reorg] is Darknet's
    plain = network_from_text(text.replace("activation=silu", "activation=linear"))
    assert not isinstance(plain.layers[0], FocusLayer) and plain.layers[0].out_shape == (2, 6, 4)


def test_silu_is_swish_and_unknown_activations_name_the_closest():
    net = network_from_text(IMG + "[convolutional]\nfilters=2\nactivation=silu\n")
    assert net.layers[0].activation == "swish"
    with pytest.raises(CfgError, match="did you mean 'swish'") as e:
        network_from_text(IMG + "[convolutional]\nfilters=2\nactivation=swsh\n")
    assert e.value.key == "activation"
    with pytest.raises(CfgError, match="did you mean 'silu'"):
        network_from_text(IMG + "[convolutional]\nfilters=2\nactivation=sllu\n")


def test_weights_round_trip(tmp_path):
    text = YOLOR_HEAD + "[shift_channels]\nfrom=1\n[control_channels]\nfrom=2\n"
    net = network_from_text(text, seed=1)
    net.save_weights(tmp_path / "y.weights")
    other = network_from_text(text, seed=2)
    other.load_weights(tmp_path / "y.weights")
    for a, b in zip(net.layers, other.layers):
        for x, y in zip(a.weight_arrays(), b.weight_arrays()):
            assert np.array_equal(x, y)
    assert (tmp_path / "y.weights").stat().st_size == 20 + 4 * (3 + 9 + 3 + 3)


def test_a_few_iterations_lower_the_loss():
    text = ("[net]\nbatch=4\nwidth=4\nheight=4\nchannels=2\nlearning_rate=0.1\nmomentum=0.9\ndecay=0\n"
            "[convolutional]\nfilters=3\nsize=3\npad=1\nactivation=silu\n"
            "[implicit_add]\nfilters=3\n[implicit_mul]\nfilters=3\n[implicit]\nfilters=3\n"
            "[route]\nlayers=0\n"
            "[shift_channels]\nfrom=1\n[control_channels]\nfrom=2\n[shift_channels]\nfrom=3\n"
            "[avgpool]\n[softmax]\n")
    net = network_from_text(text, seed=3)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, net.input.shape).astype(np.float32)
    truth = np.eye(3, dtype=np.float32)[[0, 1, 2, 0]]
    start = [layer.weights.value.copy() for layer in net.layers[1:4]]
    losses = []
    for _ in range(30):
        net.forward(x, truth, train=True)
        losses.append(net.cost)
        net.backward()
        net.update()
    assert np.mean(losses[-3:]) < 0.75 * losses[0], losses
    assert all(not np.array_equal(s, layer.weights.value) for s, layer in zip(start, net.layers[1:4]))
