"""`[attention]` / `[mha]`: multi-head scaled dot-product self-attention over the rows of each
sequence, output projection inside (darkpy; no Darknet has it).

Rows follow the recurrent layers' convention (time-major: with `steps = [net] time_steps` and S
sequences per pass, row `t·S + s` is position t of sequence s). For each sequence, with X its
`steps × D` rows and `H = heads`, `dh = D / H`:

    Q, K, V = X·Wqᵀ + bq, X·Wkᵀ + bk, X·Wvᵀ + bv      (W = [Wq; Wk; Wv], one (3D, D) matrix)
    A_h = softmax(Q_h K_hᵀ / sqrt(dh) + M)            M = −∞ where masked, else 0
    Y = concat_h(dropout(A_h)·V_h)·Woᵀ + bo

Masks: `causal=1` hides the keys after each query; `pad=ID` (≥ 0) hides the keys whose input token
(the network input, `inputs=1`) is ID. Masked weights are exactly 0 in forward and backward. A query
with every key masked gets all-zero weights (output bo) instead of NaN. `dropout=p` drops attention
weights in training (scaled by 1/(1−p)), with the network's per-iteration rng.

Parameters: `weights` (3D, D) and `biases` (3D), then `out_weights` (D, D) and `out_biases` (D),
which is also the file order. Only the two matrices are decayed by AdamW.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import StateError
from .base import Layer, Param, State, numel, register


@register
class AttentionLayer(Layer):
    kind = "attention"
    own_section = True      # darkpy's own section: `darkpy summary` adds its parameters and FLOPs
    aliases = ("mha",)
    resizable = False

    def __init__(self, index: int, dim: int, steps: int, heads: int = 1, causal: bool = True,
                 pad: int = -1, dropout: float = 0.0, dtype=np.float32):
        super().__init__(index, (dim,), (dim,), dtype)
        self.dim, self.steps, self.heads = dim, steps, heads
        self.causal, self.pad, self.dropout = causal, pad, dropout
        self.weights = Param("weights", np.zeros((3 * dim, dim), self.dtype),
                             np.zeros((3 * dim, dim), self.dtype), decay=True)
        self.biases = Param("biases", np.zeros(3 * dim, self.dtype), np.zeros(3 * dim, self.dtype))
        self.out_weights = Param("out_weights", np.zeros((dim, dim), self.dtype),
                                 np.zeros((dim, dim), self.dtype), decay=True)
        self.out_biases = Param("out_biases", np.zeros(dim, self.dtype), np.zeros(dim, self.dtype))
        self.params = [self.weights, self.biases, self.out_weights, self.out_biases]
        self._cache: dict[str, np.ndarray] = {}

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "AttentionLayer":
        dim = numel(in_shape)
        heads = sec.get_int("heads", 1)
        if heads < 1 or dim % heads:
            raise sec.error(f"must be >= 1 and divide the {dim} inputs per row (got {heads})", "heads")
        causal = sec.get_bool("causal", True)
        pad = sec.get_int("pad", -1)
        if pad >= 0 and ctx.net.inputs != 1:
            raise sec.error(f"a key-padding mask reads the token ids of the network input, which needs "
                            f"inputs=1 in [net] (got inputs={ctx.net.inputs})", "pad")
        dropout = sec.get_float("dropout", 0.0)
        if not 0 <= dropout < 1:
            raise sec.error(f"must be in [0, 1) (got {dropout})", "dropout")
        return cls(sec.index, dim, ctx.net.time_steps, heads, causal, pad, dropout, ctx.dtype)

    def init_weights(self, rng: np.random.Generator) -> None:
        """Matrices N(0, 1/D), biases 0."""
        sd = 1.0 / math.sqrt(self.dim)
        self.weights.value[...] = rng.normal(0, sd, self.weights.value.shape)
        self.out_weights.value[...] = rng.normal(0, sd, self.out_weights.value.shape)
        self.biases.value.fill(0)
        self.out_biases.value.fill(0)

    def allocate(self, batch: int) -> None:
        if batch % self.steps:
            raise StateError(f"layer {self.index} [attention]: {batch} rows is not a multiple of "
                             f"time_steps={self.steps}")
        super().allocate(batch)
        self._cache = {}

    # -- masks and layout ---------------------------------------------------------------------------
    def _seq(self, rows: np.ndarray) -> np.ndarray:
        """(T·S, n) time-major rows → (S, T, n)."""
        return np.ascontiguousarray(rows.reshape(self.steps, -1, rows.shape[-1]).transpose(1, 0, 2))

    def _rows(self, seq: np.ndarray) -> np.ndarray:
        return seq.transpose(1, 0, 2).reshape(self.batch, -1)

    def mask(self, s: State) -> np.ndarray | None:
        """(S, 1, T, T) bool, True where a key is hidden from a query; None without masks."""
        T, S = self.steps, self.batch // self.steps
        m = np.zeros((S, 1, T, T), bool)
        if self.causal:
            m |= np.triu(np.ones((T, T), bool), 1)[None, None]
        if self.pad >= 0:
            if s.net is None or s.net.input is None or s.net.input.shape[1:] != (1,):
                raise StateError(f"layer {self.index} [attention]: pad={self.pad} needs the network's token "
                                 f"ids (inputs=1)")
            ids = s.net.input.reshape(T, S).T                   # (S, T)
            m |= (ids == self.pad)[:, None, None, :]
        return m if (self.causal or self.pad >= 0) else None

    # -- compute ---------------------------------------------------------------------------------------
    def forward(self, s: State) -> None:
        T, H, D = self.steps, self.heads, self.dim
        S, dh = self.batch // T, D // H
        x = self._seq(s.input.reshape(self.batch, D))                              # (S, T, D)
        qkv = x @ self.weights.value.T + self.biases.value                         # (S, T, 3D)
        q, k, v = (qkv[..., i * D:(i + 1) * D].reshape(S, T, H, dh).transpose(0, 2, 1, 3) for i in range(3))
        scale = 1.0 / math.sqrt(dh)
        scores = (q @ k.transpose(0, 1, 3, 2)) * scale                             # (S, H, T, T)
        m = self.mask(s)
        if m is not None:
            scores = np.where(m, -np.inf, scores)
        top = scores.max(axis=-1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0)
        e = np.exp(scores - top)
        total = e.sum(axis=-1, keepdims=True)
        a = e / np.where(total > 0, total, 1)
        drop = None
        if s.train and self.dropout > 0:
            rng = s.rng if s.rng is not None else np.random.default_rng()
            drop = (rng.random(a.shape) >= self.dropout) / (1 - self.dropout)
            ad = a * drop
        else:
            ad = a
        o = (ad @ v).transpose(0, 2, 1, 3).reshape(S, T, D)                       # (S, T, D)
        y = o @ self.out_weights.value.T + self.out_biases.value
        self.output[...] = self._rows(y)
        if s.train:
            self._cache = {"x": x, "q": q, "k": k, "v": v, "a": a, "ad": ad, "drop": drop, "o": o}

    @property
    def attention_weights(self) -> np.ndarray:
        """(S, H, T, T) softmax weights of the last training forward (before dropout)."""
        return self._cache["a"]

    def backward(self, s: State) -> None:
        self.require_training_buffers()
        if not self._cache:
            raise StateError(f"layer {self.index} [attention]: backward needs a training forward first")
        c = self._cache
        T, H, D = self.steps, self.heads, self.dim
        S, dh = self.batch // T, D // H
        dy = self._seq(self.delta.reshape(self.batch, D))                          # (S, T, D)
        self.out_biases.grad += dy.sum(axis=(0, 1))
        self.out_weights.grad += dy.reshape(-1, D).T @ c["o"].reshape(-1, D)
        do = (dy @ self.out_weights.value).reshape(S, T, H, dh).transpose(0, 2, 1, 3)   # (S, H, T, dh)
        dv = c["ad"].transpose(0, 1, 3, 2) @ do
        dad = do @ c["v"].transpose(0, 1, 3, 2)
        da = dad * c["drop"] if c["drop"] is not None else dad
        a = c["a"]
        dscores = a * (da - (da * a).sum(axis=-1, keepdims=True))                 # 0 where a == 0
        scale = 1.0 / math.sqrt(dh)
        dq = (dscores @ c["k"]) * scale
        dk = (dscores.transpose(0, 1, 3, 2) @ c["q"]) * scale
        dqkv = np.concatenate([g.transpose(0, 2, 1, 3).reshape(S, T, D) for g in (dq, dk, dv)], axis=-1)
        self.biases.grad += dqkv.sum(axis=(0, 1))
        self.weights.grad += dqkv.reshape(-1, 3 * D).T @ c["x"].reshape(-1, D)
        if s.delta is not None:
            dx = dqkv @ self.weights.value
            s.delta += self._rows(dx).reshape(s.delta.shape)

    def weight_arrays(self) -> list[np.ndarray]:
        return [self.weights.value, self.biases.value, self.out_weights.value, self.out_biases.value]

    def flops(self) -> float:
        """Per row: the four projections, then scores and weighted sum over the steps."""
        return 2.0 * 4 * self.dim * self.dim + 2.0 * 2 * self.steps * self.dim

    def summary(self) -> str:
        mask = "causal" if self.causal else "full"
        return (f"attention  {self.heads:2d} heads {mask:<6} T={self.steps:<4d}      "
                f"{self.dim:4d}  ->  {self.dim:4d}")
