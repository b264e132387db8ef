"""What the `darkpy` command sets for its own process, and nothing else does.

Importing darkpy changes nothing outside darkpy: no environment variable, warnings filter or thread
setting. The `darkpy` command (`darkpy.cli:entry`, also `python -m darkpy`) is a process of its own,
so it tunes the runtimes it loads, for itself, before numpy or numba load them (both read these
variables once, when their libraries initialise). A value the user already set is kept.

- `GOMP_SPINCOUNT=30000`: numba's OpenMP workers spin about 30000 rounds (a few hundred µs)
  after a parallel region, then sleep. The next region, usually microseconds later, finds them
  awake instead of paying a wake-up (6-100 µs, machine-dependent), and they sleep before long
  (libgomp's default spins ~300,000 rounds). A large GEMM runs on those same workers
  (darkpy/kernels/cblas.py), not on OpenBLAS's own threads that spinning workers would keep off the
  cores. Until 2026-12-02 the command set `OMP_WAIT_POLICY=PASSIVE` (no spinning), then
  `GOMP_SPINCOUNT=2000` until 2026-12-05; the measurements that moved it are in README.md,
  "Sleeping or spinning workers". Not set when the user set `OMP_WAIT_POLICY` (their policy
  stands: PASSIVE still means sleeping workers).
- `OPENBLAS_THREAD_TIMEOUT=4`: OpenBLAS's workers sleep right after a GEMM instead of spinning for
  2^28 cycles, which held the cores numba's kernels need next (measured on 2 cores: batch-1
  inference 20 % and a cifar training step 27 % faster).

Child processes the command starts inherit them. Library users who want the same set them in their
own environment before importing numpy (`COMMAND_ENV` lists them); thread counts are set by
`darkpy.train.configure_threads`, which the command calls with its `--threads`/settings value.

This module imports nothing heavy: it must run before numpy is loaded.
"""
from __future__ import annotations

import os

#: The variables the `darkpy` command sets for itself (unless already set), and why: see above.
COMMAND_ENV = {"GOMP_SPINCOUNT": "30000", "OPENBLAS_THREAD_TIMEOUT": "4"}
#: A variable the user may set instead of one of COMMAND_ENV: with it set, that one is not.
USER_INSTEAD = {"GOMP_SPINCOUNT": "OMP_WAIT_POLICY"}


def set_command_environment(environ=None) -> dict[str, str]:
    """Give the `darkpy` command's process its settings (`COMMAND_ENV`, keeping values already
    set, and setting none whose `USER_INSTEAD` variable is set). Returns what the process now has
    for each of them and those ("unset" where nothing). Only the command's entry point calls this."""
    environ = os.environ if environ is None else environ
    for key, value in COMMAND_ENV.items():
        if not (key in USER_INSTEAD and USER_INSTEAD[key] in environ):
            environ.setdefault(key, value)
    keys = [*COMMAND_ENV, *USER_INSTEAD.values()]
    return {key: environ.get(key, "unset") for key in keys}
