"""[maxpool], [avgpool], [local_avgpool]: Darknet goldens, a slow numpy reference of the window
geometry, float64 gradient checks, shapes and cfg errors."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy import CfgError
from darkpy.kernels import PARALLEL_MIN
from darkpy.layers.base import State
from darkpy.layers.pooling import EMPTY, avgpool_forward
from darkpy.network import network_from_text
from helpers import assert_close, layer_gradcheck
from layer_checks import check_outputs, run_golden, run_standalone


def ref_pool(x, size, sy, sx, padding, op):
    """x (c, h, w) -> Darknet-geometry pooling in float64: window origin C's -padding/2, total
    padding `padding`, out-of-image positions ignored (max) or excluded from the count (mean)."""
    c, h, w = x.shape
    off = -int(padding / 2)                  # C integer division truncates toward zero
    oh, ow = (h + padding - size) // sy + 1, (w + padding - size) // sx + 1
    out = np.zeros((c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            y0, x0 = off + i * sy, off + j * sx
            win = x[:, max(y0, 0):max(y0 + size, 0), max(x0, 0):max(x0 + size, 0)].reshape(c, -1)
            out[:, i, j] = win.max(axis=1) if op == "max" else win.mean(axis=1)
    return out


def pool_net(section: str, c=2, h=7, w=9, batch=2, dtype=np.float64):
    return network_from_text(f"[net]\nbatch={batch}\nwidth={w}\nheight={h}\nchannels={c}\n\n[activation]\n\n"
                             f"{section}\n", dtype=dtype)


# -- goldens ----------------------------------------------------------------------------------------
def test_maxpool_golden_whole_network():
    net, d = run_golden("maxpool")
    check_outputs(net, d)


@pytest.mark.parametrize("index", [1, 3, 5, 7, 9, 11])
def test_maxpool_golden_each_layer_alone(index):
    run_standalone("maxpool", index, 0)


def test_avgpool_golden_whole_network():
    net, d = run_golden("avgpool")
    check_outputs(net, d)


@pytest.mark.parametrize("index,source", [(0, None), (3, 2)])
def test_avgpool_golden_alone(index, source):
    run_standalone("avgpool", index, source)


def test_avgpool_sums_in_darknets_order():
    """float32 global average: Darknet's loop, a float32 sum in input order, then / (h·w) — the
    same bits as that order computed here (numpy's pairwise sum differs in the last bits)."""
    net = pool_net("[avgpool]", c=5, h=13, w=11, batch=3, dtype=np.float32)
    x = np.random.default_rng(7).uniform(-1e3, 1e3, net.input.shape).astype(np.float32)
    net.forward(x)
    flat = x.reshape(15, -1)
    acc = np.zeros(15, np.float32)
    for j in range(flat.shape[1]):
        acc += flat[:, j]
    assert np.array_equal(net.output.reshape(-1), acc / np.float32(flat.shape[1]))
    assert not np.array_equal(acc, np.sum(flat, axis=1))      # the order is visible at this size


@pytest.mark.parametrize("c, batch", [(5, 3), (67, 9)])        # 15 rows; 603 rows of 143: the parallel loop
def test_avgpool_kernel_sums_in_order(c, batch):
    """avgpool_forward on both sides of its parallel threshold, and row counts that are not a
    multiple of its group of rows: every row the float32 sum in input order, / S."""
    x = np.random.default_rng(c).uniform(-1e3, 1e3, (c * batch, 13 * 11)).astype(np.float32)
    assert (x.size >= PARALLEL_MIN) == (c > 5)
    out = np.full(x.shape[0], np.nan, np.float32)
    avgpool_forward(out, x)
    acc = np.zeros(x.shape[0], np.float32)
    for j in range(x.shape[1]):
        acc += x[:, j]
    assert np.array_equal(out, acc / np.float32(x.shape[1]))


# -- geometry against the numpy reference -------------------------------------------------------------
GEOMETRIES = [  # size, stride_y, stride_x, padding (None = default size-1)
    (2, 2, 2, None), (2, 1, 1, None), (3, 2, 2, None), (3, 2, 2, 0), (3, 1, 1, None), (5, 1, 1, 4),
    (4, 1, 1, 3),    # odd padding: origin -1 (C truncation), not -2
    (3, 3, 3, 1), (3, 1, 2, None), (2, 2, 1, 0), (4, 3, 2, 5),
]


def _section(kind, size, sy, sx, padding):
    s = f"[{kind}]\nsize={size}\n" + (f"stride={sy}\n" if sy == sx else f"stride_x={sx}\nstride_y={sy}\n")
    return s + ("" if padding is None else f"padding={padding}\n")


@pytest.mark.parametrize("kind,op", [("maxpool", "max"), ("local_avgpool", "mean")])
@pytest.mark.parametrize("size,sy,sx,padding", GEOMETRIES)
def test_window_pool_matches_reference(kind, op, size, sy, sx, padding):
    net = pool_net(_section(kind, size, sy, sx, padding))
    x = np.random.default_rng(size * 7 + sy).uniform(-1, 1, net.input.shape)
    net.forward(x)
    pad = size - 1 if padding is None else padding
    for b in range(2):
        assert_close(net.layers[1].output[b], ref_pool(x[b], size, sy, sx, pad, op), 1e-12, 1e-12, kind)


def ref_argmax(x, size, sy, sx, padding):
    """x (c, h, w) -> (max, flat index into x) of each window, in float64: the FIRST maximum in
    row-major window order over the in-image positions (Darknet's `>`); (EMPTY, -1) for a window
    with no in-image position."""
    c, h, w = x.shape
    off = -int(padding / 2)
    oh, ow = (h + padding - size) // sy + 1, (w + padding - size) // sx + 1
    out, idx = np.full((c, oh, ow), EMPTY), np.full((c, oh, ow), -1)
    for k in range(c):
        for i in range(oh):
            for j in range(ow):
                for y in range(off + i * sy, off + i * sy + size):
                    for xx in range(off + j * sx, off + j * sx + size):
                        if 0 <= y < h and 0 <= xx < w and (idx[k, i, j] < 0 or x[k, y, xx] > out[k, i, j]):
                            out[k, i, j], idx[k, i, j] = x[k, y, xx], (k * h + y) * w + xx
    return out, idx


@pytest.mark.parametrize("size,sy,sx,padding", GEOMETRIES + [(2, 1, 1, 5), (3, 2, 2, 6), (2, 2, 2, 0), (2, 1, 1, 0),
                                                 (2, 2, 2, 2)])   # 2x2/2 from offset 0, and from -1
@pytest.mark.parametrize("c", [3, 120])     # 120 planes: above PARALLEL_MIN inputs, the parallel loop
@pytest.mark.parametrize("h,w", [(13, 17), (12, 16)])   # 2x2/2 from offset 0: `maxpool_2x2`
def test_maxpool_argmax_and_inference_pass_match_reference(size, sy, sx, padding, c, h, w):
    """The training pass records the first maximum's index (many ties: values from a small set) at
    every window position, edge windows and windows entirely outside the image included; the
    inference pass, which records none, outputs the same values."""
    pad = size - 1 if padding is None else padding
    if (h + pad - size) // sy + 1 < 1 or (w + pad - size) // sx + 1 < 1:
        pytest.skip("window does not fit")
    net = pool_net(_section("maxpool", size, sy, sx, padding), c=c, h=h, w=w, batch=2, dtype=np.float32)
    layer = net.layers[1]
    assert (net.layers[0].output.size >= PARALLEL_MIN) == (c == 120)
    x = np.random.default_rng(size + 10 * sy + 100 * sx).integers(-3, 4, net.input.shape).astype(np.float32)
    net.forward(x, train=True)
    trained = layer.output.copy()
    for b in range(2):
        out, idx = ref_argmax(x[b].astype(np.float64), size, sy, sx, pad)
        assert np.array_equal(trained[b], out)
        assert np.array_equal(layer.indexes[b], idx)      # flat into the item, -1: none
    layer.output.fill(7)
    net.forward(x)
    assert np.array_equal(layer.output, trained)


@pytest.mark.parametrize("h,size,stride,padding,expected", [
    (13, 2, 2, None, 7), (13, 2, 1, None, 13), (7, 3, 2, None, 4), (4, 3, 2, 0, 1), (4, 2, 2, 0, 2)])
def test_maxpool_output_sizes(h, size, stride, padding, expected):
    net = pool_net(_section("maxpool", size, stride, stride, padding), c=1, h=h, w=h, batch=1)
    assert net.layers[1].out_shape == (1, expected, expected)


def test_maxpool_size_defaults_to_stride():
    net = pool_net("[max]\nstride=3", c=1, h=9, w=9, batch=1)
    layer = net.layers[1]
    assert (layer.size, layer.padding, layer.out_shape) == (3, 2, (1, 3, 3))   # (9 + 2 - 3)//3 + 1


def test_avgpool_is_global_mean():
    net = pool_net("[avg]", c=3, h=5, w=7)
    x = np.random.default_rng(0).uniform(-1, 1, net.input.shape)
    out = net.forward(x)
    assert out.shape == (2, 3, 1, 1)
    assert_close(out[:, :, 0, 0], x.mean(axis=(2, 3)), 1e-12, 1e-12)


# -- gradients ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["maxpool", "local_avgpool"])
@pytest.mark.parametrize("size,sy,sx,padding", [(2, 2, 2, None), (3, 1, 1, None), (3, 2, 1, 0), (4, 1, 2, 3),
                                                (5, 1, 1, 4)])
def test_window_pool_gradcheck(kind, size, sy, sx, padding):
    h, w = 5, 6
    cfg = f"[net]\nbatch=2\nwidth={w}\nheight={h}\nchannels=2\n\n[activation]\n\n" + _section(kind, size, sy, sx,
                                                                                               padding)
    layer_gradcheck(cfg, 1)


def test_avgpool_gradcheck():
    layer_gradcheck("[net]\nbatch=2\nwidth=4\nheight=3\nchannels=3\n\n[activation]\n\n[avgpool]\n", 1)


def test_maxpool_backward_adds_only_at_the_argmax():
    net = pool_net("[maxpool]\nsize=2\nstride=2", c=1, h=2, w=2, batch=1)
    net.forward(np.array([[[[0.1, 0.7], [0.3, -0.2]]]]), train=True)    # records the argmaxes
    assert net.layers[1].indexes.reshape(-1).tolist() == [1]
    net.layers[0].delta.fill(1.0)
    net.layers[1].delta[...] = 2.0
    net.layers[1].backward(State(input=net.layers[0].output, delta=net.layers[0].delta, truth=None,
                                 train=True, layers=net.layers))
    assert net.layers[0].delta.reshape(-1).tolist() == [1.0, 3.0, 1.0, 1.0]


def test_windows_entirely_outside_the_image_output_darknet_min_and_no_gradient():
    net = pool_net("[maxpool]\nsize=2\nstride=1\npadding=5", c=1, h=3, w=3, batch=1)   # origin -2
    net.forward(np.full(net.input.shape, 0.5))
    net.allocate_training()                 # the deltas a training forward would have sized
    out = net.layers[1].output[0, 0]
    assert out.shape == (7, 7) and out[0, 0] == -3.4028234663852886e38 and out[1, 1] == 0.5
    net.layers[1].delta.fill(1.0)
    net.layers[1].backward(State(input=net.layers[0].output, delta=net.layers[0].delta, truth=None,
                                 train=True, layers=net.layers))
    assert net.layers[0].delta.sum() == (out == 0.5).sum()


# -- cfg errors --------------------------------------------------------------------------------------
def test_maxpool_needs_an_image():
    with pytest.raises(CfgError, match="image"):
        network_from_text("[net]\ninputs=10\n\n[maxpool]\nsize=2\nstride=2\n")


def test_window_larger_than_input_is_an_error():
    with pytest.raises(CfgError, match="does not fit"):
        pool_net("[maxpool]\nsize=5\nstride=1\npadding=0", h=3, w=3)


@pytest.mark.parametrize("key", ["maxpool_depth", "antialiasing"])
def test_unsupported_alexeyab_keys_are_errors(key):
    with pytest.raises(CfgError, match=key):
        pool_net(f"[maxpool]\nsize=2\nstride=2\n{key}=1")
