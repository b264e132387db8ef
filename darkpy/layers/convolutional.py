"""`[convolutional]` / `[conv]`: 2-D convolution with optional batch norm (spec §2.1, §5).

Besides the GEMM path described here (its helpers in layers/conv_gemm.py), a layer may take the
direct convolution across filters (layers/conv_direct_fv.py), Winograd (layers/conv_winograd.py),
the row-vectorised direct one or the pointwise kernel, chosen by shape when it allocates.

GEMM forward, per chunk of batch items and group: im2col with the items side by side into the shared
workspace, then ONE 2-D GEMM `W_g (n/g, c/g·k·k) @ col (c/g·k·k, items·oh·ow)`, reordered into the
batch-major output (a single item needs no reordering, and a single item of a 1x1 stride-1 unpadded
convolution skips im2col: its input already is the column matrix). Then ONE fused pass adds the
bias or applies batch norm (whose β is `biases`), and the activation.

Backward: one fused pass turns `delta` (gradient w.r.t. the activated output) into the gradient w.r.t.
the raw product, accumulating bias / BN-scale gradients; it is left in `delta` afterwards, as Darknet
leaves it (the reference dumps call it `delta_out`). Then per chunk and group, with the chunk's items
side by side as in the forward pass, the weight gradient `+= delta_g @ colᵀ` (one GEMM) and the input
gradient `col2im(W_gᵀ @ delta_g)` is ADDED into the previous delta.
# darknet: pjreddie's CPU 1x1 convolution overwrites the previous delta (GEMM beta=0), losing other
# consumers' gradients; darkpy always adds (as cuDNN and AlexeyAB do).

Keys: filters, size, stride (AlexeyAB stride_x / stride_y), pad / padding (pad=1 means size/2 per side
and overrides padding), groups, dilation (AlexeyAB: padding is multiplied by the dilation),
batch_normalize, activation (default logistic), flipped. binary / xnor (layers/xnor.py) and
share_index (layers/share.py) are subclasses chosen through VARIANTS; AlexeyAB's deformable and
anti-aliased variants are rejected with a clear error.
"""
from __future__ import annotations

import math

import numpy as np

from .. import blas
from ..kernels import activations as act
from ..kernels import direct as dk
from ..kernels import direct_blocks as db
from ..kernels import direct_fv_grad as fvg
from ..kernels import direct_wgrad as dwg
from ..kernels import im2col as ic
from ..kernels.kernel_call import KeptCall
from ..kernels import pointwise as pw
from ..kernels import winograd as wg
from ..memory import param_zeros
from .base import Layer, Param, State, fmt_shape, register
from .bias_bn_act import (BatchNormParams, allocate_bias_bn_act_training, backward_bias_bn_act,
                          forward_bias_bn_act, inference_epilogue)
from .conv_averaged import AveragedConv
from .conv_direct_fv import DirectFvConv
from .conv_gemm import GemmConv, rows_transposed
from .conv_winograd import WinogradConv

#: Per-item multiply-adds (n/g · c/g·k·k · oh·ow) from which a batch's items are put side by side
#: into one GEMM (`ConvolutionalLayer.wide`); below it numpy's stacked matmul (one GEMM per item).
WIDE_MIN_MACS = 1 << 22
#: ... except 1x1 stride-1 layers with at least this many output positions: their per-item GEMM reads
#: the input in place and writes the output in place, which measured 1.2-1.9x faster than the two
#: reordering copies of the side-by-side GEMM (resnet50's 14x14 and 56x56 bottleneck convs at b16).
WIDE_GEMM_ONLY_MAX_S = 128

