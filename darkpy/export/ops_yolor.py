"""Converters for YOLOR's layers (layers/implicit.py, layers/yolor.py) and for `[contrastive]`,
whose inference output is constant (layers/contrastive.py)."""
from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from .convert import Ctx, converts


def _batch_dims(ctx: Ctx, layer, shape) -> str:
    """int64 (1 + len(shape),): the batch size of the network input, then `shape`."""
    g = ctx.g
    b = g.slice(g.op("Shape", [ctx.input[0]], "shape"), [0], [1], [0])
    return g.op("Concat", [b, g.ints(list(shape))], "dims", axis=0)


@converts("implicit", "implicit_add", "implicit_mul")
def implicit(ctx: Ctx, layer):
    """The learned array itself, the same for every item of the batch (it ignores its input)."""
    g = ctx.g
    w = g.weight(layer.weights.value[None], f"l{layer.index}_implicit")
    return g.op("Expand", [w, _batch_dims(ctx, layer, layer.out_shape)], f"l{layer.index}_expand"), layer.out_shape


def _channel_vector(ctx: Ctx, layer) -> str:
    c = layer.in_shape[0]
    return ctx.view(ctx.src(layer.refs[0]), (c, 1, 1))


@converts("shift_channels")
def shift_channels(ctx: Ctx, layer):
    """x + v, v: layer `from`'s output as one value per channel."""
    return ctx.g.add(ctx.x(layer), _channel_vector(ctx, layer), f"l{layer.index}_shift"), layer.out_shape


@converts("control_channels")
def control_channels(ctx: Ctx, layer):
    """x · v, v: layer `from`'s output as one value per channel."""
    return ctx.g.mul(ctx.x(layer), _channel_vector(ctx, layer), f"l{layer.index}_control"), layer.out_shape


@converts("contrastive")
def contrastive(ctx: Ctx, layer):
    """Inference: darknet computes nothing and the output stays zero (layers/contrastive.py)."""
    g = ctx.g
    value = numpy_helper.from_array(np.zeros(1, g.dtype))
    zeros = g.op("ConstantOfShape", [_batch_dims(ctx, layer, layer.out_shape)], f"l{layer.index}_contrastive",
                 value=value)
    return zeros, layer.out_shape
