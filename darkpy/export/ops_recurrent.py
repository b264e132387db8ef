"""Recurrent layers unrolled over `time_steps` (layers/recurrent.py is the reference).

Rows are time-major (step t of every sequence is rows [t·S, (t+1)·S)), so the input is viewed as
(T, S, ...) with S = -1: the export runs any number of sequences per pass. The state starts from zero
at every pass (darkpy's default; `carry_state` is refused). Inner connected/convolutional layers are
converted by their own converters (ops_conv.py); the input-side products run once over all rows.
"""
from __future__ import annotations

from .convert import Ctx, converts, refuse
from .ops_conv import activation


def _check(layer):
    if layer.carry_state:
        raise refuse(layer, "carry_state (a state kept between passes) cannot be exported")


def _all_rows(ctx: Ctx, layer, inner, x: str, in_shape) -> str:
    """The inner layer over every row, viewed as (T, S, *out)."""
    y = ctx.inner(inner.layer, (x, tuple(in_shape)))
    return ctx.g.reshape(y, (layer.steps, -1, *inner.layer.out_shape))


def _step(ctx: Ctx, t3: str, t: int) -> str:
    """Step t of a (T, S, ...) tensor: (S, ...)."""
    return ctx.g.op("Gather", [t3, ctx.g.ints(t)], "step", axis=0)


def _zeros_like(g, t: str) -> str:
    from onnx import helper
    zero = helper.make_tensor("zero", g.elem_type, [1], [0.0])
    return g.op("ConstantOfShape", [g.op("Shape", [t])], "zeros", value=zero)


def _stack_steps(ctx: Ctx, outs: list[str]) -> str:
    return outs[0] if len(outs) == 1 else ctx.g.op("Concat", outs, "steps", axis=0)


def _sig(g, x):
    return g.op("Sigmoid", [x])


@converts("rnn", "crnn")
def simple_recurrent(ctx: Ctx, layer):
    _check(layer)
    g = ctx.g
    in_shape = layer.input_layer.layer.in_shape
    ins = _all_rows(ctx, layer, layer.input_layer, ctx.x(layer, in_shape), in_shape)
    state_shape = tuple(layer.state_shape)
    state = _zeros_like(g, _step(ctx, ins, 0))
    outs = []
    for t in range(layer.steps):
        self_out = ctx.inner(layer.self_layer.layer, (state, state_shape))
        self_out = g.reshape(self_out, (-1, *state_shape))
        new = g.add(_step(ctx, ins, t), self_out)
        if layer.shortcut:
            new = g.add(new, state)
        state = new
        y = ctx.inner(layer.output_layer.layer, (state, state_shape))
        outs.append(g.reshape(y, (-1, *layer.out_shape)))
    return _stack_steps(ctx, outs), layer.out_shape


@converts("gru")
def gru(ctx: Ctx, layer):
    _check(layer)
    g = ctx.g
    n = layer.outputs
    x = ctx.x(layer, (layer.inputs,))
    uz, ur, uh = (_all_rows(ctx, layer, i, x, (layer.inputs,)) for i in (layer.uz, layer.ur, layer.uh))
    cand = "tanh" if layer.tanh else "logistic"        # darknet: logistic unless tanh=1
    h = _zeros_like(g, _step(ctx, uz, 0))
    outs = []
    for t in range(layer.steps):
        wz = ctx.inner(layer.wz.layer, (h, (n,)))
        wr = ctx.inner(layer.wr.layer, (h, (n,)))
        z = _sig(g, g.add(_step(ctx, uz, t), wz))
        r = _sig(g, g.add(_step(ctx, ur, t), wr))
        wh = ctx.inner(layer.wh.layer, (g.mul(r, h), (n,)))
        hc = activation(g, g.add(_step(ctx, uh, t), wh), cand, layer)
        # out = z·h + (1 − z)·hc
        h = g.add(g.mul(z, h), g.mul(g.op("Sub", [g.const(1.0), z]), hc), f"l{layer.index}_gru")
        outs.append(h)
    return _stack_steps(ctx, outs), layer.out_shape


@converts("lstm")
def lstm(ctx: Ctx, layer):
    _check(layer)
    g = ctx.g
    n = layer.outputs
    x = ctx.x(layer, (layer.inputs,))
    ui, uf, uo, ug = (_all_rows(ctx, layer, i, x, (layer.inputs,)) for i in (layer.ui, layer.uf, layer.uo, layer.ug))
    h = _zeros_like(g, _step(ctx, ui, 0))
    c = h
    outs = []
    for t in range(layer.steps):
        wi, wf, wo, wg = (ctx.inner(w.layer, (h, (n,))) for w in (layer.wi, layer.wf, layer.wo, layer.wg))
        f = _sig(g, g.add(wf, _step(ctx, uf, t)))
        i = _sig(g, g.add(wi, _step(ctx, ui, t)))
        gg = g.op("Tanh", [g.add(wg, _step(ctx, ug, t))])
        o = _sig(g, g.add(wo, _step(ctx, uo, t)))
        c = g.add(g.mul(f, c), g.mul(i, gg))
        h = g.mul(o, g.op("Tanh", [c]), f"l{layer.index}_lstm")
        outs.append(h)
    return _stack_steps(ctx, outs), layer.out_shape
