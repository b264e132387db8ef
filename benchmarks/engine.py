"""How the suite measures: contenders one at a time, each sample in its own process and its own
quiet window, outputs checked equal first.

Contenders: `darkpy`, `torch` (NCHW), `torch-cl` (torch with `channels_last`) and, for inference,
`onnxruntime` (CPU provider) on the network exported to ONNX (`onnx_models.ONNX_EXPORTERS`: by
darkpy's own exporter, or, as a cross-check, the torch translation). The faster torch layout is
darkpy's PyTorch peer.

Fairness, in order of what it rules out:
- **Same environment.** Every worker process (`python -m benchmarks.worker KIND`, see there) gets
  `environment.worker_env`: built from nothing, the same for all, with the thread counts set
  explicitly; never a copy of this parent's `os.environ`. The parent imports darkpy (to build the
  weights) and importing darkpy changes nothing, but anything the user's shell set to tune a
  runtime (OPENBLAS_CORETYPE, OMP_WAIT_POLICY, ...) is dropped too, and recorded. Each worker
  reports what it actually runs with (`runtime`: threads, OpenMP/OpenBLAS variables, BLAS kernel).
  The darkpy worker sets for itself what the `darkpy` command sets (darkpy/process.py), unless
  `--darkpy-as library`.
- **Never two at once.** Only one worker process exists at any time: each sample starts its
  contender's process, sets it up, warms it up, takes ONE timed sample (the op repeated until it
  lasts >= min_sample_s), and the process quits; the parent checks that it has exited, waits a
  settle period (a pool's spinning threads stop with their process, but the OS needs a moment) and
  until the machine looks idle (/proc/stat), and records that busy share beside the sample. The
  contenders' order rotates every round.
- **Same outputs.** Before any timing, every contender's outputs are compared with darkpy's (every
  layer at batch-1 inference for torch; the heads and softmax logits otherwise and for ONNX Runtime;
  the training loss); one that disagrees is not timed.
"""
from __future__ import annotations

import os
import pickle
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .environment import ROOT, wait_quiet
from .worker import check_picks
from .worker_process import Unavailable, Worker, WorkerError  # noqa: F401 (Unavailable: the phases')

SHARED = Path(os.environ.get("DARKPY_SHARED", ROOT.parent / "shared")).resolve()
#: Environment variable naming a built Darknet executable (the C reference); skipped when unset.
DARKNET_ENV = "DARKPY_BENCH_DARKNET"
TORCH_KINDS = ("torch", "torch-cl")


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
    reps: int = 5                       # timed rounds per phase (one sample per contender each)
    min_sample_s: float = 0.3           # a sample repeats the op until it lasts this long
    warm_s: float = 0.3                 # warm-up in each process before its sample
    settle_s: float = 1.0               # after a worker exits, before the next starts
    max_busy: float = 0.10              # the machine counts as quiet below this busy share ...
    max_wait_s: float = 10.0            # ... waited for at most this long (then recorded as not quiet)
    infer_batch: int = 64
    onnx_from: str = "darkpy"           # which exporter feeds onnxruntime (ONNX_EXPORTERS)
    darkpy_as: str = "command"          # "command": the darkpy worker sets what `darkpy` sets; "library"
    contenders: tuple = ("darkpy", "torch", "torch-cl", "onnxruntime")
    fixed_threads: bool = False         # darkpy runs every layer on `threads` (no per-layer choice)
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


def layer_desc(layer) -> str:
    """A convolution's shape in one phrase (for the per-layer tables): `3x3/1 32->64 on 16x16`."""
    if layer.kind != "convolutional":
        return ""
    c, h, w = layer.in_shape
    g = f" g{layer.groups}" if getattr(layer, "groups", 1) != 1 else ""
    return f"{layer.size}x{layer.size}/{layer.stride_x} {c}->{layer.n} on {h}x{w}{g}"


@dataclass
class Prepared:
    weights: str
    spec: str | None                    # pickled layer specs for torch (None: not translatable)
    unsupported: str | None             # why torch cannot run it (inference)
    train_unsupported: str | None       # why torch cannot train it
    input_shape: tuple
    classes: int
    flops: float                        # forward FLOPs per image (Darknet's count: conv + connected)
    conv_flops: float
    layer_rows: list                    # (index, kind, out_shape, flops) per layer
    descs: list                         # layer_desc per layer
    heads: list                         # the output layer and every yolo layer
    detector: dict | None               # yolo heads: what random truth needs (max boxes, classes)
    momentum: float
    decay: float
    seq: dict | None = None             # sequence nets: time_steps, vocabulary, optimiser keys


