"""A linear 1x1 `[convolutional]` layer that writes the global `[avgpool]` after it, averaging
first (inference with shared outputs only, `outputs_plan.fuse_pools`).

A classifier's last convolution is often a 1x1 one with a linear activation feeding a global
average pool (darknet19.cfg's 1024 -> 1000 on 7x7, tiny.cfg's 128 -> 1000 on 14x14, digits.cfg's
64 -> 10 on 4x4). Each of its outputs is an affine function of one input position, the same for
every position: bias / batch norm fold into act(raw·k + off) with a linear act, so the mean over
the map of W·x + b is W·mean(x) + b. Averaging the input first computes the same values with
h·w times fewer multiply-adds: one (B, c) x (c, n) product instead of B·h·w columns of them, and
the pool reads the smaller of the two maps. Each layer's forward within the network's, processes
alternating with and without (2 threads, 2-core AVX-512 Xeon): tiny.cfg's 128 -> 1000 on 14x14
and its pool 290 -> 59 µs at batch 1 (the forward 0.95x the time), 21.4 -> 0.8 ms at batch 64
(0.93x); darknet19's 1024 -> 1000 on 7x7 750 -> 262 µs at batch 1 (0.98x); digits' 64 -> 10 on
4x4 39 -> 23 µs at batch 64 (0.97x).

The values are those of the two layers run apart up to rounding (the sums in another order: each
channel's mean, then the products, where the pool averaged the products), not the same bits; it is
for the shared-outputs inference alone, which never shows the convolution's own output, and the
pool's output is tested against the two layers run apart (tests/test_avg_fusion.py).

Where the convolution before the pair is on the direct path across filters and only the pair reads
its output, it writes the means itself (`input_means`, `outputs_plan._write_means`), summing its
tiles as they come out of the microkernel instead of writing its maps; the pair then only takes the
product.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ..kernels import jit, pjit, simd, thread_count
from ..kernels.microgemm import CV, rows8x1, rows8x2
from .base import State
from .pooling import avgpool_forward

#: Most input values and multiply-adds (batch · c · n) of a pair computed in one serial kernel
#: call (means, product and epilogue: digits' 64 -> 10 at batch 1 in 3 µs, where three calls took
#: 10); larger ones average in the parallel average pool, then take the product (the serial call
#: took digits' at batch 64, 65536 values, 46 µs against 28).
SMALL_VALUES = 1 << 13
SMALL_MACS = 1 << 16
#: The product runs on all threads from this many multiply-adds, its filters split between them
#: (each output's sum in the same order at any thread count): tiny.cfg's 128 -> 1000 at batch 1
#: (128000) 50-54 µs with the pool against 73-79 on one thread (2-core AVX-512 Xeon).
PARALLEL_MIN_MACS = 1 << 16
#: Fewest items for which the product runs on the 8-row microkernel, filters by items
#: (`_product_blocked`), rather than as one dot product per output (`_products`, whose horizontal
#: sums and reloads of the means cost more than the FMAs). darknet19's 1024 -> 1000 with its
#: input's averaging, the layer alone within its network (2 threads, 2-core AVX-512 Xeon, min of
#: 30): batch 64 1.84-2.18 -> 0.88 ms, batch 16 0.57 -> 0.27, batch 8 (items padded to 16) 0.28 ->
#: 0.22, batch 4 0.119 -> 0.136 (lost); tiny.cfg's 128 -> 1000 at batch 64 0.46-0.48 -> 0.25-0.29.
#: Only from PARALLEL_MIN_MACS: digits' 64 -> 10 at batch 64, serial as dot products, took 6.6 µs,
#: on both threads as blocks 9-11.
BLOCKED_MIN_BATCH = 8


class AveragedConv:
    """Mixin of ConvolutionalLayer: its forward through the average pool after it."""

    def can_write_averaged(self, pool) -> bool:
        """Whether an inference forward can write the output of `pool`, the global [avgpool]
        reading this layer's output, by averaging first: a 1x1 ungrouped layer at stride 1 without
        padding (each output reads its own position) and a linear activation, not XNOR's (which
        binarises its input)."""
        return (getattr(pool, "kind", None) == "avgpool" and self.size == 1 and self.groups == 1
                and self.stride_x == 1 and self.stride_y == 1 and self.padding == 0
                and self.activation == "linear" and self.can_keep_filters)

    def averaged_flops(self) -> float:
        """Operations per item of a forward that averages first: the c·h·w additions of the means
        and the (c) x (c, n) product's 2·c·n (against `flops()`' 2·c·n·h·w)."""
        c, h, w = self.in_shape
        return float(c * h * w + 2 * c * self.n)

    def averaged_scratch(self) -> None:
        """The (B, c) means `_forward_averaged` writes, made when `fuse_pools` fuses the pair."""
        self._averaged = np.empty((self.batch, self.in_shape[0]), self.dtype)
        blocked = (self.batch >= BLOCKED_MIN_BATCH and self.n >= 8
                   and self.batch * self.in_shape[0] * self.n >= PARALLEL_MIN_MACS)
        items = -(-self.batch // simd.LANES) * simd.LANES if blocked else 0
        #: the means transposed, (c, items) with zeros past the batch, and the products (n, items);
        #: empty where the product is not blocked (`_blocked`)
        self._means_t = np.empty((self.in_shape[0], items), self.dtype)
        self._sums_t = np.empty((self.n if items else 0, items), self.dtype)

    @property
    def _blocked(self) -> bool:
        """Whether `_forward_averaged` takes the product filters by items (`_product_blocked`)."""
        return self._means_t.size > 0

    def writes_means(self) -> bool:
        """Whether an inference forward can write the means of its output maps instead of its
        output, for a following convolution that averages its input first
        (`outputs_plan.fuse_pools`): the direct path across filters (`_fv_writes_means`), and
        Winograd's chunked path, each output plane's mean as the plane is finished, in the cache
        (darknet19's 1024 -> 1000 at b64 averaging its 12.8 MB input itself took 1.10 ms, 0.50
        after the 512 -> 1024 before it wrote the means; that one's time level; 2 threads, 2-core
        AVX-512 Zen 5). Not the GEMM paths: a pass taking the means after BLAS's product cost
        tiny.cfg's 512 -> 128 on 14x14 at b64 what its 128 -> 1000 saved (0.12-0.23 ms)."""
        if self.winograd:
            return not self.winograd_in_bands(self.batch)
        return self._fv_writes_means()

    def _forward_means(self, s: State, x: np.ndarray, y: np.ndarray, mean: np.ndarray) -> None:
        """An inference forward writing its maps' means into `mean` (B, n) (`writes_means`)."""
        epilogue = self._epilogue(False)
        if self.direct_fv:
            self._keep_call(s, self._forward_fv(x, y, epilogue, mean=mean))
        else:
            self._winograd(x, self.weights.value, self.padding, y, add=False, epilogue=epilogue,
                           u=self.kept_filters() if self.keep_filters else None, mean=mean)

    def input_means(self) -> np.ndarray:
        """The (B, c) means of the input, for the layer before to write (`means_by`, set by
        `fuse_pools`): `_forward_averaged` then only takes the product."""
        return self._averaged

    def _forward_averaged(self, x: np.ndarray, epilogue: tuple) -> None:
        """The pool's output (B, n) := the mean of x (B, c, h, w) over its map (as [avgpool]
        computes it: sum, then divide), times the weights, then `epilogue`'s raw·k + off (see
        `inference_epilogue`; in float64, as the separate pass computes it). The product is
        darkpy's own: through numpy's BLAS darknet19's 1024 -> 1000 at batch 1 took 400-510 µs
        against 240-250, and the next forward's first layer (after it, on BLAS's thread, numba's
        had gone idle) 770-830 µs against 695-700 (2-core AVX-512 Xeon)."""
        b, c = self.batch, self.in_shape[0]
        k, off, _ = epilogue
        out = self.average_into.output.reshape(b, self.n)
        w = self.weights.value.reshape(self.n, c)
        if self.means_by is None:           # else the layer before wrote the means
            if x.size <= SMALL_VALUES and b * c * self.n <= SMALL_MACS:
                _small(out, self._averaged, x.reshape(b, c, -1), w, k, off)
                return
            avgpool_forward(self._averaged.reshape(-1), x.reshape(b * c, -1))
        if self._blocked:
            _product_blocked(out, self._averaged, w, k, off, thread_count(), self._means_t, self._sums_t)
        elif b * c * self.n >= PARALLEL_MIN_MACS:
            _product_parallel(out, self._averaged, w, k, off, thread_count())
        else:
            _products(out, self._averaged, w, k, off, 0, self.n)


