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

from darkpy.kernels import direct as dk
from darkpy.kernels import winograd as wg


def _parfor_lines(kernel, *args):
    """(file:line, source) of every parfor of a fresh parallel compilation of `kernel` on args."""
    options = {k: v for k, v in kernel.targetoptions.items() if k not in ("cache", "nopython")}
    fresh = numba.njit(**options)(kernel.py_func)
    fresh(*args)
    diagnostics = fresh.get_metadata(fresh.signatures[0])["parfor_diagnostics"]
    return [(f"{pf.loc.filename}:{pf.loc.line}", linecache.getline(pf.loc.filename, pf.loc.line))
            for pf in diagnostics.get_parfors()]


def _direct_args(kind):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    y = np.zeros((2, 4, 9, 8), np.float32)
    rows = dk.block_rows(9, 8, 3, 1)
    if kind == "forward":
        return y, x, w, 1, 1, 1, rows
    return np.zeros_like(w), x, rng.standard_normal(y.shape).astype(np.float32), 1, 1, 1, rows


def _winograd_inputs_args():
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 6)).astype(np.float32)
    th, tw = wg.tiles(7, 6)
    return np.zeros((16, 3, 2 * th * tw), np.float32), x, 1


def _winograd_outputs_args():
    th, tw = wg.tiles(7, 6)
    m = np.random.default_rng(2).standard_normal((16, 4, 2 * th * tw)).astype(np.float32)
    return np.zeros((2, 4, 7, 6), np.float32), m, False


CASES = {
    "direct forward": (dk._conv_forward_parallel, lambda: _direct_args("forward")),
    "direct weight gradient": (dk._weight_grad_parallel, lambda: _direct_args("wgrad")),
    "winograd inputs": (wg.inputs, _winograd_inputs_args),
    "winograd outputs": (wg.outputs, _winograd_outputs_args),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_parallel_kernel_has_only_its_prange_loops(name):
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