#: Sections that make a network a sequence model (token ids in, `torch_seq.py` on the torch side).
SEQ_KINDS = ("embedding", "attention", "crossentropy")


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
    seq = None
    if any(l.kind in SEQ_KINDS for l in layers):
        seq = {"steps": config.time_steps, "vocab": layers[-1].outputs,
               "opt": {k: float(getattr(config, k)) for k in ("B1", "B2", "eps", "weight_decay", "clip_norm")}}
        spec_path, unsupported, train_unsupported = translate_seq(layers, seq, f"{base}.torch.pkl")
    else:
        spec_path, unsupported, train_unsupported = translate(layers, f"{base}.torch.pkl")
    out = max((l for l in layers if l.kind != "cost"), key=lambda l: l.index)
    rows = [(l.index, l.kind, tuple(l.out_shape), float(l.flops())) for l in layers]
    yolos = [l for l in layers if l.kind == "yolo"]
    detector = {"max_boxes": max(l.max_boxes for l in yolos), "classes": yolos[0].classes} if yolos else None
    per_item = seq["steps"] if seq else 1        # a sequence's FLOPs: its rows' (tokens')
    return Prepared(weights, spec_path, unsupported, train_unsupported, tuple(config.input_shape), out.outputs,
                    sum(r[3] for r in rows) * per_item, sum(r[3] for r in rows if r[1] == "convolutional"), rows,
                    [layer_desc(l) for l in layers], sorted({out.index} | {l.index for l in yolos}), detector,
                    config.momentum, config.decay, seq)


def translate(layers, path: str) -> tuple[str | None, str | None, str | None]:
    """Pickle the torch translation's layer specs; say why torch cannot run (or train) the net."""
    try:
        from .torch_model import TorchNet, Unsupported, layer_spec
    except ImportError as e:
        return None, f"torch not importable ({e})", "torch not importable"
    try:
        specs = [layer_spec(l) for l in layers]
        model = TorchNet(specs)         # every layer translates (else say why, and time darkpy alone)
    except Unsupported as e:
        return None, str(e), str(e)
    with open(path, "wb") as f:
        pickle.dump(specs, f)
    return path, None, model.train_unsupported()


def translate_seq(layers, seq: dict, path: str) -> tuple[str | None, str | None, str | None]:
    """A sequence net for torch (`torch_seq.py`): its layer dicts, pickled with the time steps and
    the optimiser keys. Trained only (a Transformer training step is what the suite times)."""
    try:
        from .torch_seq import TorchSeqNet, Unsupported, seq_specs
    except ImportError as e:
        return None, f"torch not importable ({e})", "torch not importable"
    try:
        specs = seq_specs(layers)
        TorchSeqNet(specs, steps=seq["steps"])
    except Unsupported as e:
        return None, str(e), str(e)
    with open(path, "wb") as f:
        pickle.dump({"specs": specs, **seq}, f)
    return path, None, None


def random_truth(rng: np.random.Generator, batch: int, detector: dict) -> np.ndarray:
    """Detector truth rows as darkpy reads them: 1-6 random boxes per image (x, y, w, h, class),
    the rest zero (the list ends at the first x == 0)."""
    truth = np.zeros((batch, 5 * detector["max_boxes"]), np.float32)
    for b in range(batch):
        k = int(rng.integers(1, min(6, detector["max_boxes"]) + 1))
        boxes = np.column_stack([rng.uniform(0.05, 0.95, k), rng.uniform(0.05, 0.95, k),
                                 rng.uniform(0.05, 0.6, k), rng.uniform(0.05, 0.6, k),
                                 rng.integers(0, detector["classes"], k)])
        truth[b, :5 * k] = boxes.reshape(-1)
    return truth


# -- one phase ---------------------------------------------------------------------------------------

