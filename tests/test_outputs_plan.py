"""Network.share_outputs: inference with the layer outputs nothing reads afterwards in one arena.

- The placement (`outputs_plan.place`): two blocks whose lives overlap never share memory, on
  random lives (hypothesis), and the arena is no larger than needed for the live set in the cases
  where that is known.
- Every shared network darkpy exports gives the same outputs (network output and detection heads)
  with shared outputs as without, with the arena filled with NaN first (a layer that read a value
  it did not write would show it) and again on a second input (nothing carried over).
- The state rules: training and backward are refused, set_batch/resize keep the plan, `keep`
  keeps a layer readable, a bad index is a one-line error; and the memory it gives back, the
  replaced buffers included (not left resident in the C heap).
"""
from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import shared_path
import darkpy.layers.conv_winograd as cw
import darkpy.layers.convolutional as conv
from darkpy import outputs_plan
from darkpy.kernels import direct as dk
from darkpy.errors import StateError
from darkpy.network import network_from_text
from helpers import assert_same_bits, blas_splits_exactly

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_cases as ec  # noqa: E402
from test_export import _params as exported_networks  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12), st.integers(0, 5000)), min_size=1,
                max_size=30))
def test_blocks_alive_together_never_overlap(blocks):
    first = [b[0] for b in blocks]
    last = [b[0] + b[1] for b in blocks]
    sizes = [b[2] for b in blocks]
    offsets, total = outputs_plan.place(sizes, first, last)
    for i in range(len(blocks)):
        if sizes[i]:
            assert offsets[i] % outputs_plan.ALIGN == 0 and offsets[i] + sizes[i] <= total
        for j in range(i):
            if sizes[i] and sizes[j] and first[i] <= last[j] and first[j] <= last[i]:
                assert offsets[i] + sizes[i] <= offsets[j] or offsets[j] + sizes[j] <= offsets[i], (i, j)


def test_a_chain_needs_only_two_blocks_and_a_route_keeps_its_source_alive():
    # a chain: each block lives until the next one is made, so two blocks' worth is enough
    offsets, total = outputs_plan.place([160] * 6, list(range(6)), [i + 1 for i in range(6)])
    assert total == 320 and len(set(offsets)) == 2
    net = network_from_text(CHAIN_WITH_ROUTE, batch=1)
    assert outputs_plan.last_uses(net.layers) == [5, 2, 3, 4, 5, 5]      # layer 0 is read by the route


CHAIN_WITH_ROUTE = """
[net]
width=12
height=12
channels=3
[convolutional]
filters=4
size=3
pad=1
activation=leaky
[convolutional]
filters=4
size=3
pad=1
activation=leaky
[maxpool]
size=2
stride=2
[upsample]
stride=2
[convolutional]
filters=4
size=1
activation=linear
[route]
layers=-1,0
"""


def _heads(net):
    return [net.layers.index(net.output_layer)] + [l.index for l in net.layers
                                                   if getattr(l, "is_detection_head", False)]


@pytest.mark.parametrize("name", exported_networks())     # one per distinct network, as there
def test_shared_outputs_give_the_same_outputs(name, monkeypatch):
    shared_path("cfg")
    # the same kernels as without sharing (a kept Winograd filter transform, the direct path's
    # inference-only reach or the direct convolution across filters would move layers onto another
    # path: tests/test_winograd.py, tests/test_direct_conv.py and tests/test_direct_fv.py check
    # those)
    monkeypatch.setattr(cw, "KEPT_FILTER_VALUES", 0)
    monkeypatch.setattr(dk, "SMALL_MAX_BATCH_POSITIONS", 0)
    monkeypatch.setattr(conv, "DIRECT_FV", False)
    # nor a convolution averaging first (its rounding: tests/test_avg_fusion.py)
    monkeypatch.setattr(outputs_plan, "AVERAGE_FIRST", False)
    case = ec.prepare(name)                 # built at a small size, random weights, one forward run
    net, x = case.net, case.x
    x2 = np.random.default_rng(1).random(x.shape, dtype=np.float32)
    want = []
    for inp in (x, x2):
        net.forward(inp)
        want.append([net.layers[i].output.copy() for i in _heads(net)])
    net.share_outputs()
    assert net._arena is not None
    net._arena[...] = np.nan
    for inp, ref in zip((x, x2), want):
        net.forward(inp)
        for i, r in zip(_heads(net), ref):
            got = net.layers[i].output
            scale = max(float(np.abs(r).max()), 1e-30)
            assert np.isfinite(got).all() == np.isfinite(r).all(), f"{name}: layer {i} not finite"
            # rounding apart (helpers.py): deep random nets (yolov7x, 160 layers) grow it to ~5e-3
            tol = 1e-6 if blas_splits_exactly() else 2e-2
            assert float(np.abs(got - r).max()) <= tol * scale, f"{name}: layer {i} differs"


