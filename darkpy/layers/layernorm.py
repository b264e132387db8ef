"""`[layernorm]`: layer normalisation over each row's values (darkpy; no Darknet has it).

    y = gain · (x − mean) / sqrt(var + eps) + bias,   mean and (biased) var over the row

Keys: `eps` (default 1e-5, as torch.nn.LayerNorm). Gain starts at 1, bias at 0; neither is decayed
by AdamW. File order: biases, then gains (the order of Darknet's BN block: biases, scales).
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from ..kernels import PARALLEL_MIN, pjit, vjit
from ..kernels import vecmath as vm
from .base import Layer, Param, State, numel, register


# -- kernels (row statistics in float64, summed in 8 lanes: kernels/vecmath.py) -----------------
@vjit
def _ln_row(out, xhat, inv, x, gain, bias, eps, b):
    n = x.shape[1]
    mean = vm.row_sum(x[b], n) / n
    k = 1.0 / math.sqrt(vm.row_sqdev(x[b], n, mean) / n + eps)
    inv[b, 0] = k
    for j in range(n):
        h = (x[b, j] - mean) * k
        xhat[b, j] = h
        out[b, j] = h * gain[j] + bias[j]


@pjit
def layernorm_forward(out, xhat, inv, x, gain, bias, eps):
    """x, out, xhat: (B, n); inv: (B, 1) gets 1/sqrt(var + eps); gain, bias: (n,)."""
    B = x.shape[0]
    if x.size < PARALLEL_MIN:
        for b in range(B):
            _ln_row(out, xhat, inv, x, gain, bias, eps, b)
    else:
        for b in prange(B):
            _ln_row(out, xhat, inv, x, gain, bias, eps, b)


@vjit
def _ln_grad_row(dx, d, xhat, inv, gain, b):
    n = d.shape[1]
    m1 = vm.row_dot(d[b], gain, n) / n
    m2 = vm.row_dot3(d[b], gain, xhat[b], n) / n
    k = inv[b, 0]
    for j in range(n):
        dx[b, j] += (d[b, j] * gain[j] - m1 - xhat[b, j] * m2) * k


@vjit
def _ln_param_grads(acc_b, acc_g, d, xhat):
    for b in range(d.shape[0]):
        for j in range(d.shape[1]):
            acc_b[j] += d[b, j]
            acc_g[j] += d[b, j] * xhat[b, j]


@pjit
def layernorm_backward(dx, bias_grad, gain_grad, d, xhat, inv, gain, want_dx):
    """d, xhat: (B, n); bias_grad, gain_grad: (n,) += Σ d, Σ d·x̂ over rows; with want_dx, dx: (B, n)
    += the input gradient."""
    B, n = d.shape
    acc_b = np.empty(n)      # zeroed by loops: np.zeros in a parallel function is a parallel region
    acc_g = np.empty(n)
    for j in range(n):
        acc_b[j] = 0.0
        acc_g[j] = 0.0
    _ln_param_grads(acc_b, acc_g, d, xhat)
    for j in range(n):
        bias_grad[j] += acc_b[j]
        gain_grad[j] += acc_g[j]
    if not want_dx:
        return
    if d.size < PARALLEL_MIN:
        for b in range(B):
            _ln_grad_row(dx, d, xhat, inv, gain, b)
    else:
        for b in prange(B):
            _ln_grad_row(dx, d, xhat, inv, gain, b)


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
