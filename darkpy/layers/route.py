"""`[route]`: concatenate earlier layers' outputs (spec §2.16, §1.4, §12).

`layers=` lists the sources (negative = relative to this layer). The output of each item is the
concatenation, in list order, of the sources' flat outputs. When every source is an image of the
same width and height the output is that image with the channels stacked; otherwise it is a flat
vector, as in Darknet (a following layer that needs an image then says so; route warns at build
time, naming the shapes, so that message has a cause).

AlexeyAB's `groups`/`group_id` take, from each source, the `group_id`-th of `groups` equal
contiguous chunks of its flat output (for an image: a block of whole channels).

Backward ADDS each slice of this layer's delta into its source's delta: a source read by several
layers receives the sum of all their gradients.

In inference with shared outputs (`Network.share_outputs`, darkpy/outputs_plan.py) a part may be
written in place: its source's output is then a view of that part of this layer's output (or this
layer's output a view of its one source's), and the forward copies only the other parts.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ..kernels import PARALLEL_MIN, jit, pjit, simd
from .base import Layer, Shape, State, fmt_shape, is_image, numel, register

#: Values per task of `copy_parts`. A copy is bound by memory, but by one core's share of it: on
#: the 2-core AVX-512 Xeon VM a 2.8 MB copy took 187 µs with numpy's copyto (one thread) and 75 µs
#: split between two; yolov4-tiny's routes at b1, within its forward, 0.49 -> 0.29 ms (two
#: 104x104x64 maps), 0.19 -> 0.12 and 0.20 -> 0.11 ms, its eleven 1.4 -> 0.9 ms.
SPAN = 1 << 14
#: A route of at least `simd.STREAM_MIN_BYTES` copies its parts past the caches (`stream_parts`),
#: where both are C-contiguous. yolov4-tiny's 128-channel route on 104x104 at b64 (354 MB from two
#: 64-channel parts), the copy alone after the caches were filled with other data, alternating in
#: one process (2 threads, 2-core Zen 5, medians of 8): 16.9 -> 13.0 ms; a pass reading the route
#: next 18.4 and 18.3 ms.
STREAM = True


@jit(inline="always")
def _part(dst, src, t, spans, add):
    """Task t of `copy_parts`: one span of one item's row."""
    b, lo = t // spans, (t % spans) * SPAN
    d, x = dst[b, lo:lo + SPAN], src[b, lo:lo + SPAN]
    if add:
        for i in range(d.shape[0]):
            d[i] += x[i]
    else:
        for i in range(d.shape[0]):
            d[i] = x[i]


