"""`[layernorm]`: layer normalisation over each row's values (darkpy; no Darknet has it).

    y = gain · (x − mean) / sqrt(var + eps) + bias,   mean and (biased) var over the row

Keys: `eps` (default 1e-5, as torch.nn.LayerNorm). Gain starts at 1, bias at 0; neither is decayed
by AdamW. File order: biases, then gains (the order of Darknet's BN block: biases, scales).
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from ..kernels import PARALLEL_MIN, jit, pjit, simd, vjit
from ..kernels import vecmath as vm
from ..kernels.simd import LANES
from .base import Layer, Param, State, numel, register


# -- kernels ---------------------------------------------------------------------------------------
# Row statistics and the backward's two row means are float64 sums in SIMD lanes (as
# kernels/vecmath.py's `dot_lanes`): a row of 128 float32 values is eight vector adds, not 128
# scalar ones. The parameter gradients are summed per chunk of
# GRAD_CHUNK rows (in row order, float64), the chunks in parallel, then the chunks' sums in chunk
# order: the same bits at any thread count (the order depends on LANES and GRAD_CHUNK only).
GRAD_CHUNK = 32


@jit(inline="always")
def _mean_inv(x, n, eps):
    """(mean, 1/sqrt(var + eps)) of the row x (n,) in float64 (biased var, two passes)."""
    nv = n - n % LANES
    zero = simd.widen(simd.zero(x))
    acc = zero
    for j in range(0, nv, LANES):
        acc = simd.add(acc, simd.widen(simd.load(x, j)))
    s = vm.lanes_total(acc)
    for j in range(nv, n):
        s += x[j]
    m = s / n
    mv = simd.splat(acc, m)
    acc = zero
    for j in range(0, nv, LANES):
        t = simd.sub(simd.widen(simd.load(x, j)), mv)
        acc = simd.add(acc, simd.mul(t, t))
    q = vm.lanes_total(acc)
    for j in range(nv, n):
        t = x[j] - m
        q += t * t
    return m, 1.0 / math.sqrt(q / n + eps)


@vjit
def _ln_row(out, xhat, x, gain, bias, m, k):
    for j in range(x.shape[0]):
        h = (x[j] - m) * k
        xhat[j] = h
        out[j] = h * gain[j] + bias[j]


@pjit
def layernorm_forward(out, xhat, inv, x, gain, bias, eps):
    """x, out, xhat: (B, n); inv: (B, 1) gets 1/sqrt(var + eps); gain, bias: (n,)."""
    B, n = x.shape
    if x.size < PARALLEL_MIN:
        for b in range(B):
            m, k = _mean_inv(x[b], n, eps)
            inv[b, 0] = k
            _ln_row(out[b], xhat[b], x[b], gain, bias, m, k)
    else:
        for b in prange(B):
            m, k = _mean_inv(x[b], n, eps)
            inv[b, 0] = k
            _ln_row(out[b], xhat[b], x[b], gain, bias, m, k)


@jit(inline="always")
def _grad_means(d, gain, xhat, n):
    """(mean of d·gain, mean of d·gain·x̂) over the row, in float64."""
    nv = n - n % LANES
    a1 = a2 = simd.widen(simd.zero(d))
    for j in range(0, nv, LANES):
        dg = simd.mul(simd.widen(simd.load(d, j)), simd.widen(simd.load(gain, j)))
        a1 = simd.add(a1, dg)
        a2 = simd.add(a2, simd.mul(dg, simd.widen(simd.load(xhat, j))))
    s1, s2 = vm.lanes_total(a1), vm.lanes_total(a2)
    for j in range(nv, n):
        dg = (1.0 * d[j]) * gain[j]
        s1 += dg
        s2 += dg * xhat[j]
    return s1 / n, s2 / n


@vjit
def _ln_grad_row(dx, pb, pg, d, xhat, gain, m1, m2, k, want_dx):
    """pb, pg (n,) float64 += the row's d and d·x̂; with want_dx, dx += the row's input gradient."""
    for j in range(d.shape[0]):
        v = 1.0 * d[j]
        pb[j] += v
        pg[j] += v * xhat[j]
    if want_dx:
        for j in range(d.shape[0]):
            dx[j] += (d[j] * gain[j] - m1 - xhat[j] * m2) * k


@vjit
def _ln_grad_chunk(dx, pb, pg, d, xhat, inv, gain, want_dx, lo, hi):
    """Rows lo..hi-1: pb, pg := their parameter gradients' sums; dx += their input gradients."""
    n = d.shape[1]
    for j in range(n):
        pb[j] = 0.0
        pg[j] = 0.0
    for b in range(lo, hi):
        m1, m2 = _grad_means(d[b], gain, xhat[b], n)
        _ln_grad_row(dx[b], pb, pg, d[b], xhat[b], gain, m1, m2, inv[b, 0], want_dx)


