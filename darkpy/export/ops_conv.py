"""Converters for the parameterised layers: convolutional, deconvolutional, local, connected,
batchnorm; and every Darknet activation as ONNX ops (kernels/activations.py is the reference)."""
from __future__ import annotations

import numpy as np

from ..layers.share import SharedConvolutionalLayer
from ..layers.xnor import XnorConvolutionalLayer
from .convert import Ctx, converts, refuse
from .graph import Graph

BN_EPS = 1e-5       # kernels/bn.py: (x - mean) / sqrt(var + 1e-5)


# -- activations ------------------------------------------------------------------------------------
def _where(g: Graph, cond: str, a: str, b: str) -> str:
    return g.op("Where", [cond, a, b], "where")


def _lt(g, x, v):
    return g.op("Less", [x, g.const(v)], "lt")


def _gt(g, x, v):
    return g.op("Greater", [x, g.const(v)], "gt")


def _affine(g, x, k, b):
    """k*x + b."""
    return g.add(g.scale(x, k), g.const(b))


def _sigmoid(g, x):
    return g.op("Sigmoid", [x], "sigmoid")


def activation(g: Graph, x: str, name: str, layer=None) -> str:
    """Darknet activation `name` applied to tensor x (the forms of kernels/activations.py)."""
    if name == "linear":
        return x
    if name in ("leaky", "revleaky"):
        return g.op("LeakyRelu", [x], "leaky", alpha=0.1)
    if name == "relu":
        return g.op("Relu", [x], "relu")
    if name == "logistic":
        return _sigmoid(g, x)
    if name == "relie":
        return g.op("LeakyRelu", [x], "relie", alpha=0.01)
    if name == "ramp":
        return g.add(g.op("Relu", [x]), g.scale(x, 0.1), "ramp")
    if name == "tanh":
        return g.op("Tanh", [x], "tanh")
    if name == "plse":
        mid = _affine(g, x, 0.125, 0.5)
        return _where(g, _lt(g, x, -4.0), _affine(g, x, 0.01, 0.04),
                      _where(g, _gt(g, x, 4.0), _affine(g, x, 0.01, 1 - 0.04), mid))
    if name == "elu":
        return g.op("Elu", [x], "elu", alpha=1.0)
    if name == "loggy":
        return _affine(g, _sigmoid(g, x), 2.0, -1.0)
    if name == "stair":
        n = g.op("Floor", [x], "floor")
        half = g.op("Floor", [g.scale(x, 0.5)], "floor")
        n_half = g.op("Floor", [g.scale(n, 0.5)], "floor")
        odd = g.op("Sub", [n, g.scale(n_half, 2.0)], "sub")              # n mod 2 (Python's sign rule)
        even = g.op("Equal", [odd, g.const(0.0)], "even")
        return _where(g, even, half, g.add(g.op("Sub", [x, n], "sub"), half))
    if name == "hardtan":
        return g.op("Clip", [x, g.const(-1.0), g.const(1.0)], "hardtan")
    if name == "lhtan":
        return _where(g, _lt(g, x, 0.0), g.scale(x, 0.001),
                      _where(g, _gt(g, x, 1.0), _affine(g, x, 0.001, 1 - 0.001), x))
    if name == "selu":
        return g.op("Selu", [x], "selu", alpha=1.6732, gamma=1.0507)
    if name == "swish":
        return g.mul(x, _sigmoid(g, x), "swish")
    if name == "mish":
        sp = g.op("Softplus", [x], "softplus")
        return g.mul(x, g.op("Tanh", [sp], "tanh"), "mish")
    if name == "hard_mish":
        quad = g.add(g.mul(g.scale(x, 0.5), x), x)                       # x*x/2 + x
        zero = g.scale(x, 0.0)
        return _where(g, _gt(g, x, 0.0), x, _where(g, _gt(g, x, -2.0), quad, zero))
    if name == "gelu":          # the exact x·Φ(x)
        erf = g.op("Erf", [g.scale(x, 0.7071067811865476)], "erf")
        return g.mul(g.scale(x, 0.5), g.add(erf, g.const(1.0)), "gelu")
    if name == "gelu_tanh":     # AlexeyAB's `gelu` (the tanh approximation), constants unrounded
        x3 = g.mul(g.mul(x, x), x)
        inner = g.add(g.scale(x, 0.7978845608028654), g.scale(x3, 0.044715 * 0.7978845608028654))
        return g.mul(g.scale(x, 0.5), g.add(g.op("Tanh", [inner]), g.const(1.0)), "gelu_tanh")
    if name == "relu6":
        return g.op("Clip", [x, g.const(0.0), g.const(6.0)], "relu6")
    raise refuse(layer, f"activation={name} cannot be exported", "activation") if layer is not None \
        else ValueError(name)


