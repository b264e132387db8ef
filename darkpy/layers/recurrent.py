"""Recurrent layers `[rnn]`, `[gru]`, `[lstm]`, `[crnn]` (spec §2.5), trained by back-propagation
through time: what they share, and `[rnn]` and `[crnn]`; `[gru]` and `[lstm]` with their gate
kernels are in layers/gated.py.

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

from ..errors import StateError
from ..kernels import activations as act
from .base import Layer, State, fmt_shape, is_image, numel, register
from .connected import ConnectedLayer
from .convolutional import ConvolutionalLayer, conv_out_size

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


def _rows2d(a: np.ndarray) -> np.ndarray:
    """(rows, ...) as (rows, values): conv inner layers (conv_lstm) have image-shaped rows."""
    return a.reshape(a.shape[0], -1)


def _positive(sec, key: str, default: int = 1) -> int:
    value = sec.get_int(key, default)
    if value < 1:
        raise sec.error(f"must be >= 1 (got {value})", key)
    return value
