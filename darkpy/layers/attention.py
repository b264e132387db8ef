"""AlexeyAB's attention layers (spec §14.1): `[sam]` and `[scale_channels]`.

`[sam]` (spatial attention, YOLOv4): `out = act(prev * from)`, element-wise; `from` and the previous
layer must have the same shape. Backward: `d = delta * act'`; `prev.delta += d * from`,
`from.delta += d * prev`.

`[scale_channels]` (squeeze-and-excitation): the previous layer is a 1x1xC vector (or flat C) and
scales each channel of the `from` map: `out[k, y, x] = act(prev[k] * from[k, y, x])`. With
`scale_wh=1` the previous layer is a WxHx1 map that scales every channel at each pixel instead:
`out[k, y, x] = act(prev[y, x] * from[k, y, x])`. The output has `from`'s shape. Backward: `prev.delta`
gets the sum of `d * from` over what it scaled, `from.delta += d * prev`.

Both take `activation` (default linear); swish/mish/hard_mish/gelu keep a pre-activation copy.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ..kernels import activations as act
from ..kernels import pjit
from .base import Layer, Shape, State, fmt_shape, is_image, numel, register
from .route import shape_text
from .shortcut import ActivationBuffers


# -- kernels -------------------------------------------------------------------------------------
@pjit
def sam_backward(prev_delta, from_delta, d, prev, frm):
    """All (B, n): prev_delta += d * frm; from_delta += d * prev. The two deltas may be one array
    (from=-1), so each element's two adds stay on one thread."""
    B, n = d.shape
    for b in prange(B):
        for i in range(n):
            g = d[b, i]
            prev_delta[b, i] += g * frm[b, i]
            from_delta[b, i] += g * prev[b, i]


@pjit
def scale_forward(out, scale, frm, per_pixel):
    """out, frm: (B, C, N); scale: (B, C) per channel, or (B, N) per pixel when per_pixel.
    out[b, k, p] = scale[b, k or p] * frm[b, k, p]."""
    B, C, N = out.shape
    for b in prange(B):
        for k in range(C):
            for p in range(N):
                out[b, k, p] = (scale[b, p] if per_pixel else scale[b, k]) * frm[b, k, p]


@pjit
def scale_backward(scale_delta, from_delta, d, scale, frm, per_pixel):
    """d, frm, from_delta: (B, C, N); scale, scale_delta: (B, C) or (B, N) as in `scale_forward`.
    scale_delta += sum of d * frm over what each scale multiplied; from_delta += d * scale."""
    B, C, N = d.shape
    for b in prange(B):
        for k in range(C):
            if per_pixel:
                for p in range(N):
                    scale_delta[b, p] += d[b, k, p] * frm[b, k, p]
                    from_delta[b, k, p] += d[b, k, p] * scale[b, p]
            else:
                acc = 0.0 * d[b, k, 0]
                for p in range(N):
                    acc += d[b, k, p] * frm[b, k, p]
                    from_delta[b, k, p] += d[b, k, p] * scale[b, k]
                scale_delta[b, k] += acc


class _Gate(ActivationBuffers, Layer):
    """Shared parts: one `from` reference, an activation, and the delta * act' step."""

    def __init__(self, index: int, in_shape: Shape, ref: int, source: Layer, activation: str,
                 dtype=np.float32):
        self.refs = (ref,)
        self.source = source             # the Layer object, for its shape at resize time
        self.activation = activation
        self.act = act.code(activation)
        super().__init__(index, in_shape, self.compute_out_shape(in_shape), dtype)
        self.x = np.zeros((0,), self.dtype)
        self.scratch = np.zeros((0,), self.dtype)

    @staticmethod
    def read(sec, ctx) -> tuple[int, str]:
        ref = ctx.ref(sec, "from", sec.get_int("from"))
        return ref, sec.get_choice("activation", act.NAMES, "linear", aliases=act.ALIASES)

    def compute_out_shape(self, in_shape: Shape) -> Shape:
        return tuple(self.source.out_shape)

    def resize(self, in_shape: Shape) -> None:
        why = self.mismatch(tuple(in_shape), self.source.out_shape)
        if why:
            raise self.error(why, "from")
        super().resize(in_shape)

    def mismatch(self, prev: Shape, frm: Shape) -> str | None:
        raise NotImplementedError

    def activate(self) -> None:
        if self.x.size:
            np.copyto(self.x, self.output)
        act.activate_array(self.output, self.act)

    def gated_delta(self) -> np.ndarray:
        """delta * act'(output), in a scratch buffer (delta itself for linear)."""
        if not self.scratch.size:
            return self.delta
        np.copyto(self.scratch, self.delta)
        act.gradient_array(self.scratch, self.output, self.act, self.x if self.x.size else None)
        return self.scratch

    def summary(self) -> str:
        return f"{self.kind:<15}{self.refs[0]:>4}   {fmt_shape(self.in_shape)}   ->  {fmt_shape(self.out_shape)}"


