"""`[upsample]`: nearest-neighbour upsampling, or sum-pooling downsampling (spec §2.18, §12).

`stride` s > 0: output (c, h*s, w*s), `out[y][x] = scale * in[y/s][x/s]`; backward adds `scale *`
the sum of each s x s block of delta into the input's delta.

`stride` -s < 0: output (c, h/s, w/s), each value `scale * SUM` of its s x s block (a sum, not a
mean). When h or w is not a multiple of s, Darknet reads each item's input as if it were a
contiguous (c, (h/s)*s, (w/s)*s) array, i.e. rows of the shortened length run on into the next row
(golden `forward/upsample` layer 4); darkpy reproduces that reading.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ..kernels import PARALLEL_MIN, jit, pjit
from .base import Layer, Shape, State, fmt_shape, register


# -- kernels -------------------------------------------------------------------------------------
@jit(inline="always")
def _upsample_plane(out, x, bc, s, scale):
    """Plane bc = b·C + c of `upsample_forward`: each input row's first output row, then copies
    of it; at stride 2 (yolo necks) the pairs written out, a loop the compiler vectorises. Against
    a loop over dx for every output row: shapes-tiny's 32 x 8x8 -> 16x16 at b1 alone (2-core
    AVX-512 Xeon, min of 30 calls) 6.3 -> 3.0 µs."""
    _, C, H, W = x.shape
    b = bc // C
    c = bc % C
    for y in range(H):
        src = x[b, c, y]
        row = out[b, c, y * s]
        if s == 2:
            for i in range(W):
                v = scale * src[i]
                row[2 * i] = v
                row[2 * i + 1] = v
        else:
            for i in range(W):
                v = scale * src[i]
                for dx in range(s):
                    row[i * s + dx] = v
        for dy in range(1, s):
            dst = out[b, c, y * s + dy]
            for j in range(W * s):
                dst[j] = row[j]


@pjit
def upsample_forward(out, x, s, scale):
    """out: (B, C, H*s, W*s); x: (B, C, H, W). out[y, x] = scale * x[y // s, x // s]. Parallel over
    (item, channel) planes, serial below PARALLEL_MIN output values."""
    B, C = x.shape[:2]
    if out.size < PARALLEL_MIN:
        for bc in range(B * C):
            _upsample_plane(out, x, bc, s, scale)
    else:
        for bc in prange(B * C):
            _upsample_plane(out, x, bc, s, scale)


@pjit
def upsample_backward(prev_delta, delta, s, scale):
    """prev_delta: (B, C, H, W); delta: (B, C, H*s, W*s). prev_delta[y, x] += scale * the sum of
    delta over the s x s block that (y, x) was copied to. Serial below PARALLEL_MIN values."""
    B, C = prev_delta.shape[:2]
    if delta.size < PARALLEL_MIN:
        for bc in range(B * C):
            _upsample_backward_plane(prev_delta, delta, s, scale, bc)
    else:
        for bc in prange(B * C):
            _upsample_backward_plane(prev_delta, delta, s, scale, bc)


@jit(inline="always")
def _upsample_backward_plane(prev_delta, delta, s, scale, bc):
    C, H, W = prev_delta.shape[1:]
    b = bc // C
    c = bc % C
    for y in range(H):
        for i in range(W):
            acc = 0.0 * scale
            for dy in range(s):
                for dx in range(s):
                    acc += delta[b, c, y * s + dy, i * s + dx]
            prev_delta[b, c, y, i] += scale * acc


@pjit
def downsample_forward(out, x, s, scale):
    """out: (B, C, OH, OW); x: (B, n) each item's flat input, n >= C*(OH*s)*(OW*s), read as a
    (C, OH*s, OW*s) array (Darknet's reading, see the module docstring).
    out[y, x] = sum over the s x s block of scale * in, in row-major block order."""
    B, C, OH, OW = out.shape
    rw = OW * s
    plane = OH * s * rw
    for bc in prange(B * C):
        b = bc // C
        c = bc % C
        base = c * plane
        for y in range(OH):
            for i in range(OW):
                acc = 0.0 * scale
                for dy in range(s):
                    row = base + (y * s + dy) * rw + i * s
                    for dx in range(s):
                        acc += scale * x[b, row + dx]
                out[b, c, y, i] = acc


@pjit
def downsample_backward(prev_delta, delta, s, scale):
    """prev_delta: (B, n) flat per item, addressed as in `downsample_forward`; delta: (B, C, OH, OW).
    Every input of a block gets scale * that block's delta added."""
    B, C, OH, OW = delta.shape
    rw = OW * s
    plane = OH * s * rw
    for bc in prange(B * C):
        b = bc // C
        c = bc % C
        base = c * plane
        for y in range(OH):
            for i in range(OW):
                g = scale * delta[b, c, y, i]
                for dy in range(s):
                    row = base + (y * s + dy) * rw + i * s
                    for dx in range(s):
                        prev_delta[b, row + dx] += g


@register
class UpsampleLayer(Layer):
    kind = "upsample"
    needs_image = True

    def __init__(self, index: int, in_shape: Shape, stride: int = 2, scale: float = 1.0, dtype=np.float32):
        self.stride = stride
        self.scale = scale
        super().__init__(index, in_shape, self.compute_out_shape(in_shape), dtype)

    @property
    def reverse(self) -> bool:
        """True for a negative stride (downsampling)."""
        return self.stride < 0

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "UpsampleLayer":
        stride = sec.get_int("stride", 2)
        scale = sec.get_float("scale", 1.0)
        if stride == 0:
            raise sec.error("must not be 0 (positive: upsample by stride; negative: downsample)", "stride")
        layer = cls(sec.index, in_shape, stride, scale, ctx.dtype)
        if min(layer.out_shape) < 1:
            raise sec.error(f"input {in_shape[2]}x{in_shape[1]} is smaller than the downsampling factor "
                            f"{-stride}", "stride")
        return layer

    def compute_out_shape(self, in_shape: Shape) -> Shape:
        c, h, w = in_shape
        if self.stride < 0:
            return (c, h // -self.stride, w // -self.stride)
        return (c, h * self.stride, w * self.stride)

    def resize(self, in_shape: Shape) -> None:
        super().resize(in_shape)
        if min(self.out_shape) < 1:
            raise self.error(f"input {in_shape} is too small to downsample by {-self.stride}")

    def forward(self, s: State) -> None:
        if self.reverse:
            # darknet: item b starts at b*C*(OH*s)*(OW*s) in Darknet's reading, so on non-divisible sizes
            # with batch > 1 its later items read their neighbours' values; darkpy starts each item at
            # its own first value (identical for batch 1 and for divisible sizes).
            downsample_forward(self.output, s.input.reshape(self.batch, -1), -self.stride, self.scale)
        else:
            upsample_forward(self.output, s.input.reshape(self.batch, *self.in_shape), self.stride, self.scale)

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        if self.reverse:
            # darknet: the downsampling backward overwrites prev.delta; darkpy adds (DESIGN §4 rule 2)
            downsample_backward(s.delta.reshape(self.batch, -1), self.delta, -self.stride, self.scale)
        else:
            upsample_backward(s.delta.reshape(self.batch, *self.in_shape), self.delta, self.stride, self.scale)

    def summary(self) -> str:
        name = "downsample" if self.reverse else "upsample"
        return f"{name:<19}{abs(self.stride):2d}x  {fmt_shape(self.in_shape)}   ->  {fmt_shape(self.out_shape)}"
