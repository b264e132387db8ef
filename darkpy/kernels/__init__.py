"""Kernels shared by more than one layer family.

Every kernel is an `@jit` function on arrays and scalars only, outputs first, with the shape of each
array argument in a comment. `jit` is the one place compile flags live. Kernels are dtype-generic:
the same source runs in float32 for real work and float64 for gradient checks (numba compiles one
specialisation per dtype, cached on disk).
"""
from __future__ import annotations

import functools

import numba

# (numba's OpenMP workers spin between parallel regions by default: the `darkpy` command sets
# OMP_WAIT_POLICY=PASSIVE for its own process, see darkpy/process.py; importing darkpy sets nothing.)

#: Serial kernel: cached on disk, releases the GIL (so the data loader thread can run beside it).
jit = functools.partial(numba.njit, cache=True, nogil=True)
#: Serial kernel as `jit` whose float divisions follow IEEE (x/0 gives ±inf or NaN) instead of
#: checking for zero and raising: the check stops the compiler vectorising a loop that divides
#: (a division-heavy loop ran 10× slower). Results are otherwise the same bits.
vjit = functools.partial(numba.njit, cache=True, nogil=True, error_model="numpy")
#: Parallel kernel: as `jit`, with `prange` loops spread over numba's thread pool.
pjit = functools.partial(numba.njit, cache=True, nogil=True, parallel=True)

#: Values a `pjit` kernel must touch before it runs its loop in parallel. Waking numba's threads
#: costs ~10 µs per parallel region (measured on 2 cores, more under load), about what one core
#: needs to pass over 32k floats; below this size every `pjit` kernel takes its serial branch
#: (`if n < PARALLEL_MIN: ... range ... else: ... prange ...`), which starts no thread at all.
#: Batch-1 inference runs dozens of such small kernels per image. (A kernel module reads it when
#: it compiles: clear the numba cache after changing it.)
PARALLEL_MIN = 1 << 15
