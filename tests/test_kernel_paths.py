"""The element-wise and layout kernels that take a serial branch below a threshold (`PARALLEL_MIN`
values, `PARALLEL_MIN_FLAT` for the flat cheap ones: kernels/__init__.py) and a parallel one above
it: both branches against a slow reference (numpy, or the scalar `_act`), so neither can drift from
the other. Sizes: `SMALL` well below every threshold, `large(threshold)`
above it and not a multiple of any block size."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from darkpy.kernels import PARALLEL_MIN, PARALLEL_MIN_FLAT
from darkpy.kernels import activations as A
from darkpy.kernels import bn as bnk
from darkpy.kernels import im2col as ic
from darkpy.layers import gated as R
from darkpy.layers.shortcut import shortcut_prefix_add_act
from darkpy.layers.softmax import softmax_forward
from darkpy.layers.upsample import upsample_forward
from darkpy.layers.yolo import yolo_activate
from helpers import assert_close

SMALL = 1000


def large(threshold: int) -> int:
    """A size above `threshold` that is not a multiple of any block size."""
    return threshold + 12345


def act_large(a: int, cheap_threshold: int) -> int:
    """A size at which a kernel applying activation `a` takes its parallel branch."""
    return large(int(A.parallel_min(a, cheap_threshold)))


def _values(n, dtype, seed=0):
    """n values over the activations' interesting ranges, with specials at the start."""
    x = (np.random.default_rng(seed).standard_normal(n) * 4).astype(dtype)
    x[:5] = [0.0, -0.0, 1e-30, -7.5, 30.0]
    return x


def _act_ref(x, a):
    return np.array([A._act(v, a) for v in x.astype(np.float64)])


# -- activations ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", A.NAMES)
def test_activate_small_is_the_scalar_formula(name):
    """The serial branch (and its vectorised loops for leaky/relu/logistic) gives `_act`'s values."""
    a = A.code(name)
    for dtype in (np.float32, np.float64):
        x = _values(SMALL, dtype)
        y = x.copy()
        A.activate(y, a)
        assert_close(y, _act_ref(x, a).astype(dtype), 1e-6, 1e-7, name)
        assert np.array_equal(np.signbit(y[:2]), np.signbit(_act_ref(x[:2], a))), f"{name}: sign of zero"


@pytest.mark.parametrize("name", A.NAMES)
def test_activate_and_gradient_parallel_equal_serial(name):
    """Above the threshold (parallel spans) the values are exactly those of the serial branch,
    run here on chunks below the threshold."""
    a = A.code(name)
    n = act_large(a, PARALLEL_MIN_FLAT)
    x = _values(n, np.float32, 1)
    y = x.copy()
    A.activate(y, a)
    expected = x.copy()
    for lo in range(0, n, SMALL):
        A.activate(expected[lo:lo + SMALL], a)
    assert np.array_equal(y, expected)
    d = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    d_par, d_ser = d.copy(), d.copy()
    A.gradient(d_par, y, x, a)
    for lo in range(0, n, SMALL):
        A.gradient(d_ser[lo:lo + SMALL], y[lo:lo + SMALL], x[lo:lo + SMALL], a)
    assert np.array_equal(d_par, d_ser)


# -- fused bias / batch-norm passes ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["leaky", "linear", "logistic", "mish"])
@pytest.mark.parametrize("shape", [(2, 3, 50), (1, 64, 13 * 13 * 4)])
def test_bn_inference_and_bias_passes_match_numpy(name, shape):
    a = A.code(name)
    assert (np.prod(shape) >= PARALLEL_MIN) == (shape[0] == 1)
    rng = np.random.default_rng(3)
    c = shape[1]
    y0 = rng.standard_normal(shape)
    mean, var = rng.normal(0, 0.1, c), rng.uniform(0.5, 2, c)
    scales, biases = rng.uniform(0.5, 1.5, c), rng.normal(0, 0.1, c)
    y = y0.copy()
    bnk.bn_act_forward_infer(y, mean, var, scales, biases, a, False)
    z = (y0 - mean[:, None]) / np.sqrt(var[:, None] + 1e-5) * scales[:, None] + biases[:, None]
    assert_close(y, _act_ref(z.reshape(-1), a).reshape(shape), 1e-12, 1e-12, "bn inference")
    y, pre = y0.copy(), np.zeros(shape)
    bnk.bias_act_forward(y, pre, biases, a, True)
    z = y0 + biases[:, None]
    assert_close(pre, z, 0, 0, "pre-activation")
    assert_close(y, _act_ref(z.reshape(-1), a).reshape(shape), 1e-12, 1e-12, "bias + activation")


