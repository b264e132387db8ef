"""`[layernorm]`: layer normalisation over each row's values (darkpy; no Darknet has it).

    y = gain · (x − mean) / sqrt(var + eps) + bias,   mean and (biased) var over the row

Keys: `eps` (default 1e-5, as torch.nn.LayerNorm). Gain starts at 1, bias at 0; neither is decayed
by AdamW. File order: biases, then gains (the order of Darknet's BN block: biases, scales).
"""
from __future__ import annotations

import numpy as np

from .base import Layer, Param, State, numel, register


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
        mean = x.mean(axis=1, keepdims=True)
        np.subtract(x, mean, out=self.xhat)
        var = np.mean(self.xhat * self.xhat, axis=1, keepdims=True)
        np.divide(1.0, np.sqrt(var + self.eps), out=self.inv)
        self.xhat *= self.inv
        np.multiply(self.xhat, self.scales.value, out=self.output)
        self.output += self.biases.value

    def backward(self, s: State) -> None:
        self.require_training_buffers()
        d = self.delta
        self.biases.grad += d.sum(axis=0)
        self.scales.grad += (d * self.xhat).sum(axis=0)
        if s.delta is None:
            return
        dxh = d * self.scales.value
        m1 = dxh.mean(axis=1, keepdims=True)
        m2 = (dxh * self.xhat).mean(axis=1, keepdims=True)
        dx = (dxh - m1 - self.xhat * m2) * self.inv
        s.delta += dx.reshape(s.delta.shape)

    def weight_arrays(self) -> list[np.ndarray]:
        return [self.biases.value, self.scales.value]

    def flops(self) -> float:
        return 8.0 * self.n

    def summary(self) -> str:
        return f"layernorm                                {self.n:4d}  ->  {self.n:4d}"
