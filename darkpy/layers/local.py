"""`[local]`: locally connected layer — a convolution whose filters differ at every output position
(spec §2.3).

Each output location `l` (row-major over out_h × out_w) has its own filter bank `W[l]` of shape
`(filters, c·k·k)`, and every output element its own bias: `y[f, l] = act(W[l, f] · patch_l + b[f, l])`.
The `.weights` layout is `biases[filters·out_h·out_w]` (CHW) then `weights[locations][filters][c][k][k]`.

Darknet's `pad` here is a FLAG that is also used literally as the im2col padding: the output size is
`(in − (pad ? 1 : size))/stride + 1` while the patches are unrolled with `pad` pixels of zeros. The two
only agree when `size = 2·pad + 1` (every shipped cfg: size 3, pad 1), so other combinations are
rejected at build time instead of reading misaligned columns as Darknet does.

Compute: the patches of a chunk of batch items are unrolled location-major, `col (L, c·k·k, nb)`, so
the forward is ONE stacked GEMM `W (L, n, c·k·k) @ col → (L, n, nb)`, scattered into the CHW output
with the biases. Backward: weight gradient `δ_l @ col_lᵀ` per location (its temporary is one
location's bank, not the whole weight array), input gradient `W_lᵀ @ δ_l` stacked, then col2im.
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from .. import blas
from ..kernels import activations as act
from ..kernels import im2col as ic
from ..kernels import pjit
from ..kernels.activations import _act, _grad
from ..memory import param_zeros
from .base import Layer, Param, State, fmt_shape, register


def local_out_size(size_in: int, k: int, stride: int, pad: int) -> int:
    """Darknet's local_out_height/width: `pad` is a flag here."""
    return (size_in - (1 if pad else k)) // stride + 1


