"""`[convolutional]` / `[conv]`: 2-D convolution with optional batch norm (spec §2.1, §5).

Forward, per chunk of batch items and group: im2col with the items side by side into the shared
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
from ..kernels import bn as bnk
from ..kernels import direct as dk
from ..kernels import im2col as ic
from ..kernels import winograd as wg
from ..memory import param_ones, param_zeros
from .base import Layer, Param, State, fmt_shape, register

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
#: Batch items per Winograd chunk: as many as keep V and M (the transformed input and product) within
#: WINOGRAD_CHUNK_VALUES (16 MiB in float32, half of im2col's CHUNK_VALUES), so that the 16 GEMMs
#: read V while it is still in a cache level (shapes-tiny training 0.93x time at 1<<20 against the whole
#: batch at once, on a 2-core Zen 4), but at least WINOGRAD_MIN_GEMM_TILES tiles, so the GEMMs stay
#: wide enough for BLAS (cifar at b64 was 1.15x slower with one 196-tile item per chunk). Each chunk
#: starts two parallel regions, and where waking the workers is dear (66 µs on a 2-core Zen 5 VM)
#: fewer chunks win: there 1<<22 against 1<<20 took 0.76-0.85x the time of a shapes-tiny b64
#: forward, 0.76-0.85x of its b32 training step, 0.94-1.09x of cifar b64 and 0.92-0.98x of
#: yolov3-tiny b16 (two rounds each, 2 threads, OpenBLAS's Haswell kernels as that machine's shell
#: pinned them); 1<<24 was no better than 1<<22.
WINOGRAD_CHUNK_VALUES = 1 << 22
WINOGRAD_MIN_GEMM_TILES = 256
#: A training forward keeps the Winograd transform of its input, V (16 values per 2x2 tile and
#: channel, about 4x the input), for the weight gradient, which otherwise transforms the same input
#: again, when the whole batch's V has at most this many values (32 MiB in float32): small layers
#: and batches (digits, shapes-tiny); larger ones recompute it rather than hold it.
WINOGRAD_KEEP_VALUES = 1 << 23
#: Direct convolution (kernels/direct.py) for layers with at most 4 input channels and 32 filters
#: (first layers): no im2col matrix, in the forward pass and the weight gradient (the input
#: gradient, which a first layer never computes, stays im2col's). False: always im2col + GEMM.
DIRECT = True

#: Padding (values) between the 16 matrices of a Winograd buffer: with it the 16 streams a transform
#: reads or writes are not a power of two apart, which made them collide in the cache (measured 3x).
XI_PAD = 16

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


class BatchNormParams:
    """γ (`scales`, learnable), the rolling statistics and the last batch's statistics of a BN block
    over `n` channels; shared by conv and connected. β lives in the owning layer's `biases`."""

    def __init__(self, n: int, dtype):
        self.scales = Param("scales", param_ones(n, dtype), param_zeros(n, dtype), decay=False)
        self.rolling_mean = param_zeros(n, dtype)
        self.rolling_variance = param_zeros(n, dtype)
        self.mean = param_zeros(n, dtype)       # batch statistics of the last training forward
        self.variance = param_zeros(n, dtype)

    def arrays(self) -> list[np.ndarray]:
        """The BN block as a .weights file stores it: scales, rolling mean, rolling variance."""
        return [self.scales.value, self.rolling_mean, self.rolling_variance]

    def reset(self) -> None:
        """Darknet's initial values: γ = 1, rolling mean 0, rolling variance 0."""
        self.scales.value.fill(1)
        self.rolling_mean.fill(0)
        self.rolling_variance.fill(0)


