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
each holding V[ξ]'s (c, tiles) matrix (and possibly padding after it); the per-tile transforms
both run, over whole rows of tiles in vector lanes, are in kernels/winograd_tiles.py. The input
gradient is the same algorithm on the delta with the filters flipped and transposed. The weight
gradient uses the adjoints: `outputs_adjoint` (dY -> dM = A dY Aᵀ), the 16
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
from .winograd_tiles import plane_inputs, plane_outputs


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
    """y: (nb, n, oh, ow) output, C-contiguous, written (add=False) or ADDED to (add=True); m: (16,
    n, nb·th·tw) the transformed products, each row of tiles contiguous. Each tile is Aᵀ m A, its
    2x2 block cropped at the image edge.
    k, off: (n,) float64 (and the activation code `act`), or empty: then each written plane becomes
    act(y·k + off) right away, while it is in the cache (the inference epilogue; `bn.infer_affine`
    gives batch norm's k and off, the same values `bn.bn_act_forward_infer` uses, so the result is
    the same bits as that separate pass). `pool` (nb, n, oh/2, ow/2), with k given and even oh, ow:
    each finished plane's 2x2 stride-2 maxima go there and y is not written (kernels/pool2x2.py).
    `mean` (nb, n), with k given: each finished plane's mean goes there and y is not written (its
    sum in float64 in 8 lanes, `vecmath.row_sum`, not [avgpool]'s float sum in order: that chain
    of 49 dependent adds per 7x7 plane made darknet19's 512 -> 1024 at b64 0.9 ms slower, more
    than not writing its planes saved). Serial below PARALLEL_MIN output values."""
    if not y.flags.c_contiguous:        # (its planes are written through 1-D views)
        raise ValueError("winograd.outputs: y must be C-contiguous")
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
