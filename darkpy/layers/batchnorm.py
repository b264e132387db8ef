"""`[batchnorm]`: stand-alone batch normalisation, per channel (spec §2.14, §5).

`y = γ·x̂ + β` with the same statistics, epsilon and rolling updates as the BN inside conv/connected
(see kernels/bn.py). A flat input of n values is n channels of one position each.

Differences from pjreddie's layer, on purpose (README "Differences from Darknet"):
- it works on the CPU (Darknet's CPU path crashes: its `x`/`x_norm` buffers only exist in GPU builds);
- γ and β train (Darknet has no update function for it), as in AlexeyAB's fork;
- backward ADDS into the previous delta (Darknet overwrites it). # darknet: overwrite not copied.
File layout: pjreddie's — scales, rolling_mean, rolling_variance (β, `biases`, is NOT in the file, so
a trained β is lost in such a file); AlexeyAB's puts the biases first (`alexeyab_weight_arrays`;
darkpy/weights.py says when each is used).
"""
from __future__ import annotations

import numpy as np

from ..kernels import activations as act
from ..kernels import bn as bnk
from ..kernels import im2col as ic
from ..memory import param_zeros
from .base import Layer, Param, State, is_image, register
from .bias_bn_act import BatchNormParams


@register
class BatchNormLayer(Layer):
    kind = "batchnorm"

    def __init__(self, index: int, in_shape, dtype=np.float32):
        super().__init__(index, in_shape, in_shape, dtype)
        c = self.in_shape[0] if is_image(self.in_shape) else self.inputs
        self.darknet_cpu_bn = False
        self.biases = Param("biases", param_zeros(c, self.dtype), param_zeros(c, self.dtype))
        self.bn = BatchNormParams(c, self.dtype)
        self.params = [self.biases, self.bn.scales]
        self.xnorm = np.zeros((0,), self.dtype)
        self._trained = False

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "BatchNormLayer":
        return cls(sec.index, in_shape, ctx.dtype)

    @property
    def channels(self) -> int:
        return self.bn.rolling_mean.shape[0]

    def _view(self, a: np.ndarray) -> np.ndarray:
        return a.reshape(self.batch, self.channels, -1)

    def resize(self, in_shape) -> None:
        if not is_image(in_shape) or in_shape[0] != self.channels:
            raise self.error(f"cannot resize [batchnorm] from {self.in_shape} to {tuple(in_shape)}")
        super().resize(in_shape)

    def init_weights(self, rng: np.random.Generator) -> None:
        """As Darknet: scales 1, biases 0, rolling mean 0, rolling variance 0."""
        self.bn.reset()
        self.biases.value.fill(0)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.xnorm = np.zeros((0,), self.dtype)     # x̂ of a training forward: allocate_training
        self._trained = False

    def allocate_training(self) -> None:
        super().allocate_training()
        self.xnorm = self.training_buffer(self.xnorm)

    def extra_buffers(self) -> list[np.ndarray]:
        return [self.xnorm]

    def forward(self, s: State) -> None:
        np.copyto(self.output, s.input.reshape(self.output.shape))
        y = self._view(self.output)
        bn = self.bn
        self._trained = s.train
        if s.train:
            bnk.bn_act_forward_train(y, self._view(self.xnorm), bn.mean, bn.variance, bn.rolling_mean,
                                     bn.rolling_variance, bn.scales.value, self.biases.value,
                                     act.LINEAR, self.darknet_cpu_bn)
        else:
            bnk.bn_act_forward_infer(y, bn.rolling_mean, bn.rolling_variance, bn.scales.value,
                                     self.biases.value, act.LINEAR, self.darknet_cpu_bn)

    def backward(self, s: State) -> None:
        if not self._trained:
            raise self.error("batch-norm backward needs a training-mode forward first")
        d = self._view(self.delta)
        bn = self.bn
        bnk.bn_act_backward(d, self._view(self.output), self._view(self.xnorm), bn.variance,
                            bn.scales.value, self.biases.value, self.biases.grad, bn.scales.grad,
                            act.LINEAR, d, self.darknet_cpu_bn)
        if s.delta is not None:
            ic.add_into(s.delta.reshape(-1), self.delta.reshape(-1))

    def weight_arrays(self) -> list[np.ndarray]:
        return [self.bn.scales.value, self.bn.rolling_mean, self.bn.rolling_variance]

    def alexeyab_weight_arrays(self) -> list[np.ndarray]:
        """AlexeyAB's file order: the biases (β) first, then pjreddie's three."""
        return [self.biases.value, *self.weight_arrays()]

    def summary(self) -> str:
        if is_image(self.in_shape):
            c, h, w = self.in_shape
            return f"Batch Normalization Layer: {w} x {h} x {c} image"
        return f"Batch Normalization Layer: {self.inputs} inputs"
