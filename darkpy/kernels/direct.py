"""Direct convolution for layers with few input channels (first layers: 1-4 channels, any kernel
up to 7x7; 3x3 layers with up to 32 channels and 128 filters on large maps, or small maps in a
small batch).

A first layer's im2col matrix is thin (K = c·k·k = 9 or 27 rows) but as long as the image, so
im2col + GEMM spends much of its time writing and re-reading that matrix, and BLAS runs a 16x27
by 27xN product far below its rate; a 16 -> 32 3x3 layer on Winograd runs its 16 GEMMs at
K = 16, as far below it. These kernels work on blocks of output rows instead:

- a block's input rows are gathered into small zero-padded planes split by phase,
  `P[c, qy, qx, r, t] = x_padded[c, (oy0 + r)·sy + qy, t·sx + qx]`, each row `Lw = OW + (k−1)//sx`
  values long, so that over the block's flattened positions `j = r·Lw + ox` every tap (c, ky, kx)
  reads ONE contiguous run of a plane, at offset `(ky//sy)·Lw + kx//sx` — whatever the stride and
  padding, with no bounds tests in the inner loops (positions with ox ≥ OW are computed and
  dropped: a few percent more work); the blocks' sizes, their planes and the prefetch of the next
  block's rows are in kernels/direct_blocks.py;
- forward: per filter, the block's outputs are the sum over the taps of weight × run; eight
  filters at a time on AVX-512 (four on AVX2, and for 3x3 kernels over at most 4 channels or at
  strides other than 1 and 2), STEP positions of them at a time in SIMD vectors (kernels/simd.py)
  that stay in registers over all the taps; the sums are then copied out to the output rows, or,
  when a 2x2 maxpool is fused, put through the inference epilogue and pooled where they are
  (`_pool_out`);
- weight gradient: kernels/direct_wgrad.py, on the same blocks and planes.

Like im2col these compute Darknet's cross-correlation.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import prange, types
from numba.extending import overload

from . import PARALLEL_MIN, njit, simd, vjit
from .borrow import borrowed, keep
from .direct_blocks import PREFETCH_ROWS, _fill, _jit, _serial, prefetch_block
from .epilogue import affine_act_rows_into
from .kernel_call import KeptCall
from .pool2x2 import epilogue_pool_flat, no_pool

#: A forward with fewer than PARALLEL_MIN outputs still runs in parallel when it does at least
#: PARALLEL_MIN · PARALLEL_MIN_TAPS multiply-adds (1M, ~15 µs on one core): shapes-tiny's 32 -> 64
#: on 16x16 at b1 (16384 outputs of 288 taps) took 207 µs on one thread and 144 on two; digits'
#: 16 -> 32 on 8x8 (0.3M) stays serial.
PARALLEL_MIN_TAPS = 32
#: An output of at least `simd.STREAM_MIN_BYTES` whose rows are whole vectors is written past the
#: caches where they are aligned (`_act_out`). yolov4-tiny's first layer (3 -> 32 stride 2, from
#: 416x416) at b64 within its forward (2 threads, 2-core Zen 5, per-layer medians, processes
#: alternating, 3 rounds): 32.6-35.2 -> 25.4-26.1 ms, the next layer's 84.6-87.8 -> 82.7-85.2; the
#: forward 1014-1048 -> 993-1039 ms. Rows of a part of a vector (yolov4-tiny's 104-wide on
#: 104x104, 88 MB: level) stream nothing. The shared outputs' arena (`Network.share_outputs`: the
#: inference commands, the benchmark) starts every output on a 64-byte line; a layer's own buffer
#: (numpy's: 16 bytes) streams nothing.
STREAM = True


#: Most filters of a layer that trains with a kernel other than 3x3: the direct forward beat
#: im2col + GEMM at 16-32 filters on 1-3 channels (single core, float32: 1.1-1.6x faster), but
#: that weight gradient is not register-blocked (`direct_wgrad`) and was not measured past 32.
MAX_FILTERS = 32
#: ... and for 3x3 kernels, and any kernel in a network that will only infer. At 128 filters
#: (cifar's first layer) GEMM was 1.4x faster before the forward had the register-blocked
#: microkernel (`_pass`); since: resnet50's first layer (7x7 stride 2, 3 -> 64 from 224x224, with
#: its 2x2 maxpool) within its network's forward alone (2 threads, 2-core AVX-512 Xeon, min of 30
#: calls) at b1 1.32 ms + the pool's 0.06 -> 0.75 ms, at b8 12.7 -> 5.9 ms (the same kernel with
#: its taps' offsets computed in the loop: 0.99 and 8.9 ms, hence the SIZED kinds). For 3x3
#: kernels also in training. Measured on a 2-core Zen 3 (AVX2), each layer's forward alone, min
#: over 6-10 rounds alternating in one process, against the path it took at 32: tiny.cfg's 16 ->
#: 128 on 56x56 at b16 26.5 -> 19.9 ms (Winograd), at b1 1.01 -> 0.89 and 0.97 -> 0.95 ms;
#: yolov3-tiny's 32 -> 64 on 104x104 at b1 4.3 -> 3.3 ms; darknet19's 32 -> 64 on 112x112 at b1
#: 4.3 -> 3.5 ms, b64 level (200 ms), training b16 forward 90 -> 85, backward 186 -> 163 ms;
#: cifar's first layer (3 -> 128 on 28x28) at b64 7.3 -> 6.4 ms, b1 level, training b128 forward
#: 20.6 -> 18.5 and backward 36 -> 34 ms; darknet.cfg's 32 -> 64 on 56x56 level (b1, b16). 32 ->
#: 256 on 28x28 measured level (tiny.cfg, b16), hence 128.
MAX_FILTERS_3X3 = 128


#: 3x3 stride-1 layers with at most MID_CHANNELS input channels take the direct path too when each
#: output map has at least MID_MIN_POSITIONS positions. Measured at 16 -> 32 channels against
#: Winograd, alternating in one process (2 threads, Zen 4 AVX-512): darknet.cfg's 128x128 layer at
#: b1 1.55 -> 0.96 ms, tiny.cfg's 112x112 2.35 -> 1.23 ms (b64: 83 -> 61 ms), yolov3-tiny's 208x208
#: 5.8 -> 3.8 ms, shapes-tiny's 64x64 b64 12.2 -> 11.6 ms and its b32 training step 95 -> 90 ms.
#: 32 -> 32 layers gain (yolov4-tiny's two on 104x104, the suite's only ones, measured the same
#: way: 3.1 -> 2.6 and 3.4 -> 2.6 ms at b1, 134 -> 117 and 141 -> 113 ms at b64), hence up to 32
#: channels. Smaller maps, down to SMALL_MIN_POSITIONS, only while the whole batch has at most
#: SMALL_MAX_BATCH_POSITIONS output positions, and only in a network that will only infer
#: (`Network.share_outputs`): there the GEMMs of the other paths are small and slow (2-core Zen 3,
#: as MAX_FILTERS_3X3: digits' 16 -> 32 on 8x8 at b1 29 -> 19 µs, at b64 518 -> 398 µs;
#: shapes-tiny's 32 -> 64 on 16x16 at b1 215 -> 149 µs). Past it Winograd wins (that layer at b64
#: 4.5 -> 4.8 ms); on 4x4 maps the 2 padding columns of every 6 lose (digits' 32 -> 64 at b64 452 ->
#: 584 µs). Training loses: the direct weight gradient is not register-blocked (digits' training
#: step at b32 4.5 -> 5.1 ms, its 8x8 layer's backward 0.96 -> 1.59 ms; shapes-tiny's 16x16 layer's
#: backward at b32 7.2 -> 10.1 ms).
MID_CHANNELS = 32
MID_MIN_POSITIONS = 32 * 32
#: ... and 3x3 stride-2 layers on such maps too, in a network that will only infer. Their other
#: path is im2col + GEMM (Winograd takes stride 1 only). Against it, yolov4-tiny's 32 -> 64 from
#: 208x208 (the suite's only such layer), within the network's forward (2 threads, 2-core AVX-512
#: Xeon): 3.56 -> 2.46 ms at b1, 27.4 -> 19.7 ms at b8; the whole forward alternating in one
#: process 0.95x the time at b1, 0.96x at b8 (four filters per pass then; eight since,
#: `_pass3_stride2`). Training keeps the GEMM: the direct weight gradient was not measured at
#: stride 2 over 32 channels.
MID_STRIDE_2 = True
SMALL_MIN_POSITIONS = 8 * 8
SMALL_MAX_BATCH_POSITIONS = 64 * 64


def supports(c: int, n: int, k: int, groups: int, dilation: int, stride: int = 1,
             positions: int = 0, batch: int = 1, inference_only: bool = False) -> bool:
    """Which layers these kernels handle: ungrouped, undilated, at most MAX_FILTERS_3X3 filters
    (MAX_FILTERS for a kernel other than 3x3 that trains), and either at most 4 input channels
    with a kernel at most 7x7, or a 3x3 stride-1 kernel over at most MID_CHANNELS channels whose
    output maps have `positions` (rows x columns) at least MID_MIN_POSITIONS, or, for a layer that
    will only infer, at least SMALL_MIN_POSITIONS with at most SMALL_MAX_BATCH_POSITIONS in the
    `batch`; or, for a layer that will only infer (MID_STRIDE_2), a 3x3 stride-2 kernel over at
    most MID_CHANNELS channels with at least MID_MIN_POSITIONS outputs per map."""
    most = MAX_FILTERS_3X3 if k == 3 or inference_only else MAX_FILTERS
    if groups != 1 or dilation != 1 or k > 7 or n > most:
        return False
    if c <= 4:
        return True
    if c <= MID_CHANNELS and k == 3 and stride == 2 and inference_only and MID_STRIDE_2:
        return positions >= MID_MIN_POSITIONS
    small = (inference_only and SMALL_MIN_POSITIONS <= positions
             and batch * positions <= SMALL_MAX_BATCH_POSITIONS)
    return (c <= MID_CHANNELS and k == 3 and stride == 1
            and (positions >= MID_MIN_POSITIONS or small))


#: Filters per pass of the weight gradient's block loop (`direct_wgrad`), one tap per pass over
#: the block's run: each run is read once for this many filters. As the forward's loop of that
#: form (before `_pass`), 4 measured 1.4-2.2x faster than 2 (single core, AVX-512: yolov3-tiny's
#: first layer 2.9 -> 1.7 ms, shapes-tiny's at b8 0.63 -> 0.43 ms); 8 was no faster than 4.
FILTERS_PER_PASS = 4


#: Output positions per microkernel step of `_forward_block`: three vectors. Against two (8
#: accumulators, the FMAs' latency barely covered), each layer's forward alone, alternating in one
#: process (2 threads, 2-core Zen 3; same bits): 0.80-0.88x the time on shapes-tiny's three 3x3
#: layers at b1 and b16, yolov4-tiny's first layer and its 32 -> 32 on 104x104 at b1; cifar's first
#: layer (3 -> 128 on 28x28) at b16 0.29-0.80x; digits' first layer (one channel) at b64 level.
STEP = 3 * simd.LANES


@_jit
def _steps(m):
    """m rounded up to whole STEPs."""
    return (m + STEP - 1) // STEP * STEP


@_jit
def _fma3(s0, s1, s2, u, v0, v1, v2):
    """(s0 + u·v0, s1 + u·v1, s2 + u·v2): one weight against three vectors of positions."""
    return simd.fma(s0, u, v0), simd.fma(s1, u, v1), simd.fma(s2, u, v2)


@_jit
def _store3(a, j, s0, s1, s2):
    """a[j:j+STEP] := three accumulators, in order."""
    simd.store(a, j, s0)
    simd.store(a, j + simd.LANES, s1)
    simd.store(a, j + 2 * simd.LANES, s2)


#: Filters per pass of `_forward_block` over more than 4 channels: with AVX-512's 32 vector
#: registers eight (24 accumulators: each tap's three position vectors are loaded once for eight
#: filters instead of four); AVX2's 16 registers hold only four. Each layer's forward alone, 2-core
#: Xeon VM (AVX-512), 2 threads, min of 7-15 calls alternating in one process: tiny.cfg's 16 -> 128
#: on 56x56 and 16 -> 32 on 112x112 at b64 0.89-0.90x the time, yolov4-tiny's 32 -> 32 on 104x104
#: at b8 0.90x, shapes-tiny's 16 -> 32 on 64x64 at b64 0.93x, at b1 (with its maxpool) 0.87x. First
#: layers (1-3 channels) keep four at stride 1: eight measured level to 1.09x there. Stride 2 takes
#: as many at any channel count (`_pass3_stride2`).
FILTERS_3X3 = 8 if simd.LANES == 16 else 4


@_jit
def _four(f, N):
    """Filters f..f+3; past the last filter, the last one again (computed twice in the forward,
    written with the same values; never added in the gradient)."""
    return min(f, N - 1), min(f + 1, N - 1), min(f + 2, N - 1), min(f + 3, N - 1)


@_jit
def _taps4(s, w, f, c, ky, kx, v0, v1, v2):
    """The 12 sums s (three vectors of positions for each of the four filters f) plus tap
    (c, ky, kx)'s four weights times (v0, v1, v2)."""
    return (_fma3(s[0], s[1], s[2], w[f[0], c, ky, kx], v0, v1, v2)
            + _fma3(s[3], s[4], s[5], w[f[1], c, ky, kx], v0, v1, v2)
            + _fma3(s[6], s[7], s[8], w[f[2], c, ky, kx], v0, v1, v2)
            + _fma3(s[9], s[10], s[11], w[f[3], c, ky, kx], v0, v1, v2))


