"""Converters for the layers without learnable parameters: pooling, route, shortcut, upsample,
reorg/reorg3d, crop, dropout, softmax, logistic, activation, l2norm, lrn, sam, scale_channels, cost,
and the refusal of the recurrent layers."""
from __future__ import annotations

import copy

import numpy as np

from ..layers.base import State, numel
from ..layers.shortcut import _as_chw
from ..layers.tree import TreeSoftmaxLayer
from ..layers.yolor import FocusLayer
from .convert import Ctx, converts, refuse
from .ops_conv import activation

#: Darknet's value of a max over padding only (-FLT_MAX); float16 graphs use their own lowest value.
_LOWEST = {np.dtype(np.float32): -3.4028234663852886e38, np.dtype(np.float16): -65504.0}


# -- pooling ------------------------------------------------------------------------------------------
def _window_pads(layer) -> list[int]:
    # darknet: windows start at -(padding // 2); the rest of the padding falls at the bottom/right
    p = layer.padding
    return [p // 2, p // 2, p - p // 2, p - p // 2]


@converts("maxpool")
def maxpool(ctx: Ctx, layer):
    g = ctx.g
    x = ctx.x(layer)
    pads = _window_pads(layer)
    attrs = {"kernel_shape": [layer.size, layer.size], "strides": [layer.stride_y, layer.stride_x]}
    if max(pads) >= layer.size:
        # ONNX wants pads < kernel: pad explicitly with Darknet's -FLT_MAX (a window over padding
        # only then outputs -FLT_MAX, as Darknet does)
        x = g.op("Pad", [x, g.ints([0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]]),
                         g.const(_LOWEST[g.dtype])], "pad")
        pads = [0, 0, 0, 0]
    return g.op("MaxPool", [x], f"l{layer.index}_maxpool", pads=pads, **attrs), layer.out_shape


@converts("local_avgpool")
def local_avgpool(ctx: Ctx, layer):
    pads = _window_pads(layer)
    if max(pads) >= layer.size:
        raise refuse(layer, f"padding={layer.padding} with size={layer.size}: windows over padding only "
                            "cannot be exported", "padding")
    y = ctx.g.op("AveragePool", [ctx.x(layer)], f"l{layer.index}_avgpool", kernel_shape=[layer.size] * 2,
                 strides=[layer.stride_y, layer.stride_x], pads=pads, count_include_pad=0)
    return y, layer.out_shape


@converts("avgpool")
def avgpool(ctx: Ctx, layer):
    y = ctx.g.op("GlobalAveragePool", [ctx.x(layer)], f"l{layer.index}_avgpool")
    return ctx.view((y, (layer.in_shape[0], 1, 1)), layer.out_shape), layer.out_shape


# -- wiring ---------------------------------------------------------------------------------------------
@converts("route")
def route(ctx: Ctx, layer):
    g = ctx.g
    parts = []
    if len(layer.out_shape) == 3:           # images of one size: whole channel blocks
        for i in layer.refs:
            name, shape = ctx.src(i)
            cg = shape[0] // layer.groups
            t = ctx.view((name, shape), shape)
            parts.append(t if layer.groups == 1 else
                         g.slice(t, [cg * layer.group_id], [cg * (layer.group_id + 1)], [1]))
    else:
        for i, part in zip(layer.refs, layer.parts):
            t = ctx.view(ctx.src(i), (numel(ctx.src(i)[1]),))
            parts.append(t if layer.groups == 1 else
                         g.slice(t, [part * layer.group_id], [part * (layer.group_id + 1)], [1]))
    y = parts[0] if len(parts) == 1 else g.op("Concat", parts, f"l{layer.index}_route", axis=1)
    return y, layer.out_shape


def _scatter(g, t: str, m, out_chw) -> str:
    """A `from` map t (B, c1, h1, w1) sampled as darkpy's shortcut_add does, zero outside the
    overlap, as a (B, c2, h2, w2) tensor: out[k, j*sample, i*sample] = t[k, j*stride, i*stride]."""
    stride, sample, minc, minh, minw = m
    c2, h2, w2 = out_chw
    t = g.slice(t, [0, 0, 0], [minc, (minh - 1) * stride + 1, (minw - 1) * stride + 1], [1, 2, 3],
                [1, stride, stride])
    if sample > 1:        # spread: (B, c, h, 1, w, 1) padded to (B, c, h, s, w, s)
        t = g.reshape(t, (0, minc, minh, 1, minw, 1))
        t = g.op("Pad", [t, g.ints([0, 0, 0, 0, 0, 0, 0, 0, 0, sample - 1, 0, sample - 1])], "pad")
        t = g.reshape(t, (0, minc, minh * sample, minw * sample))
    hh, ww = minh * sample if sample > 1 else minh, minw * sample if sample > 1 else minw
    if (minc, hh, ww) != (c2, h2, w2):
        t = g.op("Pad", [t, g.ints([0, 0, 0, 0, 0, c2 - minc, h2 - hh, w2 - ww])], "pad")
    return t


