"""Bias, batch norm and activation, the part of a forward and backward that convolutional,
deconvolutional and connected layers share: the batch-norm parameters, the fused pass over a raw
product (`forward_bias_bn_act`, `backward_bias_bn_act`) and the per-channel factors of the
inference epilogue a kernel applies itself (`inference_epilogue`)."""
from __future__ import annotations

import numpy as np

from ..kernels import activations as act
from ..kernels import bn as bnk
from ..memory import param_ones, param_zeros
from .base import Param


class BatchNormParams:
    """γ (`scales`, learnable), the rolling statistics and the last batch's statistics of a BN block
    over `n` channels; shared by conv and connected. β lives in the owning layer's `biases`."""

    def __init__(self, n: int, dtype):
        self.scales = Param("scales", param_ones(n, dtype), param_zeros(n, dtype), decay=False)
        self.rolling_mean = param_zeros(n, dtype)
        self.rolling_variance = param_zeros(n, dtype)
        self.mean = param_zeros(n, dtype)       # batch statistics of the last training forward
        self.variance = param_zeros(n, dtype)

    def arrays(self) -> list[np.ndarray]:
        """The BN block as a .weights file stores it: scales, rolling mean, rolling variance."""
        return [self.scales.value, self.rolling_mean, self.rolling_variance]

    def reset(self) -> None:
        """Darknet's initial values: γ = 1, rolling mean 0, rolling variance 0."""
        self.scales.value.fill(1)
        self.rolling_mean.fill(0)
        self.rolling_variance.fill(0)


def allocate_bias_bn_act_training(layer) -> None:
    """Shared by conv, deconv and connected: size the training buffers the fused pass needs, the
    pre-activation (swish/mish/... backward reads it) and BN's x̂, like the layer's output."""
    if act.needs_input(layer.act):
        layer.pre = layer.training_buffer(layer.pre)
    if layer.bn:
        layer.xnorm = layer.training_buffer(layer.xnorm)


def forward_bias_bn_act(layer, y: np.ndarray, train: bool, keep_pre: bool = True) -> None:
    """Shared by conv, deconv and connected: turn `y` (B, C, S), the raw product, into the layer's
    output in place: + bias, or batch norm (batch statistics in training, rolling ones otherwise,
    β = biases), then the activation. The pre-activation is copied to `layer.pre` when it exists
    and `keep_pre` (swish/mish/... need it in backward)."""
    layer._trained = train
    keep = keep_pre and layer.pre.size > 0
    bn = layer.bn
    a = act.kernel_code(layer.act, y.dtype)
    if bn is None and y.shape[2] == 1:          # connected, 1×1 maps: along rows (vectorised)
        y2 = y.reshape(y.shape[:2])
        bnk.bias_act_forward_rows(y2, layer.pre.reshape(y2.shape) if keep else y2, layer.biases.value, a,
                                  keep)
    elif bn is None:
        bnk.bias_act_forward(y, layer.pre.reshape(y.shape) if keep else y, layer.biases.value, a, keep)
    elif train:
        bnk.bn_act_forward_train(y, layer.xnorm.reshape(y.shape), bn.mean, bn.variance,
                                 bn.rolling_mean, bn.rolling_variance, bn.scales.value,
                                 layer.biases.value, a, layer.darknet_cpu_bn)
    else:
        bnk.bn_act_forward_infer(y, bn.rolling_mean, bn.rolling_variance, bn.scales.value,
                                 layer.biases.value, a, layer.darknet_cpu_bn)


def inference_epilogue(layer) -> tuple:
    """(k, off, activation code) for a kernel that finishes an inference forward itself, as it
    writes each output plane: act(raw·k + off) with k, off (C,) float64 the very values the
    separate pass (`forward_bias_bn_act`) computes, so the same bits.
    Marks the forward as an inference one, as that pass would."""
    layer._trained = False
    k, off = layer.affine
    if layer.bn is None:
        k[:] = 1.0
        off[:] = layer.biases.value
    else:
        bn = layer.bn
        bnk.infer_affine(k, off, bn.rolling_mean, bn.rolling_variance, bn.scales.value,
                         layer.biases.value, layer.darknet_cpu_bn)
    return k, off, act.kernel_code(layer.act, layer.dtype)


def backward_bias_bn_act(layer, d: np.ndarray, y: np.ndarray) -> None:
    """Shared by conv and connected: turn `d` (B, C, S), the gradient w.r.t. the activated output,
    into the gradient w.r.t. the raw product, in place, accumulating bias (and BN scale) gradients."""
    a = act.kernel_code(layer.act, d.dtype)
    if layer.bn is None:
        if act.needs_input(layer.act) and not layer._trained:
            raise layer.error(f"{layer.activation} backward needs a training-mode forward first")
        if d.shape[2] == 1:
            d2, y2 = d.reshape(d.shape[:2]), y.reshape(d.shape[:2])
            bnk.bias_act_backward_rows(d2, y2, layer.pre.reshape(d2.shape) if layer.pre.size else y2,
                                       layer.biases.grad, a)
        else:
            bnk.bias_act_backward(d, y, layer.pre.reshape(d.shape) if layer.pre.size else y,
                                  layer.biases.grad, a)
        return
    if not layer._trained:
        raise layer.error("batch-norm backward needs a training-mode forward first")
    bn = layer.bn
    bnk.bn_act_backward(d, y, layer.xnorm.reshape(d.shape), bn.variance, bn.scales.value,
                        layer.biases.value, layer.biases.grad, bn.scales.grad, a,
                        layer.pre.reshape(d.shape) if layer.pre.size else y, layer.darknet_cpu_bn)

