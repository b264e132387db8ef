"""`[crossentropy]` / `[xent]`: softmax cross-entropy per row (token) from logits (darkpy).

The output is `softmax(x / temperature)` over each row (what `darkpy generate` samples from). With
truth, per row:
- `targets=index` (default): one truth value per row, the class id; rows whose id equals
  `ignore_index` (default -1) are out of the loss, out of the gradient and out of the count;
- `targets=soft`: a distribution per row (`outputs` truth values, summing to 1); an all-zero row
  is ignored the same way.
`label_smoothing=ε` mixes the target with the uniform distribution, `q ← (1 − ε)·q + ε/V` (as
torch's `F.cross_entropy(label_smoothing=ε)`). Loss per row `−Σ q·log p`, from log-sum-exp.

Cost: `cost` is the SUM over the counted rows (Darknet's raw sum, which the update rules divide
by the batch); `token_mean = cost / counted` is torch's `reduction="mean"` with `ignore_index`
(ignored rows out of the numerator and the denominator). `delta = (q − p)/temperature`, the
negative gradient of `cost` w.r.t. the logits; 0 on ignored rows.
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from ..errors import StateError
from ..kernels import PARALLEL_MIN, jit, pjit
from ..kernels import vecmath as vm
from .base import Layer, State, numel, register

TARGETS = ("index", "soft")


# -- kernels -------------------------------------------------------------------------------------
@jit(inline="always")
def _xent_row(out, loss, delta, x, cls, soft, eps, temp, want, b, fast):
    """One row, in float64: out = softmax(x/temp); with `want`, loss = −q·log p and
    delta = (q − p·Σq)/temp, q the smoothed target (class `cls[b]`, or soft[b] when soft has rows;
    cls[b] < 0 or an all-zero soft row: q = 0). Returns Σ loss. `fast`: exp as `vm.exp_neg`.
    Every loop is branch-free in j (the exps are stored first, then summed), so each vectorises."""
    V = x.shape[1]
    inv = 1.0 / temp
    xr, o = x[b], out[b]
    m = vm.row_max(xr, V, inv)
    for j in range(V):
        o[j] = vm.exp_neg(m - xr[j] * inv, fast)
    tot = vm.row_sum(o, V)
    lse = m + math.log(tot)
    rt = 1.0 / tot
    if not want:
        for j in range(V):
            o[j] = o[j] * rt
        return 0.0
    use_soft = soft.shape[0] > 0
    keep = cls[b] >= 0
    raw = 1.0
    if use_soft:
        raw = vm.row_sum(soft[b], V)
        keep = raw != 0
    sumq = 0.0
    if keep:
        sumq = (1 - eps) * raw + eps if eps > 0 else raw
    c = cls[b]
    for j in range(V):
        q = 0.0
        if keep:
            q = soft[b, j] if use_soft else (1.0 if j == c else 0.0)
            if eps > 0:
                q = (1 - eps) * q + eps / V
        p = o[j] * rt
        o[j] = p
        loss[b, j] = -q * (xr[j] * inv - lse)
        delta[b, j] = (q - p * sumq) * inv
    return vm.row_sum(loss[b], V)


@pjit(error_model="numpy")
def xent_forward(out, loss, delta, row_loss, x, cls, soft, eps, temp, want):
    """x: (B, V) logits; out, loss, delta: (B, V); row_loss: (B,) float64 gets Σ loss per row;
    cls: (B,) int64 class ids (< 0: ignored); soft: (B, V) targets, or (0, V) for index targets."""
    B = x.shape[0]
    fast = out.itemsize == 4                # float32 layers: the vectorising exp
    if x.size < PARALLEL_MIN:
        for b in range(B):
            row_loss[b] = _xent_row(out, loss, delta, x, cls, soft, eps, temp, want, b, fast)
    else:
        for b in prange(B):
            row_loss[b] = _xent_row(out, loss, delta, x, cls, soft, eps, temp, want, b, fast)


@register
class CrossEntropyLayer(Layer):
    kind = "crossentropy"
    own_section = True      # darkpy's own section: `darkpy summary` adds its parameters and FLOPs
    aliases = ("xent",)
    has_cost = True
    resizable = False

    def __init__(self, index: int, in_shape, targets: str = "index", ignore_index: int = -1,
                 label_smoothing: float = 0.0, temperature: float = 1.0, dtype=np.float32):
        n = numel(in_shape)
        super().__init__(index, in_shape, (n,), dtype)
        self.targets = targets
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.temperature = temperature
        self.counted = 0
        self.token_mean: float | None = None

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "CrossEntropyLayer":
        targets = sec.get_choice("targets", TARGETS, "index")
        ignore = sec.get_int("ignore_index", -1)
        eps = sec.get_float("label_smoothing", 0.0)
        temp = sec.get_float("temperature", 1.0)
        if not 0 <= eps < 1:
            raise sec.error(f"must be in [0, 1) (got {eps})", "label_smoothing")
        if temp <= 0:
            raise sec.error(f"must be > 0 (got {temp})", "temperature")
        if numel(in_shape) < 2:
            raise sec.error(f"needs at least 2 classes per row (got {numel(in_shape)} inputs)")
        return cls(sec.index, in_shape, targets, ignore, eps, temp, ctx.dtype)

    @property
    def truths(self) -> int:
        return 1 if self.targets == "index" else 0

    def targets_for_kernel(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cls, soft, keep) for `xent_forward`: class ids (−1 where ignored) and an empty soft
        array, or for soft targets the (B, V) distributions; keep: which rows count."""
        B, V = self.batch, self.outputs
        if self.targets == "index":
            ids = t.reshape(B)
            keep = ids != self.ignore_index
            cls = ids.astype(np.int64)
            bad = keep & ((cls != ids) | (cls < 0) | (cls >= V))
            if bad.any():
                r = int(np.argmax(bad))
                raise StateError(f"layer {self.index} [crossentropy]: row {r} has target {float(ids[r]):g}; targets "
                                 f"are class ids 0..{V - 1} or ignore_index={self.ignore_index}")
            return np.where(keep, cls, -1), np.zeros((0, V), np.float64), keep
        soft = np.ascontiguousarray(t.reshape(B, V), np.float64)
        return np.zeros(B, np.int64), soft, soft.sum(axis=1) != 0

    def forward(self, s: State) -> None:
        x = s.input.reshape(self.batch, self.outputs)
        B, V = x.shape
        want = s.truth is not None
        if want:
            self.allocate_training()
            if s.truth.size != self.batch * max(self.truths, 1) and self.targets == "index":
                raise StateError(f"[crossentropy] layer {self.index} reads 1 truth value (class id) per row, "
                                 f"got {s.truth.size // max(self.batch, 1)}")
            cls, soft, keep = self.targets_for_kernel(s.truth)
            loss, delta = self.loss.reshape(B, V), self.delta.reshape(B, V)
        else:
            cls, soft, keep = np.zeros(B, np.int64), np.zeros((0, V), np.float64), None
            loss = delta = self.output.reshape(B, V)            # unused without truth
        row_loss = np.zeros(B, np.float64)
        xent_forward(self.output.reshape(B, V), loss, delta, row_loss, x, cls, soft,
                     float(self.label_smoothing), float(self.temperature), want)
        if not want:
            self.token_mean = None
            return
        self.counted = int(keep.sum())
        self.cost = float(row_loss.sum())
        self.token_mean = self.cost / self.counted if self.counted else 0.0

    def backward(self, s: State) -> None:
        if s.delta is not None:
            s.delta += self.delta.reshape(s.delta.shape)

    def clear_cost(self) -> None:
        super().clear_cost()
        self.token_mean = None
        if self.delta.size:
            self.delta.fill(0)

    def summary(self) -> str:
        return f"crossentropy                                   {self.inputs:4d}"
