"""Data-parallel scaling by hand: 1 rank x T threads against T ranks x 1 thread, on one host.

    python -m benchmarks.mpi_scaling                      # shapes-tiny and cifar, 2 cores
    python -m benchmarks.mpi_scaling --nets cifar --iterations 12
    python -m benchmarks.mpi_scaling --paper              # only the 8/64-rank estimate (no timing)

For each network it trains on synthetic data in a temp folder (shapes-tiny: the bundled shapes
generator, 128 px; cifar: random 32x32 images with CIFAR's labels), through `darkpy.train.train`
as `darkpy train` does, with the cfg's own batch (shapes-tiny 32, cifar 128), and reports:

- images/s: the cfg batch over the median iteration time (the first `--warmup` iterations dropped);
- per update on rank 0: the allreduce of the flat gradient buffer timed alone (the ranks in step)
  and the whole exchange inside training (the allreduce plus the small allgather of costs and BN
  statistics, waiting for the other rank excluded), against the compute (iteration minus exchange);
- the gradient buffer's size, and the machine's load average before and after each run.

A 2-iteration run of each network first compiles (caches) every kernel it needs, untimed.

The load matters: the ranks share the cores with whatever else runs, and a run whose load average
exceeds the cores it uses measures the neighbours as much as darkpy. The script prints the load with
every figure and marks a table measured under load as not fit to publish.

`--paper`: the expected efficiency at 8 and 64 ranks (one rank per machine) on 10 GbE, from the
gradient sizes and FLOPs of real cfgs, with no overlap of communication and compute (darkpy sums
the gradients after the backward pass): a machine trains at R GFLOP/s, so images/s = R / (3 x the
forward FLOPs per image); compute per update = batch / (ranks x images/s); allreduce = 2 (N-1)/N x
bytes / bandwidth + 2 log2(N) x latency (MPICH's reduce-scatter + allgather for large messages);
efficiency = compute / (compute + allreduce).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DARKPY_SHARED", ROOT.parent / "shared"))
NETS = {"shapes-tiny": ROOT / "cfg" / "shapes-tiny.cfg", "cifar": SHARED / "cfg" / "pjreddie" / "cifar.cfg"}
CIFAR_LABELS = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

#: --paper: one machine's training speed (images/s at the cfg's size) and the network.
TEN_GBE_BYTES_S = 1.1e9          # 10 Gb/s line rate is 1.25 GB/s; ~1.1 GB/s is what TCP reaches
TEN_GBE_LATENCY_S = 50e-6
PAPER_CFGS = {"yolov4-tiny": SHARED / "cfg" / "alexeyab" / "yolov4-tiny-custom.cfg",
              "yolov3-tiny": SHARED / "cfg" / "alexeyab" / "yolov3-tiny.cfg",
              "cifar": NETS["cifar"], "yolov4": SHARED / "cfg" / "alexeyab" / "yolov4.cfg"}


# -- data -------------------------------------------------------------------------------------------------

def make_data(net: str, folder: Path) -> Path:
    """A .data file over synthetic images for `net` in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    if net == "shapes-tiny":
        import importlib.util
        spec = importlib.util.spec_from_file_location("shapes_generate", ROOT / "data" / "shapes" / "generate.py")
        gen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gen)
        train, valid = gen.generate(folder, n=96, size=128, seed=1, valid_fraction=0.1)
        data = folder / "shapes.data"
        data.write_text(f"classes=4\ntrain={train}\nvalid={valid}\nnames={ROOT / 'data' / 'shapes.names'}\n")
        return data
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(256):
        p = folder / f"{i:04d}_{CIFAR_LABELS[i % 10]}.png"
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    (folder / "train.list").write_text("\n".join(paths) + "\n")
    (folder / "labels.txt").write_text("\n".join(CIFAR_LABELS) + "\n")
    data = folder / "cifar.data"
    data.write_text(f"classes=10\ntrain={folder / 'train.list'}\nlabels={folder / 'labels.txt'}\n")
    return data


# -- one configuration (run as a worker, under mpiexec for several ranks) ------------------------------------

def worker(cfg: str, data: str, iterations: int, threads: int, warmup: int, backup: str) -> None:
    import numpy as np

    from darkpy.distributed import world
    from darkpy.settings import Settings
    from darkpy.train import train

    comm = world()
    result = train(cfg, data=data, max_batches=iterations, backup=backup, settings=Settings(threads=threads),
                   evaluate=False, comm=comm, save_last=10 ** 9, save_every=10 ** 9)
    exchange = comm.transfer_seconds
    n_updates = max(1, iterations)
    # the allreduce alone, ranks in step, on a buffer the size of the gradients
    from darkpy.network import load_network
    size = sum(p.value.size for layer in load_network(cfg, batch=1).layers for p in layer.params)
    buf = np.ones(size, np.float32)
    times = []
    for _ in range(10):
        comm.allgather(np.zeros(1))                         # line the ranks up
        t0 = time.perf_counter()
        comm.allreduce(buf)
        times.append(time.perf_counter() - t0)
    if comm.rank != 0:
        return
    secs = [r.seconds for r in result.records][warmup:]
    it = statistics.median(secs)
    batch = result.records[-1].images // result.iteration
    print(json.dumps({"ranks": comm.size, "threads": threads, "batch": batch, "median_iteration_s": it,
                      "images_per_s": batch / it, "exchange_per_update_s": exchange / n_updates,
                      "allreduce_alone_s": statistics.median(times) if comm.size > 1 else 0.0,
                      "gradient_floats": int(size)}))


