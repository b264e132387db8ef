"""Direct convolution vectorised across filters, for small output maps (inference and training).

On an 8x8 or 4x4 map a layer's GEMMs are short (im2col: N = 16-64 positions per item; Winograd:
16 GEMMs of a few tiles) and `direct.py`'s kernels, which vectorise along a row of positions,
compute the padding columns of every row (on a 4x4 map a third of the work). Here the vectors run
across filters instead, as ONNX Runtime's NCHWc convolutions do, while the tensors stay NCHW:

- the weights are laid out filters last in blocks of FV filters (`filters_last`): a block holds
  tap t = (c·k + ky)·k + kx's FV weights at t·FV, filters zero-padded to whole microkernel widths,
  so the FV filters of one tap (two vectors: 16 filters with AVX2, 32 with AVX-512,
  `simd.LANES`) are two vector loads, and a microkernel streams one contiguous block (as rows of
  all the filters, a tap's weights were a row apart: past a few hundred taps the block's lines fell
  into a few of the L2's sets, and 512 -> 512 on 7x7 ran 2.9 ms against 1.0 blocked);
- a microkernel (`_tile6`, kernels/fv_tiles.py) keeps 6 positions x FV filters in twelve vector
  accumulators over the c·k·k taps (with the two weight vectors and a broadcast, 15 of AVX2's 16
  registers); each tap
  costs two vector loads, six scalar loads broadcast to the lanes (`simd.get`: no bounds or sign
  tests) and twelve FMAs (`_tile4`: 4 positions, for short filters and small maps; `_tile8`: 8
  positions in sixteen accumulators, on AVX-512's 32 registers, for every layer). The positions
  are any of the map, found through a table of their offsets, so nothing is computed outside the
  map and any stride works;
- the input is read in place when the layer has no padding, else from zero-padded copies of the
  items' planes, filled at each call (their buffer, with the tables of offsets, made once for a
  kept call: kernels/fv_planes.py); a padded stride-1 layer in a batch reads the input in place
  too, each position over its taps inside the input only (kernels/direct_fv_border.py);
- each unit (item, FV filters, a run of positions) scatters its tiles into the NCHW output and
  applies bias / batch norm and the activation to what it wrote (the inference epilogue); or,
  when a 2x2 [maxpool] alone reads the output (float32 inference), keeps the map's tiles and
  writes their maxima to the pool's output (`writes_pooled`);
- training: the weight and input gradients, kernels/direct_fv_grad.py (the input gradient of a
  stride-1 layer is this forward again).

Like `direct.py` this computes Darknet's cross-correlation.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import prange

from . import PARALLEL_MIN, njit, simd, vjit
from .activations import LEAKY, LINEAR, RELU
from .bn import affine_act_row
from .borrow import borrowed
from .fv_planes import _fill_item, prepared
from .fv_tiles import FV, _jit, block_at, run_tile
from .kernel_call import KeptCall
from .pool2x2 import max4v, no_pool, pools_first

#: Output positions per unit of parallel work (whole microkernels of 4 or 6 positions).
UNIT_POSITIONS = 384
#: Layers with at least WIDE_MIN_TAPS taps per filter and WIDE_MIN_POSITIONS output positions per
#: item take the 6-position microkernel (`_tile6`: 12 accumulators, the FMAs' latency covered with
#: room), the others the 4-position one (8 accumulators, as many as the FMAs' latency needs, and no
#: wasted positions on a 4x4 map). Measured each layer's forward alone, alternating in one process
#: (2-core Zen 3): 6 against 4 positions, shapes-tiny's 64 -> 128 on 8x8 0.83-0.92x the time at
#: b1, b16 and b64, its 32 -> 64 on 16x16 0.82-0.95x; but digits' 16 -> 32 on 8x8 (144 taps)
#: 1.02-1.09x at b64 and its 32 -> 64 on 4x4 (18 positions computed for 16) 0.93-1.14x.
WIDE_MIN_TAPS = 192
WIDE_MIN_POSITIONS = 64
#: Positions per microkernel on AVX-512, whatever the layer (`_tile8`: 16 accumulators; 0: by
#: WIDE_MIN_TAPS, as on AVX2). Each layer's forward alone, alternating in one process (2 threads,
#: 2-core AVX-512 Xeon; same bits): against 4 and 6 positions 0.83-0.91x the time on digits' layers
#: at b64 and b1, 0.84-0.92x on shapes-tiny's 8x8 ones at b64, 0.79-0.80x on 512 -> 512 on 7x7 at
#: b1. Twelve positions (24 accumulators) ran 1.2-1.5x slower than eight.
TILE = 8 if simd.LANES == 16 else 0

#: Most taps per filter (c·k·k) in a network that only infers: a microkernel's FV filters of
#: weights, 64 bytes a tap (128 with AVX-512), stay in the L1 cache up to here (18 KB; 36 KB).
#: Most output positions per item: past 8x8 maps the other paths run their GEMMs or row kernels
#: long enough to be faster. Measured layer by layer against the path each took before,
#: alternating in one process (2 threads, 2-core Zen 3 AVX2, inference with shared outputs; ratio
#: of medians): digits' 16 -> 32 on 8x8 0.77 at b64 (direct) and 0.63 at b1, its 32 -> 64 on 4x4
#: 0.63 (Winograd) and 0.45 (GEMM), its 1x1 64 -> 10 on 4x4 0.91 and 0.38; shapes-tiny's 1x1 128
#: -> 64, 128 -> 27 and 64 -> 32 on 8x8 0.56-0.94 at b64 and 0.74-0.75 at b1. Beyond them it lost:
#: shapes-tiny's 64 -> 128 on 8x8 (576 taps) 1.21-1.29 at b64, its 32 -> 64 on 16x16 level, 16 ->
#: 32 on 32x32 1.55; cifar's 1x1 512 -> 10 on 7x7 1.21 at b64.
MAX_TAPS = 288
MAX_POSITIONS = 64
#: Bytes of a block of filters (FV filters' weights over a chunk of taps) one microkernel pass
#: reads: past it the taps go in chunks (`_unit`), so the chunk stays in the L2 cache while the
#: run's tiles read it. Without chunks darknet19's 512 -> 1024 on 7x7 (a 1.2 MB block) ran at the
#: same 5.8 ms on one thread and on two, from the L3 cache. Against no chunks, alternating in one
#: process (2 threads, 2-core AVX-512 Xeon), the whole forward at batch 1: darknet19 0.98x the
#: time, cifar level.
CHUNK_BYTES = 1 << 18
#: Each chunk's pass prefetches the next chunk of weights (`_unit`): measured the same way,
#: darknet19 0.97x the time, cifar level.
PREFETCH = True
#: ... spread over its first PREFETCH_TILES tiles (or all, if fewer), each prefetching the weights
#: of every PREFETCH_TILES-th tap, instead of all in one tile, whose bursts of prefetches waited on
#: memory (2 lines a tap, ~48 GB/s asked of one core's ~18). Within the forward at b1 (2 threads,
#: 2-core AVX-512 Xeon, medians of 150 forwards, 2 rounds alternating with the one-tile form):
#: darknet19's three 512 -> 1024 on 7x7 (18.9 MB of weights each, 7 tiles) 2.27-2.45 -> 2.08-2.12
#: ms; spread over all 22 tiles of yolov3-tiny's 512 -> 1024 on 13x13 it lost (5.5-5.8 -> 5.7-6.6
#: ms), over the first eight level (5.8-6.1 -> 4.7-5.9 ms, 3 rounds).
PREFETCH_TILES = 8
#: A forward with fewer than PARALLEL_MIN output values runs on several threads all the same from
#: this many multiply-adds (about 10 µs of one core's work).
PARALLEL_MIN_MACS = 1 << 21
#: Fewest output positions per item (a 2x2 map; one position is a connected layer's GEMM).
MIN_POSITIONS = 4
#: An inference forward writes the 2x2 stride-2 [maxpool] that alone reads its output itself
#: (`writes_pooled`, `outputs_plan.fuse_pools`): the whole map's tiles pooled in vectors across
#: the filters (`_pool_run`), and 4x fewer values scattered into NCHW. digits' forward at b64,
#: processes alternating with the commit before (2 threads, 2-core AVX-512 Xeon): 0.95x the time
#: (its 16 -> 32 on 8x8 and the maxpool's 14 µs).
POOLED = True


#: Training too (forward, weight gradient, input gradient), for stride-1 layers whose forward and
#: input gradient's filters (c·k·k and n·k·k taps) are within TRAINING_MAX_TAPS. Measured per
#: layer (forward + backward at b32 unless said, BN + leaky, against the path each took,
#: alternating in one process, 2 threads, Zen 3): digits' 16 -> 32 on 8x8 0.59x the time
#: (Winograd), its 1x1 64 -> 10 on 4x4 0.81, shapes-tiny's 1x1 128 -> 27 and 64 -> 32 on 8x8 0.75
#: and 0.81, 128 -> 64 0.95 (0.73 at b8), 64 -> 64 at b128 0.80, 32 -> 16 3x3 at b128 0.74;
#: digits' training step 0.92-0.93x.
TRAINING = True
#: Inference in a batch of at most this many output positions (a single 7x7 or 8x8 map) takes this
#: path whatever the taps: a microkernel then streams its block of weights from the L2 cache, at
#: about 250 GFLOP/s on 512 -> 512 3x3 on 7x7 (2 threads, 2-core Xeon, AVX-512), where the GEMM's
#: 49 columns kept OpenBLAS at ~150 after im2col. Alternating in one process there, the whole
#: forward at batch 1: cifar 0.88x the time. 0: never past MAX_TAPS. (At b64 on cifar the 7x7
#: layers' wide GEMMs win: 1.2-1.3x the time on this path.)
FEW_POSITIONS = 64
#: ... and so does a k x k layer (k > 1) of at least DEEP_MIN_TAPS taps per filter in a batch of at
#: most DEEP_MAX_POSITIONS output positions (a 13x13, 14x14 or 16x16 map at batch 1), strided or
#: with at least DEEP_MIN_FILTERS filters. Its streamed block of weights dwarfs the input, and the
#: other paths' GEMMs are thin: Winograd's 16 tiles of a 13x13 or 14x14 map (a third of them
#: padding on 13x13), im2col's 169-196 columns (OpenBLAS at ~245 GFLOP/s). Measured each layer's
#: forward within the network's batch-1 forward, and the whole forward alternating in one process
#: against no such rule (`benchmarks.step_time --ab-setting`), 2 threads, 2-core AVX-512 Xeon:
#: yolov3-tiny 0.92-0.95x the time (its 13x13 layers 256 -> 512 2.7 -> 1.9 ms, 512 -> 1024 8.5 ->
#: 7.2 ms), yolov4-tiny 0.92-0.94x (512 -> 512 on 13x13 4.1 -> 3.7 ms, 256 -> 512 2.5 -> 1.9 ms),
#: darknet19 0.96-0.98x (256 -> 512 on 14x14 3.1 -> 2.1, 2.8 -> 1.9, 2.5 -> 2.1 ms), resnet50's
#: stride-2 256 -> 256 from 28x28 (im2col before) 1.6 -> 1.4 ms (its forward 0.96x). Fewer
#: filters on Winograd's 14x14 lost: cifar's two 256 -> 256 layers 0.82 -> 0.95-1.07 ms (its
#: forward 1.03-1.07x), resnet50's five level. So did fewer taps (tiny.cfg's 64 -> 512 on 14x14,
#: 576 taps: its forward 1.02x; darknet.cfg's 128 -> 256, 1152 taps: 1.04x), 1x1 layers against
#: the GEMM (yolov3-tiny's 1024 -> 256 on 13x13: 0.55 -> 0.71 ms), and 1024 positions (26x26
#: maps: yolov3-tiny 1.05x, darknet19 1.03x).
DEEP_MIN_TAPS = 2048
DEEP_MIN_FILTERS = 512
DEEP_MAX_POSITIONS = 256
#: On a 2-core Zen 5 EPYC (OpenBLAS's GEMMs at ~500 GFLOP/s) the rule lost while the microkernels
#: spilled an accumulator at every tap (~220 GFLOP/s; `fv_tiles._tap`); since, the whole forward at
#: batch 1 with the rule on against off, alternating in one process (2 threads, 4 rounds of 30):
#: yolov3-tiny 0.87x the time (its 512 -> 1024 on 13x13 4.9 -> 3.3 ms), yolov4-tiny 0.87x,
#: darknet19 0.93x, resnet50, darknet.cfg, tiny.cfg and cifar level. False: never.
DEEP = True
#: ... and, where DEEP, a strided k x k layer of at least STRIDED_MIN_TAPS taps per filter in a batch
#: of at most STRIDED_MAX_POSITIONS output positions (a 28x28 or 32x32 map at batch 1), whose only
#: other path is im2col and a GEMM: resnet50's 3x3 stride-2 128 -> 128 from 56x56 (1152 taps, 784
#: positions) within the batch-1 forward 0.98 -> 0.61 ms (2 threads, 2-core Zen 5). (It holds the
#: strided layers of the DEEP rule above, whose own condition `supports` then checks for the
#: stride-1 ones only.)
STRIDED_MIN_TAPS = 1024
STRIDED_MAX_POSITIONS = 1024
#: ... and, where DEEP, a 1x1 layer of at least DEEP_1X1_MIN_CHANNELS input channels in a batch of
#: at most DEEP_MAX_POSITIONS output positions, whose other path is a thin GEMM (169-196 columns).
#: Lost on the Xeon while the microkernels spilled (above); since, each layer within the batch-1
#: forward (2 threads, 2-core Zen 5, the rule on against off in one process, 10-16 rounds):
#: yolov3-tiny's 1024 -> 256 and 512 -> 255 on 13x13 0.45-0.54 -> 0.30-0.35 and 0.24-0.27 ->
#: 0.15-0.17 ms (its forward 0.985-0.999x), yolov4-tiny's two 512 -> 256/255 0.20 -> 0.16 ms (0.99x),
#: tiny.cfg's 512 -> 64 and 512 -> 128 on 14x14 0.067 -> 0.043 and 0.097 -> 0.084 ms (0.97x),
#: darknet19's two 512 -> 256 on 14x14 0.23/0.20 -> 0.15/0.14 ms (0.98x); resnet50's 1024 -> 256
#: on 14x14 0.33 -> 0.31-0.32 ms (its forward level). 256 channels lost (resnet50's 256 -> 1024 on
#: 14x14 0.32 -> 0.40 ms).
DEEP_1X1_MIN_CHANNELS = 512
#: Most taps per filter of a layer that trains, in its forward and its input gradient: its GEMM and
#: Winograd alternatives are short too (digits' 32 -> 64 on 4x4 at b32 ran Winograd on 128 tiles).
#: Against MAX_TAPS, alternating in one process (2 threads, 2-core Xeon, AVX-512): digits' training
#: step at b32 0.88-0.91x the time, shapes-tiny's 0.98-1.01x. (Inference keeps MAX_TAPS: 576 there
#: measured 1.02-1.03x the time of digits and shapes-tiny at b64.)
TRAINING_MAX_TAPS = 576


def supports(c: int, n: int, k: int, groups: int, dilation: int, positions: int,
             inference_only: bool, stride: int = 1, pad: int = 0, batch: int = 1) -> bool:
    """Layers this path takes: ungrouped and undilated, with MIN_POSITIONS to MAX_POSITIONS output
    positions per item; in a network that will only infer, with at most MAX_TAPS taps per filter (c
    input channels, k x k), or any number in a batch of at most FEW_POSITIONS output positions, and
    (where DEEP) whatever its map, in a batch of at most DEEP_MAX_POSITIONS output positions a
    k x k layer of at least DEEP_MIN_TAPS taps and DEEP_MIN_FILTERS filters or a 1x1 layer of at
    least DEEP_1X1_MIN_CHANNELS channels, in one of at most STRIDED_MAX_POSITIONS a strided k x k
    layer of at least STRIDED_MIN_TAPS taps; in one that trains (with TRAINING), at stride 1 with
    padding at most k − 1 and at most TRAINING_MAX_TAPS taps per filter of the forward (c·k·k) and
    of the input gradient (n·k·k)."""
    if not (groups == 1 and dilation == 1 and MIN_POSITIONS <= positions):
        return False
    if DEEP and inference_only:
        taps, total = c * k * k, batch * positions
        if k == 1 and c >= DEEP_1X1_MIN_CHANNELS and total <= DEEP_MAX_POSITIONS:
            return True
        if k > 1 and stride > 1 and taps >= STRIDED_MIN_TAPS and total <= STRIDED_MAX_POSITIONS:
            return True
        if (k > 1 and taps >= DEEP_MIN_TAPS and total <= DEEP_MAX_POSITIONS
                and n >= DEEP_MIN_FILTERS):
            return True
    if positions > MAX_POSITIONS:
        return False
    if inference_only:
        return c * k * k <= MAX_TAPS or batch * positions <= FEW_POSITIONS
    return (TRAINING and stride == 1 and pad <= k - 1
            and max(c, n) * k * k <= TRAINING_MAX_TAPS)


#: The units of work of both twins (`_forward_serial`, `_forward_parallel`; the wgrad pair),
#: compiled on their own with the twins' flags: once for both, and outside the parallel twin's
#: parfor passes (inlined, digits' training compiled the direct kernels for 7 s more).
_unit_jit = njit(cache=True, nogil=True, fastmath={"contract"})


def padded_filters(n: int) -> int:
    """Filters rounded up to whole microkernel widths: the columns of `filters_last`'s matrix."""
    return -(-n // FV) * FV


@njit(cache=True, nogil=True)
def filters_last(wt, w):
    """wt (c·k·k · padded_filters(n),) := w (n, c, k, k) in blocks of FV filters: the block of
    filters f0.. starts at `block_at(f0, taps)` and holds, tap after tap, the tap's FV weights
    (filter f0 + j of tap t at block_at(f0, taps) + t·FV + j); the filters past n zero."""
    n = w.shape[0]
    taps = w.shape[1] * w.shape[2] * w.shape[3]
    wf = w.reshape(n, taps)
    for f0 in range(0, wt.shape[0] // taps, FV):
        for t in range(taps):
            row = wt[block_at(f0, taps) + t * FV:block_at(f0, taps) + (t + 1) * FV]
            for j in range(FV):
                row[j] = wf[f0 + j, t] if f0 + j < n else 0


@_jit
def tile_positions(taps, S):
    """Positions per microkernel for filters of `taps` taps on maps of S positions: TILE, else 6
    for wide layers (WIDE_MIN_TAPS, WIDE_MIN_POSITIONS), else 4."""
    return TILE if TILE else (6 if taps >= WIDE_MIN_TAPS and S >= WIDE_MIN_POSITIONS else 4)


@vjit
def _epilogue_tile(tile, npos, kp, op, f0, act):
    """tile (npos positions x FV filters, filters last) in place := act(value·k + off), with the
    filters f0..'s k and off from kp and op (float64, zero-padded to whole FV) and act linear,
    leaky or relu: in vectors across the filters, widened to float64 as `affine_act_row`'s scalar
    loop does. For float32 tiles only: linked into its fastmath caller the product and the sum
    fuse, which float64 outputs showed (1-2 ulp off the separate pass); rounded to float32 the
    values were the separate pass's in every test. Row by row over a small map's few positions the
    scalar pass took longer than the scatter (digits' 32 -> 64 on 4x4: 16 values a row)."""
    for h in range(0, FV, simd.LANES):
        kv, ov = simd.load(kp, f0 + h), simd.load(op, f0 + h)
        zero, tenth = simd.splat(kv, 0.0), simd.splat(kv, 0.1)
        for i in range(npos):
            j = i * FV + h
            z = simd.add(simd.mul(simd.widen(simd.load(tile, j)), kv), ov)
            if act == LEAKY:
                z = simd.positive_or(z, simd.mul(z, tenth))
            elif act == RELU:
                z = simd.positive_or(z, zero)
            simd.store(tile, j, simd.cast_like(tile, z))


@_jit
def _scatter8(y, b, f0, nf, p0, tile):
    """y[b, f0 + f, p0:p0+8] := a tile's 8 positions of filter f, for f < nf: filter by filter, the
    eight stores to one output row (position by position, they went to nf rows: each layer's
    forward alone at b64, one or two threads, 0.86-0.97x the time on digits' and shapes-tiny's
    layers)."""
    for f in range(nf):
        row = y[b, f0 + f]
        row[p0] = tile[f]
        row[p0 + 1] = tile[FV + f]
        row[p0 + 2] = tile[2 * FV + f]
        row[p0 + 3] = tile[3 * FV + f]
        row[p0 + 4] = tile[4 * FV + f]
        row[p0 + 5] = tile[5 * FV + f]
        row[p0 + 6] = tile[6 * FV + f]
        row[p0 + 7] = tile[7 * FV + f]


@_jit
def _pool_run(p, b, f0, nf, run, pt, k, off, act):
    """p[b, f0:f0+nf] := the 2x2 stride-2 maxima of a whole map's tiles, run (positions x FV
    filters, filters last, from position 0), after the epilogue: FV filters at a time, in vectors,
    each window's four values compared in `max4`'s order (`max4v`: the same bits, ties and NaNs);
    pt: scratch of FV values. With k (the filters' k and off, zero-padded to whole FV: not empty),
    the tiles are still the sums and the epilogue is taken on the maxima (`pools_first` holds for
    the nf filters: the same bits, on a quarter of the values)."""
    ow = 2 * p.shape[3]
    for py in range(p.shape[2]):
        for px in range(p.shape[3]):
            q = (2 * py * ow + 2 * px) * FV
            for h in range(0, FV, simd.LANES):
                simd.store(pt, h, max4v(simd.load(run, q + h), simd.load(run, q + FV + h),
                                        simd.load(run, q + ow * FV + h),
                                        simd.load(run, q + (ow + 1) * FV + h)))
            if k.shape[0]:
                # int64, not Literal[int](1): a literal compiled `_epilogue_tile` again
                _epilogue_tile(pt, np.int64(1), k, off, f0, act)
            for f in range(nf):
                p[b, f0 + f, py, px] = pt[f]


@_jit
def epilogue_on_tiles(itemsize, act):
    """Whether the epilogue goes through the tiles in vectors (`_epilogue_tile`) rather than over
    the rows written: for float32 values (float64 sums went through it contracted, fused
    multiply-adds, 1-2 ulp off the separate pass) and linear, leaky and relu. (The kernels call it;
    Python runs its source, `on_tiles`.)"""
    return itemsize == 4 and (act == LINEAR or act == LEAKY or act == RELU)


@_jit
def _unit(y, src, item, wt, toff, pos, t, groups, runs, k, off, act, add, chunk_bytes,
          prefetch, p):
    """Unit t: item b = t // (groups·runs) (its planes at src[b·item:]), filters FV·(t // runs %
    groups)..., positions of run t % runs; its tiles scattered into y (B, N, S) (added to it with
    `add`), through the epilogue (k, off: zero-padded to whole FV, or empty): on the tiles
    (`_epilogue_tile`) for linear, leaky and relu, else on the rows written. Past CHUNK_BYTES of
    the filters' block the taps go in chunks, each over all of the run's tiles, their sums kept in
    a buffer for the run. With a pooled output p (the run a whole map, the epilogue on the tiles),
    the run's tiles are kept the same way and their 2x2 maxima written to p instead of y."""
    N, S = y.shape[1], y.shape[2]
    taps = toff.shape[0]
    b = t // (groups * runs)
    f0 = (t // runs % groups) * FV
    p_lo = (t % runs) * UNIT_POSITIONS
    p_hi = min(p_lo + UNIT_POSITIONS, S)
    nf = min(FV, N - f0)
    w0 = block_at(f0, taps)
    pv = tile_positions(taps, S)
    kc = max(1, chunk_bytes // (FV * wt.itemsize))         # taps per chunk
    chunks = -(-taps // kc)
    pooled = p.shape[0] > 0
    whole = chunks > 1 or pooled                           # every tile of the run kept
    out = np.empty(((p_hi - p_lo + pv - 1) // pv if whole else 1) * pv * FV, y.dtype)
    tiles = (p_hi - p_lo + pv - 1) // pv
    ahead = min(kc, taps) * FV if prefetch else 0
    spread = min(tiles, PREFETCH_TILES)
    tiled = k.shape[0] > 0 and epilogue_on_tiles(y.itemsize, act)
    # a pooled run's epilogue on its maxima where that gives the same bits (`_pool_run`)
    late = pooled and tiled and _pools_first(k, off, act, f0, nf)
    for ch in range(chunks):
        t0, t1 = ch * kc, min(taps, (ch + 1) * kc)
        for p0 in range(p_lo, p_hi, pv):
            tile = out[(p0 - p_lo) * FV:] if whole else out
            # the first tiles prefetch the next chunk (after the last, the next unit's block),
            # each every `spread`-th tap's weights (`PREFETCH_TILES`)
            j = (p0 - p_lo) // pv
            pf = (ahead if j < spread else 0, spread, j)
            npos = min(pv, p_hi - p0)
            run_tile(pv, npos, tile, src, b * item, wt, w0, toff, None, t0, t1, ch > 0, pos, p0,
                     pf)
            if ch < chunks - 1:
                continue
            if tiled and not late:
                _epilogue_tile(tile, npos, k, off, f0, act)
            if pooled:
                continue
            if npos == 8 and not add:
                _scatter8(y, b, f0, nf, p0, tile)
                continue
            for i in range(npos):
                if add:
                    for f in range(nf):
                        y[b, f0 + f, p0 + i] += tile[i * FV + f]
                else:
                    for f in range(nf):
                        y[b, f0 + f, p0 + i] = tile[i * FV + f]
    if pooled:       # scratch: the first position's values, read before they are written over
        _pool_run(p, b, f0, nf, out, out[:FV], k if late else k[:0], off, act)
    elif k.shape[0] and not tiled:
        for f in range(f0, f0 + nf):
            affine_act_row(y[b, f, p_lo:p_hi], k[f], off[f], act)


@_jit
def _pools_first(k, off, act, f0, nf):
    """Whether `pools_first` holds for filters f0..f0+nf−1."""
    for f in range(f0, f0 + nf):
        if not pools_first(k[f], off[f], act):
            return False
    return True


@_unit_jit
def _units(y, src, item, wt, toff, pos, lo, hi, groups, runs, k, off, act, add, chunk_bytes,
           prefetch, p):
    """Units lo..hi−1 (`_unit`): one call per thread, not per unit (as `direct._forward_units`,
    whose per-unit calls had cost digits' first layer at b64 7 % of its time). Its callers (the
    twins) pass y, wt and p borrowed (kernels/borrow.py), and their caller holds the arrays
    `prepared` made (src, toff, pos, k, off) for the whole call: those are borrowed here, so that
    no view the units make counts a reference."""
    src, toff, pos, k, off = borrowed(src), borrowed(toff), borrowed(pos), borrowed(k), borrowed(off)
    for t in range(lo, hi):
        _unit(y, src, item, wt, toff, pos, t, groups, runs, k, off, act, add, chunk_bytes,
              prefetch, p)


# Twins, as in direct.py: the parallel one's prange loops. Sharing their set-up through a helper
# (the source as a conditional expression, the padding loop over a conditional range) made the
# parallel twin 7x slower (digits' 32 -> 64 layer at b64 0.7 -> 5.2 ms on one thread).
@njit(cache=True, nogil=True, fastmath={"contract"})
def _forward_serial(y, x, wt, src, wp, toff, pos, kp, op, pad, act, add, chunk_bytes, prefetch,
                    p, threads):
    y, x, wt, p = borrowed(y), borrowed(x), borrowed(wt), borrowed(p)
    src, toff, pos, kp, op = borrowed(src), borrowed(toff), borrowed(pos), borrowed(kp), borrowed(op)
    B, C = x.shape[0], x.shape[1]
    plane = src.shape[0] // (B * C)
    groups, runs = -(-y.shape[1] // FV), -(-y.shape[2] // UNIT_POSITIONS)
    if pad:
        for b in range(B):
            _fill_item(src, x, b, pad, plane // wp, wp)
    # int64, not Literal[int](0): a literal first unit compiled `_units` again for this twin
    _units(y, src, C * plane, wt, toff, pos, np.int64(0),
           B * groups * runs, groups, runs, kp, op, act, add, chunk_bytes, prefetch, p)


@njit(cache=True, nogil=True, parallel=True, fastmath={"contract"})
def _forward_parallel(y, x, wt, src, wp, toff, pos, kp, op, pad, act, add, chunk_bytes,
                      prefetch, p, threads):
    y, x, wt, p = borrowed(y), borrowed(x), borrowed(wt), borrowed(p)
    src, toff, pos, kp, op = borrowed(src), borrowed(toff), borrowed(pos), borrowed(kp), borrowed(op)
    B, C = x.shape[0], x.shape[1]
    plane = src.shape[0] // (B * C)
    groups, runs = -(-y.shape[1] // FV), -(-y.shape[2] // UNIT_POSITIONS)
    if pad and B == 1:                   # one item: no parallel region of its own
        _fill_item(src, x, 0, pad, plane // wp, wp)
    elif pad:
        for b in prange(B):
            _fill_item(src, x, b, pad, plane // wp, wp)
    units = B * groups * runs
    parts = min(threads, units)
    for i in prange(parts):     # as prange's own static split of the units
        _units(y, src, C * plane, wt, toff, pos, i * units // parts,
               (i + 1) * units // parts, groups, runs, kp, op, act, add, chunk_bytes, prefetch, p)


_NO_AFFINE = np.empty(0)


@functools.cache
def _no_means(dtype) -> np.ndarray:
    """The border path's 'no means' argument: an empty array (one per dtype, never written)."""
    return np.empty(0, dtype)


def on_tiles(dtype, act: int) -> bool:
    """`epilogue_on_tiles` for a dtype, run as Python (its source, not the compiled function:
    each call from Python through numba's dispatcher cost ~0.3 µs of every forward)."""
    return epilogue_on_tiles.py_func(np.dtype(dtype).itemsize, act)


def writes_pooled(dtype, act: int, positions: int) -> bool:
    """Whether `conv_forward` can write a 2x2 stride-2 pool of its output instead of the output:
    with the epilogue on the tiles (`on_tiles`), a map within one run of UNIT_POSITIONS."""
    return POOLED and on_tiles(dtype, act) and positions <= UNIT_POSITIONS


def writes_means(dtype, act: int) -> bool:
    """Whether `conv_forward` can write its output planes' means instead of the output: with the
    epilogue on the tiles (`on_tiles`)."""
    return on_tiles(dtype, act)


def conv_forward(y, x, wt, k, sy, sx, pad, kk=_NO_AFFINE, off=_NO_AFFINE, act=0, add=False,
                 pool=None, mean=None):
    """y (B, N, OH, OW) := the correlation of x (B, C, H, W) with the k x k filters laid out by
    `filters_last` in wt, stride (sy, sx), zero padding `pad` on every side (with `add`: y += it).
    kk, off: (N,) float64 and the activation code `act`, or empty: then every output plane becomes
    act(y·kk[f] + off[f]) as it is written (the inference epilogue). `pool` (B, N, OH/2, OW/2),
    with the epilogue and even OH, OW, where `writes_pooled`: the 2x2 stride-2 maxima of each
    output plane go there and y is not written. `mean` (B, N), with the epilogue on the tiles
    (`writes_means`) and not `add`: each output plane's mean goes there (its sum in some order,
    then / OH·OW); y is written only off the border path (which sums the tiles as they come; the
    others average y after).

    Serial below PARALLEL_MIN output values unless they take PARALLEL_MIN_MACS multiply-adds or
    more (a 7x7 map's few outputs over thousands of taps). A parallel, padded stride-1 layer in a
    batch computes only the taps inside the input (kernels/direct_fv_border.py), where its
    epilogue is on the tiles or there is none."""
    KeptCall(*forward_call(y, x, wt, k, sy, sx, pad, kk, off, act, add, pool, mean))()


def forward_call(y, x, wt, k, sy, sx, pad, kk=_NO_AFFINE, off=_NO_AFFINE, act=0, add=False,
                 pool=None, mean=None):
    """`conv_forward` as the compiled kernel, its arguments but the last (the thread count,
    `thread_count()` at each call) and what runs after it (None, or the means of y off the border
    path: a function and its arguments), for a caller that keeps them (kernels/kernel_call.py)."""
    B, N, OH, OW = y.shape
    tiled = kk.shape[0] > 0 and on_tiles(y.dtype, act)
    if pool is not None and not (tiled and not add and OH % 2 == 0 and OW % 2 == 0
                                 and pool.shape == (B, N, OH // 2, OW // 2)
                                 and writes_pooled(y.dtype, act, OH * OW)):
        raise ValueError(f"direct_fv.conv_forward cannot write a pooled output here ({y.dtype}, "
                         f"activation {act}, {OH}x{OW} map, pool {pool.shape})")
    if mean is not None and not (tiled and not add and pool is None and mean.shape == (B, N)):
        raise ValueError(f"direct_fv.conv_forward cannot write the maps' means here ({y.dtype}, "
                         f"activation {act}, add {add}, means {mean.shape})")
    macs = B * padded_filters(N) * OH * OW * x.shape[1] * k * k       # what the microkernels do
    serial = y.size < PARALLEL_MIN and macs < PARALLEL_MIN_MACS
    p = no_pool(y.dtype) if pool is None else pool
    if ((tiled or not kk.shape[0]) and not serial and (pool is None or border.POOLED)
            and border.applies(sy, sx, pad, k, B, x.shape[1] * k * k, y.itemsize)):
        m = _no_means(y.dtype) if mean is None else mean.reshape(mean.size)
        return border.conv_forward, (y, x, wt, k, pad, kk, off, act, add, tiled, p, m), None
    y3 = y.reshape(B, N, OH * OW)
    return (_forward_serial if serial else _forward_parallel,
            (y3, x, wt, *prepared(x, k, sy, sx, pad, OH, OW, kk, off, N), pad, act, add,
             CHUNK_BYTES, PREFETCH, p),
            None if mean is None else (_means, (mean, y3)))


@njit(cache=True, nogil=True)
def _means(mean, y):
    """mean (B, N) := y (B, N, S) summed over S in order, then / S."""
    for b in range(y.shape[0]):
        for f in range(y.shape[1]):
            acc = y[b, f, 0]
            for j in range(1, y.shape[2]):
                acc += y[b, f, j]
            mean[b, f] = acc / y.shape[2]


# (at the end: the border path imports this module's microkernels)
from . import direct_fv_border as border  # noqa: E402