def _summary(samples: list[float], batch: int) -> dict:
    med = statistics.median(samples)
    return {"samples_s": samples, "median_s": med, "min_s": min(samples), "max_s": max(samples),
            "images_per_s": batch / med}


def compare(ref_path: str, got_path: str) -> dict:
    """Largest difference of every output the contender saved, relative to that output's largest
    magnitude in darkpy's (the reference, which saves at least as many)."""
    worst, worst_at, n = 0.0, None, 0
    with np.load(ref_path) as a, np.load(got_path) as b:
        for key in b.files:
            if key not in a.files:
                return {"ok": False, "why": f"layer {key}: not among darkpy's saved outputs"}
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
    if n == 0:
        return {"ok": False, "why": "no output compared"}
    return {"ok": worst <= 1e-3, "max_rel_err": worst, "worst_layer": worst_at, "outputs_compared": n}


def run_phase(spec: NetSpec, prep: Prepared, mode: str, batch: int, opts: Options) -> dict:
    """One (network, mode, batch): check the contenders' outputs agree, then time them."""
    phase = Phase(spec, prep, mode, batch, opts)
    phase.start()
    for step in (phase.check, phase.time, phase.finish):
        if "darkpy" not in phase.kinds:         # darkpy failed: nothing to compare against
            break
        step()
    return phase.result


