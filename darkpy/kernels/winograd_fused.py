"""Winograd F(2x2, 3x3) fused per band of tile rows: input transform, the 16 products and output
transform of one band in one task, in the task's own buffers.

kernels/winograd.py runs the three steps over a whole chunk of items, each through memory: V and M
(4x the input and the output) leave the cache between the steps, and the products run as BLAS
calls on threads of their own, between two parallel regions of numba's. Here one task (a band:
whole tile rows of one item, as many as keep its V within half an L2, `band_rows`) transforms its
patches into V (16 matrices c x tiles), multiplies them by the filter transform U (16 matrices
n x c, made once per call or kept by the layer) with the register-blocked microkernels
(kernels/microgemm.py: eight filters x two or one vectors of tiles) into M, FILTER_BLOCK filters
at a time, and turns each block of M into its rows of the output at once, with the inference
epilogue (affine + activation) and the 2x2 maxpool when asked. V stays in the core's L2, M in
L1-L2; the threads never leave numba's pool. The arithmetic is kernels/winograd.py's (same
transforms), only the products sum in another order. A batch of few bands (13x13 at batch 1) gets
a whole number of bands per thread (`band_count`), and splits each band's filters into groups
(`groups`), each group's task transforming the band's input again, so both threads have work.

The layer takes it where the products' shared dimension (the input channels) is short, and for
wider layers in small batches: see `layers/conv_winograd.py`, FUSED_BANDS, for where it measured
faster and where BLAS stays ahead.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import jit, pjit
from .bn import affine_act_row
from . import simd
from .microgemm import CV, rows8x1, rows8x2
from .pool2x2 import epilogue_pool_rows
from .winograd_tiles import plane_inputs, plane_outputs

#: Values between two of a band's 16 matrices of V (and of M) beyond the matrix itself: without
#: it the 16 matrices are often a multiple of 4 KiB apart, and the transforms' 16 streams of
#: stores and loads fall into the same cache sets.
XI_PAD = 16
#: Tiles per band (whole tile rows, at least one): at most BAND_TILES, and at most as many as keep
#: a band's V and one block of its M, 16·(c + min(n, FILTER_BLOCK))·tiles values, within
#: BAND_VALUES (1 MiB in float32, half a core's L2: 128 tiles up to 96 input channels, 102 at 128,
#: 56 at 256).
BAND_TILES = 128
BAND_VALUES = 1 << 18
#: Filters whose products a band computes and finishes at a time: M holds 16·FILTER_BLOCK·tiles
#: values (128 KiB at 64 tiles), so only V sets a band's size.
FILTER_BLOCK = 32


def band_count(tiles_w: int, tiles_h: int, c: int, n: int, items: int, parts: int) -> int:
    """Bands per item for a map of tiles_h x tiles_w tiles, c input and n output channels: the
    fewest with at most the rows `band_rows` allows, and where the batch gives few bands, a whole
    number of bands per part of the work (13 tile rows at batch 1 as 5 bands leave one of two
    threads 3 of them). The parts: the forward's threads; the weight gradient's fixed slices,
    since where its bands end splits its sums (with the threads there, each thread count had its
    own rounding)."""
    bands = -(-tiles_h // band_rows(tiles_w, tiles_h, c, n))
    if items * bands < 8 * parts:
        while (items * bands) % parts and bands < tiles_h:
            bands += 1
    return bands


def band_rows(tiles_w: int, tiles_h: int, c: int, n: int) -> int:
    """The most tile rows a band of a tiles_h x tiles_w map may have over c -> n channels."""
    tiles = min(BAND_TILES, BAND_VALUES // (16 * max(c + min(n, FILTER_BLOCK), 1)))
    return max(1, min(tiles_h, tiles // max(tiles_w, 1)))


@jit(inline="always")
def _scratch_band(rows, cols, dtype):
    """`_band_inputs`' scratch band, (rows, cols), and a row of zeros after it that the vector
    transform may read (`winograd_tiles.plane_inputs`): pass the band as `sp[:rows]`."""
    sp = np.empty((rows + 1, cols), dtype)
    for j in range(cols):
        sp[rows, j] = 0
    return sp


@jit
def _band_inputs(v, x, b, pad, r0, r1, tw, cs, t0, ntp, sp):
    """v (16 rows) := V of tile rows r0..r1−1 of item b: V[ξ][ch, t] at v[ξ, ch·cs + t0 + t],
    t = (ty − r0)·tw + tx; with ntp > 0 the columns t of the band's tiles .. ntp − 1 are set to 0.
    sp: a (2·(r1 − r0) + 2, 2·tw + 2) scratch band of the zero-padded input, a row of
    `_scratch_band` after it."""
    c, h, w = x.shape[1], x.shape[2], x.shape[3]
    bh, bw = sp.shape
    nt = (r1 - r0) * tw
    for ch in range(c):
        for i in range(bh):
            yy = 2 * r0 + i - pad
            row = sp[i]
            if yy < 0 or yy >= h:
                for j in range(bw):
                    row[j] = 0
                continue
            xr = x[b, ch, yy]
            for j in range(bw):
                xx = j - pad
                row[j] = xr[xx] if 0 <= xx < w else 0
        plane_inputs(v, ch * cs + t0, sp, r1 - r0, tw)
        for xi in range(16):
            for t in range(ch * cs + t0 + nt, ch * cs + t0 + ntp):     # (V[ξ][ch] past the tiles)
                v[xi, t] = 0


@jit
def _band_products(m, u, ustr, v, vb0, vrs, vcs, f0, nf, c, ntp):
    """M[ξ] (nf, ntp) = U[ξ] (filters f0..f0+nf−1, c) @ V[ξ] (c, ntp) for the 16 ξ: M[ξ][i, t] at
    m[ξ·(nf·ntp + XI_PAD) + i·ntp + t], U[ξ][f, ch] at u[ξ·ustr + f·c + ch], V[ξ][ch, t] at
    v[vb0 + ξ·vrs + ch·vcs + t]; ntp a multiple of LANES (the columns past the band's tiles are
    read whatever they hold: their products are never used). Column blocks outside, filters
    inside: a block's c rows of V stay in L1. Eight filters at a time; the last nf % 8 one at a
    time (each as eight equal rows: correct, not fast; the layer's filter groups are whole
    eights)."""
    for xi in range(16):
        vb = vb0 + xi * vrs
        mb = xi * (nf * ntp + XI_PAD)
        ub = xi * ustr + f0 * c
        for col in range(0, ntp, CV):
            for i0 in range(0, nf - 7, 8):
                _rows8(m, mb + i0 * ntp + col, ntp, u, ub + i0 * c, c, v, vb + col, vcs, c,
                       ntp - col, False)
            for i in range(nf // 8 * 8, nf):
                _rows8(m, mb + i * ntp + col, 0, u, ub + i * c, 0, v, vb + col, vcs, c, ntp - col,
                       False)


@jit(inline="always")
def _rows8(out, ob, ostr, lhs, lb, lstr, rhs, r0, rstr, k, cols, add):
    """Eight rows of a band product (shared dimension k) over two vectors of columns, or one where
    `cols` < CV; written or (add) added."""
    if cols >= CV:
        rows8x2(out, ob, ostr, lhs, lb, lstr, rhs, r0, rstr, 0, k, add)
    else:
        rows8x1(out, ob, ostr, lhs, lb, lstr, rhs, r0, rstr, 0, k, add)


@jit(inline="always")
def _band_outputs(dst, m, i, nf, ntp, r0, r1, tw, oh, ow, add, row0):
    """Output rows of tile rows r0..r1−1 of the band's filter i (of nf) from m (16, nf·ntp +
    XI_PAD: M[ξ][i, t] at m[ξ, i·ntp + t]), into dst (a plane, or a band whose row 0 is output row
    row0): Aᵀ M A per tile, cropped at the map's edge; written or added."""
    plane_outputs(dst, 2 * r0 - row0, simd.flat(m), m.shape[1], i * ntp, r1 - r0, 2 * r0, tw,
                  oh, ow, add)


