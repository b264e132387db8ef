"""Parallel kernels open no parallel region besides their `prange` loops.

In a numba `parallel=True` function every array expression (`np.zeros(...)`, `a += b`, `a[:] = 0`),
including those of helpers inlined into it, becomes a parallel region of its own: each wakes the
thread pool, which costs more than the work on the small arrays involved. Each kernel here is
recompiled without the disk cache (cached code carries no diagnostics), run once, and numba's list
of its parallel loops (parfors) checked: every one must come from a `prange` line."""
from __future__ import annotations

import linecache

import numba
import numpy as np
import pytest
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, PassManager, register_pass

from darkpy.kernels import activations as act
from darkpy.kernels import attention as attk
from darkpy.kernels import bn as bnk
from darkpy.kernels import cblas
from darkpy.kernels import direct as dk
from darkpy.kernels import direct_blocks as db
from darkpy.kernels import direct_fv as fv
from darkpy.kernels import direct_fv_border as fvb
from darkpy.kernels import direct_wgrad as dwg
from darkpy.kernels import gemm
from darkpy.kernels import pointwise as pw
from darkpy.kernels import simd
from darkpy.kernels import winograd as wg
from darkpy.kernels import winograd_fused as wgf
from darkpy import optim
from darkpy.layers import conv_averaged, gated, layernorm, mha, pooling, shortcut, upsample, xent


class _Parfors(Exception):
    """Raised by `_StopAfterParfors` with the compilation's parfor diagnostics."""

    def __init__(self, diagnostics):
        super().__init__("parfor diagnostics")
        self.diagnostics = diagnostics


@register_pass(mutates_CFG=False, analysis_only=True)
class _StopAfterParfors(FunctionPass):
    """Ends a compilation once numba's parallel passes have made (and fused) its parfors."""
    _name = "darkpy_stop_after_parfors"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        raise _Parfors(state.metadata["parfor_diagnostics"])


class _UpToParfors(CompilerBase):
    """numba's nopython pipeline without its lowering: the parfors are all there, and the LLVM
    code generation of a large parallel kernel (most of a fresh compile's time) is skipped."""

    def define_pipelines(self):
        pm = PassManager("up to parfors")
        pm.passes.extend(DefaultPassBuilder.define_untyped_pipeline(self.state).passes)
        pm.passes.extend(DefaultPassBuilder.define_typed_pipeline(self.state).passes)
        pm.add_pass(_StopAfterParfors, "stop after the parfor passes")
        pm.finalize()
        return [pm]


def _parfor_lines(kernel, *args):
    """(file:line, source) of every parfor of a fresh parallel compilation of `kernel` on args."""
    options = {k: v for k, v in kernel.targetoptions.items() if k not in ("cache", "nopython")}
    fresh = numba.njit(pipeline_class=_UpToParfors, **options)(kernel.py_func)
    with pytest.raises(_Parfors) as stopped:
        fresh(*args)
    return [(f"{pf.loc.filename}:{pf.loc.line}", linecache.getline(pf.loc.filename, pf.loc.line))
            for pf in stopped.value.diagnostics.get_parfors()]


def _direct_args(kind):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    y = np.zeros((2, 4, 9, 8), np.float32)
    rows = db.block_rows(9, 8, 3, 1)
    if kind == "forward":
        pool = np.zeros((2, 4, 4, 4), np.float32)      # the pooled branch (even rows: 8x8)
        return np.zeros((2, 4, 8, 8), np.float32), x[:, :, :8].copy(), w, 1, 1, 1, 2, np.ones(4), \
            np.zeros(4), 0, pool, 2
    return np.zeros_like(w), x, rng.standard_normal(y.shape).astype(np.float32), 1, 1, 1, rows


def _border_args():
    """kernels/direct_fv_border.py's forward writing a pooled output (its epilogue after the maxima)."""
    w = _f32(40, 16, 3, 3)
    wt = np.empty(w[0].size * fv.padded_filters(40), np.float32)
    fv.filters_last(wt, w)
    pv = fv.tile_positions(16 * 9, 16)
    tables = fvb.tables(8, 16, 4, 4, 40, 3, 1, 4, 4, pv)
    return (np.zeros((8, 40, 4, 4), np.float32), _f32(8, 16, 4, 4), wt, 3, np.ones(40), np.zeros(40),
            act.LEAKY, False, True, np.zeros((8, 40, 2, 2), np.float32), np.empty(0, np.float32), 2, *tables,
            pv)


