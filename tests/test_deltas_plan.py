"""Network.share_deltas: training with the deltas that live only inside a backward in one arena.

- A training step gives bit-identical parameter gradients, cost and kept deltas with shared deltas
  as with every layer owning its own, on the shipped cfgs and on every distinct shared network
  darkpy exports (routes, shortcuts, detection heads, recurrent and attention layers, dropout, ...;
  those outside the export tests' fast list marked `slow`), with the arena filled with NaN first
  (a layer that read a delta before it was zeroed would show it).
- The plan: a delta is zeroed by its first writer's step and lives to its own layer's backward;
  two deltas alive at once never share memory; kept layers own theirs.
- The state rules: a forward without truth leaves the arena zero, set_batch/resize keep the plan,
  `share_deltas(False)` gives every layer its own delta again; and the memory it gives back.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import shared_path
from darkpy import deltas_plan, outputs_plan
from darkpy.errors import TrainingError
from darkpy.network import load_network, network_from_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_cases as ec  # noqa: E402
from test_export import _params as exported_networks  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: the shipped cfgs and a small batch each (a sequence model's: whole sequences of time_steps rows)
SHIPPED = {"digits.cfg": 2, "shapes-tiny.cfg": 2, "tiny-gpt.cfg": 64, "tiny-gpt-sort.cfg": 36,
           "char-rnn.cfg": 128}


def _truth(net, rng) -> np.ndarray:
    """One box per item for detection heads (class 0 at the centre), a token id per row for a
    sequence model's cross-entropy, else a one-hot row."""
    t = np.zeros((net.batch, net.truths), np.float32)
    if getattr(net.layers[-1], "is_detection_head", False):
        t[:, :5] = [0.5, 0.5, 0.3, 0.2, 0]
    elif net.truths == 1:
        t[:, 0] = rng.integers(0, net.output_layer.outputs, net.batch)
    else:
        t[np.arange(net.batch), rng.integers(0, net.truths, net.batch)] = 1
    return t


def _step(net, x, truth) -> dict:
    """One training forward and backward from the same rng and `seen`; what it produced."""
    for layer in net.layers:
        for p in layer.params:
            p.grad[...] = 0
    net.seen, net.rng = 0, np.random.default_rng(5)
    net.forward(x, truth, train=True)
    net.backward()
    kept = deltas_plan.kept_layers(net.layers)
    return {"cost": net.cost,
            "grads": [_bits(p.grad) for layer in net.layers for p in layer.params],
            "kept deltas": [_bits(net.layers[i].delta) for i in sorted(kept)]}


def _bits(a: np.ndarray) -> tuple:
    """A digest of a's bits (and its shape): equal digests, the same bits (NaN and -0 too).
    Copying and comparing the gradients themselves took most of a large network's test (390 MB of
    them for extraction22k.cfg)."""
    return a.shape, hashlib.sha1(np.ascontiguousarray(a).view(np.uint8)).digest()


def _same(a: dict, b: dict, name: str) -> None:
    assert a["cost"] == b["cost"], name
    for what in ("grads", "kept deltas"):
        assert len(a[what]) == len(b[what])
        for k, (u, v) in enumerate(zip(a[what], b[what])):
            assert u == v, f"{name}: {what} {k} differ"


def _check_same_step(net, name: str) -> None:
    net.thread_plans.enabled = False            # the same kernels, thread counts and sums both times
    rng = np.random.default_rng(0)
    x = rng.random((net.batch, *net.input_shape), dtype=np.float32)
    if net.layers[0].kind == "embedding":                   # token ids
        x = rng.integers(0, net.layers[0].vocab, x.shape).astype(np.float32)
    truth = _truth(net, rng)
    try:
        owned = _step(net, x, truth)
    except TrainingError as e:          # e.g. [contrastive]: darkpy refuses to train it, and says so
        if "not supported by darkpy" not in str(e):
            raise
        pytest.skip(f"{name}: {e}")
    net.share_deltas()
    net.allocate_training()
    assert net._delta_arena is not None, name
    net._delta_arena[...] = np.nan
    net._deltas_dirty = False                   # (so that only the plan's own zeroing clears it)
    _same(owned, _step(net, x, truth), name)
    _same(owned, _step(net, x, truth), name + " (second step)")


@pytest.mark.parametrize("cfg", SHIPPED)
def test_shipped_networks_train_the_same_with_shared_deltas(cfg):
    net = load_network(ROOT / "cfg" / cfg, batch=SHIPPED[cfg])
    _check_same_step(net, cfg)


@pytest.mark.parametrize("name", exported_networks())     # one per distinct network; most `slow`
def test_shared_networks_train_the_same_with_shared_deltas(name):
    shared_path("cfg")
    net = ec.prepare(name).net             # built at a small size, random weights
    _check_same_step(net, name)


