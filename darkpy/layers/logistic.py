"""`[logistic]`: element-wise sigmoid with binary cross-entropy against the truth (Darknet's
LOGXENT, spec §2.11, §8.2). Multi-label classification: every output is its own yes/no.

`output = σ(x)` (shape unchanged). With truth:
- `loss[i] = -t log p - (1-t) log(1-p)`;
- `delta = t - p`, the exact negative gradient of the loss w.r.t. the logits x;
- `cost = sum(loss)` over the batch.
Backward adds `delta` to the previous delta (the sigmoid's Jacobian is absorbed by the loss).

Differences from Darknet (README):
- darknet: without truth Darknet keeps the previous step's loss and cost (and still averages them
  into the network cost); darkpy zeroes them (cost None), see DESIGN §4 rule 1.
- darknet: the loss is computed from the logits (`softplus(x) - t·x`, the same value), so it
  stays finite where σ(x) rounds to exactly 0 or 1 in float32 (Darknet gives inf there).
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from ..kernels import pjit
from .base import Layer, State, register
from .softmax import truth_rows


@pjit
def logistic_forward(out, x):
    """out, x: (n,) flat. out = 1 / (1 + exp(-x))."""
    for i in prange(x.shape[0]):
        out[i] = 1.0 / (1.0 + math.exp(-x[i]))


@pjit
def logistic_xent(delta, loss, p, x, t):
    """delta, loss, p, x, t: (n,) flat. delta = t - p; loss = BCE(p, t) from the logit x."""
    for i in prange(x.shape[0]):
        v = x[i]
        # -t log σ(v) - (1-t) log(1-σ(v)) = max(v, 0) - t v + log(1 + exp(-|v|))
        # darknet: evaluates the left side on the float32 p (inf once p rounds to 0 or 1)
        loss[i] = max(v, 0.0) - t[i] * v + math.log1p(math.exp(-abs(v)))
        delta[i] = t[i] - p[i]


@register
class LogisticLayer(Layer):
    kind = "logistic"
    has_cost = True

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "LogisticLayer":
        return cls(sec.index, in_shape, in_shape, ctx.dtype)

    def forward(self, s: State) -> None:
        x = s.input.reshape(-1)
        logistic_forward(self.output.reshape(-1), x)
        if s.truth is None:
            return
        self.allocate_training()         # delta and loss: sized by the first forward with truth
        t = truth_rows(s, self)
        logistic_xent(self.delta.reshape(-1), self.loss.reshape(-1), self.output.reshape(-1), x, t.reshape(-1))
        self.cost = float(self.loss.sum(dtype=np.float64))

    def backward(self, s: State) -> None:
        if s.delta is not None:
            s.delta += self.delta.reshape(s.delta.shape)

    def clear_cost(self) -> None:
        # darknet: without truth the last loss/cost stay in place and still count in the net cost
        super().clear_cost()
        self.delta.fill(0)

    def summary(self) -> str:
        return f"logistic x entropy                             {self.inputs:4d}"
