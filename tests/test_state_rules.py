"""The state rules of DESIGN §4, each tried the way a user would break it.

1. truth before backward; a forward without truth leaves no stale cost/loss readable;
2. deltas accumulate: every layer ADDS into its producer's delta, and an output read by several
   layers (route + shortcut + the next layer) receives the sum of all paths;
4. set_batch and resize reallocate every buffer and invalidate the truth flag;
5. the cost is reported as Darknet's sum and as the mean per element.
"""
from __future__ import annotations

import numpy as np
import pytest

from darkpy import StateError
from darkpy.layers.base import Param, State
from darkpy.network import network_from_text
from helpers import assert_close, numerical_grad

HEAD = "[net]\nbatch={batch}\nwidth=5\nheight=4\nchannels=3\n\n[activation]\n\n"

LOSS_NETS = {
    "softmax": "[softmax]\ngroups=3\n",
    "cost": "[activation]\nactivation=tanh\n\n[cost]\ntype=sse\n",
    "logistic": "[logistic]\n",
}


def loss_net(kind, batch=2, dtype=np.float32):
    return network_from_text(HEAD.format(batch=batch) + LOSS_NETS[kind], dtype=dtype, seed=3)


def data(net, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, net.input.shape).astype(net.dtype)
    t = rng.uniform(0, 1, net.truth.shape).astype(net.dtype)
    return x, t


# -- rule 1: truth before backward ---------------------------------------------------------------------
def test_backward_before_any_forward_raises():
    with pytest.raises(StateError, match="truth"):
        loss_net("softmax").backward()


@pytest.mark.parametrize("kind", sorted(LOSS_NETS))
def test_backward_after_a_forward_without_truth_raises(kind):
    net = loss_net(kind)
    x, t = data(net)
    net.forward(x, t, train=True)
    net.forward(x, train=True)                      # training forward, but no truth
    with pytest.raises(StateError):
        net.backward()


def test_backward_after_an_inference_forward_with_truth_raises():
    net = loss_net("cost")
    x, t = data(net)
    net.forward(x, t, train=False)
    with pytest.raises(StateError):
        net.backward()


def test_a_second_backward_needs_a_new_forward():
    net = loss_net("logistic")
    x, t = data(net)
    net.forward(x, t, train=True)
    net.backward()
    with pytest.raises(StateError):
        net.backward()


@pytest.mark.parametrize("kind", sorted(LOSS_NETS))
def test_forward_without_truth_leaves_no_stale_cost(kind):
    net = loss_net(kind)
    x, t = data(net)
    net.forward(x, t, train=True)
    layer = net.layers[-1]
    assert isinstance(layer.cost, float) and layer.cost > 0 and layer.loss.any() and layer.delta.any()
    assert net.cost is not None and net.cost_mean is not None
    net.forward(x)                                  # inference, no truth (darknet keeps the old values)
    assert layer.cost is None and net.cost is None and net.cost_mean is None
    assert not layer.loss.any() and not layer.delta.any()
    if kind == "cost":
        assert not layer.output.any()               # the cost layer's output is its error


# -- rule 2: deltas accumulate ----------------------------------------------------------------------------
FAMILIES = {
    "activation": "[activation]\nactivation=tanh\n",
    "maxpool": "[maxpool]\nsize=3\nstride=1\n",
    "local_avgpool": "[local_avgpool]\nsize=2\nstride=2\n",
    "avgpool": "[avgpool]\n",
    "dropout": "[dropout]\nprobability=0.4\n",
    "l2norm": "[l2norm]\n",
    "lrn": "[lrn]\nsize=3\nalpha=0.1\n",
    "softmax": "[softmax]\n",
    "cost": "[cost]\n",
    "logistic": "[logistic]\n",
}


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_backward_adds_into_the_previous_delta(kind):
    net = network_from_text(HEAD.format(batch=2) + FAMILIES[kind], dtype=np.float64, seed=1)
    x, t = data(net, 5)
    net.forward(x, t, train=True)
    layer, prev = net.layers[1], net.layers[0]
    if not layer.has_cost:
        layer.delta[...] = np.random.default_rng(2).standard_normal(layer.delta.shape)

    def backward():
        layer.backward(State(input=prev.output, delta=prev.delta, truth=net.truth, train=True,
                             layers=net.layers, net=net))
    prev.delta.fill(0)
    backward()
    alone = prev.delta.copy()
    assert alone.any()
    prev.delta.fill(0.5)
    backward()
    assert_close(prev.delta, alone + 0.5, 1e-12, 1e-12, f"[{kind}] must add, not overwrite")


