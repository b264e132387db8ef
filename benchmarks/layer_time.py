"""Per-layer wall time of one darkpy step of a suite network at 1 and at N threads, alternated step by
step in ONE process (so both thread counts see the same machine load), for finding where more
threads lose (not a benchmark: nothing is compared with other frameworks, nothing is published).

    python -m benchmarks.layer_time digits train 32 --rounds 200            # 1 vs 2 threads
    python -m benchmarks.layer_time shapes-tiny infer 1 --threads 2

Each round runs one step at 1 thread and one at N (order alternating), timing every
`layer.forward(state)` / `layer.backward(state)` as `Network.forward/backward` run them, and the
update; it prints a percentile (the median unless --percentile) per layer and phase in µs for each thread count and their ratio.
"""
from __future__ import annotations

import argparse
import os
import time
import warnings
from collections import defaultdict

from darkpy.process import set_command_environment

set_command_environment()            # the darkpy command's OpenMP/OpenBLAS settings, before numpy

import numpy as np  # noqa: E402


def build(name: str, batch: int):
    """The suite network `name` at `batch` with sane random weights, an input and a truth."""
    from darkpy.cfg import CfgWarning, load_cfg
    from darkpy.network import Network

    from .engine import SEQ_KINDS, random_truth, sane_weights
    from .run import SUITE

    spec = {s.name: s for s in SUITE}[name]
    doc = load_cfg(spec.cfg)
    if spec.size:
        doc.set("net.width", str(spec.size))
        doc.set("net.height", str(spec.size))
    seq = any(sec.kind in SEQ_KINDS for sec in doc.layers)
    steps = doc.net.get_int("time_steps", 1) if seq else 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CfgWarning)
        net = Network(doc, batch=batch * steps)     # a sequence net: `batch` sequences of time-major rows
    sane_weights(net.layers)
    rng = np.random.default_rng(0)
    if steps > 1:                                   # token ids in, token ids as targets
        x, truth = (rng.integers(32, 127, (batch * steps, 1)).astype(np.float32) for _ in range(2))
        return net, x, truth
    x = rng.random((batch, *net.input_shape), dtype=np.float32)
    yolos = [l for l in net.layers if l.kind == "yolo"]
    if yolos:
        truth = random_truth(rng, batch, {"max_boxes": max(l.max_boxes for l in yolos),
                                          "classes": yolos[0].classes})
    else:
        truth = np.zeros((batch, net.truths), np.float32)
        truth[np.arange(batch), rng.integers(0, net.truths, batch)] = 1
    return net, x, truth


def step_arguments(ap) -> None:
    """The arguments every step tool takes: network, mode, batch, and --plain-outputs."""
    ap.add_argument("network", help="a suite network (benchmarks/run.py), e.g. digits, shapes-tiny")
    ap.add_argument("mode", choices=["train", "infer"])
    ap.add_argument("batch", type=int)
    ap.add_argument("--plain-outputs", action="store_true",
                    help="infer without Network.share_outputs (the suite's worker and the inference "
                         "commands share them, which also keeps Winograd filter transforms and lets a "
                         "convolution write its 2x2 maxpool)")


def as_the_worker(net, args) -> None:
    """A network runs as the suite's worker and the commands run it: for inference with shared
    outputs (and what comes with them), unless --plain-outputs; for training with shared deltas."""
    if args.mode == "infer" and not args.plain_outputs:
        net.share_outputs(keep=[net.output_layer.index])
    if args.mode == "train":
        net.share_deltas()


def warm_up(net, step, steps: int = 3) -> None:
    """`steps` steps, and more until the network's per-layer thread counts are chosen
    (darkpy/threadplan.py), so that what is timed next is the steady state."""
    for _ in range(steps):
        step()
    while not net.thread_plans.settled():
        step()


def make_step(net, x, truth, train: bool):
    """One step of the suite network: a training step (forward with truth, backward, update at a
    fixed rate) or an inference forward."""
    def step():
        if train:
            net.forward(x, truth, train=True)
            net.backward()
            net.update(1e-3)
        else:
            net.forward(x)
    return step


def instrument(net, times: dict) -> None:
    """Wrap every layer's forward/backward so that each call adds its wall time to
    times[(index, kind, phase)] (a list per step, the caller appends a new slot)."""
    for layer in net.layers:
        for phase in ("forward", "backward"):
            orig = getattr(layer, phase)

            def timed(s, orig=orig, key=(layer.index, layer.kind, phase)):
                t0 = time.perf_counter()
                orig(s)
                times[key] += time.perf_counter() - t0
            setattr(layer, phase, timed)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    step_arguments(ap)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--percentile", type=float, default=50,
                    help="of each layer's times (10: closer to a quiet machine's when others run)")
    args = ap.parse_args(argv)

    from darkpy.runtime import configure_threads

    net, x, truth = build(args.network, args.batch)
    as_the_worker(net, args)
    net.thread_plans.enabled = False        # every layer on 1, then on --threads threads
    step_times: dict = defaultdict(float)
    instrument(net, step_times)
    train = args.mode == "train"
    samples = {1: defaultdict(list), args.threads: defaultdict(list)}

    def step():
        if train:
            net.forward(x, truth, train=True)
            net.backward()
            t0 = time.perf_counter()
            net.update(1e-3)
            step_times[(999, "update", "")] += time.perf_counter() - t0
        else:
            net.forward(x)

    for n in (1, args.threads):
        configure_threads(n)
        for _ in range(3):
            step()
    for r in range(args.rounds):
        for n in ((1, args.threads) if r % 2 == 0 else (args.threads, 1)):
            configure_threads(n)
            step_times.clear()
            t0 = time.perf_counter()
            step()
            total = time.perf_counter() - t0
            for key, t in step_times.items():
                samples[n][key].append(t)
            samples[n][(1000, "step", "")].append(total)
    one, many = samples[1], samples[args.threads]
    print(f"{args.network} {args.mode} b{args.batch}: µs per step, 1 vs {args.threads} threads, "
          f"{args.rounds} rounds, percentile {args.percentile:g}, load {os.getloadavg()[0]:.2f}")
    print(f"{'layer':>5} {'kind':<14} {'phase':<8} {'1 thr':>9} {f'{args.threads} thr':>9} {'ratio':>6} {'diff':>8}")
    for key in sorted(one):
        a, b = (np.percentile(v[key], args.percentile) * 1e6 for v in (one, many))
        idx = "" if key[0] >= 999 else key[0]
        flag = "  <--" if b > a * 1.05 and b - a > 20 else ""
        print(f"{idx:>5} {key[1]:<14} {key[2]:<8} {a:9.1f} {b:9.1f} {b / a:6.2f} {b - a:8.1f}{flag}")


if __name__ == "__main__":
    main()
