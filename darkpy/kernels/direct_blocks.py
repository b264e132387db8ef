"""The row blocks of the direct convolution (kernels/direct.py, its weight gradient
kernels/direct_wgrad.py): how many output rows a block takes, the phase planes of the input rows a
block reads (`_fill`), and the prefetch of the next block's input rows while a thread computes one.
"""
from __future__ import annotations

from . import njit, simd

_jit = njit(cache=True, nogil=True, inline="always")
#: A helper that a parallel caller must not inline (see `direct_wgrad._weight_grad_parts`); the
#: direct family's kernels all take these two.
_serial = njit(cache=True, nogil=True)

#: Output positions per row block (rows of Lw values): its planes and sums stay in the L1/L2 caches.
BLOCK_POSITIONS = 1024


def block_rows(oh: int, ow: int, k: int, sx: int) -> int:
    """Output rows per block."""
    return max(1, min(oh, BLOCK_POSITIONS // (ow + (k - 1) // sx)))


#: The forward's blocks are made smaller (down to MIN_FORWARD_ROWS rows) until the batch has at
#: least FORWARD_UNITS of them, so that a small batch's work divides among threads: at b1 a 32x32
#: map was 30 rows + 2 rows, a 16x16 one a single block. Measured on the 2-core Zen 3 at b1, 2
#: threads, each layer's forward alone (median of 50 alternating calls): shapes-tiny's 16 -> 32 on
#: 32x32 with its fused maxpool 151 -> 116 µs at 8 rows; its 32 -> 64 on 16x16 207 µs (serial) ->
#: 144 µs at 8 rows in parallel, 158 at 4. A forward's values do not depend on its blocks (each
#: output sums its taps in one order), so this changes no result; the weight gradient's blocks,
#: whose partial sums it adds, keep `block_rows`.
FORWARD_UNITS = 4
MIN_FORWARD_ROWS = 8


def forward_rows(batch: int, oh: int, ow: int, k: int, sx: int, even: bool = False) -> int:
    """Output rows per block of `conv_forward` for a batch of `batch` items (`even`: a multiple of
    2, for a fused 2x2 maxpool). In an odd batch the threads split the last item's blocks: the
    rows are then made equal blocks of an even count where a size of at least MIN_FORWARD_ROWS
    (and at most `block_rows`) allows, `balanced_rows`."""
    rows = block_rows(oh, ow, k, sx)
    if batch * -(-oh // rows) < FORWARD_UNITS:
        rows = min(rows, max(MIN_FORWARD_ROWS, -(-oh // -(-FORWARD_UNITS // batch))))
    if even:
        rows = max(2, rows - rows % 2)
    return balanced_rows(batch, oh, rows, even)


def balanced_rows(batch: int, oh: int, rows: int, even: bool) -> int:
    """`rows`, or in an odd batch whose blocks two threads would split unevenly (a contiguous half
    of the units each, `twins`), the largest size from `rows` down to MIN_FORWARD_ROWS that cuts
    each map into an even count of equal blocks (`even`: itself even). The layer's kernel alone at
    b1, 2 threads, alternating in one process (2-core Zen 5 VM, 400 rounds): tiny.cfg's 16 -> 128
    on 56x56, blocks of 17, 17, 17 and 5 rows (34 against 22 per thread) -> four of 14: 329 ->
    270 µs; darknet.cfg's 32 -> 64 on 56x56 (16, 16, 16, 8) 306 -> 263 µs; shapes-tiny's first
    layer (pooled 64x64, 14 x 4 + 8 -> 8 x 8) 20.3 -> 19.6 µs. The same values (blocks change
    none)."""
    if batch % 2 == 0:
        return rows
    for r in range(rows, MIN_FORWARD_ROWS - 1, -1):
        if oh % r == 0 and (oh // r) % 2 == 0 and not (even and r % 2):
            return r
    return rows


@_serial
def _fill(pf, x, b, oy0, rows, sy, sx, pad, k, lw):
    """`_fill_strided` with column strides 1 and 2 as constants: a row's every other value is
    gathered in vectors (`simd.evens`; as a constant-stride loop that the compiler vectorised, the
    planes took 37 % of shapes-tiny's first layer's forward at b16 on one thread; vectors: its
    forward at b64, 2 threads, 0.95x the time, yolov4-tiny's 32 -> 64 stride-2 layer's at b1
    0.97x). Compiled on its own, once for the forward and the weight gradient."""
    if sx == 1:
        _fill_strided(pf, x, b, oy0, rows, sy, 1, pad, k, lw)
    elif sx == 2:
        _fill_strided(pf, x, b, oy0, rows, sy, 2, pad, k, lw)
    else:
        _fill_strided(pf, x, b, oy0, rows, sy, sx, pad, k, lw)


@_jit
def _fill_strided(pf, x, b, oy0, rows, sy, sx, pad, k, lw):
    """pf (C·sy·sx planes of R·lw values, R = rows + (k−1)//sy + 1): the phase planes of the
    input rows that output rows oy0..oy0+rows−1 of item b read (0 outside the image)."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    R = rows + (k - 1) // sy + 1
    for c in range(C):
        for qy in range(sy):
            for qx in range(sx):
                p0 = ((c * sy + qy) * sx + qx) * R * lw
                for r in range(R):
                    iy = (oy0 + r) * sy + qy - pad
                    dst = pf[p0 + r * lw:p0 + (r + 1) * lw]
                    if iy < 0 or iy >= H:
                        dst[:] = 0
                        continue
                    # t in [lo, hi) reads inside the row (ix = t·sx + qx − pad in [0, W)):
                    # three loops without a test per value
                    off = qx - pad
                    lo = 0 if off >= 0 else (-off + sx - 1) // sx
                    hi = min((W - off + sx - 1) // sx if W > off else 0, lw)
                    lo = min(lo, hi)
                    for t in range(lo):
                        dst[t] = 0
                    src = x[b, c, iy, lo * sx + off:]
                    mid = dst[lo:]
                    done = 0
                    if sx == 2:     # whole vectors while 2·LANES values of the row remain
                        done = min(hi - lo, src.shape[0] // 2) // simd.LANES * simd.LANES
                        for t in range(0, done, simd.LANES):
                            simd.store(mid, t, simd.evens(simd.load(src, 2 * t),
                                                          simd.load(src, 2 * t + simd.LANES)))
                    for t in range(done, hi - lo):
                        mid[t] = src[t * sx]
                    tail = dst[hi:]
                    for t in range(lw - hi):
                        tail[t] = 0


@_jit
def _run(pf, c, ky, kx, sy, sx, R, lw, M):
    """Tap (c, ky, kx)'s run of M values in the planes pf."""
    a = ((c * sy + ky % sy) * sx + kx % sx) * R * lw + (ky // sy) * lw + kx // sx
    return pf[a:a + M]


#: Each thread asks for the input rows of its next row block while it computes the one before
#: (`prefetch_block`): a first layer reads the network's input, written by the forward's copy or
#: long gone from the caches, in bursts of a block's rows (44 KB for shapes-tiny's 3 -> 16 stride
#: 2 from 128x128) between long computations. Within the forward at b64, processes alternating
#: (2 threads, 2-core Zen 5, medians of 40 forwards, 3 rounds): that layer 2.05-2.20 -> 1.67-1.92
#: ms. False: none.
PREFETCH_ROWS = True


@_jit
def prefetch_rows(a, b, r0, r1):
    """Ask the core for rows r0..r1−1 (clipped to the map) of every channel of item b of a
    (B, C, H, W): each of their cache lines."""
    C, H, W = a.shape[1], a.shape[2], a.shape[3]
    r0, r1 = max(0, r0), min(H, r1)
    af = simd.flat(a)
    for c in range(C):
        for i in range(((b * C + c) * H + r0) * W, ((b * C + c) * H + r1) * W, 64 // a.itemsize):
            simd.prefetch(af, i)


@_jit
def block_input_rows(t, nblk, rows, sy, pad, k):
    """(item, first row, row past the last) of the input rows that row block t (item t // nblk,
    `rows` output rows from (t % nblk)·rows) of a k x k layer at row stride sy and padding `pad`
    reads (and the rows between, where the stride skips some), not clipped to the map."""
    oy0 = (t % nblk) * rows
    return t // nblk, oy0 * sy - pad, (oy0 + rows - 1) * sy + k - pad


@_jit
def prefetch_block(x, t, nblk, rows, sy, pad, k):
    """`prefetch_rows` of the input rows that row block t reads (`block_input_rows`)."""
    b, r0, r1 = block_input_rows(t, nblk, rows, sy, pad, k)
    prefetch_rows(x, b, r0, r1)
