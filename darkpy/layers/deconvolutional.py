"""`[deconvolutional]` / `[deconv]`: transposed convolution with optional batch norm (spec §2.2).

Output size `(in − 1)·stride + size − 2·padding` per axis; `pad=1` means `padding = size/2` and
overrides `padding`, as in `[convolutional]`. Weights are `[c_in][filters][size][size]`, the
transposed-convolution layout, and the file order is the convolutional one: biases, (BN) scales,
rolling mean, rolling variance, then weights.

Forward, per chunk of batch items: `col = Wᵀ (n·k·k, c) @ x (c, h·w)` into the shared workspace, then
col2im ADDS every column into the zeroed output; then the fused bias/BN/activation pass shared with
conv. Backward: the fused pass turns `delta` into the gradient w.r.t. the raw product (left there, as
Darknet does), im2col unrolls it, `weight_grad += x @ dcolᵀ` and `prev_delta += W @ dcol`.

# darknet: pjreddie never sets a deconvolutional layer's `groups`, so loading its weights divides by
# zero; darkpy has no groups here (the key is not read, as in Darknet) and loads c·n·k·k weights.
"""
from __future__ import annotations

import numpy as np

from .. import blas
from ..kernels import activations as act
from ..kernels import im2col as ic
from ..memory import param_zeros
from .base import Layer, Param, State, fmt_shape, register
from .bias_bn_act import (BatchNormParams, allocate_bias_bn_act_training, backward_bias_bn_act,
                          forward_bias_bn_act)


def deconv_out_size(size_in: int, k: int, stride: int, padding: int) -> int:
    return (size_in - 1) * stride + k - 2 * padding


