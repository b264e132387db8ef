"""The YOLOR project's dialect of the cfg format (WongKinYiu/yolor's darknet-style cfgs).

A document is in the YOLOR dialect when it has one of the sections only YOLOR defines
(`YOLOR_SECTIONS`) or an `activation=silu` (YOLOR's name for Darknet's swish, accepted everywhere
as an alias). What the dialect changes: `[reorg]` without a `stride` key is YOLOR's Focus (see
`FocusLayer`), where Darknet's would be a stride-1 no-op.

- `[shift_channels]` from=k: `out[c, y, x] = in[c, y, x] + a[c]` with a the output of layer k
  (an `[implicit_add]`, or any layer with one value per input channel);
- `[control_channels]` from=k: `out[c, y, x] = in[c, y, x] · a[c]` (k: an `[implicit_mul]`);
- Focus (`[reorg]`, YOLOR): space-to-depth by 2, the four phases concatenated along channels in
  the order (y even, x even), (y odd, x even), (y even, x odd), (y odd, x odd).

Backward of shift: the previous delta += delta, `a`'s delta += delta summed over the positions;
of control: the previous delta += delta · a, `a`'s delta += Σ delta · in; of Focus: the inverse
permutation, added into the previous delta.
"""
from __future__ import annotations

import numpy as np

from .base import Layer, Shape, State, fmt_shape, numel, register

#: Sections only the YOLOR project's cfgs use.
YOLOR_SECTIONS = frozenset({"implicit_add", "implicit_mul", "shift_channels", "control_channels"})


def dialect(doc) -> str:
    """"yolor" for a document in the YOLOR dialect (module docstring), else "darknet"."""
    for sec in doc.layers:
        if sec.kind in YOLOR_SECTIONS:
            return "yolor"
        opt = sec.options.get("activation")
        if opt is not None and opt.value == "silu":
            return "yolor"
    return "darknet"


class _ChannelOp(Layer):
    """Shared by shift_channels / control_channels: the input with a per-channel vector applied."""

    needs_image = True
    word = ""

    def __init__(self, index: int, in_shape: Shape, ref: int, dtype=np.float32):
        super().__init__(index, in_shape, in_shape, dtype)
        self.refs = (ref,)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "_ChannelOp":
        ref = ctx.ref(sec, "from", sec.get_int("from"))
        src = ctx.layers[ref].out_shape
        if numel(src) != in_shape[0]:
            raise sec.error(f"layer {ref} outputs {numel(src)} values {tuple(src)}; {cls.kind} needs one per "
                            f"input channel ({in_shape[0]})", "from")
        return cls(sec.index, in_shape, ref, ctx.dtype)

    def _vector(self, s: State, what: str = "output") -> np.ndarray:
        return getattr(s.layers[self.refs[0]], what).reshape(self.batch, self.in_shape[0], 1, 1)

    def summary(self) -> str:
        return f"{self.word:<8} {self.refs[0]:>3}              {fmt_shape(self.in_shape)}   ->  {fmt_shape(self.out_shape)}"


@register
class ShiftChannelsLayer(_ChannelOp):
    kind = "shift_channels"
    word = "shift"

    def forward(self, s: State) -> None:
        np.add(s.input.reshape(self.output.shape), self._vector(s), out=self.output)

    def backward(self, s: State) -> None:
        if s.delta is not None:
            s.delta += self.delta.reshape(s.delta.shape)
        src = self._vector(s, "delta")
        src += self.delta.sum(axis=(2, 3), keepdims=True)


@register
class ControlChannelsLayer(_ChannelOp):
    kind = "control_channels"
    word = "control"

    def forward(self, s: State) -> None:
        np.multiply(s.input.reshape(self.output.shape), self._vector(s), out=self.output)

    def backward(self, s: State) -> None:
        x = s.input.reshape(self.output.shape)
        if s.delta is not None:
            s.delta += (self.delta * self._vector(s)).reshape(s.delta.shape)
        src = self._vector(s, "delta")
        src += (self.delta * x).sum(axis=(2, 3), keepdims=True)


class FocusLayer(Layer):
    """YOLOR's `[reorg]` (no stride): (c, h, w) -> (4c, h/2, w/2), phases (0,0), (1,0), (0,1), (1,1)
    as (dy, dx), each a block of c channels."""

    kind = "reorg"
    needs_image = True
    PHASES = ((0, 0), (1, 0), (0, 1), (1, 1))

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "FocusLayer":
        c, h, w = in_shape
        if h % 2 or w % 2:
            raise sec.error(f"YOLOR's reorg (Focus) needs an even width and height (got {w}x{h})")
        return cls(sec.index, in_shape, cls.compute(in_shape), ctx.dtype)

    @staticmethod
    def compute(in_shape: Shape) -> Shape:
        c, h, w = in_shape
        return (4 * c, h // 2, w // 2)

    def compute_out_shape(self, in_shape: Shape) -> Shape:
        return self.compute(in_shape)

    def forward(self, s: State) -> None:
        c = self.in_shape[0]
        x = s.input.reshape(self.batch, *self.in_shape)
        for q, (dy, dx) in enumerate(self.PHASES):
            self.output[:, q * c:(q + 1) * c] = x[:, :, dy::2, dx::2]

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        c = self.in_shape[0]
        d = s.delta.reshape(self.batch, *self.in_shape)
        for q, (dy, dx) in enumerate(self.PHASES):
            d[:, :, dy::2, dx::2] += self.delta[:, q * c:(q + 1) * c]

    def summary(self) -> str:
        return f"focus              /2   {fmt_shape(self.in_shape)}   ->  {fmt_shape(self.out_shape)}"
