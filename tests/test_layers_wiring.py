"""Wiring layers: [route], [shortcut], [upsample], [reorg], [reorg3d], [crop], [sam], [scale_channels].

Forward against Darknet goldens layer by layer, backward against float64 central differences,
the accumulation rule (an output read by a route AND a shortcut gets the sum of both paths'
gradients), resize, and the one-line errors for wiring that cannot work.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from darkpy.cfg import CfgWarning
from darkpy.errors import CfgError
from darkpy.kernels import PARALLEL_MIN
from darkpy.layers import route as route_kernels
from darkpy.layers.base import State
from darkpy.network import load_network, network_from_text
from helpers import assert_close, golden_dir, golden_meta, layer_gradcheck, numerical_grad, read_f32

NET = "[net]\nwidth={w}\nheight={h}\nchannels={c}\n"
HOLD = "[activation]\nactivation=linear\n"      # layer 0: holds the input, so it has a delta


def cfg(*sections: str, w: int = 4, h: int = 4, c: int = 2) -> str:
    return NET.format(w=w, h=h, c=c) + "\n".join(sections)


# -- goldens ---------------------------------------------------------------------------------------
def _shapes(d) -> list[tuple[int, ...]]:
    rows = []
    for line in (d / "shapes.txt").read_text().split("\n"):
        if line.strip():
            _, _, w, h, c, n = line.split()
            rows.append((int(w), int(h), int(c), int(n)))
    return rows


@pytest.mark.parametrize("name", ["route", "shortcut", "upsample", "reorg", "crop"])
def test_forward_matches_darknet_golden(name):
    d = golden_dir("forward", name)
    meta = golden_meta(d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CfgWarning)      # route golden: a flat route, warned about
        net = load_network(d / "net.cfg", d / "net.weights")
    net.forward(read_f32(d / "input.f32").reshape(net.input.shape))
    for layer, (w, h, c, n) in zip(net.layers, _shapes(d)):
        assert layer.outputs == n, f"layer {layer.index} outputs"
        if w:
            assert layer.out_shape == (c, h, w), f"layer {layer.index} shape"
        else:
            assert layer.out_shape == (n,), f"layer {layer.index} should be flat"
    for spec in meta["layers"]:
        i = spec["index"]
        assert_close(net.layers[i].output.reshape(-1), read_f32(d / spec["file"]), 1e-5, 1e-5,
                     f"{name} layer {i} ({spec['type']})")


# -- gradient checks (float64, central differences) -------------------------------------------------
GRADCHECKS = {
    "route_unsorted_three_sources": (cfg(
        HOLD, "[convolutional]\nfilters=3\nsize=1\nactivation=linear",
        "[maxpool]\nsize=2\nstride=2", "[route]\nlayers=1,0,-2"), 3),
    "route_flat_different_sizes": (cfg(
        HOLD, "[maxpool]\nsize=2\nstride=2", "[route]\nlayers=1,0"), 2),
    "route_groups": (cfg(
        HOLD, "[convolutional]\nfilters=4\nsize=1\nactivation=linear",
        "[route]\nlayers=-1,0\ngroups=2\ngroup_id=1"), 2),
    "shortcut_same_shape_leaky": (cfg(
        HOLD, "[convolutional]\nfilters=2\nsize=1\nactivation=linear", "[shortcut]\nfrom=0\nactivation=leaky"), 2),
    "shortcut_from_larger_fewer_channels": (cfg(
        HOLD, "[convolutional]\nfilters=3\nsize=2\nstride=2\nactivation=linear",
        "[shortcut]\nfrom=0\nactivation=logistic"), 2),
    "shortcut_from_smaller_alpha_beta": (cfg(
        HOLD, "[maxpool]\nsize=2\nstride=2", "[route]\nlayers=0",
        "[shortcut]\nfrom=1\nalpha=0.5\nbeta=2\nactivation=linear"), 3),
    "shortcut_from_previous_swish": (cfg(HOLD, "[shortcut]\nfrom=-1\nactivation=swish\nbeta=0.3"), 1),
    "shortcut_list_of_froms": (cfg(
        HOLD, "[convolutional]\nfilters=2\nsize=1\nactivation=linear",
        "[convolutional]\nfilters=2\nsize=1\nactivation=linear", "[shortcut]\nfrom=0,-2\nbeta=1.5"), 3),
    "shortcut_flat": (cfg(
        HOLD, "[connected]\noutput=5\nactivation=linear", "[connected]\noutput=3\nactivation=linear",
        "[shortcut]\nfrom=1\nactivation=tanh"), 3),
    "upsample_2": (cfg(HOLD, "[upsample]\nstride=2"), 1),
    "upsample_3_scale": (cfg(HOLD, "[upsample]\nstride=3\nscale=0.5", w=3, h=2), 1),
    "downsample_2": (cfg(HOLD, "[upsample]\nstride=-2\nscale=1.5"), 1),
    "downsample_odd_size": (cfg(HOLD, "[upsample]\nstride=-2", w=5, h=5), 1),
    "reorg_2": (cfg(HOLD, "[reorg]\nstride=2", c=4), 1),
    "reorg_reverse": (cfg(HOLD, "[reorg]\nstride=2\nreverse=1", c=8, w=3, h=2), 1),
    "reorg_flatten": (cfg(HOLD, "[reorg]\nflatten=1", c=3, w=3, h=2), 1),
    "reorg_flatten_reverse": (cfg(HOLD, "[reorg]\nflatten=1\nreverse=1", c=3, w=3, h=2), 1),
    "reorg_extra": (cfg(HOLD, "[reorg]\nextra=5"), 1),
    "reorg3d": (cfg(HOLD, "[reorg3d]\nstride=2", c=3), 1),
    "reorg3d_reverse": (cfg(HOLD, "[reorg3d]\nstride=2\nreverse=1", c=8, w=3, h=2), 1),
    "sam_logistic": (cfg(
        HOLD, "[convolutional]\nfilters=2\nsize=1\nactivation=linear", "[sam]\nfrom=0\nactivation=logistic"), 2),
    "sam_from_previous": (cfg(HOLD, "[sam]\nfrom=-1"), 1),
    "scale_channels": (cfg(
        HOLD, "[avgpool]", "[convolutional]\nfilters=2\nsize=1\nactivation=logistic",
        "[scale_channels]\nfrom=0\nactivation=leaky"), 3),
    "scale_channels_wh": (cfg(
        HOLD, "[convolutional]\nfilters=1\nsize=1\nactivation=logistic", "[scale_channels]\nfrom=0\nscale_wh=1"), 2),
}


@pytest.mark.filterwarnings("ignore::darkpy.cfg.CfgWarning")     # route_flat_different_sizes
@pytest.mark.parametrize("name", list(GRADCHECKS))
def test_backward_matches_numerical_gradient(name):
    text, index = GRADCHECKS[name]
    layer_gradcheck(text, index, rtol=1e-6, atol=1e-8)


def test_crop_has_no_backward():
    """Gradients stop at a crop (Darknet has no crop backward): nothing reaches the layer before."""
    net = network_from_text(cfg(HOLD, "[crop]\ncrop_width=3\ncrop_height=2"), dtype=np.float64)
    net.forward(np.random.default_rng(0).uniform(size=net.input.shape), train=True)
    net.layers[1].delta[...] = 1.0
    net.layers[1].backward(State(net.layers[0].output, net.layers[0].delta, None, True, net.layers))
    assert not net.layers[0].delta.any()


# -- the accumulation rule ----------------------------------------------------------------------------
SHARED = cfg(
    HOLD,
    "[upsample]\nstride=1\nscale=0.7",               # 1: A, read by layers 2, 3, 4 and 5
    "[activation]\nactivation=logistic",             # 2: reads A as its input
    "[shortcut]\nfrom=1\nactivation=leaky",          # 3: A as `from`
    "[route]\nlayers=1,3",                           # 4: A as a route source
    "[shortcut]\nfrom=1\nalpha=0.5\nbeta=2",         # 5: A as `from` again, over half the channels
    "[cost]\ntype=sse", c=2, w=3, h=3)


def test_output_read_by_route_and_shortcut_gets_the_sum_of_both_gradients():
    """Layer 1's delta after Network.backward must be the full derivative through all four readers.
    Backward runs 5, 4, 3, 2: if route (4), shortcut (3) or the activation (2) overwrote layer 1's
    delta instead of adding, the earlier readers' contributions would be lost and this would fail."""
    net = network_from_text(SHARED, dtype=np.float64)
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, net.input.shape)
    truth = rng.uniform(-1, 1, net.truth.shape)
    results = []
    for _ in range(2):          # twice: deltas must be re-zeroed, not carried over, at each forward
        net.forward(x, truth, train=True)
        net.backward()
        results.append(net.layers[1].delta.copy())
    assert_close(results[1], results[0], 0, 0, "second pass")
    # The chain from layer 5 back to layer 1 is linear in layer 5's delta r: with r fixed,
    # layer 1's delta must equal d/dA sum(r * out5), A = layer 1's output.
    r = net.layers[5].delta.copy()
    s = State(net.layers[1].output, net.layers[1].delta, None, True, net.layers)

    def f() -> float:
        for layer in net.layers[2:6]:
            layer.forward(s)
            s.input = layer.output
        s.input = net.layers[1].output
        return float((r * net.layers[5].output).sum())

    expected = numerical_grad(f, net.layers[1].output)
    assert_close(results[0], expected, 1e-6, 1e-8, "layer 1 delta (sum of four readers)")
    # and each reader really contributes: the route path alone is not the whole gradient
    assert np.abs(expected).max() > 0.1


