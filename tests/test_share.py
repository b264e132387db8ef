"""`share_index`: a convolution using another's weights. The shared weights receive the sum of
both layers' gradients (float64 central differences of the whole network), one update steps
them, and the .weights file stores them once."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy.errors import CfgError
from darkpy.layers.base import State
from darkpy.layers.share import SharedConvolutionalLayer
from darkpy.network import network_from_text
from helpers import assert_close, numerical_grad

NET = "[net]\nbatch=2\nwidth=5\nheight=5\nchannels=3\nlearning_rate=0.1\nmomentum=0\ndecay=0\n"
TWO = (NET + "[convolutional]\nfilters=3\nsize=3\npad=1\nactivation=leaky\n"
       "[convolutional]\nfilters=3\nsize=3\nstride=2\npad=1\nactivation=linear\nshare_index=0\n")


def _backward_all(net, r):
    """Network backward from L = sum(r · last output), without a cost layer."""
    for layer in net.layers:
        layer.delta.fill(0)
        for p in layer.params:
            p.grad.fill(0)
    net.layers[-1].delta[...] = -r
    for i in range(len(net.layers) - 1, -1, -1):
        prev = net.layers[i - 1] if i else None
        net.layers[i].backward(State(input=prev.output if prev else net.input,
                                     delta=prev.delta if prev else None, truth=None, train=True,
                                     layers=net.layers))


def test_shared_weights_get_the_sum_of_both_gradients():
    net = network_from_text(TWO, dtype=np.float64)
    a, b = net.layers
    assert isinstance(b, SharedConvolutionalLayer) and b.weights is a.weights and b.params == []
    assert b.out_shape == (3, 3, 3)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, net.input.shape)
    a.biases.value[...] = rng.normal(size=3)
    net.forward(x, train=True)
    net.allocate_training()
    r = rng.standard_normal(b.output.shape)
    _backward_all(net, r)

    def L():
        return float((net.forward(x, train=True) * r).sum())

    assert_close(a.weights.grad, -numerical_grad(L, a.weights.value), 1e-5, 1e-7, "shared weights")
    assert_close(a.biases.grad, -numerical_grad(L, a.biases.value), 1e-5, 1e-7, "shared biases")
    # the sum: a plain copy (its own weights) gets only its part, the rest is layer 0's
    own = network_from_text(TWO.replace("share_index=0\n", ""), dtype=np.float64)
    for la in own.layers:
        la.weights.value[...] = a.weights.value
        la.biases.value[...] = a.biases.value
    own.forward(x, train=True)
    own.allocate_training()
    _backward_all(own, r)
    assert_close(a.weights.grad, own.layers[0].weights.grad + own.layers[1].weights.grad, 1e-12, 1e-12, "sum")


def test_one_update_and_one_copy_in_the_weights_file(tmp_path):
    text = TWO.replace("activation=leaky", "activation=leaky\nbatch_normalize=1")
    text = text.replace("share_index=0", "share_index=-1\nbatch_normalize=1")
    net = network_from_text(text)
    a, b = net.layers
    assert b.bn.scales is a.bn.scales and b.bn.rolling_mean is a.bn.rolling_mean
    assert b.bn.mean is not a.bn.mean                      # batch statistics stay per layer
    net.save_weights(tmp_path / "s.weights")
    assert (tmp_path / "s.weights").stat().st_size == 20 + 4 * (3 * 4 + 81)
    other = network_from_text(text, seed=5)
    other.load_weights(tmp_path / "s.weights")
    assert np.array_equal(other.layers[1].weights.value, a.weights.value)
    before = a.weights.value.copy()
    a.weights.grad[...] = 1.0
    net.update(rate=0.1)
    assert_close(a.weights.value, before + 0.1 / net.config.full_batch, 1e-6, 1e-7, "stepped once")


@pytest.mark.parametrize("text,msg", [
    (NET + "[convolutional]\nfilters=3\nsize=3\n[convolutional]\nfilters=4\nsize=3\nshare_index=0\n",
     "size, filters and input channels must match"),
    (NET + "[maxpool]\nsize=1\nstride=1\n[convolutional]\nfilters=3\nshare_index=0\n", "must be a plain"),
    (NET + "[convolutional]\nfilters=3\nshare_index=0\n", "outside"),
])
def test_bad_share_index_is_a_located_error(text, msg):
    with pytest.raises(CfgError, match=msg) as e:
        network_from_text(text)
    assert e.value.key == "share_index"


def test_a_few_iterations_lower_the_loss():
    text = (NET.replace("batch=2", "batch=4") + "[convolutional]\nfilters=3\nsize=3\npad=1\nactivation=leaky\n"
            "[convolutional]\nfilters=3\nsize=3\npad=1\nactivation=leaky\nshare_index=0\n"
            "[convolutional]\nfilters=2\nsize=1\nactivation=linear\n[avgpool]\n[softmax]\n")
    net = network_from_text(text, seed=2)
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, net.input.shape).astype(np.float32)
    truth = np.eye(2, dtype=np.float32)[[0, 1, 1, 0]]
    x[[0, 3], 0] += 1
    losses = []
    for _ in range(30):
        net.forward(x, truth, train=True)
        losses.append(net.cost)
        net.backward()
        net.update()
    assert np.mean(losses[-3:]) < 0.5 * losses[0], losses