#: An 8x8x3 input and a 3x3 leaky layer, where both small networks below start.
HEAD = """
[net]
width=8
height=8
channels=3
[convolutional]
filters=4
size=3
pad=1
activation=leaky
"""

CHAIN_WITH_SHORTCUT = HEAD + """[convolutional]
filters=4
size=3
pad=1
activation=leaky
[shortcut]
from=-2
activation=linear
[convolutional]
filters=4
size=1
activation=leaky
[route]
layers=-1,0
[convolutional]
filters=3
size=1
activation=linear
[avgpool]
[softmax]
"""


ATTENTION = HEAD + """[convolutional]
filters=4
size=1
activation=logistic
[sam]
from=-2
[avgpool]
[convolutional]
filters=4
size=1
activation=logistic
[scale_channels]
from=-3
activation=swish
[convolutional]
filters=3
size=1
activation=linear
[avgpool]
[softmax]
"""


def test_attention_layers_train_the_same_with_shared_deltas():
    """[sam] and [scale_channels] add into the delta of the layer `from` names (none of the shared
    networks above has them)."""
    net = network_from_text(ATTENTION, batch=2)
    assert [l.kind for l in net.layers][2:6] == ["sam", "avgpool", "convolutional", "scale_channels"]
    _check_same_step(net, "sam + scale_channels")


def test_the_plan_zeroes_each_delta_at_its_first_writer_and_overlaps_only_dead_ones():
    net = network_from_text(CHAIN_WITH_SHORTCUT, batch=2)
    net.share_deltas()
    net.allocate_training()
    layers = net.layers
    n = len(layers)
    last = outputs_plan.last_uses(layers)
    assert last == [4, 2, 3, 4, 5, 6, 7, 7]             # layer 0: read by the shortcut and the route
    assert deltas_plan.kept_layers(layers) == {7}        # the softmax
    # zeroed just before the backward of its highest-index writer
    assert ({i: sorted(v) for i, v in net._delta_zero.items()}
            == {2: [1], 3: [2], 4: [0, 3], 5: [4], 6: [5], 7: [6]})
    life = {i: (n - 1 - last[i], n - 1 - i) for i in range(n - 1)}
    for i in life:
        for j in life:
            if i < j and life[i][0] <= life[j][1] and life[j][0] <= life[i][1]:
                assert not np.shares_memory(layers[i].delta, layers[j].delta), (i, j)
    shared = sum(layers[i].delta.size for i in life)
    assert net._delta_arena.size < 0.75 * shared                # memory is reused
    assert not np.shares_memory(layers[7].delta, net._delta_arena)


def test_a_forward_without_truth_leaves_no_delta_behind_and_the_plan_survives_changes():
    net = network_from_text(CHAIN_WITH_SHORTCUT, batch=2)
    net.share_deltas()
    rng = np.random.default_rng(0)
    x = rng.random((2, 3, 8, 8), dtype=np.float32)
    truth = np.eye(3, dtype=np.float32)[[0, 2]]     # (the avgpool's output: 3 values per item)
    net.forward(x, truth, train=True)
    net.backward()
    assert np.abs(net._delta_arena).max() > 0
    net.forward(x)
    assert not net._delta_arena.any() and not net.layers[-1].delta.any()
    net.set_batch(3)                                    # dropped with every buffer, planned again
    assert net._delta_arena is None
    net.forward(np.concatenate([x, x[:1]]), np.concatenate([truth, truth[:1]]), train=True)
    assert net._delta_arena is not None and net.layers[1].delta.base is net._delta_arena
    net.resize(12, 12)
    x12 = rng.random((3, 3, 12, 12), dtype=np.float32)
    net.forward(x12, np.concatenate([truth, truth[:1]]), train=True)
    net.backward()
    assert net.layers[1].delta.shape == (3, 4, 12, 12) and net.layers[1].delta.base is net._delta_arena
    net.share_deltas(False)
    net.forward(x12, np.concatenate([truth, truth[:1]]), train=True)
    assert net._delta_arena is None and all(layer.delta.base is None for layer in net.layers)


def test_memory_given_back_on_cifar_at_batch_128():
    """cifar.cfg's deltas: 306 MB owned; in one arena, about the two largest alive at once."""
    shared_path("cfg")
    net = load_network(shared_path("cfg", "pjreddie", "cifar.cfg"), batch=128)
    net.allocate_training()
    owned = deltas_plan.delta_bytes(net.layers)
    net.share_deltas()
    net.allocate_training()
    shared = deltas_plan.delta_bytes(net.layers)
    largest = max(layer.delta.nbytes for layer in net.layers)
    assert owned > 300 * 2 ** 20 and shared <= 2.5 * largest, (owned, shared, largest)
