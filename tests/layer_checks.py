"""Checks shared by the layer-family tests: forward goldens and loss-layer gradient checks.

Forward goldens (../shared/golden/forward/<name>), two ways to check a layer against a golden:
- `run_golden(name)`: the whole golden network through `darkpy.load_network(net.cfg, net.weights)`
  (with `truth.f32` when there is one), then every `layer_NNN.f32` (and delta, costs.txt);
- `run_standalone(name, index, source)`: only layer `index`, built from its own cfg section on a
  one-layer network whose input is the golden dump of the layer it reads (`source`). This checks the
  layer alone, whatever other families are doing.
Tolerance: the golden README's `allclose(rtol=1e-5, atol=1e-5)` for float32 forward dumps.

`loss_gradcheck`: a loss layer's backward against float64 central differences of its own `cost`.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from darkpy import load_network
from darkpy.cfg import load_cfg
from darkpy.layers import REGISTRY
from darkpy.layers.base import State
from darkpy.network import Network, network_from_text
from helpers import assert_close, golden_dir, numerical_grad, read_f32

RTOL = ATOL = 1e-5


def _require_kinds(kinds) -> None:
    missing = sorted({k for k in kinds if k not in REGISTRY})
    if missing:
        msg = f"layer families not built yet: {', '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def golden(name: str):
    d = golden_dir("forward", name)
    if not d.is_dir():
        pytest.fail(f"golden {d} is missing from ../shared")
    return d


def golden_truth(d) -> np.ndarray | None:
    p = d / "truth.f32"
    return read_f32(p)[None] if p.exists() else None


def run_golden(name: str) -> tuple[Network, object]:
    """Build the golden's network with its weights and run its forward pass (inference, with truth)."""
    d = golden(name)
    _require_kinds(sec.kind for sec in load_cfg(d / "net.cfg").layers)
    net = load_network(d / "net.cfg", d / "net.weights")
    net.forward(read_f32(d / "input.f32")[None], golden_truth(d), train=False)
    return net, d


def check_outputs(net: Network, d, indices=None, skip=()) -> None:
    for i, layer in enumerate(net.layers):
        if (indices is not None and i not in indices) or i in skip:
            continue
        assert_close(layer.output.reshape(-1), read_f32(d / f"layer_{i:03d}.f32"), RTOL, ATOL,
                     f"{d.name} layer {i} ({layer.kind}) output")


def check_loss(net: Network, d) -> None:
    """Every dumped delta and every cost of costs.txt, plus the network cost."""
    for p in sorted(d.glob("layer_*.delta.f32")):
        i = int(p.name[6:9])
        assert_close(net.layers[i].delta.reshape(-1), read_f32(p), RTOL, ATOL, f"{d.name} layer {i} delta")
    costs = {line.split()[0]: line.split()[-1] for line in (d / "costs.txt").read_text().splitlines()}
    for key, value in costs.items():
        got = net.cost if key == "net" else net.layers[int(key)].cost
        assert got is not None and abs(got - float(value)) <= 1e-5 * abs(float(value)) + 1e-5, \
            f"{d.name} cost {key}: {got} vs {value}"


def check_loss_alone(net: Network, name: str, index: int) -> None:
    """The delta and cost of golden layer `index`, computed by a run_standalone network."""
    d = golden(name)
    layer = net.layers[0]
    assert_close(layer.delta.reshape(-1), read_f32(d / f"layer_{index:03d}.delta.f32"), RTOL, ATOL,
                 f"{name} layer {index} delta alone")
    costs = {line.split()[0]: float(line.split()[-1]) for line in (d / "costs.txt").read_text().splitlines()}
    assert layer.cost == pytest.approx(costs[str(index)], rel=1e-5, abs=1e-5)
    assert net.cost == pytest.approx(costs["net"], rel=1e-5, abs=1e-5)


def shapes(d) -> list[tuple[str, int, int, int, int]]:
    """shapes.txt rows as (type, w, h, c, outputs)."""
    rows = []
    for line in (d / "shapes.txt").read_text().splitlines():
        _, kind, w, h, c, n = line.split()
        rows.append((kind, int(w), int(h), int(c), int(n)))
    return rows


def standalone_net(name: str, index: int, source: int | None) -> tuple[Network, np.ndarray]:
    """Layer `index` of golden `name` alone, on a network whose input has the shape of layer
    `source`'s output (None: the golden's own input). Returns (network, that input)."""
    d = golden(name)
    doc = load_cfg(d / "net.cfg")
    sec = doc.layers[index]
    if source is None:
        x = read_f32(d / "input.f32")
        net_sec = doc.net.as_dict()
        head = "\n".join(f"{k}={net_sec[k]}" for k in ("width", "height", "channels"))
    else:
        x = read_f32(d / f"layer_{source:03d}.f32")
        _, w, h, c, n = shapes(d)[source]
        head = f"width={w}\nheight={h}\nchannels={c}" if w * h * c == n else f"inputs={n}"
    body = "\n".join(f"{k}={v}" for k, v in sec.as_dict().items())
    net = network_from_text(f"[net]\nbatch=1\n{head}\n\n[{sec.kind}]\n{body}\n")
    return net, x[None]


def run_standalone(name: str, index: int, source: int | None) -> Network:
    """As standalone_net, then forward (with the golden's truth) and compare the layer's output."""
    net, x = standalone_net(name, index, source)
    d = golden(name)
    net.forward(x, golden_truth(d), train=False)
    assert_close(net.layers[0].output.reshape(-1), read_f32(d / f"layer_{index:03d}.f32"), RTOL, ATOL,
                 f"{name} layer {index} ({net.layers[0].kind}) alone")
    return net


def loss_gradcheck(cfg_text: str, truth: np.ndarray, factor: float = 1.0, seed: int = 0,
                   input_range=(-1.0, 1.0), rtol=1e-6, atol=1e-8) -> Network:
    """The LAST layer of `cfg_text` is a loss layer reading layer -2. In float64, after a training
    forward with `truth` and that layer's backward, layer -2's delta must equal
    `-factor · d cost / d(layer -2 output)` (Darknet's delta is the negative gradient of
    `factor · cost`: factor 1/2 where it leaves out the 2 of a square)."""
    net = network_from_text(cfg_text, dtype=np.float64)
    x = np.random.default_rng(seed).uniform(*input_range, size=net.input.shape)
    truth = np.asarray(truth, np.float64).reshape(net.truth.shape)
    net.forward(x, truth, train=True)
    layer, prev = net.layers[-1], net.layers[-2]

    def state():
        return State(input=prev.output, delta=prev.delta, truth=truth, train=True, layers=net.layers,
                     rng=np.random.default_rng(seed), net=net)

    def cost() -> float:
        layer.forward(state())
        return layer.cost

    cost()
    prev.delta.fill(0)
    layer.backward(state())
    analytic = prev.delta.copy()
    num = numerical_grad(cost, prev.output)
    assert_close(analytic, -factor * num, rtol, atol, f"[{layer.kind}] delta vs d cost/d input")
    return net