@pjit
def copy_parts(dst, src, add):
    """dst (B, n) := src (B, n), or += with `add` (rows of both may be strided), in tasks of SPAN
    values, in parallel from PARALLEL_MIN values."""
    spans = -(-dst.shape[1] // SPAN)
    if dst.size < PARALLEL_MIN:
        for t in range(dst.shape[0] * spans):
            _part(dst, src, t, spans, add)
    else:
        for t in prange(dst.shape[0] * spans):
            _part(dst, src, t, spans, add)


@pjit
def stream_parts(dst, d0, src, s0, n):
    """dst[:, d0:d0+n] := src[:, s0:s0+n], dst (B, ·) and src (B, ·) C-contiguous, each task's
    span (SPAN values of one item's row) stored past the caches (`simd.store_stream`) from its
    first aligned vector: for routes of at least `simd.STREAM_MIN_BYTES`."""
    spans = -(-n // SPAN)
    out, x = simd.flat(dst), simd.flat(src)
    L = simd.LANES
    for t in prange(dst.shape[0] * spans):
        b, lo = t // spans, (t % spans) * SPAN
        d, s, m = b * dst.shape[1] + d0 + lo, b * src.shape[1] + s0 + lo, min(SPAN, n - lo)
        j = 0
        while j < m and not simd.aligned(out, d + j):
            out[d + j] = x[s + j]
            j += 1
        while j + L <= m:
            simd.store_stream(out, d + j, simd.load(x, s + j))
            j += L
        for i in range(j, m):
            out[d + i] = x[s + i]
        simd.store_fence()


def shape_text(shape: Shape) -> str:
    """A shape as users read it in Darknet's tables: `WxHxC`, or `N (flat)`."""
    if len(shape) == 3:
        c, h, w = shape
        return f"{w}x{h}x{c}"
    return f"{numel(shape)} (flat)"


@register
class RouteLayer(Layer):
    kind = "route"

    def __init__(self, index: int, in_shape: Shape, refs, sources: list[Layer], groups: int = 1,
                 group_id: int = 0, dtype=np.float32):
        self.refs = tuple(refs)
        self.sources = list(sources)    # the Layer objects, for their shapes at resize time
        self.groups = groups
        self.group_id = group_id
        self.parts: list[int] = []      # values taken from each source, per item
        self.in_place: list[bool] = []  # parts the source writes straight into the output
        super().__init__(index, in_shape, self._route_shape(), dtype)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "RouteLayer":
        refs = [ctx.ref(sec, "layers", v) for v in sec.get_int_list("layers")]
        groups = sec.get_int("groups", 1)
        group_id = sec.get_int("group_id", 0)
        if groups < 1:
            raise sec.error(f"must be >= 1 (got {groups})", "groups")
        if not 0 <= group_id < groups:
            raise sec.error(f"must be in 0..{groups - 1} (got {group_id})", "group_id")
        sources = [ctx.layers[i] for i in refs]
        for i, src in zip(refs, sources):
            per = src.out_shape[0] if is_image(src.out_shape) else src.outputs
            if per % groups:
                what = "channels" if is_image(src.out_shape) else "values"
                raise sec.error(f"layer {i} has {per} {what}, not divisible by groups={groups}", "groups")
        layer = cls(sec.index, in_shape, refs, sources, groups, group_id, ctx.dtype)
        if not is_image(layer.out_shape) and any(is_image(s.out_shape) for s in sources):
            shapes = ", ".join(f"layer {i} is {shape_text(s.out_shape)}" for i, s in zip(refs, sources))
            sec.warn(f"inputs have different sizes ({shapes}); the output is a flat vector of "
                     f"{layer.outputs} values, as in darknet, so no later layer can treat it as an image",
                     "layers")
        return layer

    def _route_shape(self) -> Shape:
        """The output shape from the sources' current shapes (also fills `self.parts`)."""
        shapes = [s.out_shape for s in self.sources]
        self.parts = [numel(sh) // self.groups for sh in shapes]
        first = shapes[0]
        if all(is_image(sh) and sh[1:] == first[1:] for sh in shapes):
            return (sum(sh[0] for sh in shapes) // self.groups, first[1], first[2])
        return (sum(self.parts),)

    def resize(self, in_shape: Shape) -> None:
        """Sources come earlier, so they already have their new shapes: recompute from them."""
        self.in_shape = tuple(in_shape)
        self.out_shape = self._route_shape()

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.in_place = [False] * len(self.refs)

    def source_parts(self) -> list[tuple[int, int, int]]:
        """(source layer, first value, values) of each part of an item's output, in order."""
        return [(i, part * self.group_id, part) for i, part in zip(self.refs, self.parts)]

    def forward(self, s: State) -> None:
        out = self.output.reshape(self.batch, -1)
        offset = 0
        for (i, start, part), in_place in zip(self.source_parts(), self.in_place):
            if not in_place:
                src = s.layers[i].output.reshape(self.batch, -1)
                if (STREAM and out.nbytes >= simd.STREAM_MIN_BYTES and src.flags.c_contiguous
                        and out.flags.c_contiguous):
                    stream_parts(out, offset, src, start, part)
                else:
                    copy_parts(out[:, offset:offset + part], src[:, start:start + part], False)
            offset += part

    def backward(self, s: State) -> None:
        delta = self.delta.reshape(self.batch, -1)
        offset = 0
        for i, part in zip(self.refs, self.parts):
            dst = s.layers[i].delta.reshape(self.batch, -1)
            start = part * self.group_id
            copy_parts(dst[:, start:start + part], delta[:, offset:offset + part], True)
            offset += part

    def summary(self) -> str:
        line = "route " + "".join(f" {i}" for i in self.refs)
        if self.groups > 1:     # AlexeyAB's form: group_id/groups and the output shape
            line += f"   {self.group_id}/{self.groups} -> {fmt_shape(self.out_shape)}"
        return line