class Phase:
    """The steps of `run_phase`. A contender that fails (or disagrees with darkpy) is dropped with
    its error recorded; the others go on."""

    def __init__(self, spec: NetSpec, prep: Prepared, mode: str, batch: int, opts: Options):
        self.spec, self.prep, self.mode, self.batch, self.opts = spec, prep, mode, batch, opts
        self.name = f"{mode} b{batch}"
        self.result: dict = {"phase": self.name, "mode": mode, "batch": batch, "contenders": {}, "windows": []}
        self.kinds: list[str] = []
        self.checks: dict[str, tuple[str, dict]] = {}
        self.job: dict = {}

    def _drop(self, kind: str, error: str) -> None:
        self.result["contenders"].setdefault(kind, {})["error"] = error
        if kind in self.kinds:
            self.kinds.remove(kind)

    def _skip(self, kind: str, why: str) -> None:
        self.result["contenders"].setdefault(kind, {})["skipped"] = why

    def session(self, kind: str, script, record: bool = True, drop: bool = True):
        """One worker's whole life, alone on the machine: wait for a quiet window, start the
        process, set it up, run `script(worker)` (a list of (op, args) or a function), make sure the
        process has exited. When it fails: None and the contender dropped (`drop`), else Unavailable."""
        o = self.opts
        window = wait_quiet(o.settle_s, o.max_busy, o.max_wait_s)
        window.update(kind=kind, t=time.time())
        w = Worker(kind, o)
        try:
            setup = w.call("setup", **self.job_for(kind))
            if callable(script):
                out = script(w)
            else:
                out = [w.call(op, **args) for op, args in script]
        except WorkerError as e:
            w.close()
            if not drop:
                raise Unavailable(str(e)) from None
            self._drop(kind, str(e))
            return None
        window["exited_cleanly"] = w.close()
        window["setup_s"] = setup["setup_s"]
        if record:
            self.result["windows"].append(window)
        if isinstance(out, dict):
            out["window"] = window
        return out

    def job_for(self, kind: str) -> dict:
        job = dict(self.job)
        if kind == "onnxruntime":
            job.update(onnx=self.onnx, onnx_outputs=self.onnx_outputs, onnx_source=self.opts.onnx_from)
        return job

    def start(self) -> None:
        """Write the input (and labels or truth), pick the contenders, export ONNX if needed."""
        spec, prep, batch, tmp = self.spec, self.prep, self.batch, self.opts.tmp
        rng = np.random.default_rng(batch + (1000 if self.mode == "train" else 0))
        stem = f"{spec.name}.{self.mode}{batch}"
        inp = tmp / f"{stem}.x.npy"
        labels = None
        rows = batch
        if prep.seq:            # token ids, time-major rows (batch sequences of `steps`), and targets
            rows = batch * prep.seq["steps"]
            np.save(inp, rng.integers(32, 127, (rows, 1)).astype(np.float32))
            labels = tmp / f"{stem}.y.npy"
            np.save(labels, rng.integers(32, 127, (rows, 1)).astype(np.float32))
        else:
            np.save(inp, rng.random((batch, *prep.input_shape), dtype=np.float32))
        if self.mode == "train" and not prep.seq:
            labels = tmp / f"{stem}.y.npy"
            y = random_truth(rng, batch, prep.detector) if prep.detector else rng.integers(0, prep.classes, batch)
            np.save(labels, y)
        self.job = {"cfg": str(spec.cfg), "edits": edits_for(spec, batch), "weights": prep.weights,
                    "spec": prep.spec, "batch": rows, "mode": self.mode, "threads": self.opts.threads,
                    "input": str(inp), "labels": str(labels) if labels else None, "rate": TRAIN_RATE,
                    "momentum": prep.momentum, "decay": prep.decay, "seq": bool(prep.seq),
                    "fixed_threads": self.opts.fixed_threads}
        wanted = self.opts.contenders
        self.kinds = ["darkpy"]
        torch_why = prep.unsupported or (prep.train_unsupported if self.mode == "train" else None)
        for kind in TORCH_KINDS:
            if kind in wanted:
                if prep.seq and kind == "torch-cl":
                    self._skip(kind, "a sequence net has no channels_last layout")
                elif torch_why:
                    self._skip(kind, torch_why)
                    self.result["torch_skipped"] = torch_why
                else:
                    self.kinds.append(kind)
        if "onnxruntime" in wanted:
            if self.mode != "infer":
                pass                            # an inference engine: not a training contender
            else:
                self.onnx_outputs = check_picks([r[1] for r in prep.layer_rows], prep.heads)
                self.onnx = str(tmp / f"{stem}.onnx")
                try:
                    from .onnx_models import ONNX_EXPORTERS

                    ONNX_EXPORTERS[self.opts.onnx_from](self, self.onnx, self.onnx_outputs)
                    self.kinds.append("onnxruntime")
                    self.result["onnx"] = {"source": self.opts.onnx_from, "outputs": self.onnx_outputs,
                                           "mb": os.path.getsize(self.onnx) / 2 ** 20}
                except Unavailable as e:
                    self._skip("onnxruntime", str(e))
        for kind in self.kinds:
            self.result["contenders"].setdefault(kind, {})

    def check(self) -> None:
        """Outputs agree first: every layer at batch-1 inference (torch), the heads and softmax
        logits otherwise (and for ONNX Runtime), the training loss (when no dropout makes it
        random). A contender that disagrees is dropped. Also records each one's runtime."""
        all_layers = self.mode == "infer" and self.batch == 1
        for kind in list(self.kinds):
            path = str(self.opts.tmp / f"{self.spec.name}.{self.mode}{self.batch}.{kind}.npz")

            def script(w, path=path, kind=kind):
                reply = w.call("check", out=path, all_layers=all_layers and kind != "onnxruntime")
                reply["runtime"] = w.call("runtime")
                return reply

            reply = self.session(kind, script)
            if reply:
                self.checks[kind] = (path, reply)
                self.result["contenders"][kind]["runtime"] = reply["runtime"]
        if "darkpy" not in self.checks:
            self.kinds = []
            return
        self.result["checks"] = {}
        has_dropout = any(r[1] == "dropout" for r in self.prep.layer_rows)
        for kind in [k for k in self.checks if k != "darkpy"]:
            c = compare(self.checks["darkpy"][0], self.checks[kind][0])
            loss_d, loss_t = self.checks["darkpy"][1].get("loss"), self.checks[kind][1].get("loss")
            if loss_d is not None and loss_t is not None:
                c["train_loss"] = {"darkpy": loss_d, "torch": loss_t, "compared": not has_dropout}
                if not has_dropout and abs(loss_d - loss_t) > 1e-3 * max(abs(loss_d), 1.0):
                    c.update(ok=False, why=f"training loss darkpy {loss_d:.6g}, torch {loss_t:.6g}")
            self.result["checks"][kind] = c
            if not c["ok"]:
                self._drop(kind, f"outputs differ from darkpy's: {c}")

    def time(self) -> None:
        """`reps` rounds; in each, every contender in turn (rotating) gets its own process: warm-up,
        ONE sample sized from the warm-up to last >= min_sample_s, and (darkpy) the sgemm rate of
        that moment; the last round also times every layer (darkpy; torch at inference)."""
        o = self.opts
        self.samples: dict[str, list[float]] = {k: [] for k in self.kinds}
        self.tables: dict[str, dict] = {}
        self.sgemm: list[float] = []
        self.rss: dict[str, list[dict]] = {k: [] for k in self.kinds}
        if "darkpy" in self.kinds:
            # one untimed darkpy process first: it compiles what this phase runs that the kernel
            # cache lacks, so that no timed process's warm-up, nor its peak memory, holds a compile
            # (a cold cache put tiny-gpt's training at 368 MB against 250 warm)
            self.session("darkpy", lambda w: w.call("warm", min_s=0.0, min_ops=1), record=False)
        order = list(self.kinds)
        for r in range(o.reps):
            last = r == o.reps - 1
            for kind in order[r % len(order):] + order[:r % len(order)]:
                if kind not in self.kinds:
                    continue

                def script(w, kind=kind, last=last):
                    warm = w.call("warm", min_s=o.warm_s, min_ops=2)
                    n = max(1, round(o.min_sample_s / max(warm["last_s"], 1e-6)))
                    out = {"s": w.call("run", n=n)["s"], "n": n, "warm": warm}
                    if kind == "darkpy":
                        out["sgemm"] = w.call("sgemm")["gflops"]
                    if last and (kind == "darkpy" or (self.mode == "infer" and kind in TORCH_KINDS)):
                        out["layers"] = w.call("layers", n=max(1, min(n, 20)))
                    out["rss"] = w.call("rss")
                    return out

                got = self.session(kind, script)
                if got is None:
                    continue
                got["window"]["sample_s"] = got["s"]
                self.samples[kind].append(got["s"])
                self.rss[kind].append(got["rss"])
                c = self.result["contenders"][kind]
                c.setdefault("runs_per_sample", []).append(got["n"])
                c.setdefault("warmup_ops", []).append(got["warm"]["ops"])
                if "sgemm" in got:
                    self.sgemm.append(got["sgemm"])
                if "layers" in got:
                    self.tables[kind] = layers_reply(got["layers"])

    def finish(self) -> None:
        """Medians, the peers and the ratios, per-layer tables, GFLOP/s and peak memory."""
        result, prep, batch = self.result, self.prep, self.batch
        flops = batch * (train_flops(prep) if self.mode == "train" else prep.flops)
        if self.sgemm:
            result["sgemm_gflops"] = statistics.median(self.sgemm)
        timed = [k for k in self.kinds if self.samples.get(k)]
        for kind in timed:
            c = result["contenders"][kind]
            c.update(_summary(self.samples[kind], batch))
            c["gflops"] = flops / c["median_s"] / 1e9
            rss = self.rss[kind]
            c["maxrss_mb"] = max(x["maxrss_mb"] for x in rss)
            if rss[-1].get("darkpy_buffers_mb"):
                c["darkpy_buffers_mb"] = rss[-1]["darkpy_buffers_mb"]
        torch_kinds = [k for k in timed if k in TORCH_KINDS]
        if "darkpy" in timed:
            ips = result["contenders"]["darkpy"]["images_per_s"]
            if torch_kinds:
                peer = min(torch_kinds, key=lambda k: result["contenders"][k]["median_s"])
                result["peer"] = peer
                result["ratio"] = ips / result["contenders"][peer]["images_per_s"]
            if "onnxruntime" in timed:
                result["ratio_ort"] = ips / result["contenders"]["onnxruntime"]["images_per_s"]
        windows = result["windows"]
        busy = [w["busy"] for w in windows if w.get("busy") is not None]
        result["quiet"] = {"windows": len(windows), "not_quiet": sum(not w["quiet"] for w in windows),
                           "other_workers": sum(bool(w.get("other_workers")) for w in windows),
                           "max_busy": max(busy) if busy else None,
                           "unclean_exits": sum(not w.get("exited_cleanly", True) for w in windows)}
        if "darkpy" in self.tables:
            per = {"darkpy": self.tables["darkpy"]}
            if result.get("peer") in self.tables:
                per["torch"] = self.tables[result["peer"]]
            result["layers"] = layer_table(prep, per, batch)
            if self.mode == "infer":
                result["conv_forward_gflops"] = conv_gflops(prep, per["darkpy"]["fwd"], batch,
                                                            per["darkpy"].get("computed_flops", {}))
                if "torch" in per:
                    result["torch_conv_forward_gflops"] = conv_gflops(prep, per["torch"]["fwd"], batch)


