"""`[connected] tie=L`: the output projection shares the [embedding] table of layer L. The one array
gets the sum of both gradients (float64 central differences of the network's cost), is updated once,
stored once in the .weights file, and a bad tie is a clear cfg error."""
from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import assert_close, numerical_grad

from darkpy.errors import CfgError
from darkpy.network import network_from_text

T, S, V, D = 4, 2, 10, 6

CFG = f"""[net]
batch={S}
time_steps={T}
inputs=1
learning_rate=0.01
adamw=1
weight_decay=0.1

[embedding]
vocab={V}
size={D}

[layernorm]

[connected]
output={V}
activation=linear
{{tie}}

[crossentropy]
"""


def _data(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, (T * S, 1)).astype(np.float64)
    ids[:3] = 5                                 # a repeated token: its rows add up in both roles
    return ids, rng.integers(0, V, (T * S, 1)).astype(np.float64)


def test_tied_table_gets_the_sum_of_both_gradients():
    net = network_from_text(CFG.format(tie="tie=0"), dtype=np.float64, seed=3)
    emb, fc = net.layers[0], net.layers[2]
    assert fc.weights is emb.table and fc.tied == 0
    fc.biases.value[...] = np.random.default_rng(1).normal(0, 0.3, V)
    ids, tgt = _data()

    def cost():
        net.forward(ids, tgt, train=True)
        return net.cost

    cost()
    net.backward()
    analytic = -emb.table.grad.copy()           # darkpy keeps the negative summed gradient
    # both roles contribute: the projection's share alone (delta·input) is not the total
    fc_share = -(fc.delta.reshape(-1, V).T @ net.layers[1].output.reshape(-1, D))
    assert np.abs(fc_share).max() > 1e-3 and np.abs(analytic - fc_share).max() > 1e-3
    num = numerical_grad(cost, emb.table.value)
    assert_close(analytic, num, 1e-6, 1e-9, "tied table gradient")


def test_tied_weights_are_updated_once_and_stored_once(tmp_path):
    tied = network_from_text(CFG.format(tie="tie=-2"), seed=3)
    free = network_from_text(CFG.format(tie=""), seed=3)
    fc = tied.layers[2]
    assert all(p is not tied.layers[0].table for p in fc.params)
    ids, tgt = _data()
    before = tied.layers[0].table.value.copy()
    tied.forward(ids.astype(np.float32), tgt.astype(np.float32), train=True)
    tied.backward()
    g = tied.layers[0].table.grad.copy()
    tied.update(rate=0.01)
    # one AdamW step of the shared array, no decay (an embedding table): |Δ| = rate where g ≠ 0
    step = np.abs(tied.layers[0].table.value - before)
    assert np.allclose(step[np.abs(g) > 1e-6], 0.01, rtol=1e-3)
    a, b = tmp_path / "tied.weights", tmp_path / "free.weights"
    tied.save_weights(a)
    free.save_weights(b)
    assert b.stat().st_size - a.stat().st_size == V * D * 4
    again = network_from_text(CFG.format(tie="tie=0"), seed=9)
    again.load_weights(a)
    assert np.array_equal(again.layers[2].weights.value, tied.layers[0].table.value)
    assert again.layers[2].weights is again.layers[0].table
    assert "tied to 0" in tied.summary()


@pytest.mark.parametrize("tie,why", [("tie=1", "not an [embedding]"), ("tie=0\noutput=7", "output=10")])
def test_bad_tie_is_a_cfg_error(tie, why):
    text = CFG.format(tie=tie)
    if "output=7" in tie:
        text = text.replace(f"output={V}\nactivation=linear\ntie=0\noutput=7", "output=7\nactivation=linear\ntie=0")
    with pytest.raises(CfgError, match=re.escape(why)):
        network_from_text(text)
