"""im2col / col2im and the shared convolution workspace.

A convolution is computed as GEMMs: the input patch under every output position is unrolled into a
column of `col` (`im2col`), and `W (n, c·k·k) @ col (c·k·k, oh·ow)` is the output. The backward pass
runs the same unrolling backwards (`col2im`), ADDING every column entry into the input-sized delta
it came from.

Geometry (spec §2.1, AlexeyAB's `dilation`): output row `oy` reads input rows
`oy·stride_y − pad + ky·dilation` for `ky = 0..k−1`, where `pad` is the per-side padding already
multiplied by the dilation; positions outside the image read zero (and receive nothing in col2im).

Two layouts for a chunk of batch items: `im2col`/`col2im_add` keep one (c·k·k, oh·ow) matrix per
item (deconvolutional uses them); `im2col_wide`/`col2im_wide_add` put the items side by side in one
(c·k·k, items·oh·ow) matrix, so the convolutional layer makes ONE 2-D GEMM per chunk — for deep,
small-spatial layers at batch 16–64 that measured ~2x faster than numpy's stacked matmul, which calls
one small GEMM per item — and `rows_to_items` turns the (n, items·oh·ow) result back batch-major.
Unrolling walks zero-padded input rows (`_unroll_plane_s12`, `_unroll_plane`); on maps at most
GATHER_MAX_WIDTH wide, where that walk's per-segment cost dominates, both directions go through a
per-geometry index table instead (`gather_table`, `_scatter_add`).
The column buffer is large and only needed while one layer runs, so every layer shares one
workspace per dtype, as Darknet shares `net.workspace`. Layers `reserve()` their size in
`allocate()` and take views with `get()` in forward/backward; the buffer only grows, so no hot path
allocates. Consequence: two networks must not run forward/backward at the same time in different
threads of one process.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import PARALLEL_MIN, jit, pjit

_WORKSPACES: dict[np.dtype, np.ndarray] = {}

#: Column values unrolled at once (32 MiB in float32) when a layer is small enough to batch items;
#: a layer whose single item needs more still gets one item per chunk.
CHUNK_VALUES = 1 << 23


def chunk_items(per_item: int, batch: int) -> int:
    """How many batch items to unroll together for a layer needing `per_item` column values each."""
    return max(1, min(batch, CHUNK_VALUES // max(per_item, 1)))


def reserve(size: int, dtype) -> None:
    """Make the shared workspace of `dtype` hold at least `size` values (grows, never shrinks)."""
    dtype = np.dtype(dtype)
    ws = _WORKSPACES.get(dtype)
    if ws is None or ws.size < size:
        _WORKSPACES[dtype] = np.empty(max(size, 1), dtype)


def get(shape: tuple, dtype, offset: int = 0) -> np.ndarray:
    """A C-contiguous view of the shared workspace with `shape`, starting `offset` values in (so a
    layer can hold two disjoint buffers); `reserve` must have been called for offset + size."""
    n = 1
    for d in shape:
        n *= d
    ws = _WORKSPACES[np.dtype(dtype)]
    if ws.size < offset + n:
        raise RuntimeError(f"workspace holds {ws.size} values, {offset + n} needed: "
                           "reserve() was not called")
    return ws[offset:offset + n].reshape(shape)


@jit
def _valid_range(off, stride, size, out):
    """The output positions o in [lo, hi) whose input index o·stride + off lies in [0, size)."""
    lo = 0 if off >= 0 else (-off + stride - 1) // stride
    hi = (size - off + stride - 1) // stride if size > off else 0
    hi = min(hi, out)
    return min(lo, hi), hi


#: Column values from which `im2col`/`im2col_wide` unroll planes on several threads. The unrolling
#: is a copy at 0.15-0.7 ns per value on one core, so below ~64k values a parallel region's start
#: (~7 µs with sleeping workers) costs more than the second core saves.
PARALLEL_MIN_COPY = 1 << 16


@jit
def _unroll_plane(col, wide, x, t, k, stride_y, stride_x, pad, dilation, out_h, out_w):
    """The k·k column rows of plane t = b·c + ci of `im2col` (wide=False: col[b, r]) or of
    `im2col_wide` (wide=True: col[r, b]). Walks the zero-padded input rows one at a time: each is
    built once in a small row buffer (zeros, then the image row), and every (ky, kx) that reads it
    copies out_w values from it, with no test per value. One loop per column row segment is what
    makes short rows fast: the old per-segment zero / copy / zero loops cost 1-2 ns per value on
    8-16 wide maps, this 0.3-0.6 (0.15 on 32+ wide ones). Used at strides of 3 and more across;
    strides 1 and 2 have their own copy of this walk (`_unroll_plane_s12`): the duplicated loop
    header is the price of keeping the strided gather out of that nest."""
    _, c, h, w = x.shape
    b = t // c
    ci = t % c
    # padded rows and columns that some output position reads (h + 2·pad when the output size came
    # from the usual formula; more only if a caller asks for a larger output: those read zeros)
    hp = max(h + 2 * pad, (out_h - 1) * stride_y + (k - 1) * dilation + 1)
    wp = max(w + 2 * pad, (out_w - 1) * stride_x + (k - 1) * dilation + 1)
    buf = np.empty(wp, x.dtype)
    plane = x[b, ci]
    for yp in range(hp):
        built = False
        for ky in range(k):
            rel = yp - ky * dilation
            if rel < 0 or rel % stride_y != 0 or rel // stride_y >= out_h:
                continue
            oy = rel // stride_y
            if not built:
                iy = yp - pad
                if iy < 0 or iy >= h:
                    for q in range(wp):
                        buf[q] = 0
                else:
                    for q in range(pad):
                        buf[q] = 0
                    inner = buf[pad:]
                    src = plane[iy]
                    for q in range(w):
                        inner[q] = src[q]
                    tail = buf[pad + w:]
                    for q in range(wp - pad - w):
                        tail[q] = 0
                built = True
            for kx in range(k):
                r = (ci * k + ky) * k + kx
                dst = col[r, b, oy * out_w:] if wide else col[b, r, oy * out_w:]
                src = buf[kx * dilation:]
                for q in range(out_w):
                    dst[q] = src[q * stride_x]


@jit
def _unroll_plane_s12(col, wide, x, t, k, stride_y, pad, dilation, out_h, out_w, buf, phases):
    """`_unroll_plane` at stride 1 or 2 across, with the row buffer `buf` and `phases` given
    (`_row_buffers`: allocated once per call, not per plane). `buf` holds at least w + 2·pad values
    and the extra columns a larger output reads, zero outside its image part [pad, pad + w), which
    is the only part written here. At stride 2 (`phases` (2, ⌈wp/2⌉), else (2, 0)) each built row
    is split once into its even and odd columns (`_split_pairs`), so every (ky, kx) copies a
    contiguous run of one of them, as at stride 1 of `buf` itself. No strided gather shares this
    loop nest: with one beside the contiguous copies (as in `_unroll_plane`) they ran ~1.5x slower
    (stride 1, 8×8 maps, 16 channels: 9.0 → 6.1 µs; 32×32: 51 → 30 µs; stride 2, one core, Zen 3:
    32 × 208×208 1.48 → 0.86 ms, 3 × 224×224 7×7 392 → 241 µs, 128 × 56×56 at b4 3.0 → 2.3 ms)."""
    _, c, h, w = x.shape
    b = t // c
    ci = t % c
    hp = max(h + 2 * pad, (out_h - 1) * stride_y + (k - 1) * dilation + 1)
    plane = x[b, ci]
    zero = False                    # whether buf's image part is known to hold zeros (it may
    #                                 hold the previous plane's last row)
    for yp in range(hp):
        built = False
        for ky in range(k):
            rel = yp - ky * dilation
            if rel < 0 or rel % stride_y != 0 or rel // stride_y >= out_h:
                continue
            oy = rel // stride_y
            if not built:
                iy = yp - pad
                if iy < 0 or iy >= h:
                    if not zero:
                        inner = buf[pad:]
                        for q in range(w):
                            inner[q] = 0
                        zero = True
                else:
                    inner = buf[pad:]
                    src = plane[iy]
                    for q in range(w):
                        inner[q] = src[q]
                    zero = False
                if phases.shape[1]:
                    _split_pairs(phases, buf)
                built = True
            for kx in range(k):
                r = (ci * k + ky) * k + kx
                dst = col[r, b, oy * out_w:] if wide else col[b, r, oy * out_w:]
                # stride 2: value q is buf[2q + kx·d], phase (kx·d) % 2's value q + (kx·d) // 2
                src = (phases[kx * dilation % 2, kx * dilation // 2:] if phases.shape[1]
                       else buf[kx * dilation:])
                for q in range(out_w):
                    dst[q] = src[q]


@jit
def _split_pairs(phases, buf):
    """phases[0] = buf's even values, phases[1] its odd ones (the last odd one 0 for an odd length):
    one pass over consecutive pairs, which the compiler turns into vector loads and shuffles
    (a strided gather per (ky, kx) ran at 1.1 G values/s against 6.9 at stride 1)."""
    n = buf.shape[0] // 2
    ev = phases[0]
    od = phases[1]
    for q in range(n):
        ev[q] = buf[2 * q]
        od[q] = buf[2 * q + 1]
    if buf.shape[0] % 2:
        ev[n] = buf[2 * n]
        od[n] = 0


@jit
def _unroll_serial(col, wide, x, k, stride_y, stride_x, pad, dilation, out_h, out_w):
    nb, c = x.shape[:2]
    if stride_x <= 2:
        buf, phases = _row_buffers(x, k, stride_x, pad, dilation, out_w)
        for t in range(nb * c):
            _unroll_plane_s12(col, wide, x, t, k, stride_y, pad, dilation, out_h, out_w, buf, phases)
        return
    for t in range(nb * c):
        _unroll_plane(col, wide, x, t, k, stride_y, stride_x, pad, dilation, out_h, out_w)


@pjit
def _unroll_parallel(col, wide, x, k, stride_y, stride_x, pad, dilation, out_h, out_w):
    nb, c = x.shape[:2]
    if stride_x <= 2:
        for t in prange(nb * c):
            buf, phases = _row_buffers(x, k, stride_x, pad, dilation, out_w)
            _unroll_plane_s12(col, wide, x, t, k, stride_y, pad, dilation, out_h, out_w, buf, phases)
        return
    for t in prange(nb * c):
        _unroll_plane(col, wide, x, t, k, stride_y, stride_x, pad, dilation, out_h, out_w)


@jit
def _row_buffers(x, k, stride_x, pad, dilation, out_w):
    """`_unroll_plane_s12`'s zeroed padded-row buffer and, at stride 2 across, its two phases
    ((2, 0) at stride 1)."""
    wp = max(x.shape[3] + 2 * pad, (out_w - 1) * stride_x + (k - 1) * dilation + 1)
    return np.zeros(wp, x.dtype), np.empty((2, (wp + 1) // 2 if stride_x == 2 else 0), x.dtype)


#: Output widths up to which `im2col`/`im2col_wide` copy through an index table (`gather_table`)
#: instead of walking padded rows: on maps this narrow the row walk's per-segment cost (a few
#: values per slice) dominates. Measured (one thread, batch 1, 3x3, stride 1, pad 1), row walk →
#: table: 32 channels 4×4 10.1 → 3.7 µs, 64 × 7×7 27 → 15, 512 × 7×7 221 → 153, 128 × 8×8 45 → 37,
#: 512 × 2×2 70 → 9.4; at width 10 the table was slower (19 → 22), at 32 2.9x slower.
GATHER_MAX_WIDTH = 8
#: The largest table built (int32 entries, c·k·k·oh·ow; 8 MiB): darknet19's 1024-channel 3x3 on
#: 7×7 needs 451,584.
GATHER_MAX_ENTRIES = 1 << 21
#: Bytes of tables kept in all; past it the oldest are dropped (and built again when used).
TABLE_BUDGET = 64 << 20
_TABLES: dict[tuple, np.ndarray | None] = {}


def gather_table(c, h, w, k, stride_y, stride_x, pad, dilation, out_h, out_w) -> np.ndarray | None:
    """(c·k·k, out_h·out_w) int32, read-only: for each column entry of one item, the flat index
    (ci·h + iy)·w + ix of the input value it holds, or -1 where it reads padding. None when it
    would have more than GATHER_MAX_ENTRIES entries, or for an item of 2^31 values or more. Kept
    per geometry (a layer's table is built on its first pass), TABLE_BUDGET bytes in all."""
    key = (c, h, w, k, stride_y, stride_x, pad, dilation, out_h, out_w)
    if key in _TABLES:
        return _TABLES[key]
    table = None
    if c * k * k * out_h * out_w <= GATHER_MAX_ENTRIES and c * h * w < 2 ** 31:    # int32 indices
        ci, ky, kx, oy, ox = np.meshgrid(np.arange(c), np.arange(k), np.arange(k), np.arange(out_h),
                                         np.arange(out_w), indexing="ij", sparse=True)
        iy = oy * stride_y - pad + ky * dilation
        ix = ox * stride_x - pad + kx * dilation
        inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
        table = np.where(inside, (ci * h + iy) * w + ix, -1).astype(np.int32)
        table = np.ascontiguousarray(table.reshape(c * k * k, out_h * out_w))
        table.flags.writeable = False
    _TABLES[key] = table
    while sum(t.nbytes for t in _TABLES.values() if t is not None) > TABLE_BUDGET:
        del _TABLES[next(iter(_TABLES))]
    return table


@jit
def _gather_task(col, wide, x, table, zero, t, rows_per_task):
    """Column rows [r0, r0 + rows_per_task) of item b, task t = b·tasks_per_item + r0 / rows_per_task:
    each entry the input value its table entry names, `zero` for -1. x[b] is C-contiguous."""
    rows, n = table.shape
    per_item = (rows + rows_per_task - 1) // rows_per_task
    b = t // per_item
    r0 = t % per_item * rows_per_task
    xf = x[b].ravel()
    for r in range(r0, min(r0 + rows_per_task, rows)):
        dst = col[r, b] if wide else col[b, r]
        src = table[r]
        for q in range(n):
            i = src[q]
            dst[q] = xf[i] if i >= 0 else zero


@jit
def _gather_serial(col, wide, x, table, zero):
    for b in range(x.shape[0]):
        _gather_task(col, wide, x, table, zero, b, table.shape[0])


@pjit
def _gather_parallel(col, wide, x, table, zero, rows_per_task):
    per_item = (table.shape[0] + rows_per_task - 1) // rows_per_task
    for t in prange(x.shape[0] * per_item):
        _gather_task(col, wide, x, table, zero, t, rows_per_task)


def _table_for(x, k, stride_y, stride_x, pad, dilation, out_h, out_w) -> np.ndarray | None:
    """The index table both directions use for x (nb, c, h, w), or None: an output wider than
    GATHER_MAX_WIDTH, an x whose items are not C-contiguous, or a table too large."""
    if out_w > GATHER_MAX_WIDTH or not x.flags.c_contiguous:
        return None
    return gather_table(*x.shape[1:], k, stride_y, stride_x, pad, dilation, out_h, out_w)


def _unroll(col, wide, x, k, stride_y, stride_x, pad, dilation, out_h, out_w):
    """`im2col`/`im2col_wide`'s work: through the index table on narrow maps (a C-contiguous x),
    else walking padded rows; on several threads from PARALLEL_MIN_COPY values."""
    parallel = col.size >= PARALLEL_MIN_COPY
    table = _table_for(x, k, stride_y, stride_x, pad, dilation, out_h, out_w)
    if table is not None:
        zero = x.dtype.type(0)
        if parallel:                # about 8 tasks per item: a batch-1 layer still splits
            _gather_parallel(col, wide, x, table, zero, max(1, -(-table.shape[0] // 8)))
        else:
            _gather_serial(col, wide, x, table, zero)
        return
    run = _unroll_parallel if parallel else _unroll_serial
    run(col, wide, x, k, stride_y, stride_x, pad, dilation, out_h, out_w)


def im2col(col, x, k, stride_y, stride_x, pad, dilation, out_h, out_w):
    """col: (nb, c·k·k, out_h·out_w) output; x: (nb, c, h, w) input images.
    Row r = (ci·k + ky)·k + kx of col[b] holds x[b, ci, oy·sy − pad + ky·d, ox·sx − pad + kx·d]
    (zero outside the image). One task per (item, channel) plane (`_unroll`)."""
    _unroll(col, False, x, k, stride_y, stride_x, pad, dilation, out_h, out_w)


@jit
def _col2im_channel(x, col, bc, k, stride_y, stride_x, pad, dilation, out_h, out_w):
    """Input channel ci of item b (bc = b·c + ci) of `col2im_add`: for each of its k·k column rows
    and each output row inside the image, the valid span is added back with no per-element test."""
    _, c, h, w = x.shape
    b = bc // c
    ci = bc % c
    plane = x[b, ci]
    for ky in range(k):
        for kx in range(k):
            src = col[b, (ci * k + ky) * k + kx]
            xoff = kx * dilation - pad
            lo, hi = _valid_range(xoff, stride_x, w, out_w)
            for oy in range(out_h):
                iy = oy * stride_y - pad + ky * dilation
                if iy < 0 or iy >= h:
                    continue
                dst = plane[iy, lo * stride_x + xoff:]
                sv = src[oy * out_w + lo:oy * out_w + hi]
                if stride_x == 1:
                    for t in range(hi - lo):
                        dst[t] += sv[t]
                else:
                    for t in range(hi - lo):
                        dst[t * stride_x] += sv[t]


def col2im_add(x, col, k, stride_y, stride_x, pad, dilation, out_h, out_w):
    """x: (nb, c, h, w) delta, ADDED to; col: (nb, c·k·k, out_h·out_w). The adjoint of `im2col`.
    One thread per (item, input channel), so no two threads write the same element; serial below
    PARALLEL_MIN values. Through the index table where `im2col` uses it (`_scatter_add`)."""
    if not _scatter_add(x, col, False, k, stride_y, stride_x, pad, dilation, out_h, out_w):
        _col2im_walk(x, col, k, stride_y, stride_x, pad, dilation, out_h, out_w)


@pjit
def _col2im_walk(x, col, k, stride_y, stride_x, pad, dilation, out_h, out_w):
    nb, c = x.shape[:2]
    if col.size < PARALLEL_MIN:
        for bc in range(nb * c):
            _col2im_channel(x, col, bc, k, stride_y, stride_x, pad, dilation, out_h, out_w)
    else:
        for bc in prange(nb * c):
            _col2im_channel(x, col, bc, k, stride_y, stride_x, pad, dilation, out_h, out_w)


def im2col_wide(col, x, k, stride_y, stride_x, pad, dilation, out_h, out_w):
    """col: (c·k·k, nb, out_h·out_w) output, a view of the GEMM's (c·k·k, nb·out_h·out_w) column
    matrix; x: (nb, c, h, w) input images. col[r, b, oy·out_w + ox], r = (ci·k + ky)·k + kx, holds
    x[b, ci, oy·sy − pad + ky·d, ox·sx − pad + kx·d] (zero outside the image). The items sit side by
    side so a whole chunk is ONE 2-D GEMM (a stacked matmul, one GEMM per item, measured up to 2x
    slower). With k = 1, stride 1, pad 0 this is the transpose (nb, c, S) -> (c, nb, S)."""
    _unroll(col, True, x, k, stride_y, stride_x, pad, dilation, out_h, out_w)


def col2im_wide_add(x, col, k, stride_y, stride_x, pad, dilation, out_h, out_w):
    """x: (nb, c, h, w) delta, ADDED to; col: (c·k·k, nb, out_h·out_w) laid out as `im2col_wide`'s.
    Its adjoint. One thread per (input channel, item), so no two threads write one element.
    Through the index table where `im2col_wide` uses it (`_scatter_add`)."""
    if not _scatter_add(x, col, True, k, stride_y, stride_x, pad, dilation, out_h, out_w):
        _col2im_wide_walk(x, col, k, stride_y, stride_x, pad, dilation, out_h, out_w)


@pjit
def _col2im_wide_walk(x, col, k, stride_y, stride_x, pad, dilation, out_h, out_w):
    nb, c, h, w = x.shape
    for cb in prange(c * nb):
        ci = cb // nb
        b = cb % nb
        for ky in range(k):
            for kx in range(k):
                r = (ci * k + ky) * k + kx
                xoff = kx * dilation - pad
                lo, hi = _valid_range(xoff, stride_x, w, out_w)
                for oy in range(out_h):
                    iy = oy * stride_y - pad + ky * dilation
                    if iy < 0 or iy >= h:
                        continue
                    base = oy * out_w
                    for ox in range(lo, hi):
                        x[b, ci, iy, ox * stride_x + xoff] += col[r, b, base + ox]


def _scatter_add(x, col, wide, k, stride_y, stride_x, pad, dilation, out_h, out_w) -> bool:
    """col2im through `gather_table` on the maps `_unroll` gathers (False: not such a map). Each
    (item, channel) task adds its k·k column rows into its own plane, entries in table order, which
    is the row walk's order of additions into each input value: the same bits. Measured (2
    threads, 3x3, stride 1): 32 × 4×4 at b64 444 → 185 µs, 1024 × 7×7 at b1 499 → 181 µs."""
    table = _table_for(x, k, stride_y, stride_x, pad, dilation, out_h, out_w)
    if table is None:
        return False
    if col.size < PARALLEL_MIN:
        _scatter_serial(x, col, wide, table, k * k)
    else:
        _scatter_parallel(x, col, wide, table, k * k)
    return True


@jit
def _scatter_plane(x, col, wide, table, taps, cb):
    """Task cb = ci·nb + b of `_scatter_add`: x[b, ci] += its column rows ci·taps .. + taps."""
    nb = x.shape[0]
    ci = cb // nb
    b = cb % nb
    xf = x[b].ravel()
    for r in range(ci * taps, (ci + 1) * taps):
        src = col[r, b] if wide else col[b, r]
        idx = table[r]
        for q in range(idx.shape[0]):
            i = idx[q]
            if i >= 0:
                xf[i] += src[q]


@jit
def _scatter_serial(x, col, wide, table, taps):
    for cb in range(x.shape[0] * x.shape[1]):
        _scatter_plane(x, col, wide, table, taps, cb)


@pjit
def _scatter_parallel(x, col, wide, table, taps):
    for cb in prange(x.shape[0] * x.shape[1]):
        _scatter_plane(x, col, wide, table, taps, cb)


@pjit
def rows_to_items(y, rows):
    """y: (nb, n, S) output; rows: (n, nb, S), a view of a chunk's (n, nb·S) GEMM result. The
    inverse layout change of `im2col_wide` with k = 1: back to batch-major."""
    nb, n, ns = y.shape
    for fb in prange(n * nb):
        f = fb // nb
        b = fb % nb
        for s in range(ns):
            y[b, f, s] = rows[f, b, s]


@pjit
def add_into(dst, src):
    """dst, src: (n,) flat. dst += src, in parallel (numpy's += is single-threaded)."""
    for i in prange(dst.shape[0]):
        dst[i] += src[i]
