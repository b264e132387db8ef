"""How the suite measures: one worker process per contender, outputs checked equal first, then
alternating timed runs.

Contenders: `darkpy`, `torch` (NCHW) and `torch-cl` (torch with `channels_last`); the faster torch
layout is darkpy's peer. Each runs in its own process (`python -m benchmarks.engine KIND`, driven by
JSON lines on stdin/stdout) so peak memory (VmHWM) is each one's own, and the torch process
never imports darkpy or numba: it gets the network as `torch_model.layer_spec` dicts. Every process is
started fresh per (network, phase), so a phase's peak memory is that phase's. Only one process
computes at a time: the parent asks each in turn for one timed sample, rotating the order every
round, so a change of machine load hits every contender alike.

Both frameworks get the same thread count (default 2, one per core): darkpy through
`darkpy.train.configure_threads` (numba and BLAS), torch through `torch.set_num_threads`. Worker
processes run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (this workplace sets them for old
OpenBLAS builds, and they slow numpy's current one); the BLAS kernel in use is recorded.
"""
from __future__ import annotations

import json
import os
import pickle
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DARKPY_SHARED", ROOT.parent / "shared")).resolve()
CONTENDERS = ("darkpy", "torch", "torch-cl")
#: Environment variable naming a built Darknet executable (the C reference); skipped when unset.
DARKNET_ENV = "DARKPY_BENCH_DARKNET"
PAUSE_S = 0.05          # between two contenders' samples, so one's spinning threads never overlap