@pytest.mark.parametrize("shape", [(2, 3, 50), (4, 16, 700)])
def test_bn_training_pass_matches_numpy(shape):
    """Batch statistics over items and positions, unbiased variance (kernels/bn.py)."""
    rng = np.random.default_rng(4)
    c = shape[1]
    y0 = rng.standard_normal(shape) * 2 + 1
    y, xnorm = y0.copy(), np.zeros(shape)
    mean, var, rmean, rvar = np.zeros(c), np.zeros(c), np.zeros(c), np.ones(c)
    scales, biases = rng.uniform(0.5, 1.5, c), rng.normal(0, 0.1, c)
    bnk.bn_act_forward_train(y, xnorm, mean, var, rmean, rvar, scales, biases, A.LEAKY, False)
    m, v = y0.mean(axis=(0, 2)), y0.var(axis=(0, 2), ddof=1)
    assert_close(mean, m, 1e-12, 1e-12, "mean")
    assert_close(var, v, 1e-12, 1e-12, "variance")
    assert_close(rvar, 0.99 + 0.01 * v, 1e-12, 1e-12, "rolling variance")
    z = (y0 - m[:, None]) / np.sqrt(v[:, None] + 1e-5) * scales[:, None] + biases[:, None]
    assert_close(y, np.where(z > 0, z, 0.1 * z), 1e-12, 1e-12, "output")


# -- shortcut --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,keep_pre", [("leaky", False), ("linear", False), ("logistic", False),
                                           ("swish", True)])
@pytest.mark.parametrize("size", ["small", "large"])
def test_shortcut_fused_pass_matches_numpy(name, keep_pre, size):
    a = A.code(name)
    n = SMALL if size == "small" else act_large(a, PARALLEL_MIN_FLAT)
    rng = np.random.default_rng(5)
    prev, add = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    alpha, beta = np.float32(0.5), np.float32(1.5)
    out, pre = np.zeros(n, np.float32), np.zeros(n if keep_pre else 0, np.float32)
    shortcut_prefix_add_act(out[None], pre[None], prev[None], add[None], alpha, beta, a, keep_pre, n)
    z = alpha * prev + beta * add                      # float32 arithmetic, as Darknet's
    if keep_pre:
        assert np.array_equal(pre, z)
    assert_close(out, _act_ref(z, a), 1e-6, 1e-7, name)


@pytest.mark.parametrize("name,keep_pre", [("leaky", False), ("linear", False), ("logistic", False),
                                           ("swish", True)])
@pytest.mark.parametrize("size", ["small", "large"])
def test_shortcut_prefix_pass_matches_numpy(name, keep_pre, size):
    """A `from` of fewer values per item (its overlap a prefix of each item): the prefix gets
    act(alpha*prev + beta*add), the rest act(prev) unscaled, on both branches; the pre-activation
    kept when asked."""
    a = A.code(name)
    B = 3
    N = SMALL if size == "small" else act_large(a, PARALLEL_MIN_FLAT) // B
    n = N // 3 + 5                                     # not a multiple of any block
    rng = np.random.default_rng(6)
    prev = rng.standard_normal((B, N)).astype(np.float32)
    add = rng.standard_normal((B, n + 7)).astype(np.float32)    # longer than the overlap
    alpha, beta = np.float32(0.5), np.float32(1.5)
    out = np.full((B, N), np.nan, np.float32)
    pre = np.full((B, N if keep_pre else 0), np.nan, np.float32)
    shortcut_prefix_add_act(out, pre, prev, add, alpha, beta, a, keep_pre, n)
    z = prev.copy()
    z[:, :n] = alpha * prev[:, :n] + beta * add[:, :n]     # float32 arithmetic, as Darknet's
    if keep_pre:
        assert np.array_equal(pre, z)
    assert_close(out.reshape(-1), _act_ref(z.reshape(-1), a), 1e-6, 1e-7, name)


