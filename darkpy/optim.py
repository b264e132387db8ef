"""Darknet's learning-rate policies (spec §3) and update rules (spec §6.3).

SGD: with B = the full batch (batch·subdivisions, time_steps included) and η = rate·layer scale,
    grad -= decay·B·w   (weights only);   w += η/B · grad;   grad *= momentum
where `grad` is the accumulated negative gradient (Darknet's `*_updates`). Adam (`adam=1`): as
Darknet's GPU path (its CPU path ignores `adam`), with decay on every parameter and η not divided by B.

darkpy's own, for Transformers (`[net]` keys):
- `adamw=1`: torch.optim.AdamW on the mean gradient g = −grad/B: `w ← w − η·λ·w` (decoupled decay
  λ = `weight_decay`, default 0.01, on weights only: never biases, layer-norm gains or embedding
  tables), then Adam's step with `B1`, `B2`, `eps`, bias-corrected with the update count.
- `clip_norm=c`: before the update, if the global L2 norm of the mean gradient over every learning
  parameter exceeds c, all gradients are scaled by c/norm (torch's clip_grad_norm_); the norm is kept
  in `Network.grad_norm` and logged per iteration.
- `warmup=N`: the rate rises linearly, lr·(b+1)/N, for the first N updates (any policy);
  `policy=cosine` then decays it to `learning_rate_min` over the remaining updates up to max_batches.
"""
from __future__ import annotations

import math

import numpy as np

from numba import prange

from .kernels import PARALLEL_MIN, jit, pjit, vjit
from .kernels import vecmath as vm