#: Winograd F(2x2, 3x3) (kernels/winograd.py) for 3x3 stride-1 layers, when the batch's output
#: tiles (2x2 blocks) number at least WINOGRAD_MIN_TILES (the filter transform, done once per
#: forward, must be amortised) and the layer has at least WINOGRAD_MIN_CHANNELS input channels
#: (a 3-channel first layer makes tiny GEMMs). False: always im2col + GEMM.
WINOGRAD = True
WINOGRAD_MIN_TILES = 128
WINOGRAD_MIN_CHANNELS = 16
#: ... or, when the layer keeps its filter transform (inference with fixed weights,
#: `conv_winograd.plan_kept_filters`), fewer tiles but at least WINOGRAD_KEPT_MIN_TILES whole ones
#: (2x2 blocks inside the output, so odd maps count their waste). With the transform paid once,
#: batch 1 gains on 14x14 and 13x13 maps (36-49 whole tiles: cifar forward 11.9 -> 10.7 ms,
#: yolov3-tiny 41.2 -> 40.3 ms with the two 256 -> 512 layers its cap allows; all three 35.6 ->
#: 31.3) and on 8x8 ones (16: shapes-tiny's 64 -> 128 layers 148 -> 95 µs, its forward 1.43 -> 1.03),
#: and loses on 7x7 ones (9 whole of 16: cifar's 512-channel layers), alternating in one process
#: on a 2-core Zen 4. Also at least WINOGRAD_KEPT_MIN_CHANNELS input channels: digits' 16 -> 32
#: layer on 8x8 lost there (80 -> 90 µs the whole forward). Only where the fused bands take the
#: layer (`winograd_in_bands`): on the chunked path the 16 GEMMs are as narrow as the tiles (49 at
#: 13x13), and the GEMM path's one GEMM (N = oh·ow) outran them since it runs split on numba's
#: threads (darkpy/blas.py). Each layer within its network's forward at b1, processes alternating
#: (2 threads, 2-core Zen 5 EPYC): darknet19's 256 -> 512 on 14x14 1.68-1.75 -> 1.26-1.42 ms,
#: yolov4-tiny's on 13x13 1.69 -> 1.19 ms, yolov3-tiny's two 1.72-1.77 -> 1.26-1.38 ms; resnet50's
#: 256 -> 256 on 14x14 (fused bands) stay: 0.38 against 0.73 ms on the GEMM path. True: the
#: chunked path too, as before 2026-12-06.
WINOGRAD_KEPT_CHUNKED = False
WINOGRAD_KEPT_MIN_TILES = 16
WINOGRAD_KEPT_MIN_CHANNELS = 32
#: An inference forward on the Winograd or direct path applies bias or batch norm and the activation
#: to each block of output it writes, while it is in the cache, instead of in a separate pass over
#: the whole output (the same bits: `inference_epilogue`). False: always the separate pass.
FUSED_EPILOGUE = True
#: An inference forward on the Winograd or direct path writes the 2x2 stride-2 [maxpool] that alone
#: reads its output itself (`outputs_plan.fuse_pools`) when its output maps have at least this many
#: positions. Alternating in one process (2 threads, Zen 4): tiny.cfg at b64 545 -> 508 ms (the
#: four maxpools' 25 ms and part of the convolutions' writes), darknet.cfg b1 8.93 -> 8.77 ms,
#: yolov3-tiny b1 46.9 -> 45.9 ms. On digits' 8x8 Winograd layer at b64 the fused layer measured
#: slower in one run (539 against 497 + 16 µs) and level in another, for at most the pool's 16 µs.
POOLED_MIN_POSITIONS = 16 * 16
#: Direct convolution (kernels/direct.py) for layers with at most 4 input channels and 32 filters
#: (128 for 3x3 kernels, and for any kernel in a network that only infers) and for 3x3 layers
#: with at most 32 channels and 128 filters on large maps, or on small ones in a small batch
#: (`dk.supports`): no im2col matrix, in the
#: forward pass and the weight gradient (and the input gradient of stride-1 layers with
#: DIRECT_INPUT_GRAD; others im2col's). It comes before Winograd. False: im2col + GEMM or Winograd.
DIRECT = True
#: The input gradient of a stride-1 direct layer by the direct forward kernel itself (the delta
#: correlated with the turned filters, `_direct_input_grad`) instead of a GEMM into an im2col-sized
#: matrix and col2im. False: the GEMM and col2im.
DIRECT_INPUT_GRAD = True
#: Layers with small output maps and few taps per filter (`fv.supports`: in training only stride-1
#: ones) take the direct convolution vectorised across filters (kernels/direct_fv.py) in the
#: forward pass and both gradients, before every other path. False: never.
DIRECT_FV = True
#: 1x1 layers of a network that will only infer take the fused 1x1 kernel (kernels/pointwise.py)
#: where it pays (`pw.supports`), before every other path. False: never.
POINTWISE = True
#: ... and batches of large outputs (`pw.supports_large`) the GEMM with the epilogue fused
#: (`blas.pointwise`). False: the GEMM path and its separate pass.
POINTWISE_LARGE = True
#: ... and the other 1x1 layers of such a network on maps of at least PACKED_MIN_POSITIONS
#: positions, with at most PACKED_MAX_INPUT_BYTES of input in the batch, the microkernel on packed
#: panels with the epilogue fused (`pw.packed_forward`; measured there). False: never.
POINTWISE_PACKED = True
PACKED_MIN_POSITIONS = 512
PACKED_MAX_INPUT_BYTES = 4 << 20