# -- bias / batch norm ------------------------------------------------------------------------------
def _bn_arrays(layer):
    bn = layer.bn
    if getattr(layer, "darknet_cpu_bn", False):
        raise refuse(layer, "darknet_cpu_bn (pjreddie's CPU batch-norm epsilon) cannot be exported")
    return (np.asarray(bn.scales.value, np.float64), np.asarray(bn.rolling_mean, np.float64),
            np.asarray(bn.rolling_variance, np.float64), np.asarray(layer.biases.value, np.float64))


def folded(layer) -> tuple[np.ndarray, np.ndarray]:
    """(k, b) per output channel such that bias/BN of the raw product y is k*y + b (float64)."""
    if layer.bn is None:
        return np.ones(layer.biases.value.shape[0]), np.asarray(layer.biases.value, np.float64)
    gamma, mean, var, beta = _bn_arrays(layer)
    k = gamma / np.sqrt(var + BN_EPS)
    return k, beta - mean * k


def _bn_node(ctx: Ctx, layer, y: str) -> str:
    """An explicit BatchNormalization node (`--no-fold`) on y (B, C, ...)."""
    g = ctx.g
    p = f"l{layer.index}_bn"
    arrays = g.cached(("bn", id(layer)), lambda: [g.weight(a, p + s) for a, s in zip(
        _bn_arrays(layer), ("_scale", "_mean", "_var", "_bias"))])
    scale, mean, var, bias = arrays
    return g.op("BatchNormalization", [y, scale, bias, mean, var], f"l{layer.index}_bn", epsilon=BN_EPS)


def _weights_and_bias(ctx: Ctx, layer, w: np.ndarray, out_axis: int):
    """(weights, bias) initializers with BN folded in when ctx.fold; with `--no-fold` the raw
    weights and no bias (the BN node adds β). `out_axis`: the weights' output-channel axis.
    Made once per layer (recurrent layers use theirs at every step)."""
    def make():
        if layer.bn is not None and not ctx.fold:
            return ctx.g.weight(w, f"l{layer.index}_w"), None
        k, b = folded(layer)
        shape = [1] * w.ndim
        shape[out_axis] = -1
        # the product in float32 (one rounding more than float64, ~6e-8 relative): big nets export fast
        wk = w * k.astype(w.dtype).reshape(shape) if layer.bn is not None else w
        return ctx.g.weight(wk, f"l{layer.index}_w"), ctx.g.weight(b, f"l{layer.index}_b")
    return ctx.g.cached(("layer", id(layer), ctx.fold), make)


def _finish(ctx: Ctx, layer, y: str, has_bias: bool) -> str:
    if not has_bias:
        y = _bn_node(ctx, layer, y)
    return activation(ctx.g, y, layer.activation, layer)


# -- convolutional ----------------------------------------------------------------------------------
@converts("convolutional", classes=(SharedConvolutionalLayer, XnorConvolutionalLayer))
def convolutional(ctx: Ctx, layer):
    """A shared convolution (share_index) holds its source's arrays; an XNOR/binary one
    (layers/xnor.py) is the convolution with its binarised weights mean_f·sign(w) as constants,
    and with xnor=1 the input binarised first (x >= 0 -> +1, else -1; the padding stays 0)."""
    g = ctx.g
    x = ctx.x(layer)
    weights = layer.weights.value
    if isinstance(layer, XnorConvolutionalLayer):
        weights = layer._binarized().copy()
        if layer.xnor:
            ge = g.op("GreaterOrEqual", [x, g.const(0.0)], f"l{layer.index}_sign")
            x = _where(g, ge, g.const(1.0), g.const(-1.0))
    w, b = _weights_and_bias(ctx, layer, weights, 0)
    p = layer.padding * layer.dilation     # darkpy pads `padding` x dilation per side (im2col)
    y = g.op("Conv", [x, w] + ([b] if b else []), f"l{layer.index}_conv",
             kernel_shape=[layer.size, layer.size], strides=[layer.stride_y, layer.stride_x],
             pads=[p, p, p, p], dilations=[layer.dilation, layer.dilation], group=layer.groups)
    return _finish(ctx, layer, y, b is not None), layer.out_shape