SMALL = """
[net]
width=16
height=16
channels=3
batch=2
[convolutional]
filters=8
size=3
pad=1
activation=leaky
[maxpool]
size=2
stride=2
[convolutional]
filters=8
size=3
pad=1
activation=leaky
[connected]
output=5
activation=linear
[softmax]
"""


def test_training_is_refused_until_unshared_and_the_plan_survives_batch_and_size_changes():
    net = network_from_text(SMALL, batch=2)
    x = np.random.default_rng(0).random((2, 3, 16, 16), dtype=np.float32)
    truth = np.eye(5, dtype=np.float32)[[1, 3]]
    ref = net.predict(x)
    net.share_outputs()
    assert np.allclose(net.predict(x), ref, rtol=1e-6, atol=1e-7)
    assert np.shares_memory(net.layers[0].output, net.layers[2].output)     # both in the arena
    with pytest.raises(StateError, match="share_outputs.*unshare_outputs"):
        net.forward(x, truth, train=True)
    net.set_batch(3)
    assert net._arena is not None and np.shares_memory(net.layers[1].output, net._arena)
    assert np.allclose(net.predict(np.concatenate([x, x[:1]]))[:2], ref, rtol=1e-6, atol=1e-7)
    net.unshare_outputs()
    assert net._arena is None and not np.shares_memory(net.layers[0].output, net.layers[2].output)
    net.set_batch(2)
    net.forward(x, truth, train=True)
    net.backward()                                            # training works again


def test_keep_leaves_a_layer_readable_and_bad_indices_are_one_line_errors(monkeypatch):
    monkeypatch.setattr(dk, "SMALL_MAX_BATCH_POSITIONS", 0)     # the same path as without sharing
    monkeypatch.setattr(conv, "DIRECT_FV", False)
    net = network_from_text(SMALL, batch=2)
    x = np.random.default_rng(0).random((2, 3, 16, 16), dtype=np.float32)
    net.forward(x)
    conv2 = net.layers[2].output.copy()
    net.share_outputs(keep=[2])
    net.forward(x)
    assert np.allclose(net.layers[2].output, conv2, rtol=1e-6, atol=1e-7)
    assert not np.shares_memory(net.layers[2].output, net._arena)
    with pytest.raises(StateError, match="no layer 9 .*0..4"):
        net.share_outputs(keep=[9])


def test_memory_given_back_at_batch_64():
    """yolov3-tiny-sized outputs: the arena holds what is alive at once, not every layer."""
    shared_path("cfg")
    from darkpy.cfg import load_cfg
    from darkpy.network import Network
    doc = load_cfg(shared_path("cfg", "pjreddie", "yolov3-tiny.cfg"))
    for key in ("width", "height"):
        doc.set(f"net.{key}", "416")
    net = Network(doc, batch=64, shapes_only=False)
    before = outputs_plan.output_bytes(net.layers)
    saved = net.share_outputs()
    after = outputs_plan.output_bytes(net.layers)
    assert before - after == saved and after < 0.55 * before, (before, after)


_GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def _in_fresh_process(code: str) -> list[str]:
    """Run `code` in a new interpreter (a heap nothing else has used) and return its printed words."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.skipif(not _GLIBC, reason="malloc_trim is glibc's")
def test_freed_heap_memory_is_given_back():
    """Arrays freed in the middle of the C heap stay resident until `release_freed_memory`."""
    ok, before, after = _in_fresh_process("""
        import re
        import numpy as np
        from darkpy.memory import release_freed_memory
        def rss():
            return int(re.search(r"VmRSS:\\s*(\\d+)", open("/proc/self/status").read()).group(1)) // 1024
        big = np.ones(16 << 20, np.uint8)
        del big                                     # glibc's mmap threshold rises to 16 MB
        garbage = [np.ones(1 << 20, np.uint8) for _ in range(40)]     # heap arrays, resident
        top = np.ones(1 << 20, np.uint8)            # keeps the heap's top in use
        del garbage
        before = rss()
        print(release_freed_memory(), before, rss())
    """)
    assert ok == "True" and int(before) - int(after) >= 30, (before, after)


@pytest.mark.skipif(not _GLIBC, reason="malloc_trim is glibc's")
def test_sharing_outputs_leaves_no_freed_buffers_resident():
    """cifar at batch 64: the per-layer outputs `share_outputs` replaces are not left in the heap
    (72 MB of it resident before `Network.allocate` gave them back)."""
    shared_path("cfg")
    before, after = _in_fresh_process(f"""
        import re
        from darkpy.cfg import load_cfg
        from darkpy.memory import release_freed_memory
        from darkpy.network import Network
        def rss():
            return int(re.search(r"VmRSS:\\s*(\\d+)", open("/proc/self/status").read()).group(1)) // 1024
        net = Network(load_cfg({str(shared_path("cfg", "pjreddie", "cifar.cfg"))!r}), batch=64)
        net.share_outputs()
        before = rss()
        release_freed_memory()
        print(before, rss())
    """)
    assert int(before) - int(after) < 8, (before, after)


def test_a_fused_pool_never_shares_memory_with_the_convolutions_input():
    """A convolution that writes the [maxpool] after it writes the pool's output while it still
    reads its own input (in parallel blocks), so the plan counts the pool's output as born at the
    convolution: the two never overlap, and the outputs equal the unshared network's."""
    text = SMALL.replace("[convolutional]\nfilters=8\nsize=3\npad=1\nactivation=leaky\n[maxpool]",
                         "[convolutional]\nfilters=8\nsize=3\npad=1\nactivation=leaky\n"
                         "[convolutional]\nfilters=8\nsize=3\npad=1\nactivation=leaky\n[maxpool]", 1)
    net = network_from_text(text, batch=2)
    x = np.random.default_rng(0).random((2, 3, 16, 16), dtype=np.float32)
    ref = net.predict(x)
    net.share_outputs()
    conv1, pool = net.layers[1], net.layers[2]
    assert conv1.pool_into is pool                              # the pool is fused
    assert np.shares_memory(net.layers[0].output, net._arena)   # the convolution's input is shared
    assert not np.shares_memory(net.layers[0].output, pool.output)
    assert outputs_plan.born(net.layers)[2] == 1
    assert np.allclose(net.predict(x), ref, rtol=1e-5, atol=1e-6)


# yolov4-tiny's pattern, smaller: a route of half a layer's channels (AlexeyAB's groups), routes of
# two layers, a layer that two routes of several parts read (only the first hosts it), a route of a
# whole layer, and one naming a layer twice
ROUTES = """
[net]
width=16
height=16
channels=3
[convolutional]
filters=8
size=3
pad=1
activation=leaky
[route]
layers=-1
groups=2
group_id=1
[convolutional]
filters=4
size=3
pad=1
activation=leaky
[convolutional]
filters=4
size=3
pad=1
activation=leaky
[route]
layers=-1,-2
[convolutional]
filters=8
size=1
activation=leaky
[route]
layers=-6,-1
[route]
layers=-2,-1
[route]
layers=-3
[route]
layers=-1,-1
[convolutional]
filters=3
size=1
activation=linear
"""


def _route_network(batch):
    net = network_from_text(ROUTES, batch=batch)
    x = np.random.default_rng(0).random((batch, 3, 16, 16), dtype=np.float32)
    net.forward(x)
    ref = [layer.output.copy() for layer in net.layers]
    return net, x, ref


