"""The GEMM path of `[convolutional]` layers: the column matrix (im2col) of a chunk of items and
its GEMMs with the weights, forward and backward, for the layers no other path takes (the 1x1
layers on 1x1 maps as one GEMM of the batch's rows, `rows_gemm`; the whole batch as one stacked
GEMM, `one_gemm`; else chunks of items and groups, side by side in one wide GEMM or stacked).

`ConvolutionalLayer` (layers/convolutional.py) sets which of them from its shape when it allocates
and inherits `GemmConv`'s methods, as it does the other paths' mixins'.
"""
from __future__ import annotations

import numpy as np

from .. import blas
from ..kernels import im2col as ic


#: `rows_gemm`'s forward as W (n, c) @ xᵀ (c, B) into the workspace, then transposed into the
#: output (B, n), instead of x (B, c) @ Wᵀ (`rows_transposed`), in a batch of at most
#: ROWS_TRANSPOSED_MAX_BATCH items with at least ROWS_TRANSPOSED_MIN_WEIGHTS weights: OpenBLAS
#: runs the product with the long side in rows faster. darknet.cfg's 1024 -> 1000 within its
#: forward (2 threads, 2-core Zen 5 EPYC, SkylakeX kernels, per-layer medians, two processes each
#: way): at b4 0.77-0.90 -> 0.41-0.43 ms, at b16 0.60-0.61 -> 0.38-0.40, at b64 level (0.76-0.82:
#: its 4 MB of weights come from memory). The product alone, weights from memory: 1024 -> 1000 at
#: b2, b8, b32 0.82, 0.51, 0.61 -> 0.46, 0.32, 0.47 ms, at b128 and b256 1.02, 1.54 -> 1.13, 2.05;
#: 512 -> 512 at b16 0.25 -> 0.18, b64 level; 512 -> 10 at b16 0.025 -> 0.13 (the transpose's
#: threads woken for a product that small). The transposed product runs on darkpy's own GEMM where
#: it fits (`blas.product`: a batch that is a multiple of 16, xᵀ packed once; kernels/gemm.py):
#: within their forwards at b64 (2-core AVX-512 Xeon, family 6 model 167, SkylakeX kernels, two
#: processes each) darknet.cfg's 1024 -> 1000 1.16-1.18 -> 0.83-0.88 ms (x @ Wᵀ 0.88-0.93),
#: resnet50's 2048 -> 1000 1.84-2.03 -> 1.47-1.57 ms; at b16 darknet.cfg's 0.73 -> 0.46 ms.
ROWS_TRANSPOSED_MAX_BATCH = 64
ROWS_TRANSPOSED_MIN_WEIGHTS = 1 << 18


def rows_transposed(batch: int, n: int, c: int) -> bool:
    """Whether a `rows_gemm` layer of n filters over c channels runs its forward transposed at
    `batch` (ROWS_TRANSPOSED_MAX_BATCH, ROWS_TRANSPOSED_MIN_WEIGHTS)."""
    return batch <= ROWS_TRANSPOSED_MAX_BATCH and n * c >= ROWS_TRANSPOSED_MIN_WEIGHTS


