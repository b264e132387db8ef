"""Winograd F(2x2, 3x3): 3x3 stride-1 convolution with 2.25x fewer multiplications than im2col + GEMM.

Every 2x2 block ("tile") of output positions depends on a 4x4 patch of the input. Winograd's minimal
filtering algorithm (Lavin & Gray 2015) computes the tile as

    Y = Aᵀ [ (G g Gᵀ) ⊙ (Bᵀ d B) ] A          g: 3x3 filter, d: 4x4 input patch, ⊙ elementwise

so summed over input channels, each of the 16 positions ξ of the 4x4 transformed domain is an
ordinary matrix product:  M[ξ] (n, tiles) = U[ξ] (n, c) @ V[ξ] (c, tiles),  with
U = G g Gᵀ (the filters, transformed once per forward) and V = Bᵀ d B (the input patches). The 16
GEMMs do 16·n·c multiply-adds per tile where im2col does 36, and V holds 4 values per input
position where im2col's column matrix holds 9. Like im2col this computes a cross-correlation, as
Darknet's convolution does.

The kernels are the transforms: `filters` (g -> U), `inputs` (x -> V, zero padding read outside
the image) and `outputs` (M -> y, writing or ADDING the 2x2 tiles, cropping the last row and column
of tiles when the output size is odd); the layer runs the 16 products `U[ξ] @ V[ξ]` between them
(`darkpy.blas.matmul`, as concurrent streams). `inputs` writes V as 16 C-contiguous rows, one per ξ,
each holding V[ξ]'s (c, tiles) matrix (and possibly padding after it). The input gradient is the same algorithm on the delta with the filters flipped and
transposed. The weight gradient uses the adjoints: `outputs_adjoint` (dY -> dM = A dY Aᵀ), the 16
GEMMs dU[ξ] = dM[ξ] @ V[ξ]ᵀ, and `filters_adjoint_add` (dW += Gᵀ dU G) — exactly the convolution's
weight gradient, since the forward computes exactly the convolution.

Numerics: the transforms add and subtract (no division except G's exact halves), so the result
differs from the direct sum only by float rounding, a few ulps of the summed magnitudes; the layer
uses this path only where it measured faster (see `layers/convolutional.py`).

Matrices (F(2x2, 3x3)):
    Bᵀ = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
    G  = [1 0 0; ½ ½ ½; ½ -½ ½; 0 0 1]
    Aᵀ = [1 1 1 0; 0 1 -1 -1]
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import PARALLEL_MIN, jit, pjit, simd
from .borrow import borrowed, keep
from .bn import affine_act_row
from .pool2x2 import epilogue_pool_rows, no_pool
from .vecmath import row_sum


def tiles(out_h: int, out_w: int) -> tuple[int, int]:
    """Tile rows and columns covering an out_h x out_w output (the last ones may be half used)."""
    return (out_h + 1) // 2, (out_w + 1) // 2


@jit
def _g_cols(g0, g1, g2):
    """G·(g0, g1, g2)ᵀ: one column of a 3x3 filter to 4 values (the same for a row times Gᵀ)."""
    h = 0.5 * (g0 + g2)
    return g0, h + 0.5 * g1, h - 0.5 * g1, g2


@pjit
def filters(u, w):
    """u: (16, n, c) output, U[ξ][f, ch] = (G g Gᵀ)[ξ // 4, ξ % 4] for each 3x3 filter g = w[f, ch]
    of w (n, c, 3, 3); u's rows u[ξ, f] contiguous. Filter by filter (`_filter_row`). Serial below
    PARALLEL_MIN values of U."""
    n = w.shape[0]
    if 16 * n * w.shape[1] < PARALLEL_MIN:
        for f in range(n):
            _filter_row(u, w, f)
    else:
        for f in prange(n):
            _filter_row(u, w, f)


@jit
def _filter_row(u, w, f):
    """Filter f of `filters`: its channels LANES at a time (`_filter_lanes`) from its taps copied
    tap-major into a scratch, the last c % LANES one by one (`_filter`). The same operations on
    the same types lane by lane as `_filter` (G's halves in float64 where its scalar code widens):
    the same bits. Against pair by pair in one parallel loop (float32, U's rows padded as the
    layer's, 2 threads, 2-core Zen 5): 512 -> 512 0.83 -> 0.63 ms, its flipped filters (the input
    gradient's, strided) 0.95 -> 0.56; 1024 -> 512 2.03 -> 1.28 and 2.19 -> 1.42 ms; in
    darknet19's training step at b16 the 20 transforms 23.3 -> 20.3-22.7 ms. Writing U (16 values
    for every 9 weights) bounds it now."""
    c = w.shape[1]
    u, w = borrowed(u), borrowed(w)
    full = c - c % simd.LANES if u.strides[2] == u.itemsize else 0
    if full:
        made = np.empty(9 * full, w.dtype)
        taps = borrowed(made)
        for ch in range(full):
            for ky in range(3):
                for kx in range(3):
                    taps[(3 * ky + kx) * full + ch] = w[f, ch, ky, kx]
        for ch0 in range(0, full, simd.LANES):
            _filter_lanes(u, taps, f, full, ch0)
        keep(made)
    for ch in range(full, c):
        _filter(u, w, f * c + ch)


@jit(inline="always")
def _filter_lanes(u, taps, f, full, ch0):
    """U of filter f for channels ch0..ch0+LANES−1, from `taps` (tap k of channel ch at
    taps[k·full + ch])."""
    g00, g01 = simd.load(taps, ch0), simd.load(taps, full + ch0)
    g02, g10 = simd.load(taps, 2 * full + ch0), simd.load(taps, 3 * full + ch0)
    g11, g12 = simd.load(taps, 4 * full + ch0), simd.load(taps, 5 * full + ch0)
    g20, g21 = simd.load(taps, 6 * full + ch0), simd.load(taps, 7 * full + ch0)
    g22 = simd.load(taps, 8 * full + ch0)
    t00, t10, t20, t30 = _g_lanes(g00, g10, g20)
    t01, t11, t21, t31 = _g_lanes(g01, g11, g21)
    t02, t12, t22, t32 = _g_lanes(g02, g12, g22)
    _store_row(u, 0, f, ch0, _g_lanes(t00, t01, t02))
    _store_row(u, 4, f, ch0, _g_lanes(t10, t11, t12))
    _store_row(u, 8, f, ch0, _g_lanes(t20, t21, t22))
    _store_row(u, 12, f, ch0, _g_lanes(t30, t31, t32))


@jit(inline="always")
def _g_lanes(g0, g1, g2):
    """`_g_cols` lane by lane, with its types: g0 + g2 in the vectors' dtype, the rest in float64
    (as its scalar code promotes them), g0 and g2 passed through."""
    s = simd.widen(simd.add(g0, g2))
    half = simd.splat(s, 0.5)
    h = simd.mul(half, s)
    q = simd.mul(half, simd.widen(g1))
    return g0, simd.add(h, q), simd.sub(h, q), g2


@jit(inline="always")
def _store_row(u, xi, f, ch0, row):
    """u[xi + j, f, ch0:ch0+LANES] := row[j] (rounded to u's dtype), j = 0..3."""
    _store_lanes(u, xi, f, ch0, row[0])
    _store_lanes(u, xi + 1, f, ch0, row[1])
    _store_lanes(u, xi + 2, f, ch0, row[2])
    _store_lanes(u, xi + 3, f, ch0, row[3])


@jit(inline="always")
def _store_lanes(u, xi, f, ch0, v):
    """u[xi, f, ch0:ch0+LANES] := v, rounded to u's dtype."""
    dst = simd.unit_stride(u[xi, f])
    simd.store(dst, ch0, simd.cast_like(dst, v))


@jit(inline="always")
def _filter(u, w, nc):
    """Filter-channel pair nc = f·c + ch of `filters`."""
    c = w.shape[1]
    f = nc // c
    ch = nc % c
    g = w[f, ch]
    # G g: column j of g becomes column j of the 4x3 matrix t
    t00, t10, t20, t30 = _g_cols(g[0, 0], g[1, 0], g[2, 0])
    t01, t11, t21, t31 = _g_cols(g[0, 1], g[1, 1], g[2, 1])
    t02, t12, t22, t32 = _g_cols(g[0, 2], g[1, 2], g[2, 2])
    # (G g) Gᵀ: row i of t becomes row i of U
    u[0, f, ch], u[1, f, ch], u[2, f, ch], u[3, f, ch] = _g_cols(t00, t01, t02)
    u[4, f, ch], u[5, f, ch], u[6, f, ch], u[7, f, ch] = _g_cols(t10, t11, t12)
    u[8, f, ch], u[9, f, ch], u[10, f, ch], u[11, f, ch] = _g_cols(t20, t21, t22)
    u[12, f, ch], u[13, f, ch], u[14, f, ch], u[15, f, ch] = _g_cols(t30, t31, t32)


@jit
def _bt_col(d0, d1, d2, d3):
    """Bᵀ·(d0..d3)ᵀ: one column of a 4x4 patch to 4 values (the same for a row times B)."""
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


#: Tiles per work item of `inputs`: planes with fewer tiles (small maps) are taken several at a time,
#: so each work item amortises its scratch plane.
INPUT_BLOCK_TILES = 64


@pjit
def inputs(v, x, pad):
    """v: (16, >= c·T) output rows, C-contiguous, T = nb·th·tw: V[ξ][ch, t] at v[ξ, ch·T + t], tile
    index t = (b·th + ty)·tw + tx; x: (nb, c, h, w) input. The tile (ty, tx) reads the 4x4 patch d
    at rows 2·ty − pad.., columns 2·tx − pad.. (zero outside the image); V = Bᵀ d B. The tile grid
    covers the output of a 3x3 stride-1 kernel, (h + 2·pad − 2) x (w + 2·pad − 2).

    Per plane: a copy into a zero-bordered scratch plane (so no tile tests the image's edges), then
    each tile's 16 values straight from its 4x4 patch, written into the 16 rows of `v`. Measured on
    one core of a Zen 3 VM (2026-12-02) against the previous version (Bᵀ d per band of rows, then B
    per tile, written by index into a (16, c, tiles) view): 2.3-2.9x faster on 4x4 and 8x8 maps
    (0.75-0.95 against 1.8-2.8 ns per value of V), 1.1-1.6x on 16x16 to 64x64 maps."""
    nb, c, h, w = x.shape
    th = (h + 2 * pad - 1) // 2
    tw = (w + 2 * pad - 1) // 2
    per_plane = th * tw
    T = nb * per_plane
    hp = 2 * th + 2                         # the padded plane: every row and column a tile reads
    wp = 2 * tw + 2                         # (>= h + 2·pad and w + 2·pad)
    planes = c * nb
    per = max(1, INPUT_BLOCK_TILES // per_plane)
    for blk in prange((planes + per - 1) // per):
        p = np.empty((hp + 1, wp), x.dtype)     # (a row past the plane: `plane_inputs`)
        for i in range(hp + 1):             # (loops: np.zeros here would be a parallel region)
            for j in range(wp):
                p[i, j] = 0                 # the border stays 0; the image part is overwritten
        for cb in range(blk * per, min(planes, (blk + 1) * per)):
            ch = cb // nb
            b = cb % nb
            for yy in range(h):
                pr = p[yy + pad]
                xr = x[b, ch, yy]
                for xx in range(w):
                    pr[xx + pad] = xr[xx]
            plane_inputs(v, ch * T + b * per_plane, p, th, tw)


@jit(inline="always")
def tile_inputs(v, t, r0, r1, r2, r3, j):
    """V = Bᵀ d B of the tile whose 4x4 patch d is columns j..j+3 of the rows r0..r3, into
    v[0..15, t]."""
    # Bᵀ d, column by column: s{j}{i} is its row i, column j
    s00, s01, s02, s03 = _bt_col(r0[j], r1[j], r2[j], r3[j])
    s10, s11, s12, s13 = _bt_col(r0[j + 1], r1[j + 1], r2[j + 1], r3[j + 1])
    s20, s21, s22, s23 = _bt_col(r0[j + 2], r1[j + 2], r2[j + 2], r3[j + 2])
    s30, s31, s32, s33 = _bt_col(r0[j + 3], r1[j + 3], r2[j + 3], r3[j + 3])
    # (Bᵀ d) B, row by row: row i gives V[4·i .. 4·i + 3]
    v[0, t], v[1, t], v[2, t], v[3, t] = _bt_col(s00, s10, s20, s30)
    v[4, t], v[5, t], v[6, t], v[7, t] = _bt_col(s01, s11, s21, s31)
    v[8, t], v[9, t], v[10, t], v[11, t] = _bt_col(s02, s12, s22, s32)
    v[12, t], v[13, t], v[14, t], v[15, t] = _bt_col(s03, s13, s23, s33)


@jit(inline="always")
def plane_inputs(v, t, p, rows, tw):
    """`tile_inputs` for `rows` rows of tw tiles whose patches lie in the C-contiguous plane p
    (2·rows + 2 rows of 2·tw + 2 values, followed in memory by another row, which may hold
    anything): V of tile (ty, tx) into v[0..15, t + ty·tw + tx] (v's rows each contiguous).
    Rows of at least LANES/2 tiles in vectors (`_row_vec`), shorter ones tile by tile."""
    if tw >= simd.LANES // 2:
        for ty in range(rows):
            _row_vec(v, t + ty * tw, p[2 * ty], p[2 * ty + 1], p[2 * ty + 2], p[2 * ty + 3], tw)
        return
    for ty in range(rows):
        r0, r1, r2, r3 = p[2 * ty], p[2 * ty + 1], p[2 * ty + 2], p[2 * ty + 3]
        for tx in range(tw):
            tile_inputs(v, t, r0, r1, r2, r3, 2 * tx)
            t += 1


@jit(inline="always")
def _row_vec(v, t, r0, r1, r2, r3, tw):
    """`tile_inputs` for the tiles tx = 0..tw−1 of one row of tiles (patch columns 2·tx..2·tx+3
    of the rows r0..r3; see `plane_inputs`) into v[0..15, t + tx], for tw >= LANES/2: LANES
    tiles at a time in vectors (a row's even and odd columns split by `simd.evens` / `odds`;
    each lane the scalar arithmetic, so the same values), the last vector overlapping the one
    before where tw is not a whole number of them; below LANES tiles two overlapping half
    vectors (their other lanes read past the tiles, into r3's next row at the last, and are
    dropped). One call site of `_tiles_vec` for all of them: with one per kind (whole,
    overlapping, half) the same rows ran 2x slower. Against tile by tile, one item's whole map
    as one band (`_band_inputs`, one thread, 2-core Zen 5, AVX-512): 128 channels of 28x28 116 ->
    56 µs, 32 of 32x32 36 -> 11, 64 of 52x52 190 -> 72; `inputs` on 16 items of 128 x 28x28 2.4
    -> 1.5-1.9 ms. Alternating processes with the tile-by-tile commit (2 threads,
    `benchmarks.step_time`): shapes-tiny's forward at b64 12.0-12.3 -> 11.0-11.3 ms, its training
    step at b32 25.5-25.7 -> 24.7-24.8 ms, cifar's at b128 1167-1218 -> 1115-1145 ms,
    yolov4-tiny's forward at b1 (min) 14.8-16.5 -> 13.9-14.1 ms."""
    low = tw < simd.LANES
    step = simd.LANES // 2 if low else simd.LANES
    for i in range((tw + step - 1) // step):
        tx = min(i * step, tw - step)
        _tiles_vec(v, t + tx, r0, r1, r2, r3, 2 * tx, low)


@jit(inline="always")
def _tiles_vec(v, t, r0, r1, r2, r3, j, low):
    """V of LANES tiles whose patches start at column j, j + 2, ... of the rows r0..r3, into
    v[0..15, t..t+LANES−1]; with `low`, only the first LANES/2 tiles' (`simd.store_low`)."""
    a0, a1, a2, a3 = _patch_cols(r0, j)
    b0, b1, b2, b3 = _patch_cols(r1, j)
    c0, c1, c2, c3 = _patch_cols(r2, j)
    d0, d1, d2, d3 = _patch_cols(r3, j)
    # Bᵀ d, column by column: s{j}{i} is its row i, column j
    s00, s01, s02, s03 = _bt_vec(a0, b0, c0, d0)
    s10, s11, s12, s13 = _bt_vec(a1, b1, c1, d1)
    s20, s21, s22, s23 = _bt_vec(a2, b2, c2, d2)
    s30, s31, s32, s33 = _bt_vec(a3, b3, c3, d3)
    # (Bᵀ d) B, row by row: row i gives V[4·i .. 4·i + 3]
    _store4(v, 0, t, _bt_vec(s00, s10, s20, s30), low)
    _store4(v, 4, t, _bt_vec(s01, s11, s21, s31), low)
    _store4(v, 8, t, _bt_vec(s02, s12, s22, s32), low)
    _store4(v, 12, t, _bt_vec(s03, s13, s23, s33), low)


@jit(inline="always")
def _patch_cols(r, j):
    """Columns j + 2·l, j + 2·l + 1, j + 2·l + 2 and j + 2·l + 3 of the row r for the lanes
    l = 0..LANES−1: the four columns of LANES tiles' patches in one row."""
    L = simd.LANES
    a = simd.load(r, j)
    b = simd.load(r, j + L)
    c = simd.load(r, j + 2)
    d = simd.load(r, j + 2 + L)
    return simd.evens(a, b), simd.odds(a, b), simd.evens(c, d), simd.odds(c, d)


@jit(inline="always")
def _bt_vec(d0, d1, d2, d3):
    """`_bt_col` in every lane."""
    return simd.sub(d0, d2), simd.add(d1, d2), simd.sub(d2, d1), simd.sub(d1, d3)


@jit(inline="always")
def _store4(v, xi, t, q, low):
    """The four vectors q into rows xi..xi+3 of v from column t (with `low`, their first halves)."""
    if low:
        simd.store_low(simd.unit_stride(v[xi]), t, q[0])
        simd.store_low(simd.unit_stride(v[xi + 1]), t, q[1])
        simd.store_low(simd.unit_stride(v[xi + 2]), t, q[2])
        simd.store_low(simd.unit_stride(v[xi + 3]), t, q[3])
    else:
        simd.store(simd.unit_stride(v[xi]), t, q[0])
        simd.store(simd.unit_stride(v[xi + 1]), t, q[1])
        simd.store(simd.unit_stride(v[xi + 2]), t, q[2])
        simd.store(simd.unit_stride(v[xi + 3]), t, q[3])


@jit(inline="always")
def tile_outputs(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15):
    """Aᵀ m A of one tile's 16 products (ξ = 4·i + j): its 2x2 outputs y00, y01, y10, y11."""
    # Aᵀ m: two rows of 4, then (Aᵀ m) A: two columns
    a0, a1, a2, a3 = m0 + m4 + m8, m1 + m5 + m9, m2 + m6 + m10, m3 + m7 + m11
    b0, b1, b2, b3 = m4 - m8 - m12, m5 - m9 - m13, m6 - m10 - m14, m7 - m11 - m15
    return a0 + a1 + a2, a1 - a2 - a3, b0 + b1 + b2, b1 - b2 - b3


@jit(inline="always")
def plane_outputs(dst, r, mf, xs, t, rows, oy0, tw, oh, ow, add):
    """`tile_outputs` of `rows` rows of tw tiles into dst (C-contiguous, ow wide), written or added
    (`add`): M[ξ] of tile (ty, tx) is mf[ξ·xs + t + ty·tw + tx] (mf 1-D); tile row ty covers the
    map's output rows oy0 + 2·ty, oy0 + 2·ty + 1 (oh x ow, cropped there) and goes to dst's rows
    r + 2·ty, r + 2·ty + 1. The tiles with both columns in the map LANES at a time in vectors,
    then LANES/2 (`_tiles_out_vec`), the others tile by tile. Everything by index into 1-D
    arrays: row views made in the loops (m[ξ], dst[r]) cost reference counting at each, and the
    kernel ran slower than tile by tile; so did numba's indexing, whose sign test per index (16
    distinct ones a tile) made the tile-by-tile loop 2x slower than `simd.get`. Against tile by
    tile (one thread, 2-core Zen 5, AVX-512): `outputs` of 16 items x 128 filters on 28x28 2.0 ->
    1.4 ms, of 32 x 32 on 32x32 1.2 -> 0.45, of 8 x 64 on 52x52 1.6 -> 0.65; the fused bands' 32
    filters on 28x28, 32x32 and 52x52 33 -> 24, 38 -> 19 and 82 -> 34 µs; 14x14 and 7x7 maps (tile
    by tile in both) 1.0-1.1x the time. Processes alternating with the commit before (2 threads):
    shapes-tiny's forward at b64 0.93-0.96x the time, yolov4-tiny's at b1 0.97x, cifar's training
    step level."""
    tw2 = ow // 2                       # tiles whose right column is in the map
    if tw2 < simd.LANES // 2:
        for ty in range(rows):
            _tiles_out(dst, r + 2 * ty, mf, xs, t + ty * tw, 0, tw, ow, oy0 + 2 * ty + 1 < oh, add)
        return
    flat = simd.flat(dst)
    for ty in range(rows):
        below = oy0 + 2 * ty + 1 < oh
        rr = r + 2 * ty
        tt = t + ty * tw
        tx = 0
        while tw2 - tx >= simd.LANES // 2:
            low = tw2 - tx < simd.LANES
            _tiles_out_vec(flat, rr * ow + 2 * tx, ow if below else 0, mf, xs, tt + tx, add, low)
            tx += simd.LANES // 2 if low else simd.LANES
        _tiles_out(dst, rr, mf, xs, tt, tx, tw, ow, below, add)


@jit(inline="always")
def _tiles_out(dst, r, mf, xs, t, tx0, tw, ow, below, add):
    """`tile_outputs` of tiles tx0..tw−1 of one row of tiles, tile by tile (`plane_outputs`)."""
    g = simd.get                        # (no sign test per index: 16 distinct ones a tile)
    for x in range(t + tx0, t + tw):
        y00, y01, y10, y11 = tile_outputs(
            g(mf, x), g(mf, xs + x), g(mf, 2 * xs + x), g(mf, 3 * xs + x), g(mf, 4 * xs + x),
            g(mf, 5 * xs + x), g(mf, 6 * xs + x), g(mf, 7 * xs + x), g(mf, 8 * xs + x),
            g(mf, 9 * xs + x), g(mf, 10 * xs + x), g(mf, 11 * xs + x), g(mf, 12 * xs + x),
            g(mf, 13 * xs + x), g(mf, 14 * xs + x), g(mf, 15 * xs + x))
        ox = 2 * (x - t)
        store_tile(dst, r, ox, y00, y01, y10, y11, ox + 1 < ow, below, add)


@jit(inline="always")
def _tiles_out_vec(flat, o, below, mf, xs, t, add, low):
    """`tile_outputs` of LANES tiles (with `low`, LANES/2) whose M[ξ] are at mf[ξ·xs + t..], into
    flat[o..] and, when `below` (the row length) is not 0, flat[o + below..], 2 values a tile
    (written or added): each lane the scalar arithmetic, so the same values; the tiles' two
    columns interleaved by `simd.zip_low` / `zip_high`."""
    m0, m1, m2, m3 = _m_lanes(mf, t, xs, low)
    m4, m5, m6, m7 = _m_lanes(mf, t + 4 * xs, xs, low)
    m8, m9, m10, m11 = _m_lanes(mf, t + 8 * xs, xs, low)
    m12, m13, m14, m15 = _m_lanes(mf, t + 12 * xs, xs, low)
    a0 = simd.add(simd.add(m0, m4), m8)             # Aᵀ m: as `tile_outputs`, operation by operation
    a1 = simd.add(simd.add(m1, m5), m9)
    a2 = simd.add(simd.add(m2, m6), m10)
    a3 = simd.add(simd.add(m3, m7), m11)
    b0 = simd.sub(simd.sub(m4, m8), m12)
    b1 = simd.sub(simd.sub(m5, m9), m13)
    b2 = simd.sub(simd.sub(m6, m10), m14)
    b3 = simd.sub(simd.sub(m7, m11), m15)
    _out_row(flat, o, simd.add(simd.add(a0, a1), a2), simd.sub(simd.sub(a1, a2), a3), add, low)
    if below:
        _out_row(flat, o + below, simd.add(simd.add(b0, b1), b2),
                 simd.sub(simd.sub(b1, b2), b3), add, low)


@jit(inline="always")
def _m_lanes(mf, i, xs, low):
    """mf[i..], mf[i + xs..], mf[i + 2·xs..], mf[i + 3·xs..] as four vectors (with `low`, their
    first halves)."""
    if low:
        return (simd.load_low(mf, i), simd.load_low(mf, i + xs), simd.load_low(mf, i + 2 * xs),
                simd.load_low(mf, i + 3 * xs))
    return (simd.load(mf, i), simd.load(mf, i + xs), simd.load(mf, i + 2 * xs),
            simd.load(mf, i + 3 * xs))


@jit(inline="always")
def _out_row(row, c, left, right, add, low):
    """row[c..] := (add: +=) the tiles' left and right outputs interleaved: LANES values (with
    `low`: the first LANES/2 tiles'), else 2·LANES."""
    _put(row, c, simd.zip_low(left, right), add)
    if not low:
        _put(row, c + simd.LANES, simd.zip_high(left, right), add)


@jit(inline="always")
def _put(row, c, v, add):
    if add:
        simd.store(row, c, simd.add(simd.load(row, c), v))
    else:
        simd.store(row, c, v)


@jit(inline="always")
def store_tile(dst, r, c, y00, y01, y10, y11, right, below, add):
    """dst[r:r+2, c:c+2] := (add: +=) a tile's outputs, the right column only when `right`, the
    lower row only when `below` (the map's last tiles may be half used)."""
    if add:
        dst[r, c] += y00
        if right:
            dst[r, c + 1] += y01
        if below:
            dst[r + 1, c] += y10
            if right:
                dst[r + 1, c + 1] += y11
    else:
        dst[r, c] = y00
        if right:
            dst[r, c + 1] = y01
        if below:
            dst[r + 1, c] = y10
            if right:
                dst[r + 1, c + 1] = y11


@jit(inline="always")
def _output_plane(yf, mf, xs, fs, f, t, add):
    """Output plane yf (oh, ow) of filter f from the tiles t.. of M (`_outputs_parallel`)."""
    oh, ow = yf.shape
    plane_outputs(yf, 0, mf, xs, f * fs + t, (oh + 1) // 2, 0, (ow + 1) // 2, oh, ow, add)


# compiled once for both twins, not inlined into each (a task is POOL_GROUP whole planes)
@jit
def _output_units(y, mf, xs, fs, g, add, k, off, act, p, mean):
    """Planes fb = f·nb + b in group g (POOL_GROUP planes) of `outputs`, each then act(plane·k[f] +
    off[f]) in place when k is not empty; with a pooled output p or means, each plane goes to one
    scratch plane instead (made once per group of planes, not once per plane: 2048 allocations per
    call on digits' 8x8 maps at b64) and its 2x2 maxima to p, or its mean to mean[b, f]."""
    nb, n, oh, ow = y.shape
    pooled = p.shape[0] > 0
    averaged = mean.shape[0] > 0
    plane = np.empty((oh if pooled or averaged else 0, ow), y.dtype)
    for fb in range(g * POOL_GROUP, min((g + 1) * POOL_GROUP, nb * n)):
        f = fb // nb
        b = fb % nb
        t = b * ((oh + 1) // 2) * ((ow + 1) // 2)
        if pooled:
            _output_plane(plane, mf, xs, fs, f, t, False)
            epilogue_pool_rows(p[b, f], plane, k[f], off[f], act)
            continue
        if averaged:
            _output_plane(plane, mf, xs, fs, f, t, False)
            row = simd.flat(plane)
            affine_act_row(row, k[f], off[f], act)
            mean[b, f] = row_sum(row, row.shape[0]) / row.shape[0]
            continue
        _output_plane(y[b, f], mf, xs, fs, f, t, add)
        if k.shape[0]:
            affine_act_row(simd.flat(y[b, f]), k[f], off[f], act)


#: Output planes per task of `outputs` (its parallel loop's unit of work).
POOL_GROUP = 8


_NO_AFFINE = np.empty(0)


def outputs(y, m, add, k=_NO_AFFINE, off=_NO_AFFINE, act=0, pool=None, mean=None):
    """y: (nb, n, oh, ow) output, written (add=False) or ADDED to (add=True); m: (16, n, nb·th·tw)
    the transformed products. Each tile is Aᵀ m A, its 2x2 block cropped at the image edge.
    k, off: (n,) float64 (and the activation code `act`), or empty: then each written plane becomes
    act(y·k + off) right away, while it is in the cache (the inference epilogue; `bn.infer_affine`
    gives batch norm's k and off, the same values `bn.bn_act_forward_infer` uses, so the result is
    the same bits as that separate pass). `pool` (nb, n, oh/2, ow/2), with k given and even oh, ow:
    each finished plane's 2x2 stride-2 maxima go there and y is not written (kernels/pool2x2.py).
    `mean` (nb, n), with k given: each finished plane's mean goes there and y is not written (its
    sum in float64 in 8 lanes, `vecmath.row_sum`, not [avgpool]'s float sum in order: that chain
    of 49 dependent adds per 7x7 plane made darknet19's 512 -> 1024 at b64 0.9 ms slower, more
    than not writing its planes saved). Serial below PARALLEL_MIN output values."""
    run = _outputs_parallel if y.size >= PARALLEL_MIN else _outputs_serial
    mf, xs, fs = matrices_flat(m)
    run(y, mf, xs, fs, add, k, off, act, no_pool(y.dtype) if pool is None else pool,
        _NO_MEANS[y.dtype.itemsize] if mean is None else mean)


def matrices_flat(m: np.ndarray) -> tuple[np.ndarray, int, int]:
    """(mf, xs, fs): the stack m (16, n, tiles), rows of tiles contiguous, as the 1-D run of memory
    it lies in, M[ξ][f, t] at mf[ξ·xs + f·fs + t] (no copy)."""
    size = m.itemsize
    if m.strides[2] != size or any(st % size or st < 0 for st in m.strides):
        raise ValueError("winograd.outputs: M's tiles must be contiguous")
    xs, fs = m.strides[0] // size, m.strides[1] // size
    span = 15 * xs + (m.shape[1] - 1) * fs + m.shape[2]
    return np.lib.stride_tricks.as_strided(m, shape=(span,), strides=(size,)), xs, fs


#: `outputs`' mean argument when there is none (by itemsize: float32, float64)
_NO_MEANS = {4: np.empty((0, 0), np.float32), 8: np.empty((0, 0), np.float64)}


@pjit
def _outputs_parallel(y, mf, xs, fs, add, k, off, act, p, mean):
    """`outputs` with M given as mf (1-D): M[ξ][f, t] at mf[ξ·xs + f·fs + t]."""
    for g in prange((y.shape[0] * y.shape[1] + POOL_GROUP - 1) // POOL_GROUP):
        _output_units(y, mf, xs, fs, g, add, k, off, act, p, mean)


@jit
def _outputs_serial(y, mf, xs, fs, add, k, off, act, p, mean):
    for g in range((y.shape[0] * y.shape[1] + POOL_GROUP - 1) // POOL_GROUP):
        _output_units(y, mf, xs, fs, g, add, k, off, act, p, mean)


# ---- adjoints, for the weight gradient: dU[ξ] = dM[ξ] @ V[ξ]ᵀ between them ----------------------

@jit
def _a_col(p, q):
    """A·(p, q)ᵀ: a 2-vector to 4 values (the adjoint of Aᵀ's rows, used on rows and columns)."""
    return p, p + q, p - q, -q


@pjit
def outputs_adjoint(m, dy):
    """m: (16, n, nb·th·tw) output, dM = A dY Aᵀ per tile (the adjoint of `outputs`); dy: (nb, n,
    oh, ow) the gradient of the output. Positions of a tile outside the output count as zero."""
    nb, n, oh, ow = dy.shape
    th = (oh + 1) // 2
    tw = (ow + 1) // 2
    for fb in prange(n * nb):
        f = fb // nb
        b = fb % nb
        df = dy[b, f]
        t = b * th * tw
        for ty in range(th):
            for tx in range(tw):
                (m[0, f, t], m[1, f, t], m[2, f, t], m[3, f, t], m[4, f, t], m[5, f, t], m[6, f, t],
                 m[7, f, t], m[8, f, t], m[9, f, t], m[10, f, t], m[11, f, t], m[12, f, t],
                 m[13, f, t], m[14, f, t], m[15, f, t]) = tile_adjoint(df, 2 * ty, 2 * tx)
                t += 1


@jit(inline="always")
def tile_adjoint(df, oy, ox):
    """A dY Aᵀ of the tile whose outputs start at df[oy, ox] (df: one output plane's gradient; the
    tile's positions outside it count as zero): its 16 values, ξ = 0..15."""
    oh, ow = df.shape
    right = ox + 1 < ow
    below = oy + 1 < oh
    z = df[oy, ox] * 0
    y00 = df[oy, ox]
    y01 = df[oy, ox + 1] if right else z
    y10 = df[oy + 1, ox] if below else z
    y11 = df[oy + 1, ox + 1] if right and below else z
    # A dY: 4 rows of 2, then each row (p, q) times Aᵀ: (p, p + q, p − q, −q)
    m0, m1, m2, m3 = _a_col(y00, y01)
    m4, m5, m6, m7 = _a_col(y00 + y10, y01 + y11)
    m8, m9, m10, m11 = _a_col(y00 - y10, y01 - y11)
    m12, m13, m14, m15 = _a_col(-y10, -y11)
    return m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15


@jit
def _gt_row(a0, a1, a2, a3):
    """Gᵀ·(a0..a3)ᵀ: 4 values to 3 (the adjoint of `_g_cols`)."""
    h = 0.5 * (a1 + a2)
    return a0 + h, 0.5 * (a1 - a2), h + a3


@pjit
def filters_adjoint_add(dw, du):
    """dw: (n, c, 3, 3) weight gradient, ADDED to: Gᵀ dU G per filter (the adjoint of `filters`);
    du: (16, n, c), its rows along c or along n (the fused weight gradient's, transposed) in unit
    steps. Filter by filter with the channels in vector lanes, or channel by channel with the
    filters in them (`_adjoint_part`). Serial below PARALLEL_MIN values of dU."""
    n, c = dw.shape[0], dw.shape[1]
    by_filter = du.strides[2] == du.itemsize
    parts = n if by_filter else c
    if 16 * n * c < PARALLEL_MIN:
        for i in range(parts):
            _adjoint_part(dw, du, i, by_filter)
    else:
        for i in prange(parts):
            _adjoint_part(dw, du, i, by_filter)


@jit
def _adjoint_part(dw, du, i, by_filter):
    """Filter i (by_filter: its channels LANES at a time), else channel i (its filters LANES at a
    time) of `filters_adjoint_add`, the nine sums of each vector into a float64 scratch
    (`_adjoint_lanes`, tap-major) then added to dw one by one, the last values that make no whole
    vector pair by pair (`_filter_adjoint_add`); du's rows along the lanes in unit steps, else
    every pair by pair. The same operations on the same types lane by lane as
    `_filter_adjoint_add`: the same bits. Against pair by pair in one parallel loop (float32, 2
    threads, 2-core AVX-512 Zen 5): 256 -> 256 0.39 -> 0.17 ms, 512 -> 512 1.62 -> 0.88, 1024 ->
    512 3.33 -> 2.43; transposed (the fused weight gradient's dU, whose pairs read 16 lines each)
    1.20 -> 0.18, 4.92 -> 0.80, 22.1 -> 2.2 ms. Training steps, processes alternating: cifar's at
    b128 1225-1240 -> 1200-1222 ms, darknet19's at b16 693-720 -> 650-696 ms."""
    n, c = dw.shape[0], dw.shape[1]
    du, dw = borrowed(du), borrowed(dw)
    p = np.int64(i)                     # (a prange index may come unsigned: it mixes with j's)
    along = c if by_filter else n
    unit = du.strides[2 if by_filter else 1] == du.itemsize
    full = along - along % simd.LANES if unit else 0
    if full:
        made = np.empty(9 * full, np.float64)
        sums = borrowed(made)
        for j0 in range(0, full, simd.LANES):
            _adjoint_lanes(sums, du, p, full, j0, by_filter)
        for j in range(full):
            f, ch = (p, j) if by_filter else (j, p)
            for ky in range(3):
                for kx in range(3):
                    dw[f, ch, ky, kx] += sums[(3 * ky + kx) * full + j]
        keep(made)
    for j in range(full, along):
        _filter_adjoint_add(dw, du, p * c + j if by_filter else j * c + p)


@jit(inline="always")
def _adjoint_lanes(sums, du, i, full, j0, by_filter):
    """Gᵀ dU G of the LANES pairs from j0 of part i into `sums` (tap k of lane pair j at
    sums[k·full + j], float64)."""
    t00, t10, t20 = _gt_lanes(_du(du, 0, i, j0, by_filter), _du(du, 4, i, j0, by_filter),
                              _du(du, 8, i, j0, by_filter), _du(du, 12, i, j0, by_filter))
    t01, t11, t21 = _gt_lanes(_du(du, 1, i, j0, by_filter), _du(du, 5, i, j0, by_filter),
                              _du(du, 9, i, j0, by_filter), _du(du, 13, i, j0, by_filter))
    t02, t12, t22 = _gt_lanes(_du(du, 2, i, j0, by_filter), _du(du, 6, i, j0, by_filter),
                              _du(du, 10, i, j0, by_filter), _du(du, 14, i, j0, by_filter))
    t03, t13, t23 = _gt_lanes(_du(du, 3, i, j0, by_filter), _du(du, 7, i, j0, by_filter),
                              _du(du, 11, i, j0, by_filter), _du(du, 15, i, j0, by_filter))
    _sum_row(sums, 0, full, j0, _gt_lanes(t00, t01, t02, t03))
    _sum_row(sums, 3, full, j0, _gt_lanes(t10, t11, t12, t13))
    _sum_row(sums, 6, full, j0, _gt_lanes(t20, t21, t22, t23))


@jit(inline="always")
def _du(du, xi, i, j0, by_filter):
    """du[xi, i, j0:j0+LANES] (by_filter), else du[xi, j0:j0+LANES, i], as a vector."""
    if by_filter:
        return simd.load(simd.unit_stride(du[xi, i]), j0)
    return simd.load(simd.unit_stride(du[xi, :, i]), j0)


@jit(inline="always")
def _gt_lanes(a0, a1, a2, a3):
    """`_gt_row` lane by lane, with its types: a1 ± a2 in the vectors' dtype, the rest in float64
    (as its scalar code promotes them)."""
    half = simd.splat(simd.widen(a0), 0.5)
    h = simd.mul(half, simd.widen(simd.add(a1, a2)))
    return (simd.add(simd.widen(a0), h), simd.mul(half, simd.widen(simd.sub(a1, a2))),
            simd.add(h, simd.widen(a3)))


@jit(inline="always")
def _sum_row(sums, k, full, ch0, row):
    """sums[(k + j)·full + ch0 ..] := row[j], j = 0..2."""
    simd.store(sums, k * full + ch0, row[0])
    simd.store(sums, (k + 1) * full + ch0, row[1])
    simd.store(sums, (k + 2) * full + ch0, row[2])


@jit(inline="always")
def _filter_adjoint_add(dw, du, nc):
    """Filter-channel pair nc = f·c + ch of `filters_adjoint_add`."""
    c = dw.shape[1]
    f = nc // c
    ch = nc % c
    # Gᵀ dU: each column j of the 4x4 dU to 3 values, rows t_i
    t00, t10, t20 = _gt_row(du[0, f, ch], du[4, f, ch], du[8, f, ch], du[12, f, ch])
    t01, t11, t21 = _gt_row(du[1, f, ch], du[5, f, ch], du[9, f, ch], du[13, f, ch])
    t02, t12, t22 = _gt_row(du[2, f, ch], du[6, f, ch], du[10, f, ch], du[14, f, ch])
    t03, t13, t23 = _gt_row(du[3, f, ch], du[7, f, ch], du[11, f, ch], du[15, f, ch])
    # (Gᵀ dU) G: each row to 3 values
    g = dw[f, ch]
    a, b_, c_ = _gt_row(t00, t01, t02, t03)
    g[0, 0] += a
    g[0, 1] += b_
    g[0, 2] += c_
    a, b_, c_ = _gt_row(t10, t11, t12, t13)
    g[1, 0] += a
    g[1, 1] += b_
    g[1, 2] += c_
    a, b_, c_ = _gt_row(t20, t21, t22, t23)
    g[2, 0] += a
    g[2, 1] += b_
    g[2, 2] += c_