def current_rate(cfg, batch_num: int, rng: np.random.Generator | None = None) -> float:
    """Learning rate for update number `batch_num` (Darknet's get_current_batch: seen/(batch·subdiv)).

    `cfg` is a NetConfig. Burn-in is checked first, for every policy, as in Darknet."""
    lr = cfg.learning_rate
    b = batch_num
    if cfg.burn_in and b < cfg.burn_in:
        return lr * (b / cfg.burn_in) ** cfg.power
    warmup = getattr(cfg, "warmup", 0)
    if warmup and b < warmup:
        return lr * (b + 1) / warmup
    policy = cfg.policy
    if policy == "cosine":
        span = max(cfg.max_batches - warmup, 1)
        u = min(max(b - warmup, 0) / span, 1.0)
        return cfg.learning_rate_min + 0.5 * (lr - cfg.learning_rate_min) * (1 + math.cos(math.pi * u))
    if policy == "constant":
        return lr
    if policy == "step":
        return lr * cfg.scale ** (b // max(cfg.step, 1))
    if policy == "steps":
        rate = lr
        for step, scale in zip(cfg.steps, cfg.scales):
            if step > b:
                break
            rate *= scale
        return rate
    if policy == "exp":
        return lr * cfg.gamma ** b
    if policy == "poly":
        if cfg.max_batches <= 0:
            return lr
        return lr * max(0.0, 1 - b / cfg.max_batches) ** cfg.power
    if policy == "random":
        u = (rng or np.random.default_rng()).random()
        return lr * u ** cfg.power
    if policy == "sigmoid":
        return lr / (1 + math.exp(cfg.gamma * (b - cfg.step)))
    if policy == "sgdr":
        cycle = cfg.sgdr_cycle or max(cfg.max_batches, 1)
        start = 0
        while b >= start + cycle:
            start += cycle
            cycle *= cfg.sgdr_mult
        return cfg.learning_rate_min + 0.5 * (lr - cfg.learning_rate_min) * (
            1 + math.cos(math.pi * (b - start) / cycle))
    raise ValueError(f"unknown policy {policy!r}")


@jit
def sgd_step(w, g, rate, batch, momentum, decay):
    """w, g: (n,). Darknet SGD with momentum; `decay` is 0 for biases and BN scales."""
    k = rate / batch
    for i in range(w.shape[0]):
        gi = g[i] - decay * batch * w[i]
        w[i] += k * gi
        g[i] = gi * momentum


@jit
def adam_step(w, g, m, v, rate, batch, b1, b2, eps, t, decay):
    """w, g, m, v: (n,). Darknet's Adam; g is cleared after use."""
    c1 = 1.0 - b1 ** t
    c2 = 1.0 - b2 ** t
    for i in range(w.shape[0]):
        d = g[i] - decay * batch * w[i]
        m[i] = b1 * m[i] + (1 - b1) * d
        v[i] = b2 * v[i] + (1 - b2) * d * d
        w[i] += rate * (m[i] / c1) / (math.sqrt(v[i] / c2) + eps)
        g[i] = 0


@vjit
def _adamw_span(w, g, m, v, c):
    """One span of `adamw_step`, all (n,); c: its constants in the arrays' dtype (`adamw_step`),
    so a float32 layer's update is float32 arithmetic: sixteen values a vector, and the square root
    and division, the loop's cost, in single precision (as torch.optim.AdamW; float64 layers and
    the gradient checks keep float64). m and v are read once and written once (reading back what
    the loop stored kept it from vectorising: 2x slower)."""
    ib, b1, b2, ic2, eps, shrink, step = c[0], c[1], c[2], c[3], c[4], c[5], c[6]
    one = c[7]
    for i in range(w.shape[0]):
        d = g[i] * ib
        mi = b1 * m[i] + (one - b1) * d
        vi = b2 * v[i] + (one - b2) * d * d
        m[i] = mi
        v[i] = vi
        w[i] = w[i] * shrink - step * mi / (math.sqrt(vi * ic2) + eps)
        g[i] = 0


@pjit(error_model="numpy")
def adamw_step(w, g, m, v, rate, batch, b1, b2, eps, t, decay):
    """w, g, m, v: (n,). torch's AdamW on the mean gradient −g/batch; `decay` is λ (0: none).
    Parallel over spans of 16k values from PARALLEL_MIN values."""
    c = np.empty(8, w.dtype)            # the constants, in w's dtype (`_adamw_span`)
    c[0] = -1.0 / batch
    c[1] = b1
    c[2] = b2
    c[3] = 1.0 / (1.0 - b2 ** t)
    c[4] = eps
    c[5] = 1.0 - rate * decay
    c[6] = rate / (1.0 - b1 ** t)
    c[7] = 1.0
    n = w.shape[0]
    if n < PARALLEL_MIN:
        _adamw_span(w, g, m, v, c)
    else:
        span = 1 << 14
        for k in prange((n + span - 1) // span):
            lo, hi = k * span, min(n, (k + 1) * span)
            _adamw_span(w[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], c)


#: Spans of `sum_squares` from which they run in parallel. One span (64k values) takes ~7 µs on
#: one core, about what starting a parallel region costs: tiny-gpt's 54 gradients (867k values,
#: 20 of them 32k-66k) took 1.04 ms a step in parallel regions of one or two spans.
SUM_PARALLEL_SPANS = 8


@pjit
def sum_squares(g):
    """Σ g² of g: (n,), accumulated in float64: spans of 64k values (from PARALLEL_MIN values;
    in parallel from SUM_PARALLEL_SPANS spans), each in SIMD lanes (`vm.dot_lanes`), the span sums
    added in order: the same bits at any thread count. Non-finite iff some value is (float32
    squares cannot overflow float64)."""
    n = g.shape[0]
    span = 1 << 16
    if n < PARALLEL_MIN:
        return vm.dot_lanes(g, g, n)
    parts = np.empty((n + span - 1) // span)       # (np.zeros would be a parallel region of its own)
    if parts.shape[0] < SUM_PARALLEL_SPANS:
        for k in range(parts.shape[0]):
            lo, hi = k * span, min(n, (k + 1) * span)
            parts[k] = vm.dot_lanes(g[lo:hi], g[lo:hi], hi - lo)
    else:
        for k in prange(parts.shape[0]):
            lo, hi = k * span, min(n, (k + 1) * span)
            parts[k] = vm.dot_lanes(g[lo:hi], g[lo:hi], hi - lo)
    total = 0.0
    for k in range(parts.shape[0]):
        total += parts[k]
    return total


def clip_global_norm(grads, batch: int, max_norm: float, total: float | None = None) -> float:
    """Scale the accumulated gradients `grads` (Darknet's negative sums) so that the L2 norm of the
    mean gradient over all of them is at most `max_norm`; returns the norm before clipping. `total`:
    their Σ g² when the caller has it already."""
    if total is None:
        total = sum(sum_squares(g.reshape(-1)) for g in grads)
    norm = math.sqrt(total) / batch
    if norm > max_norm:
        k = max_norm / (norm + 1e-6)    # torch's clip_grad_norm_ adds the same 1e-6
        for g in grads:
            g *= k
    return norm


def update_params(params, cfg, rate: float, batch: int, t: int) -> None:
    """Apply one update to a layer's Params. `batch` = full batch B; `t` = Adam's update count."""
    for p in params:
        w, g = p.value.reshape(-1), p.grad.reshape(-1)
        if getattr(cfg, "adamw", False):
            if "m" not in p.state or p.state["m"].shape != w.shape:
                p.state["m"] = np.zeros_like(w)
                p.state["v"] = np.zeros_like(w)
            adamw_step(w, g, p.state["m"], p.state["v"], rate, batch, cfg.B1, cfg.B2, cfg.eps, t,
                       cfg.weight_decay if p.decay else 0.0)
        elif cfg.adam:
            if "m" not in p.state or p.state["m"].shape != w.shape:
                p.state["m"] = np.zeros_like(w)
                p.state["v"] = np.zeros_like(w)
            adam_step(w, g, p.state["m"], p.state["v"], rate, batch, cfg.B1, cfg.B2, cfg.eps, t,
                      cfg.decay)
        else:
            sgd_step(w, g, rate, batch, cfg.momentum, cfg.decay if p.decay else 0.0)
