"""`[shortcut]`: add earlier layers' outputs to the previous one (spec §2.17, §12).

`out = act(prev)` with, over the part where the shapes overlap, `alpha*prev + beta*from` added
first. The output has the previous layer's shape. A `from` map of another size is sampled the way
Darknet does it:
- from larger (by an integer factor `stride`): every stride-th pixel of `from` is read;
- from smaller (by a factor `sample`): it is added at every sample-th output pixel;
- channels: only the first min(c_prev, c_from) take part.
Elements outside the overlap keep `prev` unscaled. Width and height must shrink or grow by the
same factor (Darknet asserts); anything else is a "shortcut mismatch" CfgError naming both shapes.
Flat vectors (and 1x1xC maps) are added element by element over the shorter one; a flat vector
and a larger image cannot be combined.

pjreddie takes one `from` plus `alpha`/`beta`; AlexeyAB takes a list (the sum of all of them) and
has no alpha/beta. darkpy takes both; a list with alpha != 1 is refused (each add would rescale the
running sum). AlexeyAB's learnable `weights_type` mixing is not supported.

Backward: `d = delta * act'`; `prev.delta += d` (times alpha inside the overlap);
`from.delta += beta * d` mapped back to the sampled positions.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ..kernels import activations as act
from ..kernels import PARALLEL_MIN, PARALLEL_MIN_FLAT, jit, pjit
from .base import Layer, Shape, State, fmt_shape, is_image, register
from .route import shape_text


# -- kernels -------------------------------------------------------------------------------------
@jit(inline="always")
def _add_plane(out, add, alpha, beta, stride, sample, minc, minh, minw, bk):
    """(item, channel) pair bk = b·minc + k of `shortcut_add`."""
    b = bk // minc
    k = bk % minc
    for j in range(minh):
        for i in range(minw):
            out[b, k, j * sample, i * sample] = (alpha * out[b, k, j * sample, i * sample]
                                                 + beta * add[b, k, j * stride, i * stride])


@pjit
def shortcut_add(out, add, alpha, beta, stride, sample, minc, minh, minw):
    """out: (B, C2, H2, W2), the running output; add: (B, C1, H1, W1), a `from` map.
    out[k, j*sample, i*sample] = alpha*out[..] + beta*add[k, j*stride, i*stride] over the overlap.
    Parallel over (item, channel) pairs, serial below PARALLEL_MIN values."""
    B = out.shape[0]
    if B * minc * minh * minw < PARALLEL_MIN:
        for bk in range(B * minc):
            _add_plane(out, add, alpha, beta, stride, sample, minc, minh, minw, bk)
    else:
        for bk in prange(B * minc):
            _add_plane(out, add, alpha, beta, stride, sample, minc, minh, minw, bk)


@jit(inline="always")
def _backward_plane(prev_delta, from_delta, d, alpha1, beta, stride, sample, minc, minh, minw, bk):
    """(item, channel) pair bk = b·minc + k of `shortcut_backward`."""
    b = bk // minc
    k = bk % minc
    for j in range(minh):
        for i in range(minw):
            g = d[b, k, j * sample, i * sample]
            if alpha1 != 0:
                prev_delta[b, k, j * sample, i * sample] += alpha1 * g
            from_delta[b, k, j * stride, i * stride] += beta * g


@pjit
def shortcut_backward(prev_delta, from_delta, d, alpha1, beta, stride, sample, minc, minh, minw):
    """prev_delta, d: (B, C2, H2, W2); from_delta: (B, C1, H1, W1). Over the overlap only:
    prev_delta += alpha1 * d (alpha1 = alpha - 1: the caller has added d everywhere already);
    from_delta[k, j*stride, i*stride] += beta * d[k, j*sample, i*sample]. prev_delta and from_delta
    may be the same array (from=-1): an item/channel pair stays on one thread. Serial below
    PARALLEL_MIN values."""
    B = d.shape[0]
    if B * minc * minh * minw < PARALLEL_MIN:
        for bk in range(B * minc):
            _backward_plane(prev_delta, from_delta, d, alpha1, beta, stride, sample, minc, minh, minw, bk)
    else:
        for bk in prange(B * minc):
            _backward_plane(prev_delta, from_delta, d, alpha1, beta, stride, sample, minc, minh, minw, bk)


@jit
def _add_act_span(out, pre, prev, add, alpha, beta, a, keep_pre):
    """out, prev, add: (n,); out = act(alpha*prev + beta*add) (alpha, beta of the arrays' dtype, so
    the sum rounds as Darknet's float sum); pre: (n,) gets the sum when keep_pre. Leaky (ResNet's
    shortcut) without pre is one vectorised loop; the rest add, then activate in place."""
    n = out.shape[0]
    if a == act.LEAKY and not keep_pre:
        for i in range(n):
            v = alpha * prev[i] + beta * add[i]
            out[i] = v if v > 0 else 0.1 * v
        return
    for i in range(n):
        out[i] = alpha * prev[i] + beta * add[i]
    if keep_pre:
        for i in range(n):
            pre[i] = out[i]
    act.activate_span(out, a)


@jit
def _act_span(out, pre, prev, a, keep_pre):
    """out, prev: (n,); out = act(prev) (`_add_act_span` without the add); pre: (n,) gets prev when
    keep_pre."""
    n = out.shape[0]
    if a == act.LEAKY and not keep_pre:
        for i in range(n):
            v = prev[i]
            out[i] = v if v > 0 else 0.1 * v
        return
    for i in range(n):
        out[i] = prev[i]
    if keep_pre:
        for i in range(n):
            pre[i] = out[i]
    act.activate_span(out, a)


@jit
def _prefix_task(out, pre, prev, add, alpha, beta, a, keep_pre, n, t, nblk):
    """Task t of `shortcut_prefix_add_act`: item t // nblk, its values in block t % nblk."""
    b = t // nblk
    lo = (t % nblk) * act.BLOCK
    hi = min(out.shape[1], lo + act.BLOCK)
    mid = min(max(lo, n), hi)           # [lo, mid) in the overlap, [mid, hi) past it
    p = pre[b]                          # (empty without keep_pre)
    if mid > lo:
        _add_act_span(out[b, lo:mid], p[lo:mid], prev[b, lo:mid], add[b, lo:mid], alpha, beta, a,
                      keep_pre)
    if hi > mid:
        _act_span(out[b, mid:hi], p[mid:hi], prev[b, mid:hi], a, keep_pre)


