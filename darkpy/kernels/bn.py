"""Fused bias / batch-norm / activation passes shared by conv, connected and [batchnorm] (spec §5).

Every kernel works on a layer's raw product viewed as `(batch, channels, spatial)` (spatial = out_h·out_w,
1 for connected) and does in ONE pass over memory what Darknet does in four or five (normalise, scale,
add bias, activate; or activation gradient, bias/scale gradients, BN backward). Parallel loops run over
channels when a channel's statistics are reduced, else over (item, channel) rows. The row helpers
pick the activation once per row, so the common ones (linear, leaky, relu, logistic) run as tight
loops the compiler vectorises; the others go through the generic per-element `_act`/`_grad`.

Batch norm, darkpy semantics (the GPU/cuDNN-trained semantics, DESIGN §5):
    x̂ = (x − μ)/sqrt(σ² + 1e-5),  σ² unbiased (÷(N−1)),  N = batch·spatial,
    rolling_mean = .99·rolling_mean + .01·μ,  rolling_variance likewise;
inference uses the rolling statistics. The backward pass is the exact gradient of that forward
(checked by central differences), so its variance term divides by N−1.

`darknet_cpu=True` reproduces pjreddie's CPU path bit for bit where it differs, for comparing with the
reference dumps: the forward divides by `sqrt(σ²) + 1e-6` (epsilon outside the root) and the backward
uses Darknet's formula, `sqrt(σ² + 1e-5)` with a variance term divided by N (not the exact gradient of
its own forward). # darknet: both kept only behind this flag.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import prange

from . import PARALLEL_MIN, jit, njit, pjit, vjit
from .borrow import borrowed
from .activations import (
    GELU,
    GELU_F32,
    GELU_TANH,
    HARD_MISH,
    LEAKY,
    LINEAR,
    LOGISTIC,
    MISH,
    RELU,
    SWISH,
    _act,
    _grad,
    gelu_f32,
    gelu_f32_and_grad,
    gelu_f32_grad,
)

EPS = 1e-5              # inside the square root (darkpy, cuDNN, Darknet GPU, AlexeyAB)
DARKNET_CPU_EPS = 1e-6  # outside the square root (pjreddie CPU forward)
MOMENTUM = 0.01         # rolling = (1 − MOMENTUM)·rolling + MOMENTUM·batch statistic


@jit
def needs_input(a):
    """The activations whose gradient needs the pre-activation (as activations.needs_input)."""
    return a == SWISH or a == MISH or a == HARD_MISH or a == GELU or a == GELU_TANH or a == GELU_F32


@vjit
def affine_act_row(row, k, off, a):
    """row: (S,) in place -> act(row·k + off)."""
    n = row.shape[0]
    if a == LINEAR:
        for s in range(n):
            row[s] = row[s] * k + off
    elif a == LEAKY:
        for s in range(n):
            z = row[s] * k + off
            row[s] = z if z > 0 else 0.1 * z
    elif a == RELU:
        for s in range(n):
            z = row[s] * k + off
            row[s] = z if z > 0 else 0.0
    elif a == LOGISTIC:
        for s in range(n):
            row[s] = 1.0 / (1.0 + math.exp(-(row[s] * k + off)))
    elif a == GELU_F32:
        for s in range(n):
            row[s] = gelu_f32(row[s] * k + off)
    else:
        for s in range(n):
            row[s] = _act(row[s] * k + off, a)


#: The row reductions (sums, dot products) may be reassociated: that is what lets the compiler
#: vectorise them (measured 7-12x on a row of 4096 values; a channel's sum stays on one thread, so
#: the result is deterministic). Not inlined into their callers, which would drop the flag.
#: IEEE division (as `vjit`) too, so the activation derivatives inside them vectorise.
_reduce_jit = functools.partial(njit, cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})


@_reduce_jit
def _row_sum(r):
    """Σ r, accumulated in float64."""
    acc = 0.0
    for s in range(r.shape[0]):
        acc += r[s]
    return acc


@_reduce_jit
def _row_sqdev(r, m):
    """Σ (r − m)², accumulated in float64."""
    acc = 0.0
    for s in range(r.shape[0]):
        t = r[s] - m
        acc += t * t
    return acc


@_reduce_jit
def _grad_channel(d, y, pre, c, a):
    """Channel c of d: (B, C, S) in place *= act'; y: (B, C, S) activated output; pre: (B, C, S)
    pre-activation (read only for the activations that need it). Returns Σ d[:, c] after the
    multiplication. One call per channel, its items' rows in the loop: a call per row cost more
    than the row on small maps. The batch-norm backward per layer within the training step (2
    threads, 2-core AVX-512 Xeon, family 6 model 167), against a call per row: digits' at b32 82,
    73, 51 -> 76, 48, 30 µs, shapes-tiny's 8x8 layers 459, 457, 246, 177 -> 287, 332, 216, 120 µs
    and its first 2.4 -> 1.7 ms, cifar's at b128 0.93x the time."""
    nb, ns = d.shape[0], d.shape[2]
    acc = 0.0
    if a == LINEAR:
        for b in range(nb):
            for s in range(ns):
                acc += d[b, c, s]
    elif a == LEAKY:
        for b in range(nb):
            for s in range(ns):
                v = d[b, c, s] if y[b, c, s] > 0 else 0.1 * d[b, c, s]
                d[b, c, s] = v
                acc += v
    elif a == RELU:
        for b in range(nb):
            for s in range(ns):
                v = d[b, c, s] if y[b, c, s] > 0 else 0.0
                d[b, c, s] = v
                acc += v
    elif a == LOGISTIC:
        for b in range(nb):
            for s in range(ns):
                v = d[b, c, s] * y[b, c, s] * (1 - y[b, c, s])
                d[b, c, s] = v
                acc += v
    elif a == GELU_F32:
        for b in range(nb):
            for s in range(ns):
                v = d[b, c, s] * gelu_f32_grad(pre[b, c, s])
                d[b, c, s] = v
                acc += v
    else:
        for b in range(nb):
            for s in range(ns):
                v = d[b, c, s] * _grad(y[b, c, s], pre[b, c, s], a)
                d[b, c, s] = v
                acc += v
    return acc