# -- resize -----------------------------------------------------------------------------------------
RESIZE_NET = """[net]
width={w}
height={h}
channels=3
[convolutional]
filters=4
size=3
stride=1
pad=1
activation=leaky
[maxpool]
size=2
stride=2
[convolutional]
filters=8
size=3
stride=1
pad=1
activation=leaky
[maxpool]
size=2
stride=2
[convolutional]
filters=8
size=1
stride=1
activation=leaky
[upsample]
stride=2
[route]
layers=-1,2
[convolutional]
filters=8
size=1
stride=1
activation=linear
[shortcut]
from=2
activation=leaky
[upsample]
stride=-2
[avgpool]
[scale_channels]
from=8
[reorg3d]
stride=2
"""


def test_resize_recomputes_shapes_buffers_and_outputs():
    net = load_network_text(RESIZE_NET.format(w=16, h=16), batch=2)
    net.resize(24, 32)
    fresh = load_network_text(RESIZE_NET.format(w=24, h=32), batch=2)
    for a, b in zip(net.layers, fresh.layers):
        assert a.out_shape == b.out_shape, f"layer {a.index} {a.kind}"
        assert a.output.shape == (2, *b.out_shape), f"layer {a.index} buffers"
        assert a.delta.size == 0, f"layer {a.index}: training buffers are dropped by resize"
        for wa, wb in zip(a.weight_arrays(), b.weight_arrays()):
            np.copyto(wb, wa)
    # the SE layer's input (avgpool, 8x1x1) keeps its shape; it must still follow its `from` layer
    assert net.layers[11].out_shape == (8, 16, 12)
    x = np.random.default_rng(0).uniform(size=net.input.shape)
    net.forward(x)
    fresh.forward(x)
    for a, b in zip(net.layers, fresh.layers):
        assert_close(a.output, b.output, 1e-6, 1e-6, f"layer {a.index} {a.kind} after resize")


