"""Every fast path against the plain one, on layers and networks hypothesis draws.

A [convolutional] layer takes one of several paths by its shape, batch and whether the network
only infers (the direct convolutions, the one across filters, Winograd, the fused 1x1 kernels,
else im2col + GEMM), and an inferring network fuses what follows it (its 2x2 maxpool, a global
average pool, the means a 1x1 layer after it averages first) and shares one arena among the
outputs (darkpy/outputs_plan.py: routes as views, outputs placed over dead ones). Each drawn
network runs twice: in float32 as darkpy runs it, and in float64 with every one of those paths
and fusions switched off (im2col + GEMM and the separate epilogue pass: the path the float64
gradient checks of test_conv.py cover). Inferring, the outputs must agree, also on the second
forward (the kept kernel calls), after new weights, at another batch and (networks) resized;
training (forward and backward with an sse cost, twice: the second at another batch), the cost,
every parameter's gradient and the input gradient must. The same layers and networks on 2 numba
threads and on 1 must give the same bits. The `example`s pin one layer per path
(`test_examples_take_every_path` checks that they still do), hypothesis draws the rest
(derandomised: CI runs the same draws every time). 1500-2000 random draws of each test passed
when it was written.
"""
from __future__ import annotations

import contextlib

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

import darkpy.layers.convolutional as conv
import darkpy.layers.route as route
from darkpy import CfgError, StateError, deltas_plan, outputs_plan
from darkpy.kernels import direct
from darkpy.kernels import simd
from darkpy.network import network_from_text
from helpers import same_random_parameters

#: The module switches of the paths, fusions and shared buffers the float64 reference runs
#: without (its deltas each a buffer of its own, its routes copies, nothing streamed).
PATHS_OFF = [(conv, "WINOGRAD"), (conv, "DIRECT"), (conv, "DIRECT_FV"), (conv, "POINTWISE"),
             (conv, "POINTWISE_LARGE"), (conv, "POINTWISE_PACKED"), (conv, "FUSED_EPILOGUE"), (outputs_plan, "FUSE_POOLS"),
             (outputs_plan, "AVERAGE_FIRST"), (outputs_plan, "WRITE_MEANS"),
             (outputs_plan, "ROUTE_VIEWS"), (deltas_plan, "SHARE"), (route, "STREAM"),
             (direct, "STREAM")]
TAILS = ["", "[maxpool]\nsize=2\nstride=2\n", "[avgpool]\n",
         "[convolutional]\nfilters=5\nsize=1\nactivation=linear\n[avgpool]\n"]
