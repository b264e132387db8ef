"""Reference points beside the contenders: the machine's sgemm rate, the start-up of the `darkpy`
command, and a user-built Darknet (the C reference)."""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .engine import DARKNET_ENV, NetSpec, Options, edits_for, sane_weights
from .environment import ROOT, worker_env

# -- the machine's sgemm rate ---------------------------------------------------------------------------------------

SGEMM_SCRIPT = r"""
import json, sys, time
import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

def best_rate(mm, n, reps=5):
    mm()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mm()
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / min(times) / 1e9

threads = int(sys.argv[1])
threadpool_limits(threads)
by_size = {}
for n in (1024, 2048):
    a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    c = np.empty_like(a)
    by_size[n] = best_rate(lambda: np.matmul(a, b, out=c), n)
info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
out = {"numpy_gflops": max(by_size.values()), "by_size": by_size,
       "blas": {k: info[0].get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
       if info else None}
try:
    import torch
except ImportError:
    pass
else:
    time.sleep(1.0)          # numpy's BLAS threads wind down before torch's are timed
    torch.set_num_threads(threads)
    ta, tb = torch.rand(2048, 2048), torch.rand(2048, 2048)
    out["torch_gflops"] = best_rate(lambda: torch.mm(ta, tb), 2048)
print(json.dumps(out))
"""


def sgemm_peak(threads: int) -> dict:
    """The machine's float32 GEMM rate at `threads` threads, through numpy's BLAS (the one darkpy
    uses) and torch's, measured in a fresh process with the same environment as the workers."""
    r = subprocess.run([sys.executable, "-c", SGEMM_SCRIPT, str(threads)], env=worker_env(threads),
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    if r.returncode != 0:
        return {"error": r.stderr[-2000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- start-up of the darkpy command ------------------------------------------------------------------------

def startup_bench(opts: Options, warm_runs: int = 3) -> dict:
    """Cold start (fresh kernel cache: everything compiles) and warm start of `darkpy predict` as a
    whole process, and whether the commands that need no kernel (`--help`, `summary`, `cfg check`)
    ever compile one (they must leave a fresh NUMBA_CACHE_DIR empty)."""
    from types import SimpleNamespace

    from darkpy.cfg import load_cfg
    from darkpy.network import build_layers
    from darkpy.weights import save_weights

    cfg = ROOT / "cfg" / "digits.cfg"
    images = sorted((ROOT / "data" / "digits" / "test").glob("*.png"))
    if not cfg.is_file() or not images:
        return {"skipped": "cfg/digits.cfg or data/digits/test/*.png missing"}
    _, layers = build_layers(load_cfg(cfg))
    sane_weights(layers)
    weights = str(opts.tmp / "startup-digits.weights")
    save_weights(SimpleNamespace(layers=layers, seen=0), weights)

    def run(args, cache: Path) -> tuple[float, str, int]:
        env = worker_env(opts.threads, NUMBA_CACHE_DIR=str(cache))
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "darkpy", *args], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
        return time.perf_counter() - t0, r.stdout + r.stderr, r.returncode

    cache = opts.tmp / "numba-cache-predict"
    predict = ["predict", "cfg/digits.cfg", weights, str(images[0])]
    cold_s, cold_out, rc = run(predict, cache)
    out = {"command": "darkpy predict cfg/digits.cfg W IMAGE", "cold_s": cold_s, "cold_rc": rc,
           "cold_says_compiling": "compil" in cold_out.lower(),
           "cold_cache_files": sum(1 for p in cache.rglob("*.nbi")),   # proves the cold run compiled
           "cold_output_tail": cold_out[-600:]}
    warm = [run(predict, cache)[0] for _ in range(warm_runs)]
    out.update(warm_s=statistics.median(warm), warm_samples_s=warm)
    out["no_kernel_commands"] = {}
    for args in (["--help"], ["summary", "cfg/digits.cfg"], ["cfg", "check", "cfg/digits.cfg"]):
        fresh = Path(tempfile.mkdtemp(prefix="numba-cache-", dir=opts.tmp))
        t, _text, rc = run(args, fresh)
        compiled = sorted(str(p.relative_to(fresh)) for p in fresh.rglob("*") if p.is_file())
        out["no_kernel_commands"]["darkpy " + " ".join(args)] = {"s": t, "rc": rc, "compiled": len(compiled),
                                                                 "files": compiled[:5]}
    return out


# -- the Darknet C reference ---------------------------------------------------------------------------------

def darknet_reference(specs: list[NetSpec], opts: Options, darkpy_b1: dict[str, float]) -> dict:
    """Batch-1 inference of each network by a user-built Darknet (`darknet speed CFG N`)."""
    exe = os.environ.get(DARKNET_ENV)
    if not exe:
        return {"skipped": f"set {DARKNET_ENV}=/path/to/darknet to time the Darknet C reference"}
    if not os.access(exe, os.X_OK):
        return {"skipped": f"{DARKNET_ENV}={exe} is not an executable file"}
    from darkpy.cfg import load_cfg

    out = {"executable": exe, "networks": {}}
    for spec in specs:
        doc = load_cfg(spec.cfg)
        for key, value in edits_for(spec, 1).items():
            doc.set(key, value)
        path = opts.tmp / f"{spec.name}.darknet.cfg"
        path.write_text(doc.text())
        # `speed` may time whole seconds only: run long enough (about 5 s at darkpy's pace)
        tics = max(10, int(5.0 / max(darkpy_b1.get(spec.name, 0.05), 1e-3)))
        try:
            r = subprocess.run([exe, "speed", str(path), str(tics)], capture_output=True, text=True,
                               timeout=600, cwd=opts.tmp, env=worker_env(opts.threads))
        except subprocess.TimeoutExpired:
            out["networks"][spec.name] = {"error": "timed out"}
            continue
        m = re.search(r"Speed:\s*([0-9.eE+-]+)\s*sec/eval", r.stdout + r.stderr)
        if not m:
            out["networks"][spec.name] = {"error": (r.stdout + r.stderr)[-500:]}
            continue
        sec = float(m.group(1))
        out["networks"][spec.name] = {"sec_per_image": sec, "images_per_s": 1 / sec if sec > 0 else None,
                                      "tics": tics}
    return out


