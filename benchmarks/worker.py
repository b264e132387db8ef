"""A contender's process: `python -m benchmarks.worker KIND [--darkpy-as library]`.

KIND is `darkpy`, `torch` (NCHW), `torch-cl` (torch in channels_last) or `onnxruntime`. The parent
(engine.py) starts it with the same explicitly built environment for every KIND, sends one JSON
request per line on stdin and reads one JSON reply per line. Only one worker lives at a time.

The darkpy contender first does what the `darkpy` command does for its own process
(`darkpy.process.set_command_environment`, before numpy loads), unless `--darkpy-as library`: then it
runs as a library user who set nothing. The torch process never imports darkpy or numba (it gets the
network as `torch_model.layer_spec` dicts); the onnxruntime process imports neither darkpy nor torch.
Every worker reports what it actually runs with (`runtime`): thread counts, the OpenMP and OpenBLAS
variables it sees, the BLAS/OpenMP libraries threadpoolctl finds, numba's threading layer.
"""
from __future__ import annotations

import sys

if __name__ == "__main__":
    KIND = sys.argv[1] if len(sys.argv) > 1 else ""
    if KIND == "darkpy" and "--darkpy-as" not in sys.argv[2:]:
        from darkpy.process import set_command_environment

        set_command_environment()

import json
import os
import pickle
import re
import resource
import time
import traceback
import warnings

import numpy as np

CONTENDERS = ("darkpy", "torch", "torch-cl", "onnxruntime")
#: Variables a worker reports as seen inside its process (after its own configuration).
REPORTED_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
                "OPENBLAS_L2_SIZE", "OPENBLAS_THREAD_TIMEOUT", "MKL_NUM_THREADS", "KMP_BLOCKTIME",
                "GOMP_SPINCOUNT", "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER")


def check_picks(kinds: list[str], heads: list[int]) -> list[int]:
    """The outputs compared at the larger batches: the heads, and the logits feeding a softmax head
    (a saturated softmax alone would hide differences)."""
    return sorted(set(heads) | {h - 1 for h in heads if kinds[h] in ("softmax", "crossentropy") and h > 0})


def load_truth(job: dict, classes: int, truths: int) -> np.ndarray | None:
    """The training truth of a phase: a (batch, truths) array as saved (detectors), or one-hot rows
    of saved class labels (classifiers)."""
    if not job.get("labels"):
        return None
    labels = np.load(job["labels"])
    if labels.ndim == 2:
        return labels.astype(np.float32)
    truth = np.zeros((len(labels), truths), np.float32)
    truth[np.arange(len(labels)), labels] = 1
    return truth