def load_network_text(text: str, batch: int):
    return network_from_text(text, batch=batch)


def test_resize_keeps_crop_ratio_like_darknet():
    net = network_from_text(cfg("[crop]\ncrop_width=5\ncrop_height=6", w=10, h=8, c=1))
    net.resize(20, 12)
    # darknet: both sizes use crop_height/h = 0.75 (float32), truncated
    assert net.layers[0].out_shape == (1, 9, 15)
    assert net.layers[0].output.shape == (1, 1, 9, 15)


def test_batch_items_are_independent():
    """A batch of two gives each item the output it gets alone (incl. the odd-size downsample)."""
    text = cfg(HOLD, "[upsample]\nstride=-2", "[reorg]\nextra=3", "[route]\nlayers=0,-1", w=5, h=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CfgWarning)      # the flat route is warned about
        net = network_from_text(text, batch=2)
    x = np.random.default_rng(1).uniform(size=net.input.shape).astype(np.float32)
    both = net.forward(x).copy()
    net.set_batch(1)
    for b in range(2):
        assert_close(net.forward(x[b:b + 1]), both[b:b + 1], 0, 0, f"item {b}")


# -- crop in training ---------------------------------------------------------------------------------
def test_crop_training_draws_random_windows_and_flips():
    net = network_from_text(cfg("[crop]\ncrop_width=3\ncrop_height=2\nflip=1", w=5, h=4, c=2))
    x = np.random.default_rng(0).uniform(size=net.input.shape).astype(np.float32)
    seen = set()
    for _ in range(60):
        out = net.forward(x, train=True)[0]
        hits = [(dh, dw, f) for dh in range(3) for dw in range(3) for f in (0, 1)
                if np.array_equal(out, (x[0, :, dh:dh + 2, dw:dw + 3][..., ::-1 if f else 1]) * 2 - 1)]
        assert hits, "training crop is not a (flipped) window of the input"
        seen.update(hits)
    assert len({(dh, dw) for dh, dw, _ in seen}) > 4 and {f for *_, f in seen} == {0, 1}
    centre = net.forward(x, train=False)[0]
    assert np.array_equal(centre, x[0, :, 1:3, 1:4] * 2 - 1)


