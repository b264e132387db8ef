"""[maxpool], [avgpool], [local_avgpool]: Darknet goldens, a slow numpy reference of the window
geometry, float64 gradient checks, shapes and cfg errors."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy import CfgError
from darkpy.layers.base import State
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
    net.forward(np.array([[[[0.1, 0.7], [0.3, -0.2]]]]))
    assert net.layers[1].indexes.reshape(-1).tolist() == [1]
    net.layers[0].delta.fill(1.0)
    net.layers[1].delta[...] = 2.0
    net.layers[1].backward(State(input=net.layers[0].output, delta=net.layers[0].delta, truth=None,
                                 train=True, layers=net.layers))
    assert net.layers[0].delta.reshape(-1).tolist() == [1.0, 3.0, 1.0, 1.0]


def test_windows_entirely_outside_the_image_output_darknet_min_and_no_gradient():
    net = pool_net("[maxpool]\nsize=2\nstride=1\npadding=5", c=1, h=3, w=3, batch=1)   # origin -2
    net.forward(np.full(net.input.shape, 0.5))
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