def runtime_info() -> dict:
    """What this process runs with, as the libraries it loaded report it."""
    out = {"env": {k: os.environ.get(k) for k in REPORTED_ENV}}
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        out["threadpools"] = "threadpoolctl not installed"
    else:
        out["threadpools"] = [{k: i.get(k) for k in ("user_api", "internal_api", "prefix", "version",
                                                      "architecture", "num_threads", "threading_layer")}
                              for i in threadpool_info()]
    if "numba" in sys.modules:
        import numba
        try:
            layer = numba.threading_layer()
        except ValueError:
            layer = None                # no parallel kernel ran yet
        out["numba"] = {"threads": numba.get_num_threads(), "threading_layer": layer}
    if "torch" in sys.modules:
        import torch
        out["torch"] = {"threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
                        "mkldnn": torch.backends.mkldnn.is_available(),
                        "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    return out


def peak_rss_mb() -> float:
    """This process's peak resident memory. /proc's VmHWM, not getrusage's ru_maxrss: Linux carries
    the parent's peak over fork+exec into ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"VmHWM:\s*(\d+)\s*kB", f.read())
        if m:
            return int(m.group(1)) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sgemm_rate(n: int = 1024, reps: int = 3) -> float:
    """numpy's float32 GEMM rate now, in GFLOP/s (best of `reps`)."""
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    c = np.empty_like(a)
    np.matmul(a, a, out=c)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.matmul(a, a, out=c)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


# -- the runners ---------------------------------------------------------------------------------------

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
        self.net.thread_plans.enabled = not job.get("fixed_threads", False)
        self.job = job
        self.x = np.load(job["input"])
        self.truth = load_truth(job, self.net.output_layer.outputs, self.net.truths)
        self.heads = sorted({self.net.output_layer.index}
                            | {l.index for l in self.net.layers if l.kind == "yolo"})
        if job["mode"] == "train":
            self.net.share_deltas()     # as `darkpy train` runs (darkpy/deltas_plan.py)
        if job["mode"] == "infer":
            # as `darkpy predict/detect/valid/map` run: only the compared outputs keep their own
            # buffers (`check`, which reads every layer, gives every layer its own again)
            self.net.share_outputs(keep=self.heads)

    def buffers(self) -> dict:
        """darkpy's allocated buffers by role, in MB."""
        from darkpy.deltas_plan import delta_bytes
        from darkpy.outputs_plan import output_bytes
        out = {"output": output_bytes(self.net.layers), "delta": delta_bytes(self.net.layers), "other": 0}
        for layer in self.net.layers:
            extra = getattr(layer, "extra_buffers", None)
            out["other"] += sum(a.nbytes for a in extra()) if extra else 0
            out["other"] += sum(p.value.nbytes + p.grad.nbytes for p in layer.params)
        try:
            from darkpy.kernels import im2col
            out["workspace"] = sum(ws.nbytes for ws in getattr(im2col, "_WORKSPACES", {}).values())
        except ImportError:
            pass
        return {k: v / 2 ** 20 for k, v in out.items()}

    def settled(self) -> bool:
        """True once the network's per-layer thread counts are chosen (darkpy/threadplan.py):
        the passes that measure them are part of the warm-up, not of the timed sample."""
        return self.net.thread_plans.settled()

    def op(self) -> None:
        if self.job["mode"] == "train":
            self.net.forward(self.x, self.truth, train=True)
            self.net.backward()
            self.net.update(self.job["rate"])
        else:
            self.net.forward(self.x)

    def check(self, out: str, all_layers: bool) -> dict:
        self.net.unshare_outputs()
        self.net.forward(self.x)
        picks = range(len(self.net.layers)) if all_layers else check_picks(
            [l.kind for l in self.net.layers], self.heads)
        np.savez(out, **{str(i): self.net.layers[i].output.reshape(len(self.x), -1) for i in picks})
        reply = {"heads": self.heads}
        if self.truth is not None:
            self.net.forward(self.x, self.truth, train=True)     # loss only: no backward, no update
            reply["loss"] = self.net.cost
        return reply

    def layers(self, n: int = 1) -> dict:
        """`n` ops with every layer's forward (and backward) and the update timed; per-layer
        medians over the ops, and the mean wall time of one op."""
        nl = len(self.net.layers)
        fwd, bwd, update = np.zeros((n, nl)), np.zeros((n, nl)), np.zeros(n)
        k = 0

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
        # layers whose forward computes the same values with fewer operations than their nominal
        # count (a convolution averaging first, layers/conv_averaged.py): what they compute
        computed = {l.index: l.averaged_flops() for l in self.net.layers
                    if getattr(l, "average_into", None) is not None}
        return {"fwd": np.median(fwd, 0).tolist(), "bwd": np.median(bwd, 0).tolist() if train else None,
                "update": float(np.median(update)), "s": total / n, "computed_flops": computed}


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
        self.labels = torch.from_numpy(np.load(job["labels"])) if job.get("labels") else None
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
        with torch.no_grad():
            outs = self.model(self.x, keep_all=True)
        picks = range(len(outs)) if all_layers else check_picks([st.kind for st in self.model.steps],
                                                                self.model.heads)
        np.savez(out, **{str(i): outs[i].contiguous().reshape(len(self.x), -1).numpy() for i in picks})
        reply = {"heads": self.model.heads}
        if self.labels is not None:
            self.model.train()
            with torch.no_grad():
                self.model.loss(self.x, self.labels, 1)
            reply["loss"] = self.model.last_cost        # Darknet's reported cost, as darkpy's
        self.model.train(training)
        return reply

    def layers(self, n: int = 1) -> dict:
        """`n` inference forwards with every step timed (training is not timed per layer)."""
        t0 = time.perf_counter()
        with self.torch.inference_mode():
            fwd = [self.model.forward_timed(self.x) for _ in range(n)]
        return {"fwd": np.median(np.array(fwd), 0).tolist(), "bwd": None, "update": 0.0,
                "s": (time.perf_counter() - t0) / n}

    def export_onnx(self, path: str, outputs: list[int]) -> dict:
        """Write the network (at this input's shape) as ONNX, its outputs the layers `outputs`."""
        from .torch_model import export_onnx

        export_onnx(self.model, self.x, path, outputs)
        return {"path": path}


class OrtRunner:
    """ONNX Runtime's side of an inference phase: CPU provider, `threads` intra-op threads, one
    inter-op thread, all graph optimisations (its defaults otherwise, spinning included)."""

    def __init__(self, job: dict):
        import onnxruntime as ort

        if job["mode"] != "infer":
            raise RuntimeError("onnxruntime is an inference contender")
        so = ort.SessionOptions()
        so.intra_op_num_threads = job["threads"]
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.ort = ort
        self.sess = ort.InferenceSession(job["onnx"], so, providers=["CPUExecutionProvider"])
        self.input_name = self.sess.get_inputs()[0].name
        self.names = [f"layer{i}" for i in job["onnx_outputs"]]   # the compared layers (onnx_models.py)
        missing = set(self.names) - {o.name for o in self.sess.get_outputs()}
        if missing:
            raise RuntimeError(f"the ONNX model has no output {sorted(missing)}")
        self.x = np.load(job["input"])
        self.job = job
        self.options = {"intra_op_num_threads": so.intra_op_num_threads, "inter_op_num_threads": 1,
                        "execution_mode": "sequential", "graph_optimization_level": "all",
                        "providers": self.sess.get_providers(), "version": ort.__version__,
                        "onnx_source": job.get("onnx_source")}

    def op(self) -> None:
        self.sess.run(self.names, {self.input_name: self.x})

    def check(self, out: str, all_layers: bool) -> dict:
        outs = self.sess.run(self.names, {self.input_name: self.x})
        layers = self.job["onnx_outputs"]       # the darkpy layer of each output, in order (onnx_models.py)
        if len(layers) != len(outs):
            raise RuntimeError(f"the ONNX model has {len(outs)} outputs ({self.names}); expected the layers {layers}")
        np.savez(out, **{str(i): o.reshape(len(self.x), -1) for i, o in zip(layers, outs)})
        return {"heads": None}


class TorchSeqRunner:
    """torch's side of a sequence net's training step (`torch_seq.py`): darkpy's loss (summed
    cross-entropy ÷ the rows), clip_grad_norm_, AdamW with decay on the weight matrices only."""

    def __init__(self, job: dict):
        import torch

        from .torch_seq import TorchSeqNet, to_seq

        self.torch = torch
        torch.set_num_threads(job["threads"])
        torch.manual_seed(0)
        with open(job["spec"], "rb") as f:
            d = pickle.load(f)
        self.steps, self.opt_keys = d["steps"], d["opt"]
        self.model = TorchSeqNet(d["specs"], steps=self.steps)
        self.rows = job["batch"]
        self.ids = torch.tensor(to_seq(np.load(job["input"])[:, 0].astype(np.int64), self.steps))
        self.targets = torch.tensor(to_seq(np.load(job["labels"])[:, 0].astype(np.int64), self.steps))
        o = self.opt_keys
        cfg = type("Cfg", (), {"weight_decay": o["weight_decay"], "B1": o["B1"], "B2": o["B2"], "eps": o["eps"]})
        self.opt = self.model.optimizer(cfg, job["rate"])
        self.job = job

    def op(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.model.loss(self.ids, self.targets, self.rows).backward()
        if self.opt_keys["clip_norm"] > 0:
            self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.opt_keys["clip_norm"])
        self.opt.step()

    def check(self, out: str, all_layers: bool) -> dict:
        """The logits and the softmax of the output layer (as darkpy's time-major rows) and the
        summed cross-entropy (darkpy's reported cost)."""
        torch = self.torch
        self.model.eval()
        with torch.no_grad():
            z = self.model.logits(self.ids)
            loss = float(self.model.loss(self.ids, self.targets, 1))
        self.model.train()
        last = len(self.model.kinds) - 1
        rows = lambda a: a.transpose(0, 1).reshape(self.rows, -1).numpy()      # (S, T, V) -> t·S + s
        np.savez(out, **{str(last - 1): rows(z), str(last): rows(torch.softmax(z, -1))})
        return {"heads": [last], "loss": loss}

    def layers(self, n: int = 1) -> dict:
        raise RuntimeError("per-layer torch timing covers inference only")


def make_runner(kind: str, job: dict):
    if kind == "darkpy":
        return DarkpyRunner(job)
    if kind == "onnxruntime":
        return OrtRunner(job)
    if job.get("seq"):
        return TorchSeqRunner(job)
    return TorchRunner(job, kind == "torch-cl")


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
                runner = make_runner(kind, msg)
                reply = {"setup_s": time.perf_counter() - t0}
            elif op == "run":
                t0 = time.perf_counter()
                for _ in range(msg["n"]):
                    runner.op()
                reply = {"s": (time.perf_counter() - t0) / msg["n"]}
            elif op == "warm":
                reply = warm_up(runner, msg["min_s"], msg.get("min_ops", 2))
            elif op == "sgemm":
                reply = {"gflops": sgemm_rate()}
            elif op == "rss":
                reply = {"maxrss_mb": peak_rss_mb()}
                if hasattr(runner, "buffers"):
                    reply["darkpy_buffers_mb"] = runner.buffers()
            elif op == "runtime":
                reply = runtime_info()
                if hasattr(runner, "options"):
                    reply["onnxruntime"] = runner.options
            else:
                reply = getattr(runner, op)(**msg)
        except Exception:
            reply = {"error": traceback.format_exc()}
        proto.write(json.dumps(reply) + "\n")


def warm_up(runner, min_s: float, min_ops: int) -> dict:
    """Run the op at least `min_ops` times and for at least `min_s` seconds (first-use allocation,
    caches, kernel loading), and until the runner is `settled()` when it says (darkpy: its
    per-layer thread counts chosen); report the last op's time (what the sample is sized by)."""
    start = time.perf_counter()
    n, last = 0, 0.0
    settled = getattr(runner, "settled", lambda: True)
    while n < min_ops or time.perf_counter() - start < min_s or not settled():
        t0 = time.perf_counter()
        runner.op()
        last = time.perf_counter() - t0
        n += 1
    return {"ops": n, "last_s": last, "s": time.perf_counter() - start}


if __name__ == "__main__":
    if KIND not in CONTENDERS:
        sys.exit(f"usage: python -m benchmarks.worker {{{'|'.join(CONTENDERS)}}} [--darkpy-as library]")
    worker_main(KIND)