def run_config(cfg: Path, data: Path, ranks: int, threads: int, iterations: int, warmup: int, tmp: Path) -> dict:
    from darkpy.distributed import find_mpiexec

    from darkpy.process import set_command_environment

    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    set_command_environment(env)       # both configurations run as `darkpy train` does
    args = ["-m", "benchmarks.mpi_scaling", "--worker", str(cfg), str(data), str(iterations), str(threads),
            str(warmup), str(tmp / f"backup-{ranks}x{threads}")]
    cmd = [sys.executable, *args] if ranks == 1 else [find_mpiexec(), "-n", str(ranks), sys.executable, *args]
    load0 = os.getloadavg()[0]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=3600)
    finally:
        if proc.poll() is None:             # interrupted or timed out: end the whole job, not only mpiexec
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{stdout}\n{stderr}")
    out = json.loads(stdout.strip().splitlines()[-1])
    out["load_before"], out["load_after"] = load0, os.getloadavg()[0]
    return out


def measure(nets: list[str], cores: int, iterations: int, warmup: int) -> None:
    with tempfile.TemporaryDirectory(prefix="darkpy-mpi-bench-") as t:
        tmp = Path(t)
        rows = []
        for net in nets:
            data = make_data(net, tmp / net)
            run_config(NETS[net], data, 1, cores, 2, 0, tmp)     # compiles what the net needs, not timed
            for ranks, threads in ((1, cores), (cores, 1)):
                res = run_config(NETS[net], data, ranks, threads, iterations, warmup, tmp)
                res["net"] = net
                rows.append(res)
                print(f"{net}: {ranks} rank(s) x {threads} thread(s): {res['images_per_s']:.1f} images/s "
                      f"(load {res['load_before']:.1f} -> {res['load_after']:.1f})", flush=True)
    loaded = max(max(r["load_before"], r["load_after"]) for r in rows) > 0.5 * (os.cpu_count() or 1)
    print()
    print(f"Machine: {os.cpu_count()} cores; load average (1 min) from {min(r['load_before'] for r in rows):.1f} "
          f"to {max(r['load_after'] for r in rows):.1f} during the runs"
          + ("  ** LOADED: these timings measure the neighbours too; do not publish them **" if loaded else ""))
    print()
    print("| network | ranks x threads | batch | images/s | iteration s | exchange / update ms | "
          "allreduce alone ms | compute / update ms | gradient MB | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        compute = r["median_iteration_s"] - r["exchange_per_update_s"]
        print(f"| {r['net']} | {r['ranks']} x {r['threads']} | {r['batch']} | {r['images_per_s']:.1f} | "
              f"{r['median_iteration_s']:.3f} | {1e3 * r['exchange_per_update_s']:.2f} | "
              f"{1e3 * r['allreduce_alone_s']:.2f} | {1e3 * compute:.0f} | {4 * r['gradient_floats'] / 1e6:.1f} | "
              f"{r['load_before']:.1f}-{r['load_after']:.1f} |")


# -- on paper ---------------------------------------------------------------------------------------------------

def allreduce_seconds(nbytes: float, ranks: int, bandwidth: float = TEN_GBE_BYTES_S,
                      latency: float = TEN_GBE_LATENCY_S) -> float:
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / bandwidth + 2 * math.ceil(math.log2(ranks)) * latency


def paper(machine_gflops: list[float]) -> None:
    import warnings

    from darkpy.network import load_network

    print("Expected efficiency, one rank per machine, 10 GbE (1.1 GB/s, 50 us per message), no overlap of")
    print("the allreduce with compute; a machine trains at R GFLOP/s (3x the forward FLOPs per image):")
    print()
    print("| network | parameters | gradient MB | GFLOP per image (train) | allreduce ms at 8 / 64 ranks | "
          "machine GFLOP/s | batch | efficiency at 8 | at 64 | at 64 with 8 images per rank (batch 512) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, cfg in PAPER_CFGS.items():
        if not cfg.is_file():
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = load_network(cfg, batch=1)
        params = sum(p.value.size for layer in net.layers for p in layer.params)
        nbytes = 4 * params
        train_flop = 3 * sum(layer.flops() for layer in net.layers)
        batch = net.config.batch if net.config.batch > 1 else 64
        a8, a64 = allreduce_seconds(nbytes, 8), allreduce_seconds(nbytes, 64)
        for rate in machine_gflops:
            speed = rate * 1e9 / train_flop            # images/s of one machine

            def eff(ranks, per_update_images):
                compute = per_update_images / ranks / speed
                return compute / (compute + allreduce_seconds(nbytes, ranks))
            print(f"| {name} | {params / 1e6:.2f} M | {nbytes / 1e6:.1f} | {train_flop / 1e9:.1f} | "
                  f"{1e3 * a8:.0f} / {1e3 * a64:.0f} | {rate:g} | {batch} | {100 * eff(8, batch):.0f} % | "
                  f"{100 * eff(64, batch):.0f} % | {100 * eff(64, 64 * 8):.0f} % |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        cfg, data, iterations, threads, warmup, backup = sys.argv[2:8]
        worker(cfg, data, int(iterations), int(threads), int(warmup), backup)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    ap.add_argument("--cores", type=int, default=2, help="threads of the 1-rank run = ranks of the other")
    ap.add_argument("--iterations", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--paper", action="store_true", help="only the 8/64-rank estimate")
    ap.add_argument("--machine-gflops", type=float, nargs="+", default=[150.0, 1500.0],
                    help="--paper: one machine's training rate in GFLOP/s (default: 150, what darkpy reaches "
                         "on this 2-core VM (benchmarks/RESULTS.md), and 1500, a 32-core AVX2 node)")
    a = ap.parse_args()
    if not a.paper:
        measure(a.nets, a.cores, a.iterations, a.warmup)
        print()
    paper(a.machine_gflops)


if __name__ == "__main__":
    main()
