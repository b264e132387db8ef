"""Per-node time of ONNX Runtime on a suite network, from its own profiler, for comparing layer by
layer with `benchmarks.layer_time` (not a benchmark: nothing is published).

    python -m benchmarks.ort_nodes tiny 64 --threads 2
    python -m benchmarks.layer_time tiny infer 64 --threads 2 --rounds 5     # darkpy's side

The network is the suite's (same cfg edits and sane random weights as `layer_time`), exported with
darkpy's exporter at the batch, and run by ONNX Runtime as the suite's worker runs it (CPU provider,
--threads intra-op threads, one inter-op thread, sequential, all graph optimisations) with profiling
on; it prints the median time of each node over the timed runs, in execution order, and the sum
against the median wall time of a run. ONNX Runtime fuses and reorders nodes (e.g. a convolution
with its activation, in its NCHWc layout with reorder nodes between), so nodes map to darkpy's
layers by their names (`l<i>_...`, `leaky_<k>` ...), not one to one.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict

from darkpy.process import set_command_environment

set_command_environment()            # the darkpy command's OpenMP/OpenBLAS settings, before numpy

import numpy as np  # noqa: E402


def node_times(profile: list, skip: int) -> list[tuple[str, str, float]]:
    """(node name, op type, median µs) per node of an ONNX Runtime profile (its JSON events), in the
    order the nodes first ran, leaving out each node's first `skip` runs (warm-up)."""
    runs: dict = defaultdict(list)
    ops = {}
    for event in profile:
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith("_kernel_time"):
            node = name[:-len("_kernel_time")]
            runs[node].append(event["dur"])
            ops[node] = event.get("args", {}).get("op_name", "")
    return [(node, ops[node], float(np.median(t[skip:] if len(t) > skip else t))) for node, t in runs.items()]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("network", help="a suite network (benchmarks/run.py), e.g. tiny, digits")
    ap.add_argument("batch", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args(argv)

    import onnxruntime as ort

    from darkpy.export import export_onnx

    from .layer_time import build

    net, x, _ = build(args.network, args.batch)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "net.onnx")
        export_onnx(net, path)
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "profile")
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: x.reshape(args.batch, *net.input_shape)}
        warm = 3
        for _ in range(warm):
            sess.run(None, feed)
        walls = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            sess.run(None, feed)
            walls.append(time.perf_counter() - t0)
        with open(sess.end_profiling()) as f:
            rows = node_times(json.load(f), warm)
    print(f"{args.network} b{args.batch}, onnxruntime {ort.__version__}, {args.threads} thread(s): "
          f"{np.median(walls) * 1e3:.2f} ms per run (median of {args.runs}; profiling on)")
    print(f"{'node':44s} {'op':22s} {'µs':>10s}")
    for node, op, us in rows:
        print(f"{node[:44]:44s} {op[:22]:22s} {us:10.1f}")
    print(f"{'sum of nodes':67s} {sum(r[2] for r in rows):10.1f}")


if __name__ == "__main__":
    main()
