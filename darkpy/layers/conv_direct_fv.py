"""The direct path vectorised across filters of `[convolutional]` layers (kernels/direct_fv.py):
which layers take it, the weights laid out filters last (kept while they are fixed), and the
forward and backward calls.

`ConvolutionalLayer` (layers/convolutional.py) sets `direct_fv` from `_fv_applies` when it
allocates and inherits `DirectFvConv`'s methods, as it does `WinogradConv`'s.
"""
from __future__ import annotations

import numpy as np

from ..kernels import activations as act
from ..kernels import direct_fv as fv
from ..kernels import direct_fv_grad as fvg
from ..kernels.kernel_call import KeptCall

#: The input gradient of a 1x1 stride-1 unpadded layer on this path is one GEMM per item, Wᵀ (c, n)
#: @ d_b (n, oh·ow), stacked (`blas.matmul`), written straight into a fresh previous delta
#: (`ConvolutionalLayer.assigns_fresh_delta`), else added; instead of the forward kernel run on
#: the delta with the filters transposed (`fvg.input_grad_add`), whose vectors run across the
#: input's channels and whose taps are the layer's few filters. Each input gradient alone (2
#: threads, 2-core Zen 5 EPYC, median of 30 calls; fresh / added against the kernel): cifar's
#: 512 -> 10 on 7x7 at b128 0.37 / 0.67 against 1.29 ms, shapes-tiny's 128 -> 64, 128 -> 27 and
#: 64 -> 32 on 8x8 at b32 0.14 / 0.16 against 0.18 ms, 0.06 / 0.08 against 0.13, 0.04 / 0.05
#: against 0.07, digits' 64 -> 10 on 4x4 at b32 0.005 / 0.008 against 0.024. False: the kernel.
GEMM_INPUT_GRAD_1X1 = True


class DirectFvConv:
    """Mixin of ConvolutionalLayer: its direct_fv path."""

    def _fv_applies(self, inference_only: bool, batch: int) -> bool:
        """Whether the direct convolution across filters (`fv.supports`) can take this layer at
        `batch`."""
        return fv.supports(self.in_shape[0] // self.groups, self.n, self.size, self.groups,
                           self.dilation, self.out_shape[1] * self.out_shape[2], inference_only,
                           max(self.stride_x, self.stride_y), self.padding, batch)

    def filters_last(self) -> np.ndarray:
        """The weights laid out for `fv.conv_forward`: while they are fixed (`inference_only`) made
        at the first call after `allocate` or `weights_changed` and kept, else at every call."""
        w = self.weights.value
        if self._kept_wt is None:
            self._kept_wt = np.empty(w[0].size * fv.padded_filters(self.n), self.dtype)
        elif self.inference_only and self.can_keep_filters:        # (XNOR binarises each time)
            return self._kept_wt
        fv.filters_last(self._kept_wt, w)
        return self._kept_wt

    def weights_changed(self) -> None:
        """Drop what was computed from the weights (the kept layouts of both paths)."""
        super().weights_changed()
        self._kept_wt = None

    def _forward_fv(self, x, y, epilogue: tuple, pool=None, mean=None) -> KeptCall:
        """y (B, n, oh, ow) := the correlation of x (B, c, h, w), then `epilogue` (see
        `inference_epilogue`) when not empty; with `pool`, its 2x2 maxima written there instead
        (`_fv_writes_pooled`); with `mean` (B, n), each map's mean (`can_write_means`). Returns
        the kernel call it made (`fv.forward_call`)."""
        call = KeptCall(*fv.forward_call(y, x, self.filters_last(), self.size, self.stride_y,
                                         self.stride_x, self.padding, *epilogue, pool=pool,
                                         mean=mean))
        call()
        return call

    def _fv_writes_means(self) -> bool:
        """Whether this path's inference forward can write its output maps' means instead of the
        output (`fv.writes_means`: the epilogue on the tiles)."""
        return self.direct_fv and fv.writes_means(self.dtype, act.kernel_code(self.act, self.dtype))

    def _fv_writes_pooled(self) -> bool:
        """Whether this path's inference forward can write a following 2x2 maxpool
        (`fv.writes_pooled`)."""
        return self.direct_fv and fv.writes_pooled(
            self.dtype, act.kernel_code(self.act, self.dtype), self.out_shape[1] * self.out_shape[2])

    def _fv_input_grad_by_gemm(self) -> bool:
        """Whether this layer's input gradient is the stacked GEMM (GEMM_INPUT_GRAD_1X1)."""
        return GEMM_INPUT_GRAD_1X1 and self.is_gemm_only and self.groups == 1

    def _backward_fv(self, x, d, prev, fresh: bool) -> None:
        """weights.grad += the weight gradient of the delta d (B, n, oh, ow) (w.r.t. the raw
        product); then, when there is a previous delta prev, the input gradient added into it (with
        `fresh`, written: see `_fv_input_grad_by_gemm`): the correlation of d with the filters
        turned and transposed (stride 1, `fvg.input_grad_add`), or for a 1x1 layer Wᵀ @ d."""
        fvg.weight_grad(self.weights.grad, x, d, self.stride_y, self.stride_x, self.padding)
        if prev is None:
            return
        if self._fv_input_grad_by_gemm():           # the GEMM path's (layers/conv_gemm.py)
            self._input_grad_stacked(d.reshape(self.batch, self.n, -1), prev,
                                     self.weights.value.reshape(self.n, -1), fresh)
            return
        c = self.in_shape[0]
        self._wt_flipped = self.training_buffer(
            self._wt_flipped, (self.n * self.size * self.size * fv.padded_filters(c),))
        fv.filters_last(self._wt_flipped, fvg.turned(self.weights.value))
        fvg.input_grad_add(prev, d, self._wt_flipped, self.size, self.padding)