@converts("deconvolutional")
def deconvolutional(ctx: Ctx, layer):
    """darkpy: col = Wᵀ·x, col2im with `padding` per side: a transposed convolution."""
    g = ctx.g
    x = ctx.x(layer)
    w, b = _weights_and_bias(ctx, layer, layer.weights.value, 1)    # (c, n, k, k)
    p = layer.padding
    y = g.op("ConvTranspose", [x, w] + ([b] if b else []), f"l{layer.index}_deconv",
             kernel_shape=[layer.size, layer.size], strides=[layer.stride, layer.stride], pads=[p, p, p, p])
    return _finish(ctx, layer, y, b is not None), layer.out_shape


@converts("connected")
def connected(ctx: Ctx, layer):
    g = ctx.g
    x = ctx.x(layer, (layer.inputs,))
    w, b = _weights_and_bias(ctx, layer, layer.weights.value, 0)     # (n, inputs)
    if b is not None:
        y = g.op("Gemm", [x, w, b], f"l{layer.index}_fc", transB=1)
    else:
        y = g.op("Gemm", [x, w], f"l{layer.index}_fc", transB=1)
    return ctx.view((_finish(ctx, layer, y, b is not None), (layer.n,)), layer.out_shape), layer.out_shape


@converts("local")
def local(ctx: Ctx, layer):
    """Patches by a grouped one-hot convolution (row order (c, ky, kx), as local_im2col), then one
    batched MatMul per location with the (L, n, c·k·k) weights, plus the (n, L) biases."""
    g = ctx.g
    c, h, w = layer.in_shape
    n, oh, ow = layer.out_shape
    k, s, pad = layer.size, layer.stride, layer.pad
    kk = k * k
    eye = np.zeros((c * kk, 1, k, k))
    for r in range(c * kk):
        eye[r, 0, (r % kk) // k, r % k] = 1
    pb = max(0, (oh - 1) * s + k - h - pad)        # bottom/right padding so the last window exists
    pr = max(0, (ow - 1) * s + k - w - pad)
    patches = g.op("Conv", [ctx.x(layer), g.weight(eye, f"l{layer.index}_im2col")], f"l{layer.index}_patches",
                   kernel_shape=[k, k], strides=[s, s], pads=[pad, pad, pb, pr], group=c)
    patches = g.slice(patches, [0, 0], [oh, ow], [2, 3])
    L = oh * ow
    cols = g.op("Transpose", [g.reshape(patches, (0, c * kk, L))], perm=[2, 1, 0])     # (L, ckk, B)
    prod = g.op("MatMul", [g.weight(layer.weights.value, f"l{layer.index}_w"), cols])   # (L, n, B)
    y = g.op("Transpose", [prod], perm=[2, 1, 0])                                       # (B, n, L)
    y = g.add(y, g.weight(layer.biases.value, f"l{layer.index}_b"))
    y = activation(g, y, layer.activation, layer)
    return g.reshape(y, (-1, n, oh, ow)), layer.out_shape


@converts("batchnorm")
def batchnorm(ctx: Ctx, layer):
    """A [batchnorm] layer on its own: BN with rolling statistics per channel, no activation."""
    g = ctx.g
    shape = layer.in_shape if len(layer.in_shape) == 3 else (layer.inputs, 1, 1)
    x = ctx.x(layer, shape)
    if not ctx.fold:
        y = _bn_node(ctx, layer, x)
    else:
        k, b = folded(layer)
        y = g.add(g.mul(x, g.const(k.reshape(-1, 1, 1))), g.const(b.reshape(-1, 1, 1)), f"l{layer.index}_bn")
    return ctx.view((y, shape), layer.out_shape), layer.out_shape
