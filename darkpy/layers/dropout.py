"""`[dropout]`: inverted dropout (spec §2.8).

Training: each element is dropped (set to 0) with probability p and kept elements are scaled by
1/(1-p), so inference needs no rescaling and is the identity. The uniform draws come from the
network's random generator (`State.rng`) and are kept for backward, which applies the same mask and
scale to the gradient.

darknet: the layer shares the previous layer's output and delta buffers and works in place; darkpy
gives it buffers of its own (a copy), so the previous layer's output stays what that layer computed
and backward adds into the previous delta like every other layer. Inferring with shared outputs
(`Network.share_outputs`), its output is a view of its input where it can (`source_parts`, as a
[route] of one whole part: outputs_plan.views), and nothing is copied: cifar.cfg's three at b64
copied 2.3 ms of its 346 ms forward.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ..kernels import pjit
from .base import Layer, State, register


@pjit
def dropout_forward(out, x, r, p, scale):
    """out, x, r: (n,) flat. out = 0 where r < p, else x * scale (Darknet's comparison)."""
    for i in prange(out.shape[0]):
        out[i] = 0.0 * x[i] if r[i] < p else x[i] * scale


@pjit
def dropout_backward(prev_delta, delta, r, p, scale):
    """prev_delta, delta, r: (n,) flat. prev_delta += delta * scale where the element was kept."""
    for i in prange(delta.shape[0]):
        if r[i] >= p:
            prev_delta[i] += delta[i] * scale


@register
class DropoutLayer(Layer):
    kind = "dropout"

    def __init__(self, index, in_shape, probability: float = 0.5, dtype=np.float32):
        super().__init__(index, in_shape, in_shape, dtype)
        self.probability = probability
        self.scale = 1.0 / (1.0 - probability)
        self.rand = np.zeros((0,), self.dtype)
        self.masked = False            # whether the last forward dropped anything (training)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "DropoutLayer":
        p = sec.get_float("probability", 0.5)
        if not 0.0 <= p < 1.0:
            raise sec.error(f"must be in [0, 1) (got {p})", "probability")
        for key in ("dropblock",):
            if sec.get_int(key, 0):
                raise sec.error(f"{key}=1 (AlexeyAB) is not supported by darkpy", key)
        return cls(sec.index, in_shape, p, ctx.dtype)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.rand = np.zeros((0,), self.dtype)    # the uniform draws of the last training forward
        self.masked = False
        self.in_place = [False]        # the output a view of the input (set by outputs_plan)

    def source_parts(self) -> list[tuple[int, int, int]]:
        """(source layer, first value, values) of the one part of an item's output, as a [route]
        gives them (outputs_plan.views): the layer before's whole output (none for a first layer,
        whose input is the network's)."""
        return [(self.index - 1, 0, int(np.prod(self.in_shape)))] if self.index > 0 else []

    def allocate_training(self) -> None:
        super().allocate_training()
        self.rand = self.training_buffer(self.rand)

    def extra_buffers(self):
        return [self.rand]

    def forward(self, s: State) -> None:
        x = s.input.reshape(-1)
        out = self.output.reshape(-1)
        self.masked = s.train and self.probability > 0
        if not self.masked:
            if not any(self.in_place):
                np.copyto(out, x)
            return
        rng = s.rng if s.rng is not None else np.random.default_rng()
        rng.random(out=self.rand, dtype=self.dtype)
        dropout_forward(out, x, self.rand.reshape(-1), self.probability, self.scale)

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        if not self.masked:
            s.delta += self.delta.reshape(s.delta.shape)
            return
        dropout_backward(s.delta.reshape(-1), self.delta.reshape(-1), self.rand.reshape(-1), self.probability,
                         self.scale)

    def summary(self) -> str:
        return f"dropout       p = {self.probability:.2f}               {self.inputs:4d}  ->  {self.outputs:4d}"