# -- heads and wiring ------------------------------------------------------------------------------------
@pytest.mark.parametrize("hw", [4 * 4, 26 * 26])
@pytest.mark.parametrize("scale_xy,new_coords", [(1.0, False), (1.2, False), (2.0, True)])
def test_yolo_activation_matches_numpy(hw, scale_xy, new_coords):
    n, classes, batch = 3, 4, 2
    entries = 5 + classes
    x = np.random.default_rng(6).standard_normal((batch, n * entries * hw))
    out = np.zeros_like(x)
    yolo_activate(out, x, n, entries, hw, scale_xy, new_coords)
    z = x.reshape(batch, n, entries, hw)
    sig = z if new_coords else 1 / (1 + np.exp(-z))
    ref = sig.copy()
    ref[:, :, :2] = sig[:, :, :2] * scale_xy - 0.5 * (scale_xy - 1)
    ref[:, :, 2:4] = z[:, :, 2:4]
    assert_close(out.reshape(ref.shape), ref, 1e-12, 1e-12)


@pytest.mark.parametrize("shape", [(1, 2, 4, 5), (1, 128, 13, 13)])
def test_upsample_matches_numpy(shape):
    x = np.random.default_rng(7).standard_normal(shape)
    out = np.zeros((*shape[:2], shape[2] * 2, shape[3] * 2))
    upsample_forward(out, x, 2, 0.5)
    assert np.array_equal(out, 0.5 * x.repeat(2, axis=2).repeat(2, axis=3))


@pytest.mark.parametrize("batch,n,groups", [(1, 1000, 1), (2, 30, 3), (40, 1000, 2)])
def test_softmax_matches_numpy(batch, n, groups):
    x = np.random.default_rng(8).standard_normal((batch, n)) * 3
    out = np.zeros_like(x)
    softmax_forward(out, x, groups, 2.0)
    z = x.reshape(batch, groups, -1) / 2.0
    e = np.exp(z - z.max(axis=2, keepdims=True))
    assert_close(out, (e / e.sum(axis=2, keepdims=True)).reshape(x.shape), 1e-12, 1e-15)


# -- im2col / col2im ---------------------------------------------------------------------------------------
def im2col_ref(x, k, sy, sx, pad, dil, oh, ow):
    """Slow numpy im2col of x (nb, c, h, w): (nb, c·k·k, oh·ow), zero outside the image."""
    nb, c, h, w = x.shape
    xp = np.zeros((nb, c, h + 2 * pad + sy * oh + dil * k, w + 2 * pad + sx * ow + dil * k))
    xp[:, :, pad:pad + h, pad:pad + w] = x
    col = np.zeros((nb, c, k, k, oh, ow))
    for ky, kx in itertools.product(range(k), range(k)):
        col[:, :, ky, kx] = xp[:, :, ky * dil:ky * dil + sy * oh:sy, kx * dil:kx * dil + sx * ow:sx]
    return col.reshape(nb, c * k * k, oh * ow)


GEOMS = [  # k, stride_y, stride_x, pad (before dilation), dilation
    (3, 1, 1, 1, 1), (3, 2, 2, 1, 1), (1, 1, 1, 0, 1), (1, 2, 2, 0, 1), (7, 2, 2, 3, 1), (3, 1, 2, 0, 1),
    (3, 3, 1, 2, 1), (3, 1, 1, 1, 2), (5, 2, 1, 3, 2), (2, 1, 1, 4, 1), (3, 2, 2, 1, 2), (2, 2, 2, 1, 1),
    (3, 3, 3, 1, 1),    # stride 3 across: the generic strided walk
]


