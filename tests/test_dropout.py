"""[dropout]: Darknet golden (inference = identity), training statistics, float64 gradient check."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy import CfgError
from darkpy.layers.base import State
from darkpy.network import network_from_text
from helpers import layer_gradcheck
from layer_checks import check_outputs, run_golden, run_standalone


def test_dropout_golden_whole_network():
    net, d = run_golden("dropout")
    check_outputs(net, d)


@pytest.mark.parametrize("index,source", [(1, 0), (4, 3)])
def test_dropout_golden_alone(index, source):
    run_standalone("dropout", index, source)


def drop_net(p=0.3, batch=4, c=3, h=10, w=10, dtype=np.float32):
    return network_from_text(f"[net]\nbatch={batch}\nwidth={w}\nheight={h}\nchannels={c}\n\n[activation]\n\n"
                             f"[dropout]\nprobability={p}\n", dtype=dtype, seed=5)


def test_training_drops_about_p_and_scales_the_rest():
    net = drop_net(p=0.3)
    x = np.random.default_rng(1).uniform(0.5, 1.5, net.input.shape).astype(np.float32)
    out = net.forward(x, train=True)
    dropped = out == 0
    assert abs(dropped.mean() - 0.3) < 0.05          # 1200 draws: 5 sigma is ~0.066
    np.testing.assert_allclose(out[~dropped], x[~dropped] / np.float32(0.7), rtol=1e-6)
    np.testing.assert_array_equal(net.layers[0].output, x)   # the previous output is not touched


def test_masks_differ_between_training_steps_and_inference_is_identity():
    net = drop_net(p=0.5)
    x = np.ones(net.input.shape, np.float32)
    a = net.forward(x, train=True).copy()
    b = net.forward(x, train=True).copy()
    assert not np.array_equal(a == 0, b == 0)
    np.testing.assert_array_equal(net.forward(x, train=False), x)


def test_default_probability_is_half():
    net = network_from_text("[net]\ninputs=4\n\n[dropout]\n")
    assert net.layers[0].probability == 0.5 and net.layers[0].out_shape == (4,)


def test_gradcheck_training_mask():
    # layer_gradcheck re-seeds State.rng for every forward, so the mask is fixed while it perturbs
    net = layer_gradcheck("[net]\nbatch=2\nwidth=4\nheight=3\nchannels=2\n\n[activation]\n\n"
                          "[dropout]\nprobability=0.4\n", 1, train=True)
    assert (net.layers[1].output == 0).any() and (net.layers[0].output != 0).all()


def test_backward_after_inference_forward_is_identity():
    net = drop_net(p=0.5, dtype=np.float64)
    x = np.random.default_rng(2).uniform(-1, 1, net.input.shape)
    net.forward(x, train=False)
    net.allocate_training()                 # the deltas a training forward would have sized
    layer = net.layers[1]
    layer.delta[...] = x
    net.layers[0].delta.fill(1.0)
    layer.backward(State(input=net.layers[0].output, delta=net.layers[0].delta, truth=None, train=False,
                         layers=net.layers))
    np.testing.assert_array_equal(net.layers[0].delta, 1.0 + x)


@pytest.mark.parametrize("p", ["1", "-0.1", "1.5"])
def test_probability_out_of_range_is_an_error(p):
    with pytest.raises(CfgError, match="probability"):
        network_from_text(f"[net]\ninputs=4\n\n[dropout]\nprobability={p}\n")