def worker_env(threads: int, **extra: str) -> dict[str, str]:
    """The environment of every measured process (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


# =====================================================================================================
# Worker side: runs inside `python -m benchmarks.engine KIND`
# =====================================================================================================

class DarkpyRunner:
    """darkpy's side of a phase: the network at the phase's batch, its op, per-layer timing."""

    def __init__(self, job: dict):
        from darkpy.cfg import CfgWarning, load_cfg
        from darkpy.network import Network
        from darkpy.train import configure_threads

        configure_threads(job["threads"])
        doc = load_cfg(job["cfg"])
        for key, value in job["edits"].items():
            doc.set(key, value)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CfgWarning)
            self.net = Network(doc, batch=job["batch"])
        self.net.load_weights(job["weights"])
        self.job = job
        self.x = np.load(job["input"])
        self.truth = None
        if job["labels"]:
            labels = np.load(job["labels"])
            self.truth = np.zeros((len(labels), self.net.truths), np.float32)
            self.truth[np.arange(len(labels)), labels] = 1
        self.heads = sorted({self.net.output_layer.index}
                            | {l.index for l in self.net.layers if l.kind == "yolo"})

    def buffers(self) -> dict:
        """darkpy's allocated buffers by role, in MB (allocated, not necessarily touched: np.zeros
        pages count toward RSS only once written)."""
        out = {"output": 0, "delta": 0, "other": 0}
        for layer in self.net.layers:
            out["output"] += layer.output.nbytes
            out["delta"] += layer.delta.nbytes
            extra = getattr(layer, "extra_buffers", None)
            out["other"] += sum(a.nbytes for a in extra()) if extra else 0
            out["other"] += sum(p.value.nbytes + p.grad.nbytes for p in layer.params)
        try:
            from darkpy.kernels import im2col
            out["workspace"] = sum(ws.nbytes for ws in getattr(im2col, "_WORKSPACES", {}).values())
        except ImportError:
            pass
        return {k: v / 2 ** 20 for k, v in out.items()}

    def op(self) -> None:
        if self.job["mode"] == "train":
            self.net.forward(self.x, self.truth, train=True)
            self.net.backward()
            self.net.update(self.job["rate"])
        else:
            self.net.forward(self.x)

    def check(self, out: str, all_layers: bool) -> dict:
        t0 = time.perf_counter()
        self.net.forward(self.x)
        took = time.perf_counter() - t0
        picks = range(len(self.net.layers)) if all_layers else check_picks(
            [l.kind for l in self.net.layers], self.heads)
        np.savez(out, **{str(i): self.net.layers[i].output.reshape(len(self.x), -1) for i in picks})
        reply = {"heads": self.heads, "s": took}
        if self.truth is not None:
            self.net.forward(self.x, self.truth, train=True)     # loss only: no backward, no update
            reply["loss"] = self.net.cost
        return reply

    def layers(self, n: int = 1) -> dict:
        """`n` ops with every layer's forward (and backward) and the update timed; per-layer
        medians over the ops, and the mean wall time of one op."""
        nl = len(self.net.layers)
        fwd = np.zeros((n, nl))
        bwd = np.zeros((n, nl))
        update = np.zeros(n)

        def timed(fn, store, i):
            def run(s):
                t0 = time.perf_counter()
                fn(s)
                store[k, i] += time.perf_counter() - t0
            return run

        for i, layer in enumerate(self.net.layers):
            layer.forward = timed(layer.forward, fwd, i)
            layer.backward = timed(layer.backward, bwd, i)
        start = time.perf_counter()
        try:
            for k in range(n):
                if self.job["mode"] == "train":
                    self.net.forward(self.x, self.truth, train=True)
                    self.net.backward()
                    t0 = time.perf_counter()
                    self.net.update(self.job["rate"])
                    update[k] = time.perf_counter() - t0
                else:
                    self.net.forward(self.x)
        finally:
            total = time.perf_counter() - start
            for layer in self.net.layers:
                del layer.forward, layer.backward       # back to the class's methods
        train = self.job["mode"] == "train"
        return {"fwd": np.median(fwd, 0).tolist(), "bwd": np.median(bwd, 0).tolist() if train else None,
                "update": float(np.median(update)), "s": total / n}


class TorchRunner:
    """torch's side of a phase, in NCHW or channels_last."""

    def __init__(self, job: dict, channels_last: bool):
        import torch

        from .torch_model import TorchNet, make_optimizer

        self.torch = torch
        torch.set_num_threads(job["threads"])
        torch.manual_seed(0)
        with open(job["spec"], "rb") as f:
            specs = pickle.load(f)
        self.model = TorchNet(specs)
        del specs
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.model = self.model.to(memory_format=fmt)
        self.x = torch.from_numpy(np.load(job["input"])).contiguous(memory_format=fmt)
        self.job = job
        self.labels = torch.from_numpy(np.load(job["labels"])) if job["labels"] else None
        if job["mode"] == "train":
            self.model.train()
            self.opt = make_optimizer(self.model, job["rate"], job["momentum"], job["decay"])
        else:
            self.model.eval()

    def op(self) -> None:
        if self.job["mode"] == "train":
            self.opt.zero_grad(set_to_none=True)
            self.model.loss(self.x, self.labels, self.job["batch"]).backward()
            self.opt.step()
        else:
            with self.torch.inference_mode():
                self.model(self.x)

    def check(self, out: str, all_layers: bool) -> dict:
        torch = self.torch
        training = self.model.training
        self.model.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            outs = self.model(self.x, keep_all=True)
        took = time.perf_counter() - t0
        picks = range(len(outs)) if all_layers else check_picks([st.kind for st in self.model.steps],
                                                                self.model.heads)
        np.savez(out, **{str(i): outs[i].contiguous().reshape(len(self.x), -1).numpy() for i in picks})
        reply = {"heads": self.model.heads, "s": took}
        if self.labels is not None:
            self.model.train()
            with torch.no_grad():
                reply["loss"] = float(self.model.loss(self.x, self.labels, 1))
        self.model.train(training)
        return reply

    def layers(self, n: int = 1) -> dict:
        """`n` inference forwards with every step timed (training is not timed per layer): per-step
        medians, and the mean wall time of one forward."""
        t0 = time.perf_counter()
        with self.torch.inference_mode():
            fwd = [self.model.forward_timed(self.x) for _ in range(n)]
        return {"fwd": np.median(np.array(fwd), 0).tolist(), "bwd": None, "update": 0.0,
                "s": (time.perf_counter() - t0) / n}