@_reduce_jit
def _channel_dot(d, x, c):
    """Σ d[:, c] · x[:, c] over the items and positions of (B, C, S) arrays, in float64."""
    acc = 0.0
    for b in range(d.shape[0]):
        for s in range(d.shape[2]):
            acc += d[b, c, s] * x[b, c, s]
    return acc


@jit(inline="always")
def _bias_act_rows(y, pre, biases, act, keep_pre, bc):
    y, pre = borrowed(y), borrowed(pre)
    nc = y.shape[1]
    b = bc // nc
    c = bc % nc
    if keep_pre:
        p = pre[b, c]
        r = y[b, c]
        for s in range(r.shape[0]):
            p[s] = r[s] + biases[c]
    affine_act_row(y[b, c], 1.0, biases[c], act)


@pjit
def bias_act_forward(y, pre, biases, act, keep_pre):
    """y: (B, C, S) raw product, in place -> act(y + biases[c]); pre: (B, C, S) receives y + biases
    when keep_pre (activations whose gradient needs the input), else unused; biases: (C,).
    Parallel over (item, channel) rows; serial below PARALLEL_MIN values (as every kernel here)."""
    nb, nc = y.shape[:2]
    if y.size < PARALLEL_MIN:
        for bc in range(nb * nc):
            _bias_act_rows(y, pre, biases, act, keep_pre, bc)
    else:
        for bc in prange(nb * nc):
            _bias_act_rows(y, pre, biases, act, keep_pre, bc)


@jit(inline="always")
def _bias_act_grad_channel(delta, y, pre, bias_grad, act, c):
    delta, y, pre = borrowed(delta), borrowed(y), borrowed(pre)
    bias_grad[c] += _grad_channel(delta, y, pre, c, act)


@pjit
def bias_act_backward(delta, y, pre, bias_grad, act):
    """delta: (B, C, S) gradient w.r.t. the activated output, in place -> w.r.t. the raw product;
    y: (B, C, S) activated output; pre: (B, C, S) pre-activation (read only when the activation needs
    it, else any (B, C, S) array); bias_grad: (C,) += Σ delta over items and positions."""
    nc = delta.shape[1]
    if delta.size < PARALLEL_MIN:
        for c in range(nc):
            _bias_act_grad_channel(delta, y, pre, bias_grad, act, c)
    else:
        for c in prange(nc):
            _bias_act_grad_channel(delta, y, pre, bias_grad, act, c)


