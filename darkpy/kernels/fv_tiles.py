"""The microkernels of the direct convolution across filters (kernels/direct_fv.py): a tile of 4, 6
or 8 output positions x FV filters in vector accumulators over a run of taps, each tap two vector
loads of weights and a broadcast per position. `direct_fv.py` (padded planes),
`direct_fv_border.py` (each position's taps inside the input) and the gradients call them.
"""
from __future__ import annotations

from . import njit, simd
from .microgemm import fma2

#: Filters per microkernel: two vectors.
FV = 2 * simd.LANES

_jit = njit(cache=True, nogil=True, inline="always")
#: The microkernel is compiled on its own and called, not inlined: inlined into a parallel caller
#: `direct._forward_block` ran 2x slower.
_serial = njit(cache=True, nogil=True)


@_jit
def block_at(f0, taps):
    """Where `filters_last`'s block of the FV filters from f0 starts (f0 a multiple of FV)."""
    return f0 * taps


@_jit
def _store2(out, v, a0, a1):
    """out[v·LANES:(v+2)·LANES] := two accumulators, in order."""
    simd.store(out, v * simd.LANES, a0)
    simd.store(out, (v + 1) * simd.LANES, a1)


@_jit
def _store8(out, a00, a01, a10, a11, a20, a21, a30, a31):
    """out[:8·LANES] := eight accumulators, in order."""
    _store2(out, 0, a00, a01)
    _store2(out, 2, a10, a11)
    _store2(out, 4, a20, a21)
    _store2(out, 6, a30, a31)


@_jit
def _start(out, v, acc, z):
    """An accumulator's first value: out[v·LANES:(v+1)·LANES] with `acc` (a K chunk after the
    first), else zero."""
    return simd.load(out, v * simd.LANES) if acc else z


@_jit
def _start8(out, acc, z):
    """The first eight accumulators' first values (`_start`)."""
    return (_start(out, 0, acc, z), _start(out, 1, acc, z), _start(out, 2, acc, z),
            _start(out, 3, acc, z), _start(out, 4, acc, z), _start(out, 5, acc, z),
            _start(out, 6, acc, z), _start(out, 7, acc, z))


@_jit
def _tap(tidx, t):
    """The block's tap that tap t reads: tidx[t], or t itself where tidx is None (no tap left
    out). None compiles the table away: its load in the inner loop, one register more than
    AVX-512's eight base positions leave, spilled an accumulator to the stack at every tap
    (`_tile8` on 2052 taps from the L2 cache, one thread, 2-core Zen 5: 177-200 -> 260-272
    GFLOP/s, the same bits)."""
    if tidx is None:
        return t
    return simd.get(tidx, t)


@_jit
def _tap_weights(wt, w0, t, pf):
    """Tap t's FV weights in the block at wt[w0] (two vectors); with `pf`, the weights pf values
    on are prefetched."""
    i = w0 + t * FV
    if pf:
        simd.prefetch(wt, i + pf)
        simd.prefetch(wt, i + pf + simd.LANES)
    return simd.load(wt, i), simd.load(wt, i + simd.LANES)


@_serial
def _tile6(out, src, s0, wt, w0, toff, tidx, t0, t1, acc, pos, p0, pf):
    """out[:6·FV] := (acc: +=) positions pos[p0:p0+6] x the FV filters whose `filters_last` block
    starts at wt[w0], over taps t0..t1−1, reading the item's (padded) planes at src[s0:]: tap t
    of position i is src[s0 + pos[p0+i] + toff[t]], its weights the block's tidx[t]-th (tidx[t] =
    t but where a path leaves taps out: kernels/direct_fv_border.py; tidx None: t, `_tap`).
    Continuing a sum from out adds the taps in the same order as one pass would: the bits do not
    depend on the K chunks. pf = (ahead, every, due): with `ahead`, every `every`-th tap from the
    `due`-th on also prefetches its weights `ahead` values on (the next chunk's,
    `direct_fv._unit`); ahead 0: none."""
    b0, b1, b2, b3 = s0 + pos[p0], s0 + pos[p0 + 1], s0 + pos[p0 + 2], s0 + pos[p0 + 3]
    b4, b5 = s0 + pos[p0 + 4], s0 + pos[p0 + 5]
    z = simd.zero(wt)
    a00, a01, a10, a11, a20, a21, a30, a31 = _start8(out, acc, z)
    a40, a41, a50, a51 = _start(out, 8, acc, z), _start(out, 9, acc, z), \
        _start(out, 10, acc, z), _start(out, 11, acc, z)
    ahead, every, due = pf
    for t in range(t0, t1):
        o = simd.get(toff, t)       # (no sign test of t)
        v0, v1 = _tap_weights(wt, w0, _tap(tidx, t), ahead if due == 0 else 0)
        due = every - 1 if due == 0 else due - 1
        a00, a01 = fma2(a00, a01, simd.get(src, b0 + o), v0, v1)
        a10, a11 = fma2(a10, a11, simd.get(src, b1 + o), v0, v1)
        a20, a21 = fma2(a20, a21, simd.get(src, b2 + o), v0, v1)
        a30, a31 = fma2(a30, a31, simd.get(src, b3 + o), v0, v1)
        a40, a41 = fma2(a40, a41, simd.get(src, b4 + o), v0, v1)
        a50, a51 = fma2(a50, a51, simd.get(src, b5 + o), v0, v1)
    _store8(out, a00, a01, a10, a11, a20, a21, a30, a31)
    _store2(out, 8, a40, a41)
    _store2(out, 10, a50, a51)