def check_picks(kinds: list[str], heads: list[int]) -> list[int]:
    """The outputs compared at the larger batches: the heads, and the logits feeding a softmax head
    (a saturated softmax alone would hide differences)."""
    return sorted(set(heads) | {h - 1 for h in heads if kinds[h] == "softmax" and h > 0})


def sgemm_rate(n: int = 1024, reps: int = 3) -> float:
    """numpy's float32 GEMM rate now, in GFLOP/s (best of `reps`): what BLAS gets under the current
    machine load, measured beside the samples it is compared with."""
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    c = np.empty_like(a)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.matmul(a, a, out=c)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def peak_rss_mb() -> float:
    """This process's peak resident memory. /proc's VmHWM, not getrusage's ru_maxrss: Linux carries
    the parent's peak over fork+exec into ru_maxrss, so every worker would report at least the
    parent's size."""
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"VmHWM:\s*(\d+)\s*kB", f.read())
        if m:
            return int(m.group(1)) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_main(kind: str) -> None:
    """Serve one contender: read a JSON request per line, answer one JSON line each."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                      # anything else printed (by us or by C code) goes to stderr
    runner = None
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg.pop("op")
        try:
            if op == "quit":
                break
            if op == "setup":
                t0 = time.perf_counter()
                runner = DarkpyRunner(msg) if kind == "darkpy" else TorchRunner(msg, kind == "torch-cl")
                reply = {"setup_s": time.perf_counter() - t0}
            elif op == "run":
                t0 = time.perf_counter()
                for _ in range(msg["n"]):
                    runner.op()
                reply = {"s": (time.perf_counter() - t0) / msg["n"]}
            elif op == "sgemm":
                reply = {"gflops": sgemm_rate()}
            elif op == "rss":
                reply = {"maxrss_mb": peak_rss_mb()}
                if hasattr(runner, "buffers"):
                    reply["darkpy_buffers_mb"] = runner.buffers()
            else:
                reply = getattr(runner, op)(**msg)
        except Exception:
            reply = {"error": traceback.format_exc()}
        proto.write(json.dumps(reply) + "\n")


# =====================================================================================================
# Parent side
# =====================================================================================================

class WorkerError(RuntimeError):
    pass


class Worker:
    """A contender's process, asked one request at a time."""

    def __init__(self, kind: str, threads: int):
        self.kind = kind
        self.log = tempfile.TemporaryFile(mode="w+")
        # darkpy's process gets the OpenBLAS setting the `darkpy` command makes for itself (see
        # darkpy/__init__.py; here numpy is imported before darkpy, too late for that line)
        extra = {"OPENBLAS_THREAD_TIMEOUT": "4"} if kind == "darkpy" else {}
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.engine", kind], cwd=ROOT,
                                     env=worker_env(threads, **extra), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)

    def call(self, op: str, **args) -> dict:
        try:
            self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.log.seek(0)
            raise WorkerError(f"{self.kind} worker died during {op}:\n{self.log.read()[-3000:]}")
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerError(f"{self.kind} {op} failed:\n{reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@dataclass
class NetSpec:
    """One network of the suite."""

    name: str
    cfg: Path
    size: int | None = None             # input width = height (None: the cfg's)
    train_batch: int | None = None      # None: inference only
    note: str = ""
    optional: bool = False              # skipped quietly when the cfg does not exist


@dataclass
class Options:
    threads: int = 2
    reps: int = 5                       # timed rounds per phase (at most)
    budget_s: float = 60.0              # per phase: fewer rounds when one round takes longer
    min_sample_s: float = 0.3           # a sample repeats the op until it lasts this long
    infer_batch: int = 64
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="darkpy-bench-")))
    log: object = sys.stderr


def _say(opts: Options, text: str) -> None:
    print(text, file=opts.log, flush=True)


# -- preparing a network -----------------------------------------------------------------------------

def edits_for(spec: NetSpec, batch: int) -> dict[str, str]:
    edits = {"net.batch": str(batch), "net.subdivisions": "1"}
    if spec.size:
        edits.update({"net.width": str(spec.size), "net.height": str(spec.size)})
    return edits


