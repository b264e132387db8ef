"""Darknet activations (spec §4): forward in place, gradient applied to a delta in place.

Darknet evaluates most gradients from the layer's OUTPUT y = f(x); darkpy does the same (it is exact
for every monotone activation here). The activations whose derivative cannot be written in terms of
y (swish, mish, hard_mish, gelu, gelu_tanh) take the pre-activation input x instead: a layer keeps a copy of x
only for those (`needs_input(code)`).

Differences from Darknet, on purpose (README "Differences from Darknet"):
- tanh uses a form that does not overflow (Darknet's CPU (e^{2x}-1)/(e^{2x}+1) is NaN for x > ~44).
- relu6 is computed (Darknet's CPU path has no case for it and returns 0).
- `gelu` is the exact x·Φ(x) (erf); AlexeyAB's `gelu` is the tanh approximation, which darkpy
  calls `gelu_tanh`. Both gradients are the true derivative at x (the fork applies its formula to
  the output).
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from . import PARALLEL_MIN, PARALLEL_MIN_FLAT, jit, pjit, vjit
from .vecmath import exp_poly as _exp_neg
from .vecmath import fma

NAMES = ("logistic", "relu", "relie", "linear", "ramp", "tanh", "plse", "leaky", "elu", "loggy",
         "stair", "hardtan", "lhtan", "selu", "swish", "mish", "hard_mish", "gelu", "relu6", "revleaky",
         "gelu_tanh")
CODES = {name: i for i, name in enumerate(NAMES)}
#: Other spellings of the same functions: the YOLOR project's cfgs write `silu` for Darknet's `swish`.
ALIASES = {"silu": "swish"}
LOGISTIC, RELU, RELIE, LINEAR, RAMP, TANH, PLSE, LEAKY, ELU, LOGGY, STAIR, HARDTAN, LHTAN, SELU, \
    SWISH, MISH, HARD_MISH, GELU, RELU6, REVLEAKY, GELU_TANH = range(len(NAMES))
#: Kernel-only code (no cfg name): exact gelu on float32 arrays, through `gelu_f32` (a branch-free
#: erfc the compiler vectorises) instead of math.erf. `kernel_code` picks it.
GELU_F32 = len(NAMES)
_NEEDS_INPUT = (SWISH, MISH, HARD_MISH, GELU, GELU_TANH, GELU_F32)
_INV_SQRT2 = 0.7071067811865476
_INV_SQRT2PI = 0.3989422804014327
_SQRT_2_PI = 0.7978845608028654            # sqrt(2/pi)
_TANH_CUBIC = 0.044715 * _SQRT_2_PI


def code(name: str) -> int:
    return CODES[ALIASES.get(name, name)]


def kernel_code(act: int, dtype) -> int:
    """The code a kernel runs for activation `act` on arrays of `dtype`: GELU_F32 for exact gelu on
    float32 (its error is far below float32 rounding, see `gelu_f32`), else `act` itself. Float64
    keeps math.erf, so float64 gradient checks and references see the libm function."""
    return GELU_F32 if act == GELU and np.dtype(dtype) == np.float32 else act


def needs_input(act: int) -> bool:
    """True when the gradient needs the pre-activation input (the layer must keep a copy)."""
    return act in _NEEDS_INPUT


# -- exact gelu for float32, vectorisable ----------------------------------------------------------
# Φ(x) = ½·erfc(−x/√2). With t = |x|/√2: ½·erfc(t) = ½·e^(−t²)·R(t), R(t) = erfc(t)·e^(t²), and R is
# a (4, 5) rational in t fitted for darkpy (iterated weighted least squares on [0, 9.5], all
# coefficients positive, so no pole): its relative error is at most 6.3e-9 there, e^(−t²) below is
# good to ~8e-9, so Φ(x) (and gelu = x·Φ) keeps a relative error near 1e-8 everywhere — about 10×
# below float32's epsilon (1.19e-7) — in both tails (no cancellation: x < 0 uses the tail itself,
# x ≥ 0 uses 1 − tail with tail ≤ ½). For t > 9.5 (|x| > 13.4) the tail is 0: gelu(x) there is
# below float32's smallest normal number. tests/test_seq_kernels.py checks it against math.erfc.
_ERFCX_P = (1.000000006246037, 1.2388844453967467, 0.7322117367080867, 0.22955108698221532,
            0.032881831980031806)
_ERFCX_Q = (1.0, 2.3672642350036166, 2.4033734637304125, 1.326518269056267, 0.40689552594395495,
            0.05828080993632917)


@jit(inline="always")
def _gelu_parts(x):
    """(Φ(x), e^(−x²/2)) in float64 for the float32 gelu (see the comment above)."""
    t = min(abs(x) * _INV_SQRT2, 9.5)
    e = _exp_neg(t * t)
    P, Q = _ERFCX_P, _ERFCX_Q
    num = fma(fma(fma(fma(P[4], t, P[3]), t, P[2]), t, P[1]), t, P[0])
    den = fma(fma(fma(fma(fma(Q[5], t, Q[4]), t, Q[3]), t, Q[2]), t, Q[1]), t, Q[0])
    tail = 0.5 * e * num / den
    if t >= 9.5:
        tail = 0.0
        e = 0.0
    phi = 1.0 - tail if x >= 0 else tail
    return phi, e


@jit(inline="always")
def gelu_f32(x):
    """Exact gelu x·Φ(x) of a float32 value (computed in float64)."""
    xd = 1.0 * x
    phi, _ = _gelu_parts(xd)
    return xd * phi


@jit(inline="always")
def gelu_f32_grad(x):
    """d gelu / dx = Φ(x) + x·φ(x) of a float32 value (computed in float64)."""
    xd = 1.0 * x
    phi, e = _gelu_parts(xd)
    return phi + xd * _INV_SQRT2PI * e


@jit(inline="always")
def gelu_f32_and_grad(x):
    """(gelu(x), gelu'(x)) of a float32 value, as `gelu_f32` and `gelu_f32_grad` give them, from one
    evaluation of Φ(x) and φ(x)."""
    xd = 1.0 * x
    phi, e = _gelu_parts(xd)
    return xd * phi, phi + xd * _INV_SQRT2PI * e


@jit
def _act(x, a):
    if a == LINEAR:
        return x
    if a == LEAKY or a == REVLEAKY:
        return x if x > 0 else 0.1 * x
    if a == RELU:
        return x if x > 0 else 0.0 * x
    if a == LOGISTIC:
        return 1.0 / (1.0 + math.exp(-x))
    if a == RELIE:
        return x if x > 0 else 0.01 * x
    if a == RAMP:
        return (x if x > 0 else 0.0 * x) + 0.1 * x
    if a == TANH:
        return math.tanh(x)
    if a == PLSE:
        if x < -4:
            return 0.01 * (x + 4)
        if x > 4:
            return 0.01 * (x - 4) + 1
        return 0.125 * x + 0.5
    if a == ELU:
        return x if x >= 0 else math.exp(x) - 1
    if a == LOGGY:
        return 2.0 / (1.0 + math.exp(-x)) - 1
    if a == STAIR:
        n = math.floor(x)
        if n % 2 == 0:
            return math.floor(x / 2)
        return (x - n) + math.floor(x / 2)
    if a == HARDTAN:
        if x < -1:
            return -1.0 + 0.0 * x
        if x > 1:
            return 1.0 + 0.0 * x
        return x
    if a == LHTAN:
        if x < 0:
            return 0.001 * x
        if x > 1:
            return 0.001 * (x - 1) + 1
        return x
    if a == SELU:
        return 1.0507 * x if x >= 0 else 1.0507 * 1.6732 * (math.exp(x) - 1)
    if a == SWISH:
        return x / (1.0 + math.exp(-x))
    if a == MISH:
        return x * math.tanh(_softplus(x))
    if a == HARD_MISH:
        if x > 0:
            return x
        if x > -2:
            return x * x / 2 + x
        return 0.0 * x
    if a == GELU:
        return 0.5 * x * (1 + math.erf(x * _INV_SQRT2))
    if a == GELU_F32:
        return gelu_f32(x)
    if a == GELU_TANH:
        # AlexeyAB's `gelu` formula, with the constants unrounded (it writes 0.797885, 0.035677)
        return 0.5 * x * (1 + math.tanh(_SQRT_2_PI * x + _TANH_CUBIC * x * x * x))
    if a == RELU6:
        return min(max(x, 0.0 * x), 6.0 + 0.0 * x)
    return x


@jit
def _softplus(x):
    if x > 20:
        return x
    if x < -20:
        return math.exp(x)
    return math.log1p(math.exp(x))


@jit
def _grad(y, x, a):
    """d f / d x, from the output y (and the input x for the activations that need it)."""
    if a == LINEAR:
        return 1.0
    if a == LEAKY or a == REVLEAKY:
        return 1.0 if y > 0 else 0.1
    if a == RELU:
        return 1.0 if y > 0 else 0.0
    if a == LOGISTIC:
        return y * (1 - y)
    if a == RELIE:
        return 1.0 if y > 0 else 0.01
    if a == RAMP:
        return (1.0 if y > 0 else 0.0) + 0.1
    if a == TANH:
        return 1 - y * y
    if a == PLSE:
        return 0.01 if (y < 0 or y > 1) else 0.125
    if a == ELU:
        return 1.0 if y >= 0 else y + 1
    if a == LOGGY:
        u = (y + 1) / 2
        return 2 * u * (1 - u)
    if a == STAIR:
        return 0.0 if math.floor(y) == y else 1.0
    if a == HARDTAN:
        return 1.0 if (y > -1 and y < 1) else 0.0
    if a == LHTAN:
        return 1.0 if (y > 0 and y < 1) else 0.001
    if a == SELU:
        return 1.0507 if y >= 0 else y + 1.0507 * 1.6732
    if a == SWISH:
        s = 1.0 / (1.0 + math.exp(-x))
        return s + x * s * (1 - s)
    if a == MISH:
        sp = _softplus(x)
        t = math.tanh(sp)
        return t + x * (1 - t * t) * (1 - math.exp(-sp))
    if a == HARD_MISH:
        if x > 0:
            return 1.0
        if x > -2:
            return x + 1
        return 0.0
    if a == GELU:
        return 0.5 * (1 + math.erf(x * _INV_SQRT2)) + x * _INV_SQRT2PI * math.exp(-0.5 * x * x)
    if a == GELU_F32:
        return gelu_f32_grad(x)
    if a == GELU_TANH:
        u = _SQRT_2_PI * x + _TANH_CUBIC * x * x * x
        t = math.tanh(u)
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * (_SQRT_2_PI + 3 * _TANH_CUBIC * x * x)
    if a == RELU6:
        return 1.0 if (x > 0 and x < 6) else 0.0
    return 1.0


#: Values per parallel block of the flat element-wise kernels (16 KiB of float32: a block stays in
#: L1 between the passes a fused kernel makes over it).
BLOCK = 1 << 12


@vjit
def activate_span(x, a):
    """x: (n,) flat, in place: x[i] = f(x[i]). The common activations run as tight loops the
    compiler vectorises, with the same formulas (so the same values) as `_act`, which the rest go
    through (a call per element, ~10x slower). Kernels pass a slice `x[lo:hi]`: looping from 0
    lets numba drop its negative-index checks, without which nothing vectorises. The leaky/relu
    loops multiply by the slope (v·1 == v exactly) rather than select v: an in-place select turns
    into a masked store, which AMD cores run several times slower."""
    n = x.shape[0]
    if a == LINEAR:
        return
    if a == LEAKY:
        for i in range(n):
            v = x[i]
            x[i] = v * (1.0 if v > 0 else 0.1)
    elif a == RELU:
        for i in range(n):
            v = x[i]
            x[i] = v * (1.0 if v > 0 else 0.0)
    elif a == LOGISTIC:
        for i in range(n):
            x[i] = 1.0 / (1.0 + math.exp(-x[i]))
    elif a == GELU_F32:
        for i in range(n):
            x[i] = gelu_f32(x[i])
    else:
        for i in range(n):
            x[i] = _act(x[i], a)


@vjit
def _gradient_span(delta, y, x, a):
    """delta, y, x: (n,) in place: delta[i] *= f'(x[i]). The common activations as tight loops the
    compiler vectorises, with `_grad`'s formulas (so the same values); the rest call `_grad` per
    element (leaky through `_grad` ran ~15x slower: 70 vs 4.6 µs on 32k values)."""
    n = delta.shape[0]
    if a == LINEAR:
        return
    if a == LEAKY or a == REVLEAKY:
        for i in range(n):
            delta[i] *= 1.0 if y[i] > 0 else 0.1
    elif a == RELU:
        for i in range(n):
            delta[i] *= 1.0 if y[i] > 0 else 0.0
    elif a == LOGISTIC:
        for i in range(n):
            v = y[i]
            delta[i] *= v * (1 - v)
    elif a == GELU_F32:
        for i in range(n):
            delta[i] *= gelu_f32_grad(x[i])
    else:
        for i in range(n):
            delta[i] *= _grad(y[i], x[i], a)


@jit(inline="always")
def parallel_min(a, cheap_min):
    """Values from which a kernel applying activation `a` (or its gradient) runs in parallel:
    `cheap_min` (the kernel's memory-bound threshold, PARALLEL_MIN_FLAT or _ROWS) when `a` costs a
    compare or nothing per value (and the kernels vectorise it), PARALLEL_MIN when it computes
    (exp, tanh, ...) or goes through `_act`/`_grad` per value."""
    if a == LINEAR or a == LEAKY or a == RELU:
        return cheap_min
    return PARALLEL_MIN


@pjit
def activate(x, a):
    """x: (n,) flat, any float dtype; x[i] = f(x[i]) in place. Serial below `parallel_min` values
    (PARALLEL_MIN_FLAT for the cheap activations), else parallel over BLOCK-sized spans."""
    n = x.shape[0]
    if a == LINEAR:
        return
    if n < parallel_min(a, PARALLEL_MIN_FLAT):
        activate_span(x, a)
        return
    for k in prange((n + BLOCK - 1) // BLOCK):
        activate_span(x[k * BLOCK:(k + 1) * BLOCK], a)


@pjit
def gradient(delta, y, x, a):
    """delta, y: (n,); x: (n,) pre-activation (read only for swish/mish/hard_mish/gelu, else any
    array). delta[i] *= f'(x[i]), in place; serial below `parallel_min` values."""
    n = delta.shape[0]
    if a == LINEAR:
        return
    if n < parallel_min(a, PARALLEL_MIN_FLAT):
        _gradient_span(delta, y, x, a)
        return
    for k in prange((n + BLOCK - 1) // BLOCK):
        lo = k * BLOCK
        _gradient_span(delta[lo:lo + BLOCK], y[lo:lo + BLOCK], x[lo:lo + BLOCK], a)


def activate_array(x: np.ndarray, act: int) -> None:
    """Apply activation `act` in place to an array of any shape (must be C-contiguous)."""
    activate(x.reshape(-1), kernel_code(act, x.dtype))


def gradient_array(delta: np.ndarray, y: np.ndarray, act: int, x: np.ndarray | None = None) -> None:
    """Multiply `delta` in place by the activation's derivative (any shape, C-contiguous)."""
    d = delta.reshape(-1)
    yf = y.reshape(-1)
    # without a stored input, relu6's x-based test reads y instead (0 < y < 6 iff 0 < x < 6)
    gradient(d, yf, yf if x is None else x.reshape(-1), kernel_code(act, delta.dtype))