# -- (rows, units) layout: connected layers and 1×1 maps (S = 1) ---------------------------------
# With S = 1 the (B, C, S) kernels above make one call per value and cannot vectorise; these run
# along each row of a (B, C) array instead, with the same formulas in the same precision (so the
# same bits), and sum the bias gradient per unit in float64 (by chunks of rows: see
# `bias_act_backward_rows`; the (B, C, S) kernel sums rows 0..B−1 in one run).
# One difference, for the float32 exact gelu (GELU_F32) only: `pre` receives the derivative gelu'
# at y + biases, not y + biases itself. Φ and φ cost ~40 float64 operations per value; forward
# computes them anyway, and backward then needs one multiply instead of a second evaluation (a
# Transformer's 128→512 gelu layer: forward + backward epilogues 2.1 → 0.9 ms at b16). The pair is
# only ever used together (`forward_bias_bn_act` / `backward_bias_bn_act`, S = 1, no BN).

@vjit
def _bias_act_vec(y, pre, biases, a, keep_pre):
    """y: (C,) one row in place -> act(y + biases); pre: (C,) gets y + biases when keep_pre (for
    GELU_F32: gelu'(y + biases), see above)."""
    n = y.shape[0]
    if keep_pre and a == GELU_F32:
        for j in range(n):
            g, dg = gelu_f32_and_grad(y[j] * 1.0 + biases[j])
            y[j] = g
            pre[j] = dg
        return
    if keep_pre:
        for j in range(n):
            pre[j] = y[j] + biases[j]
    if a == LINEAR:
        for j in range(n):
            y[j] = y[j] * 1.0 + biases[j]
    elif a == LEAKY:
        for j in range(n):
            z = y[j] * 1.0 + biases[j]
            y[j] = z if z > 0 else 0.1 * z
    elif a == RELU:
        for j in range(n):
            z = y[j] * 1.0 + biases[j]
            y[j] = z if z > 0 else 0.0
    elif a == LOGISTIC:
        for j in range(n):
            y[j] = 1.0 / (1.0 + math.exp(-(y[j] * 1.0 + biases[j])))
    elif a == GELU_F32:
        for j in range(n):
            y[j] = gelu_f32(y[j] * 1.0 + biases[j])
    else:
        for j in range(n):
            y[j] = _act(y[j] * 1.0 + biases[j], a)


@pjit
def bias_act_forward_rows(y, pre, biases, act, keep_pre):
    """y: (B, C) raw product, in place -> act(y + biases); pre: (B, C) gets y + biases when keep_pre
    (for GELU_F32: gelu' there; else any (B, C) array, untouched); biases: (C,). As
    `bias_act_forward` with S = 1."""
    nb = y.shape[0]
    if y.size < PARALLEL_MIN:
        for b in range(nb):
            _bias_act_vec(y[b], pre[b], biases, act, keep_pre)
    else:
        for b in prange(nb):
            _bias_act_vec(y[b], pre[b], biases, act, keep_pre)


@vjit
def _grad_sum_row(d, y, pre, acc, a):
    """One row (or a span of it), all (c,): d *= act' (from y, or pre for the activations that need
    it); acc: float64 += the products, unrounded (as `_grad_channel` sums them)."""
    n = d.shape[0]
    if a == LINEAR:
        for j in range(n):
            acc[j] += d[j]
    elif a == LEAKY:
        for j in range(n):
            v = d[j] if y[j] > 0 else 0.1 * d[j]
            d[j] = v
            acc[j] += v
    elif a == RELU:
        for j in range(n):
            v = d[j] if y[j] > 0 else 0.0
            d[j] = v
            acc[j] += v
    elif a == LOGISTIC:
        for j in range(n):
            v = d[j] * y[j] * (1 - y[j])
            d[j] = v
            acc[j] += v
    elif a == GELU_F32:                      # pre holds gelu' already (`_bias_act_vec`)
        for j in range(n):
            v = (1.0 * d[j]) * pre[j]         # exact in float64, rounded once below
            d[j] = v
            acc[j] += v
    else:
        for j in range(n):
            v = d[j] * _grad(y[j], pre[j], a)
            d[j] = v
            acc[j] += v


#: Rows per partial bias-gradient sum of `bias_act_backward_rows`.
GRAD_CHUNK = 32