@register
class DeconvolutionalLayer(Layer):
    kind = "deconvolutional"
    aliases = ("deconv",)
    needs_image = True

    def __init__(self, index: int, in_shape, filters: int, size: int, stride: int = 1,
                 padding: int = 0, batch_normalize: bool = False, activation: str = "logistic",
                 dtype=np.float32):
        self.n, self.size, self.stride, self.padding = filters, size, stride, padding
        super().__init__(index, in_shape, self.compute_out_shape(in_shape), dtype)
        c = self.in_shape[0]
        self.activation = activation
        self.act = act.code(activation)
        self.batch_normalize = batch_normalize
        #: True: reproduce pjreddie's CPU batch norm (for comparing with its dumps); see kernels/bn.py.
        self.darknet_cpu_bn = False
        self.biases = Param("biases", param_zeros(filters, self.dtype), param_zeros(filters, self.dtype))
        self.weights = Param("weights", param_zeros((c, filters, size, size), self.dtype),
                             param_zeros((c, filters, size, size), self.dtype), decay=True)
        self.bn = BatchNormParams(filters, self.dtype) if batch_normalize else None
        self.params = [self.biases] + ([self.bn.scales] if self.bn else []) + [self.weights]
        self.pre = np.zeros((0,), self.dtype)
        self.xnorm = np.zeros((0,), self.dtype)
        self.wgrad_tmp = np.zeros((0,), self.dtype)
        self.dx_tmp = np.zeros((0,), self.dtype)
        self.chunk = 1
        self._trained = False

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> DeconvolutionalLayer:
        filters = sec.get_int("filters", 1)
        size = sec.get_int("size", 1)
        stride = sec.get_int("stride", 1)
        activation = sec.get_choice("activation", act.NAMES, "logistic", aliases=act.ALIASES)
        bn = sec.get_bool("batch_normalize", False)
        pad = sec.get_int("pad", 0)
        padding = sec.get_int("padding", 0)
        for key, value in (("filters", filters), ("size", size), ("stride", stride)):
            if value < 1:
                raise sec.error(f"must be >= 1 (got {value})", key)
        if padding < 0:
            raise sec.error(f"must be >= 0 (got {padding})", "padding")
        if pad:
            padding = size // 2
        layer = cls(sec.index, in_shape, filters, size, stride, padding, bn, activation, ctx.dtype)
        _, oh, ow = layer.out_shape
        if oh < 1 or ow < 1:
            raise sec.error(f"output would be {ow}x{oh}: padding {padding} removes more than a "
                            f"{size}x{size} kernel with stride {stride} adds", "padding")
        return layer

    def compute_out_shape(self, in_shape):
        _, h, w = in_shape
        return (self.n, deconv_out_size(h, self.size, self.stride, self.padding),
                deconv_out_size(w, self.size, self.stride, self.padding))

    def init_weights(self, rng: np.random.Generator) -> None:
        """Darknet's init: 0.02·N(0, 1) scaled by out_h·out_w/(h·w); biases 0; BN scales 1, rolling
        statistics 0."""
        _, h, w = self.in_shape
        _, oh, ow = self.out_shape
        scale = 0.02 * (oh * ow) / (h * w)
        self.weights.value[...] = scale * rng.standard_normal(self.weights.value.shape)
        self.biases.value.fill(0)
        if self.bn:
            self.bn.reset()

    @property
    def col_shape(self) -> tuple:
        """(n·k·k, h·w): one column per INPUT position (the grid a convolution of the output has)."""
        _, h, w = self.in_shape
        return (self.n * self.size * self.size, h * w)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        empty = np.zeros((0,), self.dtype)          # all four training-only: allocate_training
        self.pre = self.xnorm = self.wgrad_tmp = self.dx_tmp = empty
        rows, cols = self.col_shape
        self.chunk = ic.chunk_items(rows * cols, batch)
        ic.reserve(self.chunk * rows * cols, self.dtype)
        self._trained = False

    def allocate_training(self) -> None:
        super().allocate_training()
        allocate_bias_bn_act_training(self)
        rows, cols = self.col_shape
        c = self.in_shape[0]
        self.wgrad_tmp = self.training_buffer(self.wgrad_tmp, (self.chunk, c, rows))
        self.dx_tmp = self.training_buffer(self.dx_tmp, (self.chunk, c, cols))

    def extra_buffers(self) -> list[np.ndarray]:
        return [self.pre, self.xnorm, self.wgrad_tmp, self.dx_tmp]

    def _chunks(self):
        for b0 in range(0, self.batch, self.chunk):
            yield slice(b0, min(b0 + self.chunk, self.batch))

    def forward(self, s: State) -> None:
        c, h, w = self.in_shape
        _, oh, ow = self.out_shape
        x = s.input.reshape(self.batch, c, h * w)
        out = self.output.reshape(self.batch, self.n, oh, ow)
        wmat = self.weights.value.reshape(c, -1)
        self.output.fill(0)
        for items in self._chunks():
            nb = items.stop - items.start
            col = ic.get((nb, *self.col_shape), self.dtype)
            blas.matmul(wmat.T, x[items], out=col)
            ic.col2im_add(out[items], col, self.size, self.stride, self.stride, self.padding, 1, h, w)
        y = self.output.reshape(self.batch, self.n, oh * ow)
        forward_bias_bn_act(self, y, s.train)

    def backward(self, s: State) -> None:
        c, h, w = self.in_shape
        _, oh, ow = self.out_shape
        self.require_training_buffers()
        d = self.delta.reshape(self.batch, self.n, oh * ow)
        backward_bias_bn_act(self, d, self.output.reshape(d.shape))
        dimg = self.delta.reshape(self.batch, self.n, oh, ow)
        x = s.input.reshape(self.batch, c, h * w)
        prev = s.delta.reshape(self.batch, c, h * w) if s.delta is not None else None
        wmat = self.weights.value.reshape(c, -1)
        wgrad = self.weights.grad.reshape(wmat.shape)
        for items in self._chunks():
            nb = items.stop - items.start
            dcol = ic.get((nb, *self.col_shape), self.dtype)
            ic.im2col(dcol, dimg[items], self.size, self.stride, self.stride, self.padding, 1, h, w)
            tmp = self.wgrad_tmp[:nb]
            blas.matmul(x[items], dcol.transpose(0, 2, 1), out=tmp)
            for i in range(nb):
                wgrad += tmp[i]
            if prev is not None:
                dx = self.dx_tmp[:nb]
                blas.matmul(wmat, dcol, out=dx)
                prev[items] += dx

    def weight_arrays(self) -> list[np.ndarray]:
        return [self.biases.value] + (self.bn.arrays() if self.bn else []) + [self.weights.value]

    def flops(self) -> float:
        c, h, w = self.in_shape
        return 2.0 * c * self.n * self.size * self.size * h * w

    def summary(self) -> str:
        return (f"deconv{self.n:5d} {self.size:2d} x{self.size:2d} /{self.stride:2d}  "
                f"{fmt_shape(self.in_shape)}   ->  {fmt_shape(self.out_shape)}")