@pjit
def layernorm_backward(dx, bias_grad, gain_grad, d, xhat, inv, gain, want_dx):
    """d, xhat: (B, n); bias_grad, gain_grad: (n,) += Σ d, Σ d·x̂ over rows; with want_dx, dx: (B, n)
    += the input gradient (dx may be d itself when not want_dx: it is not written then)."""
    B, n = d.shape
    chunks = (B + GRAD_CHUNK - 1) // GRAD_CHUNK
    pb = np.empty((chunks, n))
    pg = np.empty((chunks, n))
    if d.size < PARALLEL_MIN:
        for c in range(chunks):
            _ln_grad_chunk(dx, pb[c], pg[c], d, xhat, inv, gain, want_dx, c * GRAD_CHUNK,
                           min(B, c * GRAD_CHUNK + GRAD_CHUNK))
    else:
        for c in prange(chunks):
            _ln_grad_chunk(dx, pb[c], pg[c], d, xhat, inv, gain, want_dx, c * GRAD_CHUNK,
                           min(B, c * GRAD_CHUNK + GRAD_CHUNK))
    for j in range(n):
        sb = sg = 0.0
        for c in range(chunks):
            sb += pb[c, j]
            sg += pg[c, j]
        bias_grad[j] += sb
        gain_grad[j] += sg


@register
class LayerNormLayer(Layer):
    kind = "layernorm"
    own_section = True      # darkpy's own section: `darkpy summary` adds its parameters and FLOPs
    resizable = False

    def __init__(self, index: int, in_shape, eps: float = 1e-5, dtype=np.float32):
        n = numel(in_shape)
        super().__init__(index, in_shape, (n,), dtype)
        self.n = n
        self.eps = eps
        self.biases = Param("biases", np.zeros(n, self.dtype), np.zeros(n, self.dtype))
        self.scales = Param("scales", np.ones(n, self.dtype), np.zeros(n, self.dtype))
        self.params = [self.biases, self.scales]
        self.xhat = np.zeros((0,), self.dtype)
        self.inv = np.zeros((0,), self.dtype)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "LayerNormLayer":
        eps = sec.get_float("eps", 1e-5)
        if eps <= 0:
            raise sec.error(f"must be > 0 (got {eps})", "eps")
        return cls(sec.index, in_shape, eps, ctx.dtype)

    def init_weights(self, rng: np.random.Generator) -> None:
        self.scales.value.fill(1)
        self.biases.value.fill(0)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.xhat = np.zeros((batch, self.n), self.dtype)
        self.inv = np.zeros((batch, 1), self.dtype)

    def forward(self, s: State) -> None:
        x = s.input.reshape(self.batch, self.n)
        layernorm_forward(self.output.reshape(self.batch, self.n), self.xhat, self.inv, x, self.scales.value,
                          self.biases.value, float(self.eps))

    def backward(self, s: State) -> None:
        self.require_training_buffers()
        d = self.delta.reshape(self.batch, self.n)
        want = s.delta is not None
        dx = s.delta.reshape(self.batch, self.n) if want else d
        layernorm_backward(dx, self.biases.grad, self.scales.grad, d, self.xhat, self.inv, self.scales.value,
                           want)

    def weight_arrays(self) -> list[np.ndarray]:
        return [self.biases.value, self.scales.value]

    def flops(self) -> float:
        return 8.0 * self.n

    def summary(self) -> str:
        return f"layernorm                                {self.n:4d}  ->  {self.n:4d}"