@pjit
def bias_act_backward_rows(delta, y, pre, bias_grad, act):
    """delta: (B, C) gradient w.r.t. the activated output, in place -> w.r.t. the raw product;
    y: (B, C) activated output; pre: (B, C) pre-activation (for GELU_F32 the derivative that
    `bias_act_forward_rows` left there; any (B, C) array when the activation needs neither);
    bias_grad: (C,) += Σ over rows. Chunks of GRAD_CHUNK rows in parallel, each summing its rows
    in order (float64), then the chunks' sums in chunk order: the same bits at any thread count
    (rows in one pass, instead of one pass per span of units over all rows: 1024 x 128 rows
    80 -> ~25 µs on 2 threads)."""
    nb, nc = delta.shape
    chunks = (nb + GRAD_CHUNK - 1) // GRAD_CHUNK
    part = np.empty((chunks, nc))
    if delta.size < PARALLEL_MIN:
        for c in range(chunks):
            _grad_sum_chunk(delta, y, pre, part[c], act, c * GRAD_CHUNK, min(nb, c * GRAD_CHUNK + GRAD_CHUNK))
    else:
        for c in prange(chunks):
            _grad_sum_chunk(delta, y, pre, part[c], act, c * GRAD_CHUNK, min(nb, c * GRAD_CHUNK + GRAD_CHUNK))
    for j in range(nc):
        acc = 0.0
        for c in range(chunks):
            acc += part[c, j]
        bias_grad[j] += acc


@vjit
def _grad_sum_chunk(delta, y, pre, acc, a, lo, hi):
    """Rows lo..hi-1 of `bias_act_backward_rows`: acc (C,) := their sum after the activation."""
    delta, y, pre = borrowed(delta), borrowed(y), borrowed(pre)
    for j in range(acc.shape[0]):
        acc[j] = 0.0
    for b in range(lo, hi):
        _grad_sum_row(delta[b], y[b], pre[b], acc, a)


@jit(inline="always")
def _bn_train_channel(y, xnorm, mean, var, rolling_mean, rolling_var, scales, biases, act,
                      darknet_cpu, c):
    nb, _, ns = y.shape
    y, xnorm = borrowed(y), borrowed(xnorm)
    n = nb * ns
    acc = 0.0
    for b in range(nb):
        acc += _row_sum(y[b, c])
    m = acc / n
    acc = 0.0
    for b in range(nb):
        acc += _row_sqdev(y[b, c], m)
    v = acc / max(n - 1, 1)
    mean[c] = m
    var[c] = v
    rolling_mean[c] = (1 - MOMENTUM) * rolling_mean[c] + MOMENTUM * m
    rolling_var[c] = (1 - MOMENTUM) * rolling_var[c] + MOMENTUM * v
    if darknet_cpu:
        inv = 1.0 / (math.sqrt(v) + DARKNET_CPU_EPS)
    else:
        inv = 1.0 / math.sqrt(v + EPS)
    for b in range(nb):
        r = y[b, c]
        xn = xnorm[b, c]
        for s in range(ns):
            xn[s] = (r[s] - m) * inv
            r[s] = xn[s]
        affine_act_row(r, scales[c], biases[c], act)


@pjit
def bn_act_forward_train(y, xnorm, mean, var, rolling_mean, rolling_var, scales, biases, act,
                         darknet_cpu):
    """Training-mode BN + activation, in place on y: (B, C, S). xnorm: (B, C, S) receives x̂;
    mean, var: (C,) receive the batch statistics; rolling_mean, rolling_var: (C,) updated;
    scales, biases: (C,) γ and β. Parallel over channels."""
    nc = y.shape[1]
    if y.size < PARALLEL_MIN:
        for c in range(nc):
            _bn_train_channel(y, xnorm, mean, var, rolling_mean, rolling_var, scales, biases, act,
                              darknet_cpu, c)
    else:
        for c in prange(nc):
            _bn_train_channel(y, xnorm, mean, var, rolling_mean, rolling_var, scales, biases, act,
                              darknet_cpu, c)


@jit(inline="always")
def bn_infer_affine(rolling_mean, rolling_var, scales, biases, darknet_cpu, c):
    """(k, off): inference BN of channel c (rolling statistics) as the affine map x·k + off."""
    if darknet_cpu:
        inv = 1.0 / (math.sqrt(rolling_var[c]) + DARKNET_CPU_EPS)
    else:
        inv = 1.0 / math.sqrt(rolling_var[c] + EPS)
    k = scales[c] * inv
    return k, biases[c] - rolling_mean[c] * k


