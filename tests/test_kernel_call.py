"""An inference forward's kept kernel call (kernels/kernel_call.py): the direct paths of an
inferring network make their kernel call once and reuse it, giving the outputs a network that
makes it every time gives; new weights (`weights_changed`), a new batch and a training forward
each make it anew or drop it; the thread count is read at every call."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.engine import sane_weights
from darkpy.kernels import direct as dk
from darkpy.kernels import direct_fv as fv
from darkpy.kernels import kernel_call
from darkpy.kernels.kernel_call import KeptCall
from darkpy.network import load_network

DIGITS = Path(__file__).resolve().parents[1] / "cfg" / "digits.cfg"


def _twins(batch):
    """digits.cfg twice with the same weights: one inferring with shared outputs (its first
    three layers on the direct paths), one as it trains (no call kept)."""
    nets = [load_network(DIGITS, batch=batch) for _ in range(2)]
    sane_weights(nets[0].layers)
    for a, b in zip(nets[0].layers, nets[1].layers):
        for p, q in zip(a.params, b.params):
            q.value[...] = p.value
        if getattr(a, "bn", None) is not None:
            b.bn.rolling_mean[...] = a.bn.rolling_mean
            b.bn.rolling_variance[...] = a.bn.rolling_variance
    nets[0].share_outputs()
    return nets


def _counting(monkeypatch):
    """Counts of the calls made by the direct paths' `forward_call`s."""
    made = {"direct": 0, "fv": 0}
    for name, mod in (("direct", dk), ("fv", fv)):
        def counted(*a, _orig=mod.forward_call, _name=name, **kw):
            made[_name] += 1
            return _orig(*a, **kw)
        monkeypatch.setattr(mod, "forward_call", counted)
    return made


@pytest.mark.parametrize("batch", [1, 3])
def test_the_call_is_kept_and_made_again_when_what_it_was_made_from_changes(monkeypatch, batch):
    made = _counting(monkeypatch)
    shared, plain = _twins(batch)
    convs = [l for l in shared.layers if l.kind == "convolutional"][:3]
    assert any(l.direct for l in convs) and any(l.direct_fv for l in convs)
    x = np.random.default_rng(1).random(shared.input.shape, dtype=np.float32)
    want = plain.forward(x).copy()
    for _ in range(3):
        np.testing.assert_allclose(shared.forward(x), want, rtol=2e-6, atol=1e-7)
    assert all(l._kept_call is not None for l in convs)
    first = dict(made)
    shared.forward(x)
    assert made == first                         # kept: no call made again
    for net in (shared, plain):                  # new weights: made again, the new outputs
        net.layers[0].weights.value[0] *= -2
        net.layers[2].weights.value[1] *= 0.5
        net.weights_changed()
    want = plain.forward(x).copy()
    np.testing.assert_allclose(shared.forward(x), want, rtol=2e-6, atol=1e-7)
    assert made["direct"] > first["direct"] and made["fv"] > first["fv"]
    shared.set_batch(batch + 1)                  # new buffers: made again
    y = np.concatenate([x, x[:1]])
    np.testing.assert_allclose(shared.predict(y)[:batch], want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(shared.predict(y)[:batch], want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_kept_call_reads_each_new_input(batch):
    """A kept call of the direct path across filters holds its padded copy of the input (made
    once, kernels/fv_planes.py) and fills its inside at every call, the border staying zero: new
    inputs written into the same buffer give the new outputs."""
    shared, plain = _twins(batch)
    rng = np.random.default_rng(3)
    for i in range(3):
        x = rng.random(shared.input.shape, dtype=np.float32)
        want = plain.forward(x).copy()
        np.testing.assert_allclose(shared.forward(x), want, rtol=2e-6, atol=1e-7)
    kept = [l for l in shared.layers if l.kind == "convolutional" and l.direct_fv
            and l.padding and l._kept_call is not None and l._kept_call.run in
            (fv._forward_serial, fv._forward_parallel)]
    assert kept or batch > 1, "no padded layer of the path kept its call"


def test_a_training_network_keeps_no_call():
    _, plain = _twins(2)
    x = np.random.default_rng(2).random(plain.input.shape, dtype=np.float32)
    plain.forward(x)
    truth = np.eye(10, dtype=np.float32)[[1, 3]]
    plain.forward(x, truth, train=True)
    assert all(l._kept_call is None for l in plain.layers if l.kind == "convolutional")


def test_a_kept_call_matches_the_very_arrays_and_reads_the_thread_count_each_time(monkeypatch):
    a, b = np.zeros(3), np.zeros(3)
    got = []
    call = KeptCall(lambda *args: got.append(args), (a, 5), (got.append, ("then",)), (a, b, None))
    assert call.matches((a, b, None))
    assert not call.matches((a, b.copy(), None)) and not call.matches((a, a, None))
    for n in (2, 1):
        monkeypatch.setattr(kernel_call, "thread_count", lambda n=n: n)
        call()
    assert [g if isinstance(g, str) else g[1:] for g in got] == [(5, 2), "then", (5, 1), "then"]
    assert got[0][0] is a
