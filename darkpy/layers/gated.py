"""The gated recurrent layers `[gru]` and `[lstm]` (spec §2.5) and their gate kernels: built on
layers/recurrent.py's `_Recurrent` (inner `[connected]` layers bound to one step's rows,
time-major rows, back-propagation through time, `carry_state`); the recurrences and the
differences from Darknet are in that module's docstring.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ..kernels import activations as act
from ..kernels import PARALLEL_MIN, jit, pjit
from ..kernels.activations import LOGISTIC, TANH, _act, _grad
from .base import Layer, State, numel, register
from .connected import ConnectedLayer
from .recurrent import _connected, _positive, _Recurrent, _rows2d

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