@_jit
def _store12(acc, q, M, j, s):
    """The 12 sums s of four filters at positions j.. of their runs of M values in acc, the
    first run the q-th."""
    for i in range(4):
        _store3(acc, (q + i) * M + j, s[3 * i], s[3 * i + 1], s[3 * i + 2])


@_serial
def _forward_block(y, pf, acc, w, b, oy0, rows, sy, sx, lw, k, off, act, p, kind):
    """y[b, :, oy0:oy0+rows, :] from the block's planes pf, register-blocked: pass after pass of
    `_sums` (the filters of each pass: FILTERS_3X3, four for the kinds S1_FEW and STRIDED), each
    written out, or with a pooled output p, its rows' 2x2 maxima through the epilogue into p
    (`_pool_out`). Compiled once per `kind` (a literal). The one caller of `_sums`, each call with
    an int64 first filter: a second call site, and a first filter counted from a literal 0 (typed
    Literal[int](0) at first, then int64), had compiled it four times (seconds each, of a cold
    start)."""
    N = w.shape[0]
    M = _steps(rows * lw)
    width = 4 if kind == S1_FEW or kind == STRIDED else FILTERS_3X3
    for f0 in range(0, N, width):
        _sums(acc, pf, w, f0, rows, sy, sx, lw, kind)
        for q in range(0, width, 4):
            _write_out(y, acc, M, q, _four(f0 + q, N), b, oy0, rows, lw, k, off, act, p)