SHARED_SOURCE = HEAD.format(batch=2) + """[activation]
activation=tanh

[activation]
activation=logistic

[shortcut]
from=1
activation=linear

[route]
layers=1,3

[cost]
type=sse
"""


def test_an_output_read_three_times_gets_the_sum_of_all_paths():
    """Layer 1 feeds layer 2 (next layer), the shortcut (from=1) and the route (layers=1,3). After
    backward, the input holder's delta must be the full negative gradient of the sse/2."""
    net = network_from_text(SHARED_SOURCE, dtype=np.float64)
    x, t = data(net, 7)
    net.forward(x, t, train=True)
    net.backward()
    analytic = net.layers[0].delta.copy()

    def half_sse():
        net.forward(x, t, train=True)
        return 0.5 * net.layers[-1].cost
    num = numerical_grad(half_sse, x)
    assert_close(analytic, -num, 1e-6, 1e-9, "delta of a layer with three consumers")


# -- rule 4: set_batch and resize reallocate -----------------------------------------------------------------
EVERYTHING = HEAD.format(batch=2) + "".join(f"{FAMILIES[k]}\n" for k in (
    "activation", "maxpool", "lrn", "l2norm", "local_avgpool", "dropout", "avgpool", "softmax", "cost"))


def buffers(layer):
    """Every array a layer holds that is not a parameter."""
    params = {id(p.value) for p in layer.params} | {id(p.grad) for p in layer.params}
    return {name: v for name, v in vars(layer).items()
            if isinstance(v, np.ndarray) and id(v) not in params and not isinstance(v, Param)}


def assert_sized(net, batch):
    assert net.input.shape == (batch, *net.input_shape) and net.truth.shape[0] == batch
    for layer in net.layers:
        assert layer.output.shape == (batch, *layer.out_shape), layer
        # training-only buffers are dropped until the next training forward (tests/test_lazy_buffers.py)
        assert layer.delta.size == 0, layer
        if layer.loss is not None:
            assert layer.loss.size == 0 or layer.loss is layer.output, layer
        for name, arr in buffers(layer).items():
            assert arr.size == 0 or arr.shape[0] == batch, f"{layer} .{name} {arr.shape} at batch {batch}"


def test_set_batch_reallocates_every_buffer_and_forgets_the_truth():
    net = network_from_text(EVERYTHING)
    x, t = data(net)
    net.forward(x, t, train=True)
    net.set_batch(3)
    assert_sized(net, 3)
    with pytest.raises(StateError):
        net.backward()
    x3, t3 = data(net, 1)
    net.forward(x3, t3, train=True)
    net.backward()
    assert net.layers[0].delta.shape == (3, 3, 4, 5)


def test_resize_reallocates_and_matches_a_network_built_at_that_size():
    net = network_from_text(EVERYTHING)
    x, t = data(net)
    net.forward(x, t, train=True)
    net.resize(9, 6)
    assert_sized(net, 2)
    with pytest.raises(StateError):
        net.backward()
    fresh = network_from_text(EVERYTHING.replace("width=5\nheight=4", "width=9\nheight=6"))
    assert [l.out_shape for l in net.layers] == [l.out_shape for l in fresh.layers]
    assert net.layers[2].indexes.size == 0     # maxpool's argmaxes: dropped, sized by a training forward
    x9, t9 = data(fresh, 2)
    np.testing.assert_array_equal(net.forward(x9, t9), fresh.forward(x9, t9))
    assert net.cost == fresh.cost
    net.forward(x9, t9, train=True)
    assert net.layers[2].indexes.shape == (2, 3, 6, 9)


# -- rule 5: cost and cost_mean ----------------------------------------------------------------------------
def test_cost_mean_is_the_cost_per_element_for_one_cost_layer():
    net = loss_net("cost", batch=3)
    x, t = data(net)
    net.forward(x, t, train=True)
    layer = net.layers[-1]
    assert net.cost == layer.cost
    assert net.cost_mean == pytest.approx(layer.cost / (3 * layer.outputs), rel=1e-12)


def test_two_cost_layers_average_like_darknet():
    net = network_from_text(HEAD.format(batch=2) + "[softmax]\n\n[cost]\n", dtype=np.float64)
    x, t = data(net)
    t /= t.sum(axis=1, keepdims=True)
    net.forward(x, t, train=True)
    soft, cost = net.layers[1], net.layers[2]
    assert net.cost == pytest.approx((soft.cost + cost.cost) / 2, rel=1e-12)
    assert net.cost_mean == pytest.approx((soft.cost / (2 * 60) + cost.cost / (2 * 60)) / 2, rel=1e-12)
