"""The Transformer step's fast kernels: float32 exact gelu through the vectorised erfc (error far
below float32 rounding, against math.erf in float64), the connected layers' row kernels (same bits
as the (B, C, S) kernels for every activation but gelu, whose row kernel keeps the derivative), and float64 keeping math.erf."""
from __future__ import annotations

import math

import numpy as np
import pytest

from darkpy.kernels import activations as act
from darkpy.kernels import bn as bnk


def _gelu(x: float) -> float:
    return 0.5 * x * math.erfc(-x / math.sqrt(2))


def _gelu_grad(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2)) + x * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def test_float32_gelu_is_within_half_an_ulp_plus_a_hair():
    x = np.concatenate([np.linspace(-14, 14, 200_001), np.random.default_rng(0).normal(0, 3, 20_000)])
    x = x.astype(np.float32)
    ref = np.array([_gelu(float(v)) for v in x])
    y = x.copy()
    act.activate_array(y, act.GELU)                 # float32: the vectorised path
    normal = np.abs(ref) > np.finfo(np.float32).tiny
    ulp = np.spacing(np.abs(ref[normal]).astype(np.float32)).astype(np.float64)
    err_ulp = np.abs(y[normal] - ref[normal]) / ulp
    assert err_ulp.max() < 0.6                      # correctly rounded up to 1e-8 relative (0.5 ulp + tiny)
    assert np.all(np.abs(y[~normal]) <= 2 * np.finfo(np.float32).tiny)
    d = np.ones_like(x)
    act.gradient_array(d, y, act.GELU, x)
    g = np.array([_gelu_grad(float(v)) for v in x])
    assert np.abs(d - g).max() < 2 * np.finfo(np.float32).eps


def test_float64_gelu_keeps_math_erf():
    x = np.linspace(-6, 6, 1001)
    y = x.copy()
    act.activate_array(y, act.GELU)
    ref = np.array([0.5 * v * (1 + math.erf(v * 0.7071067811865476)) for v in x])   # the kernel's formula
    assert np.array_equal(y, ref)
    assert act.kernel_code(act.GELU, np.float64) == act.GELU
    assert act.kernel_code(act.GELU, np.float32) == act.GELU_F32


@pytest.mark.parametrize("name", ["linear", "leaky", "relu", "logistic", "mish", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("rows", [5, 300])          # serial and parallel branches
def test_row_kernels_equal_the_channel_kernels(name, rows):
    a = act.kernel_code(act.CODES[name], np.float32)
    rng = np.random.default_rng(1)
    C = 200
    raw = rng.normal(0, 2, (rows, C)).astype(np.float32)
    bias = rng.normal(0, 1, C).astype(np.float32)
    keep = act.needs_input(a)
    y1, y2 = raw.copy(), raw.copy()
    p1, p2 = np.zeros_like(raw), np.zeros_like(raw)
    bnk.bias_act_forward(y1.reshape(rows, C, 1), p1.reshape(rows, C, 1), bias, a, keep)
    bnk.bias_act_forward_rows(y2, p2, bias, a, keep)
    assert np.array_equal(y1, y2)
    if a == act.GELU_F32:       # the row kernel keeps gelu' (at the unrounded y + bias) instead
        z = raw.astype(np.float64) + bias
        ref = np.array([_gelu_grad(float(v)) for v in z.ravel()]).reshape(z.shape)
        assert np.abs(p2 - ref).max() < 2 * np.finfo(np.float32).eps
    else:
        assert np.array_equal(p1, p2)
    delta = rng.normal(0, 1, (rows, C)).astype(np.float32)
    d1, d2 = delta.copy(), delta.copy()
    g1, g2 = np.zeros(C, np.float32), np.zeros(C, np.float32)
    pre1, pre2 = (p1, p2) if keep else (y1, y2)
    bnk.bias_act_backward(d1.reshape(rows, C, 1), y1.reshape(rows, C, 1), pre1.reshape(rows, C, 1), g1, a)
    bnk.bias_act_backward_rows(d2, y2, pre2, g2, a)
    if a == act.GELU_F32:       # gelu' at y + bias unrounded (rows) or rounded to float32 (pre)
        assert np.allclose(d1, d2, rtol=1e-6, atol=1e-7) and np.allclose(g1, g2, rtol=1e-6, atol=1e-6)
    else:                       # the bias gradient: float64 sums of the same values, by chunks of rows
        assert np.array_equal(d1, d2) and np.allclose(g1, g2, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["linear", "leaky", "gelu"])
def test_row_bias_gradient_is_float64_sums_with_the_same_bits_at_any_thread_count(name):
    """bias_act_backward_rows over 1030 rows (chunks of GRAD_CHUNK rows, a last partial one, in
    parallel): the bias gradient is the float64 sum of the gradients it leaves in delta, and one
    thread gives the bits two give."""
    import numba
    a = act.kernel_code(act.CODES[name], np.float32)
    rng = np.random.default_rng(2)
    rows, C = 1030, 200
    y = rng.normal(0, 2, (rows, C)).astype(np.float32)
    pre = rng.normal(0, 1, (rows, C)).astype(np.float32)
    delta = rng.normal(0, 1, (rows, C)).astype(np.float32)
    runs = []
    saved = numba.get_num_threads()
    for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
        d, g = delta.copy(), np.full(C, 0.5, np.float32)
        numba.set_num_threads(threads)
        try:
            bnk.bias_act_backward_rows(d, y, pre, g, a)
        finally:
            numba.set_num_threads(saved)
        runs.append((d, g))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    d, g = runs[0]
    # GELU_F32 sums the products delta·gelu' unrounded (pre holds gelu'); the others what they leave
    terms = delta.astype(np.float64) * pre if a == act.GELU_F32 else d.astype(np.float64)
    assert np.allclose(g, (0.5 + terms.sum(0)).astype(np.float32), rtol=1e-6, atol=1e-6)


def test_exp_poly_and_fma():
    """vecmath.exp_poly within its documented relative error of e^(−y) over [0, 90.25], in a
    loop numba vectorises; vecmath.fma rounds once (a·b + c with a·b inexact in float64)."""
    import numba
    from darkpy.kernels import vecmath as vm

    @numba.njit(cache=False, error_model="numpy")
    def run(out, y):
        for j in range(y.shape[0]):
            out[j] = vm.exp_poly(y[j])

    @numba.njit(cache=False)
    def fused(a, b, c):
        return vm.fma(a, b, c)

    y = np.concatenate([np.linspace(0, 90.25, 100_001), np.random.default_rng(0).uniform(0, 5, 10_000)])
    out = np.empty_like(y)
    run(out, y)
    ref = np.exp(-y)
    err = np.abs(out / ref - 1)
    assert err.max() < 7.8e-9 and err[y <= 30].max() < 1e-13
    a = 1 + 2.0 ** -30
    assert fused(a, a, -1.0) == 2.0 ** -29 + 2.0 ** -60       # a·a − 1 exactly; unfused loses 2^-60
    assert fused(np.float32(3), np.float32(0.5), np.float32(1)) == np.float32(2.5)