def layers_reply(table: dict) -> dict:
    """A worker's per-layer timing as the tables read it: `computed_flops` keyed by layer index
    again (JSON made the keys strings)."""
    return {**table, "computed_flops": {int(i): f for i, f in table.get("computed_flops", {}).items()}}


def layer_table(prep: Prepared, table: dict, batch: int) -> list[dict]:
    rows = []
    computed = table["darkpy"].get("computed_flops", {})
    for (index, kind, shape, flops) in prep.layer_rows:
        row = {"index": index, "kind": kind, "out_shape": list(shape), "mflop": flops * batch / 1e6,
               "desc": prep.descs[index], "darkpy_fwd_ms": table["darkpy"]["fwd"][index] * 1e3}
        if index in computed:         # darkpy computed it with fewer operations: count those
            row["mflop"] = computed[index] * batch / 1e6
            row["desc"] += f", averaged first ({flops * batch / 1e6:.3g} MFLOP as a convolution)"
        if table["darkpy"]["bwd"] is not None:
            row["darkpy_bwd_ms"] = table["darkpy"]["bwd"][index] * 1e3
        if "torch" in table and table["torch"]["fwd"] is not None:
            row["torch_fwd_ms"] = table["torch"]["fwd"][index] * 1e3
        rows.append(row)
    if table["darkpy"]["update"]:
        rows.append({"index": None, "kind": "update", "darkpy_fwd_ms": 0.0,
                     "darkpy_bwd_ms": table["darkpy"]["update"] * 1e3})
    return rows