@jit(inline="always")
def kept_place(c, b, per_item, nb, chunk):
    """Where item b's V goes in the chunked path's kept V (chunks of `chunk` items, chunk j's 16
    matrices, c x its tiles T_j, XI_PAD apart, after those of the chunks before it:
    `conv_winograd._xi_rows`): (offset of chunk j's first matrix, of one matrix to the next, of
    one channel's row to the next (T_j), of the item's first tile in its chunk)."""
    j = b // chunk
    tj = min(chunk, nb - j * chunk) * per_item
    return j * 16 * (c * chunk * per_item + XI_PAD), c * tj + XI_PAD, tj, (b - j * chunk) * per_item


@pjit
def weight_grad3x3(du, x, dy, pad, bands, vk, chunk):
    """The Winograd weight gradient in bands, transposed: slice s of du (S, 16, c, np) := Σ over
    the s-th S-th of the batch's bands (`bands` per item) of V[ξ] dM[ξ]ᵀ (c x n, in np >= n
    columns, a multiple of LANES), dM = A dY Aᵀ of dy (nb, n, oh, ow) and V the transform of x
    (nb, c, h, w) padded by `pad`: read from vk (the kept V, in chunks of `chunk` items) unless it
    is empty, else made band by band. The caller sums the slices (a fixed number: the same bits
    at any thread count) and applies Gᵀ · G (`winograd.filters_adjoint_add`). Per band dMᵀ (tiles
    x np per ξ) stays in L2, each slice's sum in its own part of du; the products are the
    microkernels over eight channels x two vectors of filters, summed over the band's tiles."""
    for s in prange(du.shape[0]):
        _grad_slice(du, x, dy, pad, bands, vk, chunk, s)


