"""Network -> ONNX: the converter registry and the walk over the layers.

A converter is `fn(ctx, layer) -> (tensor name, shape)`, registered for one or more layer kinds with
`@converts(...)`; it reproduces exactly what that layer's `forward` computes in inference mode. The
shape it returns is the layer's `out_shape` (per item; the batch is the tensor's first dimension).
Nothing dispatches on layer names outside the registry. A layer kind without a converter, or a layer
whose options a converter cannot express exactly, is refused with an `ExportError` naming the section.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import ExportError
from .graph import Graph

CONVERTERS: dict[str, Callable] = {}
#: Per kind, the layer classes besides the kind's registered one (darkpy.layers.base.REGISTRY) that
#: its converter reproduces exactly. A variant class of a kind (a `[convolutional]` with xnor=1, a
#: `[softmax]` with tree=, ...) not listed here is refused, never exported as its base kind.
ACCEPTS: dict[str, tuple[type, ...]] = {}
#: Refusal reasons of known variant classes (by class name), shorter than the generic one.
VARIANT_REASONS: dict[str, str] = {}


def converts(*kinds: str, classes: tuple[type, ...] = ()):
    """Decorator: register `fn(ctx, layer)` as the converter of each layer kind in `kinds`; it also
    handles the variant layer classes `classes` of those kinds."""
    def deco(fn):
        for k in kinds:
            if k in CONVERTERS:
                raise RuntimeError(f"converter for [{k}] registered twice")
            CONVERTERS[k] = fn
            ACCEPTS[k] = tuple(classes)
        return fn
    return deco


def converter(layer) -> Callable:
    """The converter of `layer`, or the ExportError refusing it."""
    from ..layers.base import REGISTRY
    fn = CONVERTERS.get(layer.kind)
    cls = type(layer)
    if fn is None:
        raise refuse(layer, f"[{layer.kind}] cannot be exported to ONNX by darkpy")
    if cls is not REGISTRY.get(layer.kind) and cls not in ACCEPTS.get(layer.kind, ()):
        raise refuse(layer, VARIANT_REASONS.get(
            cls.__name__, f"[{layer.kind}] as {cls.__name__} cannot be exported to ONNX by darkpy"))
    return fn


def refuse(layer, message: str, key: str | None = None) -> ExportError:
    """The one-line error for a section that cannot be exported exactly."""
    sec = layer.section
    if sec is None:
        return ExportError(message, None, None, layer.index, layer.kind, key)
    line = sec.options[key].line if key in sec.options else sec.line
    return ExportError(message, sec.file, line, sec.index, sec.kind, key)


@dataclass
class Ctx:
    """What converters see: the graph, the network, options, and every layer's output so far."""

    g: Graph
    net: object
    fold: bool = True
    input: tuple = ("input", ())
    tensors: list = field(default_factory=list)      # (name, shape) per layer index
    feed: tuple | None = None      # (name, shape): the input of an inner layer (recurrent layers)

    def prev(self, layer) -> tuple[str, tuple]:
        if self.feed is not None:
            return self.feed
        return self.tensors[layer.index - 1] if layer.index > 0 else self.input

    def inner(self, layer, t: tuple[str, tuple]) -> str:
        """Run the converter of `layer` (an inner layer of a recurrent one) on tensor t."""
        sub = Ctx(self.g, self.net, self.fold, self.input, self.tensors, feed=t)
        return converter(layer)(sub, layer)[0]

    def src(self, i: int) -> tuple[str, tuple]:
        return self.tensors[i]

    def view(self, t: tuple[str, tuple], shape) -> str:
        """Tensor t (name, per-item shape) reshaped to `shape` (same number of values)."""
        name, have = t
        shape = tuple(shape)
        if tuple(have) == shape:
            return name
        return self.g.reshape(name, (-1, *shape))

    def x(self, layer, shape=None) -> str:
        """The layer's input, as `shape` (default its in_shape)."""
        return self.view(self.prev(layer), layer.in_shape if shape is None else shape)


def _load_converters() -> None:
    from . import heads, ops_conv, ops_misc, ops_recurrent, ops_yolor  # noqa: F401  (register their converters)


def convert_layers(ctx: Ctx) -> None:
    """Add every layer of ctx.net to ctx.g, in order; ctx.tensors gets each one's output."""
    _load_converters()
    for layer in ctx.net.layers:
        name, shape = converter(layer)(ctx, layer)
        ctx.tensors.append((name, tuple(shape)))
        got = int(np.prod(shape)) if len(shape) else 1
        if got != layer.outputs:      # a converter bug, never a user error
            raise AssertionError(f"layer {layer.index} [{layer.kind}]: exported {shape}, darkpy {layer.out_shape}")
