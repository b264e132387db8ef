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

The three kernels here are the transforms: `filters` (g -> U), `inputs` (x -> V, zero padding read
outside the image) and `outputs` (M -> y, writing or ADDING the 2x2 tiles, cropping the last row and
column of tiles when the output size is odd). The layer runs `np.matmul(U, V, out=M)` between them.

Numerics: the transforms add and subtract (no division except G's exact halves), so the result
differs from the direct sum only by float rounding, a few ulps of the summed magnitudes; the layer
uses this path only where it measured faster (see `layers/convolutional.py`).

Matrices (F(2x2, 3x3)):
    Bᵀ = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
    G  = [1 0 0; ½ ½ ½; ½ -½ ½; 0 0 1]
    Aᵀ = [1 1 1 0; 0 1 -1 -1]
"""
from __future__ import annotations

from numba import prange

from . import jit, pjit


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
    """u: (16, n, c) output, U[ξ] for ξ = 4·i + j; w: (n, c, 3, 3) filters. U = G g Gᵀ."""
    n, c = w.shape[0], w.shape[1]
    for nc in prange(n * c):
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
def _d_row(xc, yy, x0, interior):
    """Row yy of the 4x4 patch starting at column x0 of the image xc (h, w), zero outside, times B:
    (d0 − d2, d1 + d2, d2 − d1, d1 − d3)."""
    h, w = xc.shape
    if interior:
        d0, d1, d2, d3 = xc[yy, x0], xc[yy, x0 + 1], xc[yy, x0 + 2], xc[yy, x0 + 3]
    else:
        z = xc[0, 0] * 0
        d0 = d1 = d2 = d3 = z
        if 0 <= yy < h:
            if 0 <= x0 < w:
                d0 = xc[yy, x0]
            if 0 <= x0 + 1 < w:
                d1 = xc[yy, x0 + 1]
            if 0 <= x0 + 2 < w:
                d2 = xc[yy, x0 + 2]
            if 0 <= x0 + 3 < w:
                d3 = xc[yy, x0 + 3]
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


@jit
def _input_tile(v, ch, t, r00, r01, r02, r03, r10, r11, r12, r13, r20, r21, r22, r23,
                r30, r31, r32, r33):
    """Store V = Bᵀ (d B) of one tile, given the rows of d B (r_k = row k of d times B)."""
    v[0, ch, t] = r00 - r20
    v[1, ch, t] = r01 - r21
    v[2, ch, t] = r02 - r22
    v[3, ch, t] = r03 - r23
    v[4, ch, t] = r10 + r20
    v[5, ch, t] = r11 + r21
    v[6, ch, t] = r12 + r22
    v[7, ch, t] = r13 + r23
    v[8, ch, t] = r20 - r10
    v[9, ch, t] = r21 - r11
    v[10, ch, t] = r22 - r12
    v[11, ch, t] = r23 - r13
    v[12, ch, t] = r10 - r30
    v[13, ch, t] = r11 - r31
    v[14, ch, t] = r12 - r32
    v[15, ch, t] = r13 - r33


@pjit
def inputs(v, x, pad):
    """v: (16, c, nb·th·tw) output, V[ξ] with tile index (b·th + ty)·tw + tx; x: (nb, c, h, w)
    input. The tile (ty, tx) reads the 4x4 patch at rows 2·ty − pad.., columns 2·tx − pad.. (zero
    outside the image); V = Bᵀ d B. The tile grid covers the output of a 3x3 stride-1 kernel,
    (h + 2·pad − 2) x (w + 2·pad − 2). Tiles wholly inside the image take a branch-free loop."""
    nb, c, h, w = x.shape
    th = (h + 2 * pad - 1) // 2
    tw = (w + 2 * pad - 1) // 2
    # tiles tx in [lo, hi) have columns 2·tx − pad .. 2·tx − pad + 3 inside the image
    lo = min((pad + 1) // 2, tw)
    hi = max(min((w + pad - 4) // 2 + 1, tw), lo)
    for cb in prange(c * nb):
        ch = cb // nb
        b = cb % nb
        xc = x[b, ch]
        for ty in range(th):
            y0 = 2 * ty - pad
            t0 = (b * th + ty) * tw
            rows_inside = y0 >= 0 and y0 + 4 <= h
            for tx in range(tw):
                if rows_inside and lo <= tx < hi:
                    continue
                x0 = 2 * tx - pad
                r00, r01, r02, r03 = _d_row(xc, y0, x0, False)
                r10, r11, r12, r13 = _d_row(xc, y0 + 1, x0, False)
                r20, r21, r22, r23 = _d_row(xc, y0 + 2, x0, False)
                r30, r31, r32, r33 = _d_row(xc, y0 + 3, x0, False)
                _input_tile(v, ch, t0 + tx, r00, r01, r02, r03, r10, r11, r12, r13,
                            r20, r21, r22, r23, r30, r31, r32, r33)
            if not rows_inside:
                continue
            x_0 = xc[y0]
            x_1 = xc[y0 + 1]
            x_2 = xc[y0 + 2]
            x_3 = xc[y0 + 3]
            for tx in range(lo, hi):
                x0 = 2 * tx - pad
                r00, r01, r02, r03 = (x_0[x0] - x_0[x0 + 2], x_0[x0 + 1] + x_0[x0 + 2],
                                      x_0[x0 + 2] - x_0[x0 + 1], x_0[x0 + 1] - x_0[x0 + 3])
                r10, r11, r12, r13 = (x_1[x0] - x_1[x0 + 2], x_1[x0 + 1] + x_1[x0 + 2],
                                      x_1[x0 + 2] - x_1[x0 + 1], x_1[x0 + 1] - x_1[x0 + 3])
                r20, r21, r22, r23 = (x_2[x0] - x_2[x0 + 2], x_2[x0 + 1] + x_2[x0 + 2],
                                      x_2[x0 + 2] - x_2[x0 + 1], x_2[x0 + 1] - x_2[x0 + 3])
                r30, r31, r32, r33 = (x_3[x0] - x_3[x0 + 2], x_3[x0 + 1] + x_3[x0 + 2],
                                      x_3[x0 + 2] - x_3[x0 + 1], x_3[x0 + 1] - x_3[x0 + 3])
                _input_tile(v, ch, t0 + tx, r00, r01, r02, r03, r10, r11, r12, r13,
                            r20, r21, r22, r23, r30, r31, r32, r33)


@pjit
def outputs(y, m, add):
    """y: (nb, n, oh, ow) output, written (add=False) or ADDED to (add=True); m: (16, n, nb·th·tw)
    the transformed products. Each tile is Aᵀ m A, its 2x2 block cropped at the image edge."""
    nb, n, oh, ow = y.shape
    th = (oh + 1) // 2
    tw = (ow + 1) // 2
    for fb in prange(n * nb):
        f = fb // nb
        b = fb % nb
        yf = y[b, f]
        t = b * th * tw
        for ty in range(th):
            for tx in range(tw):
                # Aᵀ m: two rows of 4, then (Aᵀ m) A: two columns
                a0 = m[0, f, t] + m[4, f, t] + m[8, f, t]
                a1 = m[1, f, t] + m[5, f, t] + m[9, f, t]
                a2 = m[2, f, t] + m[6, f, t] + m[10, f, t]
                a3 = m[3, f, t] + m[7, f, t] + m[11, f, t]
                b0 = m[4, f, t] - m[8, f, t] - m[12, f, t]
                b1 = m[5, f, t] - m[9, f, t] - m[13, f, t]
                b2 = m[6, f, t] - m[10, f, t] - m[14, f, t]
                b3 = m[7, f, t] - m[11, f, t] - m[15, f, t]
                y00 = a0 + a1 + a2
                y01 = a1 - a2 - a3
                y10 = b0 + b1 + b2
                y11 = b1 - b2 - b3
                oy = 2 * ty
                ox = 2 * tx
                right = ox + 1 < ow
                below = oy + 1 < oh
                if add:
                    yf[oy, ox] += y00
                    if right:
                        yf[oy, ox + 1] += y01
                    if below:
                        yf[oy + 1, ox] += y10
                        if right:
                            yf[oy + 1, ox + 1] += y11
                else:
                    yf[oy, ox] = y00
                    if right:
                        yf[oy, ox + 1] = y01
                    if below:
                        yf[oy + 1, ox] = y10
                        if right:
                            yf[oy + 1, ox + 1] = y11
                t += 1