def train_flops(prep: Prepared) -> float:
    """A training step's FLOPs per image: the forward, the input gradient and the weight gradient
    of every layer (3x the forward), less the first layer's input gradient, which neither darkpy
    nor PyTorch computes (the network's input needs none)."""
    first = prep.layer_rows[0][3] if prep.layer_rows and prep.layer_rows[0][0] == 0 else 0.0
    return 3 * prep.flops - first


def conv_gflops(prep: Prepared, fwd_times: list[float], batch: int, computed: dict | None = None) -> float:
    """The convolution layers' FLOPs over their forward time: each layer's nominal count, or what
    it `computed` instead (layer index -> FLOPs per item, e.g. a convolution averaging first)."""
    computed = computed or {}
    t = sum(fwd_times[i] for (i, kind, _s, _f) in prep.layer_rows if kind == "convolutional")
    flops = sum(computed.get(i, f) for (i, kind, _s, f) in prep.layer_rows if kind == "convolutional")
    return flops * batch / t / 1e9 if t > 0 else 0.0


def bench_network(spec: NetSpec, opts: Options) -> dict:
    _say(opts, f"== {spec.name} ({spec.cfg})")
    prep = prepare(spec, opts)
    out = {"name": spec.name, "cfg": _rel(spec.cfg), "input": list(prep.input_shape), "note": spec.note,
           "gflop_per_image": prep.flops / 1e9, "phases": []}
    phases = [] if prep.seq else [("infer", 1), ("infer", opts.infer_batch)]
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
        elif "skipped" in c:
            parts.append(f"{kind}: skipped ({c['skipped'][:80]})")
        elif "images_per_s" in c:
            parts.append(f"{kind} {c['images_per_s']:.1f} img/s")
    if "ratio" in r:
        parts.append(f"ratio {r['ratio']:.2f}x vs {r['peer']}")
    if "ratio_ort" in r:
        parts.append(f"{r['ratio_ort']:.2f}x vs onnxruntime")
    q = r.get("quiet") or {}
    if q.get("not_quiet"):
        parts.append(f"{q['not_quiet']} of {q['windows']} windows not quiet (busy up to {q['max_busy']:.0%})")
    return ", ".join(parts)


def _rel(p: Path) -> str:
    p = Path(p).resolve()
    for base, label in ((ROOT, ""), (SHARED, "../shared/")):
        try:
            return label + str(p.relative_to(base))
        except ValueError:
            pass
    return str(p)