@register
class ConvolutionalLayer(Layer):
    kind = "convolutional"
    aliases = ("conv",)
    needs_image = True

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
        self.wchunk = 1
        self._trained = False                      # last forward was in training mode

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
        self.winograd = self._use_winograd(batch)
        self.direct = not self.winograd and DIRECT and dk.supports(
            self.in_shape[0], self.n, self.size, self.groups, self.dilation)
        if self.winograd:
            c, n = self.in_shape[0], self.n
            # tiles of the forward's output, or of backward's (the input's size): the larger
            th, tw = max(wg.tiles(*self.out_shape[1:]), wg.tiles(*self.in_shape[1:]))
            # per item: V (c x tiles) and M (n x tiles), 16 of each; backward swaps c and n
            self.wchunk = _winograd_chunk(16 * th * tw * (c + n), th * tw, batch)
            tiles = self.wchunk * th * tw
            ic.reserve(_xi_size(n, c) + _xi_size(max(c, n), tiles) * 2, self.dtype)
            kept = sum(_xi_size(c, t) for _, t in self._chunk_tiles(self.out_shape[1:]))
            self._vkeep_values = kept if kept <= WINOGRAD_KEEP_VALUES else 0
        self._trained = False

    def _use_winograd(self, batch: int) -> bool:
        """3x3, stride 1, no dilation or groups, padding <= 2 (so backward's padding 2 − p is one
        too), enough channels and output tiles: see WINOGRAD_MIN_TILES."""
        if not (WINOGRAD and self.size == 3 and self.stride_x == 1 and self.stride_y == 1
                and self.dilation == 1 and self.groups == 1 and self.padding <= 2):
            return False
        th, tw = wg.tiles(*self.out_shape[1:])
        return self.in_shape[0] >= WINOGRAD_MIN_CHANNELS and batch * th * tw >= WINOGRAD_MIN_TILES

    def allocate_training(self) -> None:
        """The buffers only backward needs, sized by the last allocate() (which drops them, so
        nothing is stale after resize/set_batch): besides the delta, the pre-activation
        (swish/mish/...), BN's x̂ and the im2col path's weight-gradient scratch."""
        super().allocate_training()
        allocate_bias_bn_act_training(self)
        if not (self.winograd or self.direct):
            rows, _ = self.col_shape
            ng = self.n // self.groups
            self.wgrad_tmp = self.training_buffer(
                self.wgrad_tmp, (ng, rows) if self.wide else (self.chunk, ng, rows))
        if self._vkeep_values:
            self.vkeep = self.training_buffer(self.vkeep, (self._vkeep_values,))

    def extra_buffers(self) -> list[np.ndarray]:
        return [self.pre, self.xnorm, self.wgrad_tmp, self.vkeep]

    def after_load(self) -> None:
        """`flipped=1`: the file stores the weight matrix transposed, [c·k·k][n]."""
        if self.flipped:
            w = self.weights.value
            w[...] = w.reshape(-1, self.n).T.reshape(w.shape).copy()

    # -- compute --------------------------------------------------------------------------------
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

    def forward(self, s: State) -> None:
        """One 2-D GEMM per chunk and group, `W_g @ col`, straight into the output for a single
        item, else into the workspace and then reordered batch-major; then the fused pass."""
        _, oh, ow = self.out_shape
        x = s.input.reshape(self.batch, *self.in_shape)
        y = self.output.reshape(self.batch, self.n, oh * ow)
        self._v_kept = False
        if self.winograd:
            keep = s.train and self.vkeep.size > 0
            self._winograd(x, self.weights.value, self.padding, y.reshape(self.batch, self.n, oh, ow),
                           add=False, keep=keep)
            self._v_kept = keep
        elif self.direct:
            dk.conv_forward(y.reshape(self.batch, self.n, oh, ow), x, self.weights.value,
                            self.stride_y, self.stride_x, self.padding,
                            dk.block_rows(oh, ow, self.size, self.stride_x))
        wmat = self.weights.value.reshape(self.groups, self.n // self.groups, -1)
        for items, j, cin, fout in ([] if self.winograd or self.direct else self._chunks()):
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
        if s.train:
            self.allocate_training()         # a no-op once they exist (the network sizes them)
        forward_bias_bn_act(self, y, s.train, keep_pre=s.train)

    def _winograd(self, x: np.ndarray, w: np.ndarray, pad: int, y: np.ndarray, add: bool,
                  keep: bool = False) -> None:
        """y (B, n', oh', ow') = (or +=) the 3x3 stride-1 correlation of x (B, c', h', w') with the
        filters w (n', c', 3, 3) and padding `pad`, by Winograd F(2x2, 3x3), `self.wchunk` items at
        a time. Forward: x the input, w the weights. Backward: x the delta, w the weights flipped
        and transposed, pad 2 − padding, y the previous delta. `keep`: the transformed input goes
        to `vkeep` (for the weight gradient) instead of the workspace."""
        n, c = w.shape[:2]
        u = _xi_view(0, n, c, self.dtype)
        wg.filters(u, w)
        for items, vrows, m in self._winograd_chunks(c, n, y.shape[2:], kept=keep):
            wg.inputs(vrows, x[items], pad)
            # the 16 GEMMs in one call (numpy loops over ξ)
            blas.matmul(u, _as_matrices(vrows, c, m.shape[2]), out=m)
            wg.outputs(y[items], m, add)

    def _chunk_tiles(self, out_hw: tuple):
        """(item slice, tiles) of each Winograd chunk for an output of out_hw (h, w) per item."""
        th, tw = wg.tiles(*out_hw)
        for b0 in range(0, self.batch, self.wchunk):
            b1 = min(b0 + self.wchunk, self.batch)
            yield slice(b0, b1), (b1 - b0) * th * tw

    def _winograd_chunks(self, c: int, n: int, out_hw: tuple, kept: bool = False):
        """(item slice, V's rows (16, c·tiles + XI_PAD), M (16, n, tiles)) per chunk of `self.wchunk`
        items, views of the workspace after the 16 (n, c) matrices at its start (U or dU), for an
        output of out_hw (h, w) per item; V from `vkeep` instead with `kept` (chunk after chunk)."""
        off = _xi_size(n, c)
        at = 0
        for items, tiles in self._chunk_tiles(out_hw):
            if kept:
                v = _xi_rows(at, c, tiles, self.dtype, self.vkeep)
            else:
                v = _xi_rows(off, c, tiles, self.dtype)
            at += _xi_size(c, tiles)
            yield items, v, _xi_view(off + _xi_size(c, tiles), n, tiles, self.dtype)

    def _winograd_weight_grad(self, x: np.ndarray, dy: np.ndarray) -> None:
        """weights.grad += the gradient of the Winograd forward, exactly the convolution's: per
        chunk, dM = A dY Aᵀ per tile (dy (B, n, oh, ow)), the 16 GEMMs dU[ξ] = dM[ξ] @ V[ξ]ᵀ with V
        the input's transform (x (B, c, h, w); kept by the training forward when it fits
        WINOGRAD_KEEP_VALUES, else computed again), and Gᵀ dU G added into the gradient."""
        n, c = self.n, self.in_shape[0]
        du = _xi_view(0, n, c, self.dtype)
        for items, vrows, dm in self._winograd_chunks(c, n, dy.shape[2:], kept=self._v_kept):
            if not self._v_kept:
                wg.inputs(vrows, x[items], self.padding)
            wg.outputs_adjoint(dm, dy[items])
            v = _as_matrices(vrows, c, dm.shape[2])
            blas.matmul(dm, v.transpose(0, 2, 1), out=du)
            wg.filters_adjoint_add(self.weights.grad, du)

    def backward(self, s: State) -> None:
        _, oh, ow = self.out_shape
        d = self.delta.reshape(self.batch, self.n, oh * ow)
        backward_bias_bn_act(self, d, self.output.reshape(d.shape))
        x = s.input.reshape(self.batch, *self.in_shape)
        prev = s.delta.reshape(self.batch, *self.in_shape) if s.delta is not None else None
        wmat = self.weights.value.reshape(self.groups, self.n // self.groups, -1)
        wgrad = self.weights.grad.reshape(wmat.shape)
        rows, cols = self.col_shape
        if self.winograd:
            self._winograd_weight_grad(x, d.reshape(self.batch, self.n, oh, ow))
        elif self.direct:
            dk.conv_weight_grad(self.weights.grad, x, d.reshape(self.batch, self.n, oh, ow),
                                self.stride_y, self.stride_x, self.padding,
                                dk.block_rows(oh, ow, self.size, self.stride_x))
            if prev is None:
                return
        for items, j, cin, fout in ([] if self.winograd else self._chunks()):
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
                           add=True)

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

    def _input_grad_stacked(self, dg, pg, w) -> None:
        """pg += the input gradient of one chunk and group: col2im(wᵀ @ dg), stacked per item."""
        _, oh, ow = self.out_shape
        nb = dg.shape[0]
        dcol = ic.get((nb, *self.col_shape), self.dtype)
        blas.matmul(w.T, dg, out=dcol)
        if self.is_gemm_only:
            pg += dcol.reshape(pg.shape)
        else:
            ic.col2im_add(pg, dcol, self.size, self.stride_y, self.stride_x,
                          self.padding * self.dilation, self.dilation, oh, ow)

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


def _winograd_chunk(per_item: int, tiles: int, batch: int) -> int:
    """Items per Winograd chunk for `per_item` values of V and M and `tiles` tiles per item."""
    fit = WINOGRAD_CHUNK_VALUES // per_item
    wide = -(-WINOGRAD_MIN_GEMM_TILES // tiles)
    return max(1, min(batch, max(fit, wide), ic.CHUNK_VALUES // per_item))


def _xi_size(a: int, b: int) -> int:
    """Workspace values of 16 (a, b) matrices XI_PAD apart (see `_xi_view`)."""
    return 16 * (a * b + XI_PAD)


def _xi_rows(offset: int, a: int, b: int, dtype, buf: np.ndarray | None = None) -> np.ndarray:
    """The 16 rows (16, a·b + XI_PAD), C-contiguous, of the shared workspace (or of the flat array
    `buf`) from `offset` that hold 16 (a, b) matrices XI_PAD apart; the form the transform kernels
    take (`wg.inputs`)."""
    n = _xi_size(a, b)
    return (ic.get((n,), dtype, offset) if buf is None else buf[offset:offset + n]).reshape(16, -1)


def _xi_view(offset: int, a: int, b: int, dtype, buf: np.ndarray | None = None) -> np.ndarray:
    """The same 16 matrices as a (16, a, b) view whose every [ξ] is a BLAS-ready matrix."""
    return _as_matrices(_xi_rows(offset, a, b, dtype, buf), a, b)


def _as_matrices(rows: np.ndarray, a: int, b: int) -> np.ndarray:
    """(16, a, b) matrices of the rows `_xi_rows` returned."""
    return rows[:, :a * b].reshape(16, a, b)


def allocate_bias_bn_act_training(layer) -> None:
    """Shared by conv, deconv and connected: size the training buffers the fused pass needs, the
    pre-activation (swish/mish/... backward reads it) and BN's x̂, like the layer's output."""
    if act.needs_input(layer.act):
        layer.pre = layer.training_buffer(layer.pre)
    if layer.bn:
        layer.xnorm = layer.training_buffer(layer.xnorm)


def forward_bias_bn_act(layer, y: np.ndarray, train: bool, keep_pre: bool = True) -> None:
    """Shared by conv, deconv and connected: turn `y` (B, C, S), the raw product, into the layer's
    output in place: + bias, or batch norm (batch statistics in training, rolling ones otherwise,
    β = biases), then the activation. The pre-activation is copied to `layer.pre` when it exists
    and `keep_pre` (swish/mish/... need it in backward)."""
    layer._trained = train
    keep = keep_pre and layer.pre.size > 0
    bn = layer.bn
    a = act.kernel_code(layer.act, y.dtype)
    if bn is None and y.shape[2] == 1:          # connected, 1×1 maps: along rows (vectorised)
        y2 = y.reshape(y.shape[:2])
        bnk.bias_act_forward_rows(y2, layer.pre.reshape(y2.shape) if keep else y2, layer.biases.value, a,
                                  keep)
    elif bn is None:
        bnk.bias_act_forward(y, layer.pre.reshape(y.shape) if keep else y, layer.biases.value, a, keep)
    elif train:
        bnk.bn_act_forward_train(y, layer.xnorm.reshape(y.shape), bn.mean, bn.variance,
                                 bn.rolling_mean, bn.rolling_variance, bn.scales.value,
                                 layer.biases.value, a, layer.darknet_cpu_bn)
    else:
        bnk.bn_act_forward_infer(y, bn.rolling_mean, bn.rolling_variance, bn.scales.value,
                                 layer.biases.value, a, layer.darknet_cpu_bn)


def backward_bias_bn_act(layer, d: np.ndarray, y: np.ndarray) -> None:
    """Shared by conv and connected: turn `d` (B, C, S), the gradient w.r.t. the activated output,
    into the gradient w.r.t. the raw product, in place, accumulating bias (and BN scale) gradients."""
    a = act.kernel_code(layer.act, d.dtype)
    if layer.bn is None:
        if act.needs_input(layer.act) and not layer._trained:
            raise layer.error(f"{layer.activation} backward needs a training-mode forward first")
        if d.shape[2] == 1:
            d2, y2 = d.reshape(d.shape[:2]), y.reshape(d.shape[:2])
            bnk.bias_act_backward_rows(d2, y2, layer.pre.reshape(d2.shape) if layer.pre.size else y2,
                                       layer.biases.grad, np.empty(d2.shape[1]), a)
        else:
            bnk.bias_act_backward(d, y, layer.pre.reshape(d.shape) if layer.pre.size else y,
                                  layer.biases.grad, a)
        return
    if not layer._trained:
        raise layer.error("batch-norm backward needs a training-mode forward first")
    bn = layer.bn
    bnk.bn_act_backward(d, y, layer.xnorm.reshape(d.shape), bn.variance, bn.scales.value,
                        layer.biases.value, layer.biases.grad, bn.scales.grad, a,
                        layer.pre.reshape(d.shape) if layer.pre.size else y, layer.darknet_cpu_bn)

