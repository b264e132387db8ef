"""What one numba parallel region costs on this machine when it does nearly nothing: the price of
waking the thread pool, which decides how much work a kernel needs before a second thread pays
(darkpy/kernels/__init__.py: PARALLEL_MIN and friends). Not a benchmark: nothing is compared with
other frameworks, nothing is published.

    python -m benchmarks.wake_cost                 # as the `darkpy` command runs (GOMP_SPINCOUNT=30000)
    python -m benchmarks.wake_cost --as-is         # with this shell's environment only, e.g.
    OMP_WAIT_POLICY=PASSIVE python -m benchmarks.wake_cost --as-is

For 1 and for --threads threads it prints the median and 90th percentile of a 64-value `prange`
region called back to back, and again after ~1 ms of other work (the pool has gone to sleep by
then unless it spins that long). Measured 2026-12-02 on a 2-core Zen 5 VM, 2 threads, two runs:
52-66 µs back to back and 67-100 µs after a gap with PASSIVE; 1.3-1.9 and 1.4-8.6 µs with libgomp's
default spinning. On a 2-core Zen 4 VM (2026-12-02, one run each): 1.5 µs back to back and 38 µs
after the gap with the command's GOMP_SPINCOUNT=2000 then (the workers have gone to sleep by
then), 52 and 67 µs with PASSIVE. On the 2-core AVX-512 Xeon VM (2026-12-05) with the command's
GOMP_SPINCOUNT=30000: 1.9 µs back to back, 36 µs after the gap (asleep again after 1 ms).
"""
from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--as-is", action="store_true", help="do not apply the darkpy command's settings")
    args = ap.parse_args(argv)
    if not args.as_is:
        from darkpy.process import set_command_environment

        set_command_environment()           # before numba loads OpenMP
    import os

    import numba
    import numpy as np
    from numba import njit, prange

    @njit(parallel=True)
    def region(a):
        for i in prange(a.shape[0]):
            a[i] += 1.0

    def busy(n=20000):
        x = 0
        for k in range(n):
            x += k
        return x

    a = np.zeros(64, np.float32)
    env = {k: os.environ.get(k, "unset") for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    for n in sorted({1, args.threads}):
        numba.set_num_threads(n)
        region(a)
        back, gap = [], []
        for _ in range(args.calls):
            t = time.perf_counter()
            region(a)
            back.append(time.perf_counter() - t)
        for _ in range(max(args.calls // 4, 1)):
            busy()
            t = time.perf_counter()
            region(a)
            gap.append(time.perf_counter() - t)
        b, g = np.array(back) * 1e6, np.array(gap) * 1e6
        print(f"{n} thread(s): back to back median {np.median(b):.1f} µs (p90 {np.percentile(b, 90):.1f}); "
              f"after ~1 ms of other work median {np.median(g):.1f} µs (p90 {np.percentile(g, 90):.1f})")
    print(f"environment: {env}, numba threading layer {numba.threading_layer()}, load {os.getloadavg()[0]:.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