@_jit
def _write_out(y, acc, M, q, f, b, oy0, rows, lw, k, off, act, p):
    """A pass's sums of the four filters f (runs of M values of acc from the q-th on) out to rows
    oy0.. of item b, as both block kinds write them: with a pooled output p their 2x2 maxima
    through the epilogue (`_pool_out`), else through the epilogue when k is not empty
    (`_act_out`), else as they are (`_copy_out`)."""
    if p.shape[0]:
        _pool_out(p, acc, M, q, f, b, oy0, rows, lw, k, off, act)
    elif k.shape[0]:
        _act_out(y, acc, M, q, f, b, oy0, rows, lw, k, off, act)
    else:
        _copy_out(y, acc, M, q, f, b, oy0, rows, lw)


def _sums(acc, pf, w, f0, rows, sy, sx, lw, kind):
    """One pass of `_pass` (the filters from f0, as many as `kind` takes) into acc."""


@overload(_sums, prefer_literal=True, jit_options={"nogil": True})
def _sums_of_kind(acc, pf, w, f0, rows, sy, sx, lw, kind):
    """`_sums` for one kind (a literal): only its microkernel is compiled. The strides of most
    layers, and the filters per pass, are constants here: the taps' offsets fold at compile time
    (computed in the loop, they took registers the eight filters' accumulators need, which then
    spilled: tiny.cfg's 16 -> 128 at b64 1.7x the time). Compiled on its own: each inlined copy of
    the microkernels took seconds of a cold start."""
    kind = _literal(kind)
    if kind == S1:
        return lambda acc, pf, w, f0, rows, sy, sx, lw, kind: _pass(
            acc, pf, w, f0, rows, 1, 1, lw, FILTERS_3X3, 3)
    if kind == S1_FEW:
        return lambda acc, pf, w, f0, rows, sy, sx, lw, kind: _pass(
            acc, pf, w, f0, rows, 1, 1, lw, 4, 3)
    if kind == S2:
        return lambda acc, pf, w, f0, rows, sy, sx, lw, kind: _pass3_stride2(
            acc, pf, w, f0, rows, lw, FILTERS_3X3)
    if kind == STRIDED:
        return lambda acc, pf, w, f0, rows, sy, sx, lw, kind: _pass(
            acc, pf, w, f0, rows, sy, sx, lw, 4, 3)
    if kind == GENERIC:
        return lambda acc, pf, w, f0, rows, sy, sx, lw, kind: _pass(
            acc, pf, w, f0, rows, sy, sx, lw, FILTERS_3X3, w.shape[2])
    if kind >= SIZED:
        ks, st = divmod(kind - SIZED, SIZED)
        return lambda acc, pf, w, f0, rows, sy, sx, lw, kind: _pass(
            acc, pf, w, f0, rows, st, st, lw, FILTERS_3X3, ks)
    return None


