"""1x1 stride-1 unpadded convolutions in inference: each item's product W (N, C) @ x (C, P) on the
8-row microkernel (microgemm.rows8x2: eight filters x two vectors of positions in sixteen
accumulators), straight from the NCHW input into the NCHW output, with the inference epilogue
(bias / batch norm, activation) applied to each unit's rows as soon as they are written.

The GEMM path calls OpenBLAS once per item (or, for up to 32 filters, `gemm.stacked`) and then
makes a separate pass over the whole output for the epilogue. For a 1x1 layer over few channels
the product is short in K: OpenBLAS packs both operands for little work, and the separate pass
reads back an output that has left the caches. Here a unit is one item's run of positions: for
each panel of CV positions the C x CV input values stay in the L1 cache while every block of eight
filters reads them, and the unit's rows go through the epilogue while they are in the L2 cache.

Where it pays (`supports`), each layer within its network's forward (2 threads, 2-core AVX-512
Xeon, median of 20-40 forwards), against the path it took: shapes-tiny's 128 -> 64, 128 -> 27 and
64 -> 32 on 8x8 at b64 0.81-0.85x the time (the direct path across filters), its 64 -> 27 on 16x16
0.90x (GEMM). The whole forwards, alternating with the path off: shapes-tiny at b64 0.985x the
time, at b1 0.96x; digits at b1 and b64, yolov4-tiny, darknet19 and tiny.cfg at b1 level (within
2 %). It lost over 512 channels or more (alone 1.1-1.4x the time: the GEMM's packed panels win
once K is long), with many weights (MAX_WEIGHTS), on large maps (MAX_POSITIONS) and on a large
batch of large maps, whose inputs come from memory (tiny.cfg's 128 -> 32 on 28x28 at b64 alone
1.4x).

Each output is summed over the channels in order (OpenBLAS sums in its own order); the epilogue is
`affine_act_row`, as in the separate pass: an output differs from the GEMM path's only by rounding.

A batch whose output is past the caches (`supports_large`) takes `blas_forward` instead, or,
for up to 32 filters, darkpy's own stacked GEMM with the same epilogue per unit (darkpy/blas.py,
`pointwise`, picks). The GEMM path's per-item products run at their GEMM's rate there, but its
separate pass then reads every output back from memory and writes it again. In `blas_forward` a
unit (`blas_units`) is an item's run of positions small enough that its input and output blocks
stay in the L2 cache; each of numba's threads takes whole units, computes one by a
single-threaded OpenBLAS sgemm call and applies the epilogue to its rows at once. Each layer
within its network's forward at b64 (2 threads, 2-core AVX-512 Xeon, median of 30 forwards of the
layer, one process per path), against the GEMM path: resnet50's 64 -> 256 on 56x56 40.9 ms
against 48.0, its 64 -> 64 13.3 against 14.0, yolov4-tiny's 64 -> 64 on 104x104 48.3 against
56.5, darknet19's 128 -> 64 on 56x56 24.5 against 27.1, yolov3-tiny's 1024 -> 256 on 13x13 18.9
against 24.2; on the own stacked GEMM, tiny.cfg's 32 -> 16 on 56x56 1.12 against 1.35 ms, its
128 -> 16 4.4-4.8 against 4.8-5.6 (three runs each). The whole forwards, alternating in one
process, measured level (within the VM's 5 %). At b1 (outputs of up to 3.2 MB, below
LARGE_MIN_BYTES) resnet50's whole forward took 1.03-1.14x the time with `blas_forward` on its 1x1
layers: the split by filters there is slower than OpenBLAS's own threads, and the separate pass
is cheap on an output still in the caches.

The other 1x1 layers with a multiple of 8 filters on maps of 512 positions or more, whose input
is small enough to stay in the caches (layers/convolutional.py: POINTWISE_PACKED, at b1 in
practice), take `packed_forward`: the same microkernel on panels of CV positions whose input values
are first packed side by side (PACKED_KB channels at a time), so that it reads one contiguous block
instead of C rows a whole map apart, with the epilogue fused. Each layer within its network's
forward at b1 (2 threads, 2-core AVX-512 Xeon, medians of 20-60 forwards, processes alternating),
against OpenBLAS and the separate pass: darknet19's 128 -> 64 on 56x56 0.40-0.42 against
0.60-0.62 ms, yolov4-tiny's 64 -> 64 on 104x104 0.59-0.63 against 0.73-0.86, 128 -> 128 on 52x52
0.45-0.46 against 0.57-0.61 and 256 -> 256 on 26x26 0.49 against 0.58-0.61, resnet50's 64 -> 64,
256 -> 64 and 256 -> 128 on 56x56 0.20, 0.60 and 0.94 against 0.27, 0.71 and 1.06, its 128 -> 512
on 28x28 0.56 against 0.66; its 64 -> 256 on 56x56 and 512 -> 256 on 28x28 level (0.69-0.89
against 0.73-0.83, 1.00 against 0.98). The whole forwards, alternating in one process: resnet50
0.98-1.01x the time, darknet19 0.985-1.01x, yolov4-tiny 0.98-1.00x (within the VM's noise). At
b64 its input comes from memory and the stacked GEMM stayed ahead (tiny.cfg's 128 -> 32 and
256 -> 32 on 28x28: 3.9-4.6 against 3.8 ms, 7.0-8.1 against 6.8-6.9), hence the input bound.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import cblas, njit, simd, thread_count
from .bn import affine_act_row
from .microgemm import CV, rows8x1, rows8x2

#: Most input channels (K): the panel of C x CV input values a unit's filter blocks share stays
#: in the L1 cache (256 channels: 32 KB).
MAX_CHANNELS = 256
#: Most weights (N x C): every panel streams all of them. Within the networks' forwards at b1 (2
#: threads, 2-core AVX-512 Xeon) resnet50's 256 -> 1024 on 14x14 (256K weights) took 0.73 ms here
#: against 0.53 on the GEMM, yolov4-tiny's 256 -> 255 and 256 -> 256 on 26x26 (64K) ran level to
#: 1.05x, its 256 -> 128 on 13x13 (32K) 0.87x.
MAX_WEIGHTS = 1 << 15
#: Most output positions per item, and in the batch (batch x map): at b64 maps of up to 16x16.
#: Larger maps lost within the networks' forwards even where the layer alone gained: resnet50's
#: forward at b1 (its 1x1 layers on 56x56 here) 1.03x the time, alternating in one process.
MAX_POSITIONS = 1 << 10
MAX_BATCH_POSITIONS = 1 << 14
#: Fewest output positions per item (one vector) and fewest filters (one block of eight).
MIN_POSITIONS = simd.LANES
MIN_FILTERS = 8
#: Positions ahead of the panel being computed whose input lines each panel prefetches (a run's
#: next-but-one panels): the input rows of a long map are C separate streams. Without it,
#: yolov4-tiny's 64 -> 64 on 104x104 at b1 1.02x the time.
PREFETCH = 2 * CV
#: Multiply-adds below which the forward runs on one thread: digits' 64 -> 10 on 4x4 at b64 (0.66M)
#: took 57 µs on one thread and 24 on two.
PARALLEL_MIN_MACS = 1 << 16

_jit = njit(cache=True, nogil=True, inline="always")


def supports(c: int, n: int, k: int, stride: int, pad: int, groups: int, dilation: int,
             positions: int, batch: int, inference_only: bool, dtype) -> bool:
    """Layers this path takes: 1x1, stride 1, unpadded, ungrouped, float32, in a network that will
    only infer, with MIN_FILTERS or more filters over at most MAX_CHANNELS channels (at most
    MAX_WEIGHTS weights), MIN_POSITIONS to MAX_POSITIONS positions per item and at most
    MAX_BATCH_POSITIONS in the batch, on AVX-512 (the
    microkernel's sixteen accumulators are all of AVX2's registers)."""
    return (inference_only and k == 1 and stride == 1 and pad == 0 and groups == 1
            and dilation == 1 and np.dtype(dtype) == np.float32 and simd.LANES == 16
            and n >= MIN_FILTERS and c <= MAX_CHANNELS and n * c <= MAX_WEIGHTS
            and MIN_POSITIONS <= positions <= MAX_POSITIONS
            and batch * positions <= MAX_BATCH_POSITIONS)


@_jit
def _tail_columns(xt, xb, C, P, v, width):
    """xt (C x LANES) := the input's positions v..v+width−1 (fewer than a vector: the run's last),
    zero-padded."""
    for c in range(C):
        for j in range(simd.LANES):
            xt[c * simd.LANES + j] = xb[c * P + v + j] if j < width else 0.0


@_jit
def _tail(yb, xb, w1, N, C, P, v, width, tile, xt):
    """Positions v..v+width−1 (fewer than CV: the run's last panel) of every filter, a vector at a
    time (`rows8x1`); a last part of a vector through zero-padded scratch (xt: C x LANES inputs,
    tile: 8 x LANES sums). One copy of each microkernel: a copy of both for the part of a vector
    had taken seconds of a cold start."""
    L = simd.LANES
    for u in range(v, v + width, L):
        part = min(L, v + width - u)
        src, s0, sstep, dst, d0, dstep = xb, u, P, yb, u, P
        if part < L:
            _tail_columns(xt, xb, C, P, u, part)
            src, s0, sstep, dst, d0, dstep = xt, 0, L, tile, 0, L
        for r8 in range(0, N, 8):
            r = min(r8, N - 8)
            ro = r if part == L else 0
            rows8x1(dst, ro * dstep + d0, dstep, w1, r * C, C, src, s0, sstep, 0, C, False)
            if part < L:
                for i in range(8):
                    for j in range(part):
                        yb[(r + i) * P + u + j] = tile[i * L + j]


@njit(cache=True, nogil=True, fastmath={"contract"})
def _unit(y, x, w, k, off, act, b, p0, p1, tile, xt):
    """Item b's positions p0..p1−1 of every filter: y[b, :, p0:p1] := w @ x[b, :, p0:p1], then
    act(·k + off) row by row when k is not empty. Blocks of eight filters; with N not a multiple
    of 8 the last block starts at N − 8 (its first rows computed twice, the same values)."""
    N, P = y.shape[1], y.shape[2]
    C = x.shape[1]
    yb, xb, w1 = y[b].reshape(N * P), x[b].reshape(C * P), w.reshape(N * C)
    for v in range(p0, p1, CV):
        if v + PREFETCH < p1:
            for c in range(C):
                simd.prefetch(xb, c * P + v + PREFETCH)
                simd.prefetch(xb, c * P + v + PREFETCH + simd.LANES)
        if p1 - v >= CV:
            for r8 in range(0, N, 8):
                r = min(r8, N - 8)
                rows8x2(yb, r * P + v, P, w1, r * C, C, xb, v, P, 0, C, False)
        else:
            _tail(yb, xb, w1, N, C, P, v, p1 - v, tile, xt)
    if k.shape[0]:
        for f in range(N):
            affine_act_row(y[b, f, p0:p1], k[f], off[f], act)


@_jit
def _run(y, x, w, k, off, act, cols, runs, u):
    """Unit u of the runs of `cols` positions (`_unit`), with its own scratch."""
    tile, xt = np.empty(8 * simd.LANES, y.dtype), np.empty(x.shape[1] * simd.LANES, y.dtype)
    p0 = (u % runs) * cols
    _unit(y, x, w, k, off, act, u // runs, p0, min(p0 + cols, y.shape[2]), tile, xt)


@njit(cache=True, nogil=True, fastmath={"contract"})
def _forward_serial(y, x, w, k, off, act, cols):
    runs = -(-y.shape[2] // cols)
    for u in range(y.shape[0] * runs):
        _run(y, x, w, k, off, act, cols, runs, u)


@njit(cache=True, nogil=True, parallel=True, fastmath={"contract"})
def _forward_parallel(y, x, w, k, off, act, cols):
    runs = -(-y.shape[2] // cols)
    for u in prange(y.shape[0] * runs):
        _run(y, x, w, k, off, act, cols, runs, u)


_NO_AFFINE = np.empty(0)


def conv_forward(y, x, w, k=_NO_AFFINE, off=_NO_AFFINE, act=0):
    """y (B, N, P) := w (N, C) @ x[b] (C, P) for each item b (C-contiguous, float32, N >= 8), then
    act(y·k[f] + off[f]) for each filter f when k, off (N,) float64 are given (the inference
    epilogue). Units of work are runs of an item's positions, whole vectors of CV, at least four
    per thread when the batch has fewer items; serial below PARALLEL_MIN_MACS multiply-adds."""
    B, N, P = y.shape
    threads = thread_count()
    runs = max(1, -(-4 * threads // B))
    cols = max(CV, -(-P // runs // CV) * CV)
    serial = threads == 1 or y.size * x.shape[1] < PARALLEL_MIN_MACS
    (_forward_serial if serial else _forward_parallel)(y, x, w, k, off, act, cols)


#: A layer whose batch's output is at least this large takes `blas_forward` or the own stacked GEMM
#: with the epilogue (`supports_large`): past the two cores' L2 caches (4 MB), where the GEMM
#: path's separate epilogue pass reads the output back from memory.
LARGE_MIN_BYTES = 8 << 20
#: ... and at least this many positions per item: each item's GEMM packs the weights again, which a
#: short run of columns does not repay. Within resnet50's forward at b64, its 512 -> 2048 layers on
#: 7x7 (4 MB of weights) took 32.2 ms against 26.9 on the GEMM path (items side by side in one
#: GEMM); its 14x14 layers (196 positions, 1 MB) 27.4-28.8 against 29.2-35.2.
LARGE_MIN_POSITIONS = 128
#: Floats of one unit's input and output blocks (C x cols and N x cols): they stay in the L2 cache
#: from the unit's GEMM to its epilogue.
BLAS_UNIT_FLOATS = 1 << 18
#: Fewest units a layer is cut into, to share among the threads (blocks of filters where runs of
#: positions are too few).
BLAS_MIN_UNITS = 8
#: Bytes per float32 (the sgemm takes addresses).
_F = 4


def supports_large(c: int, n: int, k: int, stride: int, pad: int, groups: int, dilation: int,
                  positions: int, batch: int, inference_only: bool, dtype) -> bool:
    """Layers `blas.pointwise` takes: 1x1, stride 1, unpadded, ungrouped, float32, in a network
    that will only infer, on maps of at least LARGE_MIN_POSITIONS positions, with a batch's output
    of at least LARGE_MIN_BYTES."""
    return (inference_only and k == 1 and stride == 1 and pad == 0 and groups == 1
            and dilation == 1 and np.dtype(dtype) == np.float32
            and positions >= LARGE_MIN_POSITIONS and batch * n * positions * 4 >= LARGE_MIN_BYTES)


def blas_units(B: int, N: int, C: int, P: int) -> tuple[int, int]:
    """(cols, fblock): a unit of `blas_forward` is one item's run of `cols` positions (whole
    multiples of 16 but the last) of `fblock` filters: runs of at most BLAS_UNIT_FLOATS input and
    output values, all filters, unless that makes fewer than BLAS_MIN_UNITS units. Fixed by the
    shape, never by the thread count, so that any thread count gives the same bits."""
    cols = max(16, BLAS_UNIT_FLOATS // (N + C) // 16 * 16)
    runs = -(-P // cols)
    cols = (-(-P // runs) + 15) // 16 * 16 if runs > 1 else P
    if B * runs >= BLAS_MIN_UNITS:
        return cols, N
    blocks = -(-BLAS_MIN_UNITS // (B * runs))
    return cols, max(16, (-(-N // blocks) + 15) // 16 * 16)


@njit(cache=True, nogil=True, parallel=True)
def _blas_units(y, x, w, k, off, act, cols, fblock):
    """Every unit (`blas_units`) on numba's threads: y[b, f0:f1, p0:p1] := w[f0:f1] @ x[b, :, p0:p1]
    by one sgemm call, then act(·k + off) row by row when k is not empty."""
    B, N, P = y.shape
    C = x.shape[1]
    runs, blocks = -(-P // cols), -(-N // fblock)
    py, px, pw = y.ctypes.data, x.ctypes.data, w.ctypes.data
    for u in prange(B * runs * blocks):
        b, r, f = u // (runs * blocks), (u // blocks) % runs, u % blocks
        p0, f0 = r * cols, f * fblock
        p1, f1 = min(P, p0 + cols), min(N, f0 + fblock)
        cblas.sgemm(cblas.NO_TRANS, cblas.NO_TRANS, f1 - f0, p1 - p0, C, pw + f0 * C * _F, C,
                    px + (b * C * P + p0) * _F, P, py + ((b * N + f0) * P + p0) * _F, P)
        if k.shape[0]:
            for f in range(f0, f1):
                affine_act_row(y[b, f, p0:p1], k[f], off[f], act)


def blas_forward(y, x, w, k=_NO_AFFINE, off=_NO_AFFINE, act=0):
    """As `conv_forward`, each unit's product (`blas_units`) by a call to OpenBLAS's sgemm from one
    of numba's threads, and its epilogue right after, while the unit's output is in the L2 cache.
    The caller has `cblas.load()` true and OpenBLAS on one thread (blas.one_blas_thread): each
    call is single-threaded."""
    B, N, P = y.shape
    cols, fblock = blas_units(B, N, x.shape[1], P)
    _blas_units(y, x, w, k, off, act, cols, fblock)


# -- the packed path: larger layers on darkpy's microkernel ---------------------------------------
#: k per pass over a packed panel (KB x CV input values: 32 KB, in the L1 cache while every block of
#: eight filters of the unit reads it) and filters per unit (a multiple of 8).
PACKED_KB = 256
PACKED_ROWS = 128
#: Most panels per unit: the run's rows go through the epilogue together.
PACKED_PANELS = 4
#: Fewest units (runs of panels) for which each unit takes all filters (`packed_plan`).
PACKED_MIN_UNITS = 8
#: Units' filters vary slowest (each thread reads its filters' rows once, for every run in turn)
#: rather than the runs of panels.
PACKED_FILTERS_FIRST = True


def supports_packed(c: int, n: int, k: int, stride: int, pad: int, groups: int, dilation: int,
                    inference_only: bool, dtype) -> bool:
    """Layers `packed_forward` can take: 1x1, stride 1, unpadded, ungrouped, float32, a multiple of
    8 filters, in a network that will only infer, on AVX-512 (as `supports`)."""
    return (inference_only and k == 1 and stride == 1 and pad == 0 and groups == 1
            and dilation == 1 and np.dtype(dtype) == np.float32 and simd.LANES == 16
            and n % 8 == 0)


def packed_plan(B: int, N: int, P: int) -> tuple[int, int]:
    """(rows, panels): filters and panels of CV positions per unit of `packed_forward`. All filters
    where the runs of up to PACKED_PANELS panels number at least PACKED_MIN_UNITS (the input is
    then packed by each unit, once), else groups of PACKED_ROWS filters; fixed by the shape,
    never by the thread count."""
    npan = -(-P // CV)
    panels = max(1, min(PACKED_PANELS, B * npan // PACKED_MIN_UNITS))
    if B * -(-npan // panels) >= PACKED_MIN_UNITS:
        return N, panels
    return min(N, PACKED_ROWS), panels


def packed_scratch(B: int, N: int, C: int, P: int) -> int:
    """Floats of the inputs packed ahead of `packed_forward` (every item's panels, K x CV each),
    where a panel's units are more than one group of filters (`packed_plan`); else 0."""
    return B * -(-P // CV) * C * CV if packed_plan(B, N, P)[0] < N else 0


@_jit
def _pack(dst, d0, xb, P, v, width, k0, k1):
    """dst[d0 + (kk − k0)·CV + j] := xb[kk·P + v + j] for kk in k0..k1−1, j < width (zeros after)."""
    L = simd.LANES
    for kk in range(k0, k1):
        base, src = d0 + (kk - k0) * CV, kk * P + v
        if width == CV:
            simd.store(dst, base, simd.load(xb, src))
            simd.store(dst, base + L, simd.load(xb, src + L))
        else:
            for j in range(width):
                dst[base + j] = xb[src + j]
            for j in range(width, CV):
                dst[base + j] = 0.0


@_jit
def _pack_ahead(xp, x, bp, npan):
    """Panel bp % npan of item bp // npan, every channel, into its place in xp."""
    C, P = x.shape[1], x.shape[2]
    v = (bp % npan) * CV
    _pack(xp, bp * C * CV, x[bp // npan].reshape(-1), P, v, min(CV, P - v), 0, C)


@njit(cache=True, nogil=True, fastmath={"contract"})
def _packed_unit(y, x, w, k, off, act, xp, kb, rows, panels, first, u):
    """Unit u of `packed_forward`: item b's filters r0..r1−1 (`rows` of them) at its run of
    `panels` panels of CV positions; each panel summed over the channels kb at a time from the
    packed values (xp's, or packed here), then act(·k + off) on the run's rows while they are in
    the cache."""
    B, N, P = y.shape
    C = x.shape[1]
    npan, ngroups = -(-P // CV), -(-N // rows)
    nruns = -(-npan // panels)
    b, rest = u // (nruns * ngroups), u % (nruns * ngroups)
    if first:
        g, q = rest // nruns, rest % nruns
    else:
        q, g = rest // ngroups, rest % ngroups
    r0 = g * rows
    r1 = min(N, r0 + rows)
    yb, xb, w1 = y[b].reshape(N * P), x[b].reshape(C * P), w.reshape(N * C)
    tile = np.empty(rows * CV if P % CV else 0, y.dtype)     # a last panel's sums
    panel = np.empty(0 if xp.size else kb * CV, y.dtype)
    p0 = q * panels
    for p in range(p0, min(npan, p0 + panels)):
        v = p * CV
        width = min(CV, P - v)
        for k0 in range(0, C, kb):
            k1 = min(k0 + kb, C)
            if xp.size:
                src, s0 = xp, (b * npan + p) * C * CV
            else:
                _pack(panel, 0, xb, P, v, width, k0, k1)
                src, s0 = panel, -k0 * CV
            for r in range(r0, r1, 8):
                if width == CV:
                    rows8x2(yb, r * P + v, P, w1, r * C, C, src, s0, CV, k0, k1, k0 > 0)
                else:
                    rows8x2(tile, (r - r0) * CV, CV, w1, r * C, C, src, s0, CV, k0, k1, k0 > 0)
        if width < CV:
            for r in range(r0, r1):
                for j in range(width):
                    yb[r * P + v + j] = tile[(r - r0) * CV + j]
    if k.shape[0]:
        v0, v1 = p0 * CV, min(P, (p0 + panels) * CV)
        for r in range(r0, r1):
            affine_act_row(y[b, r, v0:v1], k[r], off[r], act)


@njit(cache=True, nogil=True, fastmath={"contract"})
def _packed_serial(y, x, w, k, off, act, xp, kb, rows, panels, first):
    B, N, P = y.shape
    npan = -(-P // CV)
    for bp in range(B * npan if xp.size else 0):
        _pack_ahead(xp, x, bp, npan)
    for u in range(B * -(-npan // panels) * -(-N // rows)):
        _packed_unit(y, x, w, k, off, act, xp, kb, rows, panels, first, u)


@njit(cache=True, nogil=True, parallel=True, fastmath={"contract"})
def _packed_parallel(y, x, w, k, off, act, xp, kb, rows, panels, first):
    B, N, P = y.shape
    npan = -(-P // CV)
    for bp in prange(B * npan if xp.size else 0):
        _pack_ahead(xp, x, bp, npan)
    for u in prange(B * -(-npan // panels) * -(-N // rows)):
        _packed_unit(y, x, w, k, off, act, xp, kb, rows, panels, first, u)


def packed_forward(y, x, w, k=_NO_AFFINE, off=_NO_AFFINE, act=0, xp=None):
    """As `conv_forward` for layers `supports_packed` takes (N % 8 == 0), any number of channels and
    positions: units of all filters or PACKED_ROWS of them x a run of up to PACKED_PANELS panels of
    CV positions of an item (`packed_plan`), each panel's input values packed contiguously
    (PACKED_KB channels at a time: no stride of a whole map between the rows the microkernel
    reads), the epilogue applied to each unit's rows. xp: scratch of
    `packed_scratch` floats (the panels packed once for all the groups of filters), or None where
    that is 0. Each output is summed over the channels in order: the same bits at any thread
    count. Serial below PARALLEL_MIN_MACS multiply-adds."""
    B, N, P = y.shape
    xp = np.empty(0, y.dtype) if xp is None else xp
    serial = thread_count() == 1 or y.size * x.shape[1] < PARALLEL_MIN_MACS
    rows, panels = packed_plan(B, N, P)
    (_packed_serial if serial else _packed_parallel)(y, x, w, k, off, act, xp, PACKED_KB, rows,
                                                     panels, PACKED_FILTERS_FIRST)
