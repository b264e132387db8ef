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
- `OPENBLAS_CORETYPE=SkylakeX`, only on an x86 CPU with AVX-512 that the OpenBLAS in numpy's wheel
  (0.3.31) does not know, AMD family 1Ah (Zen 5) and later: it runs its Haswell (AVX2) kernels
  there. Measured on a 2-core Zen 5 (AMD EPYC, family 26): numpy sgemm 2048³ 103 → 190 GFLOP/s on
  one thread, 205 → 364 on two; a cifar batch-64 forward 1.3x and a darknet19 batch-1 forward
  1.4-1.7x faster. Its AVX-512 kernels need AVX-512 F, CD, BW, DQ and VL, which are checked.

Child processes the command starts inherit them. Library users who want the same set them in their
own environment before importing numpy (`COMMAND_ENV` lists them); thread counts are set by
`darkpy.train.configure_threads`, which the command calls with its `--threads`/settings value.

This module imports nothing heavy: it must run before numpy is loaded.
"""
from __future__ import annotations

import os

#: The variables the `darkpy` command sets for itself (unless already set), and why: see above.
COMMAND_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}

#: The AVX-512 subsets OpenBLAS's SkylakeX kernels use (/proc/cpuinfo flag names).
SKYLAKEX_FLAGS = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
#: The first AMD family numpy's OpenBLAS (0.3.31) does not map to a kernel set (1Ah, Zen 5).
AMD_UNKNOWN_FAMILY = 0x1A


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return f.read(1 << 16)            # the first processor's block is enough
    except OSError:
        return ""


def openblas_coretype(cpuinfo: str | None = None) -> str | None:
    """The OPENBLAS_CORETYPE the command sets for itself: "SkylakeX" on an AMD CPU of family 1Ah or
    later with AVX-512 F/CD/BW/DQ/VL (see above), else None (OpenBLAS's own choice stands).
    `cpuinfo`: /proc/cpuinfo's text (read when None; no file, as off Linux, gives None)."""
    text = _read_cpuinfo() if cpuinfo is None else cpuinfo
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break                         # the first processor only
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    try:
        family = int(fields.get("cpu family", ""))
    except ValueError:
        return None
    flags = set(fields.get("flags", "").split())
    if fields.get("vendor_id") == "AuthenticAMD" and family >= AMD_UNKNOWN_FAMILY and SKYLAKEX_FLAGS <= flags:
        return "SkylakeX"
    return None


def set_command_environment(environ=None, cpuinfo: str | None = None) -> dict[str, str]:
    """Give the `darkpy` command's process its settings (`COMMAND_ENV`, and OPENBLAS_CORETYPE where
    `openblas_coretype` names one; values already set are kept). Returns what the process now has
    for each. Only the command's entry point calls this (and tools that run as the command does)."""
    environ = os.environ if environ is None else environ
    for key, value in COMMAND_ENV.items():
        environ.setdefault(key, value)
    keys = list(COMMAND_ENV)
    if "OPENBLAS_CORETYPE" not in environ:
        coretype = openblas_coretype(cpuinfo)
        if coretype:
            environ["OPENBLAS_CORETYPE"] = coretype
    if "OPENBLAS_CORETYPE" in environ:
        keys.append("OPENBLAS_CORETYPE")
    return {key: environ[key] for key in keys}
