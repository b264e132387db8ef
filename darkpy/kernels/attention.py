"""Fused multi-head attention for `[attention]` (layers/mha.py): scores, masked softmax and the
weighted sum of the values in one pass per (sequence, head), and the backward the same way.

At a Transformer's sizes a head's products are small (tiny-gpt: 64 × 64 × 32) and each goes to
BLAS as one GEMM of a stack, which spends more time starting up than multiplying. Here every
product is a register-blocked SIMD microkernel (`microgemm.rows4x2`: 4 rows × 2 vectors, eight
vector accumulators) over a head's rows, read in place from the layer's time-major row buffers (row
t·S + s is step t of sequence s), with the causal rows cut at the query, so half of a causal head's
products are never computed. One unit of parallel work is one (sequence, head).

Every product is C[i, v] = Σ_k L[i, k] · R[k, v]: L's values are broadcast, R's rows are vectors
of the output's columns. The scores use the keys transposed (R = Kᵀ, made per unit), the weighted
sum the value rows in place (R = V); the backward's four products use the score gradient and,
for the keys' and values' gradients, the transposes of the score gradient and the weights as L,
read in place (L[i, k] at k·T + i: four neighbours per k). A product's columns are whole pairs
of vectors: the head size must be a multiple of 2·LANES (`fits`); the layer takes its GEMM path
otherwise.

The softmax (forward and backward) is the row kernel the GEMM path runs too (`softmax_row`,
`softmax_grad_row`, below), so masks, all-masked rows and exact zeros behave the same.
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from . import jit, pjit
from . import vecmath as vm
from .microgemm import CV, rows4x2


def fits(head_size: int) -> bool:
    """True when a head of `head_size` columns is whole microkernel column pairs."""
    return head_size % CV == 0


#: Which products a causal head cuts, per block of rows i0..i0+3 (rows: queries, or keys for the
#: transposed ones): none; the sum over keys k < i0 + 4 (weights · values, score gradient · keys);
#: the sum over queries k ≥ i0 (the transposed products: gradients of keys and values); the
#: output's columns v < i0 + 4 (scores, weight gradients).
FULL, KEYS_BEFORE, QUERIES_AFTER, COLUMNS_BEFORE = 0, 1, 2, 3


# compiled once for its seven call sites, not inlined into each (a copy of its IR per site made
# the two kernels' cold compile 17 s; a call costs nothing next to a head's product)
@jit
def _product(out, obase, ostr, lhs, lbase, lstr, rhs, rbase, rstr, rows, cols, kn, cut, lk=1):
    """out[obase + i·ostr + v] := Σ_k lhs[lbase + i·lstr + k·lk] · rhs[rbase + k·rstr + v] for rows
    i < `rows`, columns v < `cols` (whole CV pairs) and k < kn, less what `cut` leaves out (its
    products are exact zeros of a causal head; columns left out are not written). lstr = 1 and
    lk = a row's length: the left operand is a matrix's transpose, read in place."""
    last = rows - 1
    for i0 in range(0, rows, 4):
        i1, i2, i3 = min(i0 + 1, last), min(i0 + 2, last), min(i0 + 3, last)
        lo, hi, width = 0, kn, cols
        if cut == KEYS_BEFORE:
            hi = min(kn, i0 + 4)
        elif cut == QUERIES_AFTER:
            lo = i0
        elif cut == COLUMNS_BEFORE:
            width = min(cols, _padded(i0 + 4))
        for v in range(0, width, CV):
            rows4x2(out, obase + i0 * ostr + v, obase + i1 * ostr + v, obase + i2 * ostr + v,
                     obase + i3 * ostr + v, lhs, lbase + i0 * lstr, lbase + i1 * lstr,
                     lbase + i2 * lstr, lbase + i3 * lstr, rhs, rbase + v, rstr, lo, hi, lk)


@jit(inline="always")
def _padded(n):
    """n rounded up to whole vector pairs."""
    return (n + CV - 1) // CV * CV


@jit(inline="always")
def _transposed(src, sbase, sstr, n, m, width):
    """A new (m, width) matrix, flat: row j holds src[sbase + i·sstr + j] for i < n, then zeros."""
    dst = np.empty(m * width, src.dtype)
    for i in range(n):                  # src's rows read along, dst written down a column
        at = sbase + i * sstr
        for j in range(m):
            dst[j * width + i] = src[at + j]
    for j in range(m):
        for i in range(n, width):
            dst[j * width + i] = 0.0
    return dst


# -- the softmax rows (also the GEMM path's: layers/mha.py) -------------------------------------
@jit(inline="always")
def softmax_row(r, scale, causal, keymask, s, t, fast):
    """One query row r: (T,) of scores, in place -> its attention weights (float64 inside): keys
    after t (causal) and keys with keymask[s] set are exactly 0; all keys masked: all 0. `fast`:
    exp as `vm.exp_neg`; each loop is branch-free in j, so it vectorises."""
    T = r.shape[0]
    hi = t + 1 if causal else T
    if keymask.shape[0] > 0:
        for j in range(hi):
            if keymask[s, j]:
                r[j] = -math.inf                 # exp(−inf) below: exactly 0
    m = vm.row_max(r, hi, scale)
    if m == -math.inf:
        for j in range(T):
            r[j] = 0.0
        return
    for j in range(hi):
        r[j] = vm.exp_neg(m - r[j] * scale, fast)
    for j in range(hi, T):
        r[j] = 0.0
    inv = 1.0 / vm.row_sum(r, hi)
    for j in range(hi):
        r[j] = r[j] * inv


@jit(inline="always")
def softmax_grad_row(d, a, scale, hi):
    """d: (T,) gradient w.r.t. a row's weights a, in place -> w.r.t. its raw scores. a is 0 from
    `hi` on (the causal cut), so d is too, whatever it held there."""
    acc = vm.dot_lanes(d, a, hi)
    for j in range(hi):
        d[j] = a[j] * (d[j] - acc) * scale
    for j in range(hi, d.shape[0]):
        d[j] = 0.0


# -- forward and backward ------------------------------------------------------------------------
@pjit(error_model="numpy")
def attention_forward(a, ctx, qkv, scale, causal, keymask):
    """qkv: (T·S, 3D) time-major rows [Q | K | V]; a: (S, H, T, T) <- the attention weights
    softmax(Q_h·K_hᵀ·scale + M); ctx: (T·S, D) <- concat_h(A_h·V_h). keymask: (S, T), 1 at keys
    hidden from every query, or (0, 0)."""
    S, H, T = a.shape[0], a.shape[1], a.shape[2]
    D = ctx.shape[1]
    dh = D // H
    q1, c1, a1 = qkv.reshape(-1), ctx.reshape(-1), a.reshape(-1)
    fast = a.itemsize == 4                    # float32 layers: the vectorising exp
    tp = _padded(T)
    row = S * 3 * D                           # from one step's row of a sequence to the next
    cut = COLUMNS_BEFORE if causal else FULL
    direct = tp == T                          # rows of whole column pairs: scores straight into a
    for u in prange(S * H):
        s, h = u // H, u % H
        qb = s * 3 * D + h * dh               # step 0 of sequence s, head h, in the Q block
        kt = _transposed(q1, qb + D, row, T, dh, tp)                       # Kᵀ: (dh, tp)
        if direct:                            # raw scores in a's rows (columns after a causal cut
            _product(a1, u * T * T, T, q1, qb, row, kt, 0, tp, T, tp, dh, cut)   # left as they were)
        else:
            p = np.empty(T * tp, a.dtype)                                  # raw scores (T, tp)
            _product(p, 0, tp, q1, qb, row, kt, 0, tp, T, tp, dh, cut)
            for t in range(T):
                for j in range(t + 1 if causal else T):
                    a[s, h, t, j] = p[t * tp + j]
        for t in range(T):
            softmax_row(a[s, h, t], scale, causal, keymask, s, t, fast)
        _product(c1, s * D + h * dh, S * D, a1, u * T * T, T, q1, qb + 2 * D, row, T, dh, T,
                 KEYS_BEFORE if causal else FULL)                          # A·V


@pjit(error_model="numpy")
def attention_backward(dqkv, da, a, dctx, qkv, scale, causal):
    """The gradients of `attention_forward` without dropout: dctx (T·S, D) w.r.t. ctx in; dqkv
    (T·S, 3D) <- w.r.t. [Q | K | V]; da (S, H, T, T) <- w.r.t. the raw scores times scale (a's
    zeros stay exact zeros)."""
    S, H, T = a.shape[0], a.shape[1], a.shape[2]
    D = dctx.shape[1]
    dh = D // H
    q1, g1, d1, da1, a1 = qkv.reshape(-1), dqkv.reshape(-1), dctx.reshape(-1), da.reshape(-1), a.reshape(-1)
    tp = _padded(T)
    direct = tp == T
    row, drow = S * 3 * D, S * D
    for u in prange(S * H):
        s, h = u // H, u % H
        qb = s * 3 * D + h * dh
        ob = s * D + h * dh                   # step 0 of sequence s, head h, in dctx
        vt = _transposed(q1, qb + 2 * D, row, T, dh, tp)                   # Vᵀ: (dh, tp)
        ab = u * T * T
        cut = COLUMNS_BEFORE if causal else FULL
        if direct:                                                         # dctx·Vᵀ: d weights
            _product(da1, ab, T, d1, ob, drow, vt, 0, tp, T, tp, dh, cut)
        else:
            p = np.empty(T * tp, a.dtype)
            _product(p, 0, tp, d1, ob, drow, vt, 0, tp, T, tp, dh, cut)
            for t in range(T):
                for j in range(t + 1 if causal else T):
                    da[s, h, t, j] = p[t * tp + j]
        for t in range(T):
            softmax_grad_row(da[s, h, t], a[s, h, t], scale, t + 1 if causal else T)
        _product(g1, qb, row, da1, ab, T, q1, qb + D, row, T, dh, T,
                 KEYS_BEFORE if causal else FULL)                          # dQ = dS·K
        _product(g1, qb + D, row, da1, ab, 1, q1, qb, row, T, dh, T,
                 QUERIES_AFTER if causal else FULL, T)                     # dK = dSᵀ·Q
        _product(g1, qb + 2 * D, row, a1, ab, 1, d1, ob, drow, T, dh, T,
                 QUERIES_AFTER if causal else FULL, T)                     # dV = Aᵀ·dctx