#: A slice's body, compiled on its own (not inlined into `weight_grad3x3`), as `_conv_unit`.
@jit
def _grad_slice(du, x, dy, pad, bands, vk, chunk, s):
    """`weight_grad3x3`'s slice s."""
    S, c, npd = du.shape[0], du.shape[2], du.shape[3]
    nb = x.shape[0]
    oh, ow = dy.shape[2], dy.shape[3]
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    total = nb * bands
    rmax = -(-th // bands)
    xs = rmax * tw * npd + XI_PAD                       # dMᵀ: one ξ to the next
    vrs0 = c * rmax * tw + XI_PAD                       # the band's own V: one ξ to the next
    acc = du[s].reshape(16 * c * npd)
    for i in range(acc.shape[0]):
        acc[i] = 0
    dmt = np.empty(16 * xs, x.dtype)
    for i in range(dmt.shape[0]):       # (columns n.. stay 0)
        dmt[i] = 0
    own = np.empty(0 if vk.shape[0] else 16 * vrs0, x.dtype)
    sp = _scratch_band(2 * rmax + 2, 2 * tw + 2, x.dtype)
    g = np.empty(2 * rmax * 2 * tw * npd, x.dtype)
    for i in range(g.shape[0]):
        g[i] = 0
    for band in range(s * total // S, (s + 1) * total // S):
        b = band // bands
        r0 = (band % bands) * th // bands
        r1 = (band % bands + 1) * th // bands
        nt = (r1 - r0) * tw
        if vk.shape[0]:
            vb0, vrs, vcs, t0 = kept_place(c, b, th * tw, nb, chunk)
            v = vk
            vb0 += t0 + r0 * tw
        else:
            vb0, vrs, vcs = 0, vrs0, rmax * tw
            v = own
            _band_inputs(own.reshape(16, vrs0), x, b, pad, r0, r1, tw, vcs, 0, 0,
                         sp[:2 * (r1 - r0) + 2])
        _band_adjoint_t(dmt, xs, npd, dy, b, r0, r1, tw, g)
        for xi in range(16):
            lb = vb0 + xi * vrs
            ob = xi * c * npd
            for col in range(0, npd, CV):
                for ch in range(0, c - 7, 8):
                    _rows8(acc, ob + ch * npd + col, npd, v, lb + ch * vcs, vcs, dmt,
                           xi * xs + col, npd, nt, npd - col, True)
                for ch in range(c // 8 * 8, c):
                    _rows8(acc, ob + ch * npd + col, 0, v, lb + ch * vcs, 0, dmt,
                           xi * xs + col, npd, nt, npd - col, True)


@jit
def _band_adjoint_t(dmt, xs, npd, dy, b, r0, r1, tw, g):
    """dMᵀ of tile rows r0..r1−1 of item b: A dY Aᵀ (as `winograd.tile_adjoint`) of tile t of the
    band and filter f at dmt[ξ·xs + t·npd + f], LANES filters at a time. g: scratch for the band's
    rows of dy, filter-minor (row r, column col at g[(r·2·tw + col)·npd]; columns past the map
    and filters past n 0 from the start, rows past it set to 0 here)."""
    n, oh, ow = dy.shape[1], dy.shape[2], dy.shape[3]
    wr = 2 * tw * npd                                   # one row of g to the next
    for r in range(2 * (r1 - r0)):      # (filters innermost: the stores run along g, the
        oy = 2 * r0 + r                 # loads of a row's n lines of dy stay in L1)
        for col in range(ow):
            at = r * wr + col * npd
            if oy < oh:
                for f in range(n):
                    g[at + f] = dy[b, f, oy, col]
            else:
                for f in range(n):
                    g[at + f] = 0
    t = 0
    for ty in range(r1 - r0):
        for tx in range(tw):
            at = 2 * ty * wr + 2 * tx * npd
            for f0 in range(0, npd, simd.LANES):
                y00 = simd.load(g, at + f0)
                y01 = simd.load(g, at + npd + f0)
                y10 = simd.load(g, at + wr + f0)
                y11 = simd.load(g, at + wr + npd + f0)
                o = t + f0
                # A dY: 4 rows of 2, then each row (p, q) times Aᵀ: (p, p + q, p − q, −q)
                _a_store(dmt, o, xs, 0, y00, y01)
                _a_store(dmt, o, xs, 4, simd.add(y00, y10), simd.add(y01, y11))
                _a_store(dmt, o, xs, 8, simd.sub(y00, y10), simd.sub(y01, y11))
                _a_store(dmt, o, xs, 12, simd.neg(y10), simd.neg(y11))
            t += npd


@jit(inline="always")
def _a_store(dmt, o, xs, xi, p, q):
    """dmt at o in matrices xi .. xi + 3 (xs apart) := p, p + q, p − q, −q."""
    simd.store(dmt, xi * xs + o, p)
    simd.store(dmt, (xi + 1) * xs + o, simd.add(p, q))
    simd.store(dmt, (xi + 2) * xs + o, simd.sub(p, q))
    simd.store(dmt, (xi + 3) * xs + o, simd.neg(q))


#: Tasks per thread `groups` aims at where a map has few bands. One against two, alternating in
#: one process (2 threads, 2-core AVX-512 Xeon), the whole forward at batch 1: shapes-tiny
#: 0.82-0.85x the time, cifar 0.92-0.93x, darknet.cfg, tiny.cfg, yolov3-tiny and resnet50
#: 0.98x, darknet19 and yolov4-tiny level (each group's task transforms its band's input again).
TASKS_PER_THREAD = 1


def groups(n: int, bands: int, threads: int) -> int:
    """Filter groups per band: enough tasks for TASKS_PER_THREAD per thread where the map has few
    bands, each group whole microkernels of 8 filters (each task transforms its band's input
    again)."""
    want = -(-TASKS_PER_THREAD * threads // bands)
    return max(1, min(want, n // 8))


@pjit
def conv3x3(y, x, u, ustr, pad, add, k, off, act, p, bands, fgroups, vk, chunk):
    """y (nb, n, oh, ow) = (add: +=) the 3x3 stride-1 correlation of x (nb, c, h, w), padding
    `pad`, with the filters whose transform U[ξ] (n, c) starts at u[ξ·ustr] (flat, C order), by
    Winograd F(2x2, 3x3) in `bands` bands of tile rows per item (their rows differing by one at
    most), each band's filters in `fgroups` tasks.
    k, off (n,) float64 and `act`, or k empty: each finished band of a plane becomes act(y·k + off)
    (the inference epilogue). p (nb, n, oh/2, ow/2), with k given and even oh, ow: the band's 2x2
    maxima go there and y is not written; else an empty 4-d array. vk, unless empty: the bands' V
    goes there instead of a task's own buffer, in the layout of the chunked path's kept V for
    chunks of `chunk` items (`kept_place`), for the weight gradient (several filter groups' tasks
    each write their band's V there: the same values)."""
    for unit in prange(bands * fgroups * x.shape[0]):
        _conv_unit(y, x, u, ustr, pad, add, k, off, act, p, bands, fgroups, vk, chunk, unit)


#: A task's body, compiled on its own (not inlined into `conv3x3`), and so are the band's input
#: transform and products: numba copies an inlined function's IR at each call site and runs its
#: parallel passes over the whole body (the kernel's first call compiled for 32.7 s, 16.4 s now).
@jit
def _conv_unit(y, x, u, ustr, pad, add, k, off, act, p, bands, fgroups, vk, chunk, unit):
    """`conv3x3`'s task `unit`: filter group unit % fgroups of band unit // fgroups."""
    c = x.shape[1]
    n, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    fs = (n + 8 * fgroups - 1) // (8 * fgroups) * 8          # filters per group
    pooled = p.shape[0] > 0
    band = unit // fgroups
    f0 = (unit % fgroups) * fs
    nf = min(n, f0 + fs) - f0
    if nf <= 0:
        return
    b = band // bands
    r0 = (band % bands) * th // bands
    r1 = (band % bands + 1) * th // bands
    ntp = ((r1 - r0) * tw + simd.LANES - 1) // simd.LANES * simd.LANES
    sp = _scratch_band(2 * (r1 - r0) + 2, 2 * tw + 2, x.dtype)
    if vk.shape[0]:                     # V straight into the kept buffer
        vb0, vrs, vcs, t0 = kept_place(c, b, th * tw, x.shape[0], chunk)
        v = vk
        _band_inputs(v[vb0:vb0 + 16 * vrs].reshape(16, vrs), x, b, pad, r0, r1, tw, vcs,
                     t0 + r0 * tw, 0, sp[:-1])
        vb0 += r0 * tw + t0
    else:
        vb0, vrs, vcs = 0, c * ntp + XI_PAD, ntp
        v = np.empty(16 * vrs, x.dtype)
        _band_inputs(v.reshape(16, vrs), x, b, pad, r0, r1, tw, ntp, 0, ntp, sp[:-1])
    m = np.empty(16 * (FILTER_BLOCK * ntp + XI_PAD), x.dtype)
    lo, hi = 2 * r0, min(2 * r1, oh)            # the band's output rows
    band_out = np.empty((hi - lo if pooled else 0, ow), y.dtype)
    for fb in range(f0, f0 + nf, FILTER_BLOCK):
        nfb = min(FILTER_BLOCK, f0 + nf - fb)
        _band_products(m, u, ustr, v, vb0, vrs, vcs, fb, nfb, c, ntp)
        m2 = m[:16 * (nfb * ntp + XI_PAD)].reshape(16, nfb * ntp + XI_PAD)
        for i in range(nfb):
            f = fb + i
            if pooled:
                _band_outputs(band_out, m2, i, nfb, ntp, r0, r1, tw, oh, ow, False, lo)
                epilogue_pool_rows(p[b, f, r0:r1], band_out, k[f], off[f], act)
                continue
            _band_outputs(y[b, f], m2, i, nfb, ntp, r0, r1, tw, oh, ow, add, 0)
            if k.shape[0]:
                affine_act_row(simd.flat(y[b, f])[lo * ow:hi * ow], k[f], off[f], act)
