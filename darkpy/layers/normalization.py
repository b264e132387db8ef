"""Normalisation across channels: `[l2norm]` and `[lrn]`/`[normalization]` (spec §2.12, §2.13).

Both work per spatial position (b, y, x) on the vector of channel values. A flat input of n values
counts as an n-channel 1x1 image, as in Darknet (a connected layer's output is 1x1xn there).

`[l2norm]`: `y = x / sqrt(sum_c x²)` (no epsilon). Backward is the exact gradient
`dx = (dy - y · sum_c(dy · y)) / norm`.
darknet: the CPU backward is a pass-through (`prev.delta += delta`) and the GPU adds a leftover
`(1 - y)/norm` term first; neither is a gradient of the forward, darkpy uses the exact one.
darkpy also outputs 0 (and passes no gradient) where all channels are 0 (Darknet gives NaN).

`[lrn]`: `y_k = x_k · norm_k^(-beta)`, `norm_k = kappa + alpha · S_k`, alpha NOT divided by size.
darknet: S_k comes from Darknet's running-window sum, which has an off-by-one that darkpy keeps
for forward parity: the first window is channels [0, size/2), then channel k adds channel
`k + size/2` and removes channel `k - (size-1)/2 - 1`. Channel size/2 is therefore never added, but
is subtracted once it leaves the window. Backward is the exact gradient of THAT forward (Darknet's
is `delta · norm^(-beta)` only, and it overwrites the previous delta; darkpy adds):
`dx_j = dy_j · norm_j^(-beta) - 2·alpha·beta · x_j · sum_k M[k, j] · dy_k · x_k · norm_k^(-beta-1)`,
where M[k, j] in {-1, 0, 1} is how channel j's square enters S_k. The sum over k is evaluated with
the window recurrence run backwards (suffix sums), O(c) per position.
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from ..kernels import pjit
from .base import Layer, State, register


def _chw(shape) -> tuple[int, int]:
    """(channels, spatial positions) of an image shape, or of a flat vector as n x 1 x 1."""
    if len(shape) == 3:
        return shape[0], shape[1] * shape[2]
    n = 1
    for d in shape:
        n *= d
    return n, 1


# -- l2norm --------------------------------------------------------------------------------------
@pjit
def l2norm_forward(out, norms, x):
    """out, x: (B, C, S); norms: (B, S). out = x / ||x||_channels per (b, s); 0 where the norm is 0."""
    B, C, S = x.shape
    for b in prange(B):
        for s in range(S):
            acc = 0.0
            for c in range(C):
                acc += x[b, c, s] * x[b, c, s]
            n = math.sqrt(acc)
            norms[b, s] = n
            for c in range(C):
                out[b, c, s] = x[b, c, s] / n if n > 0 else 0.0


@pjit
def l2norm_backward(prev_delta, delta, y, norms):
    """prev_delta, delta, y: (B, C, S); norms: (B, S). prev += (dy - y·sum_c(dy·y)) / norm."""
    B, C, S = y.shape
    for b in prange(B):
        for s in range(S):
            n = norms[b, s]
            if n <= 0:
                continue
            dot = 0.0
            for c in range(C):
                dot += delta[b, c, s] * y[b, c, s]
            for c in range(C):
                prev_delta[b, c, s] += (delta[b, c, s] - y[b, c, s] * dot) / n


@register
class L2NormLayer(Layer):
    kind = "l2norm"

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "L2NormLayer":
        return cls(sec.index, in_shape, in_shape, ctx.dtype)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        c, sp = _chw(self.in_shape)
        self.norms = np.zeros((batch, sp), self.dtype)

    def extra_buffers(self):
        return [self.norms]

    def _view(self, a: np.ndarray) -> np.ndarray:
        c, sp = _chw(self.in_shape)
        return a.reshape(self.batch, c, sp)

    def forward(self, s: State) -> None:
        l2norm_forward(self._view(self.output), self.norms, self._view(s.input))

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        # darknet: the CPU backward is a pass-through; this is the exact gradient (module docstring)
        l2norm_backward(self._view(s.delta), self._view(self.delta), self._view(self.output), self.norms)

    def summary(self) -> str:
        return f"l2norm                                         {self.inputs:4d}"


# -- local response normalisation ----------------------------------------------------------------
@pjit
def lrn_forward(out, norms, x, size, alpha, beta, kappa):
    """out, norms, x: (B, C, S). Darknet's running-window norms (module docstring), then
    out = x · norms^(-beta)."""
    B, C, S = x.shape
    half = size // 2
    back = (size - 1) // 2 + 1
    for b in prange(B):
        for s in range(S):
            norms[b, 0, s] = kappa
        for k in range(min(half, C)):
            for s in range(S):
                norms[b, 0, s] += alpha * (x[b, k, s] * x[b, k, s])
        for k in range(1, C):
            prev = k - back
            nxt = k + half
            for s in range(S):
                v = norms[b, k - 1, s]
                if prev >= 0:
                    v -= alpha * (x[b, prev, s] * x[b, prev, s])
                if nxt < C:
                    v += alpha * (x[b, nxt, s] * x[b, nxt, s])
                norms[b, k, s] = v
        for k in range(C):
            for s in range(S):
                out[b, k, s] = x[b, k, s] * norms[b, k, s] ** -beta


@pjit
def lrn_backward(prev_delta, acc, delta, x, norms, size, alpha, beta):
    """prev_delta, delta, x, norms: (B, C, S); acc: (B, C, S) scratch. Exact gradient of lrn_forward.

    norm_k is a prefix sum of window updates u_i (u_0: the first window; u_i, i >= 1: add channel
    i + size/2, remove channel i - (size-1)/2 - 1), so with g_k = dy_k · x_k · norm_k^(-beta-1) and
    suffix sums G_i = sum_{k >= i} g_k, sum_k g_k norm_k = sum_i G_i u_i. Channel j's square then
    collects h_j = G_0 [j < size/2] + G_{j - size/2} [j - size/2 >= 1] - G_{j + back} [j + back < C]."""
    B, C, S = x.shape
    half = size // 2
    back = (size - 1) // 2 + 1
    for b in prange(B):
        for k in range(C - 1, -1, -1):
            for s in range(S):
                g = delta[b, k, s] * x[b, k, s] * norms[b, k, s] ** (-beta - 1)
                acc[b, k, s] = g + acc[b, k + 1, s] if k + 1 < C else g
        for j in range(C):
            for s in range(S):
                h = acc[b, 0, s] if j < half else 0.0 * acc[b, 0, s]
                if j - half >= 1:
                    h += acc[b, j - half, s]
                if j + back < C:
                    h -= acc[b, j + back, s]
                prev_delta[b, j, s] += (delta[b, j, s] * norms[b, j, s] ** -beta
                                        - 2.0 * alpha * beta * x[b, j, s] * h)


@register
class LRNLayer(Layer):
    """Local response normalisation across channels, with Darknet's window (module docstring)."""

    kind = "normalization"
    aliases = ("lrn",)
    needs_image = True

    def __init__(self, index, in_shape, size=5, alpha=1e-4, beta=0.75, kappa=1.0, dtype=np.float32):
        super().__init__(index, in_shape, in_shape, dtype)
        self.size, self.alpha, self.beta, self.kappa = size, alpha, beta, kappa

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "LRNLayer":
        alpha = sec.get_float("alpha", 1e-4)
        beta = sec.get_float("beta", 0.75)
        kappa = sec.get_float("kappa", 1.0)
        size = sec.get_int("size", 5)
        if size < 1:
            raise sec.error(f"must be >= 1 (got {size})", "size")
        return cls(sec.index, in_shape, size, alpha, beta, kappa, ctx.dtype)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.norms = np.zeros_like(self.output)
        self.scratch = np.zeros((0,), self.dtype)   # backward-only: allocate_training

    def allocate_training(self) -> None:
        super().allocate_training()
        self.scratch = self.training_buffer(self.scratch)

    def extra_buffers(self):
        return [self.norms, self.scratch]

    def _view(self, a: np.ndarray) -> np.ndarray:
        c, sp = _chw(self.in_shape)
        return a.reshape(self.batch, c, sp)

    def forward(self, s: State) -> None:
        lrn_forward(self._view(self.output), self._view(self.norms), self._view(s.input), self.size,
                    self.alpha, self.beta, self.kappa)

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        # darknet: backward is delta·norm^(-beta) only and overwrites; this is the exact gradient, added
        lrn_backward(self._view(s.delta), self._view(self.scratch), self._view(self.delta),
                     self._view(s.input), self._view(self.norms), self.size, self.alpha, self.beta)

    def summary(self) -> str:
        c, h, w = self.in_shape
        return f"Local Response Normalization Layer: {w} x {h} x {c} image, {self.size} size"
