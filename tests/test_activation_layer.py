"""[activation]: Darknet golden for all 14 activations, float64 gradient checks, cfg handling."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy import CfgError
from darkpy.kernels.activations import NAMES
from darkpy.network import network_from_text
from helpers import layer_gradcheck
from layer_checks import check_outputs, run_golden, run_standalone

ACT_ALL = ["linear", "logistic", "relu", "relie", "ramp", "tanh", "plse", "leaky", "elu", "loggy", "stair",
           "hardtan", "lhtan", "selu"]


def test_act_all_golden_whole_network():
    net, d = run_golden("act_all")
    check_outputs(net, d)


@pytest.mark.parametrize("k", range(len(ACT_ALL)))
def test_act_all_golden_each_activation_alone(k):
    # layer 2k (k >= 1) is [activation] on a route of layer 0, i.e. on the input; layer 0 is linear
    run_standalone("act_all", 2 * k, None)


CFG = """[net]
batch=2
width=3
height=2
channels=2

[activation]

[activation]
activation={name}
"""


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck(name):
    # inputs in (-1, 1) stay away from the kinks of plse/lhtan (+-4, 0/1 ranges) except the ones the
    # y-based formulas get exactly right
    layer_gradcheck(CFG.format(name=name), 1, atol=1e-6)


def test_gradcheck_flat_input():
    layer_gradcheck("[net]\nbatch=3\ninputs=5\n\n[activation]\n\n[activation]\nactivation=tanh\n", 1)


def test_output_shape_follows_input_and_forward_is_the_activation():
    net = network_from_text(CFG.format(name="leaky"))
    assert net.layers[1].out_shape == (2, 2, 3)
    x = np.linspace(-1, 1, net.input.size, dtype=np.float32).reshape(net.input.shape)
    out = net.forward(x)
    # Darknet's `.1*x` is a double product rounded to float
    np.testing.assert_array_equal(out, np.where(x > 0, x, (0.1 * x.astype(np.float64)).astype(np.float32)))


def test_unknown_activation_is_an_error_with_a_suggestion():
    with pytest.raises(CfgError, match="leaky"):
        network_from_text(CFG.format(name="leakyy"))
