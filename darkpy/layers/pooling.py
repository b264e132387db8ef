"""Pooling: `[maxpool]`/`[max]`, `[avgpool]`/`[avg]` (global) and `[local_avgpool]`/`[local_avg]`
(spec §2.6, §2.7; local_avgpool is AlexeyAB's).

Window geometry, shared by maxpool and local_avgpool:
- `padding` is the TOTAL padding over both sides (default `size-1`), so
  `out = (in + padding - size) // stride + 1` per axis;
- the first window starts at `-(padding // 2)`: Darknet computes `-padding/2` in C, which truncates
  toward zero, so for odd padding the extra row/column falls on the bottom/right;
- positions outside the image never win a max (Darknet uses -FLT_MAX there) and are left out of an
  average (AlexeyAB divides by the number of in-image positions, like cuDNN's "exclude padding");
  a window with no in-image position at all (possible when padding/2 >= size) outputs -FLT_MAX (max) or 0 (mean)
  and passes no gradient.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ..kernels import PARALLEL_MIN, jit, pjit
from .base import Layer, State, fmt_shape, register


# -- kernels -------------------------------------------------------------------------------------
#: Darknet's value for a window with no in-image position (-FLT_MAX); such an output gets no gradient.
EMPTY = -3.4028234663852886e38
#: `maxpool_forward`'s idx argument when it records no argmax
_NO_INDEXES = np.zeros((1, 1, 1, 1), np.int32)


@jit
def _max_window(xp, y0, y1, x0, x1):
    """The max of xp (H, W) over rows y0..y1-1 and columns x0..x1-1 (a non-empty in-image range),
    scanned in row-major order with ties keeping the first, and its flat index y·W + x."""
    W = xp.shape[1]
    best = xp[y0, x0]
    bi = y0 * W + x0
    for y in range(y0, y1):
        for xx in range(x0, x1):
            v = xp[y, xx]
            if v > best:
                best = v
                bi = y * W + xx
    return best, bi


@jit
def _max_2x2(x, ya, yb, xs, ia, ib):
    """The max of x[ya, xs], x[ya, xs+1], x[yb, xs], x[yb, xs+1] (ties keep the first) and its
    flat index: ia + xs, ia + xs + 1, ib + xs or ib + xs + 1 (ia, ib: the flat index of x[ya, 0],
    x[yb, 0]). Rows by index into the C-contiguous x, not as row views: see `maxpool_2x2_rows`.
    Straight-line code, which the compiler turns into selects: ~2x faster than `_max_window`'s
    loops on a 2x2 window. Selecting the index itself, not a position 0..3 turned into an index
    afterwards (`k // 2 * row + k % 2`), made training's maxpool 2-4x faster on rows of 4-16
    outputs (shapes-tiny's 32x32 -> 16x16 layer at b32: 1190 -> 306 µs), the same values."""
    best = x[ya, xs]
    at = ia + xs
    v = x[ya, xs + 1]
    if v > best:
        best = v
        at = ia + xs + 1
    v = x[yb, xs]
    if v > best:
        best = v
        at = ib + xs
    v = x[yb, xs + 1]
    if v > best:
        best = v
        at = ib + xs + 1
    return best, at


@jit
def _maxpool_plane(op, ip, xp, base, size, sy, sx, off, with_idx):
    """One (item, channel) plane of `maxpool_forward`: op (OH, OW) the max of each window of
    xp (H, W); with_idx: ip (OH, OW) gets base + the flat index of each max in xp, else ip is any
    (1, n) array, untouched. 2x2 windows whose columns lie inside the image (nearly all of them in
    Darknet's nets) take the straight-line `_max_2x2`, a row of outputs at a time; the others, and
    every other window size, scan the in-image part of the window."""
    H, W = xp.shape
    OH, OW = op.shape
    # output columns whose window lies wholly inside the image's columns
    ilo = min((-off + sx - 1) // sx, OW)
    ihi = max(min((W - size - off) // sx + 1, OW), ilo)
    for i in range(OH):
        top = off + i * sy
        y0 = max(top, 0)
        y1 = min(top + size, H)
        lo = hi = OW
        if size == 2 and y0 < y1:
            lo, hi = ilo, ihi
        ipr = ip[i] if with_idx else ip[0]
        for j in range(OW - (hi - lo)):                 # the columns outside [lo, hi)
            jj = j if j < lo else j + hi - lo
            x0 = max(off + jj * sx, 0)
            x1 = min(off + jj * sx + size, W)
            if y1 <= y0 or x1 <= x0:
                op[i, jj] = EMPTY
                if with_idx:
                    ipr[jj] = -1
            else:
                best, bi = _max_window(xp, y0, y1, x0, x1)
                op[i, jj] = best
                if with_idx:
                    ipr[jj] = base + bi
        if hi == lo:
            continue
        # A window row outside the image (top or bottom edge) is read as a copy of the row inside:
        # in row-major order the copy comes just before (top) or after (bottom) its original, and
        # ties keep the first, so the max and its index are those over the in-image row alone.
        ya = y0
        yb = y1 - 1
        first = off + lo * sx
        # output slices (loops from 0) and, for Darknet's usual stride 2, a constant step
        if sx == 2:
            _max_2x2_row(op[i, lo:hi], ipr[lo:hi], xp, ya, yb, 2, first, base, with_idx)
        else:
            _max_2x2_row(op[i, lo:hi], ipr[lo:hi], xp, ya, yb, sx, first, base, with_idx)


@jit(inline="always")
def _max_2x2_row(o, io, xp, ya, yb, step, first, base, with_idx):
    """o[t] = the max of the 2x2 window at column first + t·step of rows ya, yb of the plane xp
    (o: (n,); yb may be ya: a window row outside the image reads as a copy of the one inside);
    with_idx: io[t] = the flat index of the max, `base` + its index in xp."""
    W = xp.shape[1]
    if with_idx:
        ia = base + ya * W
        ib = base + yb * W
        for t in range(o.shape[0]):
            best, at = _max_2x2(xp, ya, yb, first + t * step, ia, ib)
            o[t] = best
            io[t] = at
    else:
        for t in range(o.shape[0]):
            o[t] = _max_2x2(xp, ya, yb, first + t * step, 0, 0)[0]


@pjit
def maxpool_forward(out, idx, x, size, sy, sx, off, with_idx):
    """out: (B, C, OH, OW); x: (B, C, H, W); with_idx (a training forward: backward reads them):
    idx (B, C, OH, OW) int32 gets the flat index into the item x[b] of each max (-1: none), else
    idx is any (1, 1, a, b) int32 array, untouched. Out-of-image positions never win (Darknet:
    -FLT_MAX there); ties keep the first position in row-major window order (Darknet's `>`).
    Parallel over (item, channel) planes."""
    B, C = x.shape[:2]
    if x.size < PARALLEL_MIN:
        for bc in range(B * C):
            _maxpool_item(out, idx, x, bc, size, sy, sx, off, with_idx)
    else:
        for bc in prange(B * C):
            _maxpool_item(out, idx, x, bc, size, sy, sx, off, with_idx)


@pjit
def maxpool_2x2_rows(out, idx, x, rows_per_item, with_idx):
    """`maxpool_forward` for 2x2 windows at stride 2 with no offset on an even-sized input, with
    every (item, channel, row) flattened: out (R, OW) and x (2R, 2·OW), output row r the max over
    input rows 2r and 2r + 1 (planes then cannot straddle rows); with_idx: idx (R, OW) gets the
    flat index into the item (`rows_per_item` output rows each), else idx is any (1, n) array,
    untouched. The same maxima, ties and indexes as the per-plane path, without its per-plane
    set-up (which dominated 4x4 and 8x8 outputs: measured 2-4x). Rows are read and written by
    index, with no row views, whose set-up cost more than a small map's row of 2-16 maxima: 0.67x
    the time without indexes and 0.73x with them (geometric means over 12 shapes, 2 threads, Zen 4;
    digits' 8x8 -> 4x4 layer at b64 0.42x, 1-item maps of 104-416 0.86-1.03x). The odd-size maps
    of the per-plane path measured 0.87-1.21x through the same `_max_2x2`."""
    R = out.shape[0]
    if out.size < PARALLEL_MIN:
        for r in range(R):
            _row_2x2(out, idx, x, r, rows_per_item, with_idx)
    else:
        for r in prange(R):
            _row_2x2(out, idx, x, r, rows_per_item, with_idx)


@jit(inline="always")
def _row_2x2(out, idx, x, r, rows_per_item, with_idx):
    """Output row r of `maxpool_2x2_rows`."""
    if with_idx:
        ia = 2 * (r % rows_per_item) * x.shape[1]
        ib = ia + x.shape[1]
        for t in range(out.shape[1]):
            best, at = _max_2x2(x, 2 * r, 2 * r + 1, 2 * t, ia, ib)
            out[r, t] = best
            idx[r, t] = at
    else:
        for t in range(out.shape[1]):
            out[r, t] = _max_2x2(x, 2 * r, 2 * r + 1, 2 * t, 0, 0)[0]


@pjit
def maxpool_2x2_planes(out, idx, x, H, OH, C, step, with_idx):
    """`maxpool_forward` for 2x2 windows from offset 0 at stride `step` (1 or 2, both ways) where
    every window's top-left position is in the image: Darknet's usual 2x2/2 on a map with an odd
    side (its last row or column of windows holds one input row or column), and the 2x2/1 of
    YOLOv3-tiny (the last row and column). The planes' rows flattened: x (P·H, W), out (P·OH, OW)
    for P = B·C planes of C channels; with_idx: idx (P·OH, OW) gets the flat index into the item of
    each max, else idx is any (1, n) array, untouched. The same maxima, ties and indexes as the
    general path (a window's row or column outside the image never wins). Everything by index, no
    views of planes or rows, and each window in straight-line code; even maps at stride 2 take
    `maxpool_2x2_rows`, faster there (the same kernel by plane took 1.2-1.8x its time). Against
    the general path (2 threads, 2-core AVX-512 Zen 5): darknet.cfg's 512 planes of 7x7 -> 4x4 at
    batch 1 117 -> 9.4 µs (ONNX Runtime: 5 µs); yolov3-tiny's 512 planes of 13x13 at stride 1
    84 -> 27 µs (ONNX Runtime's node: 29 µs profiled), with indexes 120 -> 60 µs."""
    P = out.shape[0] // OH
    # (each loop with its step a constant: the windows' columns a known distance apart)
    if out.size < PARALLEL_MIN and step == 1:
        for bc in range(P):
            _plane_2x2(out, idx, x, bc, H, OH, C, 1, with_idx)
    elif out.size < PARALLEL_MIN:
        for bc in range(P):
            _plane_2x2(out, idx, x, bc, H, OH, C, 2, with_idx)
    elif step == 1:
        for bc in prange(P):
            _plane_2x2(out, idx, x, bc, H, OH, C, 1, with_idx)
    else:
        for bc in prange(P):
            _plane_2x2(out, idx, x, bc, H, OH, C, 2, with_idx)


@jit(inline="always")
def _plane_2x2(out, idx, x, bc, H, OH, C, step, with_idx):
    """Plane bc of `maxpool_2x2_planes`."""
    W = x.shape[1]
    OW = out.shape[1]
    full = min((W - 2) // step + 1, OW)     # windows with both columns in the image
    base = (bc % C) * H * W
    for i in range(OH):
        o = bc * OH + i
        ya = bc * H + step * i
        yb = ya + 1 if step * i + 1 < H else ya     # a bottom row outside reads as the one inside
        ia = base + step * i * W
        ib = ia + (yb - ya) * W
        if with_idx:
            for t in range(full):
                best, at = _max_2x2(x, ya, yb, step * t, ia, ib)
                out[o, t] = best
                idx[o, t] = at
        else:
            for t in range(full):
                out[o, t] = _max_2x2(x, ya, yb, step * t, 0, 0)[0]
        if full < OW:                   # the last window's right column is outside: its left
            best = x[ya, W - 1]         # column is the image's last
            at = ia + W - 1
            v = x[yb, W - 1]
            if v > best:
                best = v
                at = ib + W - 1
            out[o, full] = best
            if with_idx:
                idx[o, full] = at


@jit(inline="always")
def _maxpool_item(out, idx, x, bc, size, sy, sx, off, with_idx):
    """Plane bc = b·C + c of `maxpool_forward`."""
    _, C, H, W = x.shape
    b = bc // C
    c = bc % C
    ip = idx[b, c] if with_idx else idx[0, 0]       # (1, n) and untouched without with_idx
    _maxpool_plane(out[b, c], ip, x[b, c], c * H * W, size, sy, sx, off, with_idx)


@pjit
def maxpool_backward(prev_delta, delta, idx, fresh):
    """prev_delta: (B, C*H*W) flat per item; delta, idx: (B, C*OH*OW), idx flat into the item.
    prev_delta[b, argmax] += delta; with `fresh` each item's row of prev_delta is zeroed first (the
    network left it unfilled, `State.delta_fresh`): zeroed and scattered into while it is in the
    cache, where a fill of the whole delta beforehand had left it in memory.
    Parallel over batch items: two outputs of one item may share an argmax, so an item stays on one
    thread; serial below PARALLEL_MIN values."""
    B, n = delta.shape
    if delta.size < PARALLEL_MIN:
        for b in range(B):
            _maxpool_backward_item(prev_delta, delta, idx, b, fresh)
    else:
        for b in prange(B):
            _maxpool_backward_item(prev_delta, delta, idx, b, fresh)


@jit(inline="always")
def _maxpool_backward_item(prev_delta, delta, idx, b, fresh):
    if fresh:
        for i in range(prev_delta.shape[1]):    # (a loop: `[b, :] = 0` is a parallel region)
            prev_delta[b, i] = 0
    for k in range(delta.shape[1]):
        i = idx[b, k]
        if i >= 0:
            prev_delta[b, i] += delta[b, k]


@pjit
def local_avgpool_forward(out, x, size, sy, sx, off):
    """out: (B, C, OH, OW); x: (B, C, H, W). Mean over the in-image positions of each window."""
    B, C, H, W = x.shape
    OH, OW = out.shape[2], out.shape[3]
    for bc in prange(B * C):
        b = bc // C
        c = bc % C
        for i in range(OH):
            for j in range(OW):
                acc = 0.0 * x[b, c, 0, 0]
                count = 0
                for n in range(size):
                    y = off + i * sy + n
                    if y < 0 or y >= H:
                        continue
                    for m in range(size):
                        xx = off + j * sx + m
                        if 0 <= xx < W:
                            acc += x[b, c, y, xx]
                            count += 1
                out[b, c, i, j] = acc / count if count > 0 else 0.0 * acc


@pjit
def local_avgpool_backward(prev_delta, delta, size, sy, sx, off):
    """prev_delta: (B, C, H, W); delta: (B, C, OH, OW). Each in-image window position gets
    delta / (number of in-image positions in that window), added."""
    B, C, H, W = prev_delta.shape
    OH, OW = delta.shape[2], delta.shape[3]
    for bc in prange(B * C):
        b = bc // C
        c = bc % C
        for i in range(OH):
            y0 = max(off + i * sy, 0)
            y1 = min(off + i * sy + size, H)
            for j in range(OW):
                x0 = max(off + j * sx, 0)
                x1 = min(off + j * sx + size, W)
                if y1 <= y0 or x1 <= x0:
                    continue
                g = delta[b, c, i, j] / ((y1 - y0) * (x1 - x0))
                for y in range(y0, y1):
                    for xx in range(x0, x1):
                        prev_delta[b, c, y, xx] += g


# -- layers --------------------------------------------------------------------------------------
#: Rows per task of `avgpool_forward`: the eight add chains `_avgpool_rows` runs side by side.
AVGPOOL_ROWS = 8


def avgpool_forward(out, x):
    """out (B·C,), x (B·C, S): each output the sum of its S inputs in order, then / S, in the
    dtype of the data (Darknet's float loop, the same bits). Eight rows at a time, so eight add
    chains overlap, and the row groups in parallel from PARALLEL_MIN values: tiny.cfg's 64000 rows
    of 196 at b64 took 12-15 ms in the network with four rows at a time on one thread (ONNX
    Runtime: 3.2 ms). One row at a time, 1000 rows of 49 took 21 µs; four at a time 10.6."""
    run = _avgpool_parallel if x.size >= PARALLEL_MIN else _avgpool_serial
    run(out, x)


@pjit
def _avgpool_parallel(out, x):
    for g in prange((x.shape[0] + AVGPOOL_ROWS - 1) // AVGPOOL_ROWS):
        _avgpool_rows(out, x, g * AVGPOOL_ROWS)


@jit
def _avgpool_serial(out, x):
    for g in range((x.shape[0] + AVGPOOL_ROWS - 1) // AVGPOOL_ROWS):
        _avgpool_rows(out, x, g * AVGPOOL_ROWS)


@jit(inline="always")
def _avgpool_rows(out, x, i):
    """Rows i .. i + AVGPOOL_ROWS − 1 (fewer at the end) of `avgpool_forward`."""
    n, size = x.shape
    if i + AVGPOOL_ROWS <= n:          # (eight, as written out below)
        a0, a1, a2, a3 = x[i, 0], x[i + 1, 0], x[i + 2, 0], x[i + 3, 0]
        a4, a5, a6, a7 = x[i + 4, 0], x[i + 5, 0], x[i + 6, 0], x[i + 7, 0]
        for j in range(1, size):
            a0 += x[i, j]
            a1 += x[i + 1, j]
            a2 += x[i + 2, j]
            a3 += x[i + 3, j]
            a4 += x[i + 4, j]
            a5 += x[i + 5, j]
            a6 += x[i + 6, j]
            a7 += x[i + 7, j]
        out[i], out[i + 1], out[i + 2], out[i + 3] = a0 / size, a1 / size, a2 / size, a3 / size
        out[i + 4], out[i + 5], out[i + 6], out[i + 7] = a4 / size, a5 / size, a6 / size, a7 / size
        return
    for r in range(i, n):
        acc = x[r, 0]
        for j in range(1, size):
            acc += x[r, j]
        out[r] = acc / size


def _window_out(n: int, padding: int, size: int, stride: int) -> int:
    return (n + padding - size) // stride + 1


class _WindowPool(Layer):
    """Shared geometry of maxpool and local_avgpool."""

    needs_image = True
    label = ""                               # the summary line's name

    def __init__(self, index, in_shape, size, stride_x, stride_y, padding, dtype=np.float32):
        self.size, self.stride_x, self.stride_y, self.padding = size, stride_x, stride_y, padding
        # darknet: the window origin is C's `-padding/2` (truncation toward zero), i.e. -(padding//2)
        self.offset = -(padding // 2)
        super().__init__(index, in_shape, self.compute_out_shape(in_shape), dtype)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx):
        stride = sec.get_int("stride", 1)
        stride_x = sec.get_int("stride_x", stride)
        stride_y = sec.get_int("stride_y", stride)
        size = sec.get_int("size", stride)
        padding = sec.get_int("padding", size - 1)
        for key, value in (("stride", stride), ("stride_x", stride_x), ("stride_y", stride_y), ("size", size)):
            if value < 1:
                raise sec.error(f"must be >= 1 (got {value})", key)
        if padding < 0:
            raise sec.error(f"must be >= 0 (got {padding})", "padding")
        for key in ("maxpool_depth", "antialiasing", "maxpool_zero_nonmax"):
            if sec.get_int(key, 0):
                raise sec.error(f"{key}=1 (AlexeyAB) is not supported by darkpy", key)
        c, h, w = in_shape
        oh, ow = _window_out(h, padding, size, stride_y), _window_out(w, padding, size, stride_x)
        if oh < 1 or ow < 1:
            raise sec.error(f"window size {size} with padding {padding} does not fit the {w}x{h} input "
                            f"(output would be {ow}x{oh})", "size")
        return cls(sec.index, in_shape, size, stride_x, stride_y, padding, ctx.dtype)

    def compute_out_shape(self, in_shape):
        c, h, w = in_shape
        return (c, _window_out(h, self.padding, self.size, self.stride_y),
                _window_out(w, self.padding, self.size, self.stride_x))

    def resize(self, in_shape) -> None:
        super().resize(in_shape)
        if min(self.out_shape) < 1:
            raise self.error(f"input {in_shape} is too small for window {self.size} (output {self.out_shape})")

    def _strides(self) -> str:
        if self.stride_x == self.stride_y:
            return f"{self.stride_x}"
        return f"{self.stride_x}x{self.stride_y}"

    def summary(self) -> str:
        return (f"{self.label:<13}{self.size} x {self.size} / {self._strides()}  {fmt_shape(self.in_shape)}   ->  "
                f"{fmt_shape(self.out_shape)}")


@register
class MaxPoolLayer(_WindowPool):
    """Max over each window. A training forward also records the argmax of each output, so backward
    adds into it only; an inference forward skips that (it costs ~40 % of the pass). The
    `indexes` (int32, flat into the item: no image reaches 2**31 values; int64 indexes into the
    whole batch held 95 MB of darknet19's training at b16) exist only once a training forward or
    a backward needed them after `allocate`. A backward after an inference forward finds the
    argmaxes first."""

    kind = "maxpool"
    aliases = ("max",)
    label = "max"
    #: backward() zeroes each item's previous delta itself before adding into it (`maxpool_backward`)
    assigns_fresh_delta = True

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.indexes = np.zeros((0,), np.int32)
        self._indexed = False        # `indexes` hold the argmaxes of the last forward's input
        #: the layer before, when its inference forward writes this layer's output itself
        #: (`outputs_plan.fuse_pools`; only while outputs are shared), else None
        self.pooled_by = None

    def halves_2x2(self) -> bool:
        """A 2x2 window at stride 2 with no offset on an even-sized input: each output is the max of
        one aligned 2x2 block."""
        _, oh, ow = self.out_shape
        return (self.size == 2 and self.stride_x == 2 and self.stride_y == 2 and self.offset == 0
                and self.in_shape[1] == 2 * oh and self.in_shape[2] == 2 * ow)

    def _by_planes_2x2(self) -> bool:
        """A 2x2 window from offset 0 at stride 1 or 2 (both ways) whose every window has its
        top-left position in the image (`maxpool_2x2_planes`)."""
        _, h, w = self.in_shape
        _, oh, ow = self.out_shape
        s = self.stride_x
        return (self.size == 2 and s in (1, 2) and self.stride_y == s and self.offset == 0
                and s * (oh - 1) < h and s * (ow - 1) < w and w >= 2)

    def extra_buffers(self):
        return [self.indexes]

    def _pool(self, x: np.ndarray, with_idx: bool) -> None:
        if with_idx and self.indexes.shape != self.output.shape:
            self.indexes = np.full(self.output.shape, -1, np.int32)
        _, oh, ow = self.out_shape
        if self.halves_2x2():
            maxpool_2x2_rows(self.output.reshape(-1, ow),
                             self.indexes.reshape(-1, ow) if with_idx else _NO_INDEXES[0, 0],
                             x.reshape(-1, 2 * ow), self.in_shape[0] * oh, with_idx)
        elif self._by_planes_2x2():
            maxpool_2x2_planes(self.output.reshape(-1, ow),
                               self.indexes.reshape(-1, ow) if with_idx else _NO_INDEXES[0, 0],
                               x.reshape(-1, self.in_shape[2]), self.in_shape[1], oh,
                               self.in_shape[0], self.stride_x, with_idx)
        else:
            maxpool_forward(self.output, self.indexes if with_idx else _NO_INDEXES, x, self.size,
                            self.stride_y, self.stride_x, self.offset, with_idx)
        self._indexed = with_idx

    def forward(self, s: State) -> None:
        if self.pooled_by is not None and not s.train:
            self._indexed = False           # the layer before wrote the output (its input is garbage)
            return
        self._pool(s.input.reshape(self.batch, *self.in_shape), s.train)

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        if not self._indexed:    # the last forward was an inference one: find the argmaxes now
            self._pool(s.input.reshape(self.batch, *self.in_shape), True)
        maxpool_backward(s.delta.reshape(self.batch, -1), self.delta.reshape(self.batch, -1),
                         self.indexes.reshape(self.batch, -1), s.delta_fresh)


@register
class LocalAvgPoolLayer(_WindowPool):
    """AlexeyAB's `[local_avgpool]`: maxpool's windows, averaged over the in-image positions."""

    kind = "local_avgpool"
    aliases = ("local_avg",)
    label = "local_avg"

    def forward(self, s: State) -> None:
        x = s.input.reshape(self.batch, *self.in_shape)
        local_avgpool_forward(self.output, x, self.size, self.stride_y, self.stride_x, self.offset)

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        local_avgpool_backward(s.delta.reshape(self.batch, *self.in_shape), self.delta, self.size,
                               self.stride_y, self.stride_x, self.offset)


@register
class AvgPoolLayer(Layer):
    """Global average pooling: (c, h, w) -> (c, 1, 1), each channel the mean over h*w."""

    kind = "avgpool"
    aliases = ("avg",)
    needs_image = True

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "AvgPoolLayer":
        return cls(sec.index, in_shape, (in_shape[0], 1, 1), ctx.dtype)

    def compute_out_shape(self, in_shape):
        return (in_shape[0], 1, 1)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.scratch = np.zeros((batch, self.in_shape[0], 1), self.dtype)
        #: the layer before, when its inference forward writes this layer's output itself
        #: (`outputs_plan.fuse_pools`, layers/conv_averaged.py; only while outputs are shared)
        self.pooled_by = None

    def forward(self, s: State) -> None:
        if self.pooled_by is not None and not s.train:
            return                          # the layer before wrote the output
        c, h, w = self.in_shape
        # darknet: sum, then divide by h*w
        avgpool_forward(self.output.reshape(-1), s.input.reshape(self.batch * c, h * w))

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        c, h, w = self.in_shape
        np.multiply(self.delta.reshape(self.batch, c, 1), 1.0 / (h * w), out=self.scratch)
        s.delta.reshape(self.batch, c, h * w)[...] += self.scratch

    def summary(self) -> str:
        return f"avg                     {fmt_shape(self.in_shape)}   ->  {self.outputs:4d}"
