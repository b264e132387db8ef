"""Recurrent layers `[rnn]`, `[gru]`, `[lstm]`, `[crnn]` (spec §2.5), trained by back-propagation
through time.

Layout. A recurrent network has `steps = [net] time_steps`; the network's rows per pass are
`steps × batch` (NetConfig.minibatch includes the factor) and are TIME-MAJOR: step t of every sequence
is rows `[t·batch, (t+1)·batch)`. The layer's output has the same layout, one row per (step, sequence).

Composition. Each layer is built from full `[connected]` (rnn, gru, lstm) or `[convolutional]` (crnn)
layers, as in Darknet, with their own biases and optional batch norm. An inner layer owns buffers
for all `steps × batch` rows; `_Inner.bind` points it at one step's rows before each call (Darknet's
`increment_layer`), so its forward/backward run unchanged. With batch norm in training each step is
normalised with its own batch statistics (Darknet's per-step forward), kept per step for the backward
pass. The input-side layers (rnn/crnn `input`, gru/lstm `u*`) do not depend on the state, so when
that does not change the statistics (no BN, or inference) they run over all rows in one GEMM.
The inner layers' Params are the outer layer's `params` (named `<inner>.<param>`), so
`Network.update()` trains them; `weight_arrays()` concatenates the inner layers' arrays in
pjreddie's file order (spec §7), `alexeyab_weight_arrays()` in AlexeyAB's (gru: uz ur uh wz wr wh;
lstm: wf wi wg wo uf ui ug uo); darkpy/weights.py says which a file uses.

Hidden state. Within one forward the state flows from step to step, starting from zero: every
forward is a pure function of its input and parameters (what pjreddie's CPU path does for training,
and what a gradient check needs). With `carry_state = True` a forward starts instead from the state
the previous forward ended with (Darknet's inference behaviour, e.g. generating text one step per
call); `reset_state()` zeroes it. Gradients never flow into a carried state (truncated BPTT).

Recurrences (σ = logistic, all products elementwise):
* rnn/crnn: `s_t = [shortcut: s_{t−1}] + act(U x_t) + act(W s_{t−1})`, `y_t = act(V s_t)`; each branch
  has its own bias and activation, applied before the sum.
* gru: `z = σ(Uz x + Wz h)`, `r = σ(Ur x + Wr h)`, `h̃ = f(Uh x + Wh (r·h))`, `h' = z·h + (1−z)·h̃`;
  `f` is LOGISTIC unless `tanh=1` (pjreddie's default, kept: `# darknet:`).
* lstm: `f, i, o = σ(W h + U x)`, `g = tanh(W h + U x)`, `c' = f·c + i·g`, `h' = o·tanh(c')`.

Differences from Darknet (README): pjreddie's CPU rnn/crnn advance the state pointer in training and
rebuild the state without the shortcut term in backward, copy the self layer's delta into the input
layer's after applying its activation gradient, gru and lstm have no CPU backward at all, and every
BN backward uses the last step's statistics; darkpy implements the exact gradient of the forward
above (the GPU path's semantics). Its CPU inference keeps the state between calls (darkpy: only with
`carry_state`). `[crnn]` with pjreddie's keys reproduces its width/height swap (see CRNNLayer).
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ..errors import StateError
from ..kernels import activations as act
from ..kernels import PARALLEL_MIN, jit, pjit
from ..kernels.activations import LOGISTIC, TANH, _act, _grad
from .base import Layer, State, fmt_shape, is_image, numel, register
from .connected import ConnectedLayer
from .convolutional import ConvolutionalLayer, conv_out_size

# -- kernels ---------------------------------------------------------------------------------------

# Each kernel runs its row helper over the batch rows: in parallel from PARALLEL_MIN values (every
# value costs an exp or a tanh), serially below, where waking the threads would cost more than the
# row loop (a text model's step is a few rows of a few hundred units). The helpers are inlined:
# they must hold no array expression, which would open a parallel region of its own.

@jit(inline="always")
def _gru_gates_row(z, r, fs, uz, wz, ur, wr, h, i):
    for j in range(z.shape[1]):
        z[i, j] = _act(uz[i, j] + wz[i, j], LOGISTIC)
        r[i, j] = _act(ur[i, j] + wr[i, j], LOGISTIC)
        fs[i, j] = r[i, j] * h[i, j]


@pjit
def gru_gates(z, r, fs, uz, wz, ur, wr, h):
    """All (b, n): z = σ(uz + wz), r = σ(ur + wr), fs = r·h (the reset state fed to Wh)."""
    if z.size < PARALLEL_MIN:
        for i in range(z.shape[0]):
            _gru_gates_row(z, r, fs, uz, wz, ur, wr, h, i)
    else:
        for i in prange(z.shape[0]):
            _gru_gates_row(z, r, fs, uz, wz, ur, wr, h, i)


@jit(inline="always")
def _gru_output_row(out, hc, uh, wh, z, h, a, i):
    for j in range(out.shape[1]):
        c = _act(uh[i, j] + wh[i, j], a)
        hc[i, j] = c
        out[i, j] = z[i, j] * h[i, j] + (1 - z[i, j]) * c


@pjit
def gru_output(out, hc, uh, wh, z, h, a):
    """All (b, n): hc = f(uh + wh) (f = activation code a), out = z·h + (1 − z)·hc."""
    if out.size < PARALLEL_MIN:
        for i in range(out.shape[0]):
            _gru_output_row(out, hc, uh, wh, z, h, a, i)
    else:
        for i in prange(out.shape[0]):
            _gru_output_row(out, hc, uh, wh, z, h, a, i)


@jit(inline="always")
def _gru_backward_out_row(dz, dhc, dh_prev, dh, h, hc, z, a, i):
    for j in range(dz.shape[1]):
        d = dh[i, j]
        zz = z[i, j]
        dz[i, j] = d * (h[i, j] - hc[i, j]) * zz * (1 - zz)
        dhc[i, j] = d * (1 - zz) * _grad(hc[i, j], hc[i, j], a)
        dh_prev[i, j] += d * zz


@pjit
def gru_backward_out(dz, dhc, dh_prev, dh, h, hc, z, a):
    """All (b, n). From dh (w.r.t. the step's output): dz and dhc w.r.t. the pre-activations of z and
    the candidate (written), and dh_prev += dh·z (the direct path to the previous state)."""
    if dz.size < PARALLEL_MIN:
        for i in range(dz.shape[0]):
            _gru_backward_out_row(dz, dhc, dh_prev, dh, h, hc, z, a, i)
    else:
        for i in prange(dz.shape[0]):
            _gru_backward_out_row(dz, dhc, dh_prev, dh, h, hc, z, a, i)


@jit(inline="always")
def _gru_backward_reset_row(dr, dh_prev, dfs, h, r, i):
    for j in range(dr.shape[1]):
        rr = r[i, j]
        dr[i, j] = dfs[i, j] * h[i, j] * rr * (1 - rr)
        dh_prev[i, j] += dfs[i, j] * rr


@pjit
def gru_backward_reset(dr, dh_prev, dfs, h, r):
    """All (b, n). From dfs (w.r.t. fs = r·h): dr w.r.t. r's pre-activation (written), dh_prev += dfs·r."""
    if dr.size < PARALLEL_MIN:
        for i in range(dr.shape[0]):
            _gru_backward_reset_row(dr, dh_prev, dfs, h, r, i)
    else:
        for i in prange(dr.shape[0]):
            _gru_backward_reset_row(dr, dh_prev, dfs, h, r, i)


@jit(inline="always")
def _lstm_step_row(f, i, g, o, c, h, wf, uf, wi, ui, wg, ug, wo, uo, c_prev, b):
    for j in range(f.shape[1]):
        ff = _act(wf[b, j] + uf[b, j], LOGISTIC)
        ii = _act(wi[b, j] + ui[b, j], LOGISTIC)
        gg = _act(wg[b, j] + ug[b, j], TANH)
        oo = _act(wo[b, j] + uo[b, j], LOGISTIC)
        cc = ff * c_prev[b, j] + ii * gg
        f[b, j] = ff
        i[b, j] = ii
        g[b, j] = gg
        o[b, j] = oo
        c[b, j] = cc
        h[b, j] = oo * _act(cc, TANH)


@pjit
def lstm_step(f, i, g, o, c, h, wf, uf, wi, ui, wg, ug, wo, uo, c_prev):
    """All (b, n). Gates from the W (state) and U (input) products, then c = f·c_prev + i·g and
    h = o·tanh(c)."""
    if f.size < PARALLEL_MIN:
        for b in range(f.shape[0]):
            _lstm_step_row(f, i, g, o, c, h, wf, uf, wi, ui, wg, ug, wo, uo, c_prev, b)
    else:
        for b in prange(f.shape[0]):
            _lstm_step_row(f, i, g, o, c, h, wf, uf, wi, ui, wg, ug, wo, uo, c_prev, b)


@jit(inline="always")
def _lstm_backward_row(df, di, dg, do, dc, dh, f, i, g, o, c, c_prev, b):
    for j in range(f.shape[1]):
        tc = _act(c[b, j], TANH)
        oo = o[b, j]
        ii = i[b, j]
        gg = g[b, j]
        ff = f[b, j]
        d = dh[b, j]
        do[b, j] = d * tc * oo * (1 - oo)
        dct = dc[b, j] + d * oo * (1 - tc * tc)
        di[b, j] = dct * gg * ii * (1 - ii)
        dg[b, j] = dct * ii * (1 - gg * gg)
        df[b, j] = dct * c_prev[b, j] * ff * (1 - ff)
        dc[b, j] = dct * ff


@pjit
def lstm_backward_step(df, di, dg, do, dc, dh, f, i, g, o, c, c_prev):
    """All (b, n). dh: w.r.t. the step's output h; dc: in, w.r.t. c from the next step; out, w.r.t.
    c_prev. df, di, dg, do receive the gradients w.r.t. the gates' pre-activations."""
    if f.size < PARALLEL_MIN:
        for b in range(f.shape[0]):
            _lstm_backward_row(df, di, dg, do, dc, dh, f, i, g, o, c, c_prev, b)
    else:
        for b in prange(f.shape[0]):
            _lstm_backward_row(df, di, dg, do, dc, dh, f, i, g, o, c, c_prev, b)


# -- inner layers, one time step at a time ---------------------------------------------------------


class _Inner:
    """An inner connected/convolutional layer with buffers for every row of every step. `bind`
    points its per-row buffers at a row range and its BN batch statistics at one step's slot."""

    ROW_BUFFERS = ("output", "delta", "pre", "xnorm", "dx_tmp")

    def __init__(self, name: str, layer: Layer):
        self.name = name
        self.layer = layer
        for p in layer.params:
            p.name = f"{name}.{p.name}"
        self.full: dict[str, np.ndarray] = {}
        self.rows = 0
        self.bn_mean = self.bn_var = None

    @property
    def output(self) -> np.ndarray:
        return self.full["output"]

    @property
    def delta(self) -> np.ndarray:
        """Every row's delta (empty until `allocate_training`)."""
        return self.full.get("delta", self.layer.delta)

    @property
    def bn(self):
        return self.layer.bn

    def allocate(self, rows: int, steps: int) -> None:
        layer = self.layer
        layer.allocate(rows)
        self.rows = rows
        self._collect()
        if layer.bn is not None:
            n = layer.bn.mean.shape[0]
            self.bn_mean = np.zeros((steps, n), layer.dtype)
            self.bn_var = np.zeros((steps, n), layer.dtype)

    def allocate_training(self) -> None:
        """The inner layer's training-only buffers, for every row. `bind` leaves per-row views in
        the layer, so the full buffers go back first; a no-op once they exist."""
        layer = self.layer
        for k, arr in self.full.items():
            setattr(layer, k, arr)
        layer.batch = self.rows
        layer.allocate_training()
        self._collect()

    def _collect(self) -> None:
        layer = self.layer
        self.full = {k: getattr(layer, k) for k in self.ROW_BUFFERS
                     if getattr(layer, k, None) is not None and getattr(layer, k).size}

    def bind(self, r0: int, r1: int, step: int) -> Layer:
        layer = self.layer
        for k, arr in self.full.items():
            setattr(layer, k, arr[r0:r1])
        layer.batch = r1 - r0
        if layer.bn is not None:
            layer.bn.mean = self.bn_mean[step]
            layer.bn.variance = self.bn_var[step]
        return layer

    def buffers(self) -> list[np.ndarray]:
        extra = [self.layer.wgrad_tmp]
        if self.bn_mean is not None:
            extra += [self.bn_mean, self.bn_var]
        return list(self.full.values()) + extra


class _Recurrent(Layer):
    """What the four recurrent families share: inner layers, time-major rows, state handling."""

    resizable = False
    output_shareable = False            # rnn/crnn output their output sub-layer's buffer

    def __init__(self, index: int, in_shape, out_shape, steps: int, dtype=np.float32):
        super().__init__(index, in_shape, out_shape, dtype)
        self.steps = steps
        self.seq_batch = 0                  # sequences per step (Darknet's l.batch)
        self.inner: list[_Inner] = []       # in pjreddie's .weights order
        self.carry_state = False
        self._s = State(input=np.zeros(0, self.dtype), delta=None, truth=None, train=False, layers=[])

    def _add(self, name: str, layer: Layer) -> _Inner:
        inner = _Inner(name, layer)
        self.inner.append(inner)
        self.params = [p for i in self.inner for p in i.layer.params]
        return inner

    @property
    def batch_normalize(self) -> bool:
        return self.inner[0].bn is not None

    @property
    def darknet_cpu_bn(self) -> bool:
        return any(getattr(i.layer, "darknet_cpu_bn", False) for i in self.inner)

    @darknet_cpu_bn.setter
    def darknet_cpu_bn(self, on: bool) -> None:
        """Reproduce pjreddie's CPU batch norm in every inner layer (for comparing with its dumps)."""
        for i in self.inner:
            i.layer.darknet_cpu_bn = on

    def init_weights(self, rng: np.random.Generator) -> None:
        for i in self.inner:
            i.layer.init_weights(rng)

    def allocate(self, batch: int) -> None:
        if batch % self.steps:
            raise StateError(f"layer {self.index} [{self.kind}]: {batch} rows is not a multiple of "
                             f"time_steps={self.steps} (rows are time steps x sequences)")
        self.batch = batch
        self.seq_batch = batch // self.steps
        for i in self.inner:
            i.allocate(batch, self.steps)

    def allocate_training(self) -> None:
        """The inner layers' training buffers; subclasses add their own state gradients."""
        for i in self.inner:
            i.allocate_training()

    def reset_state(self) -> None:
        """Zero the state a `carry_state` forward starts from."""
        for arr in self._initial_state():
            arr.fill(0)

    def _initial_state(self) -> list[np.ndarray]:
        raise NotImplementedError

    def extra_buffers(self) -> list[np.ndarray]:
        seen = {id(self.output), id(self.delta)}
        return [a for i in self.inner for a in i.buffers() if id(a) not in seen]

    # -- running inner layers ----------------------------------------------------------------------
    def _rows(self, t: int) -> slice:
        b = self.seq_batch
        return slice(t * b, (t + 1) * b)

    def _forward(self, inner: _Inner, x: np.ndarray, r0: int, r1: int, step: int, train: bool) -> None:
        s = self._s
        s.input, s.delta, s.train = x, None, train
        inner.bind(r0, r1, step).forward(s)

    def _backward(self, inner: _Inner, x: np.ndarray, dx, r0: int, r1: int, step: int) -> None:
        s = self._s
        s.input, s.delta, s.train = x, dx, True
        inner.bind(r0, r1, step).backward(s)

    def _segments(self, inner: _Inner, train: bool):
        """Row ranges (r0, r1, step) an input-side layer runs over: every row at once, or one step at
        a time when batch norm in training needs per-step statistics."""
        if inner.bn is not None and train:
            b = self.seq_batch
            return [(t * b, (t + 1) * b, t) for t in range(self.steps)]
        return [(0, self.batch, 0)]

    def _forward_inputs(self, inners, x: np.ndarray, train: bool) -> None:
        for inner in inners:
            for r0, r1, k in self._segments(inner, train):
                self._forward(inner, x[r0:r1], r0, r1, k, train)

    def _backward_inputs(self, inners, x: np.ndarray, dx, step: int | None) -> None:
        """Input-side backward, matching `_segments`: with batch norm, step `step`'s rows (called
        inside the time loop); without, every row at once (called after it with step None)."""
        b = self.seq_batch
        for inner in inners:
            if (inner.bn is not None) != (step is not None):
                continue
            r0, r1, k = (step * b, (step + 1) * b, step) if step is not None else (0, self.batch, 0)
            self._backward(inner, x[r0:r1], None if dx is None else dx[r0:r1], r0, r1, k)

    def weight_arrays(self) -> list[np.ndarray]:
        return [a for i in self.inner for a in i.layer.weight_arrays()]

    #: AlexeyAB's .weights order of the inner layers, by name (None: the same as pjreddie's).
    ALEXEYAB_ORDER: tuple[str, ...] | None = None

    def alexeyab_weight_arrays(self) -> list[np.ndarray]:
        """The arrays in AlexeyAB's file order (darkpy/weights.py chooses which order to use)."""
        if self.ALEXEYAB_ORDER is None:
            return self.weight_arrays()
        by_name = {i.name: i for i in self.inner}
        return [a for name in self.ALEXEYAB_ORDER for a in by_name[name].layer.weight_arrays()]

    def flops(self) -> float:
        return sum(i.layer.flops() for i in self.inner)


def _connected(index, n_in: int, n_out: int, bn: bool, activation: str, dtype) -> ConnectedLayer:
    return ConnectedLayer(index, (n_in,), n_out, bn, activation, dtype)


# -- rnn and crnn ----------------------------------------------------------------------------------


class _SimpleRecurrent(_Recurrent):
    """rnn and crnn: input, self and output sub-layers; the state is the sum of the branches."""

    def _setup(self, input_layer: Layer, self_layer: Layer, output_layer: Layer, shortcut: bool) -> None:
        self.shortcut = shortcut
        self.input_layer = self._add("input", input_layer)
        self.self_layer = self._add("self", self_layer)
        self.output_layer = self._add("output", output_layer)
        self.state_shape = self_layer.in_shape
        self.states = np.zeros((0,), self.dtype)
        self.dstates = np.zeros((0,), self.dtype)
        self.h0 = np.zeros((0,), self.dtype)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        b = self.seq_batch
        self.states = np.zeros((self.steps + 1, b, *self.state_shape), self.dtype)
        self.dstates = np.zeros((0,), self.dtype)   # training-only: allocate_training
        self.h0 = np.zeros((b, *self.state_shape), self.dtype)
        self.output = self.output_layer.output
        self.delta = self.output_layer.delta

    def allocate_training(self) -> None:
        super().allocate_training()
        self.delta = self.output_layer.delta
        self.dstates = self.training_buffer(self.dstates, self.states.shape)

    def _initial_state(self):
        return [self.h0]

    def extra_buffers(self):
        return super().extra_buffers() + [self.states, self.dstates, self.h0]

    def forward(self, s: State) -> None:
        x = s.input.reshape(self.batch, *self.input_layer.layer.in_shape)
        st = self.states
        if self.carry_state:
            st[0] = self.h0
        else:
            st[0].fill(0)
        self._forward_inputs([self.input_layer], x, s.train)
        for t in range(self.steps):
            rows = self._rows(t)
            self._forward(self.self_layer, st[t], rows.start, rows.stop, t, s.train)
            np.add(self.input_layer.output[rows], self.self_layer.output[rows], out=st[t + 1])
            if self.shortcut:
                st[t + 1] += st[t]
            self._forward(self.output_layer, st[t + 1], rows.start, rows.stop, t, s.train)
        if self.carry_state:
            self.h0[...] = st[self.steps]

    def backward(self, s: State) -> None:
        x = s.input.reshape(self.batch, *self.input_layer.layer.in_shape)
        dx = s.delta.reshape(x.shape) if s.delta is not None else None
        st, dst = self.states, self.dstates
        dst.fill(0)
        for t in range(self.steps - 1, -1, -1):
            rows = self._rows(t)
            self._backward(self.output_layer, st[t + 1], dst[t + 1], rows.start, rows.stop, t)
            # dst[t + 1] is complete: output layer of step t, self layer and shortcut of step t + 1
            self.input_layer.delta[rows] = dst[t + 1]
            self.self_layer.delta[rows] = dst[t + 1]
            if self.shortcut:
                dst[t] += dst[t + 1]
            self._backward(self.self_layer, st[t], dst[t] if t > 0 else None, rows.start, rows.stop, t)
            self._backward_inputs([self.input_layer], x, dx, t)
        self._backward_inputs([self.input_layer], x, dx, None)


@register
class RNNLayer(_SimpleRecurrent):
    kind = "rnn"

    def __init__(self, index: int, in_shape, outputs: int, steps: int, hidden: int | None = None,
                 activation: str = "logistic", batch_normalize: bool = False, shortcut: bool = False,
                 self_activation: str | None = None, dtype=np.float32):
        super().__init__(index, in_shape, (outputs,), steps, dtype)
        hidden = outputs if hidden is None else hidden
        self.hidden = hidden
        self.activation = activation
        n_in = numel(in_shape)
        self._setup(_connected(index, n_in, hidden, batch_normalize, activation, dtype),
                    _connected(index, hidden, hidden, batch_normalize, self_activation or activation, dtype),
                    _connected(index, hidden, outputs, batch_normalize, activation, dtype),
                    shortcut)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> RNNLayer:
        outputs = _positive(sec, "output")
        # pjreddie does not read `hidden` (its hidden size is `output`); AlexeyAB does
        hidden = _positive(sec, "hidden", outputs)
        activation = sec.get_choice("activation", act.NAMES, "logistic", aliases=act.ALIASES)
        bn = sec.get_bool("batch_normalize", False)
        shortcut = sec.get_bool("shortcut", False)
        logistic = sec.get_int("logistic", 0)       # AlexeyAB: the self layer's activation
        if logistic not in (0, 1, 2):
            raise sec.error(f"must be 0, 1 (logistic) or 2 (loggy) (got {logistic})", "logistic")
        self_act = {0: None, 1: "logistic", 2: "loggy"}[logistic]
        return cls(sec.index, in_shape, outputs, ctx.net.time_steps, hidden, activation, bn, shortcut,
                   self_act, ctx.dtype)

    def summary(self) -> str:
        return f"RNN Layer: {self.inputs} inputs, {self.outputs} outputs"


@register
class CRNNLayer(_SimpleRecurrent):
    """Convolutional RNN. pjreddie's keys (`output_filters`, `hidden_filters`): fixed 3x3 stride-1
    pad-1 convolutions, and its parser passes width and height swapped to the constructor, so a
    (c, h, w) input buffer is read as (c, w, h) and the output is (out, w, h) — the same memory,
    reinterpreted. darkpy reproduces that (`swapped`): weights trained by Darknet on non-square
    inputs learned exactly those neighbourhoods. # darknet: the swap is kept on purpose.
    AlexeyAB's keys (`output`, `hidden`, `size`, `pad`/`padding`, `dilation`, `groups`): no swap;
    the convolutions must keep the spatial size (stride 1), as its layer asserts. A flat input of n
    values is a 1x1 image with n channels, as Darknet sees a connected layer's output."""

    kind = "crnn"

    def __init__(self, index: int, in_shape, hidden_filters: int, output_filters: int, steps: int,
                 size: int = 3, padding: int = 1, dilation: int = 1, groups: int = 1,
                 activation: str = "logistic", batch_normalize: bool = False, shortcut: bool = False,
                 swapped: bool = False, dtype=np.float32):
        c, h, w = in_shape if len(in_shape) == 3 else (numel(in_shape), 1, 1)
        if swapped:
            h, w = w, h
        self.swapped = swapped
        self.size, self.padding, self.dilation, self.groups = size, padding, dilation, groups
        super().__init__(index, in_shape, (output_filters, h, w), steps, dtype)
        self.activation = activation

        def conv(cin, cout):
            return ConvolutionalLayer(index, (cin, h, w), cout, size, 1, 1, padding, groups, dilation,
                                      batch_normalize, activation, False, dtype)

        self._setup(conv(c, hidden_filters), conv(hidden_filters, hidden_filters),
                    conv(hidden_filters, output_filters), shortcut)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> CRNNLayer:
        p_keys = [k for k in ("output_filters", "hidden_filters") if sec.has(k)]
        a_keys = [k for k in ("output", "hidden") if sec.has(k)]
        if p_keys and a_keys:
            raise sec.error(f"mixes pjreddie's {'/'.join(p_keys)} with AlexeyAB's {'/'.join(a_keys)}; "
                            f"use output_filters/hidden_filters or output/hidden", a_keys[0])
        activation = sec.get_choice("activation", act.NAMES, "logistic", aliases=act.ALIASES)
        bn = sec.get_bool("batch_normalize", False)
        shortcut = sec.get_bool("shortcut", False)
        steps = ctx.net.time_steps
        if not a_keys:
            out_f = _positive(sec, "output_filters")
            hid_f = _positive(sec, "hidden_filters")
            swapped = is_image(in_shape) and in_shape[1] != in_shape[2]
            return cls(sec.index, in_shape, hid_f, out_f, steps, 3, 1, 1, 1, activation, bn, shortcut,
                       swapped, ctx.dtype)
        out_f = _positive(sec, "output")
        hid_f = _positive(sec, "hidden")
        size = _positive(sec, "size", 3)
        stride = _positive(sec, "stride", 1)
        dilation = _positive(sec, "dilation", 1)
        groups = _positive(sec, "groups", 1)
        padding = sec.get_int("padding", 0)
        if sec.get_int("pad", 0):
            padding = size // 2
        if sec.get_int("xnor", 0):
            raise sec.error("XNOR networks are not supported by darkpy", "xnor")
        if stride != 1:
            raise sec.error(f"must be 1: the state must keep its size from step to step (got {stride})",
                            "stride")
        c = in_shape[0] if len(in_shape) == 3 else numel(in_shape)
        for what, n in (("input channels", c), ("hidden", hid_f), ("output", out_f)):
            if n % groups:
                raise sec.error(f"groups={groups} must divide the {what} ({n})", "groups")
        h, w = (in_shape[1], in_shape[2]) if len(in_shape) == 3 else (1, 1)
        if any(conv_out_size(d, size, 1, padding, dilation) != d for d in (h, w)):
            raise sec.error(f"a {size}x{size} convolution with padding {padding} (dilation {dilation}) "
                            f"changes the {w}x{h} size; the state must keep it (use pad=1)", "size")
        return cls(sec.index, in_shape, hid_f, out_f, steps, size, padding, dilation, groups,
                   activation, bn, shortcut, False, ctx.dtype)

    @property
    def col_shape(self) -> tuple:
        """The largest im2col matrix of the inner convolutions (the summary sizes the workspace by it)."""
        return max((i.layer.col_shape for i in self.inner), key=lambda s: s[0] * s[1])

    def summary(self) -> str:
        return f"CRNN Layer: {fmt_shape(self.in_shape)}   ->  {fmt_shape(self.out_shape)}"


# -- gru -------------------------------------------------------------------------------------------


@register
class GRULayer(_Recurrent):
    kind = "gru"
    ALEXEYAB_ORDER = ("uz", "ur", "uh", "wz", "wr", "wh")     # its input_* layers first

    def __init__(self, index: int, in_shape, outputs: int, steps: int, batch_normalize: bool = False,
                 tanh: bool = False, dtype=np.float32):
        super().__init__(index, in_shape, (outputs,), steps, dtype)
        self.tanh = tanh
        # darknet: the candidate activation is LOGISTIC unless tanh=1 (pjreddie's default)
        self.cand_act = act.TANH if tanh else act.LOGISTIC
        n_in = numel(in_shape)
        def mk(n_from: int) -> ConnectedLayer:
            return _connected(index, n_from, outputs, batch_normalize, "linear", dtype)

        self.wz, self.wr, self.wh = self._add("wz", mk(outputs)), self._add("wr", mk(outputs)), \
            self._add("wh", mk(outputs))
        self.uz, self.ur, self.uh = self._add("uz", mk(n_in)), self._add("ur", mk(n_in)), \
            self._add("uh", mk(n_in))
        self.z = self.r = self.fs = self.hc = self.h0 = self.h_in = self.dh0 = self.dfs = np.zeros((0,), self.dtype)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> GRULayer:
        outputs = _positive(sec, "output")
        bn = sec.get_bool("batch_normalize", False)
        tanh = sec.get_bool("tanh", False)
        return cls(sec.index, in_shape, outputs, ctx.net.time_steps, bn, tanh, ctx.dtype)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        Layer.allocate(self, batch)
        n = self.outputs
        self.z, self.r, self.fs, self.hc = (np.zeros((batch, n), self.dtype) for _ in range(4))
        self.h0 = np.zeros((self.seq_batch, n), self.dtype)
        self.h_in = np.zeros((self.seq_batch, n), self.dtype)   # the state this forward started from
        self.dh0 = self.dfs = np.zeros((0,), self.dtype)     # training-only: allocate_training

    def allocate_training(self) -> None:
        super().allocate_training()
        Layer.allocate_training(self)
        shape = (self.seq_batch, self.outputs)
        self.dh0 = self.training_buffer(self.dh0, shape)
        self.dfs = self.training_buffer(self.dfs, shape)

    def _initial_state(self):
        return [self.h0]

    def extra_buffers(self):
        return super().extra_buffers() + [self.z, self.r, self.fs, self.hc, self.h0, self.h_in, self.dh0,
                                          self.dfs]

    def _prev(self, t: int) -> np.ndarray:
        return self.h_in if t == 0 else self.output[self._rows(t - 1)]

    def forward(self, s: State) -> None:
        x = s.input.reshape(self.batch, self.inputs)
        if not self.carry_state:
            self.h0.fill(0)
        self.h_in[...] = self.h0         # kept for backward: with carry_state h0 becomes the last step's
        self._forward_inputs([self.uz, self.ur, self.uh], x, s.train)
        for t in range(self.steps):
            rows, h = self._rows(t), self._prev(t)
            self._forward(self.wz, h, rows.start, rows.stop, t, s.train)
            self._forward(self.wr, h, rows.start, rows.stop, t, s.train)
            gru_gates(self.z[rows], self.r[rows], self.fs[rows], self.uz.output[rows],
                      self.wz.output[rows], self.ur.output[rows], self.wr.output[rows], h)
            self._forward(self.wh, self.fs[rows], rows.start, rows.stop, t, s.train)
            gru_output(self.output[rows], self.hc[rows], self.uh.output[rows], self.wh.output[rows],
                       self.z[rows], h, self.cand_act)
        if self.carry_state:
            self.h0[...] = self.output[self._rows(self.steps - 1)]

    def backward(self, s: State) -> None:
        x = s.input.reshape(self.batch, self.inputs)
        dx = s.delta.reshape(x.shape) if s.delta is not None else None
        self.dh0.fill(0)
        for t in range(self.steps - 1, -1, -1):
            rows, h = self._rows(t), self._prev(t)
            dh_prev = self.dh0 if t == 0 else self.delta[self._rows(t - 1)]
            gru_backward_out(self.uz.delta[rows], self.uh.delta[rows], dh_prev, self.delta[rows], h,
                             self.hc[rows], self.z[rows], self.cand_act)
            self.wz.delta[rows] = self.uz.delta[rows]
            self.wh.delta[rows] = self.uh.delta[rows]
            self.dfs.fill(0)
            self._backward(self.wh, self.fs[rows], self.dfs, rows.start, rows.stop, t)
            gru_backward_reset(self.ur.delta[rows], dh_prev, self.dfs, h, self.r[rows])
            self.wr.delta[rows] = self.ur.delta[rows]
            dprev = dh_prev if t > 0 else None
            self._backward(self.wr, h, dprev, rows.start, rows.stop, t)
            self._backward(self.wz, h, dprev, rows.start, rows.stop, t)
            self._backward_inputs([self.uz, self.ur, self.uh], x, dx, t)
        self._backward_inputs([self.uz, self.ur, self.uh], x, dx, None)

    def summary(self) -> str:
        return f"GRU Layer: {self.inputs} inputs, {self.outputs} outputs"


# -- lstm ------------------------------------------------------------------------------------------


@register
class LSTMLayer(_Recurrent):
    kind = "lstm"
    ALEXEYAB_ORDER = ("wf", "wi", "wg", "wo", "uf", "ui", "ug", "uo")

    def __init__(self, index: int, in_shape, outputs: int, steps: int, batch_normalize: bool = False,
                 dtype=np.float32):
        super().__init__(index, in_shape, (outputs,), steps, dtype)
        n_in = numel(in_shape)
        def mk(n_from: int) -> ConnectedLayer:
            return _connected(index, n_from, outputs, batch_normalize, "linear", dtype)

        self.wi, self.wf, self.wo, self.wg = (self._add(k, mk(outputs)) for k in ("wi", "wf", "wo", "wg"))
        self.ui, self.uf, self.uo, self.ug = (self._add(k, mk(n_in)) for k in ("ui", "uf", "uo", "ug"))
        z = np.zeros((0,), self.dtype)
        self.f = self.i = self.g = self.o = self.c = self.h0 = self.c0 = self.h_in = self.c_in = self.dc = z

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> LSTMLayer:
        outputs = _positive(sec, "output")
        bn = sec.get_bool("batch_normalize", False)
        return cls(sec.index, in_shape, outputs, ctx.net.time_steps, bn, ctx.dtype)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        Layer.allocate(self, batch)
        n = self.outputs
        self.f, self.i, self.g, self.o, self.c = (np.zeros((batch, n), self.dtype) for _ in range(5))
        self.h0, self.c0 = (np.zeros((self.seq_batch, n), self.dtype) for _ in range(2))
        self.h_in, self.c_in = (np.zeros((self.seq_batch, n), self.dtype) for _ in range(2))  # a forward's start
        self.dc = np.zeros((0,), self.dtype)                 # training-only: allocate_training

    def allocate_training(self) -> None:
        super().allocate_training()
        Layer.allocate_training(self)
        self.dc = self.training_buffer(self.dc, (self.seq_batch, self.outputs))

    def _initial_state(self):
        return [self.h0, self.c0]

    def extra_buffers(self):
        return super().extra_buffers() + [self.f, self.i, self.g, self.o, self.c, self.h0, self.c0,
                                          self.h_in, self.c_in, self.dc]

    def _prev(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        if t == 0:
            return self.h_in, self.c_in
        rows = self._rows(t - 1)
        return self.output[rows], self.c[rows]

    def forward(self, s: State) -> None:
        x = s.input.reshape(self.batch, self.inputs)
        if not self.carry_state:
            self.h0.fill(0)
            self.c0.fill(0)
        self.h_in[...] = self.h0         # kept for backward: with carry_state h0/c0 become the last step's
        self.c_in[...] = self.c0
        self._forward_inputs([self.ui, self.uf, self.uo, self.ug], x, s.train)
        for t in range(self.steps):
            rows = self._rows(t)
            h, c = self._prev(t)
            for w in (self.wi, self.wf, self.wo, self.wg):
                self._forward(w, h, rows.start, rows.stop, t, s.train)
            g = [_rows2d(inner.output[rows]) for inner in (self.wf, self.uf, self.wi, self.ui, self.wg,
                                                          self.ug, self.wo, self.uo)]
            lstm_step(self.f[rows], self.i[rows], self.g[rows], self.o[rows], self.c[rows],
                      _rows2d(self.output[rows]), *g, c)
        if self.carry_state:
            last = self._rows(self.steps - 1)
            self.h0[...] = self.output[last]
            self.c0[...] = self.c[last]

    def backward(self, s: State) -> None:
        x = s.input.reshape(self.batch, self.inputs)
        dx = s.delta.reshape(x.shape) if s.delta is not None else None
        self.dc.fill(0)
        for t in range(self.steps - 1, -1, -1):
            rows = self._rows(t)
            h, c = self._prev(t)
            lstm_backward_step(_rows2d(self.uf.delta[rows]), _rows2d(self.ui.delta[rows]),
                               _rows2d(self.ug.delta[rows]), _rows2d(self.uo.delta[rows]), self.dc,
                               _rows2d(self.delta[rows]), self.f[rows], self.i[rows], self.g[rows],
                               self.o[rows], self.c[rows], c)
            dprev = self.delta[self._rows(t - 1)] if t > 0 else None
            for w, u in ((self.wi, self.ui), (self.wf, self.uf), (self.wo, self.uo), (self.wg, self.ug)):
                w.delta[rows] = u.delta[rows]
                self._backward(w, h, dprev, rows.start, rows.stop, t)
            self._backward_inputs([self.ui, self.uf, self.uo, self.ug], x, dx, t)
        self._backward_inputs([self.ui, self.uf, self.uo, self.ug], x, dx, None)

    def summary(self) -> str:
        return f"LSTM Layer: {self.inputs} inputs, {self.outputs} outputs"


def _rows2d(a: np.ndarray) -> np.ndarray:
    """(rows, ...) as (rows, values): conv inner layers (conv_lstm) have image-shaped rows."""
    return a.reshape(a.shape[0], -1)


def _positive(sec, key: str, default: int = 1) -> int:
    value = sec.get_int(key, default)
    if value < 1:
        raise sec.error(f"must be >= 1 (got {value})", key)
    return value
