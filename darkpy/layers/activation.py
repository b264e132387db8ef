"""`[activation]`: apply one activation function element-wise (spec §2.15, §4).

The output has the input's shape (image or flat). With the default `activation=linear` the layer is
an identity, which makes it a handy input holder (tests use it as layer 0 so the network input has a
layer output and delta of its own).
"""
from __future__ import annotations

import numpy as np

from ..kernels import activations as act
from .base import Layer, State, register


@register
class ActivationLayer(Layer):
    kind = "activation"

    def __init__(self, index: int, in_shape, activation: str = "linear", dtype=np.float32):
        super().__init__(index, in_shape, in_shape, dtype)
        self.activation = activation
        self.act = act.code(activation)
        self.x = np.zeros((0,), self.dtype)        # copy of the input, only for swish/mish/...
        self.scratch = np.zeros((0,), self.dtype)  # act' * delta before it is added to prev.delta

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "ActivationLayer":
        name = sec.get_choice("activation", act.NAMES, "linear", aliases=act.ALIASES)
        return cls(sec.index, in_shape, name, ctx.dtype)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.x = np.zeros((0,), self.dtype)         # both training-only: allocate_training
        self.scratch = np.zeros((0,), self.dtype)

    def allocate_training(self) -> None:
        super().allocate_training()
        self.scratch = self.training_buffer(self.scratch)
        if act.needs_input(self.act):
            self.x = self.training_buffer(self.x)

    def forward(self, s: State) -> None:
        src = s.input.reshape(self.output.shape)
        if self.x.size:
            np.copyto(self.x, src)
        np.copyto(self.output, src)
        act.activate_array(self.output, self.act)

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        # darknet: [activation] overwrites the previous delta with act'*delta; darkpy adds, so a
        # producer with a second consumer keeps that consumer's gradient (DESIGN §4 rule 2).
        np.copyto(self.scratch, self.delta)
        act.gradient_array(self.scratch, self.output, self.act, self.x if self.x.size else None)
        s.delta += self.scratch.reshape(s.delta.shape)

    def summary(self) -> str:
        return f"Activation Layer: {self.inputs} inputs ({self.activation})"