# -- errors ------------------------------------------------------------------------------------------
def _error(text: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CfgWarning)
        with pytest.raises(CfgError) as e:
            network_from_text(text)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_route_without_layers_is_an_error():
    msg = _error(cfg(HOLD, "[route]\ngroups=1"))
    assert "layers" in msg and "missing" in msg


def test_route_reference_out_of_range():
    msg = _error(cfg(HOLD, "[route]\nlayers=-3"))
    assert "layers" in msg and "outside 0..0" in msg


def test_route_of_different_sizes_warns_then_image_layer_fails():
    text = cfg(HOLD, "[maxpool]\nsize=2\nstride=2", "[route]\nlayers=0,1")
    with pytest.warns(CfgWarning, match=r"4x4x2.*2x2x2.*flat vector of 40"):
        net = network_from_text(text)
    assert net.layers[2].out_shape == (40,)
    msg = _error(text + "\n[convolutional]\nfilters=2\nsize=1")
    assert "must output an image" in msg


def test_route_groups_must_divide_channels():
    assert "not divisible by groups=2" in _error(cfg(HOLD, "[route]\nlayers=0\ngroups=2", c=3))


def test_shortcut_mismatch_image_and_flat():
    msg = _error(cfg(HOLD, "[connected]\noutput=8", "[shortcut]\nfrom=0"))
    assert "shortcut mismatch" in msg and "4x4x2" in msg and "8 (flat)" in msg


def test_shortcut_mismatch_on_uneven_ratio():
    # from 4x4, previous 4x2 (width same, height halved): darknet asserts
    msg = _error(cfg(HOLD, "[maxpool]\nsize=1\nstride_x=1\nstride_y=2", "[shortcut]\nfrom=0"))
    assert "shortcut mismatch" in msg and "4x4x2" in msg and "4x2x2" in msg


@pytest.mark.parametrize("section, words", [
    ("[shortcut]\nfrom=0\nweights_type=per_feature", ["not supported", "weights_type"]),
    ("[shortcut]\nfrom=0,0\nalpha=0.5", ["alpha"]),
    ("[upsample]\nstride=0", ["stride"]),
    ("[upsample]\nstride=-8", ["smaller than the downsampling"]),
    ("[reorg]\nstride=3", ["divisible"]),
    ("[reorg3d]\nstride=3", ["divisible"]),
    ("[reorg]\nstride=2\nreverse=1", ["divisible by stride²=4"]),
    ("[crop]\ncrop_width=9", ["crop_width", "1..4"]),
    ("[sam]\nfrom=0", ["equal shapes"]),
    ("[scale_channels]\nfrom=0", ["1x1x2"]),
])
def test_bad_wiring_is_a_one_line_error(section, words):
    text = cfg(HOLD, "[maxpool]\nsize=2\nstride=2", section) if section.startswith(("[sam]", "[scale")) \
        else cfg(HOLD, section)
    msg = _error(text)
    for w in words:
        assert w in msg, msg


def test_reorg3d_is_tensorflow_space_to_depth_and_reverse_inverts_it():
    net = network_from_text(cfg(HOLD, "[reorg3d]\nstride=2", "[reorg3d]\nstride=2\nreverse=1", c=3, w=4, h=6))
    x = np.random.default_rng(2).uniform(size=net.input.shape).astype(np.float32)
    net.forward(x)
    y = net.layers[1].output[0]
    c, s = 3, 2
    for dy in range(s):
        for dx in range(s):
            for k in range(c):      # output channel (dy*s + dx)*c + k, as tf.nn.space_to_depth
                assert np.array_equal(y[(dy * s + dx) * c + k], x[0, k, dy::s, dx::s])
    assert np.array_equal(net.layers[2].output, x)