@_jit
def _tap(sa, sb, pf, w, fa, fb, c, ky, kx, a, width):
    """Tap (c, ky, kx), its run at pf[a], added into the sums of the filters fa (and, for eight
    filters, fb): three position vectors loaded once for all of them."""
    v0 = simd.load(pf, a)
    v1 = simd.load(pf, a + simd.LANES)
    v2 = simd.load(pf, a + 2 * simd.LANES)
    sa = _taps4(sa, w, fa, c, ky, kx, v0, v1, v2)
    if width == 8:
        sb = _taps4(sb, w, fb, c, ky, kx, v0, v1, v2)
    return sa, sb


@_jit
def _pass3_stride2(acc, pf, w, f0, rows, lw, width):
    """`_pass` at stride 2, its nine taps written out: each at a fixed offset from the channel's
    first plane (phase planes (qy, qx) one `plane` apart in the order (0,0), (0,1), (1,0), (1,1);
    the kernel's third row and column one plane row and one value on). The loop form of `_pass`
    at eight filters computed the offsets in the loop and ran no faster than four filters; written
    out, eight filters (each tap's three loads shared by twice the FMAs) took yolov4-tiny's 32 -> 64
    from 208x208 at b1 alone (2 threads, 2-core AVX-512 Xeon, min of 9 alternating calls) 2.19 ->
    1.86 ms, its first layer (3 -> 32 from 416x416) 0.75 -> 0.66 ms; the same bits."""
    N, C = w.shape[0], w.shape[1]
    plane = (rows + 2) * lw
    M = _steps(rows * lw)
    fa, fb = _four(f0, N), _four(f0 + 4, N)
    q01, q10, q11 = plane, 2 * plane, 3 * plane
    for j in range(0, M, STEP):
        z = simd.zero(acc)
        sa = (z, z, z, z, z, z, z, z, z, z, z, z)
        sb = sa
        a = j
        for c in range(C):
            sa, sb = _tap(sa, sb, pf, w, fa, fb, c, 0, 0, a, width)
            sa, sb = _tap(sa, sb, pf, w, fa, fb, c, 0, 1, a + q01, width)
            sa, sb = _tap(sa, sb, pf, w, fa, fb, c, 0, 2, a + 1, width)
            sa, sb = _tap(sa, sb, pf, w, fa, fb, c, 1, 0, a + q10, width)
            sa, sb = _tap(sa, sb, pf, w, fa, fb, c, 1, 1, a + q11, width)
            sa, sb = _tap(sa, sb, pf, w, fa, fb, c, 1, 2, a + q10 + 1, width)
            sa, sb = _tap(sa, sb, pf, w, fa, fb, c, 2, 0, a + lw, width)
            sa, sb = _tap(sa, sb, pf, w, fa, fb, c, 2, 1, a + q01 + lw, width)
            sa, sb = _tap(sa, sb, pf, w, fa, fb, c, 2, 2, a + lw + 1, width)
            a += 4 * plane
        _store12(acc, 0, M, j, sa)
        if width == 8:
            _store12(acc, 4, M, j, sb)