@converts("shortcut")
def shortcut(ctx: Ctx, layer):
    g = ctx.g
    out_chw = _as_chw(layer.out_shape)
    y = ctx.x(layer, out_chw)
    for i, m in zip(layer.refs, layer.maps):
        name, shape = ctx.src(i)
        t = ctx.view((name, shape), _as_chw(shape))
        full = _as_chw(shape) == out_chw
        add = t if full else _scatter(g, t, m, out_chw)
        if layer.alpha != 1:
            if full:
                y = g.scale(y, layer.alpha)
            else:       # alpha only inside the overlap (darkpy's shortcut_add)
                mask = np.zeros(out_chw)
                _, sample, minc, minh, minw = m
                mask[:minc, :minh * sample:sample, :minw * sample:sample] = 1
                y = g.mul(y, g.const(1 + (layer.alpha - 1) * mask))
        y = g.add(y, g.scale(add, layer.beta), f"l{layer.index}_shortcut")
    y = activation(g, y, layer.activation, layer)
    return ctx.view((y, out_chw), layer.out_shape), layer.out_shape


@converts("upsample")
def upsample(ctx: Ctx, layer):
    g = ctx.g
    c, h, w = layer.in_shape
    s = abs(layer.stride)
    if not layer.reverse:
        x = g.reshape(ctx.x(layer), (-1, c, h, 1, w, 1))
        y = g.op("Expand", [x, g.ints([1, 1, 1, s, 1, s])], "expand")
        y = g.reshape(y, (-1, c, h * s, w * s))
        return g.scale(y, layer.scale, f"l{layer.index}_upsample"), layer.out_shape
    # darknet: the input is read as a contiguous (c, oh*s, ow*s) array (upsample.py's docstring)
    _, oh, ow = layer.out_shape
    flat = ctx.x(layer, (layer.inputs,))
    flat = g.slice(flat, [0], [c * oh * s * ow * s], [1])
    blocks = g.reshape(g.scale(flat, layer.scale), (-1, c, oh, s, ow, s))
    y = g.op("ReduceSum", [blocks, g.ints([3, 5])], f"l{layer.index}_downsample", keepdims=0)
    return y, layer.out_shape


def _probe_permutation(layer) -> np.ndarray:
    """For a layer whose forward only moves (or zero-fills) values: out[k] = in[idx[k] - 1], or
    0 where idx[k] == 0, found by running its own forward on 1..N."""
    n = layer.inputs
    if n >= 1 << 24:
        raise refuse(layer, f"{n} values per item are too many to index exactly")
    probe = copy.copy(layer)
    probe.allocate(1)
    x = np.arange(1, n + 1, dtype=probe.dtype).reshape(1, *layer.in_shape)
    probe.forward(State(input=x, delta=None, truth=None, train=False, layers=[], net=None))
    return np.rint(probe.output.reshape(-1)).astype(np.int64)


@converts("reorg", "reorg3d", classes=(FocusLayer,))
def reorg(ctx: Ctx, layer):
    """Darknet's reorg permutation (not DepthToSpace's), reorg3d and YOLOR's Focus reorg, as one
    Gather whose indices come from darkpy's own kernel."""
    g = ctx.g
    idx = _probe_permutation(layer)
    flat = ctx.x(layer, (layer.inputs,))
    if (idx == 0).any():          # `extra`: a zero column in front, index 0
        zero = g.scale(g.slice(flat, [0], [1], [1]), 0.0)
        flat = g.op("Concat", [zero, flat], axis=1)
    else:
        idx = idx - 1
    y = g.op("Gather", [flat, g.ints(idx)], f"l{layer.index}_reorg", axis=1)
    return ctx.view((y, (layer.outputs,)), layer.out_shape), layer.out_shape


@converts("crop")
def crop(ctx: Ctx, layer):
    """Inference: the centre window, never flipped; x*2 - 1 unless noadjust."""
    g = ctx.g
    _, h, w = layer.in_shape
    _, ch, cw = layer.out_shape
    dh, dw = (h - ch) // 2, (w - cw) // 2
    y = g.slice(ctx.x(layer), [dh, dw], [dh + ch, dw + cw], [2, 3])
    if not layer.noadjust:
        y = g.add(g.scale(y, 2.0), g.const(-1.0), f"l{layer.index}_crop")
    return y, layer.out_shape


@converts("dropout")
def dropout(ctx: Ctx, layer):
    """Inference: a copy (darkpy scales in training only)."""
    return ctx.prev(layer)[0], ctx.prev(layer)[1]


# -- element-wise and normalisation ----------------------------------------------------------------
def tree_softmax(g, x: str, layer, axis: int) -> str:
    """The softmax of x over each group of layer.tree along `axis` (layers/tree.py): one Slice and
    Softmax per group, concatenated (put back in node order when the groups are not)."""
    tree = layer.tree
    n = tree.n
    order = np.concatenate([np.arange(o, o + k) for o, k in zip(tree.group_offset, tree.group_size)])
    if sorted(order.tolist()) != list(range(n)):
        raise refuse(layer, "a tree whose groups do not cover each node once cannot be exported", "tree")
    parts = [g.op("Softmax", [g.slice(x, [int(o)], [int(o + k)], [axis])], "group_softmax", axis=axis)
             for o, k in zip(tree.group_offset, tree.group_size)]
    y = g.op("Concat", parts, f"l{layer.index}_tree_softmax", axis=axis) if len(parts) > 1 else parts[0]
    if (order != np.arange(n)).any():
        y = g.op("Gather", [y, g.ints(np.argsort(order))], f"l{layer.index}_tree_order", axis=axis)
    return y


