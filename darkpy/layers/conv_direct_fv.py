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

    def _backward_fv(self, x, d, prev) -> None:
        """weights.grad += the weight gradient of the delta d (B, n, oh, ow) (w.r.t. the raw
        product); then, when there is a previous delta prev, the input gradient added into it: the
        correlation of d with the filters turned and transposed (stride 1, `fvg.input_grad_add`)."""
        fvg.weight_grad(self.weights.grad, x, d, self.stride_y, self.stride_x, self.padding)
        if prev is None:
            return
        c = self.in_shape[0]
        self._wt_flipped = self.training_buffer(
            self._wt_flipped, (self.n * self.size * self.size * fv.padded_filters(c),))
        fv.filters_last(self._wt_flipped, fvg.turned(self.weights.value))
        fvg.input_grad_add(prev, d, self._wt_flipped, self.size, self.padding)