@pjit
def local_im2col(col, x, k, stride, pad, out_h, out_w):
    """col: (L, c·k·k, nb) output, L = out_h·out_w; x: (nb, c, h, w) input images.
    col[l, (ci·k + ky)·k + kx, b] = x[b, ci, oy·stride − pad + ky, ox·stride − pad + kx] (0 outside)."""
    nb, c, h, w = x.shape
    rows = c * k * k
    for lr in prange(out_h * out_w * rows):
        l = lr // rows
        r = lr % rows
        oy = l // out_w
        ox = l % out_w
        kx = r % k
        ky = (r // k) % k
        ci = r // (k * k)
        iy = oy * stride - pad + ky
        ix = ox * stride - pad + kx
        inside = iy >= 0 and iy < h and ix >= 0 and ix < w
        for b in range(nb):
            col[l, r, b] = x[b, ci, iy, ix] if inside else 0


@pjit
def local_col2im_add(dx, dcol, k, stride, pad, out_h, out_w):
    """dx: (nb, c, h, w) delta, ADDED to; dcol: (L, c·k·k, nb). The adjoint of `local_im2col`;
    one thread per (item, channel), so no two threads write the same element."""
    nb, c, h, w = dx.shape
    for bc in prange(nb * c):
        b = bc // c
        ci = bc % c
        for oy in range(out_h):
            for ox in range(out_w):
                l = oy * out_w + ox
                for ky in range(k):
                    iy = oy * stride - pad + ky
                    if iy < 0 or iy >= h:
                        continue
                    for kx in range(k):
                        ix = ox * stride - pad + kx
                        if ix >= 0 and ix < w:
                            dx[b, ci, iy, ix] += dcol[l, (ci * k + ky) * k + kx, b]


@pjit
def local_output(y, pre, ymat, biases, a, keep_pre):
    """y: (nb, n, L) output; pre: (nb, n, L) receives the pre-activation when keep_pre (else any
    array); ymat: (L, n, nb) the stacked GEMM result; biases: (n, L). y = act(ymatᵀ + biases)."""
    nb, n, L = y.shape
    for bf in prange(nb * n):
        b = bf // n
        f = bf % n
        for l in range(L):
            v = ymat[l, f, b] + biases[f, l]
            if keep_pre:
                pre[b, f, l] = v
            y[b, f, l] = _act(v, a)


@pjit
def local_delta(dmat, bias_grad, delta, y, pre, a):
    """delta: (nb, n, L) gradient w.r.t. the output, turned in place into the gradient w.r.t. the
    pre-activation; y, pre: (nb, n, L) output and pre-activation (pre read only by the activations
    that need it); dmat: (L, n, nb) receives it location-major; bias_grad: (n, L) accumulated."""
    nb, n, L = delta.shape
    for f in prange(n):
        for l in range(L):
            acc = 0.0
            for b in range(nb):
                d = delta[b, f, l] * _grad(y[b, f, l], pre[b, f, l], a)
                delta[b, f, l] = d
                dmat[l, f, b] = d
                acc += d
            bias_grad[f, l] += acc


@register
class LocalLayer(Layer):
    kind = "local"
    needs_image = True
    resizable = False           # darknet: weights are per output location

    def __init__(self, index: int, in_shape, filters: int, size: int, stride: int, pad: int,
                 activation: str = "logistic", dtype=np.float32):
        self.n, self.size, self.stride, self.pad = filters, size, stride, pad
        super().__init__(index, in_shape, self.compute_out_shape(in_shape), dtype)
        c = self.in_shape[0]
        _, oh, ow = self.out_shape
        self.locations = oh * ow
        self.activation = activation
        self.act = act.code(activation)
        ckk = c * size * size
        self.biases = Param("biases", param_zeros((filters, self.locations), self.dtype),
                            param_zeros((filters, self.locations), self.dtype))
        self.weights = Param("weights", param_zeros((self.locations, filters, ckk), self.dtype),
                             param_zeros((self.locations, filters, ckk), self.dtype), decay=True)
        self.params = [self.biases, self.weights]
        self.pre = np.zeros((0,), self.dtype)
        self.ymat = np.zeros((0,), self.dtype)       # (L, n, nb) GEMM results / deltas, flat
        self.wgrad_tmp = param_zeros((filters, ckk), self.dtype)
        self.chunk = 1

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> LocalLayer:
        filters = sec.get_int("filters", 1)
        size = sec.get_int("size", 1)
        stride = sec.get_int("stride", 1)
        pad = sec.get_int("pad", 0)
        activation = sec.get_choice("activation", act.NAMES, "logistic", aliases=act.ALIASES)
        for key, value in (("filters", filters), ("size", size), ("stride", stride)):
            if value < 1:
                raise sec.error(f"must be >= 1 (got {value})", key)
        if pad < 0:
            raise sec.error(f"must be >= 0 (got {pad})", "pad")
        if pad and size != 2 * pad + 1:
            # darknet: the output size assumes `size/2` padding, im2col pads by `pad` itself.
            raise sec.error(f"pad={pad} with size={size}: darknet sizes the output for {size // 2} "
                            f"pixel(s) of padding but unrolls the input with {pad}, reading misaligned "
                            f"patches; use size={2 * pad + 1} or pad=0", "pad")
        layer = cls(sec.index, in_shape, filters, size, stride, pad, activation, ctx.dtype)
        _, oh, ow = layer.out_shape
        if oh < 1 or ow < 1:
            raise sec.error(f"output would be {ow}x{oh}: a {size}x{size} window does not fit the "
                            f"{in_shape[2]}x{in_shape[1]} input", "size")
        return layer

    def compute_out_shape(self, in_shape):
        _, h, w = in_shape
        return (self.n, local_out_size(h, self.size, self.stride, self.pad),
                local_out_size(w, self.size, self.stride, self.pad))

    def init_weights(self, rng: np.random.Generator) -> None:
        """sqrt(2/(k·k·c))·U(−1, 1) at EVERY location, biases 0.
        # darknet: randomises only location 0 and leaves the other banks at zero."""
        scale = math.sqrt(2.0 / (self.size * self.size * self.in_shape[0]))
        self.weights.value[...] = scale * rng.uniform(-1, 1, self.weights.value.shape)
        self.biases.value.fill(0)

    @property
    def ckk(self) -> int:
        return self.in_shape[0] * self.size * self.size

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.pre = np.zeros((0,), self.dtype)       # training-only: allocate_training
        self.chunk = ic.chunk_items(self.locations * self.ckk, batch)
        self.ymat = np.zeros(self.locations * self.n * self.chunk, self.dtype)
        ic.reserve(self.locations * self.ckk * self.chunk, self.dtype)

    def allocate_training(self) -> None:
        super().allocate_training()
        if act.needs_input(self.act):
            self.pre = self.training_buffer(self.pre)

    def extra_buffers(self) -> list[np.ndarray]:
        return [self.pre, self.ymat, self.wgrad_tmp]

    def _columns(self, x: np.ndarray) -> np.ndarray:
        """The location-major patches (L, c·k·k, nb) of x (nb, c, h, w), in the shared workspace."""
        _, oh, ow = self.out_shape
        col = ic.get((self.locations, self.ckk, x.shape[0]), self.dtype)
        local_im2col(col, x, self.size, self.stride, self.pad, oh, ow)
        return col

    def _chunks(self):
        for b0 in range(0, self.batch, self.chunk):
            yield slice(b0, min(b0 + self.chunk, self.batch))

    def forward(self, s: State) -> None:
        x = s.input.reshape(self.batch, *self.in_shape)
        y = self.output.reshape(self.batch, self.n, self.locations)
        pre = self.pre.reshape(y.shape) if self.pre.size else y
        for items in self._chunks():
            nb = items.stop - items.start
            ymat = self.ymat[:self.locations * self.n * nb].reshape(self.locations, self.n, nb)
            blas.matmul(self.weights.value, self._columns(x[items]), out=ymat)
            local_output(y[items], pre[items], ymat, self.biases.value, self.act, self.pre.size > 0)

    def backward(self, s: State) -> None:
        x = s.input.reshape(self.batch, *self.in_shape)
        d = self.delta.reshape(self.batch, self.n, self.locations)
        y = self.output.reshape(d.shape)
        pre = self.pre.reshape(d.shape) if self.pre.size else y
        prev = s.delta.reshape(self.batch, *self.in_shape) if s.delta is not None else None
        _, oh, ow = self.out_shape
        w, wgrad = self.weights.value, self.weights.grad
        for items in self._chunks():
            nb = items.stop - items.start
            dmat = self.ymat[:self.locations * self.n * nb].reshape(self.locations, self.n, nb)
            local_delta(dmat, self.biases.grad, d[items], y[items], pre[items], self.act)
            col = self._columns(x[items])
            for l in range(self.locations):
                blas.matmul(dmat[l], col[l].T, out=self.wgrad_tmp)
                wgrad[l] += self.wgrad_tmp
            if prev is None:
                continue
            blas.matmul(w.transpose(0, 2, 1), dmat, out=col)      # col is free again: reuse it
            local_col2im_add(prev[items], col, self.size, self.stride, self.pad, oh, ow)

    def weight_arrays(self) -> list[np.ndarray]:
        # 3-D on purpose: a header's transpose flag applies to connected matrices only
        return [self.biases.value, self.weights.value]

    def flops(self) -> float:
        return 2.0 * self.locations * self.n * self.ckk

    def summary(self) -> str:
        return (f"local {self.n:5d} {self.size:2d} x{self.size:2d} /{self.stride:2d}  "
                f"{fmt_shape(self.in_shape)}   ->  {fmt_shape(self.out_shape)}  "
                f"{self.flops() / 1e9:5.3f} BFLOPs")