@pjit
def shortcut_prefix_add_act(out, pre, prev, add, alpha, beta, a, keep_pre, n):
    """out, prev: (B, N); add: (B, N1), N1 >= n; pre: (B, N) when keep_pre, else (B, 0); alpha,
    beta: scalars of the arrays' dtype. For each item out[:n] = act(alpha*prev[:n] + beta*add[:n])
    and out[n:] = act(prev[n:]), pre the pre-activation: a shortcut of one `from` whose overlap is
    a prefix of each item (n = N: the same shape, the common case; fewer channels on the same map:
    ResNet's first block of a stage) in ONE pass over memory instead of a copy, an add and an
    activation. Parallel over (item, block) pairs, serial below `act.parallel_min` values
    (PARALLEL_MIN_FLAT for the cheap activations)."""
    B, N = out.shape
    nblk = (N + act.BLOCK - 1) // act.BLOCK
    if B * N < act.parallel_min(a, PARALLEL_MIN_FLAT):
        for t in range(B * nblk):
            _prefix_task(out, pre, prev, add, alpha, beta, a, keep_pre, n, t, nblk)
    else:
        for t in prange(B * nblk):
            _prefix_task(out, pre, prev, add, alpha, beta, a, keep_pre, n, t, nblk)


@jit
def _add_flat_item(out, add, alpha, beta, n, bk, nblk):
    b = bk // nblk
    lo = (bk % nblk) * act.BLOCK
    for i in range(lo, min(n, lo + act.BLOCK)):
        out[b, i] = alpha * out[b, i] + beta * add[b, i]


@pjit
def shortcut_add_flat(out, add, alpha, beta, n):
    """out: (B, N2), add: (B, N1), items flat: out[:n] = alpha*out[:n] + beta*add[:n] (flat vectors
    or a channel prefix, with no resampling). Parallel over (item, span) pairs, serial below
    PARALLEL_MIN_FLAT values."""
    B = out.shape[0]
    nblk = (n + act.BLOCK - 1) // act.BLOCK
    if B * n < PARALLEL_MIN_FLAT:
        for bk in range(B * nblk):
            _add_flat_item(out, add, alpha, beta, n, bk, nblk)
    else:
        for bk in prange(B * nblk):
            _add_flat_item(out, add, alpha, beta, n, bk, nblk)


