"""`[convolutional]` with `xnor=1` (XNOR-Net) or `binary=1` (binary weights): AlexeyAB's binary nets.

Forward (AlexeyAB's `forward_convolutional_layer`, float path): the weights are replaced by their
binarised copy, each filter f by `mean_f · sign(w)` with `mean_f` the mean |w| over the filter's
c·k·k values (`sign(w) = +1` for w > 0, else −1); with `xnor=1` the input is binarised too, to
±1 (`x >= 0 → +1`, as Darknet's GPU kernel; its CPU one uses x > 0, which differs only at exactly
0). Zero padding stays 0. Then the ordinary convolution, bias / batch norm and activation.

Backward (Darknet's GPU path, the one its XNOR nets were trained with; its CPU path runs the plain
convolution backward on the real weights and real input instead): the straight-through estimator.
The weight gradient is the convolution's with the binarised input, w.r.t. the binarised weights,
added to the REAL weights' gradient; the input gradient is the convolution's through the binarised
weights, times hardtanh's gradient of the real input (1 where −1 < x < 1, else 0).
# darknet: the GPU multiplies the WHOLE previous delta by that mask (other consumers' gradients
# too, depending on the order layers run backward); darkpy masks only this layer's contribution.

The .weights layout is the plain convolution's (the real weights are stored). `bin_output=1` only
changes how Darknet's bit-packed inference path stores an output for the next XNOR layer (which
binarises it anyway): it has no numeric effect and is accepted. Darknet forces `groups=1` for
`xnor=1` silently; darkpy refuses `groups > 1` there.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..kernels import jit
from .convolutional import VARIANTS, ConvolutionalLayer


@jit
def binarize_weights(out, w):
    """out, w: (n, K). out[f] = mean(|w[f]|) · (+1 if w > 0 else −1)."""
    n, k = w.shape
    for f in range(n):
        mean = 0.0
        for i in range(k):
            mean += abs(w[f, i])
        mean /= k
        for i in range(k):
            out[f, i] = mean if w[f, i] > 0 else -mean


@jit
def binarize_input(out, x):
    """out, x: (n,). ±1 by the sign of x (0 counts as +1, Darknet's GPU rule)."""
    for i in range(x.size):
        out[i] = 1.0 if x[i] >= 0 else -1.0


@jit
def add_hardtan_masked(delta, tmp, x):
    """delta, tmp, x: (n,). delta += tmp where −1 < x < 1 (hardtanh's gradient: the STE)."""
    for i in range(x.size):
        if x[i] > -1.0 and x[i] < 1.0:
            delta[i] += tmp[i]


class XnorConvolutionalLayer(ConvolutionalLayer):
    """A convolution with binarised weights (`binary=1`), and binarised inputs too (`xnor=1`)."""
    can_keep_filters = False        # its forward convolves with weights binarised each time
    assigns_fresh_delta = False     # xnor=1 adds a gradient of its own into the previous delta

    handled_keys = ("xnor", "binary", "bin_output")

    @staticmethod
    def wants(sec, key) -> bool:
        return bool(sec.get_int(key, 0))

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "XnorConvolutionalLayer":
        xnor = sec.get_bool("xnor", False)
        binary = sec.get_bool("binary", False)
        sec.get_bool("bin_output", False)     # darknet: bit-packed storage only, no numeric effect
        if xnor and sec.get_int("groups", 1) != 1:
            raise sec.error("xnor=1 with groups > 1: darknet silently drops the groups; "
                            "write groups=1", "groups")
        layer = super().from_cfg(sec, in_shape, ctx)
        layer.xnor, layer.binary = xnor, binary
        layer.wbin = np.zeros_like(layer.weights.value)
        return layer

    def _binarized(self) -> np.ndarray:
        binarize_weights(self.wbin.reshape(self.n, -1), self.weights.value.reshape(self.n, -1))
        return self.wbin

    def _input(self, x: np.ndarray) -> np.ndarray:
        if not self.xnor:
            return x
        xb = np.empty(x.shape, self.dtype)
        binarize_input(xb.reshape(-1), np.ascontiguousarray(x, self.dtype).reshape(-1))
        return xb

    def _with_binary_weights(self, run, s):
        real = self.weights.value
        self.weights.value = self._binarized()
        try:
            run(s)
        finally:
            self.weights.value = real

    def forward(self, s) -> None:
        s2 = dataclasses.replace(s, input=self._input(s.input))
        self._with_binary_weights(super().forward, s2)

    def backward(self, s) -> None:
        x = s.input
        own = None if s.delta is None or not self.xnor else np.zeros(s.delta.shape, self.dtype)
        s2 = dataclasses.replace(s, input=self._input(x), delta=s.delta if own is None else own)
        self._with_binary_weights(super().backward, s2)
        if own is not None:
            add_hardtan_masked(s.delta.reshape(-1), own.reshape(-1), np.ascontiguousarray(x).reshape(-1))

    def flops(self) -> float:
        # darknet: an XNOR layer's BFLOPs are printed /32 (bit operations); binary=1 are not
        return super().flops() / 32 if self.xnor else super().flops()

    def summary(self) -> str:
        text = super().summary()
        return ("convX" if self.xnor else "convB") + text[4:]


for _key in XnorConvolutionalLayer.handled_keys[:2]:
    VARIANTS[_key] = XnorConvolutionalLayer