@jit(inline="always")
def _bn_infer_row(y, rolling_mean, rolling_var, scales, biases, act, darknet_cpu, bc):
    y = borrowed(y)
    nc = y.shape[1]
    c = bc % nc
    k, off = bn_infer_affine(rolling_mean, rolling_var, scales, biases, darknet_cpu, c)
    affine_act_row(y[bc // nc, c], k, off, act)


@jit
def infer_affine(k, off, rolling_mean, rolling_var, scales, biases, darknet_cpu):
    """k, off: (C,) float64 outputs, inference BN of every channel as x·k + off (the values
    `bn_act_forward_infer` uses), for kernels that apply it to their own output as they write it
    (`affine_act_row`); the rest as there."""
    for c in range(k.shape[0]):
        k[c], off[c] = bn_infer_affine(rolling_mean, rolling_var, scales, biases, darknet_cpu, c)


@pjit
def bn_act_forward_infer(y, rolling_mean, rolling_var, scales, biases, act, darknet_cpu):
    """Inference BN (rolling statistics) + activation, in place on y: (B, C, S); the rest (C,).
    Parallel over (item, channel) rows."""
    nb, nc = y.shape[:2]
    if y.size < PARALLEL_MIN:
        for bc in range(nb * nc):
            _bn_infer_row(y, rolling_mean, rolling_var, scales, biases, act, darknet_cpu, bc)
    else:
        for bc in prange(nb * nc):
            _bn_infer_row(y, rolling_mean, rolling_var, scales, biases, act, darknet_cpu, bc)


@jit(inline="always")
def _bn_grad_channel(delta, y, xnorm, var, scales, biases, bias_grad, scale_grad, act, pre,
                     darknet_cpu, c):
    nb, _, ns = delta.shape
    delta, y, xnorm, pre = borrowed(delta), borrowed(y), borrowed(xnorm), borrowed(pre)
    n = nb * ns
    keep_pre = needs_input(act)
    g = scales[c]
    beta = biases[c]
    if keep_pre:
        for b in range(nb):
            for s in range(ns):
                pre[b, c, s] = g * xnorm[b, c, s] + beta
    sd = _grad_channel(delta, y, pre, c, act)      # Σ δ
    sdx = _channel_dot(delta, xnorm, c)            # Σ δ·x̂
    bias_grad[c] += sd
    scale_grad[c] += sdx
    v = var[c]
    sigma = math.sqrt(v + EPS)
    if darknet_cpu:
        # x − μ = x̂·(sqrt(σ²) + 1e-6); variance term ÷N as Darknet's backward does.
        fwd = math.sqrt(v) + DARKNET_CPU_EPS
        nv = n
    else:
        fwd = sigma
        nv = max(n - 1, 1)
    # with dx̂ = γ·δ and r = x − μ: dx = dx̂/σ − Σdx̂/(N·σ) − r·Σ(dx̂·r)/(σ³·nv)
    k_d = g / sigma
    k_mean = g * sd / (n * sigma)
    k_var = g * sdx * fwd * fwd / (sigma * sigma * sigma * nv)
    for b in range(nb):
        for s in range(ns):
            delta[b, c, s] = k_d * delta[b, c, s] - k_mean - xnorm[b, c, s] * k_var


@pjit
def bn_act_backward(delta, y, xnorm, var, scales, biases, bias_grad, scale_grad, act, pre,
                    darknet_cpu):
    """delta: (B, C, S) gradient w.r.t. the activated output, in place -> w.r.t. the raw product x
    (before normalisation); y, xnorm: (B, C, S) output and x̂ of the last training forward; var: (C,)
    that forward's batch variance; scales, biases: (C,); bias_grad, scale_grad: (C,) accumulated;
    pre: (B, C, S) scratch that receives γ·x̂ + β, the pre-activation, for the activations whose
    gradient needs it (else any (B, C, S) array, untouched). Parallel over channels."""
    nc = delta.shape[1]
    if delta.size < PARALLEL_MIN:
        for c in range(nc):
            _bn_grad_channel(delta, y, xnorm, var, scales, biases, bias_grad, scale_grad, act, pre,
                             darknet_cpu, c)
    else:
        for c in prange(nc):
            _bn_grad_channel(delta, y, xnorm, var, scales, biases, bias_grad, scale_grad, act, pre,
                             darknet_cpu, c)
