"""Training-only buffers are allocated lazily (issue 5, peak memory).

`allocate()` sizes what inference needs; every layer's `delta`, a cost layer's `loss` and the
backward caches (activation/shortcut/sam scratch and input copies, batch-norm x̂, dropout draws,
connected/deconv/local temporaries, recurrent state gradients) stay empty until the first training
forward (`Network.allocate_training`). A forward with truth but without training sizes only the
cost layers' buffers (they write their delta and loss). `set_batch`/`resize` drop them again.
Training must give bit-identical results to a network whose buffers exist from the start (the
pre-change behaviour: checked once against the original code too, for these same networks).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import ROOT, shared_path

from darkpy import StateError
from darkpy.cfg import CfgWarning
from darkpy.network import load_network, network_from_text

#: Training-only attributes, per layer kind (besides `delta` and `loss`, checked for every layer).
TRAINING_ONLY = {
    "activation": ("x", "scratch"),
    "shortcut": ("x", "scratch"),
    "sam": ("x", "scratch"),
    "scale_channels": ("x", "scratch"),
    "batchnorm": ("xnorm",),
    "dropout": ("rand",),
    "lrn": ("scratch",),
    "local": ("pre",),
    "connected": ("pre", "xnorm", "wgrad_tmp", "dx_tmp"),
    "deconvolutional": ("pre", "xnorm", "wgrad_tmp", "dx_tmp"),
    "convolutional": ("pre", "xnorm"),
    "rnn": ("dstates",),
    "crnn": ("dstates",),
    "gru": ("dh0", "dfs"),
    "lstm": ("dc",),
}

#: Every family with a training-only buffer (swish/mish keep input copies), in one small net.
ZOO = """[net]
batch=2
width=8
height=8
channels=3
learning_rate=0.01
momentum=0.9
decay=0.0005

