"""[softmax]: Darknet goldens (groups, temperature, cross-entropy with soft labels), a numpy
reference, float64 gradient checks of the loss, cfg errors."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy import CfgError
from darkpy.network import network_from_text
from helpers import assert_close, numerical_grad
from layer_checks import check_loss, check_loss_alone, check_outputs, loss_gradcheck, run_golden, run_standalone


def ref_softmax(x, groups, temp):
    """x (B, n) -> softmax of x/temp over `groups` contiguous chunks, float64."""
    z = np.asarray(x, np.float64).reshape(x.shape[0], groups, -1) / temp
    e = np.exp(z - z.max(axis=2, keepdims=True))
    return (e / e.sum(axis=2, keepdims=True)).reshape(x.shape)


def soft_net(groups=1, temp=1.0, n=12, batch=2, extra=""):
    return network_from_text(f"[net]\nbatch={batch}\ninputs={n}\n\n[activation]\n\n"
                             f"[softmax]\ngroups={groups}\ntemperature={temp}\n{extra}", dtype=np.float64)


# -- goldens ----------------------------------------------------------------------------------------
def test_softmax_golden_whole_network():
    net, d = run_golden("softmax")
    check_outputs(net, d)


@pytest.mark.parametrize("index", [1, 3, 5, 7])
def test_softmax_golden_each_layer_alone(index):
    run_standalone("softmax", index, 0)


def test_softmax_xent_golden_whole_network():
    net, d = run_golden("softmax_xent")
    check_outputs(net, d)
    check_loss(net, d)


def test_softmax_xent_golden_alone():
    check_loss_alone(run_standalone("softmax_xent", 1, 0), "softmax_xent", 1)


# -- forward -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("groups,temp", [(1, 1.0), (3, 1.0), (4, 0.5), (2, 2.5), (12, 1.0)])
def test_forward_matches_reference(groups, temp):
    net = soft_net(groups, temp)
    x = np.random.default_rng(groups).uniform(-3, 3, net.input.shape)
    out = net.forward(x)
    assert net.layers[1].out_shape == (12,)
    assert_close(out, ref_softmax(x, groups, temp), 1e-12, 1e-15)


def test_output_is_flat_even_for_an_image_input():
    net = network_from_text("[net]\nwidth=2\nheight=2\nchannels=3\n\n[softmax]\n")
    assert net.layers[0].out_shape == (12,)


# -- loss ----------------------------------------------------------------------------------------------
def test_loss_is_minus_log_p_wherever_truth_is_nonzero():
    net = soft_net(groups=2, n=6, batch=1)
    x = np.array([[0.5, -1.0, 2.0, 0.1, 0.2, -0.3]])
    t = np.array([[0.25, 0.0, 0.75, 1.0, 0.0, 0.0]])
    net.forward(x, t, train=True)
    p = ref_softmax(x, 2, 1.0)
    layer = net.layers[1]
    expect = np.where(t != 0, -np.log(p), 0.0)       # not t * -log p: a 0.25 label counts fully
    assert_close(layer.loss, expect, 1e-12, 1e-15)
    assert_close(layer.delta, t - p, 1e-12, 1e-15)
    assert layer.cost == pytest.approx(expect.sum(), rel=1e-12)
    assert isinstance(layer.cost, float) and net.cost == pytest.approx(layer.cost)


@pytest.mark.parametrize("groups", [1, 3])
def test_gradcheck_one_hot(groups):
    """With one-hot truth per group and temperature 1, delta is exactly -d cost / d logits."""
    rng = np.random.default_rng(groups)
    t = np.zeros((2, groups, 12 // groups))
    for b in range(2):
        for g in range(groups):
            t[b, g, rng.integers(12 // groups)] = 1
    loss_gradcheck(f"[net]\nbatch=2\ninputs=12\n\n[activation]\n\n[softmax]\ngroups={groups}\n", t,
                   input_range=(-2, 2))


def test_delta_of_soft_labels_is_the_cross_entropy_gradient():
    """For soft labels summing to 1, delta = t - p is -d/dx of the textbook -sum t log p (Darknet's
    reported loss differs, see the rule above, but its gradient is this one)."""
    net = soft_net(groups=1, n=5, batch=1)
    x = np.random.default_rng(3).uniform(-2, 2, (1, 5))
    t = np.array([[0.1, 0.0, 0.6, 0.3, 0.0]])
    net.forward(x, t, train=True)

    def ce():
        return float(-(t * np.log(ref_softmax(x, 1, 1.0))).sum())
    assert_close(net.layers[1].delta, -numerical_grad(ce, x), 1e-7, 1e-9)


def test_backward_adds_delta_unchanged():
    net = soft_net(n=4, batch=1)
    x = np.array([[0.1, 0.2, 0.3, 0.4]])
    t = np.array([[0, 0, 1.0, 0]])
    net.forward(x, t, train=True)
    net.layers[0].delta.fill(1.0)
    net.backward()
    assert_close(net.layers[0].delta, 1.0 + (t - ref_softmax(x, 1, 1.0)), 1e-12, 1e-15)


def test_huge_logits_give_a_finite_loss():
    net = soft_net(n=3, batch=1)
    net.forward(np.array([[200.0, 0.0, -200.0]]), np.array([[0, 0, 1.0]]), train=True)
    assert net.layers[1].cost == pytest.approx(400.0)


def test_far_tails_keep_every_representable_probability():
    """Arguments of exp below float64's range give 0 without calling it; the float64 path still
    keeps probabilities down to its subnormals, and float32's its own."""
    x = np.array([[0.0, -700.0, -745.0, -746.5, -1e4, -90.0]])
    out = soft_net(n=6, batch=1).forward(x)
    assert out[0, 1] == np.exp(-700.0) and out[0, 2] == np.exp(-745.0) > 0
    assert out[0, 3] == out[0, 4] == 0.0 and out[0, 0] == 1.0
    out32 = network_from_text("[net]\nbatch=1\ninputs=6\n\n[softmax]\n").forward(x.astype(np.float32))
    assert out32.dtype == np.float32 and out32[0, 5] == np.float32(np.exp(-90.0)) > 0


def test_noloss_with_truth_has_zero_cost_and_no_delta():
    net = soft_net(n=4, batch=1, extra="noloss=1\n")
    net.forward(np.ones((1, 4)), np.array([[1.0, 0, 0, 0]]), train=True)
    assert net.layers[1].cost == 0.0 and not net.layers[1].delta.any() and not net.layers[1].loss.any()


# -- cfg errors ----------------------------------------------------------------------------------------
def test_tree_needs_its_file():     # the tree itself: tests/test_tree.py
    with pytest.raises(CfgError, match="no such tree file 'data/missing.tree'"):
        network_from_text("[net]\ninputs=4\n\n[softmax]\ntree=data/missing.tree\n")


def test_groups_must_divide_inputs():
    with pytest.raises(CfgError, match="groups"):
        network_from_text("[net]\ninputs=10\n\n[softmax]\ngroups=3\n")