def _fv_padded_args():
    """kernels/direct_fv.py's parallel forward of a padded layer in a batch (its padding loop a
    prange of its own), through the epilogue."""
    w = _f32(40, 16, 3, 3)
    wt = np.empty(w[0].size * fv.padded_filters(40), np.float32)
    fv.filters_last(wt, w)
    x = _f32(3, 16, 4, 4)
    return (np.zeros((3, 40, 16), np.float32), x, wt,
            *fv.prepared(x, 3, 1, 1, 1, 4, 4, np.ones(40), np.zeros(40), 40), 1, act.LEAKY, False,
            fv.CHUNK_BYTES, fv.PREFETCH, np.empty((0, 0, 0, 0), np.float32), 2)


def _winograd_inputs_args():
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 6)).astype(np.float32)
    th, tw = wg.tiles(7, 6)
    return np.zeros((16, 3 * 2 * th * tw), np.float32), x, 1


def _winograd_outputs_args():
    th, tw = wg.tiles(8, 6)
    m = np.random.default_rng(2).standard_normal((16, 4, 2 * th * tw)).astype(np.float32)
    pool = np.zeros((2, 4, 4, 3), np.float32)          # the pooled branch too
    mean = np.zeros((2, 4), np.float32)                 # and the means' (the pool's taken first)
    return np.zeros((2, 4, 8, 6), np.float32), *wg.matrices_flat(m), False, np.ones(4), np.zeros(4), 0, pool, mean


def _f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _bn_args(kind):
    y, c = _f32(2, 3, 8), np.ones(3, np.float32)
    if kind == "train":
        return y, np.zeros_like(y), c * 0, c * 0, c * 0, c.copy(), c, c * 0, act.LEAKY, False
    if kind == "infer":
        return y, c * 0, c, c, c * 0, act.LEAKY, False
    return (y, _f32(2, 3, 8, seed=1), _f32(2, 3, 8, seed=2), c, c, c * 0, c * 0, c * 0, act.LEAKY,
            np.zeros_like(y), False)


def _maxpool_args(kind):
    x = _f32(2, 3, 4, 4)
    if kind == "planes":
        return np.zeros((2, 3, 2, 2), np.float32), np.zeros((2, 3, 2, 2), np.int32), x, 2, 2, 2, 0, True
    if kind == "rows":
        return np.zeros((12, 2), np.float32), np.zeros((12, 2), np.int32), x.reshape(24, 4), 6, True
    if kind == "odd":                   # 3x3 maps -> 2x2
        return (np.zeros((12, 2), np.float32), np.zeros((12, 2), np.int32), _f32(2, 3, 3, 3).reshape(18, 3),
                3, 2, 3, 2, True)
    return np.zeros((2, 48), np.float32), _f32(2, 12), np.zeros((2, 12), np.int32), True


def _shortcut_args(kind):
    a, b = _f32(2, 3, 4, 4), _f32(2, 3, 4, 4, seed=1)
    if kind == "add":
        return a, b, 1.0, 1.0, 1, 1, 3, 4, 4
    if kind == "backward":
        return a, b, _f32(2, 3, 4, 4, seed=2), 0.5, 1.0, 1, 1, 3, 4, 4
    if kind == "add_act":
        return (a.reshape(2, -1), np.zeros((2, 0), np.float32), b.reshape(2, -1), b.reshape(2, -1), np.float32(1), np.float32(1),
                act.LEAKY, False, 48)
    if kind == "add_flat":
        return a.reshape(2, -1), b.reshape(2, -1), 1.0, 1.0, 48
    return a.reshape(2, -1), b.reshape(2, -1), _f32(2, 48, seed=2), 0.5, 1.0, 48


def _rnn_args(n_arrays, *extra):
    return tuple(_f32(2, 5, seed=i) for i in range(n_arrays)) + extra