@jit
def _small(out, mean, x, w, k, off):
    """out (B, n) := ((mean (B, c) := x (B, c, S) averaged over S) @ w (n, c)ᵀ) · k + off."""
    B, C, S = x.shape
    for b in range(B):
        for c in range(C):
            acc = x[b, c, 0]
            for j in range(1, S):
                acc += x[b, c, j]
            mean[b, c] = acc / S
    _products(out, mean, w, k, off, 0, w.shape[0])


@pjit
def _product_parallel(out, mean, w, k, off, threads):
    """`_products` of all the filters, split between `threads` parts."""
    n = w.shape[0]
    parts = min(threads, n)
    for i in prange(parts):
        _products(out, mean, w, k, off, i * n // parts, (i + 1) * n // parts)


@jit
def _products(out, mean, w, k, off, f0, f1):
    """out[:, f0:f1] := (mean (B, c) @ w[f0:f1]ᵀ) · k + off, each sum in vectors along c (two
    chains), the affine in float64."""
    C = w.shape[1]
    for f in range(f0, f1):
        wf = w[f]
        for b in range(mean.shape[0]):
            mb = mean[b]
            a0, a1 = simd.zero(wf), simd.zero(wf)
            c = 0
            while c + 2 * simd.LANES <= C:
                a0 = simd.add(a0, simd.mul(simd.load(mb, c), simd.load(wf, c)))
                a1 = simd.add(a1, simd.mul(simd.load(mb, c + simd.LANES),
                                           simd.load(wf, c + simd.LANES)))
                c += 2 * simd.LANES
            a0 = simd.add(a0, a1)
            acc = simd.lane(a0, 0)
            for j in range(1, simd.LANES):
                acc += simd.lane(a0, j)
            for j in range(c, C):
                acc += mb[j] * wf[j]
            out[b, f] = acc * k[f] + off[f]


@pjit
def _product_blocked(out, mean, w, k, off, threads, mt, sums):
    """out (B, n) := (mean (B, c) @ w (n, c)ᵀ) · k + off through the transposed product sums (n,
    items) := w @ mt, mt (c, items) the means transposed (zeros past B): blocks of eight filters by
    two vectors of items on `rows8x2` (a last vector on `rows8x1`), each sum over c in order; the
    blocks split between `threads` parts. With n not a multiple of 8 the last block starts at
    n − 8 (its first rows computed twice, the same values)."""
    B, C = mean.shape
    for c in range(C):
        for b in range(B):
            mt[c, b] = mean[b, c]
        for b in range(B, mt.shape[1]):
            mt[c, b] = 0
    blocks = -(-w.shape[0] // 8)
    parts = min(threads, blocks)
    for i in prange(parts):
        for j in range(i * blocks // parts, (i + 1) * blocks // parts):
            _filter_block(out, mt, w, k, off, min(8 * j, w.shape[0] - 8), sums)


@jit
def _filter_block(out, mt, w, k, off, r, sums):
    """Filters r..r+7 of `_product_blocked`: their sums over every item, then the epilogue."""
    C, items = w.shape[1], mt.shape[1]
    s1, w1, m1 = simd.flat(sums), simd.flat(w), simd.flat(mt)
    v = 0
    while v + CV <= items:
        rows8x2(s1, r * items + v, items, w1, r * C, C, m1, v, items, 0, C, False)
        v += CV
    if v < items:
        rows8x1(s1, r * items + v, items, w1, r * C, C, m1, v, items, 0, C, False)
    for f in range(r, r + 8):
        for b in range(out.shape[0]):
            out[b, f] = sums[f, b] * k[f] + off[f]
