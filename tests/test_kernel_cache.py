"""The kernels' on-disk cache is keyed on every darkpy source file that holds or calls kernels, not
only on the kernel's own file (darkpy/kernels/__init__.py: `njit`): a kernel whose file did not
change but whose inlined helpers (another file) did is compiled again, not loaded stale.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import darkpy.kernels as kernels
from darkpy.kernels import bn, direct, direct_fv, fv_tiles, pool2x2

ROOT = Path(__file__).resolve().parents[1]


def test_every_kind_of_kernel_carries_the_sources_fingerprint():
    """`jit`, `vjit`, `pjit` and the modules' own `njit(...)` flags: numba's cache object of each
    holds the key (this fails, rather than caching stale code quietly, if numba renames it)."""
    for kernel in (pool2x2.max4, bn.affine_act_row, direct.twins(direct.S1)[1],
                   direct_fv._forward_serial, fv_tiles._tile8):
        stamp = kernel._cache._cache_file._source_stamp
        assert isinstance(stamp, tuple) and stamp[1] == kernels.sources_fingerprint(), kernel


def test_the_fingerprint_follows_kernel_sources_only(tmp_path):
    pkg = tmp_path / "darkpy"
    shutil.copytree(ROOT / "darkpy", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = kernels.fingerprint(pkg)
    assert before == kernels.sources_fingerprint()
    (pkg / "notes.py").write_text("# no kernels here\n")
    assert kernels.fingerprint(pkg) == before
    helper = pkg / "kernels" / "pool2x2.py"
    helper.write_text(helper.read_text() + "\n# changed\n")     # a helper other files inline
    changed = kernels.fingerprint(pkg)
    assert changed != before
    # intrinsics compiled into kernels, in files that mention no jit (kernels/borrow.py: which
    # arrays numba may treat as aliases decides which writes it keeps)
    extension = pkg / "kernels" / "borrow.py"
    assert b"jit" not in extension.read_bytes()
    extension.write_text(extension.read_text() + "\n# changed\n")
    assert kernels.fingerprint(pkg) != changed


_RUN = """
import sys
import pytest

import darkpy.kernels as kernels
if sys.argv[1] != "-":
    kernels.sources_fingerprint = lambda: sys.argv[1]       # as if another file had changed
from darkpy.kernels import pool2x2
pool2x2.max4(1.0, 2.0, 3.0, 4.0)
print(sum(pool2x2.max4.stats.cache_hits.values()), sum(pool2x2.max4.stats.cache_misses.values()))
"""


def test_a_cached_kernel_is_compiled_again_when_other_kernel_sources_change(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}

    def run(fp: str) -> tuple[int, int]:
        done = subprocess.run([sys.executable, "-c", _RUN, fp], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=300)
        assert done.returncode == 0, done.stderr
        hits, misses = map(int, done.stdout.split())
        return hits, misses

    assert run("-") == (0, 1)              # compiled and cached
    assert run("-") == (1, 0)              # loaded
    assert run("other sources") == (0, 1)  # not loaded: compiled again
    assert run("other sources") == (1, 0)


_LITERALS = """
import gc
import inspect
import numpy as np
from numba.core import types
from numba.core.registry import CPUDispatcher
from darkpy.kernels import direct, direct_fv, pointwise
rng = np.random.default_rng(0)
x = rng.standard_normal((8, 8, 16, 16)).astype(np.float32)
w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
k, off = np.ones(16), np.zeros(16)
for b in (1, 8):                                    # the serial twins, then the parallel ones
    direct.conv_forward(np.empty((b, 16, 16, 16), np.float32), x[:b], w, 1, 1, 1, 4)
    direct.conv_forward(np.empty((b, 16, 16, 16), np.float32), x[:b], w, 1, 1, 1, 4, k, off, 7,
                        pool=np.empty((b, 16, 8, 8), np.float32))
    wt = np.empty(w[0].size * direct_fv.padded_filters(16), np.float32)
    direct_fv.filters_last(wt, w)
    direct_fv.conv_forward(np.empty((b, 16, 14, 14), np.float32), x[:b], wt, 3, 1, 1, 0)
direct.conv_forward(np.empty((1, 16, 16, 16), np.float32), x[:1, :3].copy(), w[:, :3].copy(), 1, 1,
                    1, 4)                           # another kind of the direct path
pointwise.conv_forward(np.empty((1, 16, 64), np.float32),
                       x[:1].reshape(1, 8, 256)[:, :, :64].copy(), w[:, :, 0, 0].copy(), k, off, 7)
for d in gc.get_objects():
    if isinstance(d, CPUDispatcher) and d.py_func.__module__.startswith("darkpy"):
        names = list(inspect.signature(d.py_func).parameters)
        plain = {tuple(a if n == "kind" else types.unliteral(a) for n, a in zip(names, sig))
                 for sig in d.signatures}
        if len(plain) < len(d.signatures):
            print(d.py_func.__module__ + "." + d.py_func.__name__, d.signatures)
print("scanned")
"""


@pytest.mark.slow
def test_no_kernel_is_compiled_again_for_a_literal_argument(tmp_path):
    """numba types a call whose argument starts as a literal (a counter from 0) first with the
    literal, then with int64, and compiles the callee for both: the direct 3x3 passes had been
    compiled four times (seconds each of a cold start). In a fresh cache, the direct and 1x1
    kernels (pooled and unpooled; serial and parallel twins, which share their units) leave no
    darkpy kernel with two signatures that differ only by a literal, other than the direct path's
    `kind` (a literal on purpose: one compiled version per kind of layer)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _LITERALS], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "scanned", done.stdout
