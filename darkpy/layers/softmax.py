"""`[softmax]`/`[soft]`: softmax over contiguous groups, with softmax cross-entropy when there is
truth (spec §2.9, §8.1).

Each item's flat input is split into `groups` CONTIGUOUS chunks of `inputs/groups` values (not a
per-pixel channel softmax) and each chunk becomes `softmax(x / temperature)`, with the maximum
subtracted first. The output is flat.

With truth (and not `noloss`):
- `loss[i] = -log p[i]` wherever `t[i] != 0`, else 0 — Darknet's rule: the truth value is not
  used as a weight, so a soft label 0.25 contributes the full `-log p`;
- `delta = t - p`, the negative gradient of cross-entropy w.r.t. the logits (for one-hot truth and
  temperature 1 it is exactly the negative gradient of the cost);
- `cost = sum(loss)` over the batch.

Backward adds `delta` to the previous layer's delta unchanged: the softmax Jacobian is never
applied (it is absorbed by the cross-entropy). darknet: this also holds when a later layer (e.g.
`[cost] type=sse`) adds into this layer's delta, which doubles the effective gradient of a
softmax + sse pair; darkpy keeps that so training matches Darknet.
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from ..errors import StateError
from ..kernels import PARALLEL_MIN, jit, pjit
from .base import Layer, State, numel, register


@jit
def _group_max(x, b, lo, size):
    """x: (B, n). The largest of x[b, lo:lo+size] (subtracted before exp, for stability)."""
    largest = -np.inf
    for i in range(lo, lo + size):
        if x[b, i] > largest:
            largest = x[b, i]
    return largest


#: Below this argument exp is 0 in float64 (its least subnormal is exp(-745.13)).
EXP_ZERO_BELOW = -746.0


@jit(inline="always")
def _exp_or_zero(a):
    """exp(a): 0 below EXP_ZERO_BELOW without calling libm, whose underflow path took a 1000-way
    softmax of logits spread over ±750 (resnet50 at b1 with the benchmark's random weights) 17 µs
    alone (6 now) and 32 in the network; 5-6 for logits within ±10 either way."""
    return math.exp(a) if a >= EXP_ZERO_BELOW else 0.0


@jit(inline="always")
def _softmax_group(out, x, bg, groups, temp):
    """Group bg = b·groups + g of `softmax_forward`."""
    size = x.shape[1] // groups
    b = bg // groups
    lo = (bg % groups) * size
    largest = _group_max(x, b, lo, size)
    total = 0.0
    for i in range(lo, lo + size):
        e = _exp_or_zero(x[b, i] / temp - largest / temp)
        total += e
        out[b, i] = e
    for i in range(lo, lo + size):
        out[b, i] /= total


@pjit
def softmax_forward(out, x, groups, temp):
    """out, x: (B, n) flat per item, n divisible by groups. Softmax of x/temp over each group.
    Parallel over groups, serial below PARALLEL_MIN values (a classifier's 1000 at batch 1)."""
    B = x.shape[0]
    if x.size < PARALLEL_MIN:
        for bg in range(B * groups):
            _softmax_group(out, x, bg, groups, temp)
    else:
        for bg in prange(B * groups):
            _softmax_group(out, x, bg, groups, temp)


@pjit
def softmax_xent(delta, loss, p, x, t, groups, temp):
    """delta, loss, p, x, t: (B, n). delta = t - p; loss = -log p where t != 0, else 0.

    -log p is computed from the logits (log-sum-exp), so it stays finite where p underflows to 0
    (darknet: -log of the stored float, which is inf there). Serial below PARALLEL_MIN values."""
    B, n = x.shape
    if x.size < PARALLEL_MIN:
        for bg in range(B * groups):
            _xent_group(delta, loss, p, x, t, groups, temp, bg)
    else:
        for bg in prange(B * groups):
            _xent_group(delta, loss, p, x, t, groups, temp, bg)


@jit(inline="always")
def _xent_group(delta, loss, p, x, t, groups, temp, bg):
    size = x.shape[1] // groups
    b = bg // groups
    lo = (bg % groups) * size
    largest = _group_max(x, b, lo, size)
    total = 0.0
    for i in range(lo, lo + size):
        total += _exp_or_zero(x[b, i] / temp - largest / temp)
    lse = math.log(total)
    for i in range(lo, lo + size):
        delta[b, i] = t[b, i] - p[b, i]
        if t[b, i] != 0:
            # darknet: -log of the stored float p (inf where p underflows); same value otherwise
            loss[b, i] = lse - (x[b, i] / temp - largest / temp)
        else:
            loss[b, i] = 0.0


@register
class SoftmaxLayer(Layer):
    kind = "softmax"
    aliases = ("soft",)
    has_cost = True

    def __init__(self, index, in_shape, groups: int = 1, temperature: float = 1.0, noloss: bool = False,
                 dtype=np.float32):
        super().__init__(index, in_shape, (numel(in_shape),), dtype)
        self.groups = groups
        self.temperature = temperature
        self.noloss = noloss

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "SoftmaxLayer":
        groups = sec.get_int("groups", 1)
        temperature = sec.get_float("temperature", 1.0)
        noloss = sec.get_bool("noloss", False)
        if cls is SoftmaxLayer and sec.has("tree"):
            from .tree import TreeSoftmaxLayer     # YOLO9000's softmax tree (layers/tree.py)
            return TreeSoftmaxLayer.from_cfg(sec, in_shape, ctx)
        if sec.get_int("spatial", 0):
            raise sec.error("spatial=1 (a GPU-only per-pixel softmax in Darknet) is not supported by darkpy",
                            "spatial")
        n = numel(in_shape)
        if groups < 1 or n % groups:
            raise sec.error(f"must be >= 1 and divide the {n} inputs (got {groups})", "groups")
        if temperature <= 0:
            raise sec.error(f"must be > 0 (got {temperature})", "temperature")
        return cls(sec.index, in_shape, groups, temperature, noloss, ctx.dtype)

    def compute_out_shape(self, in_shape):
        n = numel(in_shape)
        if n % self.groups:
            raise self.error(f"groups={self.groups} does not divide the {n} inputs of the resized network")
        return (n,)

    def forward(self, s: State) -> None:
        x = s.input.reshape(self.batch, self.outputs)
        softmax_forward(self.output, x, self.groups, self.temperature)
        if s.truth is None:
            return
        self.allocate_training()         # delta and loss: sized by the first forward with truth
        if self.noloss:
            # darknet: a noloss softmax still has a cost (0) that counts in the network's average
            self.loss.fill(0)
            self.cost = 0.0
            return
        t = truth_rows(s, self)
        softmax_xent(self.delta, self.loss, self.output, x, t, self.groups, self.temperature)
        self.cost = float(self.loss.sum(dtype=np.float64))

    def backward(self, s: State) -> None:
        # darknet: no softmax Jacobian, whatever added into self.delta (module docstring)
        if s.delta is not None:
            s.delta += self.delta.reshape(s.delta.shape)

    def clear_cost(self) -> None:
        super().clear_cost()
        self.delta.fill(0)

    def summary(self) -> str:
        return f"softmax                                        {self.inputs:4d}"


def truth_rows(s: State, layer: Layer) -> np.ndarray:
    """The truth rows for a loss layer whose truth has the layer's own output size, as (batch, n)."""
    t = s.truth
    if t.size != layer.batch * layer.outputs:
        raise StateError(f"[{layer.kind}] layer {layer.index} needs {layer.outputs} truth values per item, "
                         f"got {t.size // max(layer.batch, 1)}")
    return t.reshape(layer.batch, layer.outputs)
