"""Direct convolution across filters without padded copies, for padded stride-1 layers in a batch:
each output position computes only its taps that fall inside the input, as ONNX Runtime's NCHWc
kernels do at the borders. Nothing is copied into zero-padded planes and no zero is multiplied: a
3x3 'same' layer on a 4x4 map has 100 of its 144 tap-positions per channel inside (0.69 of the
work), on an 8x8 map 484 of 576 (0.84).

With padding p, output row oy reads the kernel rows ky in [max(0, p − oy), min(k, H + p − oy)):
one range for every row but the first and last few, and likewise for columns. The positions with
the same two ranges form a class (at most (2p+1)² of them: the corners, the edges, the inside). A
class's taps are its (c, ky, kx) in the padded path's order, so each output is the padded path's
sum less its zero products, which leave a sum as it is: the same bits (but for the sign of a zero
sum, and a product of a padding zero with an infinite weight, which is NaN there).

A class's positions are taken across the items of a block of pv items (as many as a microkernel
has positions), so the microkernels stay full: a 4x4 map's corner class is 8 positions, one
`_tile8` call per block. The tables of a block's classes (`tables`) depend on the layer's shape
only, so they are built once per shape and kept: one block's positions serve every block at its
offset, and a batch that is not a whole number of blocks has its last block's tables too. (Built at
every call over the whole batch, they took 7.8 µs of digits' 32 -> 64 on 4x4 at b64 and 14.8 µs of
its 16 -> 32 on 8x8, before the parallel region; digits' forward at b64, alternating processes,
2 threads: 0.85-0.97x the time with them kept.) The microkernels are
`direct_fv`'s, reading the unpadded planes in place through tap offsets relative to each
position's first tap (possibly before the map's first value, never read), with the class's tap
indices into the weight blocks (`tidx`). Each tile goes through the epilogue in vectors and is
scattered position by position into NCHW.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import prange

from . import njit, simd
from .direct_fv import (CHUNK_BYTES, _epilogue_tile, _pool_run, _pools_first, _unit_jit,
                        tile_positions)
from .fv_planes import _padded
from .fv_tiles import FV, NO_PREFETCH, _jit, _serial, block_at, run_tile

#: Take padded stride-1 layers in batches of at least MIN_ITEMS items (fewer: a small map's classes
#: fill few microkernels; the padded path runs). False: never. Measured against the padded path,
#: alternating in one process (2 threads, 2-core AVX-512 Xeon; the same bits): digits' inference at
#: b64 0.91-0.95x the time (its 32 -> 64 on 4x4 alone 153-161 against 180 µs), its training step
#: at b32 0.95-0.99x (forwards and input gradients); shapes-tiny's inference at b64 and training
#: at b32 level (0.99-1.03x; its 64 -> 128 on 8x8 alone at b64 0.88x).
BORDER = True
MIN_ITEMS = 8
#: ... also where the layer writes its 2x2 maxpool (`direct_fv.writes_pooled`): digits' inference
#: at b64 0.98-1.00x the time against the padded path's pooled forward (its 16 -> 32 on 8x8).
POOLED = True


def applies(sy: int, sx: int, pad: int, k: int, batch: int, taps: int, itemsize: int) -> bool:
    """Whether `conv_forward` takes a layer: stride 1, padding 1 to k − 1 (every position keeps a
    tap), a batch of MIN_ITEMS or more, and one chunk of weights (`direct_fv.CHUNK_BYTES`)."""
    return (BORDER and sy == 1 and sx == 1 and 0 < pad < k and batch >= MIN_ITEMS
            and taps * FV * itemsize <= CHUNK_BYTES)


@_serial
def _ranges(n, size, k, pad):
    """(class of each of the n output rows (or columns), first and last-plus-one kernel row of
    each class, class count) for an input of `size` rows at stride 1: runs of equal ranges."""
    cls = np.empty(n, np.int64)
    lo = np.empty(n, np.int64)
    hi = np.empty(n, np.int64)
    m = 0
    for o in range(n):
        a, b = max(0, pad - o), min(k, size + pad - o)
        if m == 0 or a != lo[m - 1] or b != hi[m - 1]:
            lo[m], hi[m] = a, b
            m += 1
        cls[o] = m - 1
    return cls, lo, hi, m


@_serial
def _tables(nb, C, H, W, N, k, pad, oh, ow, pv):
    """The classes' taps and positions over a block of nb items, offsets from the block's first
    item: (tap starts (classes + 1), tap offsets, tap indices, position starts (classes + 1), each
    class's end of the positions written, source offsets, destination offsets). A class's
    positions go item after item; its last are padded to a whole microkernel of pv positions by
    repeating its last position (computed again, not written)."""
    rc, rlo, rhi, nr = _ranges(oh, H, k, pad)
    qc, qlo, qhi, nq = _ranges(ow, W, k, pad)
    ncls = nr * nq
    tstart = np.zeros(ncls + 1, np.int64)
    for r in range(nr):
        for q in range(nq):
            cl = r * nq + q
            tstart[cl + 1] = tstart[cl] + C * (rhi[r] - rlo[r]) * (qhi[q] - qlo[q])
    toff = np.empty(tstart[ncls], np.int64)
    tidx = np.empty(tstart[ncls], np.int64)
    for r in range(nr):
        for q in range(nq):
            i = tstart[r * nq + q]
            for c in range(C):
                for ky in range(rlo[r], rhi[r]):
                    for kx in range(qlo[q], qhi[q]):
                        toff[i] = (c * H + ky) * W + kx
                        tidx[i] = (c * k + ky) * k + kx
                        i += 1
    per_item = np.zeros(ncls, np.int64)
    for oy in range(oh):
        for ox in range(ow):
            per_item[rc[oy] * nq + qc[ox]] += 1
    pstart = np.zeros(ncls + 1, np.int64)
    for cl in range(ncls):
        pstart[cl + 1] = pstart[cl] + -(-per_item[cl] * nb // pv) * pv
    pos = np.empty(pstart[ncls], np.int64)
    dst = np.empty(pstart[ncls], np.int64)
    filled = pstart[:ncls].copy()
    for b in range(nb):
        for oy in range(oh):
            for ox in range(ow):
                cl = rc[oy] * nq + qc[ox]
                j = filled[cl]
                pos[j] = (b * C * H + oy - pad) * W + ox - pad
                dst[j] = b * N * oh * ow + oy * ow + ox
                filled[cl] += 1
    for cl in range(ncls):
        for j in range(filled[cl], pstart[cl + 1]):
            pos[j] = pos[filled[cl] - 1]
    return tstart, toff, tidx, pstart, filled, pos, dst


#: Layer shapes whose tables `tables` keeps (a few KB to a few MB each: one block's positions).
TABLES_KEPT = 64


@functools.lru_cache(maxsize=TABLES_KEPT)
def tables(B, C, H, W, N, k, pad, oh, ow, pv):
    """`_tables` of a whole block of pv items, followed by those of the batch's last block where
    it has fewer (B % pv items): its classes numbered from the first block's class count on, its
    positions after the first block's. Built once per shape; the arrays are shared by every call,
    never written."""
    full = _tables(pv, C, H, W, N, k, pad, oh, ow, pv)
    if B % pv == 0:
        return full
    tstart, toff, tidx, pstart, filled, pos, dst = full
    _, _, _, pstart2, filled2, pos2, dst2 = _tables(B % pv, C, H, W, N, k, pad, oh, ow, pv)
    n = pos.shape[0]
    return (tstart, toff, tidx, np.concatenate((pstart, pstart2[1:] + n)),
            np.concatenate((filled, filled2 + n)), np.concatenate((pos, pos2)),
            np.concatenate((dst, dst2)))


@_jit
def _run(yf, src, s0, d0, wt, taps, N, S, toff, tidx, t0, t1, pos, dst, lo, hi, end, f0, k, off,
         act, add, epilogue, pv, tile, run, sums):
    """Positions lo..hi−1 of a class in a block's tables (its taps t0..t1−1; the positions from
    `end` on its last repeated), the block's items from src[s0] and yf[d0], x the FV filters from
    f0: tile by tile through the epilogue on the tiles (`epilogue`), scattered into yf (added with
    `add`) at d0 + dst + f·S; or, with a run (a pooled output), each position's FV values copied
    to the run of its item in the block (S positions x FV filters each); or, with sums (the maps'
    means), added to the sums of its item in the block (FV each)."""
    nf = min(FV, N - f0)
    w0 = block_at(f0, taps)
    inside = t1 - t0 == taps        # every tap, in order: tidx[t] = t − t0
    for p0 in range(lo, hi, pv):
        npos = min(pv, end - p0)
        if inside:      # without the table (`fv_tiles._tap`), the weights from tap t0 on
            run_tile(pv, npos, tile, src, s0, wt, w0 - t0 * FV, toff, None, t0, t1, False, pos, p0,
                     NO_PREFETCH)
        else:
            run_tile(pv, npos, tile, src, s0, wt, w0, toff, tidx, t0, t1, False, pos, p0,
                     NO_PREFETCH)
        if epilogue:
            _epilogue_tile(tile, npos, k, off, f0, act)
        for i in range(npos):
            if sums.shape[0]:
                r = dst[p0 + i] // (N * S) * FV
                for h in range(0, FV, simd.LANES):
                    simd.store(sums, r + h, simd.add(simd.load(sums, r + h),
                                                     simd.load(tile, i * FV + h)))
                continue
            if run.shape[0]:
                r = (dst[p0 + i] // (N * S) * S + dst[p0 + i] % (N * S)) * FV
                for h in range(0, FV, simd.LANES):
                    simd.store(run, r + h, simd.load(tile, i * FV + h))
                continue
            d = d0 + dst[p0 + i] + f0 * S
            if add:
                for f in range(nf):
                    yf[d + f * S] += tile[i * FV + f]
            else:
                for f in range(nf):
                    yf[d + f * S] = tile[i * FV + f]


@_unit_jit
def _units(yf, src, wt, taps, items, N, S, B, tstart, toff, tidx, pstart, filled, pos, dst, lo, hi,
           k, off, act, add, tiled, pv, p, m):
    """Units lo..hi−1, unit u the FV filters of group u // blocks over the items of block u %
    blocks (pv items, the tables' first block; the last block's own where it has fewer), class by
    class: the block's inputs and outputs stay in the L1 cache while its classes' tiles read and
    write them (a class's positions over all items at once read the whole batch's input per tile:
    digits' 32 -> 64 on 4x4 at b64 ran 1.15x the padded path's time). With a pooled output p, the
    block's maps are kept in runs, then pooled (`direct_fv._pool_run`, the epilogue after the
    maxima where `pools_first` holds). With means m (B·N, not empty), each map's values are summed
    as the tiles come (in the classes' order), then divided by S."""
    tile = np.empty(pv * FV, yf.dtype)
    pooled = p.shape[0] > 0
    run = np.empty(pv * S * FV if pooled else 0, yf.dtype)
    pt = np.empty(FV, yf.dtype)
    sums = np.empty(pv * FV if m.shape[0] else 0, yf.dtype)
    blocks = -(-B // pv)
    ncls = tstart.shape[0] - 1
    for u in range(lo, hi):
        f0, b0 = u // blocks * FV, u % blocks * pv
        nf = min(FV, N - f0)
        late = pooled and _pools_first(k, off, act, f0, nf)
        c0 = 0 if b0 + pv <= B else ncls        # the last block's classes where it is short
        sums[:] = 0
        for cl in range(ncls):
            _run(yf, src, b0 * items, b0 * N * S, wt, taps, N, S, toff, tidx, tstart[cl],
                 tstart[cl + 1], pos, dst, pstart[c0 + cl], pstart[c0 + cl + 1], filled[c0 + cl],
                 f0, k, off, act, add, tiled and not late, pv, tile, run, sums)
        if sums.shape[0]:
            for b in range(b0, min(b0 + pv, B)):
                for f in range(nf):
                    m[b * N + f0 + f] = sums[(b - b0) * FV + f] / S
        if pooled:
            for b in range(b0, min(b0 + pv, B)):
                _pool_run(p, b, f0, nf, run[(b - b0) * S * FV:], pt, k if late else k[:0], off,
                          act)


@njit(cache=True, nogil=True, parallel=True)
def _forward_parallel(y, x, wt, k, kk, off, act, add, tiled, p, m, threads, tstart, toff, tidx,
                      pstart, filled, pos, dst, pv):
    B, N, oh, ow = y.shape
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    groups = -(-N // FV)
    kp, op = _padded(kk, groups * FV), _padded(off, groups * FV)
    units = groups * -(-B // pv)
    parts = min(threads, units)
    yf, xf = y.reshape(y.size), x.reshape(x.size)
    for i in prange(parts):     # as prange's own static split of the units
        _units(yf, xf, wt, C * k * k, C * H * W, N, oh * ow, B, tstart, toff, tidx, pstart, filled,
               pos, dst, i * units // parts, (i + 1) * units // parts, kp, op, act, add, tiled, pv,
               p, m)


def conv_forward(y, x, wt, k, pad, kk, off, act, add, tiled, p, m, threads):
    """`direct_fv.conv_forward` for a layer that `applies`: y (B, N, OH, OW) := (with `add`: +=)
    the stride-1 correlation of x with the filters laid out by `filters_last` in wt, zero padding
    `pad`; through the epilogue kk, off, act on the tiles when `tiled` (else kk is empty). With a
    pooled output p (not empty, `tiled`), its 2x2 maxima go there instead of y; with means m (B·N,
    not empty, `tiled`, not `add`), each output map's mean."""
    B, N, oh, ow = y.shape
    C, H, W = x.shape[1:]
    pv = tile_positions(C * k * k, oh * ow)
    tstart, toff, tidx, pstart, filled, pos, dst = tables(B, C, H, W, N, k, pad, oh, ow, pv)
    _forward_parallel(y, x, wt, k, kk, off, act, add, tiled, p, m, threads, tstart, toff, tidx,
                      pstart, filled, pos, dst, pv)
