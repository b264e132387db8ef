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
from numba import prange

from .. import blas
from ..errors import StateError
from ..kernels import PARALLEL_MIN, pjit
from ..kernels import activations as act
from ..kernels import attention as attn
from ..kernels import bn as bnk
from ..kernels.attention import softmax_grad_row, softmax_row
from .base import Layer, Param, State, numel, register


# -- kernels -------------------------------------------------------------------------------------
@pjit(error_model="numpy")
def softmax_masked(a, scale, causal, keymask):
    """a: (S, H, T, T) raw scores Q·Kᵀ, in place -> softmax(a·scale + M) over the last axis, M = −∞
    after the query (causal) and at keys with keymask (S, T) set (keymask (0, 0): none)."""
    S, H, T = a.shape[:3]
    fast = a.itemsize == 4                  # float32 layers: the vectorising exp
    if a.size < PARALLEL_MIN:
        for i in range(S * H):
            for t in range(T):
                softmax_row(a[i // H, i % H, t], scale, causal, keymask, i // H, t, fast)
    else:
        for i in prange(S * H):
            for t in range(T):
                softmax_row(a[i // H, i % H, t], scale, causal, keymask, i // H, t, fast)


@pjit(error_model="numpy")
def softmax_backward(da, a, scale):
    """da: (S, H, T, T) gradient w.r.t. the weights a, in place -> w.r.t. the raw scores Q·Kᵀ:
    scale·a·(da − Σ da·a) (0 wherever a is 0, so masked keys get exactly 0)."""
    S, H, T = a.shape[:3]
    if a.size < PARALLEL_MIN:
        for i in range(S * H):
            for t in range(T):
                softmax_grad_row(da[i // H, i % H, t], a[i // H, i % H, t], scale, T)
    else:
        for i in prange(S * H):
            for t in range(T):
                softmax_grad_row(da[i // H, i % H, t], a[i // H, i % H, t], scale, T)


#: Scores, softmax and weighted sum per (sequence, head) in one fused SIMD kernel, forward and
#: backward (kernels/attention.py), where the head size is whole vector pairs and no dropout is
#: drawn; else GEMM stacks. tiny-gpt (16 sequences of 64, 4 heads of 32), 2 threads, 2-core
#: AVX-512 Xeon: a layer's products and softmax 0.47 ms forward and 0.67 backward against 0.73 and
#: 1.3 as GEMM stacks; its training step 0.94x the time (alternating in one process).
FUSED = True


@register
class AttentionLayer(Layer):
    kind = "attention"
    own_section = True      # darkpy's own section: `darkpy summary` adds its parameters and FLOPs
    aliases = ("mha",)
    resizable = False
    assigns_fresh_delta = True   # its input gradient is one GEMM: written straight into a fresh delta

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
        empty = np.zeros((0,), self.dtype)
        self.qkv = self.scores = self.context = empty           # forward (allocate)
        self.dqkv = self.dscores = self.dcontext = self.dx_tmp = self.wgrad_tmp = empty   # backward
        self.drop: np.ndarray | None = None     # the last training forward's dropout scale, (S, H, T, T)
        self._x: np.ndarray | None = None       # its input rows; None: no training forward to go back through

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
        T, D = self.steps, self.dim
        self.qkv = np.zeros((batch, 3 * D), self.dtype)                            # time-major rows
        self.scores = np.zeros((batch // T, self.heads, T, T), self.dtype)         # (S, H, T, T)
        self.context = np.zeros((batch, D), self.dtype)                            # concat_h(A_h·V_h)
        empty = np.zeros((0,), self.dtype)                 # the training ones: allocate_training
        self.dqkv = self.dscores = self.dcontext = self.dx_tmp = self.wgrad_tmp = empty
        self.drop, self._x = None, None

    def allocate_training(self) -> None:
        super().allocate_training()
        self.dqkv = self.training_buffer(self.dqkv, self.qkv.shape)
        self.dscores = self.training_buffer(self.dscores, self.scores.shape)
        self.dcontext = self.training_buffer(self.dcontext, self.context.shape)
        self.dx_tmp = self.training_buffer(self.dx_tmp, (self.batch, self.dim))
        self.wgrad_tmp = self.training_buffer(self.wgrad_tmp, self.weights.value.shape)

    def extra_buffers(self) -> list[np.ndarray]:
        return [self.qkv, self.scores, self.context, self.dqkv, self.dscores, self.dcontext, self.dx_tmp,
                self.wgrad_tmp]

    # -- masks and layout ---------------------------------------------------------------------------
    def key_mask(self, s: State) -> np.ndarray:
        """(S, T) uint8, 1 where a key is a pad token; (0, 0) without a key-padding mask."""
        T, S = self.steps, self.batch // self.steps
        if self.pad < 0:
            return np.zeros((0, 0), np.uint8)
        if s.net is None or s.net.input is None or s.net.input.shape[1:] != (1,):
            raise StateError(f"layer {self.index} [attention]: pad={self.pad} needs the network's token "
                             f"ids (inputs=1)")
        return np.ascontiguousarray((s.net.input.reshape(T, S).T == self.pad).astype(np.uint8))

    # -- compute ---------------------------------------------------------------------------------------
    # The projections are GEMMs (blas.matmul). The per-(sequence, head) products run fused
    # (kernels/attention.py) where the head size allows; otherwise, and with dropout, as stacks of
    # small GEMMs through blas.matmul, which runs a stack as one stream per thread (each 64 × 64 @
    # 64 × 32 product at tiny-gpt's size is below OpenBLAS's own threading threshold).
    def _heads(self, rows: np.ndarray, part: int = 0, parts: int = 1) -> np.ndarray:
        """(T·S, parts·D) time-major rows → a (S, H, T, dh) view of block `part` (no copy)."""
        T, H = self.steps, self.heads
        S, dh = self.batch // T, self.dim // H
        return rows.reshape(T, S, parts, H, dh)[:, :, part].transpose(1, 2, 0, 3)

    def forward(self, s: State) -> None:
        D, dh = self.dim, self.dim // self.heads
        x = s.input.reshape(self.batch, D)                                         # time-major rows
        qkv, a = self.qkv, self.scores
        blas.product(qkv, x, self.weights.value.T, bias=self.biases.value)         # (T·S, 3D)
        self.drop = None
        if s.train and self.dropout > 0:
            rng = s.rng if s.rng is not None else np.random.default_rng()
            self.drop = (rng.random(a.shape) >= self.dropout) / (1 - self.dropout)
        if self.fused:
            attn.attention_forward(a, self.context, qkv, 1.0 / math.sqrt(dh), self.causal, self.key_mask(s))
        else:
            q, k, v = (self._heads(qkv, i, 3) for i in range(3))                   # (S, H, T, dh) views
            blas.matmul(q, k.transpose(0, 1, 3, 2), out=a)                         # (S, H, T, T)
            softmax_masked(a, 1.0 / math.sqrt(dh), self.causal, self.key_mask(s))
            blas.matmul(self._dropped(), v, out=self._heads(self.context))
        blas.product(self.output.reshape(self.batch, D), self.context, self.out_weights.value.T,
                     bias=self.out_biases.value)
        self._x = x if s.train else None

    @property
    def fused(self) -> bool:
        """This pass takes the fused kernels (kernels/attention.py): FUSED, a head size of whole
        microkernel columns, and no dropout drawn for it."""
        return FUSED and attn.fits(self.dim // self.heads) and self.drop is None

    def _dropped(self) -> np.ndarray:
        """The weights the values are averaged with: a, or a·drop in a training forward with dropout."""
        return self.scores if self.drop is None else (self.scores * self.drop).astype(self.dtype)

    @property
    def attention_weights(self) -> np.ndarray:
        """(S, H, T, T) softmax weights of the last training forward (before dropout)."""
        if self._x is None:
            raise StateError(f"layer {self.index} [attention]: no training forward to read weights from")
        return self.scores

    def backward(self, s: State) -> None:
        self.require_training_buffers()
        if self._x is None:
            raise StateError(f"layer {self.index} [attention]: backward needs a training forward first")
        D, dh = self.dim, self.dim // self.heads
        a, da, dqkv = self.scores, self.dscores, self.dqkv
        dy = self.delta.reshape(self.batch, D)
        bnk.bias_act_backward_rows(dy, dy, dy, self.out_biases.grad, act.LINEAR)    # Σ rows, in parallel
        blas.product(self.out_weights.grad, dy.T, self.context, add=True, scratch=self.wgrad_tmp[:D])
        do = self._heads(blas.product(self.dcontext, dy, self.out_weights.value))   # (S, H, T, dh)
        if self.fused:
            attn.attention_backward(dqkv, da, a, self.dcontext, self.qkv, 1.0 / math.sqrt(dh), self.causal)
        else:
            q, k, v = (self._heads(self.qkv, i, 3) for i in range(3))
            blas.matmul(self._dropped().transpose(0, 1, 3, 2), do, out=self._heads(dqkv, 2, 3))   # dv
            blas.matmul(do, v.transpose(0, 1, 3, 2), out=da)                       # d weights
            if self.drop is not None:
                da *= self.drop
            softmax_backward(da, a, 1.0 / math.sqrt(dh))                           # -> d scores·scale
            blas.matmul(da, k, out=self._heads(dqkv, 0, 3))                        # dq
            blas.matmul(da.transpose(0, 1, 3, 2), q, out=self._heads(dqkv, 1, 3))  # dk
        bnk.bias_act_backward_rows(dqkv, dqkv, dqkv, self.biases.grad, act.LINEAR)
        blas.product(self.weights.grad, dqkv.T, self._x, add=True, scratch=self.wgrad_tmp)
        if s.delta is not None:
            blas.product(s.delta.reshape(self.batch, D), dqkv, self.weights.value, add=not s.delta_fresh,
                         scratch=self.dx_tmp)

    def weight_arrays(self) -> list[np.ndarray]:
        return [self.weights.value, self.biases.value, self.out_weights.value, self.out_biases.value]

    def flops(self) -> float:
        """Per row: the four projections, then scores and weighted sum over the steps."""
        return 2.0 * 4 * self.dim * self.dim + 2.0 * 2 * self.steps * self.dim

    def summary(self) -> str:
        mask = "causal" if self.causal else "full"
        return (f"attention  {self.heads:2d} heads {mask:<6} T={self.steps:<4d}      "
                f"{self.dim:4d}  ->  {self.dim:4d}")
