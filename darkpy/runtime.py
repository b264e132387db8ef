"""The run's machinery: thread counts for numba and BLAS, and whether a first run must compile kernels."""
from __future__ import annotations

import os
from pathlib import Path

COMPILING_NOTICE = "First run: compiling numba kernels (cached afterwards, so later runs start fast)"


def configure_threads(threads: int) -> int:
    """Set numba's thread count (0 = all cores), and BLAS's when threadpoolctl is installed.

    Process-wide: only the `darkpy` command and functions given a thread count call it (importing
    darkpy sets nothing; see darkpy/process.py for what the command also sets for itself)."""
    import numba

    n = numba.config.NUMBA_NUM_THREADS if threads <= 0 else min(threads, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        pass   # BLAS keeps its own default: environment variables set now would be too late
    else:
        threadpool_limits(limits=n)
        from . import blas
        blas.configure(n)     # small GEMMs of darkpy.blas.matmul on one BLAS thread (see there)
    return n


def kernels_need_compiling(net, training: bool = True) -> bool:
    """True when the first run will compile kernels: some module the run uses (the layers' families,
    the image code, and the optimiser when `training`) has numba kernels but none of them cached on
    disk yet. A heuristic (a module cached by a run that used only part of it counts as cached),
    good enough to announce the minute a first run spends compiling. Inference passes
    `training=False`: it never runs the optimiser, so its kernels are never cached by it."""
    import sys

    from numba.core.registry import CPUDispatcher

    modules = {type(layer).__module__ for layer in net.layers} | {"darkpy.images"}
    if training:
        modules.add("darkpy.optim")
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    for name in modules:
        mod = sys.modules.get(name)
        if mod is None or not getattr(mod, "__file__", None):
            continue
        stem = Path(mod.__file__).stem
        kernels = [obj.py_func.__qualname__ for obj in vars(mod).values()
                   if isinstance(obj, CPUDispatcher) and obj.py_func.__module__ == name]
        if not kernels:
            continue
        where = Path(cache_dir) if cache_dir else Path(mod.__file__).parent / "__pycache__"
        search = where.rglob if cache_dir else where.glob
        if not any(any(search(f"{stem}.{q}-*.nbi")) for q in kernels):
            return True
    return False
