"""[local] and [deconvolutional]: Darknet goldens, slow numpy references (batch > 1, non-square,
several strides/paddings), float64 gradient checks, file layout and cfg handling."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import assert_close, golden_dir, layer_gradcheck, read_f32

from darkpy import CfgError, load_network
from darkpy.cfg import CfgWarning
from darkpy.network import network_from_text

RTOL = ATOL = 1e-5
ACT = {"linear": lambda x: x, "leaky": lambda x: np.where(x > 0, x, 0.1 * x), "tanh": np.tanh,
       "logistic": lambda x: 1 / (1 + np.exp(-x))}


def run_golden(name: str):
    d = golden_dir("forward", name)
    if not d.is_dir():
        pytest.fail(f"golden {d} is missing from ../shared")
    net = load_network(d / "net.cfg", d / "net.weights")
    for layer in net.layers:
        if hasattr(layer, "darknet_cpu_bn"):
            layer.darknet_cpu_bn = True
    net.forward(read_f32(d / "input.f32").reshape(net.input.shape))
    return net, d


@pytest.mark.parametrize("name", ["local", "deconv"])
def test_golden_forward(name):
    """Every layer within 1e-5 (deconv's BN layer with pjreddie's CPU epsilon, as the golden)."""
    net, d = run_golden(name)
    for i, layer in enumerate(net.layers):
        assert_close(layer.output.reshape(-1), read_f32(d / f"layer_{i:03d}.f32"), RTOL, ATOL,
                     f"{name} layer {i} ({layer.kind})")


# -- numpy references ------------------------------------------------------------------------------

def ref_local(x, w, b, size, stride, pad, activation):
    """x (c, h, w); w (L, n, c·k·k); b (n, L). Location by location, patch by patch."""
    _, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad)))
    oh = (h - (1 if pad else size)) // stride + 1
    ow = (wd - (1 if pad else size)) // stride + 1
    out = np.zeros((w.shape[1], oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            patch = xp[:, oy * stride:oy * stride + size, ox * stride:ox * stride + size].reshape(-1)
            out[:, oy, ox] = w[oy * ow + ox] @ patch + b[:, oy * ow + ox]
    return ACT[activation](out)


def ref_deconv(x, w, b, stride, padding, activation):
    """x (c, h, w); w (c, n, k, k): every input pixel scatters a weighted kernel into the output."""
    _, h, wd = x.shape
    _, n, k, _ = w.shape
    full = np.zeros((n, (h - 1) * stride + k, (wd - 1) * stride + k))
    for iy in range(h):
        for ix in range(wd):
            full[:, iy * stride:iy * stride + k, ix * stride:ix * stride + k] += \
                np.einsum("c,cnyx->nyx", x[:, iy, ix].astype(np.float64), w)
    oh, ow = full.shape[1] - 2 * padding, full.shape[2] - 2 * padding
    return ACT[activation](full[:, padding:padding + oh, padding:padding + ow] + b[:, None, None])


@pytest.mark.parametrize("body", ["filters=3\nsize=3\nstride=1\npad=1\nactivation=leaky",
                                  "filters=2\nsize=3\nstride=2\npad=1\nactivation=tanh",
                                  "filters=2\nsize=2\nstride=2\npad=0\nactivation=linear",
                                  "filters=1\nsize=5\nstride=1\npad=2\nactivation=logistic"])
def test_local_matches_reference(body):
    net = network_from_text(f"[net]\nbatch=3\nwidth=7\nheight=6\nchannels=2\n[local]\n{body}\n", seed=1)
    layer = net.layers[0]
    layer.biases.value[...] = np.random.default_rng(2).uniform(-0.5, 0.5, layer.biases.value.shape)
    x = np.random.default_rng(3).uniform(-1, 1, net.input.shape).astype(np.float32)
    out = net.forward(x)
    for i in range(3):
        want = ref_local(x[i], layer.weights.value, layer.biases.value, layer.size, layer.stride,
                         layer.pad, layer.activation)
        assert_close(out[i], want, 1e-5, 1e-6, f"{body!r} item {i}")


@pytest.mark.parametrize("body", ["filters=3\nsize=4\nstride=2\npadding=1\nactivation=leaky",
                                  "filters=2\nsize=3\nstride=1\npad=1\nactivation=tanh",
                                  "filters=2\nsize=3\nstride=3\nactivation=linear",
                                  "filters=1\nsize=5\nstride=2\npadding=2\nactivation=logistic"])
def test_deconv_matches_reference(body):
    net = network_from_text(f"[net]\nbatch=3\nwidth=5\nheight=3\nchannels=2\n[deconv]\n{body}\n", seed=1)
    layer = net.layers[0]
    layer.weights.value[...] = np.random.default_rng(2).uniform(-1, 1, layer.weights.value.shape)
    layer.biases.value[...] = np.random.default_rng(4).uniform(-0.5, 0.5, layer.biases.value.shape)
    x = np.random.default_rng(3).uniform(-1, 1, net.input.shape).astype(np.float32)
    out = net.forward(x)
    for i in range(3):
        want = ref_deconv(x[i], layer.weights.value, layer.biases.value, layer.stride, layer.padding,
                          layer.activation)
        assert_close(out[i], want, 1e-5, 1e-5, f"{body!r} item {i}")


# -- gradient checks -------------------------------------------------------------------------------

HOLDER = "[net]\nbatch=2\nwidth={w}\nheight={h}\nchannels=2\n[activation]\nactivation=linear\n"
GRADCHECKS = {
    "local_s2_pad1": HOLDER.format(w=5, h=4) + "[local]\nfilters=3\nsize=3\nstride=2\npad=1\nactivation=leaky\n",
    "local_pad0_mish": HOLDER.format(w=4, h=4) + "[local]\nfilters=2\nsize=2\nstride=1\npad=0\nactivation=mish\n",
    "deconv_s2": HOLDER.format(w=3, h=2) + "[deconv]\nfilters=3\nsize=4\nstride=2\npadding=1\nactivation=leaky\n",
    "deconv_bn": HOLDER.format(w=3, h=3) + "[deconv]\nfilters=2\nsize=3\nstride=1\npad=1\n"
                                           "batch_normalize=1\nactivation=logistic\n",
    "deconv_s3_swish": HOLDER.format(w=2, h=3) + "[deconv]\nfilters=2\nsize=2\nstride=3\nactivation=swish\n",
}


@pytest.mark.parametrize("name", list(GRADCHECKS))
def test_gradcheck(name):
    layer_gradcheck(GRADCHECKS[name], 1)


# -- layout, params, cfg ---------------------------------------------------------------------------

def test_file_layout_and_params():
    net = network_from_text("[net]\nbatch=1\nwidth=5\nheight=4\nchannels=2\n"
                            "[local]\nfilters=3\nsize=3\nstride=1\npad=1\n"
                            "[deconv]\nfilters=2\nsize=2\nstride=2\nbatch_normalize=1\n")
    local, deconv = net.layers
    assert [a.shape for a in local.weight_arrays()] == [(3, 20), (20, 3, 18)]     # biases CHW, [L][n][c·k·k]
    assert [(p.name, p.decay) for p in local.params] == [("biases", False), ("weights", True)]
    assert [a.shape for a in deconv.weight_arrays()] == [(2,)] * 4 + [(3, 2, 2, 2)]  # [c_in][n][k][k]
    assert [p.name for p in deconv.params] == ["biases", "scales", "weights"]
    assert deconv.out_shape == (2, 8, 10)
    assert local.flops() == 2 * 20 * 3 * 18 and deconv.flops() == 2 * 3 * 2 * 4 * 20
    assert local.activation == deconv.activation == "logistic"      # darknet's default
    # every location of a local layer is initialised (darknet: only location 0)
    assert (np.abs(local.weights.value).max(axis=(1, 2)) > 0).all()
    lines = net.summary().splitlines()
    assert lines[2] == "    1 deconv    2  2 x 2 / 2     5 x   4 x   3   ->    10 x   8 x   2"


def test_local_pad_must_match_size():
    """Darknet sizes the output for size/2 padding but unrolls with `pad`: only size = 2·pad + 1 works."""
    text = "[net]\nbatch=1\nwidth=6\nheight=6\nchannels=1\n[local]\nfilters=1\nsize={s}\npad={p}\n"
    with pytest.raises(CfgError, match="pad=1 with size=5") as ei:
        network_from_text(text.format(s=5, p=1))
    assert ei.value.key == "pad"
    assert network_from_text(text.format(s=5, p=2)).layers[0].out_shape == (1, 6, 6)
    with pytest.raises(CfgError, match="does not fit"):
        network_from_text(text.format(s=7, p=0))


def test_deconv_has_no_groups_and_resizes():
    with pytest.warns(CfgWarning, match="groups: unused key"):
        net = network_from_text("[net]\nbatch=1\nwidth=3\nheight=3\nchannels=2\n"
                                "[deconv]\nfilters=2\nsize=2\nstride=2\ngroups=2\n")
    assert net.layers[0].weights.value.shape == (2, 2, 2, 2)
    net.resize(4, 5)
    assert net.layers[0].out_shape == (2, 10, 8) and net.forward(np.ones((1, 2, 5, 4))).shape == (1, 2, 10, 8)
    with pytest.raises(CfgError, match="output would be"):
        network_from_text("[net]\nwidth=1\nheight=1\nchannels=1\n[deconv]\nsize=1\npadding=1\n")


def test_local_not_resizable():
    net = network_from_text("[net]\nwidth=4\nheight=4\nchannels=1\n[local]\nsize=3\npad=1\n")
    with pytest.raises(CfgError, match="cannot resize"):
        net.resize(6, 6)


def test_local_and_deconv_train():
    """SGD through the public API (forward with truth, backward, update) lowers an SSE loss on a fixed
    batch at every step: the Params carry the right gradients into the optimiser."""
    net = network_from_text("[net]\nbatch=2\nwidth=4\nheight=4\nchannels=1\nlearning_rate=0.01\n"
                            "momentum=0\ndecay=0\n[local]\nfilters=2\nsize=3\npad=1\nactivation=leaky\n"
                            "[deconv]\nfilters=1\nsize=2\nstride=2\nactivation=linear\n[cost]\n", seed=3)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, (2, 1, 4, 4)), rng.uniform(-1, 1, (2, 64))
    costs = []
    for _ in range(6):
        net.forward(x, y, train=True)
        costs.append(net.cost)
        net.backward()
        net.update()
    assert all(b < a for a, b in itertools.pairwise(costs)), costs
    assert costs[-1] < 0.995 * costs[0]
