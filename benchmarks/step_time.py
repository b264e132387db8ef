"""Median time of one darkpy step of a suite network, for A/B comparisons of code versions on a busy
machine (not a benchmark: nothing is compared with other frameworks, nothing is published).

    python -m benchmarks.step_time digits train 32 --reps 200           # CPU time, 1 thread
    python -m benchmarks.step_time shapes-tiny infer 1 --threads 2      # wall time, 2 threads

With one thread it reports process CPU time, which other jobs on the machine disturb far less than
wall time (cache and memory-bandwidth sharing remain); with more threads (or --wall) wall time.
The network gets the suite's input size, random sane weights (benchmarks.engine.sane_weights),
random input and truth, three warm-up steps, then `--reps` timed steps; it prints the median in ms.

Per-layer threads against every layer on --threads (darkpy/threadplan.py), alternating in one
process (`--rounds` rounds of `--reps` steps each way; prints the median of each side's round medians):

    python -m benchmarks.step_time shapes-tiny infer 1 --threads 2 --reps 5 --ab-threads --rounds 20

A module setting at two values, alternating in one process the same way, one network built per
value (settings read when a network allocates, such as the convolution's thresholds, take effect):

    python -m benchmarks.step_time shapes-tiny train 32 --threads 2 --reps 3 --rounds 10 \
        --ab-setting darkpy.blas.STREAM_MIN_MACS '1<<62' '1<<20'

A/B of two trees: run it alternately from each tree's root (PYTHONPATH=<tree>), several rounds, and
compare the medians of the per-process medians, e.g.

    for i in 1 2 3 4; do for t in /tmp/old .; do (cd $t && PYTHONPATH=$PWD python -m benchmarks.step_time \\
        digits train 32 --reps 200); done; done
"""
from __future__ import annotations

import argparse
import ast
import importlib
import os
import sys
import time

from darkpy.process import set_command_environment

set_command_environment()            # the darkpy command's OpenMP/OpenBLAS settings, before numpy

import numpy as np  # noqa: E402


def main(argv=None) -> None:
    from .layer_time import step_arguments

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    step_arguments(ap)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wall", action="store_true", help="wall time even with one thread")
    ap.add_argument("--fixed-threads", action="store_true",
                    help="every layer on --threads threads (no per-layer choice, darkpy/threadplan.py)")
    ap.add_argument("--ab-threads", action="store_true",
                    help="alternate per-layer threads and --fixed-threads in this process, --rounds times")
    ap.add_argument("--ab-setting", nargs=3, metavar=("MODULE.NAME", "A", "B"),
                    help="alternate a module setting between values A and B (Python literals or "
                         "'M<<N'), --rounds times")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)

    from darkpy.runtime import configure_threads

    from .layer_time import as_the_worker, build, make_step, warm_up
    from .run import SUITE

    if args.network not in {s.name for s in SUITE}:
        sys.exit(f"unknown network {args.network!r}; one of: {', '.join(s.name for s in SUITE)}")
    configure_threads(args.threads)
    clock = time.process_time if args.threads == 1 and not args.wall else time.perf_counter
    if args.ab_setting:
        _ab_setting(args, clock)
        return
    net, x, truth = build(args.network, args.batch)
    as_the_worker(net, args)
    net.thread_plans.enabled = not args.fixed_threads
    step = make_step(net, x, truth, args.mode == "train")
    warm_up(net, step)
    if args.ab_threads:
        _ab_threads(net, step, clock, args)
        return
    times = []
    for _ in range(args.reps):
        t0 = clock()
        step()
        times.append(clock() - t0)
    kind = "wall" if clock is time.perf_counter else "cpu"
    print(f"{np.median(times) * 1e3:.4f} ms ({kind}, {args.threads} thread(s), min {min(times) * 1e3:.4f}, "
          f"load {os.getloadavg()[0]:.2f})")



def _value(text: str):
    """A Python literal, or `M<<N`."""
    if "<<" in text:
        m, n = text.split("<<")
        return int(m) << int(n)
    return ast.literal_eval(text)


def _ab_setting(args, clock) -> None:
    """Rounds of `reps` steps with the setting at A, then at B (sides alternate which goes first),
    each side on its own network built with its value; the median of each side's round medians."""
    from .layer_time import as_the_worker, build, make_step, warm_up

    name, a, b = args.ab_setting
    module_name, attr = name.rsplit(".", 1)
    module = importlib.import_module(module_name)
    sides = {}
    for text in (a, b):
        setattr(module, attr, _value(text))
        net, x, truth = build(args.network, args.batch)
        as_the_worker(net, args)
        net.thread_plans.enabled = not args.fixed_threads
        step = make_step(net, x, truth, args.mode == "train")
        warm_up(net, step)
        sides[text] = step
    rounds = {text: [] for text in sides}
    for r in range(args.rounds):
        for text in ((a, b) if r % 2 == 0 else (b, a)):
            setattr(module, attr, _value(text))
            sides[text]()
            times = []
            for _ in range(args.reps):
                t0 = clock()
                sides[text]()
                times.append(clock() - t0)
            rounds[text].append(np.median(times))
    med = {text: np.median(v) for text, v in rounds.items()}
    print(" ".join(f"{attr}={text}: {m * 1e3:.4f} ms;" for text, m in med.items())
          + f" B/A {med[b] / med[a]:.3f} ({args.threads} thread(s), {args.rounds} rounds of {args.reps}, "
            f"load {os.getloadavg()[0]:.2f})")


def _ab_threads(net, step, clock, args) -> None:
    """Rounds of `reps` steps with the network's per-layer thread choice, then with every layer on
    --threads (sides alternate which goes first); the median of each side's per-round medians."""
    rounds = {"per-layer": [], "fixed": []}
    for r in range(args.rounds):
        for side in (("per-layer", "fixed") if r % 2 == 0 else ("fixed", "per-layer")):
            net.thread_plans.enabled = side == "per-layer"
            step()
            times = []
            for _ in range(args.reps):
                t0 = clock()
                step()
                times.append(clock() - t0)
            rounds[side].append(np.median(times))
    chosen = {k[0]: "".join(map(str, v)) for k, v in net.thread_plans.chosen().items()}
    print(" ".join(f"{side} {np.median(v) * 1e3:.4f} ms;" for side, v in rounds.items())
          + f" ({args.threads} thread(s), {args.rounds} rounds of {args.reps}, threads per layer {chosen}, "
            f"load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