# -- AlexeyAB's attention layers against OpenCV's Darknet importer ------------------------------------
ATTENTION_NET = cfg(
    "[convolutional]\nfilters=8\nsize=3\nstride=1\npad=1\nactivation=leaky",
    "[avgpool]",
    "[convolutional]\nfilters=8\nsize=1\nstride=1\nactivation=logistic",
    "[scale_channels]\nfrom=-3",                                   # 3
    "[convolutional]\nfilters=8\nsize=1\nstride=1\nactivation=logistic",
    "[sam]\nfrom=-2",                                              # 5
    "[shortcut]\nfrom=-3",            # 6 (OpenCV ignores a shortcut activation)
    w=8, h=6, c=3)


def test_sam_and_scale_channels_match_opencv(tmp_path):
    """No Darknet golden covers these AlexeyAB layers; OpenCV's importer implements them. (OpenCV
    takes only the first entry of a `from` list, so the list form is checked by gradients alone.)"""
    cv2 = pytest.importorskip("cv2")
    (tmp_path / "net.cfg").write_text(ATTENTION_NET)
    net = load_network(tmp_path / "net.cfg")
    rng = np.random.default_rng(0)
    for layer in net.layers:
        for a in layer.weight_arrays():
            a[...] = rng.uniform(-0.5, 0.5, a.shape)
    net.save_weights(tmp_path / "net.weights")
    x = rng.uniform(0, 1, net.input.shape).astype(np.float32)
    net.forward(x)
    cv = cv2.dnn.readNetFromDarknet(str(tmp_path / "net.cfg"), str(tmp_path / "net.weights"))
    cv.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    names = ["scale_channels_3", "sam_5", "shortcut_6"]
    cv.setInput(x)
    for name, out in zip(names, cv.forward(names)):
        i = int(name.rsplit("_", 1)[1])
        assert_close(net.layers[i].output, out.reshape(net.layers[i].output.shape), 1e-5, 1e-6, name)


@pytest.mark.parametrize("batch", [1, 3])
def test_large_route_with_groups_is_the_concatenation_and_adds_back(batch):
    """A route of two large sources (several spans of the parallel copy, strided rows, AlexeyAB's
    group_id) outputs the concatenation of the chosen chunks, and its backward adds its delta
    into each source's delta (not overwriting what was there)."""
    text = cfg("[convolutional]\nfilters=8\nsize=1\nactivation=linear",
               "[convolutional]\nfilters=6\nsize=1\nactivation=linear",
               "[route]\nlayers=0,1\ngroups=2\ngroup_id=1", w=96, h=90, c=2)
    net = network_from_text(text.replace("[net]\n", f"[net]\nbatch={batch}\n"), dtype=np.float64)
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, net.input.shape)
    net.forward(x)
    a, b = (net.layers[i].output.reshape(batch, -1) for i in (0, 1))
    half_a, half_b = a.shape[1] // 2, b.shape[1] // 2
    want = np.concatenate([a[:, half_a:], b[:, half_b:]], axis=1)
    assert min(half_a, half_b) > route_kernels.SPAN     # several parallel tasks per part
    assert net.layers[2].output.size >= PARALLEL_MIN
    np.testing.assert_array_equal(net.layers[2].output.reshape(batch, -1), want)
    before = [rng.uniform(-1, 1, net.layers[i].delta.shape) for i in (0, 1)]
    for i in (0, 1):
        net.layers[i].delta[...] = before[i]
    route = net.layers[2]
    route.delta[...] = rng.uniform(-1, 1, route.delta.shape)
    route.backward(State(None, None, None, True, net.layers))
    d = route.delta.reshape(batch, -1)
    got0, got1 = (net.layers[i].delta.reshape(batch, -1) for i in (0, 1))
    was0, was1 = (x.reshape(batch, -1) for x in before)
    np.testing.assert_array_equal(got0[:, :half_a], was0[:, :half_a])
    np.testing.assert_array_equal(got0[:, half_a:], was0[:, half_a:] + d[:, :half_a])
    np.testing.assert_array_equal(got1[:, :half_b], was1[:, :half_b])
    np.testing.assert_array_equal(got1[:, half_b:], was1[:, half_b:] + d[:, half_a:])
