"""Direct convolution vectorised across filters, for inference on small output maps.

On an 8x8 or 4x4 map a layer's GEMMs are short (im2col: N = 16-64 positions per item; Winograd:
16 GEMMs of a few tiles) and `direct.py`'s kernels, which vectorise along a row of positions,
compute the padding columns of every row (on a 4x4 map a third of the work). Here the vectors run
across filters instead, as ONNX Runtime's NCHWc convolutions do, while the tensors stay NCHW:

- the weights are laid out once as `wt[c·k·k + ky·k + kx, f]` (`filters_last`), filters
  zero-padded to whole microkernel widths, so the FV = 16 filters of one tap are two vector loads;
- a microkernel (`_tile`) keeps 6 positions x 16 filters in twelve vector accumulators over all
  c·k·k taps; each tap costs two vector loads, six scalar loads broadcast to the lanes and twelve
  FMAs. The positions are any six of the map, found through a table of their offsets, so nothing
  is computed outside the map and any stride works;
- the input is read in place when the layer has no padding, else from zero-padded copies of the
  item's planes made once per call;
- each unit (item, 16 filters, a run of positions) scatters its tiles into the NCHW output and
  applies bias / batch norm and the activation to what it wrote (the inference epilogue).

Like `direct.py` this computes Darknet's cross-correlation. Inference only: the layer trains on
its other paths.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from . import PARALLEL_MIN, simd
from .bn import affine_act_row

#: Filters per microkernel: two vectors.
FV = 2 * simd.LANES
#: Output positions per microkernel: 12 accumulators and 2 weight vectors fill AVX2's 16 registers.
PV = 4
#: Output positions per unit of parallel work (whole microkernels).
UNIT_POSITIONS = 64 * PV

#: Most taps per filter (c·k·k): a microkernel's 16 filters of weights, 64 bytes a tap, stay in
#: the L1 cache up to here (18 KB). Most output positions per item: past 8x8 maps the other paths
#: run their GEMMs or row kernels long enough to be faster. Measured layer by layer against the
#: path each took before, alternating in one process (2 threads, 2-core Zen 3 AVX2, inference with
#: shared outputs; ratio of medians): digits' 16 -> 32 on 8x8 0.77 at b64 (direct) and 0.63 at
#: b1, its 32 -> 64 on 4x4 0.63 (Winograd) and 0.45 (GEMM), its 1x1 64 -> 10 on 4x4 0.91 and
#: 0.38; shapes-tiny's 1x1 128 -> 64, 128 -> 27 and 64 -> 32 on 8x8 0.56-0.94 at b64 and 0.74-0.75
#: at b1. Beyond them it lost: shapes-tiny's 64 -> 128 on 8x8 (576 taps) 1.21-1.29 at b64, its
#: 32 -> 64 on 16x16 level, 16 -> 32 on 32x32 1.55; cifar's 1x1 512 -> 10 on 7x7 1.21 at b64.
MAX_TAPS = 288
MAX_POSITIONS = 64


def supports(c: int, k: int, groups: int, dilation: int, positions: int,
             inference_only: bool) -> bool:
    """Layers this path takes: in a network that will only infer, ungrouped and undilated, with at
    most MAX_TAPS taps per filter (c input channels, k x k) and PV to MAX_POSITIONS output
    positions per item (a map of one position is a connected layer's GEMM)."""
    return (inference_only and groups == 1 and dilation == 1 and c * k * k <= MAX_TAPS
            and PV <= positions <= MAX_POSITIONS)


_jit = numba.njit(cache=True, nogil=True, inline="always")
#: The microkernel is compiled on its own and called, not inlined: inlined into a parallel caller
#: `direct._forward_block3` ran 2x slower.
_serial = numba.njit(cache=True, nogil=True)


def padded_filters(n: int) -> int:
    """Filters rounded up to whole microkernel widths: the columns of `filters_last`'s matrix."""
    return -(-n // FV) * FV


@numba.njit(cache=True, nogil=True)
def filters_last(wt, w):
    """wt (c·k·k · padded_filters(n),) := w (n, c, k, k) as rows per tap, filters along each row,
    the filters past n zero."""
    n = w.shape[0]
    taps = w.shape[1] * w.shape[2] * w.shape[3]
    wf = w.reshape(n, taps)
    npad = wt.shape[0] // taps
    for t in range(taps):
        row = wt[t * npad:(t + 1) * npad]
        for f in range(n):
            row[f] = wf[f, t]
        for f in range(n, npad):
            row[f] = 0


@_serial
def _tile(out, src, s0, wt, npad, toff, pos, p0, f0):
    """out (PV·FV,) := positions pos[p0:p0+PV] x filters f0..f0+FV−1 of the correlation, reading
    the item's (padded) planes at src[s0:]: tap t of position i is src[s0 + pos[p0+i] + toff[t]]."""
    b0, b1, b2, b3 = s0 + pos[p0], s0 + pos[p0 + 1], s0 + pos[p0 + 2], s0 + pos[p0 + 3]
    z = simd.zero(wt)
    a00, a01, a10, a11, a20, a21, a30, a31 = z, z, z, z, z, z, z, z
    for t in range(toff.shape[0]):
        o = toff[t]
        w0 = simd.load(wt, t * npad + f0)
        w1 = simd.load(wt, t * npad + f0 + simd.LANES)
        u = simd.get(src, b0 + o)
        a00, a01 = simd.fma(a00, u, w0), simd.fma(a01, u, w1)
        u = simd.get(src, b1 + o)
        a10, a11 = simd.fma(a10, u, w0), simd.fma(a11, u, w1)
        u = simd.get(src, b2 + o)
        a20, a21 = simd.fma(a20, u, w0), simd.fma(a21, u, w1)
        u = simd.get(src, b3 + o)
        a30, a31 = simd.fma(a30, u, w0), simd.fma(a31, u, w1)
    L = simd.LANES
    simd.store(out, 0, a00)
    simd.store(out, L, a01)
    simd.store(out, 2 * L, a10)
    simd.store(out, 3 * L, a11)
    simd.store(out, 4 * L, a20)
    simd.store(out, 5 * L, a21)
    simd.store(out, 6 * L, a30)
    simd.store(out, 7 * L, a31)


@_jit
def _tables(x, k, sy, sx, pad, oh, ow):
    """(plane values, row length, tap offsets, position offsets) of the source: x's own planes
    without padding, else zero-padded copies; the positions padded to whole microkernels by
    repeating the last (computed again, written once)."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    if pad == 0:
        hp, wp = H, W
    else:
        hp, wp = (oh - 1) * sy + k, (ow - 1) * sx + k
    toff = np.empty(C * k * k, np.int64)
    for c in range(C):
        for ky in range(k):
            for kx in range(k):
                toff[(c * k + ky) * k + kx] = c * hp * wp + ky * wp + kx
    S = oh * ow
    pos = np.empty(-(-S // PV) * PV, np.int64)
    for p in range(pos.shape[0]):
        q = min(p, S - 1)
        pos[p] = (q // ow) * sy * wp + (q % ow) * sx
    return hp * wp, wp, toff, pos


@_jit
def _pad_item(xp, x, b, pad, hp, wp):
    """xp[b] (C·hp·wp values from b·C·hp·wp) := item b's planes, zero-padded by `pad` before."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    base = b * C * hp * wp
    for c in range(C):
        for r in range(hp):
            dst = xp[base + (c * hp + r) * wp:base + (c * hp + r + 1) * wp]
            iy = r - pad
            if iy < 0 or iy >= H:
                dst[:] = 0
                continue
            for t in range(wp):
                ix = t - pad
                dst[t] = x[b, c, iy, ix] if 0 <= ix < W else 0


@_jit
def _unit(y, src, item, wt, npad, toff, pos, t, groups, runs, k, off, act):
    """Unit t: item b = t // (groups·runs) (its planes at src[b·item:]), filters FV·(t // runs %
    groups)..., positions of run t % runs; its tiles scattered into y (B, N, S), then the epilogue
    on what it wrote."""
    N, S = y.shape[1], y.shape[2]
    b = t // (groups * runs)
    f0 = (t // runs % groups) * FV
    p_lo = (t % runs) * UNIT_POSITIONS
    p_hi = min(p_lo + UNIT_POSITIONS, S)
    nf = min(FV, N - f0)
    out = np.empty(PV * FV, y.dtype)
    for p0 in range(p_lo, p_hi, PV):
        _tile(out, src, b * item, wt, npad, toff, pos, p0, f0)
        for i in range(min(PV, p_hi - p0)):
            for f in range(nf):
                y[b, f0 + f, p0 + i] = out[i * FV + f]
    if k.shape[0]:
        for f in range(f0, f0 + nf):
            affine_act_row(y[b, f, p_lo:p_hi], k[f], off[f], act)


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _forward_serial(y, x, wt, k, sy, sx, pad, oh, ow, kk, off, act):
    plane, wp, toff, pos = _tables(x, k, sy, sx, pad, oh, ow)
    B, C = x.shape[0], x.shape[1]
    groups, runs = y.shape[1] // FV + (y.shape[1] % FV > 0), -(-y.shape[2] // UNIT_POSITIONS)
    npad = groups * FV
    if pad == 0:
        src = x.reshape(B * C * plane)
    else:
        src = np.empty(B * C * plane, x.dtype)
        for b in range(B):
            _pad_item(src, x, b, pad, plane // wp, wp)
    for t in range(B * groups * runs):
        _unit(y, src, C * plane, wt, npad, toff, pos, t, groups, runs, kk, off, act)


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"contract"})
def _forward_parallel(y, x, wt, k, sy, sx, pad, oh, ow, kk, off, act):
    plane, wp, toff, pos = _tables(x, k, sy, sx, pad, oh, ow)
    B, C = x.shape[0], x.shape[1]
    groups, runs = y.shape[1] // FV + (y.shape[1] % FV > 0), -(-y.shape[2] // UNIT_POSITIONS)
    npad = groups * FV
    if pad == 0:
        src = x.reshape(B * C * plane)
    else:
        src = np.empty(B * C * plane, x.dtype)
        for b in prange(B):
            _pad_item(src, x, b, pad, plane // wp, wp)
    for t in prange(B * groups * runs):
        _unit(y, src, C * plane, wt, npad, toff, pos, t, groups, runs, kk, off, act)


_NO_AFFINE = np.empty(0)


def conv_forward(y, x, wt, k, sy, sx, pad, kk=_NO_AFFINE, off=_NO_AFFINE, act=0):
    """y (B, N, OH, OW) := the correlation of x (B, C, H, W) with the k x k filters laid out by
    `filters_last` in wt, stride (sy, sx), zero padding `pad` on every side. kk, off: (N,) float64
    and the activation code `act`, or empty: then every output plane becomes act(y·kk[f] + off[f])
    as it is written (the inference epilogue). Serial below PARALLEL_MIN output values."""
    B, N, OH, OW = y.shape
    run = _forward_serial if y.size < PARALLEL_MIN else _forward_parallel
    run(y.reshape(B, N, OH * OW), x, wt, k, sy, sx, pad, OH, OW, kk, off, act)