ACTIVATIONS = ["linear", "leaky", "relu", "logistic", "mish"]
#: Training draws no relu: its gradient jumps where an output is 0, and float32 rounding puts
#: outputs on either side of it (leaky's kink is avoided by `assume`, see `run_training`).
TRAIN_ACTIVATIONS = [a for a in ACTIVATIONS if a != "relu"]
#: Outputs of a leaky layer within this fraction of the largest of the float64 reference from 0
#: make the example void: the two precisions may put them on either side of the kink.
KINK = 2e-5
FUZZ = settings(max_examples=100, deadline=None, derandomize=True, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def cfg_text(c, n, k, stride, pad, h, w, bn, act, groups=1, lead="", tail="") -> str:
    """One [convolutional] layer (after `lead`, before `tail`) on a c x h x w input."""
    return (f"[net]\nwidth={w}\nheight={h}\nchannels={c}\n{lead}"
            f"[convolutional]\nfilters={n}\nsize={k}\nstride={stride}\npadding={pad}\ngroups={groups}\n"
            f"batch_normalize={bn}\nactivation={act}\n{tail}")


@contextlib.contextmanager
def paths_off():
    """Within: every fast path and fusion switched off (for building and running the reference)."""
    with pytest.MonkeyPatch.context() as mp:
        for module, name in PATHS_OFF:
            mp.setattr(module, name, False)
        yield


def assert_near(got, ref, what: str, rtol: float = 2e-4, floor: float = 1e-3) -> None:
    """float32 against the float64 reference: every value within rtol of the larger of the
    reference's largest |value| and `floor` (where the values are sums that cancel to about
    nothing, float32's rounding is relative to what was summed, not to the result)."""
    got, ref = np.asarray(got, np.float64).reshape(-1), np.asarray(ref, np.float64).reshape(-1)
    err = np.abs(got - ref)
    scale = max(float(np.abs(ref).max()) if ref.size else 0.0, floor)
    worst = int(err.argmax()) if err.size else 0
    assert err.size == 0 or err[worst] <= rtol * scale, (
        f"{what}: value {worst} is {got[worst]!r}, the plain path's {ref[worst]!r} "
        f"(largest |value| {scale:.3g})")


def run_inference(text: str, batch: int, other_batch: int, resize_to: tuple[int, int] | None = None,
                  seed: int = 0) -> None:
    """The network inferring as the commands do (shared outputs: the fusions) against the plain
    float64 one: twice (the second forward runs the kept kernel calls), then with new weights
    (`weights_changed`), then at another batch and (`resize_to`) at another size (every buffer
    reallocated, the paths chosen again)."""
    with paths_off():
        ref = network_from_text(text, batch=batch, dtype=np.float64)
    net = network_from_text(text, batch=batch)
    net.share_outputs()
    rng = same_random_parameters([net, ref], seed)
    for layer in net.layers:
        if layer.kind == "convolutional":
            event(f"{path_of(layer)}, fused: {fusion_of(layer)}")

    def check(what: str, repeat: bool = False) -> None:
        x = rng.random(net.input.shape)
        with paths_off():
            want = ref.forward(x).copy()
        assert_near(net.forward(x.astype(np.float32)), want, f"inference output, {what}")
        if repeat:
            assert_near(net.forward(x.astype(np.float32)), want, f"inference output, {what} again")

    check("first forward", repeat=True)
    rng = same_random_parameters([net, ref], seed + 1)
    net.weights_changed()
    check("new weights", repeat=True)
    net.set_batch(other_batch)
    with paths_off():
        ref.set_batch(other_batch)
    check(f"at batch {other_batch}", repeat=True)
    if resize_to is not None:
        w, h = resize_to
        try:
            with paths_off():
                ref.resize(w, h)
        except (CfgError, StateError):      # a size the network does not take (said in one line)
            return
        net.resize(w, h)
        event("resized")
        check(f"resized to {w}x{h}")


def run_training(text: str, batch: int, seed: int = 0) -> None:
    """A training forward and backward (sse cost) against the plain float64 one: the cost, every
    layer's parameter gradients and the input gradient (the delta of the first layer, which the
    one after it receives); then again, the gradients zeroed, at one item more (every buffer
    reallocated)."""
    text = text + "[cost]\ntype=sse\n"
    with paths_off():
        ref = network_from_text(text, batch=batch, dtype=np.float64)
    assume(not batch_norm_of_few(ref))
    net = network_from_text(text, batch=batch)
    rng = same_random_parameters([net, ref], seed)
    for layer in net.layers:
        if layer.kind == "convolutional":
            event(path_of(layer))
    for step in range(2):
        if step:
            for model in (net, ref):
                model.set_batch(batch + 1)
                for layer in model.layers:
                    for p in layer.params:
                        p.grad[...] = 0
        x = rng.random(net.input.shape)
        truth = rng.random(net.truth.shape)
        with paths_off():
            ref.forward(x, truth, train=True)
            ref.backward()
        for layer in ref.layers:
            if getattr(layer, "activation", None) == "leaky":
                y = np.abs(layer.output)
                assume(y.min() > KINK * y.max())
        net.forward(x.astype(np.float32), truth, train=True)
        net.backward()
        at = f" (batch {net.batch})"
        assert abs(net.cost - ref.cost) <= 2e-4 * max(abs(ref.cost), 1.0), (net.cost, ref.cost, at)
        # a gradient that cancels to ~0 (a bias before batch norm) is compared at the network's
        # scale of gradients
        floor = 0.05 * max(float(np.abs(q.grad).max()) for w in ref.layers for q in w.params)
        for layer, want in zip(net.layers, ref.layers):
            for p, q in zip(layer.params, want.params):
                assert_near(p.grad, q.grad, f"layer {layer.index} {p.name} gradient{at}", 5e-4, floor)
        assert_near(net.layers[0].delta, ref.layers[0].delta, "input gradient" + at, 5e-4)


def batch_norm_of_few(net) -> bool:
    """Some batch-norm layer normalises fewer than 8 values a channel: its gradients vanish, and
    the two precisions' rounding is all that is left of them."""
    return any(getattr(layer, "bn", None) is not None and layer.batch * layer.out_shape[1]
               * layer.out_shape[2] < 8 for layer in net.layers)


def path_of(layer) -> str:
    for name in ("pointwise", "direct_fv", "direct", "winograd", "pointwise_large", "pointwise_packed"):
        if getattr(layer, name):
            return name
    return "gemm"


# -- one network per path ------------------------------------------------------------------------
# (c, n, k, stride, pad, h, w, batch, bn, act, groups, tail index): inference, then training
INFER_EXAMPLES = {
    "direct": (3, 16, 3, 1, 1, 36, 34, 2, 1, "leaky", 1, 1),
    "direct stride 2": (3, 24, 3, 2, 1, 40, 37, 1, 1, "leaky", 1, 0),
    "direct 7x7": (3, 8, 7, 2, 3, 32, 32, 1, 1, "relu", 1, 1),
    "direct_fv": (16, 32, 3, 1, 1, 8, 8, 1, 1, "leaky", 1, 3),
    "winograd": (48, 40, 3, 1, 1, 20, 18, 2, 1, "leaky", 1, 1),
    "winograd means": (512, 200, 3, 1, 1, 7, 7, 8, 1, "leaky", 1, 3),
    "pointwise": (64, 27, 1, 1, 0, 8, 8, 2, 0, "linear", 1, 0),
    "pointwise packed": (264, 24, 1, 1, 0, 23, 25, 2, 1, "leaky", 1, 0),
    "gemm": (6, 10, 5, 2, 2, 11, 13, 2, 1, "logistic", 2, 2),
}
TRAIN_EXAMPLES = {     # (training applies the activation's gradient in one pass on every path)
    "direct": (3, 16, 3, 1, 1, 34, 32, 2, 1, "logistic", 1, 0),
    "direct_fv": (16, 32, 3, 1, 1, 8, 8, 4, 1, "mish", 1, 0),
    "winograd": (48, 40, 3, 1, 1, 16, 16, 2, 1, "linear", 1, 0),
    "gemm": (8, 12, 3, 2, 1, 9, 10, 3, 1, "mish", 1, 0),
}
#: each inference example's path and what it fuses: into its 2x2 maxpool, or the means of its
#: maps for the 1x1 layer after it (which averages first)
INFER_PATHS = {"direct": ("direct", "pool"), "direct stride 2": ("direct", None),
               "direct 7x7": ("direct", "pool"), "direct_fv": ("direct_fv", "means"),
               "winograd": ("winograd", "pool"), "winograd means": ("winograd", "means"),
               "pointwise": ("pointwise", None), "pointwise packed": ("pointwise_packed", None),
               "gemm": ("gemm", None)}


def fusion_of(layer) -> str | None:
    return "pool" if layer.pool_into is not None else "means" if layer.means_into is not None else None


@pytest.mark.parametrize("name", list(INFER_EXAMPLES))
def test_examples_take_every_path(name):
    """The pinned examples still reach the path (and fusion) each is named for (else they stop
    covering it)."""
    if INFER_PATHS[name][0].startswith("pointwise") and simd.LANES != 16:
        pytest.skip("the fused 1x1 kernel is for AVX-512 machines")
    c, n, k, s, p, h, w, b, bn, act, g, t = INFER_EXAMPLES[name]
    net = network_from_text(cfg_text(c, n, k, s, p, h, w, bn, act, g, tail=TAILS[t]), batch=b)
    net.share_outputs()
    assert (path_of(net.layers[0]), fusion_of(net.layers[0])) == INFER_PATHS[name]
    if name in TRAIN_EXAMPLES:
        c, n, k, s, p, h, w, b, bn, act, g, t = TRAIN_EXAMPLES[name]
        text = cfg_text(c, n, k, s, p, h, w, bn, act, g, lead="[activation]\nactivation=linear\n")
        net = network_from_text(text + "[cost]\ntype=sse\n", batch=b)
        assert path_of(net.layers[1]) == name


def _shapes(draw, max_macs: int):
    """c, n, k, stride, pad, h, w, batch, groups: at most max_macs multiply-adds in the batch."""
    if draw(st.integers(0, 3)) == 0:        # Winograd's shapes: 3x3 stride 1 over 16+ channels
        k, stride, pad, c = 3, 1, draw(st.integers(0, 2)), draw(st.integers(16, 72))
    else:
        k = draw(st.sampled_from([1, 1, 3, 3, 3, 3, 5, 7]))
        stride = draw(st.sampled_from([1, 1, 1, 2]))
        pad = draw(st.sampled_from(sorted({0, k // 2, min(1, k // 2)})))
        c = draw(st.one_of(st.integers(1, 4), st.integers(5, 48)))
    n = draw(st.one_of(st.integers(1, 40), st.integers(41, 136)))
    groups = 1
    if draw(st.integers(0, 7)) == 0 and c > 1:
        groups = draw(st.sampled_from([d for d in (2, c) if c % d == 0 and n % d == 0] or [1]))
    h = draw(st.integers(max(k - 2 * pad, 1), 40))
    w = draw(st.integers(max(k - 2 * pad, 1), 40))
    batch = draw(st.integers(1, 4))
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    while batch > 1 and batch * n * oh * ow * c // groups * k * k > max_macs:
        batch -= 1
    while n > 1 and n * oh * ow * c // groups * k * k > max_macs:
        n //= 2
    n -= n % groups
    return c, max(n, groups), k, stride, pad, h, w, batch, groups


@st.composite
def inference_cases(draw):
    c, n, k, s, p, h, w, b, g = _shapes(draw, 3_000_000)
    tail = draw(st.integers(0, len(TAILS) - 1))
    if TAILS[tail].startswith("[maxpool]") and draw(st.booleans()):   # maps the pool halves
        h += s * (((h + 2 * p - k) // s + 1) % 2)
        w += s * (((w + 2 * p - k) // s + 1) % 2)
    return c, n, k, s, p, h, w, b, draw(st.integers(0, 1)), draw(st.sampled_from(ACTIVATIONS)), g, tail


@st.composite
def training_cases(draw):
    c, n, k, s, p, h, w, b, g = _shapes(draw, 1_500_000)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    bn = int(b * oh * ow >= 8 and draw(st.booleans()))     # batch statistics of 8 values at least
    return c, n, k, s, p, h, w, b, bn, draw(st.sampled_from(TRAIN_ACTIVATIONS)), g, 0


def _with_examples(examples):
    def wrap(f):
        for case in examples.values():
            f = example(case)(f)
        return f
    return wrap


@pytest.mark.slow
@_with_examples(INFER_EXAMPLES)
@FUZZ
@given(inference_cases())
def test_inference_equals_the_plain_path(case):
    c, n, k, s, p, h, w, b, bn, act, g, t = case
    run_inference(cfg_text(c, n, k, s, p, h, w, bn, act, g, tail=TAILS[t]), b, b % 3 + 1)


@pytest.mark.slow
@_with_examples(TRAIN_EXAMPLES)
@FUZZ
@given(training_cases())
def test_training_equals_the_plain_path(case):
    c, n, k, s, p, h, w, b, bn, act, g, _ = case
    run_training(cfg_text(c, n, k, s, p, h, w, bn, act, g, lead="[activation]\nactivation=linear\n"), b)


# -- whole networks -------------------------------------------------------------------------------
#: Sections of the drawn networks: convolutions that reach each path on the drawn maps, and the
#: layers the shared-outputs plan places, views or fuses (pools, routes, shortcuts, upsampling).
SECTIONS = [
    "[convolutional]\nfilters=16\nsize=3\npad=1\nbatch_normalize=1\nactivation=leaky",
    "[convolutional]\nfilters=32\nsize=3\npad=1\nbatch_normalize=1\nactivation=leaky",
    "[convolutional]\nfilters=24\nsize=3\nstride=2\npad=1\nbatch_normalize=1\nactivation=mish",
    "[convolutional]\nfilters=64\nsize=1\nbatch_normalize=1\nactivation=leaky",
    "[convolutional]\nfilters=20\nsize=1\nactivation=linear",
    "[maxpool]\nsize=2\nstride=2", "[maxpool]\nsize=2\nstride=1", "[maxpool]\nsize=3\nstride=1",
    "[route]\nlayers=-1,-2", "[route]\nlayers=-2", "[route]\nlayers=-1,-3",
    "[shortcut]\nfrom=-2\nactivation=linear", "[shortcut]\nfrom=-3\nactivation=leaky",
    "[upsample]\nstride=2", "[dropout]\nprobability=0.3",
]
HEADS = ["", "[avgpool]\n[softmax]\n", "[convolutional]\nfilters=10\nsize=1\nactivation=linear\n"
         "[avgpool]\n", "[convolutional]\nfilters=6\nsize=1\nactivation=linear\n"
         "[yolo]\nmask=0\nanchors=3,4\nnum=1\nclasses=1\n"]


def _net(c: int, hw: int, body: str) -> str:
    return (f"[net]\nwidth={hw}\nheight={hw}\nchannels={c}\n[convolutional]\nfilters=16\nsize=3\n"
            "pad=1\nbatch_normalize=1\nactivation=logistic\n" + body)


_BN_MISH = "batch_normalize=1\nactivation=mish\n"
#: Networks whose first layer's output is read twice, by a convolution on each training path and
#: by a route after it: that convolution's input gradient must add to what the route gave back.
TRAIN_NETWORK_EXAMPLES = {
    "winograd": (_net(3, 16, f"[convolutional]\nfilters=32\nsize=3\npad=1\n{_BN_MISH}"
                              "[route]\nlayers=-1,-2\n"), 2),
    "direct": (_net(3, 36, f"[convolutional]\nfilters=16\nsize=3\npad=1\n{_BN_MISH}"
                            "[route]\nlayers=-1,-2\n"), 1),
    "direct_fv": (_net(3, 8, f"[convolutional]\nfilters=16\nsize=3\npad=1\n{_BN_MISH}"
                              "[route]\nlayers=-1,-2\n"), 2),
    "direct_fv 1x1": (_net(3, 8, f"[convolutional]\nfilters=16\nsize=1\n{_BN_MISH}"
                                  "[shortcut]\nfrom=-2\nactivation=linear\n"), 2),
    "gemm": (_net(3, 8, f"[convolutional]\nfilters=16\nsize=3\nstride=2\npad=1\n{_BN_MISH}"
                         "[upsample]\nstride=2\n[route]\nlayers=-1,-3\n"), 2),
}
#: ... and inferring: a pool after a convolution whose output a route reads too (not fused), an
#: upsampled branch routed beside its source, a head.
NETWORK_EXAMPLES = {
    "pool beside a route": (_net(3, 16, "[convolutional]\nfilters=32\nsize=3\npad=1\n"
                                        "batch_normalize=1\nactivation=leaky\n[maxpool]\nsize=2\n"
                                        "stride=2\n[route]\nlayers=-2\n[convolutional]\nfilters=10\n"
                                        "size=1\nactivation=linear\n[avgpool]\n"), 2, (24, 20)),
    "upsampled branch": (_net(16, 32, "[convolutional]\nfilters=24\nsize=3\nstride=2\npad=1\n"
                                      "batch_normalize=1\nactivation=leaky\n[upsample]\nstride=2\n"
                                      "[route]\nlayers=-1,-3\n" + HEADS[3]), 1, (16, 16)),
}


@pytest.mark.parametrize("name", list(TRAIN_NETWORK_EXAMPLES))
def test_network_examples_take_every_training_path(name):
    """The pinned training networks' second layer is on the path each is named for."""
    text, batch = TRAIN_NETWORK_EXAMPLES[name]
    net = network_from_text(text + "[cost]\ntype=sse\n", batch=batch)
    assert path_of(net.layers[1]) == name.split()[0]


def _few_upsamples(body) -> bool:
    """At most two [upsample]s: five took a 22x12 map to 704x384, whose float32 global average
    (summed in order, as Darknet sums it) then differs from float64's by 3e-4 relative."""
    return sum(section.startswith("[upsample]") for section in body) <= 2


def draw_network(draw, sections, half_sides: tuple[int, int], most: int, first: str,
                 heads=("",)) -> str:
    """The text of a drawn network: a 1, 3, 16 or 40-channel input with even sides of twice
    `half_sides`, a 16-filter 3x3 batch-norm layer with activation `first`, 1 to `most` of the
    `sections` (`_few_upsamples`), one of the `heads`. `draw`: a composite's or `st.data()`'s."""
    c = draw(st.sampled_from([1, 3, 16, 40]))
    h, w = (draw(st.integers(*half_sides)) * 2 for _ in range(2))
    body = draw(st.lists(st.sampled_from(sections), min_size=1, max_size=most).filter(_few_upsamples))
    return (f"[net]\nwidth={w}\nheight={h}\nchannels={c}\n[convolutional]\nfilters=16\nsize=3\n"
            f"pad=1\nbatch_normalize=1\nactivation={first}\n" + "\n".join(body) + "\n"
            + draw(st.sampled_from(heads)))


@st.composite
def network_cases(draw):
    text = draw_network(draw, SECTIONS, (6, 24), 7, "leaky", HEADS)
    return text, draw(st.integers(1, 3)), (draw(st.integers(5, 40)), draw(st.integers(5, 40)))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::darkpy.cfg.CfgWarning")   # routes of unequal maps: flat
@_with_examples(NETWORK_EXAMPLES)
@FUZZ
@given(network_cases())
def test_networks_infer_as_the_plain_path(case):
    """A drawn network inferring with shared outputs (every path, fusion and view of the plan) gives
    the outputs of the float64 one without any, also after new weights, at another batch and at
    another size."""
    text, batch, resize_to = case
    try:
        run_inference(text, batch, batch % 3 + 1, resize_to)
    except CfgError:            # shapes that do not fit (a route or shortcut across sizes)
        assume(False)


#: Training draws no pools or dropout (float32 may pick another maximum of a near tie; dropout's
#: masks), and smooth activations (see TRAIN_ACTIVATIONS): what it checks is each path's
#: gradients and how the deltas of layers read twice (routes, shortcuts) add up.
TRAIN_SECTIONS = [s.replace("leaky", "mish") for s in SECTIONS
                  if not s.startswith(("[maxpool]", "[dropout]"))]


@st.composite
def training_network_cases(draw):
    return draw_network(draw, TRAIN_SECTIONS, (3, 12), 6, "logistic"), draw(st.integers(1, 3))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::darkpy.cfg.CfgWarning")
@_with_examples(TRAIN_NETWORK_EXAMPLES)
@FUZZ
@given(training_network_cases())
def test_networks_train_as_the_plain_path(case):
    """A drawn network's training step (sse cost) gives the float64 plain one's cost and
    gradients, also at another batch."""
    text, batch = case
    try:
        run_training(text, batch)
    except CfgError:
        assume(False)


# -- the same bits on any thread count ------------------------------------------------------------
@contextlib.contextmanager
def numba_threads(n: int):
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def run_on_threads(text: str, batch: int, train: bool, seed: int = 0) -> None:
    """The network's inference output (shared outputs) or training gradients, every layer on 2
    numba threads and on 1 (no per-layer thread plans), bit for bit (README: "every kernel gives
    the same bits at any thread count")."""
    if train:
        text += "[cost]\ntype=sse\n"
    nets = [network_from_text(text, batch=batch) for _ in range(2)]
    rng = same_random_parameters(nets, seed)
    x = rng.random(nets[0].input.shape).astype(np.float32)
    truth = rng.random(nets[0].truth.shape) if train else None
    results = []
    for net, threads in zip(nets, (2, 1)):
        net.thread_plans.enabled = False
        with numba_threads(threads):
            if train:
                net.forward(x, truth, train=True)
                net.backward()
                results.append([p.grad.copy() for layer in net.layers for p in layer.params]
                               + [net.layers[0].delta.copy()])
            else:
                net.share_outputs()
                results.append([net.forward(x).copy()])
    for i, (two, one) in enumerate(zip(*results)):
        np.testing.assert_array_equal(two, one, err_msg=f"array {i}: 2 threads against 1")


needs_two_threads = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                       reason="needs 2 numba threads (NUMBA_NUM_THREADS < 2 here)")


@pytest.mark.slow
@needs_two_threads
@FUZZ
@given(inference_cases())
def test_inference_same_bits_on_any_threads(case):
    c, n, k, s, p, h, w, b, bn, act, g, t = case
    run_on_threads(cfg_text(c, n, k, s, p, h, w, bn, act, g, tail=TAILS[t]), b, False)


@pytest.mark.slow
@needs_two_threads
@FUZZ
@given(training_cases())
def test_training_same_bits_on_any_threads(case):
    c, n, k, s, p, h, w, b, bn, act, g, _ = case
    run_on_threads(cfg_text(c, n, k, s, p, h, w, bn, act, g, lead="[activation]\nactivation=linear\n"),
                   b, True)


@pytest.mark.slow
@needs_two_threads
@pytest.mark.filterwarnings("ignore::darkpy.cfg.CfgWarning")
# the fused Winograd weight gradient in few bands (batch 1): its band count followed the thread
# count until 2026-12-07, and with it where the sums were split
@example((_net(1, 8, "[upsample]\nstride=2\n[convolutional]\nfilters=16\nsize=3\npad=1\n" + _BN_MISH)
          .replace("width=8", "width=16"), 1, True))
@FUZZ
@given(st.one_of(network_cases().map(lambda c: (c[0], c[1], False)),
                 training_network_cases().map(lambda c: (*c, True))))
def test_networks_same_bits_on_any_threads(case):
    text, batch, train = case
    try:
        run_on_threads(text, batch, train)
    except CfgError:
        assume(False)