class GemmConv:
    """Mixin of ConvolutionalLayer: its GEMM path."""

    def _columns(self, xg: np.ndarray) -> np.ndarray:
        """The column matrix (c/g·k·k, items·oh·ow) of the input chunk xg (items, c/g, h, w), items
        side by side (`self.wide`), else the stacked (items, c/g·k·k, oh·ow) matrices: a view of xg
        itself for a 1x1 stride-1 unpadded layer when not side by side, else unrolled into the start
        of the workspace."""
        nb, cg = xg.shape[:2]
        if not self.wide:
            if self.is_gemm_only:
                return xg.reshape(nb, cg, -1)
            col = ic.get((nb, *self.col_shape), self.dtype)
            _, oh, ow = self.out_shape
            ic.im2col(col, xg, self.size, self.stride_y, self.stride_x, self.padding * self.dilation,
                      self.dilation, oh, ow)
            return col
        if nb == 1 and self.is_gemm_only:
            return xg.reshape(cg, -1)
        rows, cols = self.col_shape
        col = ic.get((rows, nb * cols), self.dtype)
        _, oh, ow = self.out_shape
        ic.im2col_wide(col.reshape(rows, nb, cols), xg, self.size, self.stride_y, self.stride_x,
                       self.padding * self.dilation, self.dilation, oh, ow)
        return col

    def _rows(self, nb: int) -> np.ndarray:
        """The workspace after the column matrix, (n/g, nb·oh·ow): a chunk's output or delta with
        its items side by side (the GEMM's layout)."""
        rows, cols = self.col_shape
        return ic.get((self.n // self.groups, nb * cols), self.dtype, offset=rows * nb * cols)

    def _chunks(self):
        """(item slice, group index, input-channel slice, filter slice) for every GEMM block."""
        cg, ng = self.in_shape[0] // self.groups, self.n // self.groups
        step = self.chunk
        for b0 in range(0, self.batch, step):
            for j in range(self.groups):
                yield (slice(b0, min(b0 + step, self.batch)), j, slice(j * cg, (j + 1) * cg),
                       slice(j * ng, (j + 1) * ng))

    def _forward_gemm(self, x: np.ndarray, y: np.ndarray) -> None:
        """y (B, n, oh·ow) := the GEMM path's product: the batch's rows at once (`rows_gemm`), one
        stacked GEMM (`one_gemm`), else one 2-D GEMM per chunk and group, `W_g @ col`, straight
        into the output for a single item, else into the workspace and then reordered
        batch-major."""
        wmat = self.weights.value.reshape(self.groups, self.n // self.groups, -1)
        if self.rows_gemm and self.rows_transposed:
            t = ic.get((self.n, 1, self.batch), self.dtype)
            blas.product(t.reshape(self.n, self.batch), wmat[0], x.reshape(self.batch, -1).T)
            ic.rows_to_items(y.reshape(self.batch, self.n, 1), t.reshape(self.n, self.batch, 1))
            return
        if self.rows_gemm:
            blas.matmul(x.reshape(self.batch, -1), wmat[0].T, out=y.reshape(self.batch, self.n))
            return
        if self.one_gemm:                   # `_chunks`' one block, unsliced
            blas.matmul(wmat[0], self._columns(x), out=y)
            return
        for items, j, cin, fout in self._chunks():
            col = self._columns(x[items, cin])
            yg = y[items, fout]
            if not self.wide:
                blas.matmul(wmat[j], col, out=yg)
            elif yg.shape[0] == 1:
                blas.matmul(wmat[j], col, out=yg[0])
            else:
                out = self._rows(yg.shape[0])
                blas.matmul(wmat[j], col, out=out)
                ic.rows_to_items(yg, out.reshape(out.shape[0], yg.shape[0], -1))

    def _backward_rows(self, d2, x2, prev, w, fresh: bool) -> None:
        """Backward of `rows_gemm`: d2 (B, n), x2 (B, c), w (n, c); prev (B, c, 1, 1) or None, +=
        (fresh: =) the input gradient."""
        blas.matmul(d2.T, x2, out=self.wgrad_tmp)
        ic.add_into(self.weights.grad.reshape(-1), self.wgrad_tmp.reshape(-1))
        if prev is not None and fresh:
            blas.matmul(d2, w, out=prev.reshape(x2.shape))
        elif prev is not None:
            dx = ic.get(x2.shape, self.dtype)
            blas.matmul(d2, w, out=dx)
            ic.add_into(prev.reshape(-1), dx.reshape(-1))

    def _backward_stacked(self, dg, xg, pg, w, wgrad) -> None:
        """Backward of one chunk and group with numpy's stacked matmul (layers too small for
        `wide`): dg (items, n/g, S), xg (items, c/g, h, w), pg like xg or None, w / wgrad (n/g, K)."""
        _, oh, ow = self.out_shape
        nb = dg.shape[0]
        col = self._columns(xg)
        tmp = self.wgrad_tmp[:nb]
        blas.matmul(dg, col.transpose(0, 2, 1), out=tmp)
        for i in range(nb):
            wgrad += tmp[i]
        if pg is not None:
            self._input_grad_stacked(dg, pg, w)

    def _input_grad_stacked(self, dg, pg, w, fresh: bool = False) -> None:
        """pg += the input gradient of one chunk and group: col2im(wᵀ @ dg), stacked per item; for
        a 1x1 layer (its own column matrix) wᵀ @ dg itself, written into pg when `fresh` (pg the
        whole previous delta, nothing in it yet)."""
        _, oh, ow = self.out_shape
        nb = dg.shape[0]
        if fresh and self.is_gemm_only:
            blas.matmul(w.T, dg, out=pg.reshape(nb, w.shape[1], -1))
            return
        ic.reserve(nb * self.col_shape[0] * self.col_shape[1], self.dtype)
        dcol = ic.get((nb, *self.col_shape), self.dtype)
        blas.matmul(w.T, dg, out=dcol)
        if self.is_gemm_only and pg.flags.c_contiguous:
            ic.add_into(pg.reshape(-1), dcol.reshape(-1))
        elif self.is_gemm_only:
            pg += dcol.reshape(pg.shape)
        else:
            ic.col2im_add(pg, dcol, self.size, self.stride_y, self.stride_x,
                          self.padding * self.dilation, self.dilation, oh, ow)
