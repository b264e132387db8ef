"""[cost]: Darknet goldens (sse, masked, L1 with ties, seg with scale), a numpy reference of every
type, float64 gradient checks, the smooth sign fix, masked without side effects, cfg errors."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy import CfgError
from darkpy.network import network_from_text
from helpers import assert_close, read_f32
from layer_checks import (check_loss, check_loss_alone, check_outputs, golden, loss_gradcheck, run_golden,
                          run_standalone)

GOLDENS = {"cost_sse": (2, 1), "cost_masked": (2, 1), "cost_l1": (3, 2), "cost_seg": (1, 0)}


def ref_cost(cost_type, p, t, noobj=1.0):
    """(error, delta) of Darknet's cost types, float64 (GPU semantics for seg/wgan and smooth's sign)."""
    d = t - p
    if cost_type == "L1":
        return np.abs(d), np.where(d > 0, 1.0, -1.0)
    if cost_type == "smooth":
        small = np.abs(d) < 1
        return np.where(small, d * d, 2 * np.abs(d) - 1), np.where(small, d, np.sign(d))
    if cost_type == "wgan":
        return np.where(t != 0, -p, p), np.where(t > 0, 1.0, -1.0)
    err, delta = d * d, d.copy()
    if cost_type == "masked":
        keep = t != -1234
        err, delta = err * keep, delta * keep
    if cost_type == "seg":
        w = np.where(t == 0, noobj, 1.0)
        err, delta = err * w, delta * w
    return err, delta


def cost_net(cost_type="sse", n=10, batch=2, extra=""):
    return network_from_text(f"[net]\nbatch={batch}\ninputs={n}\n\n[activation]\n\n[cost]\ntype={cost_type}\n"
                             f"{extra}", dtype=np.float64)


# -- goldens ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_cost_golden_whole_network(name):
    net, d = run_golden(name)
    # darknet: masked writes -1234 into the previous layer's output (dumped after the pass); darkpy
    # does not, so that one dump is compared where the truth is not masked only (below)
    prev = GOLDENS[name][1]
    check_outputs(net, d, skip={prev} if name == "cost_masked" else ())
    check_loss(net, d)
    if name == "cost_masked":
        keep = read_f32(d / "truth.f32") != -1234
        got, dump = net.layers[prev].output.reshape(-1), read_f32(d / f"layer_{prev:03d}.f32")
        assert_close(got[keep], dump[keep], 1e-5, 1e-5, "connected output where not masked")
        assert (dump[~keep] == -1234).all() and (got[~keep] != -1234).all()


@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_cost_golden_alone(name):
    index, source = GOLDENS[name]
    check_loss_alone(run_standalone(name, index, source), name, index)


def test_l1_golden_ties_give_delta_minus_one():
    d = golden("cost_l1")
    delta = read_f32(d / "layer_003.delta.f32")
    net = run_standalone("cost_l1", 3, 2)
    assert delta[0] == delta[7] == -1 and net.layers[0].delta.reshape(-1)[[0, 7]].tolist() == [-1, -1]


# -- formulas ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("cost_type", ["sse", "masked", "L1", "smooth", "seg", "wgan"])
def test_forward_matches_reference(cost_type):
    net = cost_net(cost_type, extra="noobj=0.3\n" if cost_type == "seg" else "")
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, net.input.shape)
    t = rng.uniform(-2, 2, net.truth.shape)
    t[:, ::3] = 0
    t[0, 1] = x[0, 1]          # an exact tie
    if cost_type == "masked":
        t[:, 1::4] = -1234
    net.forward(x, t, train=True)
    layer = net.layers[1]
    err, delta = ref_cost(cost_type, x, t, noobj=0.3)
    assert layer.out_shape == (10,)
    assert_close(layer.output, err, 1e-12, 1e-15, "error")
    assert_close(layer.delta, delta, 1e-12, 1e-15, "delta")
    assert layer.loss is layer.output
    assert isinstance(layer.cost, float) and layer.cost == pytest.approx(err.sum(), rel=1e-12)


def test_smooth_uses_the_correct_sign_outside_the_quadratic_zone():
    # darknet: the CPU smooth_l1 gives -sign(t - p) here (a bug); the gradient of 2|d|-1 is sign(d)
    net = cost_net("smooth", n=2, batch=1)
    net.forward(np.array([[0.0, 0.0]]), np.array([[3.0, -3.0]]), train=True)
    assert net.layers[1].delta.tolist() == [[1.0, -1.0]]


def test_masked_does_not_touch_the_previous_output():
    net = cost_net("masked", n=4, batch=1)
    x = np.array([[0.5, -0.5, 0.25, 1.0]])
    net.forward(x, np.array([[-1234.0, 0.0, -1234.0, 1.0]]), train=True)
    np.testing.assert_array_equal(net.layers[0].output, x)
    assert net.layers[1].output.tolist() == [[0.0, 0.25, 0.0, 0.0]]


def test_thresh_suppresses_small_deltas():
    net = cost_net("sse", n=4, batch=1, extra="thresh=0.8\n")     # |delta| < 0.8/4 -> 0
    net.forward(np.zeros((1, 4)), np.array([[0.1, -0.19, 0.21, -0.5]]), train=True)
    assert_close(net.layers[1].delta, [[0.0, 0.0, 0.21, -0.5]], 1e-12, 1e-15)


# -- gradients ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("cost_type,factor", [("sse", 0.5), ("masked", 0.5), ("seg", 0.5), ("smooth", 0.5),
                                              ("L1", 1.0), ("wgan", 1.0)])
def test_gradcheck(cost_type, factor):
    """scale * delta = -scale * factor * d cost / d input (factor 1/2 where Darknet drops the 2)."""
    rng = np.random.default_rng(4)
    t = rng.uniform(-2, 2, (2, 8))
    if cost_type == "masked":
        t[:, ::3] = -1234
    if cost_type in ("seg", "wgan"):
        t = (rng.uniform(size=(2, 8)) > 0.5).astype(float)
    extra = "noobj=0.25\n" if cost_type == "seg" else ""
    loss_gradcheck(f"[net]\nbatch=2\ninputs=8\n\n[activation]\n\n[cost]\ntype={cost_type}\nscale=0.7\n{extra}",
                   t, factor=0.7 * factor, input_range=(-2, 2))


# -- cfg ----------------------------------------------------------------------------------------------
def test_unknown_type_is_an_error_with_a_suggestion():
    with pytest.raises(CfgError, match="did you mean 'smooth'"):
        cost_net("smoth")


def test_keys_are_read():
    layer = cost_net("seg", extra="scale=2\nratio=0.5\nnoobj=0.1\nthresh=0.2\n").layers[1]
    assert (layer.scale, layer.ratio, layer.noobj, layer.thresh) == (2.0, 0.5, 0.1, 0.2)
    assert layer.section.unused() == []