@pytest.mark.parametrize("k,sy,sx,p,dil", GEOMS)
@pytest.mark.parametrize("nb,c,h,w", [(2, 3, 7, 9), (1, 40, 33, 36), (3, 24, 8, 8), (2, 150, 6, 5)])
def test_im2col_and_col2im_match_reference(k, sy, sx, p, dil, nb, c, h, w):
    """im2col (and im2col_wide, its items side by side) against the slow reference, below and
    above PARALLEL_MIN_COPY, walking padded rows (outputs wider than GATHER_MAX_WIDTH) and through
    the index table (narrower); col2im_add is its adjoint, ADDING into x:
    <im2col(x), g> == <x, col2im(g)> and the added amount is the reference's transpose."""
    pad = p * dil
    oh = (h + 2 * pad - (dil * (k - 1) + 1)) // sy + 1
    ow = (w + 2 * pad - (dil * (k - 1) + 1)) // sx + 1
    rng = np.random.default_rng(k * 100 + sy * 10 + sx)
    x = rng.standard_normal((nb, c, h, w))
    col = np.full((nb, c * k * k, oh * ow), np.nan)
    ic.im2col(col, x, k, sy, sx, pad, dil, oh, ow)
    assert np.array_equal(col, im2col_ref(x, k, sy, sx, pad, dil, oh, ow))
    wide = np.full((c * k * k, nb, oh * ow), np.nan)          # items side by side: the same rows
    ic.im2col_wide(wide, x, k, sy, sx, pad, dil, oh, ow)
    assert np.array_equal(wide, col.transpose(1, 0, 2))
    g = rng.standard_normal(col.shape)
    base = rng.standard_normal(x.shape)
    back = base.copy()
    ic.col2im_add(back, g, k, sy, sx, pad, dil, oh, ow)
    assert math.isclose(float((col * g).sum()), float((x * (back - base)).sum()), rel_tol=1e-10)
    # the adjoint, entry by entry: the gradient of sum(im2col(x) * g) w.r.t. x, by the reference
    onehot = np.zeros(x.shape)
    for idx in [(0, 0, 0, 0), (nb - 1, c - 1, h - 1, w - 1), (0, c // 2, h // 2, w // 3)]:
        onehot[idx] = 1
        assert math.isclose((im2col_ref(onehot, k, sy, sx, pad, dil, oh, ow) * g).sum(),
                            back[idx] - base[idx], rel_tol=1e-9, abs_tol=1e-12)
        onehot[idx] = 0


@pytest.mark.parametrize("k,sy,sx,p,dil", [(3, 1, 1, 1, 1), (3, 2, 2, 1, 1), (2, 1, 3, 0, 1)])
@pytest.mark.parametrize("nb,c,h,w", [(2, 3, 5, 6), (1, 24, 60, 50), (2, 3, 3, 2)])
def test_im2col_larger_output_reads_zeros(k, sy, sx, p, dil, nb, c, h, w):
    """An output larger than the usual formula gives (a caller's choice) reads zeros past the
    padded image, below and above PARALLEL_MIN_COPY, at every stride path."""
    pad = p * dil
    oh = (h + 2 * pad - (dil * (k - 1) + 1)) // sy + 3
    ow = (w + 2 * pad - (dil * (k - 1) + 1)) // sx + 4
    x = np.random.default_rng(c).standard_normal((nb, c, h, w))
    col = np.full((nb, c * k * k, oh * ow), np.nan)
    ic.im2col(col, x, k, sy, sx, pad, dil, oh, ow)
    assert np.array_equal(col, im2col_ref(x, k, sy, sx, pad, dil, oh, ow))


@pytest.mark.parametrize("nb,c,h,w", [(1, 16, 4, 4), (3, 40, 7, 7)])
def test_im2col_table_path_equals_row_walk(nb, c, h, w):
    """On narrow maps the index table and the row walk give the same columns (float32, both
    layouts, a channel slice that is not contiguous across items taking the row walk), and
    col2im through the table the same sums."""
    x = np.random.default_rng(c).standard_normal((nb, 2 * c, h, w)).astype(np.float32)
    assert w <= ic.GATHER_MAX_WIDTH
    for xs in (x, x[:, :c]):            # contiguous: the table; a channel slice: the row walk
        want = np.zeros((nb, c * 9 if xs.shape[1] == c else 2 * c * 9, h * w), np.float32)
        ic._unroll_serial(want, False, np.ascontiguousarray(xs), 3, 1, 1, 1, 1, h, w)
        col = np.full(want.shape, np.nan, np.float32)
        ic.im2col(col, xs, 3, 1, 1, 1, 1, h, w)
        assert np.array_equal(col, want)
        wide = np.full(want.transpose(1, 0, 2).shape, np.nan, np.float32)
        ic.im2col_wide(wide, xs, 3, 1, 1, 1, 1, h, w)
        assert np.array_equal(wide, want.transpose(1, 0, 2))
    # col2im through the table adds in the row walk's order: the same bits, both layouts
    g = np.random.default_rng(1).standard_normal((nb, c * 9, h * w)).astype(np.float32)
    base = np.random.default_rng(2).standard_normal((nb, c, h, w)).astype(np.float32)
    walk, table, walk_w, table_w = base.copy(), base.copy(), base.copy(), base.copy()
    ic._col2im_walk(walk, g, 3, 1, 1, 1, 1, h, w)
    ic.col2im_add(table, g, 3, 1, 1, 1, 1, h, w)
    ic._col2im_wide_walk(walk_w, np.ascontiguousarray(g.transpose(1, 0, 2)), 3, 1, 1, 1, 1, h, w)
    ic.col2im_wide_add(table_w, np.ascontiguousarray(g.transpose(1, 0, 2)), 3, 1, 1, 1, 1, h, w)
    assert np.array_equal(walk, table) and np.array_equal(walk_w, table_w) and not np.array_equal(walk, base)
    assert ic.gather_table(c, h, w, 3, 1, 1, 1, 1, h, w).shape == (c * 9, h * w)
    assert ic.gather_table(4096, 64, 64, 3, 1, 1, 1, 1, 8, 8) is None     # over GATHER_MAX_ENTRIES


def test_gather_tables_kept_within_budget(monkeypatch):
    """Tables past TABLE_BUDGET bytes drop the oldest; a dropped one is built again, equal."""
    monkeypatch.setattr(ic, "_TABLES", {})
    monkeypatch.setattr(ic, "TABLE_BUDGET", 3 * 64 * 9 * 64 * 4)        # three 64-channel 8x8 tables
    first = ic.gather_table(64, 8, 8, 3, 1, 1, 1, 1, 8, 8)
    for c in (65, 66, 67):
        ic.gather_table(c, 8, 8, 3, 1, 1, 1, 1, 8, 8)
    assert sum(t.nbytes for t in ic._TABLES.values()) <= ic.TABLE_BUDGET
    assert (64, 8, 8, 3, 1, 1, 1, 1, 8, 8) not in ic._TABLES
    again = ic.gather_table(64, 8, 8, 3, 1, 1, 1, 1, 8, 8)
    assert again is not first and np.array_equal(again, first) and not again.flags.writeable


# -- training-only kernels with a serial branch (maxpool/upsample backward, softmax cross-entropy) ----
@pytest.mark.parametrize("fresh", [False, True])   # True: the item's row is zeroed, not added into
@pytest.mark.parametrize("items", [2, 40])        # 2: below PARALLEL_MIN, 40: above it
def test_maxpool_backward_both_branches(items, fresh):
    from darkpy.layers.pooling import maxpool_backward
    rng = np.random.default_rng(items)
    n, per_item = 1024, 4096
    idx = rng.integers(0, per_item, (items, n)).astype(np.int32)     # flat into the item
    idx[:, ::7] = -1                                   # outputs without an argmax add nothing
    delta = rng.standard_normal((items, n)).astype(np.float32)
    prev = np.full((items, per_item), 0.5, np.float32)
    assert (delta.size < PARALLEL_MIN) == (items == 2)
    maxpool_backward(prev, delta, idx, fresh)
    ref = np.full((items, per_item), 0.0 if fresh else 0.5)
    for b in range(items):
        keep = idx[b] >= 0
        np.add.at(ref[b], idx[b][keep], delta[b][keep].astype(np.float64))
    assert_close(prev, ref, 1e-6, 1e-6, "maxpool_backward")


@pytest.mark.parametrize("items", [2, 40])
def test_upsample_backward_both_branches(items):
    from darkpy.layers.upsample import upsample_backward
    rng = np.random.default_rng(items)
    delta = rng.standard_normal((items, 16, 30, 32)).astype(np.float32)
    assert (delta.size < PARALLEL_MIN) == (items == 2)
    prev = np.full((items, 16, 15, 16), 0.5, np.float32)
    upsample_backward(prev, delta, 2, np.float32(0.5))
    ref = 0.5 + 0.5 * delta.astype(np.float64).reshape(items, 16, 15, 2, 16, 2).sum((3, 5))
    assert_close(prev, ref, 1e-6, 1e-6, "upsample_backward")


@pytest.mark.parametrize("items", [2, 400])
def test_softmax_xent_both_branches(items):
    from darkpy.layers.softmax import softmax_xent
    rng = np.random.default_rng(items)
    groups, size, temp = 4, 25, 2.0
    x = (rng.standard_normal((items, groups * size)) * 5).astype(np.float32)
    assert (x.size < PARALLEL_MIN) == (items == 2)
    z = x.astype(np.float64).reshape(items, groups, size) / temp
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    p = np.exp(logp).reshape(items, -1).astype(np.float32)
    t = (rng.random(x.shape) < 0.1).astype(np.float32)
    delta, loss = np.zeros_like(x), np.zeros_like(x)
    softmax_xent(delta, loss, p, x, t, groups, temp)
    assert_close(delta, t - p, 1e-6, 1e-7, "softmax_xent delta")
    assert_close(loss, np.where(t != 0, -logp.reshape(items, -1), 0), 1e-5, 1e-5, "softmax_xent loss")


# -- gru/lstm kernels: parallel over rows above PARALLEL_MIN values, serial below -------------------------
RNN_KERNELS = {        # kernel: (number of (b, n) arrays, extra scalar arguments)
    "gru_gates": (8, ()), "gru_output": (6, (A.TANH,)), "gru_backward_out": (7, (A.LOGISTIC,)),
    "gru_backward_reset": (5, ()), "lstm_step": (15, ()), "lstm_backward_step": (12, ()),
}


@pytest.mark.parametrize("name", sorted(RNN_KERNELS))
def test_recurrent_kernels_parallel_equal_serial(name):
    """A batch above PARALLEL_MIN values (parallel rows) gives exactly the values of the same kernel
    run one row at a time (each call far below the threshold: the serial branch)."""
    kernel = getattr(R, name)
    count, extra = RNN_KERNELS[name]
    rows, units = 64, 600
    assert rows * units >= PARALLEL_MIN > units
    rng = np.random.default_rng(9)
    arrays = [rng.uniform(0.05, 0.95, (rows, units)).astype(np.float32) for _ in range(count)]
    par = [a.copy() for a in arrays]
    kernel(*par, *extra)
    ser = [a.copy() for a in arrays]
    for r in range(rows):
        kernel(*[a[r:r + 1] for a in ser], *extra)
    for i, (p, q) in enumerate(zip(par, ser)):
        assert np.array_equal(p, q), f"{name}: array {i} differs"
