"""Implicit knowledge (YOLOR): learnable per-channel vectors and the layers that apply them.

`[implicit]` (AlexeyAB, `representation_layer.c`): keys filters (128), atoms (1), mean (0), std
(0.2). Its output, `filters x atoms x 1` per item, is its weights (one value per output element),
whatever its input: the input is ignored and receives no gradient. Initialisation: `mean +
uniform(-|std|, |std|)`. Backward: the weights' gradient is the delta summed over the batch. The
.weights file stores the filters·atoms weights. Updated by SGD with weight decay, as Darknet's
`update_implicit_layer`.

The YOLOR project's own dialect of the format (its darknet-style cfgs, read by its PyTorch code):
- `[implicit_add]` filters=N: the same kind of layer, a (N, 1, 1) vector initialised N(0, 0.02);
- `[implicit_mul]` filters=N: the same, initialised N(1, 0.02).
Their weights are stored like `[implicit]`'s (darkpy's choice: YOLOR keeps its weights in PyTorch
files, not in Darknet's format). The layers that apply them are in layers/yolor.py.
"""
from __future__ import annotations

import numpy as np

from ..cfg import REQUIRED
from .base import Layer, Param, Shape, State, fmt_shape, register


@register
class ImplicitLayer(Layer):
    kind = "implicit"

    def __init__(self, index: int, in_shape: Shape, filters: int, atoms: int, mean: float, std: float,
                 dtype=np.float32):
        super().__init__(index, in_shape, (filters, atoms, 1), dtype)
        self.mean, self.std = mean, std
        self.weights = Param("weights", np.zeros(self.out_shape, self.dtype),
                             np.zeros(self.out_shape, self.dtype), decay=True)
        self.params = [self.weights]

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "ImplicitLayer":
        filters = sec.get_int("filters", 128)
        atoms = sec.get_int("atoms", 1)
        mean = sec.get_float("mean", 0.0)
        std = sec.get_float("std", 0.2)
        for key, value in (("filters", filters), ("atoms", atoms)):
            if value < 1:
                raise sec.error(f"must be >= 1 (got {value})", key)
        return cls(sec.index, in_shape, filters, atoms, mean, std, ctx.dtype)

    def compute_out_shape(self, in_shape: Shape) -> Shape:
        return self.out_shape             # independent of the input

    def init_weights(self, rng: np.random.Generator) -> None:
        # darknet: rand_uniform swaps reversed bounds, so a negative std acts as its magnitude
        span = abs(self.std)
        self.weights.value[...] = self.mean + rng.uniform(-span, span, self.out_shape)

    def forward(self, s: State) -> None:
        self.output[...] = self.weights.value

    def backward(self, s: State) -> None:
        self.weights.grad += self.delta.sum(axis=0)

    def weight_arrays(self) -> list[np.ndarray]:
        return [self.weights.value]

    def summary(self) -> str:
        c, a, _ = self.out_shape
        return f"implicit {c:5d} x {a}                           ->  {fmt_shape(self.out_shape)}"


@register
class ImplicitAddLayer(ImplicitLayer):
    """YOLOR's ImplicitA: a (filters, 1, 1) vector, initialised N(0, 0.02)."""

    kind = "implicit_add"
    center = 0.0

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "ImplicitAddLayer":
        filters = sec.get_int("filters", REQUIRED)       # YOLOR has no default
        if filters < 1:
            raise sec.error(f"must be >= 1 (got {filters})", "filters")
        return cls(sec.index, in_shape, filters, 1, cls.center, 0.02, ctx.dtype)

    def init_weights(self, rng: np.random.Generator) -> None:
        self.weights.value[...] = rng.normal(self.center, self.std, self.out_shape)


@register
class ImplicitMulLayer(ImplicitAddLayer):
    """YOLOR's ImplicitM: a (filters, 1, 1) vector, initialised N(1, 0.02)."""

    kind = "implicit_mul"
    center = 1.0
