"""Wall time and call count of every numba parallel kernel in one darkpy step of a suite network, for
finding which kernels, and how many parallel regions, a step spends its time in (not a benchmark:
nothing is compared with other frameworks, nothing is published).

    python -m benchmarks.kernel_time shapes-tiny train 32                # 2 threads
    python -m benchmarks.kernel_time digits infer 64 --threads 1

Every `parallel=True` numba dispatcher a darkpy module holds is wrapped (a Python call around each
kernel call: a few µs each, so small kernels read high), the network takes warm-up steps, then
--steps timed steps; it prints per kernel the calls per step, µs per call and ms per step, and the
kernels' total against the step's. What the table does not cover is BLAS, Python and the serial
kernels. Each call is one parallel region when the kernel takes its parallel branch.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

from darkpy.process import set_command_environment

set_command_environment()            # the darkpy command's OpenMP/OpenBLAS settings, before numpy


def wrap_parallel_kernels(stats: dict) -> int:
    """Replace every parallel numba dispatcher in the loaded darkpy modules by a timing wrapper that
    adds [calls, seconds] into stats["module.name"]. Returns how many were wrapped."""
    from numba.core.registry import CPUDispatcher

    wrapped = 0
    for mname, mod in list(sys.modules.items()):
        if not mname.startswith("darkpy") or mod is None:
            continue
        for attr, fn in list(vars(mod).items()):
            if not (isinstance(fn, CPUDispatcher) and fn.targetoptions.get("parallel")):
                continue
            key = f"{fn.py_func.__module__.rsplit('.', 1)[-1]}.{fn.py_func.__name__}"

            def timed(*a, _fn=fn, _key=key, **k):
                t = time.perf_counter()
                r = _fn(*a, **k)
                entry = stats[_key]
                entry[0] += 1
                entry[1] += time.perf_counter() - t
                return r

            setattr(mod, attr, timed)
            wrapped += 1
    return wrapped


def main(argv=None) -> None:
    from .layer_time import step_arguments

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    step_arguments(ap)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args(argv)

    from darkpy.runtime import configure_threads

    from .layer_time import as_the_worker, build, make_step, warm_up

    configure_threads(args.threads)
    net, x, truth = build(args.network, args.batch)
    as_the_worker(net, args)
    stats: dict = defaultdict(lambda: [0, 0.0])
    wrap_parallel_kernels(stats)
    step = make_step(net, x, truth, args.mode == "train")
    warm_up(net, step)
    stats.clear()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    per_step = (time.perf_counter() - t0) / args.steps
    n = args.steps
    print(f"{args.network} {args.mode} b{args.batch}, {args.threads} thread(s): {per_step * 1e3:.2f} ms per step")
    print(f"{'kernel':40s} {'calls/step':>10s} {'µs/call':>9s} {'ms/step':>8s}")
    total_calls = total = 0.0
    for key, (calls, secs) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
        total_calls += calls
        total += secs
        print(f"{key:40s} {calls / n:10.1f} {secs / calls * 1e6:9.1f} {secs / n * 1e3:8.3f}")
    print(f"parallel kernels: {total / n * 1e3:.2f} ms of {per_step * 1e3:.2f} per step, "
          f"{total_calls / n:.0f} calls per step")


if __name__ == "__main__":
    main()