[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=swish

[convolutional]
filters=4
size=1
stride=1
pad=0
activation=leaky

[shortcut]
from=-2
activation=mish

[activation]
activation=mish

[batchnorm]

[sam]
from=-3

[avgpool]

[scale_channels]
from=-2

[dropout]
probability=0.3

[lrn]
size=3
alpha=0.1

[local]
filters=4
size=3
stride=1
pad=1
activation=swish

[deconvolutional]
batch_normalize=1
filters=3
size=2
stride=2
activation=mish

[maxpool]
size=2
stride=2

[route]
layers=-1,-3

[upsample]
stride=1

[l2norm]

[connected]
batch_normalize=1
output=12
activation=swish

[connected]
output=5
activation=linear

[softmax]
"""

RNN = """[net]
batch=4
inputs=6
time_steps=2
learning_rate=0.01
momentum=0.9
decay=0.0005

[rnn]
output=5
hidden=4
batch_normalize=1
activation=leaky

[gru]
output=5

[lstm]
output=4
batch_normalize=1

[connected]
output=6
activation=linear

[cost]
type=sse
"""

CRNN = """[net]
batch=4
width=4
height=3
channels=2
time_steps=2
learning_rate=0.01
momentum=0.9

[crnn]
output_filters=3
hidden_filters=2
batch_normalize=1
activation=mish

[connected]
output=4
activation=linear

[logistic]
"""


def bundled(name: str, batch: int):
    return load_network(ROOT / "cfg" / f"{name}.cfg", batch=batch)


NETS = {
    "digits": lambda: bundled("digits", 4),
    "shapes-tiny": lambda: bundled("shapes-tiny", 2),
    "zoo": lambda: network_from_text(ZOO),
    "rnn": lambda: network_from_text(RNN),
    "crnn": lambda: network_from_text(CRNN),
}


def training_buffers(net) -> dict[str, np.ndarray]:
    """Every training-only array of the network (recurrent inner layers included), by name."""
    out = {}
    for layer in net.layers:
        inner = [(f"{layer.index}.{i.name}", i.layer) for i in getattr(layer, "inner", [])]
        for tag, l in [(str(layer.index), layer)] + inner:
            names = ("delta", "loss") + TRAINING_ONLY.get(l.kind, ())
            for name in names:
                arr = getattr(l, name, None)
                if arr is not None and arr is not l.output:     # [cost]'s loss is its output
                    out[f"{tag} {l.kind}.{name}"] = arr
    return out


def assert_no_training_buffers(net):
    held = {k: a.shape for k, a in training_buffers(net).items() if a.size}
    assert not held, f"training-only buffers allocated: {held}"


def truth_for(net, rng) -> np.ndarray:
    t = np.zeros(net.truth.shape, net.dtype)
    if net.layers[-1].kind == "yolo":
        for b in range(t.shape[0]):
            for k in range(2):
                t[b, 5 * k:5 * k + 5] = [*rng.uniform(0.2, 0.8, 2), *rng.uniform(0.1, 0.4, 2), k]
    elif net.layers[-1].kind == "softmax":
        t[np.arange(t.shape[0]), rng.integers(0, t.shape[1], t.shape[0])] = 1
    else:
        t[...] = rng.random(t.shape) > 0.5
    return t


def batch_data(net, rng):
    return rng.random((net.batch, *net.input_shape), dtype=np.float32).astype(net.dtype), truth_for(net, rng)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CfgWarning)
        yield


@pytest.mark.parametrize("name", sorted(NETS))
def test_an_inference_only_network_never_allocates_training_buffers(name):
    net = NETS[name]()
    assert_no_training_buffers(net)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x, _t = batch_data(net, rng)
        net.forward(x)
    net.predict(x)
    assert_no_training_buffers(net)
    with pytest.raises(StateError, match="training forward with truth"):
        net.backward()


def test_a_real_yolo_cfg_infers_without_training_buffers():
    cfg = shared_path("cfg", "pjreddie", "yolov3-tiny.cfg")
    net = load_network(cfg, batch=2)
    net.resize(64, 64)
    x = np.random.default_rng(0).random((2, *net.input_shape), dtype=np.float32)
    first = net.forward(x).copy()
    net.forward(x)
    np.testing.assert_array_equal(net.output, first)
    assert_no_training_buffers(net)
    assert all(l.delta.size == 0 for l in net.layers)


@pytest.mark.parametrize("name", ["digits", "shapes-tiny", "zoo"])
def test_a_forward_with_truth_sizes_only_the_cost_layers(name):
    """Validation loss without training: cost layers get delta and loss, nothing else does, and the
    cost is exactly that of a network whose buffers all exist."""
    net, ref = NETS[name](), NETS[name]()
    ref.allocate_training()
    x, t = batch_data(net, np.random.default_rng(1))
    net.forward(x, t)
    ref.forward(x, t)
    assert net.cost is not None and net.cost == ref.cost
    for layer, other in zip(net.layers, ref.layers):
        if layer.has_cost:
            np.testing.assert_array_equal(layer.delta, other.delta)
            assert layer.loss.shape == layer.output.shape
        else:
            assert layer.delta.size == 0, layer
    with pytest.raises(StateError):
        net.backward()
    net.forward(x)                                  # no stale cost, loss or delta afterwards
    assert net.cost is None
    assert all(not l.delta.any() and (l.loss is None or not l.loss.any()) for l in net.layers)


def train_steps(net, rng, steps=3) -> list:
    """Inference, training and validation forwards interleaved, with SGD updates; the costs."""
    log = []
    for _ in range(steps):
        x, t = batch_data(net, rng)
        log.append(net.forward(x).copy())
        net.forward(x, t, train=True)
        log.append([net.cost] + [l.cost for l in net.layers if l.has_cost])
        net.backward()
        log += [l.delta.copy() for l in net.layers]
        net.update(check_finite=False)   # the zoo's [lrn] (Darknet's running window) can make NaN here;
                                         # this compares buffers, lazy vs eager, NaN included
        net.forward(x, t)
        log.append(net.cost)
    return log


def assert_same(a, b, what):
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        if isinstance(u, (np.ndarray, float, list)):
            np.testing.assert_array_equal(np.asarray(u), np.asarray(v), err_msg=f"{what} item {i}")
        else:
            assert u == v, f"{what} item {i}: {u} != {v}"


@pytest.mark.parametrize("name", sorted(NETS))
def test_training_is_bit_identical_to_preallocated_buffers(name):
    lazy, eager = NETS[name](), NETS[name]()
    eager.allocate_training()                       # what allocate() did before buffers were lazy
    x, _t = batch_data(lazy, np.random.default_rng(5))
    lazy.forward(x)
    assert_no_training_buffers(lazy)
    la = train_steps(lazy, np.random.default_rng(2))
    lb = train_steps(eager, np.random.default_rng(2))
    assert_same(la, lb, name)
    for l1, l2 in zip(lazy.layers, eager.layers):
        for a, b in zip(l1.weight_arrays(), l2.weight_arrays()):
            np.testing.assert_array_equal(a, b, err_msg=f"{name} layer {l1.index} weights")
    for layer in lazy.layers:
        assert layer.delta.shape == layer.output.shape, layer
        for key in TRAINING_ONLY.get(layer.kind, ()):   # those that exist have the eager net's shape
            assert getattr(layer, key).shape == getattr(eager.layers[layer.index], key).shape, (layer, key)


@pytest.mark.parametrize("change", ["set_batch", "resize"])
def test_set_batch_and_resize_drop_the_training_buffers(change):
    net = NETS["shapes-tiny"]()
    rng = np.random.default_rng(3)
    x, t = batch_data(net, rng)
    net.forward(x, t, train=True)
    net.backward()
    assert net.layers[0].delta.shape == net.layers[0].output.shape
    if change == "set_batch":
        net.set_batch(3)
    else:
        net.resize(96, 64)
    assert_no_training_buffers(net)
    with pytest.raises(StateError):
        net.backward()
    x, t = batch_data(net, rng)
    net.forward(x)
    assert_no_training_buffers(net)
    net.forward(x, t, train=True)
    for layer in net.layers:
        assert layer.delta.shape == layer.output.shape == (net.batch, *layer.out_shape), layer
    net.backward()
    net.update()
    assert np.isfinite(net.cost)
