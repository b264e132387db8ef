"""Kernels shared by more than one layer family.

Every kernel is an `@jit` function on arrays and scalars only, outputs first, with the shape of each
array argument in a comment. `jit` is the one place compile flags live. Kernels are dtype-generic:
the same source runs in float32 for real work and float64 for gradient checks (numba compiles one
specialisation per dtype, cached on disk).
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numba
from numba.np.ufunc import parallel as _numba_parallel

# (numba's OpenMP workers spin ~3 ms after a parallel region by default: the `darkpy` command sets
# GOMP_SPINCOUNT=30000, a few hundred µs, for its own process, see darkpy/process.py; importing darkpy sets
# nothing.)


def thread_count() -> int:
    """numba.get_num_threads(), without the public function's pool-launch check once the pool is
    up (0.2 against 0.65-1.5 µs a call: each kernel's Python side asks, a few times per pass of a
    small network at batch 1)."""
    getter = getattr(_numba_parallel, "_get_num_threads", None)
    if getter is None or not getattr(_numba_parallel, "_is_initialized", False):
        return numba.get_num_threads()
    n = getter()
    return n if n > 0 else numba.get_num_threads()


#: What a source file mentions when it holds or calls numba kernels (`jit`), or extends what
#: numba compiles into them (`intrinsic`: kernels/simd.py, kernels/borrow.py, which mention no jit).
_KERNEL_WORDS = (b"jit", b"intrinsic")


def fingerprint(root: Path) -> str:
    """A hash of the source files under `root` that hold, call or extend numba kernels (that
    mention one of _KERNEL_WORDS), with their paths."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        text = path.read_bytes()
        if any(word in text for word in _KERNEL_WORDS):
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + text + b"\0")
    return h.hexdigest()


@functools.cache
def sources_fingerprint() -> str:
    """`fingerprint` of the darkpy package (~5 ms, once): part of each kernel's on-disk cache key
    (`njit`)."""
    return fingerprint(Path(__file__).resolve().parent.parent)


def njit(func=None, **flags):
    """`numba.njit(**flags)`, whose on-disk cache (with cache=True) is also keyed on
    `sources_fingerprint()`. numba keys a cached kernel on its own file's text only, so a kernel
    whose file did not change kept its cached machine code when code it inlines or calls from
    another file, or a constant it reads when it compiles (PARALLEL_MIN), changed: after a
    `git pull` in an editable install, or an upgrade that left the old caches beside the new files
    (pip does not remove them), it ran the old code. The key is set on numba's cache object of
    this dispatcher only (numba's own attributes, read defensively: a numba without them caches as
    it did; tests/test_kernel_cache.py checks they are there)."""
    if func is None:
        return lambda f: njit(f, **flags)
    dispatcher = numba.njit(**flags)(func)
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    stamp = getattr(cache_file, "_source_stamp", None)
    if stamp is not None:
        cache_file._source_stamp = (stamp, sources_fingerprint())
    return dispatcher


#: Serial kernel: cached on disk, releases the GIL (so the data loader thread can run beside it).
jit = functools.partial(njit, cache=True, nogil=True)
#: Serial kernel as `jit` whose float divisions follow IEEE (x/0 gives ±inf or NaN) instead of
#: checking for zero and raising: the check stops the compiler vectorising a loop that divides
#: (a division-heavy loop ran 10× slower). Results are otherwise the same bits.
vjit = functools.partial(njit, cache=True, nogil=True, error_model="numpy")
#: Parallel kernel: as `jit`, with `prange` loops spread over numba's thread pool.
pjit = functools.partial(njit, cache=True, nogil=True, parallel=True)

#: Values a `pjit` kernel must touch before it runs its loop in parallel. Waking numba's threads
#: costs ~6-10 µs per parallel region (measured on 2 cores, more under load), about what one core
#: needs to pass over 32k floats; below this size every `pjit` kernel takes its serial branch
#: (`if n < PARALLEL_MIN: ... range ... else: ... prange ...`), which starts no thread at all.
#: Batch-1 inference runs dozens of such small kernels per image. (A kernel module reads it when
#: it compiles: clear the numba cache after changing it.)
#:
#: Not higher for the row kernels (bias/BN passes, maxpool): their serial branch is itself slower
#: than their prange loop run on one thread when rows are short (bias + leaky backward on 131k
#: values in rows of 64: 163 µs serial branch, 50 µs prange on 1 thread; BN backward 233 vs
#: 138 µs), so raising their threshold cost more at one thread than it saved at two.
PARALLEL_MIN = 1 << 15
#: PARALLEL_MIN_FLAT: the flat kernels whose two branches run the same vectorised span function, one
#: cheap pass per value (leaky/relu/linear activation and its gradient, shortcut add): ~0.1 ns per
#: value, bound by memory. Measured on a loaded 2-core Zen (1 vs 2 threads interleaved, 10th
#: percentile of 300 calls, load ~3.4), 2 threads against 1: leaky activation 1.71x at 131k values,
#: 1.18x at 524k, 1.11x at 1M, 0.67x at 2M; shortcut add + leaky 1.43x, 1.00x, 1.09x, 1.07x; hence
#: 1M until 2026-12-05. On the 2-core AVX-512 Xeon VM one core moves memory at a third of what two
#: do (a 2.8 MB copy: 187 µs on one thread, 75 on two), and at 64k resnet50's shortcuts at b1
#: (256 x 56 x 56 = 802k values down to 1024 x 14 x 14) took 0.53-0.65x the time within its forward
#: (2 threads, against 1M; the whole forward 0.95-0.96x).
PARALLEL_MIN_FLAT = 1 << 16