CASES = {
    "activate": (act.activate, lambda: (_f32(100), act.LEAKY)),
    "activation gradient": (act.gradient, lambda: (_f32(100), _f32(100, seed=1), _f32(100, seed=2), act.LEAKY)),
    "bias+act forward": (bnk.bias_act_forward, lambda: (_f32(2, 3, 8), _f32(2, 3, 8), _f32(3), act.LEAKY, False)),
    "bias+act backward": (bnk.bias_act_backward, lambda: (_f32(2, 3, 8), _f32(2, 3, 8), _f32(2, 3, 8), _f32(3), act.LEAKY)),
    "bias+act forward rows": (bnk.bias_act_forward_rows, lambda: (_f32(2, 3), _f32(2, 3), _f32(3), act.LEAKY, False)),
    "bias+act backward rows": (bnk.bias_act_backward_rows, lambda: (_f32(2, 3), _f32(2, 3), _f32(2, 3), _f32(3),
                                                                     act.LEAKY)),
    "bn forward train": (bnk.bn_act_forward_train, lambda: _bn_args("train")),
    "bn forward infer": (bnk.bn_act_forward_infer, lambda: _bn_args("infer")),
    "bn backward": (bnk.bn_act_backward, lambda: _bn_args("backward")),
    "maxpool planes": (pooling.maxpool_forward, lambda: _maxpool_args("planes")),
    "maxpool 2x2 rows": (pooling.maxpool_2x2_rows, lambda: _maxpool_args("rows")),
    "maxpool 2x2 planes": (pooling.maxpool_2x2_planes, lambda: _maxpool_args("odd")),
    "maxpool backward": (pooling.maxpool_backward, lambda: _maxpool_args("backward")),
    "upsample forward": (upsample.upsample_forward, lambda: (np.zeros((2, 3, 8, 8), np.float32), _f32(2, 3, 4, 4), 2, 1.0)),
    "upsample backward": (upsample.upsample_backward, lambda: (np.zeros((2, 3, 4, 4), np.float32), _f32(2, 3, 8, 8), 2, 1.0)),
    "shortcut add": (shortcut.shortcut_add, lambda: _shortcut_args("add")),
    "shortcut backward": (shortcut.shortcut_backward, lambda: _shortcut_args("backward")),
    "shortcut add+act": (shortcut.shortcut_prefix_add_act, lambda: _shortcut_args("add_act")),
    "shortcut add flat": (shortcut.shortcut_add_flat, lambda: _shortcut_args("add_flat")),
    "shortcut backward flat": (shortcut.shortcut_backward_flat, lambda: _shortcut_args("backward_flat")),
    "gru gates": (gated.gru_gates, lambda: _rnn_args(8)),
    "gru output": (gated.gru_output, lambda: _rnn_args(6, act.TANH)),
    "gru backward out": (gated.gru_backward_out, lambda: _rnn_args(7, act.TANH)),
    "gru backward reset": (gated.gru_backward_reset, lambda: _rnn_args(5)),
    "lstm step": (gated.lstm_step, lambda: _rnn_args(15)),
    "lstm backward step": (gated.lstm_backward_step, lambda: _rnn_args(12)),
    "direct forward": (dk.twins(dk.S1_FEW)[1], lambda: _direct_args("forward")),
    "direct weight gradient": (dwg._weight_grad_parallel, lambda: _direct_args("wgrad")),
    "direct across filters, border": (fvb._forward_parallel, _border_args),
    "direct across filters, padded": (fv._forward_parallel, _fv_padded_args),
    "winograd inputs": (wg.inputs, _winograd_inputs_args),
    "winograd outputs": (wg._outputs_parallel, _winograd_outputs_args),
    "winograd fused bands": (wgf.conv3x3, lambda: (np.zeros((2, 8, 6, 6), np.float32), _f32(2, 4, 6, 6),
                                                   _f32(16 * 32 + 15 * 16), 32 + 16, 1, False, np.empty(0),
                                                   np.empty(0), 0, np.empty((0, 0, 0, 0), np.float32), 2, 2,
                                                   np.empty(0, np.float32), 1)),
    "winograd fused weight gradient": (wgf.weight_grad3x3, lambda: (np.zeros((2, 16, 4, simd.LANES), np.float32),
                                                            _f32(2, 4, 6, 6), _f32(2, 8, 6, 6, seed=1), 1, 2,
                                                            np.empty(0, np.float32), 1)),
    "crossentropy forward": (xent.xent_forward, lambda: (_f32(2, 5), _f32(2, 5), _f32(2, 5), np.zeros(2), _f32(2, 5, seed=1),
                                                         np.array([1, -1]), np.zeros((0, 5)), 0.1, 1.0, True)),
    "attention softmax": (mha.softmax_masked, lambda: (_f32(2, 2, 4, 4), 0.5, True, np.zeros((2, 4), np.uint8))),
    "attention softmax backward": (mha.softmax_backward, lambda: (_f32(2, 2, 4, 4), _f32(2, 2, 4, 4, seed=1), 0.5)),
    "fused attention": (attk.attention_forward, lambda: (_f32(2, 2, 5, 5), _f32(10, 2 * attk.CV),
                                                         _f32(10, 6 * attk.CV, seed=1), 0.5, True,
                                                         np.zeros((0, 0), np.uint8))),
    "fused attention backward": (attk.attention_backward, lambda: (
        _f32(10, 6 * attk.CV), _f32(2, 2, 5, 5), _f32(2, 2, 5, 5, seed=1), _f32(10, 2 * attk.CV, seed=2),
        _f32(10, 6 * attk.CV, seed=3), 0.5, True)),
    "averaged 1x1 product, filters by items": (conv_averaged._product_blocked, lambda: (
        np.zeros((3, 10), np.float32), _f32(3, 8), _f32(10, 8, seed=1), np.ones(10), np.zeros(10), 2,
        np.zeros((8, simd.LANES), np.float32), np.zeros((10, simd.LANES), np.float32))),
    "adamw step": (optim.adamw_step, lambda: (*(_f32(40, seed=i) for i in range(4)), 1e-3, 2, 0.9, 0.99, 1e-8, 3, 0.01)),
    "sum of squares": (optim.sum_squares, lambda: (_f32(100),)),
    "gemm": (gemm.matmul, lambda: (_f32(16, 2 * simd.LANES), _f32(16, 5), _f32(5, 2 * simd.LANES, seed=1), False,
                                   False, False, 4, _f32(2 * simd.LANES, seed=2))),
    "gemm, transposed left operand": (gemm.matmul, lambda: (_f32(16, 2 * simd.LANES), _f32(5, 16),
                                                            _f32(5, 2 * simd.LANES, seed=1), False, True, True, 4,
                                                            np.empty(0, np.float32))),
    "split sgemm": (cblas.split_stacked_sgemm, lambda: (0, 0, cblas.NO_TRANS, 8, 0, 0, cblas.NO_TRANS, 24, 0,
                                                        16, 24, 8, 1, 2, True)),
    "packed 1x1": (pw._packed_parallel, lambda: (np.zeros((1, 16, 40), np.float32), _f32(1, 8, 40), _f32(16, 8),
                                              np.ones(16), np.zeros(16), act.LEAKY, _f32(2 * 8 * 2 * simd.LANES),
                                              256, 8, 1, True)),
    "gemm packing": (gemm.pack_transposed, lambda: (_f32(3 * simd.LANES * 5), _f32(3 * simd.LANES, 5))),
    "layernorm forward": (layernorm.layernorm_forward, lambda: (_f32(4, 20), _f32(4, 20), _f32(4, 1), _f32(4, 20, seed=1),
                                                                _f32(20), _f32(20, seed=2), 1e-5)),
    "layernorm backward": (layernorm.layernorm_backward, lambda: (_f32(40, 20), _f32(20), _f32(20), _f32(40, 20, seed=1),
                                                                  _f32(40, 20, seed=2), _f32(40, 1), _f32(20), True)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_parallel_kernel_has_only_its_prange_loops(name):
    if name == "split sgemm" and not cblas.load():
        pytest.skip("numpy's OpenBLAS has no ILP64 cblas_sgemm: the split GEMM is never compiled")
    kernel, make_args = CASES[name]
    lines = _parfor_lines(kernel, *make_args())
    assert lines, "no parallel loop at all: the kernel is not the parallel one"
    stray = [f"{where}: {src.strip()}" for where, src in lines if "prange" not in src]
    assert not stray, "parallel regions outside prange loops:\n" + "\n".join(stray)


def test_the_check_sees_an_array_expression_region():
    """The check itself: a serial-looking array expression in a parallel function is reported."""
    @numba.njit(parallel=True)
    def kernel(a):
        a[:] = 0                                    # a parallel region of its own
        for i in numba.prange(a.shape[0]):
            a[i] += i
    lines = _parfor_lines(kernel, np.ones(10))
    assert sum("prange" not in src for _, src in lines) == 1
