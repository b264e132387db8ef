"""`[reorg]` (Darknet's own permutation) and AlexeyAB's `[reorg3d]` (true space-to-depth)
(spec §2.19, §14.1).

`[reorg]` keys: `stride` s, `reverse`, `flatten`, `extra`. With input dims (w, h, c), oc = c/s² and
for every input-dims position (k, j, i):
    in  = i + w*(j + h*k)
    out = w2 + w*s*(h2 + h*s*c2),  c2 = k % oc, off = k / oc, w2 = i*s + off % s, h2 = j*s + off / s.
The normal forward does `y[in] = x[out]` and declares (c*s², h/s, w/s); `reverse` does `y[out] = x[in]`
and declares (c/s², h*s, w*s). This is NOT a standard space-to-depth (the declared shape is a
reinterpretation of the flat buffer); YOLOv2's weights were trained with it, so it is kept exactly.
`flatten` transposes each item CHW -> HWC (`reverse`: HWC -> CHW) and declares the stride shape;
`extra` = n copies the input into a flat vector of inputs + n values (the tail is 0); it cannot be
combined with flatten. `extra` takes precedence over `reverse`, as in Darknet's forward.

`[reorg3d]` keys: `stride`, `reverse`. Space-to-depth in TensorFlow channel order: output channel
`(dy*s + dx)*c + c_in` of (c*s², h/s, w/s); `reverse` is its exact inverse (depth-to-space).

Sizes must divide by the stride (and channels by s² where they are split); Darknet silently reads
out of range there. Backward is the inverse permutation and ADDS into the previous delta.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ..kernels import pjit
from .base import Layer, Shape, State, fmt_shape, numel, register


# -- kernels -------------------------------------------------------------------------------------
@pjit
def reorg_permute(dst, src, w, h, c, s, to_out, add):
    """dst, src: (B, c*h*w), each item flat. Darknet's reorg index pair (in, out) for input dims
    (w, h, c) and stride s (module docstring). to_out: dst[out] = src[in], else dst[in] = src[out];
    add: += instead of =. The mapping is a permutation, so (item, channel) pairs run in parallel."""
    B = dst.shape[0]
    oc = c // (s * s)
    for bk in prange(B * c):
        b = bk // c
        k = bk % c
        c2 = k % oc
        off = k // oc
        for j in range(h):
            h2 = j * s + off // s
            for i in range(w):
                ii = i + w * (j + h * k)
                oo = i * s + off % s + w * s * (h2 + h * s * c2)
                if to_out:
                    if add:
                        dst[b, oo] += src[b, ii]
                    else:
                        dst[b, oo] = src[b, ii]
                elif add:
                    dst[b, ii] += src[b, oo]
                else:
                    dst[b, ii] = src[b, oo]


def _blocks(a: np.ndarray, c: int, h: int, w: int, s: int) -> np.ndarray:
    """View (B, c, h, w) data as (B, c, h/s, s, w/s, s): [b, c, y, dy, x, dx]."""
    return a.reshape(a.shape[0], c, h // s, s, w // s, s)


def _depth(a: np.ndarray, c: int, h: int, w: int, s: int) -> np.ndarray:
    """View (B, c*s², h/s, w/s) data as (B, s, s, c, h/s, w/s): [b, dy, dx, c, y, x]."""
    return a.reshape(a.shape[0], s, s, c, h // s, w // s)


_TO_DEPTH = (0, 3, 5, 1, 2, 4)     # [b, c, y, dy, x, dx] -> [b, dy, dx, c, y, x]
_FROM_DEPTH = (0, 3, 4, 1, 5, 2)   # [b, dy, dx, c, y, x] -> [b, c, y, dy, x, dx]


class _ReorgBase(Layer):
    needs_image = True

    def __init__(self, index: int, in_shape: Shape, stride: int, reverse: bool, dtype=np.float32):
        self.stride = stride
        self.reverse = reverse
        super().__init__(index, in_shape, self.compute_out_shape(in_shape), dtype)

    def compute_out_shape(self, in_shape: Shape) -> Shape:
        c, h, w = in_shape
        s = self.stride
        if self.reverse:
            return (c // (s * s), h * s, w * s)
        return (c * s * s, h // s, w // s)

    def check(self, in_shape: Shape) -> str | None:
        """Why this input cannot be reorganised, or None."""
        c, h, w = in_shape
        s = self.stride
        if self.reverse and c % (s * s):
            return f"reverse needs channels divisible by stride²={s * s} (input {w}x{h}x{c})"
        if not self.reverse and (h % s or w % s):
            return f"input {w}x{h}x{c} is not divisible by stride {s}"
        return None

    def resize(self, in_shape: Shape) -> None:
        why = self.check(tuple(in_shape))
        if why:
            raise self.error(f"cannot resize: {why}")
        super().resize(in_shape)

    def summary(self) -> str:
        return f"{self.kind:<19}/{self.stride:2d}  {fmt_shape(self.in_shape)}   ->  {fmt_shape(self.out_shape)}"


@register
class ReorgLayer(_ReorgBase):
    kind = "reorg"

    def __init__(self, index: int, in_shape: Shape, stride: int = 1, reverse: bool = False,
                 flatten: bool = False, extra: int = 0, dtype=np.float32):
        self.flatten = flatten
        self.extra = extra
        super().__init__(index, in_shape, stride, reverse, dtype)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "ReorgLayer":
        if not sec.has("stride") and getattr(ctx, "dialect", "darknet") == "yolor":
            from .yolor import FocusLayer      # YOLOR's [reorg] (layers/yolor.py)
            return FocusLayer.from_cfg(sec, in_shape, ctx)
        stride = sec.get_int("stride", 1)
        reverse = sec.get_bool("reverse", False)
        flatten = sec.get_bool("flatten", False)
        extra = sec.get_int("extra", 0)
        if stride < 1:
            raise sec.error(f"must be >= 1 (got {stride})", "stride")
        if extra < 0:
            raise sec.error(f"must be >= 0 (got {extra})", "extra")
        if extra and flatten:
            raise sec.error("flatten=1 and extra cannot be combined (darknet's buffers overrun)", "extra")
        layer = cls(sec.index, in_shape, stride, reverse, flatten, extra, ctx.dtype)
        why = layer.check(tuple(in_shape))
        if why:
            raise sec.error(why, "stride")
        return layer

    def compute_out_shape(self, in_shape: Shape) -> Shape:
        if self.extra:
            return (numel(in_shape) + self.extra,)
        return super().compute_out_shape(in_shape)

    def check(self, in_shape: Shape) -> str | None:
        if self.flatten or self.extra:
            if self.flatten and numel(self.compute_out_shape(in_shape)) != numel(in_shape):
                c, h, w = in_shape
                return f"flatten with stride {self.stride} needs a size that divides (input {w}x{h}x{c})"
            return None
        c, h, w = in_shape
        s = self.stride
        if c % (s * s):     # both directions split the channels into s² groups
            return f"channels must be divisible by stride²={s * s} (input {w}x{h}x{c})"
        return super().check(in_shape)

    def forward(self, s: State) -> None:
        c, h, w = self.in_shape
        x = s.input.reshape(self.batch, -1)
        out = self.output.reshape(self.batch, -1)
        if self.flatten:
            if self.reverse:      # HWC -> CHW
                np.copyto(out.reshape(self.batch, c, h * w), x.reshape(self.batch, h * w, c).transpose(0, 2, 1))
            else:                 # CHW -> HWC
                np.copyto(out.reshape(self.batch, h * w, c), x.reshape(self.batch, c, h * w).transpose(0, 2, 1))
        elif self.extra:
            np.copyto(out[:, :x.shape[1]], x)
            out[:, x.shape[1]:] = 0
        else:
            reorg_permute(out, x, w, h, c, self.stride, self.reverse, False)

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        # darknet: every mode overwrites prev.delta, and `extra` with reverse=1 runs the reverse
        # permutation instead of the copy; darkpy adds the inverse of what forward did.
        c, h, w = self.in_shape
        dx = s.delta.reshape(self.batch, -1)
        d = self.delta.reshape(self.batch, -1)
        if self.flatten:
            if self.reverse:
                dx.reshape(self.batch, h * w, c)[...] += d.reshape(self.batch, c, h * w).transpose(0, 2, 1)
            else:
                dx.reshape(self.batch, c, h * w)[...] += d.reshape(self.batch, h * w, c).transpose(0, 2, 1)
        elif self.extra:
            dx += d[:, :dx.shape[1]]
        else:
            reorg_permute(dx, d, w, h, c, self.stride, not self.reverse, True)

    def summary(self) -> str:
        if self.extra:
            return f"reorg              {self.inputs:4d}   ->  {self.outputs:4d}"
        return super().summary()


@register
class Reorg3dLayer(_ReorgBase):
    kind = "reorg3d"

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "Reorg3dLayer":
        stride = sec.get_int("stride", 1)
        reverse = sec.get_bool("reverse", False)
        if stride < 1:
            raise sec.error(f"must be >= 1 (got {stride})", "stride")
        layer = cls(sec.index, in_shape, stride, reverse, ctx.dtype)
        why = layer.check(tuple(in_shape))
        if why:
            raise sec.error(why, "stride")
        return layer

    def forward(self, s: State) -> None:
        # darknet: AlexeyAB's reverse=1 indexes with the output sizes and is not the inverse of its
        # forward; darkpy's reverse is the exact depth-to-space inverse.
        if self.reverse:
            c, h, w = self.out_shape
            np.copyto(_blocks(self.output, c, h, w, self.stride),
                      _depth(s.input, c, h, w, self.stride).transpose(_FROM_DEPTH))
        else:
            c, h, w = self.in_shape
            np.copyto(_depth(self.output, c, h, w, self.stride),
                      _blocks(s.input, c, h, w, self.stride).transpose(_TO_DEPTH))

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        if self.reverse:
            c, h, w = self.out_shape
            _depth(s.delta, c, h, w, self.stride)[...] += \
                _blocks(self.delta, c, h, w, self.stride).transpose(_TO_DEPTH)
        else:
            c, h, w = self.in_shape
            _blocks(s.delta, c, h, w, self.stride)[...] += \
                _depth(self.delta, c, h, w, self.stride).transpose(_FROM_DEPTH)