@register
class SamLayer(_Gate):
    kind = "sam"

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "SamLayer":
        ref, activation = cls.read(sec, ctx)
        src = ctx.layers[ref]
        layer = cls(sec.index, in_shape, ref, src, activation, ctx.dtype)
        why = layer.mismatch(tuple(in_shape), src.out_shape)
        if why:
            raise sec.error(why, "from")
        return layer

    def mismatch(self, prev: Shape, frm: Shape) -> str | None:
        if tuple(prev) != tuple(frm):
            return (f"sam needs equal shapes: layer {self.refs[0]} output {shape_text(frm)} vs "
                    f"layer {self.index - 1} output {shape_text(prev)}")
        return None

    def forward(self, s: State) -> None:
        frm = s.layers[self.refs[0]].output
        np.multiply(s.input.reshape(self.output.shape), frm.reshape(self.output.shape), out=self.output)
        self.activate()

    def backward(self, s: State) -> None:
        d = self.gated_delta().reshape(self.batch, -1)
        src = s.layers[self.refs[0]]
        # darknet: AlexeyAB overwrites from.delta here; darkpy adds (DESIGN §4 rule 2)
        sam_backward(s.delta.reshape(self.batch, -1), src.delta.reshape(self.batch, -1), d,
                     s.input.reshape(self.batch, -1), src.output.reshape(self.batch, -1))


@register
class ScaleChannelsLayer(_Gate):
    kind = "scale_channels"

    def __init__(self, index: int, in_shape: Shape, ref: int, source: Layer, activation: str = "linear",
                 scale_wh: bool = False, dtype=np.float32):
        self.scale_wh = scale_wh
        super().__init__(index, in_shape, ref, source, activation, dtype)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "ScaleChannelsLayer":
        ref, activation = cls.read(sec, ctx)
        scale_wh = sec.get_bool("scale_wh", False)
        src = ctx.layers[ref]
        layer = cls(sec.index, in_shape, ref, src, activation, scale_wh, ctx.dtype)
        why = layer.mismatch(tuple(in_shape), src.out_shape)
        if why:
            raise sec.error(why, "from")
        return layer

    def mismatch(self, prev: Shape, frm: Shape) -> str | None:
        where = (f"layer {self.index - 1} output {shape_text(prev)}, layer {self.refs[0]} output "
                 f"{shape_text(frm)}")
        if not is_image(frm):
            return f"scale_channels needs an image from its `from` layer ({where})"
        c, h, w = frm
        if self.scale_wh:
            if numel(prev) != h * w or (is_image(prev) and prev[0] != 1):
                return f"scale_wh=1 needs a {w}x{h}x1 previous layer ({where})"
        elif numel(prev) != c or (is_image(prev) and prev[1:] != (1, 1)):
            return f"scale_channels needs a 1x1x{c} previous layer ({where})"
        return None

    def _views(self, scale: np.ndarray, frm: np.ndarray):
        c, h, w = self.out_shape
        return scale.reshape(self.batch, -1), frm.reshape(self.batch, c, h * w)

    def forward(self, s: State) -> None:
        scale, frm = self._views(s.input, s.layers[self.refs[0]].output)
        c, h, w = self.out_shape
        scale_forward(self.output.reshape(self.batch, c, h * w), scale, frm, self.scale_wh)
        self.activate()

    def backward(self, s: State) -> None:
        c, h, w = self.out_shape
        d = self.gated_delta().reshape(self.batch, c, h * w)
        src = s.layers[self.refs[0]]
        scale, frm = self._views(s.input, src.output)
        scale_delta, from_delta = self._views(s.delta, src.delta)
        scale_backward(scale_delta, from_delta, d, scale, frm, self.scale_wh)
