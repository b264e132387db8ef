"""The benchmark harness's fairness rules (benchmarks/engine.py, environment.py, worker.py), without
timing anything and without torch: the workers' environment is built from nothing, one worker
process lives at a time and is checked to have exited, outputs are compared before timing, and the
detector truth the harness makes is what darkpy reads."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks import engine, environment, report
from benchmarks.worker import check_picks, load_truth


def test_worker_env_is_built_from_nothing(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("SOME_USER_SETTING", "1")
    env = environment.worker_env(3)
    assert "OPENBLAS_CORETYPE" not in env and "OMP_WAIT_POLICY" not in env and "SOME_USER_SETTING" not in env
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    assert environment.parent_env_dropped()["OPENBLAS_CORETYPE"] == "Haswell"
    assert "SOME_USER_SETTING" not in environment.parent_env_dropped()


def test_compare_checks_every_output_the_contender_saved(tmp_path):
    ref, same, off, extra = (str(tmp_path / f"{n}.npz") for n in ("ref", "same", "off", "extra"))
    a = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
    np.savez(ref, **{"3": a, "5": 2 * a})
    np.savez(same, **{"5": 2 * a + 1e-6})
    np.savez(off, **{"3": a, "5": 2 * a + 0.01})
    np.savez(extra, **{"7": a})
    assert engine.compare(ref, same)["ok"] and engine.compare(ref, same)["outputs_compared"] == 1
    bad = engine.compare(ref, off)
    assert not bad["ok"] and bad["worst_layer"] == 5
    assert not engine.compare(ref, extra)["ok"]


def test_check_picks_adds_the_logits_under_a_softmax():
    assert check_picks(["convolutional", "avgpool", "softmax"], [2]) == [1, 2]
    assert check_picks(["embedding", "connected", "crossentropy"], [2]) == [1, 2]
    assert check_picks(["convolutional", "yolo", "route", "yolo"], [1, 3]) == [1, 3]


def test_random_truth_is_read_by_darkpy_as_boxes(tmp_path):
    from darkpy.layers.yolo import _valid_truth

    rng = np.random.default_rng(0)
    truth = engine.random_truth(rng, 4, {"max_boxes": 90, "classes": 3})
    assert truth.shape == (4, 450)
    rows = truth.reshape(4, 90, 5)
    for b in range(4):
        n = int((rows[b, :, 0] != 0).sum())
        assert 1 <= n <= 6 and np.all(rows[b, n:] == 0)            # the list ends at the first x == 0
        assert [_valid_truth(truth, b, t, 3) for t in range(n + 1)] == [1] * n + [-1]
        assert set(rows[b, :n, 4]) <= {0.0, 1.0, 2.0}
    # classifiers get class labels, which the darkpy worker turns into one-hot rows
    labels = np.array([2, 0])
    np.save(tmp_path / "y.npy", labels)
    np.testing.assert_array_equal(load_truth({"labels": str(tmp_path / "y.npy")}, 3, 3),
                                  np.eye(3, dtype=np.float32)[labels])


def test_onnxruntime_contender_runs_darkpys_export_of_the_compared_layers(tmp_path):
    """The default ONNX Runtime model is darkpy's own export (onnx_models.onnx_via_darkpy) with the
    compared layers as outputs `layer<i>`; the worker runs those by name and they pass the check."""
    from pathlib import Path
    from types import SimpleNamespace

    pytest.importorskip("onnxruntime")
    from benchmarks.onnx_models import ONNX_EXPORTERS, onnx_via_darkpy
    from benchmarks.worker import OrtRunner
    from darkpy.network import load_network

    assert engine.Options().onnx_from == "darkpy" and ONNX_EXPORTERS["darkpy"] is onnx_via_darkpy
    cfg = Path(__file__).resolve().parents[1] / "cfg" / "digits.cfg"
    net = load_network(cfg, batch=3)
    engine.sane_weights(net.layers)
    net.save_weights(tmp_path / "d.weights")
    x = np.random.default_rng(1).random((3, *net.input_shape), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    net.forward(x)
    np.savez(tmp_path / "ref.npz", **{str(i): net.layers[i].output.reshape(3, -1) for i in range(len(net.layers))})
    outputs = check_picks([layer.kind for layer in net.layers], [len(net.layers) - 1])
    assert outputs == [6, 7]                                     # the logits under the softmax, and the softmax
    prep = SimpleNamespace(weights=str(tmp_path / "d.weights"))
    phase = SimpleNamespace(spec=engine.NetSpec("digits", cfg), prep=prep, batch=3)
    onnx_via_darkpy(phase, str(tmp_path / "d.onnx"), outputs)
    job = {"mode": "infer", "threads": 1, "onnx": str(tmp_path / "d.onnx"), "input": str(tmp_path / "x.npy"),
           "onnx_outputs": outputs}
    runner = OrtRunner(job)
    assert runner.names == ["layer6", "layer7"]
    runner.check(str(tmp_path / "ort.npz"), False)
    c = engine.compare(str(tmp_path / "ref.npz"), str(tmp_path / "ort.npz"))
    assert c["ok"] and c["outputs_compared"] == 2 and c["max_rel_err"] < 1e-5, c
    with pytest.raises(RuntimeError, match="no output"):
        OrtRunner({**job, "onnx_outputs": [5, 6]})


class FakeWorker:
    """Stands in for a worker process: records how many are alive at once."""
    alive = 0
    most = 0
    log: list = []

    def __init__(self, kind, opts):
        FakeWorker.alive += 1
        FakeWorker.most = max(FakeWorker.most, FakeWorker.alive)
        self.kind = kind
        FakeWorker.log.append(("start", kind))

    def call(self, op, **args):
        if op == "setup":
            return {"setup_s": 0.0}
        if op == "check":
            np.savez(args["out"], **{"1": np.ones((1, 4), np.float32)})
            return {"heads": [1]}
        if op == "warm":
            return {"ops": 2, "last_s": 0.01, "s": 0.02}
        if op == "run":
            return {"s": 0.01 if self.kind == "darkpy" else 0.02}
        if op == "sgemm":
            return {"gflops": 100.0}
        if op == "rss":
            return {"maxrss_mb": 10.0}
        if op == "layers":
            return {"fwd": [0.001, 0.001], "bwd": None, "update": 0.0, "s": 0.002}
        if op == "runtime":
            return {"env": {}}
        raise AssertionError(op)

    def close(self):
        FakeWorker.alive -= 1
        FakeWorker.log.append(("exit", self.kind))
        return True


def test_one_worker_at_a_time_and_each_sample_in_its_own_process(monkeypatch, tmp_path):
    monkeypatch.setattr(engine, "Worker", FakeWorker)
    monkeypatch.setattr(engine, "wait_quiet", lambda *a: {"busy": 0.0, "quiet": True})
    FakeWorker.log, FakeWorker.most = [], 0
    prep = engine.Prepared("w", "spec.pkl", None, None, (3, 4, 4), 4, 1e6, 1e6,
                           [(0, "convolutional", (4, 4, 4), 1e6), (1, "softmax", (4,), 0.0)],
                           ["3x3/1 3->4 on 4x4", ""], [1], None, 0.9, 5e-4)
    opts = engine.Options(reps=3, contenders=("darkpy", "torch"), tmp=tmp_path)
    spec = engine.NetSpec("n", tmp_path / "n.cfg")
    r = engine.run_phase(spec, prep, "infer", 4, opts)
    assert FakeWorker.most == 1
    starts = [k for ev, k in FakeWorker.log if ev == "start"]
    # the checks, one untimed darkpy process (kernels compile there), then three rotating rounds
    assert starts == ["darkpy", "torch"] + ["darkpy"] + ["darkpy", "torch", "torch", "darkpy", "darkpy", "torch"]
    assert len(r["contenders"]["darkpy"]["samples_s"]) == 3 and r["ratio"] == pytest.approx(2.0)
    assert r["checks"]["torch"]["ok"] and r["quiet"]["windows"] == 2 + 6
    assert r["layers"][0]["desc"] == "3x3/1 3->4 on 4x4"
    # the Markdown renders from such a result
    results = {"command": "x", "machine": {"cpu": "c", "cores": 2, "memory_gb": 1, "threads": 2, "simd": [],
                                           "versions": {"python": "3", "numpy": "2", "numba": "0"},
                                           "loadavg_start": [0.0], "date": "now"},
               "networks": [{"name": "n", "phases": [r]}], "sgemm": {"numpy_gflops": 100.0}}
    md = report.markdown(results)
    assert "| n | infer b4 |" in md and "2.00×" in md


def test_busy_fraction_reads_the_machine():
    busy = environment.busy_fraction(0.05)
    assert busy is None or 0.0 <= busy <= 1.0


def test_mosaic_map_edits_reach_the_cfg_sections():
    """benchmarks/mosaic_map.py's --edit: `yolo.KEY` edits every [yolo] head, `net.KEY` the [net]
    section; a malformed edit stops the run with a message."""
    from pathlib import Path

    from benchmarks.mosaic_map import _apply_edit
    from darkpy.cfg import load_cfg
    doc = load_cfg(Path(__file__).resolve().parents[1] / "cfg" / "shapes-tiny.cfg")
    _apply_edit(doc, "yolo.iou_thresh=0.213")
    _apply_edit(doc, "net.mosaic_off=1125")
    heads = [s for s in doc.layers if s.kind == "yolo"]
    assert len(heads) == 2 and all(s.get_float("iou_thresh", 1.0) == pytest.approx(0.213) for s in heads)
    assert doc.net.get_int("mosaic_off", 0) == 1125
    with pytest.raises(SystemExit, match="SECTION.KEY=VALUE"):
        _apply_edit(doc, "iou_thresh=0.2")


def _run_tool(*args: str) -> str:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", *args], cwd=root, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_kernel_time_counts_the_parallel_kernels_a_step_calls():
    out = _run_tool("benchmarks.kernel_time", "digits", "train", "4", "--threads", "1", "--steps", "2")
    rows = {line.split()[0]: float(line.split()[1]) for line in out.splitlines() if line.startswith(("bn.", "winograd."))}
    # digits: three conv-BN layers, each a fused BN + activation forward and backward in training
    assert rows["bn.bn_act_forward_train"] == 3 and rows["bn.bn_act_backward"] == 3, out
    assert "parallel kernels:" in out


def test_wake_cost_reports_both_thread_counts():
    out = _run_tool("benchmarks.wake_cost", "--threads", "2", "--calls", "50")
    assert "1 thread(s): back to back median" in out and "2 thread(s): back to back median" in out, out


def test_step_time_alternates_a_setting_between_two_values():
    out = _run_tool("benchmarks.step_time", "digits", "infer", "2", "--reps", "2", "--rounds", "2",
                    "--ab-setting", "darkpy.blas.STREAM_MIN_MACS", "1<<62", "1<<20")
    assert "STREAM_MIN_MACS=1<<62:" in out and "STREAM_MIN_MACS=1<<20:" in out and "B/A" in out, out


def test_step_tools_infer_as_the_worker_does():
    """In infer mode the profiling tools share outputs as the suite's worker does (so they time its
    kernels: kept transforms, convolutions writing their maxpool); --plain-outputs and training not."""
    import argparse

    from benchmarks.layer_time import as_the_worker, step_arguments
    from darkpy.network import network_from_text

    ap = argparse.ArgumentParser()
    step_arguments(ap)
    cfg = "[net]\nwidth=8\nheight=8\nchannels=1\n[convolutional]\nfilters=2\nsize=1\nactivation=linear\n"
    for argv, shared in ((["digits", "infer", "1"], True), (["digits", "infer", "1", "--plain-outputs"], False),
                         (["digits", "train", "1"], False)):
        net = network_from_text(cfg)
        as_the_worker(net, ap.parse_args(argv))
        assert (net._share_keep is not None) is shared, argv


def test_ort_nodes_lists_onnxruntime_nodes_of_a_suite_network():
    out = _run_tool("benchmarks.ort_nodes", "digits", "2", "--threads", "1", "--runs", "2")
    lines = out.splitlines()
    assert "digits b2, onnxruntime" in lines[0] and "ms per run" in lines[0], out
    nodes = [line.split() for line in lines[2:-1]]
    assert sum(op == "Conv" for _, op, _ in nodes) >= 3 and all(float(us) >= 0 for *_, us in nodes), out
    assert abs(float(lines[-1].split()[-1]) - sum(float(us) for *_, us in nodes)) < 0.2 * len(nodes), out


def test_layer_tables_count_what_darkpy_computed_for_a_convolution_averaging_first(tmp_path):
    """digits' 1x1 64 -> 10 before its [avgpool] averages first in the inference worker: its row
    (and the convolution layers' GFLOP/s) counts the means and the small product, not the
    convolution's nominal FLOPs, and says so; the other layers keep Darknet's count."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from benchmarks.worker import DarkpyRunner
    from darkpy.network import load_network

    cfg = Path(__file__).resolve().parents[1] / "cfg" / "digits.cfg"
    net = load_network(cfg, batch=2)
    engine.sane_weights(net.layers)
    net.save_weights(tmp_path / "d.weights")
    np.save(tmp_path / "x.npy", np.random.default_rng(1).random((2, *net.input_shape), dtype=np.float32))
    job = {"mode": "infer", "threads": 1, "cfg": str(cfg), "edits": {}, "batch": 2,
           "weights": str(tmp_path / "d.weights"), "input": str(tmp_path / "x.npy")}
    table = json.loads(json.dumps(DarkpyRunner(job).layers(2)))     # as the worker's reply
    assert table["computed_flops"] == {"5": 64 * 16 + 2 * 64 * 10}
    table = engine.layers_reply(table)                              # as the engine reads it
    rows = [(l.index, l.kind, tuple(l.out_shape), float(l.flops())) for l in net.layers]
    prep = SimpleNamespace(layer_rows=rows, descs=[engine.layer_desc(l) for l in net.layers])
    got = {r["index"]: r for r in engine.layer_table(prep, {"darkpy": table}, 2)}
    assert got[5]["mflop"] == pytest.approx(2 * (64 * 16 + 2 * 64 * 10) / 1e6)
    assert "averaged first (0.041 MFLOP as a convolution)" in got[5]["desc"]
    assert got[4]["mflop"] == pytest.approx(2 * rows[4][3] / 1e6) and "averaged" not in got[4]["desc"]
    fwd = [1e-3] * len(rows)
    conv = [r for r in rows if r[1] == "convolutional"]
    want = (sum(r[3] for r in conv) - rows[5][3] + 64 * 16 + 2 * 64 * 10) * 2 / (len(conv) * 1e-3) / 1e9
    assert engine.conv_gflops(prep, fwd, 2, table["computed_flops"]) == pytest.approx(want)


def test_training_counts_no_input_gradient_for_the_first_layer():
    """The first layer's input gradient is computed by no contender (the network's input needs
    none): a training step counts 3x the forward FLOPs less it, and the per-layer backward rate
    of the first convolution counts its weight gradient only (the others both gradients)."""
    from types import SimpleNamespace

    rows = [(0, "convolutional", (4, 4, 4), 1e6), (1, "convolutional", (8, 4, 4), 3e6),
            (2, "softmax", (8,), 0.0)]
    prep = SimpleNamespace(layer_rows=rows, flops=4e6)
    assert engine.train_flops(prep) == pytest.approx(3 * 4e6 - 1e6)
    layers = [{"index": i, "kind": k, "desc": "", "mflop": f / 1e6, "darkpy_fwd_ms": 1.0,
               "darkpy_bwd_ms": 1.0} for i, k, _s, f in rows]
    results = {"networks": [{"name": "n", "phases": [{"mode": "train", "batch": 1, "phase": "train b1",
                                                      "sgemm_gflops": 100.0, "layers": layers}]}],
               "sgemm": {"numpy_gflops": 100.0}}
    got = {r["index"]: r["mflop"] for r in report.conv_layers(results, "bwd")}
    assert got == {0: pytest.approx(1.0), 1: pytest.approx(6.0)}
