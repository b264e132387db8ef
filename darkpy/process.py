"""What the `darkpy` command sets for its own process, and nothing else does.

Importing darkpy changes nothing outside darkpy: no environment variable, warnings filter or thread
setting. The `darkpy` command (`darkpy.cli:entry`, also `python -m darkpy`) is a process of its own,
so it tunes the runtimes it loads, for itself, before numpy or numba load them (both read these
variables once, when their libraries initialise). A value the user already set is kept.

- `OMP_WAIT_POLICY=PASSIVE`: numba's OpenMP workers sleep between parallel regions instead of
  spinning; on a small machine that also runs BLAS and the data loader, spinning threads steal the
  cores (measured on 2 cores: a 60-iteration digits training run took 25.7 s spinning, 3.5 s passive).
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
COMMAND_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}


def set_command_environment(environ=None) -> dict[str, str]:
    """Give the `darkpy` command's process its settings (`COMMAND_ENV`, keeping values already
    set). Returns what the process now has for each. Only the command's entry point calls this."""
    environ = os.environ if environ is None else environ
    for key, value in COMMAND_ENV.items():
        environ.setdefault(key, value)
    return {key: environ[key] for key in COMMAND_ENV}