@jit
def _backward_flat_item(prev_delta, from_delta, d, alpha1, beta, n, b):
    for i in range(n):
        g = d[b, i]
        if alpha1 != 0:
            prev_delta[b, i] += alpha1 * g
        from_delta[b, i] += beta * g


@pjit
def shortcut_backward_flat(prev_delta, from_delta, d, alpha1, beta, n):
    """As `shortcut_backward` for the flat case: prev_delta[:n] += alpha1*d[:n];
    from_delta[:n] += beta*d[:n]. All (B, N) with items flat. Parallel over items, serial below
    PARALLEL_MIN_FLAT values."""
    B = d.shape[0]
    if B * n < PARALLEL_MIN_FLAT:
        for b in range(B):
            _backward_flat_item(prev_delta, from_delta, d, alpha1, beta, n, b)
    else:
        for b in prange(B):
            _backward_flat_item(prev_delta, from_delta, d, alpha1, beta, n, b)


# -- geometry --------------------------------------------------------------------------------------
def _as_chw(shape: Shape) -> Shape:
    return tuple(shape) if len(shape) == 3 else (shape[0], 1, 1)


def overlap(prev: Shape, frm: Shape) -> tuple[int, int, int, int, int] | str:
    """(stride, sample, minc, minh, minw) for adding a `frm`-shaped map into a `prev`-shaped one,
    or the reason they cannot be combined."""
    c2, h2, w2 = _as_chw(prev)
    c1, h1, w1 = _as_chw(frm)
    if is_image(prev) != is_image(frm) and max(h1, w1, h2, w2) > 1:
        return "an image and a flat vector cannot be added"
    stride_w, stride_h = w1 // w2, h1 // h2
    sample_w, sample_h = w2 // w1, h2 // h1
    if stride_w != stride_h or sample_w != sample_h:
        return (f"width and height change by different factors (width {w1}->{w2}, height {h1}->{h2}); "
                "darknet only samples both by the same integer factor")
    return max(stride_w, 1), max(sample_w, 1), min(c1, c2), min(h1, h2), min(w1, w2)


class ActivationBuffers:
    """Mixin for layers that end in an activation (shortcut, sam, scale_channels): backward needs
    delta·act' (`scratch`, non-linear activations) and the pre-activation (`x`, swish/mish/...),
    both training-only: empty after allocate, sized by allocate_training."""

    def extra_buffers(self) -> list[np.ndarray]:
        return [self.x, self.scratch]

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.x = np.zeros((0,), self.dtype)
        self.scratch = np.zeros((0,), self.dtype)

    def allocate_training(self) -> None:
        super().allocate_training()
        if self.act != act.LINEAR:
            self.scratch = self.training_buffer(self.scratch)
        if act.needs_input(self.act):
            self.x = self.training_buffer(self.x)


