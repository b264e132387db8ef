"""`[connected]` / `[conn]`: fully connected layer with optional batch norm (spec §2.4, §5).

`y = act(BN(x·Wᵀ) or x·Wᵀ + b)` on the flattened input; W is `[outputs][inputs]`, as in the
`.weights` file. The file order is biases, weights, then (with BN) scales, rolling mean, rolling
variance — unlike convolutional, where the BN arrays come before the weights.

As in the convolutional layer, backward leaves the gradient w.r.t. the raw product `x·Wᵀ` in `delta`
(Darknet's behaviour) and ADDS `delta·W` into the previous layer's delta. With BN the statistics are
per output unit over the batch rows.

darkpy: `tie=L` (a layer reference, as `from=`) makes the weight matrix the token table of the
`[embedding]` layer L (vocab × size, so `output` must be its vocab and the input its size): weight
tying of an output projection. The one array gets the sum of both layers' gradients, is updated once
(as the embedding's parameter, not decayed) and is stored once in the .weights file, with the
embedding; this layer stores only its biases.
"""
from __future__ import annotations

import math

import numpy as np

from .. import blas
from ..kernels import activations as act
from ..memory import param_zeros
from .base import Layer, Param, State, register
from .bias_bn_act import (BatchNormParams, allocate_bias_bn_act_training, backward_bias_bn_act,
                          forward_bias_bn_act)


@register
class ConnectedLayer(Layer):
    kind = "connected"
    aliases = ("conn",)
    resizable = False
    assigns_fresh_delta = True   # its input gradient is one GEMM: written straight into a fresh delta

    def __init__(self, index: int, in_shape, outputs: int, batch_normalize: bool = False,
                 activation: str = "logistic", dtype=np.float32):
        super().__init__(index, in_shape, (outputs,), dtype)
        n_in = self.inputs
        self.n = outputs
        self.activation = activation
        self.act = act.code(activation)
        self.batch_normalize = batch_normalize
        #: True: reproduce pjreddie's CPU batch norm (for comparing with its dumps); see kernels/bn.py.
        self.darknet_cpu_bn = False
        self.biases = Param("biases", param_zeros(outputs, self.dtype), param_zeros(outputs, self.dtype))
        self.weights = Param("weights", param_zeros((outputs, n_in), self.dtype),
                             param_zeros((outputs, n_in), self.dtype), decay=True)
        self.bn = BatchNormParams(outputs, self.dtype) if batch_normalize else None
        self.params = [self.biases, self.weights] + ([self.bn.scales] if self.bn else [])
        self.pre = np.zeros((0,), self.dtype)       # pre-activation (swish/mish/...: their gradient needs it)
        self.xnorm = np.zeros((0,), self.dtype)     # BN x̂ of the last training forward
        self.wgrad_tmp = np.zeros((0,), self.dtype)
        self.dx_tmp = np.zeros((0,), self.dtype)
        self._trained = False
        self.tied: int | None = None                # index of the [embedding] whose table is `weights`

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "ConnectedLayer":
        outputs = sec.get_int("output", 1)
        if outputs < 1:
            raise sec.error(f"must be >= 1 (got {outputs})", "output")
        bn = sec.get_bool("batch_normalize", False)
        activation = sec.get_choice("activation", act.NAMES, "logistic", aliases=act.ALIASES)
        layer = cls(sec.index, in_shape, outputs, bn, activation, ctx.dtype)
        if sec.has("tie"):
            ref = ctx.ref(sec, "tie", sec.get_int("tie"))
            layer.tie_to(ctx.layers[ref], sec)
        return layer

    def tie_to(self, emb, sec=None) -> None:
        """Share `emb`'s token table as this layer's weights (see the module docstring)."""
        def fail(msg):
            raise (sec.error(msg, "tie") if sec is not None else ValueError(msg))
        if emb.kind != "embedding":
            fail(f"layer {emb.index} is [{emb.kind}], not an [embedding]")
        if emb.table.value.shape != self.weights.value.shape:
            fail(f"the [embedding] table of layer {emb.index} is {emb.vocab} x {emb.size}; tying needs "
                 f"output={emb.vocab} and {emb.size} inputs (this layer: output={self.n}, {self.inputs} inputs)")
        self.weights = emb.table
        self.tied = emb.index
        self.params = [self.biases] + ([self.bn.scales] if self.bn else [])

    def init_weights(self, rng: np.random.Generator) -> None:
        """Darknet's init: weights sqrt(2/inputs)·U(−1, 1), biases 0; BN scales 1, rolling stats 0.
        Tied weights belong to the embedding (its init)."""
        if self.tied is None:
            self.weights.value[...] = math.sqrt(2.0 / self.inputs) * rng.uniform(-1, 1, self.weights.value.shape)
        self.biases.value.fill(0)
        if self.bn:
            self.bn.reset()

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        empty = np.zeros((0,), self.dtype)          # all four training-only: allocate_training
        self.pre = self.xnorm = self.wgrad_tmp = self.dx_tmp = empty
        self._trained = False

    def allocate_training(self) -> None:
        super().allocate_training()
        allocate_bias_bn_act_training(self)
        self.wgrad_tmp = self.training_buffer(self.wgrad_tmp, self.weights.value.shape)
        self.dx_tmp = self.training_buffer(self.dx_tmp, (self.batch, self.inputs))

    def extra_buffers(self) -> list[np.ndarray]:
        return [self.pre, self.xnorm, self.wgrad_tmp, self.dx_tmp]

    def forward(self, s: State) -> None:
        x = s.input.reshape(self.batch, self.inputs)
        out = self.output.reshape(self.batch, self.n)
        if self.bn is None and self.act == act.LINEAR:      # the bias is where the sums start
            blas.product(out, x, self.weights.value.T, bias=self.biases.value)
            self._trained = s.train
            return
        blas.product(out, x, self.weights.value.T)
        forward_bias_bn_act(self, out.reshape(self.batch, self.n, 1), s.train)

    def backward(self, s: State) -> None:
        self.require_training_buffers()
        d = self.delta.reshape(self.batch, self.n, 1)
        backward_bias_bn_act(self, d, self.output.reshape(d.shape))
        d2 = self.delta.reshape(self.batch, self.n)
        x = s.input.reshape(self.batch, self.inputs)
        blas.product(self.weights.grad, d2.T, x, add=True, scratch=self.wgrad_tmp)
        if s.delta is not None:
            blas.product(s.delta.reshape(self.batch, self.inputs), d2, self.weights.value,
                         add=not s.delta_fresh, scratch=self.dx_tmp)

    def weight_arrays(self) -> list[np.ndarray]:
        # darknet: connected stores its weights BEFORE the BN block (conv stores them after)
        weights = [] if self.tied is not None else [self.weights.value]
        return [self.biases.value] + weights + (self.bn.arrays() if self.bn else [])

    def flops(self) -> float:
        return 2.0 * self.inputs * self.n

    def summary(self) -> str:
        tie = f" tied to {self.tied}" if self.tied is not None else ""
        return f"connected                            {self.inputs:4d}  ->  {self.n:4d}{tie}"