def sane_weights(layers, seed: int = 0) -> None:
    """Random weights a trained network could have: darkpy's init, plus batch-norm statistics and
    biases that are not the untrained zeros (rolling variance 0 would divide by sqrt(1e-5))."""
    rng = np.random.default_rng(seed)
    for layer in layers:
        init = getattr(layer, "init_weights", None)
        if init is not None:
            init(rng)
        bn = getattr(layer, "bn", None)
        if bn is not None:
            bn.scales.value[...] = rng.uniform(0.5, 1.5, bn.scales.value.shape)
            bn.rolling_mean[...] = rng.normal(0, 0.1, bn.rolling_mean.shape)
            bn.rolling_variance[...] = rng.uniform(0.5, 2.0, bn.rolling_variance.shape)
        biases = getattr(layer, "biases", None)
        if biases is not None and hasattr(biases, "value"):
            biases.value[...] = rng.normal(0, 0.1, biases.value.shape)


@dataclass
class Prepared:
    weights: str
    spec: str | None                    # pickled layer specs for torch (None: not translatable)
    unsupported: str | None
    input_shape: tuple
    classes: int
    flops: float                        # forward FLOPs per image (Darknet's count: conv + connected)
    conv_flops: float
    layer_rows: list                    # (index, kind, out_shape, flops) per layer
    momentum: float
    decay: float


#: Learning rate of the timed training steps (both frameworks): small, so that many steps on random
#: labels never diverge into inf/NaN (whose arithmetic could run at another speed).
TRAIN_RATE = 1e-3


def prepare(spec: NetSpec, opts: Options) -> Prepared:
    """Build the layers once (no buffers), give them sane random weights, write them for darkpy as a
    .weights file and for torch as pickled layer specs."""
    from types import SimpleNamespace

    from darkpy.cfg import CfgWarning, load_cfg
    from darkpy.network import build_layers
    from darkpy.weights import save_weights

    from .torch_model import TorchNet, Unsupported, layer_spec

    doc = load_cfg(spec.cfg)
    for key, value in edits_for(spec, 1).items():
        doc.set(key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CfgWarning)
        config, layers = build_layers(doc)
    sane_weights(layers)
    base = opts.tmp / spec.name
    weights = f"{base}.weights"
    save_weights(SimpleNamespace(layers=layers, seen=0), weights)
    spec_path, unsupported = f"{base}.torch.pkl", None
    try:
        specs = [layer_spec(l) for l in layers]
        TorchNet(specs)                 # every layer translates (else say why, and time darkpy alone)
        with open(spec_path, "wb") as f:
            pickle.dump(specs, f)
    except Unsupported as e:
        spec_path, unsupported = None, str(e)
    out = max((l for l in layers if l.kind != "cost"), key=lambda l: l.index)
    rows = [(l.index, l.kind, tuple(l.out_shape), float(l.flops())) for l in layers]
    return Prepared(weights, spec_path, unsupported, tuple(config.input_shape), out.outputs,
                    sum(r[3] for r in rows), sum(r[3] for r in rows if r[1] == "convolutional"), rows,
                    config.momentum, config.decay)


# -- one phase ---------------------------------------------------------------------------------------

def _summary(samples: list[float], batch: int) -> dict:
    med = statistics.median(samples)
    return {"samples_s": samples, "median_s": med, "min_s": min(samples), "max_s": max(samples),
            "images_per_s": batch / med}


def compare(a_path: str, b_path: str) -> dict:
    """Largest difference of every saved output, relative to that output's largest magnitude."""
    worst, worst_at, n = 0.0, None, 0
    with np.load(a_path) as a, np.load(b_path) as b:
        for key in a.files:
            x, y = a[key], b[key]
            if x.shape != y.shape:
                return {"ok": False, "why": f"layer {key}: shapes {x.shape} and {y.shape}"}
            scale = max(float(np.abs(x).max()), 1e-3)
            err = float(np.abs(x - y).max()) / scale
            if not np.isfinite(err):
                err = float("inf")
            if err >= worst:
                worst, worst_at = err, int(key)
            n += 1
    return {"ok": worst <= 1e-3, "max_rel_err": worst, "worst_layer": worst_at, "outputs_compared": n}