#: Keys that switch on behaviour darkpy does not implement; a non-zero value is an error.
UNSUPPORTED_KEYS = {
    "binary": "binary (1-bit) weights", "xnor": "XNOR networks", "bin_output": "binary outputs",
    "antialiasing": "anti-aliased convolution", "share_index": "weights shared with another layer",
    "assisted_excitation": "assisted excitation", "sway": "deformable (sway) convolution",
    "rotate": "deformable (rotate) convolution", "stretch": "deformable (stretch) convolution",
    "stretch_sway": "deformable (stretch_sway) convolution", "coordconv": "CoordConv",
}


#: key -> subclass of ConvolutionalLayer that a `[convolutional]` section with that key builds
#: (filled in by the variant's module: layers/xnor.py, layers/share.py).
VARIANTS: dict[str, type] = {}


def conv_out_size(size_in: int, k: int, stride: int, pad: int, dilation: int) -> int:
    """Output length along one axis; `pad` is per side, before multiplying by the dilation."""
    span = dilation * (k - 1) + 1
    return (size_in + 2 * pad * dilation - span) // stride + 1


@register
class ConvolutionalLayer(DirectFvConv, WinogradConv, AveragedConv, GemmConv, Layer):
    kind = "convolutional"
    aliases = ("conv",)
    needs_image = True
    #: may keep its Winograd filter transform while the weights are fixed (a variant whose forward
    #: swaps in other weights, such as XNOR's binarised ones, says False)
    can_keep_filters = True

    def __init__(self, index: int, in_shape, filters: int, size: int, stride_y: int = 1,
                 stride_x: int = 1, padding: int = 0, groups: int = 1, dilation: int = 1,
                 batch_normalize: bool = False, activation: str = "logistic", flipped: bool = False,
                 dtype=np.float32):
        self.n, self.size, self.groups, self.dilation = filters, size, groups, dilation
        self.stride_y, self.stride_x, self.padding = stride_y, stride_x, padding
        super().__init__(index, in_shape, self.compute_out_shape(in_shape), dtype)
        c = self.in_shape[0]
        self.activation = activation
        self.act = act.code(activation)
        self.batch_normalize = batch_normalize
        self.flipped = flipped
        #: True: reproduce pjreddie's CPU batch norm (for comparing with its dumps); see kernels/bn.py.
        self.darknet_cpu_bn = False
        self.biases = Param("biases", param_zeros(filters, self.dtype), param_zeros(filters, self.dtype))
        self.weights = Param("weights", param_zeros((filters, c // groups, size, size), self.dtype),
                             param_zeros((filters, c // groups, size, size), self.dtype), decay=True)
        self.bn = BatchNormParams(filters, self.dtype) if batch_normalize else None
        self.params = [self.biases] + ([self.bn.scales] if self.bn else []) + [self.weights]
        self.pre = np.zeros((0,), self.dtype)      # pre-activation (swish/mish/...: their gradient needs it)
        self.xnorm = np.zeros((0,), self.dtype)    # BN x̂ of the last training forward
        self.wgrad_tmp = np.zeros((0,), self.dtype)
        self.chunk = 1
        self.wide = False
        self.winograd = False
        self.direct = False
        self.direct_fv = False
        self.pointwise = self.pointwise_large = self.pointwise_packed = False
        self.packed_ahead = 0
        self._kept_wt = None                        # direct_fv's filters_last layout, once made
        self._wt_flipped = np.zeros((0,), self.dtype)   # ... and its input gradient's
        self.wchunk = 1
        #: keep the Winograd filter transform between forwards (set by `plan_kept_filters` while the
        #: network's weights are fixed for inference), and the kept transform (None: not made yet)
        self.keep_filters = False
        #: set by the network before `allocate` while its weights are fixed (`share_outputs`: no
        #: training until `unshare_outputs`), so the path may be one that only infers well
        self.inference_only = False
        self._kept_u = None
        #: the 2x2 [maxpool] right after, whose output an inference forward writes itself (set by
        #: `outputs_plan.fuse_pools` while outputs are shared; this layer's own output is then not
        #: written at all), or None; the same for the global [avgpool] right after
        #: (`can_write_averaged`); the averaging layer right after whose input means an inference
        #: forward writes (`can_write_means`), and the layer writing this one's
        self.pool_into = self.average_into = self.means_into = self.means_by = None
        self._trained = False                      # last forward was in training mode
        self._kept_call = None                     # an inference forward's kept kernel call

    # -- construction ---------------------------------------------------------------------------
    #: Keys a subclass implements (not refused by `from_cfg`).
    handled_keys: tuple[str, ...] = ()

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "ConvolutionalLayer":
        if cls is ConvolutionalLayer:
            for key, variant in VARIANTS.items():     # xnor=1, share_index=...: their own modules
                if sec.has(key) and variant.wants(sec, key):
                    return variant.from_cfg(sec, in_shape, ctx)
        for key, what in UNSUPPORTED_KEYS.items():
            if key not in cls.handled_keys and sec.has(key) and sec.get_int(key, 0):
                raise sec.error(f"{what} is not supported by darkpy", key)
        filters = sec.get_int("filters", 1)
        size = sec.get_int("size", 1)
        stride = sec.get_int("stride", 1)
        stride_x = sec.get_int("stride_x", stride)
        stride_y = sec.get_int("stride_y", stride)
        pad = sec.get_int("pad", 0)
        padding = sec.get_int("padding", 0)
        groups = sec.get_int("groups", 1)
        dilation = sec.get_int("dilation", 1)
        bn = sec.get_bool("batch_normalize", False)
        activation = sec.get_choice("activation", act.NAMES, "logistic", aliases=act.ALIASES)
        flipped = sec.get_bool("flipped", False)
        if sec.has("dot"):
            sec.get_float("dot")          # darknet reads it and never uses it
        for key, value in (("filters", filters), ("size", size), ("stride_x", stride_x),
                           ("stride_y", stride_y), ("groups", groups), ("dilation", dilation)):
            if value < 1:
                raise sec.error(f"must be >= 1 (got {value})", key if sec.has(key) else "stride")
        if padding < 0:
            raise sec.error(f"must be >= 0 (got {padding})", "padding")
        c = in_shape[0]
        if c % groups or filters % groups:
            raise sec.error(f"groups={groups} must divide both the input channels ({c}) and filters "
                            f"({filters})", "groups")
        if flipped and groups != 1:
            raise sec.error("flipped=1 with groups > 1 is not supported", "flipped")
        if pad:
            padding = size // 2
        layer = cls(sec.index, in_shape, filters, size, stride_y, stride_x, padding, groups, dilation,
                    bn, activation, flipped, ctx.dtype)
        oc, oh, ow = layer.out_shape
        if oh < 1 or ow < 1:
            raise sec.error(f"output would be {ow}x{oh}: a {size}x{size} kernel (dilation {dilation}) "
                            f"with padding {padding} does not fit the {in_shape[2]}x{in_shape[1]} input",
                            "size")
        return layer

    def compute_out_shape(self, in_shape):
        _, h, w = in_shape
        return (self.n,
                conv_out_size(h, self.size, self.stride_y, self.padding, self.dilation),
                conv_out_size(w, self.size, self.stride_x, self.padding, self.dilation))

    def init_weights(self, rng: np.random.Generator) -> None:
        """Darknet's init: weights sqrt(2/(k·k·c/groups))·N(0,1), biases 0; BN scales 1, rolling
        mean 0 and rolling variance 0 (as Darknet: an untrained BN layer used for inference
        therefore divides by sqrt(1e-5) — train it, or load weights, before predicting)."""
        fan_in = self.size * self.size * self.in_shape[0] // self.groups
        self.weights.value[...] = math.sqrt(2.0 / fan_in) * rng.standard_normal(self.weights.value.shape)
        self.biases.value.fill(0)
        if self.bn:
            self.bn.reset()

    @property
    def is_gemm_only(self) -> bool:
        """1x1, stride 1, no padding: the input is its own column matrix, no im2col needed."""
        return (self.size == 1 and self.stride_x == 1 and self.stride_y == 1 and self.padding == 0)

    @property
    def col_shape(self) -> tuple:
        _, oh, ow = self.out_shape
        return (self.in_shape[0] // self.groups * self.size * self.size, oh * ow)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        # training-only copies of the output: allocated by the first training forward (inference at
        # batch 64 would otherwise carry up to twice the activations for nothing)
        self.pre = np.zeros((0,), self.dtype)
        self.xnorm = np.zeros((0,), self.dtype)
        self.vkeep = np.zeros((0,), self.dtype)
        self._wt_flipped = np.zeros((0,), self.dtype)
        self._v_kept = False
        self._vkeep_values = 0                  # V of the whole batch, when it fits the budget
        rows, cols = self.col_shape
        ng = self.n // self.groups
        self.chunk = ic.chunk_items(rows * cols + ng * cols, batch)
        # items side by side (one big GEMM) pays only for big per-item GEMMs; small layers keep
        # numpy's stacked matmul (measured: digits-sized layers 2-5x slower side by side)
        self.wide = batch > 1 and ng * rows * cols >= WIDE_MIN_MACS
        if self.is_gemm_only and cols >= WIDE_GEMM_ONLY_MAX_S:
            self.wide = False       # per-item GEMMs straight on the input: no copies at all
        self.wgrad_tmp = np.zeros((0,), self.dtype)
        ic.reserve(self.chunk * (rows + ng) * cols, self.dtype)
        self._kept_wt = None
        geometry = (self.in_shape[0], self.n, self.size, max(self.stride_x, self.stride_y),
                    self.padding, self.groups, self.dilation, cols, batch, self.inference_only,
                    self.dtype)
        self.pointwise = POINTWISE and pw.supports(*geometry)
        # the paths in order of preference, each only where none before it took the layer
        taken = self.pointwise
        self.direct_fv = not taken and DIRECT_FV and self._fv_applies(self.inference_only, batch)
        taken = taken or self.direct_fv
        self.direct = not taken and self._direct_applies(batch, self.inference_only)
        taken = taken or self.direct
        self.winograd = not taken and self._use_winograd(batch)
        taken = taken or self.winograd
        self.pointwise_large = (not taken and POINTWISE_LARGE and pw.supports_large(*geometry)
                                and blas.cblas.load())
        taken = taken or self.pointwise_large
        self.pointwise_packed = (not taken and POINTWISE_PACKED and cols >= PACKED_MIN_POSITIONS
                                 and batch * self.in_shape[0] * cols * 4 <= PACKED_MAX_INPUT_BYTES
                                 and pw.supports_packed(*geometry[:7], self.inference_only,
                                                        self.dtype))
        taken = taken or self.pointwise_packed
        #: floats of the packed path's input packed ahead (`pw.packed_scratch`), else 0
        self.packed_ahead = (pw.packed_scratch(batch, self.n, self.in_shape[0], cols)
                             if self.pointwise_packed else 0)
        if self.packed_ahead:
            ic.reserve(self.packed_ahead, self.dtype)
        # a 1x1 layer on a 1x1 map (a classifier's last layer) is a connected layer: one GEMM of the
        # batch's rows, (B, c) @ Wᵀ, straight from the input into the output (instead of B GEMVs:
        # darknet.cfg's 1024 -> 1000 at b64 ran at 55 GFLOP/s)
        self.rows_gemm = (not taken and batch > 1 and self.is_gemm_only and cols == 1
                          and self.groups == 1)
        self.rows_transposed = self.rows_gemm and rows_transposed(batch, self.n, rows)
        if self.rows_gemm:
            # the forward's product (n x batch), backward's input gradient (batch x rows)
            ic.reserve(batch * max(rows, self.n), self.dtype)
        # the forward's GEMM path in one stacked GEMM over the whole batch (what `_chunks` yields
        # then, without its generator and slicing: digits' forward at batch 1 0.95x the time in one
        # in-process A/B, no difference measurable on larger networks)
        self.one_gemm = (not (taken or self.rows_gemm or self.wide) and self.groups == 1
                         and self.chunk >= batch)
        self._kept_u = None
        self.pool_into = self.average_into = self.means_into = self.means_by = None
        if self.winograd:
            self._winograd_allocate(batch)
        self.affine = np.empty((2, self.n))     # `inference_epilogue`'s k and off
        self._kept_epilogue = None
        self._kept_call = None
        self._trained = False

    def _on_pointwise_large(self) -> bool:
        """Whether the forward takes `blas.pointwise`: the layer's path, and darkpy.blas can keep
        OpenBLAS on one thread for it (the run configured it), else the GEMM path."""
        return self.pointwise_large and blas.sets_threads()

    def _epilogue(self, train: bool) -> tuple:
        """`inference_epilogue` for a kernel that writes the output (Winograd's output transform,
        the direct convolutions), or () for the separate pass. While the weights are fixed
        (`inference_only`) made at the first call after `allocate` or `weights_changed` and kept
        (digits' forward at b1 spent ~2.5 µs a layer making it)."""
        self._fused = ((self.winograd or self.direct or self.direct_fv or self.pointwise
                        or self.pointwise_packed or self._on_pointwise_large())
                       and not train and FUSED_EPILOGUE)
        return self._inference_epilogue() if self._fused else ()

    def _inference_epilogue(self) -> tuple:
        """`inference_epilogue`, kept while the weights are fixed (see `_epilogue`)."""
        if self._kept_epilogue is not None:
            self._trained = False
            return self._kept_epilogue
        epilogue = inference_epilogue(self)
        if self.inference_only and self.can_keep_filters:   # kept while the weights are fixed
            self._kept_epilogue = epilogue
        return epilogue

    def weights_changed(self) -> None:
        """Drop what was computed from the weights (the kept layouts and epilogue)."""
        super().weights_changed()
        self._kept_epilogue = self._kept_call = None

    def can_write_pooled(self, pool) -> bool:
        """Whether an inference forward can write the output of `pool`, a [maxpool] reading this
        layer's output (`outputs_plan.fuse_pools`): the Winograd and direct paths, which finish
        each block of output themselves, into a 2x2 stride-2 pool of an even-sized map of at least
        POOLED_MIN_POSITIONS; the direct path across filters where it can (`_fv_writes_pooled`)."""
        if not (FUSED_EPILOGUE and pool.kind == "maxpool" and pool.halves_2x2()):
            return False
        return ((self.winograd or self.direct)
                and self.out_shape[1] * self.out_shape[2] >= POOLED_MIN_POSITIONS
                or self._fv_writes_pooled())

    def can_write_means(self) -> bool:
        """`writes_means` (layers/conv_averaged.py), with the fused epilogues on."""
        return FUSED_EPILOGUE and self.writes_means()

    def _use_winograd(self, batch: int) -> bool:
        """Winograd for this batch: a shape it computes (`winograd_tiles`) with enough output tiles
        (WINOGRAD_MIN_TILES), or a layer keeping its filter transform (`kept_filters_gain`)."""
        return self.keep_filters or self.winograd_tiles(batch) >= WINOGRAD_MIN_TILES

    def winograd_tiles(self, batch: int) -> int:
        """The batch's 2x2 output tiles when Winograd can compute this layer (3x3, stride 1, no
        dilation or groups, padding <= 2 so that backward's padding 2 − p is one too, at least
        WINOGRAD_MIN_CHANNELS input channels), else 0."""
        if not (WINOGRAD and self.size == 3 and self.stride_x == 1 and self.stride_y == 1
                and self.dilation == 1 and self.groups == 1 and self.padding <= 2
                and self.in_shape[0] >= WINOGRAD_MIN_CHANNELS):
            return 0
        th, tw = wg.tiles(*self.out_shape[1:])
        return batch * th * tw

    def kept_filters_gain(self, batch: int) -> int:
        """Output tiles of this batch for which keeping the filter transform moves the layer onto
        Winograd (`plan_kept_filters` ranks layers by it), else 0."""
        tiles = self.winograd_tiles(batch)
        _, oh, ow = self.out_shape
        whole = batch * (oh // 2) * (ow // 2)
        return tiles if (self.can_keep_filters and tiles < WINOGRAD_MIN_TILES
                         and not (DIRECT_FV and self._fv_applies(True, batch))
                         and whole >= WINOGRAD_KEPT_MIN_TILES
                         and self.in_shape[0] >= WINOGRAD_KEPT_MIN_CHANNELS
                         and (WINOGRAD_KEPT_CHUNKED or self.winograd_in_bands(batch))) else 0

    def on_winograd_anyway(self, batch: int) -> bool:
        """Whether this batch puts an inferring layer on Winograd without a kept filter transform
        (which it then makes at every forward unless kept: `plan_kept_filters`)."""
        return (self.can_keep_filters and self.winograd_tiles(batch) >= WINOGRAD_MIN_TILES
                and not (DIRECT_FV and self._fv_applies(True, batch))
                and not self._direct_applies(batch, True))

    def _direct_applies(self, batch: int, inference_only: bool) -> bool:
        """Whether the row-vectorised direct convolution (`dk.supports`) can take this layer."""
        return DIRECT and dk.supports(self.in_shape[0], self.n, self.size, self.groups,
                                      self.dilation, max(self.stride_x, self.stride_y),
                                      self.out_shape[1] * self.out_shape[2], batch, inference_only)

    def allocate_training(self) -> None:
        """The buffers only backward needs, sized by the last allocate() (which drops them, so
        nothing is stale after resize/set_batch): besides the delta, the pre-activation
        (swish/mish/...), BN's x̂ and the im2col path's weight-gradient scratch."""
        super().allocate_training()
        allocate_bias_bn_act_training(self)
        if not (self.winograd or self.direct or self.direct_fv):
            rows, _ = self.col_shape
            ng = self.n // self.groups
            self.wgrad_tmp = self.training_buffer(
                self.wgrad_tmp, (ng, rows) if self.wide or self.rows_gemm else (self.chunk, ng, rows))
        if self._vkeep_values:
            self.vkeep = self.training_buffer(self.vkeep, (self._vkeep_values,))

    def extra_buffers(self) -> list[np.ndarray]:
        return [self.pre, self.xnorm, self.wgrad_tmp, self.vkeep, self._wt_flipped]

    def after_load(self) -> None:
        """`flipped=1`: the file stores the weight matrix transposed, [c·k·k][n]."""
        if self.flipped:
            w = self.weights.value
            w[...] = w.reshape(-1, self.n).T.reshape(w.shape).copy()

    # -- compute --------------------------------------------------------------------------------
    def forward(self, s: State) -> None:
        """The layer's path (the direct convolution across filters, Winograd, the direct one,
        pointwise, its large-batch GEMM or its packed panels, else GEMMs: `_forward_gemm`) into the
        output, with the epilogue where the path takes it (`_epilogue`), else the separate pass.
        Inferring with shared outputs, what `outputs_plan.fuse_pools` fused is written instead of
        the output: the average pool after it, its maps' means for the layer after, or the 2x2
        maxpool after it.
        An inference forward of the direct paths with the weights fixed makes its kernel call once
        and keeps it (kernels/kernel_call.py)."""
        if not s.train and self._kept_call is not None and self._kept_call.matches(self._made_from(s)):
            self._v_kept, self._fused, self._trained = False, True, False
            self._kept_call()
            return
        _, oh, ow = self.out_shape
        x = s.input.reshape(self.batch, *self.in_shape)
        y = self.output.reshape(self.batch, self.n, oh, ow)
        self._v_kept = self._fused = False
        pool = None
        if not s.train:
            if self.average_into is not None:
                self._forward_averaged(x, self._inference_epilogue())
                self._fused = True
                return
            if self.means_into is not None:
                self._forward_means(s, x, y, self.means_into.input_means())
                return
            if self.pool_into is not None:
                pool = self.pool_into.output.reshape(self.batch, self.n, oh // 2, ow // 2)
        if self.direct_fv:
            self._keep_call(s, self._forward_fv(x, y, self._epilogue(s.train), pool))
        elif self.winograd:
            keep = s.train and self.vkeep.size > 0
            self._winograd(x, self.weights.value, self.padding, y, add=False, keep=keep,
                           epilogue=self._epilogue(s.train),
                           u=self.kept_filters() if self.keep_filters and not s.train else None,
                           pool=pool)
            self._v_kept = keep
        elif self.direct:
            call = KeptCall(*dk.forward_call(
                y, x, self.weights.value, self.stride_y, self.stride_x, self.padding,
                db.forward_rows(self.batch, oh, ow, self.size, self.stride_x, even=pool is not None),
                *self._epilogue(s.train), pool=pool))
            call()
            self._keep_call(s, call)
        elif self.pointwise:
            pw.conv_forward(y.reshape(self.batch, self.n, -1),
                            x.reshape(self.batch, self.in_shape[0], -1),
                            self.weights.value.reshape(self.n, -1), *self._epilogue(s.train))
        elif self.pointwise_packed:
            c, p = self.in_shape[0], oh * ow
            pw.packed_forward(y.reshape(self.batch, self.n, p), x.reshape(self.batch, c, p),
                              self.weights.value.reshape(self.n, c), *self._epilogue(s.train),
                              xp=ic.get((self.packed_ahead,), self.dtype) if self.packed_ahead
                              else None)
        elif self._on_pointwise_large():
            blas.pointwise(y.reshape(self.batch, self.n, -1),
                           x.reshape(self.batch, self.in_shape[0], -1),
                           self.weights.value.reshape(self.n, -1), *self._epilogue(s.train))
        else:
            self._forward_gemm(x, y.reshape(self.batch, self.n, -1))
        if s.train:
            self.allocate_training()         # a no-op once they exist (the network sizes them)
        if not self._fused:
            forward_bias_bn_act(self, y.reshape(self.batch, self.n, -1), s.train, keep_pre=s.train)

    def _made_from(self, s: State) -> tuple:
        """What an inference forward's kernel call is made from (`KeptCall.matches`)."""
        pool, means = self.pool_into, self.means_into
        return (s.input, self.output, self.weights.value, self._kept_epilogue,
                None if pool is None else pool.output, self.average_into,
                None if means is None else means.input_means())

    def _keep_call(self, s: State, call: KeptCall) -> None:
        """Keep the kernel call this forward made, when the next inference forward will make the
        same: the weights fixed (the epilogue kept, fused)."""
        self._kept_call = None
        if not s.train and self._fused and self._kept_epilogue is not None:
            call.made_from = self._made_from(s)
            self._kept_call = call

    def backward(self, s: State) -> None:
        _, oh, ow = self.out_shape
        d = self.delta.reshape(self.batch, self.n, oh * ow)
        backward_bias_bn_act(self, d, self.output.reshape(d.shape))
        x = s.input.reshape(self.batch, *self.in_shape)
        prev = s.delta.reshape(self.batch, *self.in_shape) if s.delta is not None else None
        wmat = self.weights.value.reshape(self.groups, self.n // self.groups, -1)
        wgrad = self.weights.grad.reshape(wmat.shape)
        rows, cols = self.col_shape
        if self.direct_fv:
            self._backward_fv(x, d.reshape(self.batch, self.n, oh, ow), prev, s.delta_fresh)
            return
        if self.winograd:
            self._winograd_weight_grad(x, d.reshape(self.batch, self.n, oh, ow))
        elif self.direct:
            dwg.conv_weight_grad(self.weights.grad, x, d.reshape(self.batch, self.n, oh, ow),
                                self.stride_y, self.stride_x, self.padding,
                                db.block_rows(oh, ow, self.size, self.stride_x))
            if prev is None:
                return
            if self._direct_input_grad_ok():
                self._direct_input_grad(d.reshape(self.batch, self.n, oh, ow), prev, s.delta_fresh)
                return
        if self.rows_gemm:
            self._backward_rows(d.reshape(self.batch, self.n), x.reshape(self.batch, -1), prev, wmat[0],
                                s.delta_fresh)
        for items, j, cin, fout in ([] if self.winograd or self.rows_gemm else self._chunks()):
            dg = d[items, fout]
            nb = dg.shape[0]
            if self.direct:             # the weight gradient is done: the input gradient alone
                self._input_grad_stacked(dg, prev[items, cin], wmat[j])
                continue
            if not self.wide:
                self._backward_stacked(dg, x[items, cin], None if prev is None else prev[items, cin],
                                       wmat[j], wgrad[j])
                continue
            if nb == 1:
                dm = dg[0]
            else:
                dm = self._rows(nb)
                ic.im2col_wide(dm.reshape(-1, nb, cols), dg.reshape(nb, -1, oh, ow), 1, 1, 1, 0, 1,
                               oh, ow)
            col = self._columns(x[items, cin])
            blas.matmul(dm, col.T, out=self.wgrad_tmp)
            wgrad[j] += self.wgrad_tmp
            if prev is None:
                continue
            dcol = ic.get((rows, nb * cols), self.dtype)     # the columns are used up: reuse them
            blas.matmul(wmat[j].T, dm, out=dcol)
            ic.col2im_wide_add(prev[items, cin], dcol.reshape(rows, nb, cols), self.size,
                               self.stride_y, self.stride_x, self.padding * self.dilation,
                               self.dilation, oh, ow)
        if self.winograd and prev is not None:
            # the input gradient of a 3x3 stride-1 correlation is the correlation of the delta with
            # the filters flipped and transposed, padding 2 - p: Winograd again, added into prev
            flipped = self.weights.value.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1]
            self._winograd(d.reshape(self.batch, self.n, oh, ow), flipped, 2 - self.padding, prev,
                           add=not s.delta_fresh)

    @property
    def assigns_fresh_delta(self) -> bool:
        """The input gradient is one pass that can write the previous delta whole (Winograd, the
        direct stride-1 correlation, a flat GEMM, direct_fv's 1x1 stacked GEMM); the im2col chunks
        and the other direct_fv layers add into it."""
        if self.direct_fv:
            return self._fv_input_grad_by_gemm()
        return self.winograd or self.rows_gemm or (self.direct and self._direct_input_grad_ok())

    def _direct_input_grad_ok(self) -> bool:
        return DIRECT_INPUT_GRAD and self.stride_x == self.stride_y == 1 and self.padding < self.size

    def _direct_input_grad(self, d, prev, fresh: bool) -> None:
        """prev += (fresh: =) the input gradient of a stride-1 direct layer: the correlation of the
        delta d (B, n, oh, ow) with the filters turned 180 degrees and transposed, padding
        k − 1 − pad, by the direct forward kernel (into the workspace, then added)."""
        k, pad = self.size, self.padding
        wt = fvg.turned(self.weights.value)
        rows = db.forward_rows(self.batch, *prev.shape[2:], k, 1)
        if fresh:
            dk.conv_forward(prev, d, wt, 1, 1, k - 1 - pad, rows)
            return
        ic.reserve(prev.size, self.dtype)
        dx = ic.get(prev.shape, self.dtype)
        dk.conv_forward(dx, d, wt, 1, 1, k - 1 - pad, rows)
        ic.add_into(prev.reshape(-1), dx.reshape(-1))

    # -- file layout, summary ---------------------------------------------------------------------
    def weight_arrays(self) -> list[np.ndarray]:
        return [self.biases.value] + (self.bn.arrays() if self.bn else []) + [self.weights.value]

    def flops(self) -> float:
        _, oh, ow = self.out_shape
        return 2.0 * self.n * self.size * self.size * (self.in_shape[0] // self.groups) * oh * ow

    def summary(self) -> str:
        filters = f"{self.n:5d}" if self.groups == 1 else f"{self.n:5d}/{self.groups}"
        stride = (f"{self.stride_x:2d}" if self.stride_x == self.stride_y
                  else f"{self.stride_x}x{self.stride_y}")
        dil = f" (dil {self.dilation})" if self.dilation > 1 else ""
        return (f"conv  {filters} {self.size:2d} x{self.size:2d} /{stride}{dil}  "
                f"{fmt_shape(self.in_shape)}   ->  {fmt_shape(self.out_shape)}  "
                f"{self.flops() / 1e9:5.3f} BFLOPs")
