"""[logistic] (LOGXENT): Darknet golden with multi-label truth, float64 gradient check of the binary
cross-entropy, finite loss on saturated logits."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy.network import network_from_text
from helpers import assert_close
from layer_checks import check_loss, check_loss_alone, check_outputs, loss_gradcheck, run_golden, run_standalone

CFG = "[net]\nbatch={batch}\nwidth=3\nheight=1\nchannels=2\n\n[activation]\n\n[logistic]\n"


def test_logistic_golden_whole_network():
    net, d = run_golden("logistic_xent")
    check_outputs(net, d)
    check_loss(net, d)


def test_logistic_golden_alone():
    check_loss_alone(run_standalone("logistic_xent", 2, 1), "logistic_xent", 2)


def test_forward_loss_and_delta_match_the_formulas():
    net = network_from_text(CFG.format(batch=2), dtype=np.float64)
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, net.input.shape)
    t = rng.uniform(0, 1, net.truth.shape)
    net.forward(x, t, train=True)
    layer = net.layers[1]
    p = 1 / (1 + np.exp(-x))
    assert layer.out_shape == (2, 1, 3)
    assert_close(layer.output, p, 1e-12, 1e-15, "output")
    t = t.reshape(p.shape)
    assert_close(layer.loss, -t * np.log(p) - (1 - t) * np.log(1 - p), 1e-10, 1e-15, "loss")
    assert_close(layer.delta, t - p, 1e-12, 1e-15, "delta")
    assert isinstance(layer.cost, float) and layer.cost == pytest.approx(layer.loss.sum(), rel=1e-12)


def test_gradcheck():
    """delta = t - p is exactly -d cost / d logits for any t in [0, 1] (multi-label)."""
    t = np.random.default_rng(1).uniform(0, 1, (2, 6))
    t[0, :3] = [0, 1, 1]
    loss_gradcheck(CFG.format(batch=2), t, input_range=(-3, 3))


def test_saturated_logits_give_a_finite_loss():
    net = network_from_text(CFG.format(batch=1))          # float32: sigmoid(40) rounds to exactly 1
    net.forward(np.array([[40.0, -40.0, 0.0, 20.0, -20.0, 5.0]], np.float32),
                np.array([[0.0, 1.0, 1.0, 1.0, 0.0, 1.0]], np.float32), train=True)
    loss = net.layers[1].loss.reshape(-1)
    assert np.isfinite(loss).all()
    assert loss[:2] == pytest.approx([40.0, 40.0], rel=1e-6)
