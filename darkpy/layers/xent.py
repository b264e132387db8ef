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

import numpy as np

from ..errors import StateError
from .base import Layer, State, numel, register

TARGETS = ("index", "soft")


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

    def target_distribution(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(q, keep): the (smoothed) target distribution of every row and which rows count."""
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
            q = np.zeros((B, V), np.float64)
            q[np.nonzero(keep)[0], cls[keep]] = 1.0
        else:
            q = t.reshape(B, V).astype(np.float64)
            keep = q.sum(axis=1) != 0
        if self.label_smoothing:
            q = (1 - self.label_smoothing) * q + self.label_smoothing / V
        q[~keep] = 0
        return q, keep

    def forward(self, s: State) -> None:
        x = s.input.reshape(self.batch, self.outputs).astype(np.float64) / self.temperature
        z = x - x.max(axis=1, keepdims=True)
        lse = np.log(np.exp(z).sum(axis=1, keepdims=True))
        logp = z - lse
        p = np.exp(logp)
        self.output[...] = p
        if s.truth is None:
            self.token_mean = None
            return
        self.allocate_training()
        if s.truth.size != self.batch * max(self.truths, 1) and self.targets == "index":
            raise StateError(f"[crossentropy] layer {self.index} reads 1 truth value (class id) per row, "
                             f"got {s.truth.size // max(self.batch, 1)}")
        q, keep = self.target_distribution(s.truth)
        loss = -q * logp
        self.loss[...] = loss
        self.delta[...] = (q - p * q.sum(axis=1, keepdims=True)) / self.temperature
        self.counted = int(keep.sum())
        self.cost = float(loss.sum())
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
