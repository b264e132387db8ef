"""`[convolutional]` with `share_index=k` (AlexeyAB): a convolution that uses layer k's weights.

Layer k (an absolute index, or relative when negative, as Darknet's parser reads it) must be a
`[convolutional]` with the same size, filters, input channels and groups (Darknet errors
otherwise). The sharing layer uses k's weights, biases and, with batch_normalize, k's BN scales
and rolling statistics: the very same arrays, so an update of one is an update of the other.
Its own stride, padding, dilation and activation apply.

Gradients: both layers add into the same gradient buffers, so the shared weights receive the sum
of both layers' gradients, and ONE update consumes it (the sharing layer has no parameters of its
own). # darknet: `update_convolutional_layer` runs for both layers on the same buffers, so the
shared weights are stepped twice per iteration and momentum/decay are applied twice; darkpy steps
once. The batch statistics of a training forward stay per layer (Darknet shares those too, so the
first layer's backward would read the second's batch variance).

The .weights file has no entry for a sharing layer (Darknet saves and loads only convolutions
whose `share_layer` is NULL).
"""
from __future__ import annotations

import numpy as np

from .bias_bn_act import BatchNormParams
from .convolutional import VARIANTS, ConvolutionalLayer


class SharedConvolutionalLayer(ConvolutionalLayer):
    """A convolution whose parameters are another convolution's."""

    handled_keys = ("share_index",)

    @staticmethod
    def wants(sec, key) -> bool:
        return True

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "SharedConvolutionalLayer":
        value = sec.get_int("share_index")
        index = value if value >= 0 else ctx.index + value       # darknet's rule for this key
        if not 0 <= index < ctx.index:
            raise sec.error(f"share_index={value} points to layer {index}, outside 0..{ctx.index - 1}",
                            "share_index")
        src = ctx.layers[index]
        if not isinstance(src, ConvolutionalLayer) or type(src) is not ConvolutionalLayer:
            raise sec.error(f"share_index={value}: layer {index} is [{src.kind}] "
                            f"({type(src).__name__}); it must be a plain [convolutional]", "share_index")
        layer = super().from_cfg(sec, in_shape, ctx)
        if layer.weights.value.shape != src.weights.value.shape or layer.groups != src.groups:
            raise sec.error(f"share_index={value}: layer {index} has weights {src.weights.value.shape} "
                            f"(groups {src.groups}), this layer needs {layer.weights.value.shape} "
                            f"(groups {layer.groups}): size, filters and input channels must match",
                            "share_index")
        if (layer.bn is None) != (src.bn is None):
            raise sec.error(f"share_index={value}: batch_normalize must be the same as layer {index}'s",
                            "batch_normalize")
        layer.share(src)
        return layer

    def share(self, src: ConvolutionalLayer) -> None:
        self.source = src.index
        self.weights, self.biases = src.weights, src.biases
        if src.bn is not None:
            bn = BatchNormParams(self.n, self.dtype)      # own batch statistics
            bn.scales, bn.rolling_mean, bn.rolling_variance = (src.bn.scales, src.bn.rolling_mean,
                                                               src.bn.rolling_variance)
            self.bn = bn
        self.params = []          # updated once, through the source layer

    def init_weights(self, rng: np.random.Generator) -> None:
        """Nothing: the source layer initialises the shared arrays."""

    def after_load(self) -> None:
        """Nothing: `flipped` is the source layer's business (the arrays are its)."""

    def weight_arrays(self) -> list[np.ndarray]:
        return []

    def summary(self) -> str:
        return "convS" + super().summary()[4:]


VARIANTS["share_index"] = SharedConvolutionalLayer
