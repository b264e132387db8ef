"""The environment every measured process gets, the machine, and quiet windows between samples.

`worker_env` is built from nothing, never from `os.environ` of the parent (which imported darkpy
and may carry anyone's tuning): a handful of neutral variables copied from the parent (paths, the
user, the locale, where numba caches kernels), then the thread counts, set explicitly. Every
contender gets exactly this; anything else the parent has that would tune a runtime
(OMP_*, KMP_*, GOMP_*, OPENBLAS_*, MKL_*, NUMBA_* other than the cache, TORCH_*, ORT_*, LD_PRELOAD)
is left out and listed in the results as `parent_env_dropped`.
"""
from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Copied from the parent when set: they locate things, they tune nothing.
NEUTRAL = ("PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "LC_ALL", "NUMBA_CACHE_DIR", "DARKPY_SHARED")
#: Prefixes of variables that tune a runtime: reported when the parent has them (never passed on).
TUNING = ("OMP_", "KMP_", "GOMP_", "OPENBLAS_", "GOTO", "MKL_", "NUMBA_", "TORCH_", "ORT_", "LD_PRELOAD",
          "LD_LIBRARY_PATH", "ATEN_", "DNNL_", "ONEDNN_", "PYTORCH_")


def worker_env(threads: int, **extra: str) -> dict[str, str]:
    """The environment of every measured process: the same for every contender."""
    env = {k: os.environ[k] for k in NEUTRAL if k in os.environ}
    env.update({"OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
                "MKL_NUM_THREADS": str(threads), "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)})
    env.update(extra)
    return env


def parent_env_dropped() -> dict[str, str]:
    """The parent's tuning variables the workers do NOT get (for the record)."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(TUNING) and k != "NUMBA_CACHE_DIR"}


# -- the machine ---------------------------------------------------------------------------------------

SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
              "amx_tile")


def cpu_info() -> dict:
    model, flags = platform.processor(), set()
    try:
        text = Path("/proc/cpuinfo").read_text()
        m = re.search(r"model name\s*:\s*(.*)", text)
        model = m.group(1).strip() if m else model
        fam = re.search(r"^cpu family\s*:\s*(\d+)", text, re.M)
        mod = re.search(r"^model\s*:\s*(\d+)", text, re.M)
        if fam and mod:             # "AMD EPYC" alone names Zen 4 and Zen 5 machines alike
            model = f"{model} (family {fam.group(1)}, model {mod.group(1)})"
        m = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
        flags = set(m.group(1).split()) if m else set()
    except OSError:
        pass
    return {"cpu": model, "simd": [f for f in SIMD_FLAGS if f in flags],
            "avx2": "avx2" in flags, "avx512": "avx512f" in flags}


def machine_info(threads: int) -> dict:
    import numba
    import numpy

    versions = {"python": platform.python_version(), "numpy": numpy.__version__, "numba": numba.__version__}
    for name in ("torch", "onnxruntime"):
        try:
            r = subprocess.run([sys.executable, "-c", f"import {name}; print({name}.__version__)"],
                               capture_output=True, text=True, timeout=120, env=worker_env(threads))
            versions[name] = r.stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            versions[name] = None
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return {**cpu_info(), "cores": os.cpu_count(), "memory_gb": round(mem_gb, 1), "threads": threads,
            "platform": platform.platform(), "versions": versions,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "loadavg_start": os.getloadavg(),
            "worker_env": worker_env(threads), "parent_env_dropped": parent_env_dropped()}


# -- quiet windows -------------------------------------------------------------------------------------

def _cpu_times() -> tuple[float, float] | None:
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    values = [float(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0.0)      # idle + iowait
    return sum(values), idle


def busy_fraction(window_s: float = 0.2) -> float | None:
    """Share of all cores busy over the next `window_s` (from /proc/stat), or None where unknown."""
    a = _cpu_times()
    time.sleep(window_s)
    b = _cpu_times()
    if a is None or b is None or b[0] <= a[0]:
        return None
    return 1.0 - (b[1] - a[1]) / (b[0] - a[0])


def live_workers() -> list[int]:
    """Pids of every benchmark worker process alive on the machine (ours or anyone's)."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"benchmarks.worker" in cmd:
            pids.append(int(d.name))
    return pids


def wait_quiet(settle_s: float, max_busy: float, max_wait_s: float) -> dict:
    """Sleep `settle_s` (a finished worker's pools wind down), then wait until the machine's busy
    share over a 0.2 s window is at most `max_busy`, for at most `max_wait_s`. Returns what was
    seen (recorded beside each sample): the last busy share, any benchmark worker process still
    alive (there must be none: ours exited, and someone else's run would share the cores), and
    whether the window counts as quiet."""
    time.sleep(settle_s)
    start = time.perf_counter()
    busy = busy_fraction()
    while busy is not None and busy > max_busy and time.perf_counter() - start < max_wait_s:
        busy = busy_fraction()
    others = live_workers()
    return {"busy": busy, "quiet": (busy is None or busy <= max_busy) and not others, "other_workers": others}
