"""Fused bias / batch-norm / activation passes shared by conv, connected and [batchnorm] (spec §5).

Every kernel works on a layer's raw product viewed as `(batch, channels, spatial)` (spatial = out_h·out_w,
1 for connected) and does in ONE pass over memory what Darknet does in four or five (normalise, scale,
add bias, activate; or activation gradient, bias/scale gradients, BN backward). Parallel loops run over
channels when a channel's statistics are reduced, else over (item, channel) rows.

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

import math

from numba import prange

from . import pjit
from .activations import _act, _grad

EPS = 1e-5              # inside the square root (darkpy, cuDNN, Darknet GPU, AlexeyAB)
DARKNET_CPU_EPS = 1e-6  # outside the square root (pjreddie CPU forward)
MOMENTUM = 0.01         # rolling = (1 − MOMENTUM)·rolling + MOMENTUM·batch statistic


@pjit
def bias_act_forward(y, pre, biases, act, keep_pre):
    """y: (B, C, S) raw product, in place -> act(y + biases[c]); pre: (B, C, S) receives y + biases
    when keep_pre (activations whose gradient needs the input), else unused; biases: (C,)."""
    nb, nc, ns = y.shape
    for bc in prange(nb * nc):
        b = bc // nc
        c = bc % nc
        bias = biases[c]
        for s in range(ns):
            z = y[b, c, s] + bias
            if keep_pre:
                pre[b, c, s] = z
            y[b, c, s] = _act(z, act)


@pjit
def bias_act_backward(delta, y, pre, bias_grad, act):
    """delta: (B, C, S) gradient w.r.t. the activated output, in place -> w.r.t. the raw product;
    y: (B, C, S) activated output; pre: (B, C, S) pre-activation (read only when the activation needs
    it, else any (B, C, S) array); bias_grad: (C,) += Σ delta over items and positions."""
    nb, nc, ns = delta.shape
    for c in prange(nc):
        acc = 0.0
        for b in range(nb):
            for s in range(ns):
                d = delta[b, c, s] * _grad(y[b, c, s], pre[b, c, s], act)
                delta[b, c, s] = d
                acc += d
        bias_grad[c] += acc


@pjit
def bn_act_forward_train(y, xnorm, mean, var, rolling_mean, rolling_var, scales, biases, act,
                         darknet_cpu):
    """Training-mode BN + activation, in place on y: (B, C, S). xnorm: (B, C, S) receives x̂;
    mean, var: (C,) receive the batch statistics; rolling_mean, rolling_var: (C,) updated;
    scales, biases: (C,) γ and β."""
    nb, nc, ns = y.shape
    n = nb * ns
    for c in prange(nc):
        acc = 0.0
        for b in range(nb):
            for s in range(ns):
                acc += y[b, c, s]
        m = acc / n
        acc = 0.0
        for b in range(nb):
            for s in range(ns):
                t = y[b, c, s] - m
                acc += t * t
        v = acc / max(n - 1, 1)
        mean[c] = m
        var[c] = v
        rolling_mean[c] = (1 - MOMENTUM) * rolling_mean[c] + MOMENTUM * m
        rolling_var[c] = (1 - MOMENTUM) * rolling_var[c] + MOMENTUM * v
        if darknet_cpu:
            inv = 1.0 / (math.sqrt(v) + DARKNET_CPU_EPS)
        else:
            inv = 1.0 / math.sqrt(v + EPS)
        g = scales[c]
        beta = biases[c]
        for b in range(nb):
            for s in range(ns):
                xn = (y[b, c, s] - m) * inv
                xnorm[b, c, s] = xn
                y[b, c, s] = _act(g * xn + beta, act)


@pjit
def bn_act_forward_infer(y, rolling_mean, rolling_var, scales, biases, act, darknet_cpu):
    """Inference BN (rolling statistics) + activation, in place on y: (B, C, S); the rest (C,)."""
    nb, nc, ns = y.shape
    for bc in prange(nb * nc):
        b = bc // nc
        c = bc % nc
        if darknet_cpu:
            inv = 1.0 / (math.sqrt(rolling_var[c]) + DARKNET_CPU_EPS)
        else:
            inv = 1.0 / math.sqrt(rolling_var[c] + EPS)
        k = scales[c] * inv
        off = biases[c] - rolling_mean[c] * k
        for s in range(ns):
            y[b, c, s] = _act(y[b, c, s] * k + off, act)


@pjit
def bn_act_backward(delta, y, xnorm, var, scales, biases, bias_grad, scale_grad, act, darknet_cpu):
    """delta: (B, C, S) gradient w.r.t. the activated output, in place -> w.r.t. the raw product x
    (before normalisation); y, xnorm: (B, C, S) output and x̂ of the last training forward; var: (C,)
    that forward's batch variance; scales, biases: (C,); bias_grad, scale_grad: (C,) accumulated.
    The pre-activation γ·x̂ + β is recomputed, so no copy of it is kept."""
    nb, nc, ns = delta.shape
    n = nb * ns
    for c in prange(nc):
        g = scales[c]
        beta = biases[c]
        sd = 0.0   # Σ δ
        sdx = 0.0  # Σ δ·x̂
        for b in range(nb):
            for s in range(ns):
                xn = xnorm[b, c, s]
                d = delta[b, c, s] * _grad(y[b, c, s], g * xn + beta, act)
                delta[b, c, s] = d
                sd += d
                sdx += d * xn
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
        k_mean = g * sd / (n * sigma)
        k_var = g * sdx * fwd * fwd / (sigma * sigma * sigma * nv)
        for b in range(nb):
            for s in range(ns):
                delta[b, c, s] = g * delta[b, c, s] / sigma - k_mean - xnorm[b, c, s] * k_var