def _tree_softmax(ctx: Ctx, layer):
    """`[softmax] tree=`: the group-wise softmax of x / temperature."""
    g = ctx.g
    x = ctx.x(layer, (layer.inputs,))
    if layer.temperature != 1:
        x = g.op("Div", [x, g.const(layer.temperature)], "div")
    return tree_softmax(g, x, layer, 1), (layer.inputs,)


@converts("softmax", classes=(TreeSoftmaxLayer,))
def softmax(ctx: Ctx, layer):
    if isinstance(layer, TreeSoftmaxLayer):
        return _tree_softmax(ctx, layer)
    g = ctx.g
    n = layer.inputs
    x = g.reshape(ctx.x(layer, (n,)), (-1, layer.groups, n // layer.groups))
    if layer.temperature != 1:
        x = g.op("Div", [x, g.const(layer.temperature)], "div")
    y = g.op("Softmax", [x], f"l{layer.index}_softmax", axis=2)
    return g.reshape(y, (-1, n)), (n,)


@converts("logistic")
def logistic(ctx: Ctx, layer):
    x = ctx.x(layer, (layer.inputs,))
    return ctx.view((ctx.g.op("Sigmoid", [x], f"l{layer.index}_logistic"), (layer.inputs,)),
                    layer.out_shape), layer.out_shape


@converts("activation")
def activation_layer(ctx: Ctx, layer):
    name, shape = ctx.prev(layer)
    return activation(ctx.g, name, layer.activation, layer), shape


@converts("cost")
def cost(ctx: Ctx, layer):
    """Inference leaves a [cost] layer's output zeroed (clear_cost); nothing reads it."""
    name, shape = ctx.prev(layer)
    return ctx.g.scale(name, 0.0, f"l{layer.index}_cost"), shape


def _cs(shape) -> tuple[int, int]:
    return (shape[0], shape[1] * shape[2]) if len(shape) == 3 else (numel(shape), 1)


@converts("l2norm")
def l2norm(ctx: Ctx, layer):
    g = ctx.g
    c, s = _cs(layer.in_shape)
    x = ctx.x(layer, (c, s))
    norm = g.op("Sqrt", [g.op("ReduceSum", [g.mul(x, x), g.ints([1])], keepdims=1)], "norm")
    y = g.op("Where", [g.op("Greater", [norm, g.const(0.0)]), g.op("Div", [x, norm]), g.scale(x, 0.0)],
             f"l{layer.index}_l2norm")
    return ctx.view((y, (c, s)), layer.out_shape), layer.out_shape


def lrn_window(c: int, size: int) -> np.ndarray:
    """M (c, c): norm_k = kappa + alpha * sum_j M[k, j] x_j², Darknet's running window with its
    off-by-one (normalization.py's docstring), found by running the same recurrence on indicators."""
    half, back = size // 2, (size - 1) // 2 + 1
    m = np.zeros((c, c))
    m[0, :min(half, c)] = 1
    for k in range(1, c):
        m[k] = m[k - 1]
        if k - back >= 0:
            m[k, k - back] -= 1
        if k + half < c:
            m[k, k + half] += 1
    return m


@converts("normalization")
def lrn(ctx: Ctx, layer):
    g = ctx.g
    c, s = _cs(layer.in_shape)
    x = ctx.x(layer, (c, s))
    sums = g.op("MatMul", [g.const(lrn_window(c, layer.size)), g.mul(x, x)], "lrn_sum")
    norms = g.add(g.scale(sums, layer.alpha), g.const(layer.kappa))
    y = g.mul(x, g.op("Pow", [norms, g.const(-layer.beta)]), f"l{layer.index}_lrn")
    return ctx.view((y, (c, s)), layer.out_shape), layer.out_shape


@converts("sam")
def sam(ctx: Ctx, layer):
    g = ctx.g
    shape = layer.out_shape
    y = g.mul(ctx.x(layer, shape), ctx.view(ctx.src(layer.refs[0]), shape), f"l{layer.index}_sam")
    return activation(g, y, layer.activation, layer), shape


@converts("scale_channels")
def scale_channels(ctx: Ctx, layer):
    g = ctx.g
    c, h, w = layer.out_shape
    frm = ctx.view(ctx.src(layer.refs[0]), (c, h, w))
    scale = ctx.x(layer, (1, h, w) if layer.scale_wh else (c, 1, 1))
    y = g.mul(scale, frm, f"l{layer.index}_scale_channels")
    return activation(g, y, layer.activation, layer), layer.out_shape