@_jit
def _pass(acc, pf, w, f0, rows, sy, sx, lw, width, ks):
    """The sums of `width` (4 or 8) filters from f0 over the block, into `width` runs of
    `_steps(rows·lw)` values of acc (kernels/simd.py): for STEP positions the accumulators stay in
    vector registers over all C·ks·ks taps, each tap one load per vector and one broadcast per
    filter (the pass-per-kernel-row loop it replaced loaded and stored every accumulator once per
    three taps: single core, Zen 3, 1.2-1.4x slower). `ks` is the kernel size, a constant 3 for the
    3x3 kinds. Whole steps only: up to STEP − 1 positions past the block, read from the planes'
    slack (`_forward_plan`) and dropped."""
    N, C = w.shape[0], w.shape[1]
    R = rows + (ks - 1) // sy + 1
    plane = R * lw
    M = _steps(rows * lw)
    fa, fb = _four(f0, N), _four(f0 + 4, N)
    for j in range(0, M, STEP):
        z = simd.zero(acc)
        sa = (z, z, z, z, z, z, z, z, z, z, z, z)
        sb = sa
        for c in range(C):
            for ky in range(ks):
                row = (c * sy + ky % sy) * sx * plane + (ky // sy) * lw + j
                for kx in range(ks):
                    a = row + (kx % sx) * plane + kx // sx      # tap (c, ky, kx)'s run, at j
                    sa, sb = _tap(sa, sb, pf, w, fa, fb, c, ky, kx, a, width)
        _store12(acc, 0, M, j, sa)
        if width == 8:
            _store12(acc, 4, M, j, sb)


@_jit
def _copy_out(y, acc, M, q, f, b, oy0, rows, lw):
    """Output rows oy0.. of item b of the four filters f from their accumulators: the runs of M
    values of acc from the q-th on, rows of lw values of which the first OW are used."""
    OW = y.shape[3]
    a0, a1, a2, a3 = acc[q * M:], acc[(q + 1) * M:], acc[(q + 2) * M:], acc[(q + 3) * M:]
    for r in range(rows):
        o0 = y[b, f[0], oy0 + r]
        o1 = y[b, f[1], oy0 + r]
        o2 = y[b, f[2], oy0 + r]
        o3 = y[b, f[3], oy0 + r]
        r0 = a0[r * lw:r * lw + OW]
        r1 = a1[r * lw:r * lw + OW]
        r2 = a2[r * lw:r * lw + OW]
        r3 = a3[r * lw:r * lw + OW]
        for ox in range(OW):
            o0[ox] = r0[ox]
            o1[ox] = r1[ox]
            o2[ox] = r2[ox]
            o3[ox] = r3[ox]


@vjit
def _pool_out(p, acc, M, q, f, b, oy0, rows, lw, k, off, act):
    """The 2x2 maxima of rows oy0.. of item b of the four filters f, through the inference
    epilogue, into p[b]: each of their runs of M values in acc (from the q-th on, rows of lw
    values, the padding columns left out by the pool) by `epilogue_pool_flat` (no 2-D views: numba's
    reshape calls a helper), whose epilogue gives `affine_act_row`'s values, as the unpooled path
    calls it: the same values, bit for bit (inlined here, float64 values differed)."""
    N, PH, PW = p.shape[1], p.shape[2], p.shape[3]
    flat = simd.flat(p)
    for i in range(4):
        fi = f[i]
        epilogue_pool_flat(flat, ((b * N + fi) * PH + oy0 // 2) * PW, PW, rows // 2,
                           acc[(q + i) * M:(q + i) * M + rows * lw], lw, k[fi], off[fi], act)


@vjit
def _act_out(y, acc, M, q, f, b, oy0, rows, lw, k, off, act):
    """`_copy_out` through the inference epilogue: each filter's rows written once, straight from
    its accumulators, in vectors (`epilogue.affine_act_rows_into`), instead of copied out and
    then passed over again in place, block by block. cifar's first layer (3 -> 128 on 28x28) at b64, the kernel alone (2-core AVX-512
    Xeon, min of 10 calls): one thread 5.0 -> 4.0 ms, two 2.32 -> 1.85 ms (the copy without an
    epilogue: 1.82); within its network, alone: 2.33 -> 1.98 ms; shapes-tiny's first layer (3 -> 16,
    stride 2, from 128x128) 1.52 -> 1.35 ms, darknet19's (3 -> 32 on 224x224) at b16 6.15 ->
    5.46 ms. The same bits."""
    N, OH, OW = y.shape[1], y.shape[2], y.shape[3]
    flat = simd.flat(y)
    stream = STREAM and OW % simd.LANES == 0 and y.size * y.itemsize >= simd.STREAM_MIN_BYTES
    for i in range(4):
        fi = f[i]
        affine_act_rows_into(flat, ((b * N + fi) * OH + oy0) * OW, OW, rows,
                             acc[(q + i) * M:(q + i) * M + rows * lw], lw, k[fi], off[fi], act,
                             stream)
    if stream:
        simd.store_fence()


@_jit
def _forward_plan(y, w, sy, sx, rows):
    """(lw, nblk, planes size, scratch size) of `conv_forward`'s row blocks; the planes with STEP
    values of slack after them, and the scratch in whole steps (`_forward_block`)."""
    OH, OW = y.shape[2], y.shape[3]
    C, k = w.shape[1], w.shape[2]
    lw = OW + (k - 1) // sx
    R = rows + (k - 1) // sy + 1
    planes = C * sy * sx * R * lw + STEP
    return lw, (OH + rows - 1) // rows, planes, FILTERS_3X3 * _steps(rows * lw)


@_jit
def _planes(y, n):
    """`conv_forward`'s buffer of phase planes, n values, its slack (the last STEP) zero: what the
    dropped positions of a block's last step read."""
    pf = np.empty(n, y.dtype)
    for q in range(n - STEP, n):
        pf[q] = 0
    return pf


def _forward_unit(y, x, w, pf, acc, t, nblk, sy, sx, pad, rows, lw, k, off, act, p, kind):
    """Row block t (item t // nblk) of `conv_forward`, through its epilogue when k is not empty
    (`_act_out`); with a pooled output p, the block's 2x2 maxima go there instead, straight from
    its accumulators (`_pool_out`)."""


# Not inlined (one call per row block): an overload inlined is compiled twice, for its type and
# again in its caller. An overload, so that `kind` reaches `_forward_block` as a literal.
@overload(_forward_unit, prefer_literal=True, jit_options={"nogil": True, "fastmath": {"contract"}})
def _forward_unit_of_kind(y, x, w, pf, acc, t, nblk, sy, sx, pad, rows, lw, k, off, act, p, kind):
    _literal(kind)
    return _unit


def _unit(y, x, w, pf, acc, t, nblk, sy, sx, pad, rows, lw, k, off, act, p, kind):
    """`_forward_unit` of a literal `kind`."""
    b = t // nblk
    oy0 = (t % nblk) * rows
    n = min(rows, y.shape[2] - oy0)
    _fill(pf, x, b, oy0, n, sy, sx, pad, w.shape[2], lw)
    _forward_block(y, pf, acc, w, b, oy0, n, sy, sx, lw, k, off, act, p, kind)


def _literal(kind):
    """The value of a literal integer argument (a `kind`)."""
    if not isinstance(kind, types.IntegerLiteral):
        raise TypeError(f"direct: the kernel kind must be a literal integer, not {kind}")
    return kind.literal_value


# The serial and parallel versions are separate functions: in a `parallel=True` function every
# array expression of the inlined helpers (`a0[:] = 0`, ...) outside a prange becomes a parallel
# region of its own, so a small layer's "serial" branch woke the thread pool hundreds of times per
# call (1.9 ms instead of 0.03 ms for digits' first layer at 2 threads).
# The twins share `_forward_units`, compiled on its own: inlined into both, the parallel twin's
# parfor passes over its whole body took 14 s of a cold start, and each twin compiled it anew.
# Called once per thread (not once per unit: per call, its many array arguments cost digits'
# first layer at b64 7 % of its time).
@njit(cache=True, nogil=True, fastmath={"contract"})
def _forward_units(y, x, w, sy, sx, pad, rows, k, off, act, p, lo, hi, kind):
    """Units lo..hi−1 of `conv_forward` (row blocks, t // nblk the item), with their scratch."""
    lw, nblk, npf, nacc = _forward_plan(y, w, sy, sx, rows)
    planes = _planes(y, npf)
    sums = np.empty(nacc, y.dtype)
    pf, acc = borrowed(planes), borrowed(sums)
    y, x, w, p = borrowed(y), borrowed(x), borrowed(w), borrowed(p)
    k, off = borrowed(k), borrowed(off)
    for t in range(lo, hi):
        if PREFETCH_ROWS and t + 1 < hi:
            prefetch_block(x, t + 1, nblk, rows, sy, pad, w.shape[2])
        _forward_unit(y, x, w, pf, acc, t, nblk, sy, sx, pad, rows, lw, k, off, act, p, kind)
    keep(planes)
    keep(sums)


#: The kinds of forward, each compiled only when a layer of that kind runs (`twins`): 3x3 kernels
#: at stride 1 over at most 4 channels (four filters per pass) or more (FILTERS_3X3), at stride 2,
#: and at other strides (four filters); other kernel sizes k at an equal stride s below SIZED as
#: kind SIZED·(k + 1) + s, both constants of its microkernel, and GENERIC for the rest, its taps'
#: offsets computed in the loop. All compiled in one function, a cold start spent 7 s on the four
#: 3x3 microkernels whatever the network used.
GENERIC, S1_FEW, S1, S2, STRIDED = range(5)
SIZED = 8


def kind_of(c: int, k: int, sy: int, sx: int) -> int:
    """The kind of forward of a k x k layer over c channels at stride (sy, sx)."""
    if k != 3:
        return SIZED * (k + 1) + sy if sy == sx < SIZED else GENERIC
    if sy == 1 and sx == 1:
        return S1 if c > 4 else S1_FEW
    return S2 if sy == 2 and sx == 2 else STRIDED


@functools.cache
def twins(kind):
    """The serial and the parallel forward of one kind (a constant of each: numba's cache keys
    a closure on its cells' values), made when a layer of that kind first runs."""
    @_serial
    def serial(y, x, w, sy, sx, pad, rows, k, off, act, p, threads):
        units = y.shape[0] * _forward_plan(y, w, sy, sx, rows)[1]
        # int64, not Literal[int](0): a literal first unit compiled `_forward_units` again
        _forward_units(y, x, w, sy, sx, pad, rows, k, off, act, p, np.int64(0), units, kind)

    @njit(cache=True, nogil=True, parallel=True)
    def parallel(y, x, w, sy, sx, pad, rows, k, off, act, p, threads):
        """threads: numba's thread count (read in Python: `numba.get_num_threads()` in a kernel
        keeps numba from caching it)."""
        units = y.shape[0] * _forward_plan(y, w, sy, sx, rows)[1]
        parts = min(threads, units)
        for i in prange(parts):     # as prange's own static split of the units
            _forward_units(y, x, w, sy, sx, pad, rows, k, off, act, p, i * units // parts,
                           (i + 1) * units // parts, kind)

    return serial, parallel


_NO_AFFINE = np.empty(0)


def conv_forward(y, x, w, sy, sx, pad, rows, k=_NO_AFFINE, off=_NO_AFFINE, act=0, pool=None):
    """y: (B, N, OH, OW) := the correlation of x (B, C, H, W) with w (N, C, k, k), stride (sy, sx),
    zero padding `pad` on every side, `rows` output rows per block (`direct_blocks.forward_rows`). Serial below
    PARALLEL_MIN output values and PARALLEL_MIN · PARALLEL_MIN_TAPS multiply-adds. k, off: (N,)
    float64 (and the activation code `act`), or empty: then each block's rows of every filter f
    become act(y·k[f] + off[f]) as soon as they are written (the inference epilogue, as
    `winograd.outputs`'s). `pool` (B, N, OH/2, OW/2), with k given and even OH, OW: each finished
    block's 2x2 stride-2 maxima go there and y is not written (kernels/pool2x2.py; `rows` is then
    made even)."""
    KeptCall(*forward_call(y, x, w, sy, sx, pad, rows, k, off, act, pool))()


def forward_call(y, x, w, sy, sx, pad, rows, k=_NO_AFFINE, off=_NO_AFFINE, act=0, pool=None):
    """`conv_forward` as the compiled kernel, its arguments but the last (the thread count,
    `thread_count()` at each call) and what runs after it (nothing: None), for a caller that keeps
    them (kernels/kernel_call.py)."""
    if pool is not None:
        rows = max(2, rows - rows % 2)      # (`forward_rows(..., even=True)` gives it already)
    serial = y.size < PARALLEL_MIN and y.size * w[0].size < PARALLEL_MIN * PARALLEL_MIN_TAPS
    run = twins(kind_of(w.shape[1], w.shape[2], sy, sx))[0 if serial else 1]
    return run, (y, x, w, sy, sx, pad, rows, k, off, act,
                 no_pool(y.dtype) if pool is None else pool), None
