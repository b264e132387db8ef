"""Winograd F(2x2, 3x3)'s per-tile transforms (kernels/winograd.py has the algorithm): a tile's
4x4 input patch to its 16 values of V = Bᵀ d B (`tile_inputs`), its 16 products to its 2x2
outputs, Aᵀ M A (`tile_outputs`, `store_tile`), and both over whole rows of tiles in vector lanes
(`plane_inputs`, `plane_outputs`): LANES neighbouring tiles at a time, each lane the scalar
arithmetic, so the values are the same as tile by tile. `winograd.inputs` / `outputs` (the chunked
path) and kernels/winograd_fused.py (the bands) run them.
"""
from __future__ import annotations

from . import jit, simd


@jit
def _bt_col(d0, d1, d2, d3):
    """Bᵀ·(d0..d3)ᵀ: one column of a 4x4 patch to 4 values (the same for a row times B); of
    scalars, or of vectors (`simd`'s + and −: each lane the scalar's)."""
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


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
    s00, s01, s02, s03 = _bt_col(a0, b0, c0, d0)
    s10, s11, s12, s13 = _bt_col(a1, b1, c1, d1)
    s20, s21, s22, s23 = _bt_col(a2, b2, c2, d2)
    s30, s31, s32, s33 = _bt_col(a3, b3, c3, d3)
    # (Bᵀ d) B, row by row: row i gives V[4·i .. 4·i + 3]
    _store4(v, 0, t, _bt_col(s00, s10, s20, s30), low)
    _store4(v, 4, t, _bt_col(s01, s11, s21, s31), low)
    _store4(v, 8, t, _bt_col(s02, s12, s22, s32), low)
    _store4(v, 12, t, _bt_col(s03, s13, s23, s33), low)


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
    """Aᵀ m A of one tile's 16 products (ξ = 4·i + j): its 2x2 outputs y00, y01, y10, y11; of
    scalars, or of vectors of LANES tiles' (`simd`'s + and −: each lane the scalar's)."""
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
    then LANES/2 (`_tiles_out_vec`), then, when writing, a last half vector overlapping the one
    before (when adding, those tiles tile by tile), the others tile by tile. Everything by index
    into 1-D arrays: row views made in the loops (m[ξ], dst[r]) cost reference counting at each,
    and the kernel ran slower than tile by tile; so did numba's indexing, whose sign test per
    index (16 distinct ones a tile) made the tile-by-tile loop 2x slower than `simd.get`. Against
    tile by tile (one thread, 2-core Zen 5, AVX-512): `outputs` of 16 items x 128 filters on 28x28
    2.0 -> 0.8 ms, of 32 x 32 on 32x32 1.2 -> 0.45, of 8 x 64 on 52x52 1.6 -> 0.6; the fused bands'
    32 filters on 28x28, 32x32 and 52x52 33 -> 16, 38 -> 19 and 82 -> 34 µs; 14x14 and 7x7 maps
    (tile by tile in both) 1.0-1.1x the time. Processes alternating with the commit before (2
    threads): shapes-tiny's forward at b64 0.93-0.96x the time, yolov4-tiny's at b1 0.97x,
    cifar's training step level."""
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
        while tx < tw2:
            if tw2 - tx < simd.LANES // 2:
                if add:
                    break
                tx = tw2 - simd.LANES // 2      # (written again, the same values)
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
    (written or added): `tile_outputs` itself on vectors (each lane the scalar arithmetic, so the
    same values); the tiles' two columns interleaved by `simd.zip_low` / `zip_high`."""
    m0, m1, m2, m3 = _m_lanes(mf, t, xs, low)
    m4, m5, m6, m7 = _m_lanes(mf, t + 4 * xs, xs, low)
    m8, m9, m10, m11 = _m_lanes(mf, t + 8 * xs, xs, low)
    m12, m13, m14, m15 = _m_lanes(mf, t + 12 * xs, xs, low)
    y00, y01, y10, y11 = tile_outputs(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13,
                                      m14, m15)
    _out_row(flat, o, y00, y01, add, low)
    if below:
        _out_row(flat, o + below, y10, y11, add, low)


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