def test_routes_at_batch_1_are_written_in_place_and_give_the_same_outputs():
    """At batch 1 the sources of a route write into its output (their outputs are views of it) and
    a route of part of one layer is a view of that part: the routes copy only the parts that could
    not be placed, and the outputs are the unshared network's, bit for bit, with the arena full of
    NaN first and the plan made twice (set_batch)."""
    net, x, ref = _route_network(1)
    net.share_outputs()
    net.set_batch(1)
    L = net.layers
    assert [L[i].in_place for i in (1, 4, 6, 7, 8, 9)] == [
        [True], [True, True], [True, True], [False, True], [True], [False, False]]
    # layers 0 and 5 write route 6's output, which route 7's second part holds (its first, layer 5
    # again, is copied); route 1 views layer 0's second half, route 8 layer 5
    assert np.shares_memory(L[0].output, L[6].output) and np.shares_memory(L[5].output, L[6].output)
    assert np.shares_memory(L[1].output, L[0].output[:, 4:]) and not np.shares_memory(L[1].output, L[0].output[:, :4])
    assert np.shares_memory(L[3].output, L[4].output) and np.shares_memory(L[2].output, L[4].output)
    assert np.shares_memory(L[7].output[:, 8:], L[6].output)
    assert not np.shares_memory(L[7].output[:, :8], L[5].output)
    assert L[8].output.base is not None and np.shares_memory(L[8].output, L[5].output)
    net._arena[...] = np.nan
    net.forward(x)
    assert_same_bits(L[-1].output, ref[-1])
    for i in (0, 5, 6, 7, 8, 9):      # every route's sources stay readable until its last reader
        assert_same_bits(L[i].output, ref[i], str(i))


def test_routes_at_a_larger_batch_view_only_whole_layers():
    """At batch 2 an item's part is not contiguous in the batch: only the route of one whole layer
    is a view; the others copy, and the outputs are the same."""
    net, x, ref = _route_network(2)
    net.share_outputs()
    L = net.layers
    assert [L[i].in_place for i in (1, 4, 6, 7, 8, 9)] == [
        [False], [False, False], [False, False], [False, False], [True], [False, False]]
    assert L[8].output.base is not None and np.shares_memory(L[8].output, L[5].output)
    net._arena[...] = np.nan
    net.forward(x)
    assert_same_bits(L[-1].output, ref[-1])
    net.unshare_outputs()
    assert not any(any(L[i].in_place) for i in (1, 4, 6, 7, 8, 9))
    net.forward(x)
    assert_same_bits(L[-1].output, ref[-1])


def test_route_views_off_copies_every_part(monkeypatch):
    monkeypatch.setattr(outputs_plan, "ROUTE_VIEWS", False)
    net, x, ref = _route_network(1)
    net.share_outputs()
    assert not any(any(layer.in_place) for layer in net.layers if layer.kind == "route")
    net.forward(x)
    assert_same_bits(net.layers[-1].output, ref[-1])


DROPOUTS = """
[net]
width=8
height=8
channels=3
[dropout]
probability=0.3
[convolutional]
filters=8
size=3
pad=1
activation=leaky
[dropout]
probability=0.5
[convolutional]
filters=4
size=1
activation=linear
[dropout]
probability=0.5
"""


@pytest.mark.parametrize("batch", [1, 3])
def test_dropouts_at_inference_are_views_of_their_input(batch):
    """A [dropout] infers as the identity: with outputs shared its output is a view of its input
    and nothing is copied, where it is not kept and has a layer before it (the first one copies
    the network's input; the last, the network's output, keeps its buffer). The outputs are the
    unshared network's, bit for bit; training after unsharing drops values again."""
    net = network_from_text(DROPOUTS, batch=batch)
    x = np.random.default_rng(6).uniform(-1, 1, net.input.shape).astype(np.float32)
    ref = net.forward(x).copy()
    net.share_outputs()
    L = net.layers
    assert [L[i].in_place for i in (0, 2, 4)] == [[], [True], [False]]
    assert L[2].output.base is not None and np.shares_memory(L[2].output, L[1].output)
    net._arena[...] = np.nan
    np.testing.assert_array_equal(net.forward(x), ref)
    net.unshare_outputs()
    assert not any(L[i].in_place[:1] == [True] for i in (0, 2, 4))
    net.forward(x, np.zeros((batch, net.truths), np.float32), train=True)
    assert L[2].masked and not np.array_equal(L[2].output, L[1].output)
