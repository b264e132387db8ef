"""`[conv_lstm]` (AlexeyAB, `conv_lstm_layer.c`): an LSTM whose eight products are convolutions.

Keys: output (filters), size (3), stride (1), dilation (1), pad / padding, groups, activation (of
the inner convolutions, default linear), batch_normalize. Per step t (time-major rows, as every
darkpy sequence layer), with `W·` convolutions of the previous output h (filters → filters) and
`U·` convolutions of the input (c → filters), all with the same size/padding:
`f, i, o = σ(W h + U x)`, `g = tanh(W h + U x)`, `c' = f·c + i·g`, `h' = o·tanh(c')` — Darknet's
CPU forward without peepholes (the same recurrence as darkpy's `[lstm]`, whose code it reuses).
The output is h, (filters, h, w): the convolutions must keep the spatial size (stride 1).

Backward: back-propagation through time, the exact gradient of that forward (darkpy's `[lstm]`
machinery); Darknet's CPU backward exists for this layer, with per-step batch-norm statistics
shared like its other recurrent layers. State: as `[lstm]` (zero at each forward unless
`carry_state`). # darknet: `state_constrain` (default time_steps·32) clips the cell state to
±that value; darkpy reads it and clips nothing (a cell reaching 64 would saturate tanh anyway).

.weights order (AlexeyAB's, the only Darknet with this layer): wf, wi, wg, wo, uf, ui, ug, uo, each
a convolution block (biases, [BN], weights).

Refused with a clear error: peephole=1, bottleneck=1, xnor=1, shortcut=1, a non-tanh
`lstm_activation`, time_normalizer ≠ 1.
"""
from __future__ import annotations

import numpy as np

from .base import fmt_shape, register
from .convolutional import ConvolutionalLayer
from .gated import LSTMLayer
from .recurrent import _positive, _Recurrent

ORDER = ("wf", "wi", "wg", "wo", "uf", "ui", "ug", "uo")


@register
class ConvLSTMLayer(LSTMLayer):
    kind = "conv_lstm"
    needs_image = True
    ALEXEYAB_ORDER = ORDER

    def __init__(self, index: int, in_shape, filters: int, steps: int, size: int = 3, padding: int = 1,
                 dilation: int = 1, groups: int = 1, activation: str = "linear", batch_normalize: bool = False,
                 dtype=np.float32):
        c, h, w = in_shape
        _Recurrent.__init__(self, index, in_shape, (filters, h, w), steps, dtype)
        self.size, self.padding, self.dilation, self.groups = size, padding, dilation, groups

        def mk(c_in: int) -> ConvolutionalLayer:
            return ConvolutionalLayer(index, (c_in, h, w), filters, size, 1, 1, padding, groups, dilation,
                                      batch_normalize, activation, False, dtype)

        self.wi, self.wf, self.wo, self.wg = (self._add(k, mk(filters)) for k in ("wi", "wf", "wo", "wg"))
        self.ui, self.uf, self.uo, self.ug = (self._add(k, mk(c)) for k in ("ui", "uf", "uo", "ug"))
        z = np.zeros((0,), self.dtype)
        self.f = self.i = self.g = self.o = self.c = self.h0 = self.c0 = self.h_in = self.c_in = self.dc = z

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "ConvLSTMLayer":
        filters = _positive(sec, "output")
        size = _positive(sec, "size", 3)
        stride = sec.get_int("stride", 1)
        dilation = _positive(sec, "dilation", 1)
        padding = sec.get_int("padding", 0)
        if sec.get_bool("pad", False):
            padding = size // 2
        groups = _positive(sec, "groups", 1)
        from ..kernels import activations as act
        activation = sec.get_choice("activation", act.NAMES, "linear", aliases=act.ALIASES)
        bn = sec.get_bool("batch_normalize", False)
        for key in ("peephole", "bottleneck", "xnor", "shortcut"):
            if sec.get_int(key, 0):
                raise sec.error(f"{key}=1 in [conv_lstm] is not supported by darkpy", key)
        if sec.get_str("lstm_activation", "tanh") != "tanh":
            raise sec.error("only lstm_activation=tanh (Darknet's CPU path) is supported", "lstm_activation")
        if sec.get_float("time_normalizer", 1.0) != 1.0:
            raise sec.error("time_normalizer other than 1 is not supported by darkpy", "time_normalizer")
        sec.get_int("state_constrain", ctx.net.time_steps * 32)      # darknet: clips c; see docstring
        if stride != 1:
            raise sec.error(f"[conv_lstm] needs stride=1 (the state keeps the input's size; got {stride})",
                            "stride")
        c, h, w = in_shape
        if c % groups or filters % groups:
            raise sec.error(f"groups={groups} must divide the input channels ({c}) and output ({filters})",
                            "groups")
        layer = cls(sec.index, in_shape, filters, ctx.net.time_steps, size, padding, dilation, groups,
                    activation, bn, ctx.dtype)
        if layer.wf.layer.out_shape != layer.out_shape:
            raise sec.error(f"the convolutions must keep the {w}x{h} size (size={size}, padding={padding}, "
                            f"dilation={dilation} give {layer.wf.layer.out_shape[2]}x"
                            f"{layer.wf.layer.out_shape[1]}); use pad=1", "size")
        return layer

    def weight_arrays(self) -> list[np.ndarray]:
        return self.alexeyab_weight_arrays()       # AlexeyAB's order: the only one there is

    def summary(self) -> str:
        return (f"conv_lstm {self.out_shape[0]:5d} {self.size:2d} x{self.size:2d} /1  {fmt_shape(self.in_shape)}"
                f"   ->  {fmt_shape(self.out_shape)}")