@_serial
def _tile8(out, src, s0, wt, w0, toff, tidx, t0, t1, acc, pos, p0, pf):
    """`_tile6` for positions pos[p0:p0+8]: out[:8·FV], in sixteen accumulators (AVX-512's 32
    registers hold them with the two weight vectors and a broadcast)."""
    b0, b1, b2, b3 = s0 + pos[p0], s0 + pos[p0 + 1], s0 + pos[p0 + 2], s0 + pos[p0 + 3]
    b4, b5, b6, b7 = s0 + pos[p0 + 4], s0 + pos[p0 + 5], s0 + pos[p0 + 6], s0 + pos[p0 + 7]
    z = simd.zero(wt)
    a00, a01, a10, a11, a20, a21, a30, a31 = _start8(out, acc, z)
    a40, a41, a50, a51 = _start(out, 8, acc, z), _start(out, 9, acc, z), \
        _start(out, 10, acc, z), _start(out, 11, acc, z)
    a60, a61, a70, a71 = _start(out, 12, acc, z), _start(out, 13, acc, z), \
        _start(out, 14, acc, z), _start(out, 15, acc, z)
    ahead, every, due = pf
    for t in range(t0, t1):
        o = simd.get(toff, t)       # (no sign test of t)
        v0, v1 = _tap_weights(wt, w0, _tap(tidx, t), ahead if due == 0 else 0)
        due = every - 1 if due == 0 else due - 1
        a00, a01 = fma2(a00, a01, simd.get(src, b0 + o), v0, v1)
        a10, a11 = fma2(a10, a11, simd.get(src, b1 + o), v0, v1)
        a20, a21 = fma2(a20, a21, simd.get(src, b2 + o), v0, v1)
        a30, a31 = fma2(a30, a31, simd.get(src, b3 + o), v0, v1)
        a40, a41 = fma2(a40, a41, simd.get(src, b4 + o), v0, v1)
        a50, a51 = fma2(a50, a51, simd.get(src, b5 + o), v0, v1)
        a60, a61 = fma2(a60, a61, simd.get(src, b6 + o), v0, v1)
        a70, a71 = fma2(a70, a71, simd.get(src, b7 + o), v0, v1)
    _store8(out, a00, a01, a10, a11, a20, a21, a30, a31)
    _store2(out, 8, a40, a41)
    _store2(out, 10, a50, a51)
    _store2(out, 12, a60, a61)
    _store2(out, 14, a70, a71)


@_serial
def _tile4(out, src, s0, wt, w0, toff, tidx, t0, t1, acc, pos, p0, pf):
    """`_tile6` for positions pos[p0:p0+4]: out[:4·FV]."""
    b0, b1, b2, b3 = s0 + pos[p0], s0 + pos[p0 + 1], s0 + pos[p0 + 2], s0 + pos[p0 + 3]
    z = simd.zero(wt)
    a00, a01, a10, a11, a20, a21, a30, a31 = _start8(out, acc, z)
    ahead, every, due = pf
    for t in range(t0, t1):
        o = simd.get(toff, t)       # (no sign test of t)
        v0, v1 = _tap_weights(wt, w0, _tap(tidx, t), ahead if due == 0 else 0)
        due = every - 1 if due == 0 else due - 1
        a00, a01 = fma2(a00, a01, simd.get(src, b0 + o), v0, v1)
        a10, a11 = fma2(a10, a11, simd.get(src, b1 + o), v0, v1)
        a20, a21 = fma2(a20, a21, simd.get(src, b2 + o), v0, v1)
        a30, a31 = fma2(a30, a31, simd.get(src, b3 + o), v0, v1)
    _store8(out, a00, a01, a10, a11, a20, a21, a30, a31)


#: The microkernels' `pf` that prefetches nothing.
NO_PREFETCH = (0, 1, 0)


@_jit
def run_tile(pv, npos, out, src, s0, wt, w0, toff, tidx, t0, t1, acc, pos, p0, pf):
    """The microkernel of pv positions (`_tile8`, `_tile6`, else `_tile4`) on these arguments,
    for `npos` positions wanted: up to 4 (a run's last tile; 7x7 and 13x13 maps leave one after
    whole tiles of 8) on `_tile4`, the same sums with fewer computed (darknet19's 512 -> 1024 on
    7x7 at b1 within the forward 2.2-2.3 -> 1.9-2.1 ms)."""
    if npos <= 4:
        _tile4(out, src, s0, wt, w0, toff, tidx, t0, t1, acc, pos, p0, pf)
    elif pv == 8:
        _tile8(out, src, s0, wt, w0, toff, tidx, t0, t1, acc, pos, p0, pf)
    elif pv == 6:
        _tile6(out, src, s0, wt, w0, toff, tidx, t0, t1, acc, pos, p0, pf)
    else:
        _tile4(out, src, s0, wt, w0, toff, tidx, t0, t1, acc, pos, p0, pf)