def run_phase(spec: NetSpec, prep: Prepared, mode: str, batch: int, opts: Options) -> dict:
    """One (network, mode, batch): start the contenders, check their outputs agree, time them."""
    phase = Phase(spec, prep, mode, batch, opts)
    try:
        phase.start()
        for step in (phase.check, phase.time, phase.finish):
            if "darkpy" not in phase.workers:       # darkpy failed: nothing to compare against
                break
            step()
    finally:
        for w in phase.workers.values():
            w.close()
    return phase.result


class Phase:
    """The steps of `run_phase`. A contender that fails (or disagrees with darkpy) is dropped with
    its error recorded; the others go on."""

    def __init__(self, spec: NetSpec, prep: Prepared, mode: str, batch: int, opts: Options):
        self.spec, self.prep, self.mode, self.batch, self.opts = spec, prep, mode, batch, opts
        self.name = f"{mode} b{batch}"
        self.result: dict = {"phase": self.name, "mode": mode, "batch": batch, "contenders": {}}
        self.workers: dict[str, Worker] = {}
        self.checks: dict[str, tuple[str, dict]] = {}

    def _drop(self, kind: str, error: str) -> None:
        self.result["contenders"].setdefault(kind, {})["error"] = error
        w = self.workers.pop(kind, None)
        if w is not None:
            w.close()

    def _ask(self, kind: str, op: str, **args) -> dict | None:
        try:
            return self.workers[kind].call(op, **args)
        except WorkerError as e:
            self._drop(kind, str(e))
            return None

    def start(self) -> None:
        """Write the input (and labels), start each contender in turn (set-up computes, untimed)."""
        spec, prep, batch, tmp = self.spec, self.prep, self.batch, self.opts.tmp
        rng = np.random.default_rng(batch + (1000 if self.mode == "train" else 0))
        stem = f"{spec.name}.{self.mode}{batch}"
        inp = tmp / f"{stem}.x.npy"
        np.save(inp, rng.random((batch, *prep.input_shape), dtype=np.float32))
        labels = None
        if self.mode == "train":
            labels = tmp / f"{stem}.y.npy"
            np.save(labels, rng.integers(0, prep.classes, batch))
        job = {"cfg": str(spec.cfg), "edits": edits_for(spec, batch), "weights": prep.weights,
               "spec": prep.spec, "batch": batch, "mode": self.mode, "threads": self.opts.threads,
               "input": str(inp), "labels": str(labels) if labels else None, "rate": TRAIN_RATE,
               "momentum": prep.momentum, "decay": prep.decay}
        if not prep.spec:
            self.result["torch_skipped"] = prep.unsupported
        for kind in [k for k in CONTENDERS if k == "darkpy" or prep.spec]:
            self.workers[kind] = Worker(kind, self.opts.threads)
            reply = self._ask(kind, "setup", **job)
            if reply:
                self.result["contenders"][kind] = {"setup_s": reply["setup_s"]}

    def check(self) -> None:
        """Outputs agree first: every layer at batch-1 inference, the heads otherwise, and the
        training loss (when no dropout makes it random). A torch contender that disagrees is dropped."""
        all_layers = self.mode == "infer" and self.batch == 1
        for kind in list(self.workers):
            path = str(self.opts.tmp / f"{self.spec.name}.{self.mode}{self.batch}.{kind}.npz")
            reply = self._ask(kind, "check", out=path, all_layers=all_layers)
            if reply:
                self.checks[kind] = (path, reply)
        if "darkpy" not in self.checks:
            return
        self.result["checks"] = {}
        has_dropout = any(r[1] == "dropout" for r in self.prep.layer_rows)
        for kind in [k for k in self.checks if k != "darkpy"]:
            c = compare(self.checks["darkpy"][0], self.checks[kind][0])
            loss_d, loss_t = self.checks["darkpy"][1].get("loss"), self.checks[kind][1].get("loss")
            if loss_d is not None and loss_t is not None:
                c["train_loss"] = {"darkpy": loss_d, "torch": loss_t, "compared": not has_dropout}
                if not has_dropout and abs(loss_d - loss_t) > 1e-2 * max(abs(loss_d), 1.0):
                    c.update(ok=False, why=f"training loss darkpy {loss_d:.6g}, torch {loss_t:.6g}")
            self.result["checks"][kind] = c
            if not c["ok"]:
                self._drop(kind, f"outputs differ from darkpy's: {c}")

    def time(self) -> None:
        """Warm up (the check already ran every inference kernel once), size the samples so each
        lasts >= min_sample_s, then alternate rounds, each after a short sgemm in darkpy's process
        (the BLAS rate available under the load of that moment). The last round also times every layer (a clock
        read per layer): for a slow op that instrumented op is the round's sample; fast ops take
        their sample as usual and then as many instrumented ops for per-layer medians."""
        inner, warm = {}, {}
        for kind in list(self.workers):
            t = self.checks[kind][1]["s"]
            if self.mode == "train" or t < 1.0:     # backward not run yet, or a fast op: measure
                reply = self._ask(kind, "run", n=1)
                if reply is None:
                    continue
                t = reply["s"]
            warm[kind] = t
            inner[kind] = max(1, int(round(self.opts.min_sample_s / max(t, 1e-6))))
            self.result["contenders"][kind].update(warmup_s=t, runs_per_sample=inner[kind])
        per_round = sum(warm[k] * inner[k] for k in self.workers) + PAUSE_S * len(self.workers)
        rounds = max(1, min(self.opts.reps, int(self.opts.budget_s // max(per_round, 1e-6))))
        self.samples: dict[str, list[float]] = {k: [] for k in self.workers}
        self.tables: dict[str, dict] = {}
        self.sgemm: list[float] = []
        order = list(self.workers)
        for r in range(rounds):
            last = r == rounds - 1
            reply = self._ask("darkpy", "sgemm") if "darkpy" in self.workers else None
            if reply:
                self.sgemm.append(reply["gflops"])
            for kind in order[r % len(order):] + order[:r % len(order)]:
                if kind not in self.workers:
                    continue
                if last and (kind == "darkpy" or self.mode == "infer"):
                    table = self._ask(kind, "layers", n=inner[kind])
                    if table is None:
                        continue
                    self.tables[kind] = table
                    if inner[kind] == 1:            # one slow op: the instrumented one is the sample
                        self.samples[kind].append(table["s"])
                        time.sleep(PAUSE_S)
                        continue
                reply = self._ask(kind, "run", n=inner[kind])
                if reply is not None:
                    self.samples[kind].append(reply["s"])
                time.sleep(PAUSE_S)

    def finish(self) -> None:
        """Medians, the peer and the ratio, per-layer tables, GFLOP/s and peak memory."""
        result, prep, batch = self.result, self.prep, self.batch
        flops = prep.flops * batch * (3 if self.mode == "train" else 1)
        if self.sgemm:
            result["sgemm_gflops"] = statistics.median(self.sgemm)
        timed = [k for k in self.workers if self.samples.get(k)]
        for kind in timed:
            c = result["contenders"][kind]
            c.update(_summary(self.samples[kind], batch))
            c["gflops"] = flops / c["median_s"] / 1e9
        torch_kinds = [k for k in timed if k != "darkpy"]
        if torch_kinds and "darkpy" in timed:
            peer = min(torch_kinds, key=lambda k: result["contenders"][k]["median_s"])
            result["peer"] = peer
            result["ratio"] = (result["contenders"]["darkpy"]["images_per_s"]
                               / result["contenders"][peer]["images_per_s"])
        if "darkpy" in self.tables:
            per = {"darkpy": self.tables["darkpy"]}
            if result.get("peer") in self.tables:
                per["torch"] = self.tables[result["peer"]]
            result["layers"] = layer_table(prep, per, batch)
            if self.mode == "infer":
                result["conv_forward_gflops"] = conv_gflops(prep, per["darkpy"]["fwd"], batch)
                if "torch" in per:
                    result["torch_conv_forward_gflops"] = conv_gflops(prep, per["torch"]["fwd"], batch)
        for kind in list(self.workers):
            reply = self._ask(kind, "rss")
            if reply:
                result["contenders"][kind].update(reply)


def layer_table(prep: Prepared, table: dict, batch: int) -> list[dict]:
    rows = []
    for (index, kind, shape, flops) in prep.layer_rows:
        row = {"index": index, "kind": kind, "out_shape": list(shape), "mflop": flops * batch / 1e6,
               "darkpy_fwd_ms": table["darkpy"]["fwd"][index] * 1e3}
        if table["darkpy"]["bwd"] is not None:
            row["darkpy_bwd_ms"] = table["darkpy"]["bwd"][index] * 1e3
        if "torch" in table and table["torch"]["fwd"] is not None:
            row["torch_fwd_ms"] = table["torch"]["fwd"][index] * 1e3
        rows.append(row)
    if table["darkpy"]["update"]:
        rows.append({"index": None, "kind": "update", "darkpy_fwd_ms": 0.0,
                     "darkpy_bwd_ms": table["darkpy"]["update"] * 1e3})
    return rows


def conv_gflops(prep: Prepared, fwd_times: list[float], batch: int) -> float:
    t = sum(fwd_times[i] for (i, kind, _s, _f) in prep.layer_rows if kind == "convolutional")
    return prep.conv_flops * batch / t / 1e9 if t > 0 else 0.0


def bench_network(spec: NetSpec, opts: Options) -> dict:
    _say(opts, f"== {spec.name} ({spec.cfg})")
    prep = prepare(spec, opts)
    out = {"name": spec.name, "cfg": _rel(spec.cfg), "input": list(prep.input_shape), "note": spec.note,
           "gflop_per_image": prep.flops / 1e9, "phases": []}
    phases = [("infer", 1), ("infer", opts.infer_batch)]
    if spec.train_batch:
        phases.append(("train", spec.train_batch))
    for mode, batch in phases:
        t0 = time.perf_counter()
        r = run_phase(spec, prep, mode, batch, opts)
        _say(opts, f"   {r['phase']:<10} {phase_line(r)}   ({time.perf_counter() - t0:.0f} s)")
        out["phases"].append(r)
    return out


def phase_line(r: dict) -> str:
    parts = []
    for kind, c in r["contenders"].items():
        if "error" in c:
            last = [line for line in c["error"].strip().splitlines() if line.strip()][-1]
            parts.append(f"{kind}: ERROR ({last.strip()[:160]})")
        elif "images_per_s" in c:
            parts.append(f"{kind} {c['images_per_s']:.1f} img/s")
    if "ratio" in r:
        parts.append(f"ratio {r['ratio']:.2f}x vs {r['peer']}")
    if r.get("torch_skipped"):
        parts.append(f"torch not run: {r['torch_skipped']}")
    return ", ".join(parts)


def _rel(p: Path) -> str:
    p = Path(p).resolve()
    for base, label in ((ROOT, ""), (SHARED, "../shared/")):
        try:
            return label + str(p.relative_to(base))
        except ValueError:
            pass
    return str(p)


# -- the machine ---------------------------------------------------------------------------------------

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


def machine_info(threads: int) -> dict:
    import numba
    import numpy

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            cpu = m.group(1).strip() if m else cpu
    except OSError:
        pass
    versions = {"python": platform.python_version(), "numpy": numpy.__version__, "numba": numba.__version__}
    try:
        r = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True, timeout=120)
        versions["torch"] = r.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        versions["torch"] = None
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem_gb, 1), "threads": threads,
            "platform": platform.platform(), "versions": versions,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "loadavg_start": os.getloadavg()}


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


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in CONTENDERS:
        sys.exit(f"usage: python -m benchmarks.engine {{{'|'.join(CONTENDERS)}}}  (a worker; see run.py)")
    worker_main(sys.argv[1])