@register
class ShortcutLayer(ActivationBuffers, Layer):
    kind = "shortcut"

    def __init__(self, index: int, in_shape: Shape, refs, sources: list[Layer], activation: str = "linear",
                 alpha: float = 1.0, beta: float = 1.0, dtype=np.float32):
        super().__init__(index, in_shape, in_shape, dtype)
        self.refs = tuple(refs)
        self.sources = list(sources)     # the Layer objects, for their shapes at resize time
        self.activation = activation
        self.act = act.code(activation)
        self.alpha = alpha
        self.beta = beta
        self.maps: list[tuple[int, int, int, int, int]] = []
        self.x = np.zeros((0,), self.dtype)        # pre-activation copy (swish/mish/... only)
        self.scratch = np.zeros((0,), self.dtype)  # delta * act' (non-linear activations only)
        self._compute_maps()

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "ShortcutLayer":
        refs = [ctx.ref(sec, "from", v) for v in sec.get_int_list("from")]
        activation = sec.get_choice("activation", act.NAMES, "linear", aliases=act.ALIASES)
        alpha = sec.get_float("alpha", 1.0)
        beta = sec.get_float("beta", 1.0)
        weights_type = sec.get_choice("weights_type", ("none", "per_feature", "per_layer", "per_channel"),
                                      "none")
        sec.get_choice("weights_normalization", ("none", "relu", "avg_relu", "softmax"), "none")
        if weights_type != "none":
            raise sec.error(f"learnable shortcut weights (weights_type={weights_type}) are not supported "
                            "by darkpy; use weights_type=none", "weights_type")
        if len(refs) > 1 and alpha != 1.0:
            raise sec.error(f"alpha={alpha} needs a single `from` layer (got {len(refs)})", "alpha")
        for i in refs:
            why = overlap(tuple(in_shape), ctx.layers[i].out_shape)
            if isinstance(why, str):
                raise sec.error(_mismatch(i, ctx.layers[i].out_shape, sec.index - 1, in_shape, why), "from")
        return cls(sec.index, in_shape, refs, [ctx.layers[i] for i in refs], activation, alpha, beta,
                   ctx.dtype)

    def _compute_maps(self) -> None:
        self.maps = []
        for i, src in zip(self.refs, self.sources):
            m = overlap(self.out_shape, src.out_shape)
            if isinstance(m, str):
                raise self.error(_mismatch(i, src.out_shape, self.index - 1, self.out_shape, m), "from")
            self.maps.append(m)
        #: one `from` whose overlap is a prefix of each item (of the output's own shape, or fewer
        #: channels on the same map): the values per item it adds, for the single pass
        #: `shortcut_prefix_add_act`; else 0
        self.prefix = self._flat(self.maps[0], self.sources[0]) if len(self.sources) == 1 else 0

    def resize(self, in_shape: Shape) -> None:
        self.in_shape = self.out_shape = tuple(in_shape)
        self._compute_maps()

    def _chw(self, a: np.ndarray, shape: Shape) -> np.ndarray:
        return a.reshape(self.batch, *_as_chw(shape))

    def _flat(self, m: tuple[int, int, int, int, int], src: Layer) -> int:
        """Values per item to add element by element, or 0 when the map needs resampling."""
        stride, sample, minc, minh, minw = m
        _, h, w = _as_chw(self.out_shape)
        if stride == sample == 1 and (minh, minw) == (h, w) == _as_chw(src.out_shape)[1:]:
            return minc * h * w
        return 0

    def forward(self, s: State) -> None:
        if self.prefix:
            shortcut_prefix_add_act(self.output.reshape(self.batch, -1),
                                    self.x.reshape(self.batch, -1), s.input.reshape(self.batch, -1),
                                    s.layers[self.refs[0]].output.reshape(self.batch, -1),
                                    self.dtype.type(self.alpha), self.dtype.type(self.beta),
                                    self.act, self.x.size > 0, self.prefix)
            return
        np.copyto(self.output, s.input.reshape(self.output.shape))
        out = self._chw(self.output, self.out_shape)
        for i, m in zip(self.refs, self.maps):
            src = s.layers[i]
            n = self._flat(m, src)
            if n:
                shortcut_add_flat(self.output.reshape(self.batch, -1), src.output.reshape(self.batch, -1),
                                  self.alpha, self.beta, n)
            else:
                shortcut_add(out, self._chw(src.output, src.out_shape), self.alpha, self.beta, *m)
        if self.x.size:
            np.copyto(self.x, self.output)
        act.activate_array(self.output, self.act)

    def backward(self, s: State) -> None:
        d = self.delta
        if self.scratch.size:
            np.copyto(self.scratch, self.delta)
            act.gradient_array(self.scratch, self.output, self.act, self.x if self.x.size else None)
            d = self.scratch
        # darknet: prev.delta += alpha*d over every element, although forward leaves the elements
        # outside the overlap unscaled; darkpy applies alpha only inside the overlap (the true
        # gradient). The two agree whenever alpha == 1 or the shapes match.
        s.delta += d.reshape(s.delta.shape)      # a shortcut is never layer 0: s.delta exists
        d = self._chw(d, self.out_shape)
        prev = self._chw(s.delta, self.out_shape)
        for i, m in zip(self.refs, self.maps):
            src = s.layers[i]
            n = self._flat(m, src)
            if n:
                shortcut_backward_flat(s.delta.reshape(self.batch, -1), src.delta.reshape(self.batch, -1),
                                       d.reshape(self.batch, -1), self.alpha - 1.0, self.beta, n)
            else:
                shortcut_backward(prev, self._chw(src.delta, src.out_shape), d, self.alpha - 1.0, self.beta,
                                  *m)

    def summary(self) -> str:
        refs = ",".join(str(i) for i in self.refs)
        src = self.sources[0].out_shape
        return f"res  {refs:>3}                {fmt_shape(src)}   ->  {fmt_shape(self.out_shape)}"


def _mismatch(src_index: int, src_shape: Shape, prev_index: int, prev_shape: Shape, why: str) -> str:
    return (f"shortcut mismatch: layer {src_index} output {shape_text(src_shape)} cannot be added to "
            f"layer {prev_index} output {shape_text(prev_shape)}: {why}")
