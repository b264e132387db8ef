"""`[cost]`: an element-wise loss against the truth (spec §2.10).

The layer's OUTPUT is the per-element error (not a pass-through; the network output is the layer
before a trailing `[cost]`), and `loss` is that same buffer. With p = input, t = truth, d = t - p:

| type     | error                               | delta                  |
|----------|-------------------------------------|------------------------|
| sse, seg | d²                                  | d                      |
| masked   | d², but 0 where t == -1234          | d, but 0 there         |
| L1       | abs(d)                              | 1 if d > 0 else -1     |
| smooth   | d² if abs(d) < 1 else 2·abs(d) - 1  | d, or sign(d)          |
| wgan     | -p if t != 0 else p                 | 1 if t > 0 else -1     |

`cost = sum(error)` over the batch; backward adds `scale * delta` to the previous delta. `delta` is
Darknet's: for sse/seg/masked/smooth it is HALF the negative gradient of the error (the 2 is left
out), for L1 and wgan it is the negative gradient itself.

Darknet's GPU-only options follow its GPU path: `seg` multiplies error and delta by `noobj` where
t == 0; `thresh` zeroes deltas with abs(delta) < thresh / inputs. `ratio` is read but has no effect
(Darknet's GPU code computes a threshold from it and then discards it).

Differences from Darknet (README):
- darknet: `smooth` on the CPU has the delta's sign inverted outside |d| < 1; darkpy uses the
  correct sign (Darknet's GPU path).
- darknet: `masked` on the CPU writes -1234 into the PREVIOUS layer's output at masked positions
  (so the error there is 0). darkpy never writes into another layer's buffer: it gives the same
  error, delta and cost by zeroing them at masked positions, and the previous output keeps its values
  (Darknet's dump of that layer shows -1234 there; later layers' gradients are not affected here).
- without truth Darknet leaves the previous error/cost in place; darkpy zeroes them (cost None).
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ..kernels import pjit
from .base import Layer, State, numel, register
from .softmax import truth_rows

SECRET_NUM = -1234.0           # Darknet's "ignore this truth value" marker for type=masked
TYPES = ("sse", "masked", "smooth", "L1", "seg", "wgan")
SSE, MASKED, SMOOTH, L1, SEG, WGAN = range(len(TYPES))


@pjit
def cost_forward(err, delta, p, t, ctype, noobj, thresh):
    """err, delta, p, t: (n,) flat. Per-element error and delta of cost type `ctype` (see module)."""
    for i in prange(p.shape[0]):
        d = t[i] - p[i]
        if ctype == L1:
            e = abs(d)
            g = 1.0 if d > 0 else -1.0
        elif ctype == SMOOTH:
            if abs(d) < 1:
                e = d * d
                g = d
            else:
                e = 2 * abs(d) - 1
                g = 1.0 if d > 0 else -1.0     # darknet: the CPU path has this sign inverted
        elif ctype == WGAN:
            e = -p[i] if t[i] != 0 else p[i]
            g = 1.0 if t[i] > 0 else -1.0
        else:
            e = d * d
            g = d
            if ctype == MASKED and t[i] == SECRET_NUM:
                # darknet: writes -1234 into the previous layer's output to get these zeros
                e = 0.0
                g = 0.0
            elif ctype == SEG and t[i] == 0:
                e *= noobj
                g *= noobj
        if g * g < thresh * thresh:
            g = 0.0
        err[i] = e
        delta[i] = g


@pjit
def add_scaled(dst, src, a):
    """dst, src: (n,) flat. dst += a * src."""
    for i in prange(dst.shape[0]):
        dst[i] += a * src[i]


@register
class CostLayer(Layer):
    kind = "cost"
    has_cost = True

    def __init__(self, index, in_shape, cost_type: str = "sse", scale: float = 1.0, ratio: float = 0.0,
                 noobj: float = 1.0, thresh: float = 0.0, dtype=np.float32):
        super().__init__(index, in_shape, (numel(in_shape),), dtype)
        self.cost_type = cost_type
        self.ctype = TYPES.index(cost_type)
        self.scale, self.ratio, self.noobj, self.thresh = scale, ratio, noobj, thresh

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "CostLayer":
        # darknet: an unknown type falls back to sse with a message; darkpy refuses it
        cost_type = sec.get_choice("type", TYPES, "sse")
        return cls(sec.index, in_shape, cost_type, sec.get_float("scale", 1.0), sec.get_float("ratio", 0.0),
                   sec.get_float("noobj", 1.0), sec.get_float("thresh", 0.0), ctx.dtype)

    def compute_out_shape(self, in_shape):
        return (numel(in_shape),)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.loss = self.output          # the per-element error is both the output and the loss

    def forward(self, s: State) -> None:
        if s.truth is None:
            return                       # the network calls clear_cost(): output, delta zeroed
        self.allocate_training()         # delta and loss: sized by the first forward with truth
        t = truth_rows(s, self)
        cost_forward(self.output.reshape(-1), self.delta.reshape(-1), s.input.reshape(-1), t.reshape(-1),
                     self.ctype, self.noobj, self.thresh / self.inputs)
        self.cost = float(self.output.sum(dtype=np.float64))

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        add_scaled(s.delta.reshape(-1), self.delta.reshape(-1), self.scale)

    def clear_cost(self) -> None:
        # darknet: without truth the last error/cost stay in place
        super().clear_cost()
        self.delta.fill(0)

    def summary(self) -> str:
        return f"cost                                           {self.inputs:4d}"
