"""AlexeyAB's .weights order for [gru], [lstm] and [batchnorm] (spec §7): chosen by the header
version (0.2.5 and later: AlexeyAB's) or by an explicit `order=`; written with the matching header."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from darkpy.errors import WeightsError
from darkpy.network import network_from_text
from darkpy.weights import file_order

SEQ = "[net]\nbatch=2\ninputs=3\ntime_steps=2\n"
CFGS = {
    "gru": (SEQ + "[gru]\noutput=4\n", ("uz", "ur", "uh", "wz", "wr", "wh")),
    "lstm": (SEQ + "[lstm]\noutput=4\n", ("wf", "wi", "wg", "wo", "uf", "ui", "ug", "uo")),
    "batchnorm": ("[net]\nbatch=1\nwidth=2\nheight=2\nchannels=3\n[batchnorm]\n", None),
}


def _randomized(text, seed):
    net = network_from_text(text, seed=seed)
    rng = np.random.default_rng(seed)
    for layer in net.layers:
        for arr in layer.weight_arrays() + getattr(layer, "alexeyab_weight_arrays", list)():
            arr[...] = rng.normal(size=arr.shape)
    return net


def _body(path) -> np.ndarray:
    return np.fromfile(path, dtype="<f4")[5:]


@pytest.mark.parametrize("kind", sorted(CFGS))
def test_alexeyab_order_layout_header_and_round_trip(kind, tmp_path):
    text, names = CFGS[kind]
    net = _randomized(text, 1)
    layer = net.layers[0]
    p = tmp_path / "a.weights"
    net.save_weights(p, order="alexeyab")
    assert struct.unpack("<iii", p.read_bytes()[:12]) == (0, 2, 5)
    if names is None:     # batchnorm: biases first, then scales, rolling mean, rolling variance
        want = [layer.biases.value, layer.bn.scales.value, layer.bn.rolling_mean, layer.bn.rolling_variance]
    else:
        by_name = {i.name: i.layer for i in layer.inner}
        want = [a for n in names for a in by_name[n].weight_arrays()]
    assert np.array_equal(_body(p), np.concatenate([a.reshape(-1) for a in want]).astype("<f4"))
    back = network_from_text(text, seed=9)
    back.load_weights(p)                               # by the header: AlexeyAB's
    for a, b in zip(layer.alexeyab_weight_arrays(), back.layers[0].alexeyab_weight_arrays()):
        assert np.array_equal(a, b)
    # the same file read in pjreddie's order puts the values elsewhere
    wrong = network_from_text(text, seed=9)
    if kind == "batchnorm":
        with pytest.raises(WeightsError, match="too long"):     # pjreddie's has no biases
            wrong.load_weights(p, order="pjreddie")
    else:
        wrong.load_weights(p, order="pjreddie")
        assert not all(np.array_equal(a, b) for a, b in zip(layer.weight_arrays(),
                                                               wrong.layers[0].weight_arrays()))


def test_pjreddie_order_is_the_default_and_explicit_order_wins(tmp_path):
    text, _ = CFGS["lstm"]
    net = _randomized(text, 2)
    p = tmp_path / "p.weights"
    net.save_weights(p)
    assert struct.unpack("<iii", p.read_bytes()[:12]) == (0, 2, 0)
    assert np.array_equal(_body(p), np.concatenate([a.reshape(-1) for a in net.layers[0].weight_arrays()]))
    # an old AlexeyAB file (header 0.2.0, its order): order="alexeyab" reads it right
    old = tmp_path / "old.weights"
    body = np.concatenate([a.reshape(-1) for a in net.layers[0].alexeyab_weight_arrays()]).astype("<f4")
    old.write_bytes(struct.pack("<iiiQ", 0, 2, 0, 0) + body.tobytes())
    back = network_from_text(text, seed=7)
    back.load_weights(old, order="alexeyab")
    assert all(np.array_equal(a, b) for a, b in zip(net.layers[0].weight_arrays(), back.layers[0].weight_arrays()))
    with pytest.raises(WeightsError, match="unknown weights order 'fork'"):
        back.load_weights(old, order="fork")


def test_file_order_rule():
    assert file_order(0, 2, 0) == "pjreddie" and file_order(0, 1, 0) == "pjreddie"
    assert file_order(0, 2, 5) == "alexeyab" and file_order(0, 3, 0) == "alexeyab"
    assert file_order(1001, 1001, 5) == "pjreddie"       # the transpose flag's files are pjreddie's


def test_a_network_loaded_from_an_alexeyab_file_saves_in_its_order(tmp_path):
    text, _ = CFGS["gru"]
    net = _randomized(text, 3)
    net.save_weights(tmp_path / "a.weights", order="alexeyab")
    back = network_from_text(text, seed=4)
    back.load_weights(tmp_path / "a.weights")
    back.save_weights(tmp_path / "b.weights")        # e.g. a training checkpoint
    assert (tmp_path / "b.weights").read_bytes() == (tmp_path / "a.weights").read_bytes()
