"""Data-parallel training on MPI (darkpy/distributed.py, darkpy/update_sync.py): N ranks with
`subdivisions=s` follow one process with `subdivisions=N·s`; resume across rank counts; a failing or
killed rank ends the job; Ctrl-C on `--procs` saves `_last` once; one process is unchanged.

Every multi-rank test starts `mpiexec` itself (the venv's, from the mpich wheel) with a timeout, on
the bundled digits data (cwd = the repo root, which its lists are relative to), with batch=24 so
that 1, 2 and 3 ranks split it: one process x 6 passes, 2 ranks x 3, 3 ranks x 2 (4 images each).
"""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import darkpy.train as T
from darkpy.distributed import (SingleProcess, find_mpiexec, import_mpi, launch_command, launcher_size,
                                remove_orphaned_shm, shm_segments, threads_per_rank, world)
from darkpy.errors import DarkpyError
from darkpy.network import load_network, network_from_text
from darkpy.progress import parse_line
from darkpy.settings import Settings
from darkpy.update_sync import apply_rolling, flatten_grads

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS = 50            # the 50 digits iterations
HALF = ITERATIONS // 2     # `_last` is written here (savelast), the resume point
TIMEOUT = 240              # per mpiexec job, generous for a loaded 2-core CI machine
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
for _var in ("PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
             "PMIX_RANK"):
    ENV.pop(_var, None)


def _mpi_available() -> str | None:
    try:
        import mpi4py  # noqa: F401
        return find_mpiexec()
    except (ImportError, DarkpyError):
        return None


MPIEXEC = _mpi_available()
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="mpi4py/mpich not installed (pip install '.[mpi]')")


# -- the project: digits with batch 24 -------------------------------------------------------------------

def _cfg(folder: Path, subdivisions: int) -> str:
    """cfg/digits.cfg with batch=24 and the given subdivisions, named digits24-s<N>.cfg."""
    text = (ROOT / "cfg" / "digits.cfg").read_text()
    text = text.replace("batch=32", "batch=24").replace("subdivisions=1", f"subdivisions={subdivisions}")
    path = folder / f"digits24-s{subdivisions}.cfg"
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("mpi")
    data = root / "digits.data"
    d = ROOT / "data"
    data.write_text(f"classes=10\ntrain={d / 'digits' / 'train.list'}\nvalid={d / 'digits' / 'test.list'}\n"
                    f"names={d / 'digits.names'}\nlabels={d / 'digits.names'}\ntop=2\nsaveweights={HALF}\n")
    return {"root": root, "data": str(data), **{s: _cfg(root, s) for s in (1, 2, 3, 6)}}


def _in_root(fn):
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        return fn()
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def reference(project):
    """One process, subdivisions=6, ITERATIONS iterations (`_<HALF>.weights` beside the final ones):
    the trajectory every rank count must follow."""
    backup = project["root"] / "ref"
    r = _in_root(lambda: T.train(project[6], data=project["data"], max_batches=ITERATIONS, backup=backup,
                                 settings=Settings(seed=0, threads=1)))
    return r


def mpiexec(n: int, *darkpy_args, timeout: float = TIMEOUT, **kw) -> subprocess.CompletedProcess:
    cmd = launch_command([str(a) for a in darkpy_args], n, MPIEXEC)
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout, **kw)


def train_args(cfg: str, project, backup: Path, *extra) -> list[str]:
    return ["train", cfg, "--data", project["data"], "--backup", str(backup), "--progress", "lines",
            "--max-batches", str(ITERATIONS), *extra]


@pytest.fixture(scope="module")
def two_ranks(project):
    """2 ranks x subdivisions=3 (`mpiexec -n 2 python -m mpi4py -m darkpy train ...`)."""
    if MPIEXEC is None:
        pytest.skip("mpi4py/mpich not installed")
    backup = project["root"] / "two"
    segments = shm_segments()
    r = mpiexec(2, *train_args(project[3], project, backup))
    assert r.returncode == 0, r.stdout + r.stderr
    assert shm_segments() <= segments, "a clean run leaves no shared-memory segment behind"
    return backup, r


def assert_same_trajectory(a_weights, b_weights, cfg, rtol=1e-5):
    """Every array of the two weights files (learnable weights and BN rolling statistics) within
    `rtol` of its largest value."""
    a, b = load_network(cfg, a_weights), load_network(cfg, b_weights)
    assert a.seen == b.seen
    compared = 0
    for la, lb in zip(a.layers, b.layers):
        for i, (x, y) in enumerate(zip(la.weight_arrays(), lb.weight_arrays())):
            scale = float(np.abs(x).max()) or 1.0
            err = float(np.abs(x - y).max()) / scale
            assert err <= rtol, f"layer {la.index} [{la.kind}] array {i}: {err:.2e} of its largest value"
            compared += 1
    assert compared >= 15      # 4 conv layers: biases, 3 BN arrays, weights; the last biases and weights


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# -- equal to one process --------------------------------------------------------------------------------

@pytest.mark.slow
@needs_mpi
def test_two_ranks_follow_one_process_with_subdivisions_doubled(project, reference, two_ranks):
    backup, r = two_ranks
    final = backup / "digits24-s3_final.weights"
    assert_same_trajectory(reference.weights, final, project[6])
    ref_log, log = read_csv(reference.log), read_csv(backup / "digits24-s3_log.csv")
    assert [row["iteration"] for row in log] == [str(k) for k in range(1, ITERATIONS + 1)]
    assert [row["images"] for row in log] == [row["images"] for row in ref_log]
    assert [row["rate"] for row in log] == [row["rate"] for row in ref_log]
    # iteration 1 starts from the same weights on the same images: its loss is the same bit for bit
    assert log[0]["loss"] == ref_log[0]["loss"]
    for a, b in zip(ref_log, log):
        assert float(b["loss"]) == pytest.approx(float(a["loss"]), rel=1e-5)
    # rank 0 alone prints: one progress line per iteration, one result; the accuracy is the same
    lines = [parse_line(ln) for ln in r.stdout.splitlines()]
    assert [x["iteration"] for x in lines if x] == list(range(1, ITERATIONS + 1))
    assert r.stdout.count("Done:") == 1 and "2 ranks x 3 x 4" in r.stdout
    assert f"top-1 accuracy {100 * reference.accuracy.top1:.2f} %" in r.stdout
    # other ranks print nothing but errors, and there are none (the MPI library may add its own notes)
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith(("error", "warning", "Traceback"))], r.stderr


@pytest.mark.slow
@needs_mpi
def test_three_ranks_oversubscribed_resume_a_one_process_checkpoint(project, reference):
    """`--procs 3` on 2 cores (an uneven rank count, oversubscribed), resuming the 1-process run's
    checkpoint of iteration HALF: it ends where the uninterrupted 1-process run ends."""
    last = Path(reference.backup) / f"digits24-s6_{HALF}.weights"
    backup = project["root"] / "three"
    cmd = [sys.executable, "-m", "darkpy", *train_args(project[2], project, backup, "--weights", last,
                                                        "--procs", "3")]
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Resuming from {last}: iteration {HALF}" in r.stdout and "optimiser state restored" in r.stdout
    assert "3 ranks x 2 x 4" in r.stdout
    assert_same_trajectory(reference.weights, backup / "digits24-s2_final.weights", project[6])
    ranks_log = read_csv(backup / "digits24-s2_log.csv")
    assert [row["iteration"] for row in ranks_log] == [str(k) for k in range(HALF + 1, ITERATIONS + 1)]


@pytest.mark.slow
@needs_mpi
def test_one_process_resumes_a_two_rank_checkpoint(project, reference, two_ranks):
    backup, _ = two_ranks
    last = backup / f"digits24-s3_{HALF}.weights"
    r = _in_root(lambda: T.train(project[6], data=project["data"], weights=last, backup=project["root"] / "one",
                                 max_batches=ITERATIONS, settings=Settings(threads=1), evaluate=False))
    assert r.start_iteration == HALF and r.iteration == ITERATIONS
    assert_same_trajectory(reference.weights, r.weights, project[6])


# -- one process: unchanged --------------------------------------------------------------------------------

PLAIN_RUN = """
import sys
import darkpy.train as T
from darkpy.settings import Settings
r = T.train(sys.argv[1], data=sys.argv[2], max_batches=4, backup=sys.argv[3], settings=Settings(threads=1),
            evaluate=False)
print("mpi4py imported:", "mpi4py" in sys.modules)
"""


@pytest.mark.slow
@needs_mpi
def test_one_process_under_mpiexec_is_bit_identical_and_a_plain_run_imports_no_mpi(project):
    plain, one = project["root"] / "plain", project["root"] / "mpi1"
    r = subprocess.run([sys.executable, "-c", PLAIN_RUN, project[6], project["data"], str(plain)], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert "mpi4py imported: False" in r.stdout
    m = subprocess.run([MPIEXEC, "-n", "1", sys.executable, "-c", PLAIN_RUN, project[6], project["data"], str(one)],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    assert m.returncode == 0, m.stderr
    assert "mpi4py imported: False" in m.stdout        # mpiexec -n 1 is a plain run
    name = "digits24-s6_final.weights"
    assert (plain / name).read_bytes() == (one / name).read_bytes()
    assert read_csv(plain / "digits24-s6_log.csv")[-1]["loss"] == read_csv(one / "digits24-s6_log.csv")[-1]["loss"]


def test_the_flat_gradient_buffer_changes_nothing(monkeypatch, tmp_path):
    """A one-process run with every Param.grad a view of one buffer equals, bit for bit, the run
    with the layers' own arrays (the buffer only exists for the allreduce)."""
    from test_train import make_project

    import darkpy.update_sync as U

    p = make_project(tmp_path / "a")
    q = make_project(tmp_path / "b")
    kw = {"data": p.data, "settings": Settings(), "evaluate": False, "max_batches": 6}
    flat = T.train(p.cfg, **kw)
    monkeypatch.setattr(U, "flatten_grads", lambda net: np.zeros(0, np.float32))
    own = T.train(q.cfg, **{**kw, "data": q.data})
    assert Path(flat.weights).read_bytes() == Path(own.weights).read_bytes()


def test_a_shard_of_a_batch_is_augmented_as_in_the_whole_batch(tmp_path):
    """What each rank loads (its positions of batch k, with their per-image generators) equals
    those rows of the whole batch loaded by one process: classifier and detector."""
    from PIL import Image
    from test_train import make_project

    from darkpy.batches import image_rngs
    from darkpy.datafile import load_data_config, make_dataset
    from darkpy.datasets import DetectionData

    p = make_project(tmp_path / "cls", net_extra="exposure=1.5\nsaturation=1.5")
    net = load_network(p.cfg)
    dc = load_data_config(p.data)
    paths = Path(p.train_list).read_text().split()
    cls = make_dataset(net, dc, paths, augment=True, labels=dc.labels)
    rng = np.random.default_rng(1)
    boxes_paths = []
    for i in range(6):
        img = tmp_path / f"d{i}.png"
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(img)
        img.with_suffix(".txt").write_text(f"0 .5 .5 .3 .4\n1 .3 .6 .2 .2\n{'1 .7 .2 .1 .3' if i % 2 else ''}\n")
        boxes_paths.append(str(img))
    det = DetectionData(boxes_paths, classes=2, augment=True, hue=.1, saturation=1.5, exposure=1.5)
    for data, idx in ((cls, [5, 0, 17, 3, 9, 11]), (det, [4, 1, 0, 5, 2, 3])):
        whole_x, whole_y = data.load(idx, image_rngs(7, 3, range(6)), 16, 16)
        for lo, hi in ((0, 2), (2, 4), (4, 6)):
            x, y = data.load(idx[lo:hi], image_rngs(7, 3, range(lo, hi)), 16, 16)
            np.testing.assert_array_equal(x, whole_x[lo:hi])
            np.testing.assert_array_equal(y, whole_y[lo:hi])
        other_x, _ = data.load(idx, image_rngs(8, 3, range(6)), 16, 16)
        assert not np.array_equal(other_x, whole_x)


def test_flatten_grads_makes_every_grad_a_view_of_one_buffer():
    net = network_from_text("[net]\nbatch=2\nwidth=6\nheight=6\nchannels=2\n"
                            "[convolutional]\nbatch_normalize=1\nfilters=3\nsize=3\npad=1\nactivation=leaky\n"
                            "[connected]\noutput=5\nactivation=linear\n[softmax]\n")
    params = [p for layer in net.layers for p in layer.params]
    for i, p in enumerate(params):
        p.grad[...] = np.arange(p.grad.size).reshape(p.grad.shape) + 100 * i
    before = [p.grad.copy() for p in params]
    flat = flatten_grads(net)
    assert flat.flags.c_contiguous and flat.size >= sum(p.grad.size for p in params)
    for p, old in zip(params, before):
        np.testing.assert_array_equal(p.grad, old)
        assert np.shares_memory(p.grad, flat) and p.grad.flags.c_contiguous
        assert p.grad.ctypes.data % 64 == 0
    flat[...] = 0
    assert all(not p.grad.any() for p in params)


def test_rolling_replay_follows_the_batch_norm_kernel():
    """The BN replay rule is the kernel's: a training forward from rolling r0 gives what
    apply_rolling(r0, the batch's mean/variance) gives (to float32 rounding of the statistic)."""
    net = network_from_text("[net]\nbatch=4\nwidth=5\nheight=5\nchannels=3\n"
                            "[convolutional]\nbatch_normalize=1\nfilters=4\nsize=3\npad=1\nactivation=leaky\n"
                            "[avgpool]\n[softmax]\n")
    bn = net.layers[0].bn
    bn.rolling_mean[...] = [0.5, -1, 2, 0]
    bn.rolling_variance[...] = [1, 2, 0.5, 3]
    r0 = bn.rolling_mean.copy(), bn.rolling_variance.copy()
    x = np.random.default_rng(0).random((4, 3, 5, 5), np.float32)
    net.forward(x, np.eye(4, 4, dtype=np.float32), train=True)
    mean, var = r0[0].copy(), r0[1].copy()
    apply_rolling(mean, bn.mean)
    apply_rolling(var, bn.variance)
    np.testing.assert_allclose(mean, bn.rolling_mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(var, bn.rolling_variance, rtol=1e-6)
    assert not np.array_equal(mean, r0[0])


class FakeRank0(SingleProcess):
    """Rank 0 of a 2-rank job whose rank 1 sends `other(row)` and the same gradients."""

    size = 2

    def __init__(self, other):
        self.other = other

    def allreduce(self, flat):
        flat *= 2
        return flat

    def allgather(self, row):
        return np.stack([row, self.other(row)])


BN_NET = ("[net]\nbatch=4\nwidth=5\nheight=5\nchannels=3\n"
          "[convolutional]\nbatch_normalize=1\nfilters=4\nsize=3\npad=1\nactivation=leaky\n[avgpool]\n[softmax]\n")


def test_update_sync_sums_costs_in_pass_order_and_replays_bn_in_rank_order():
    from darkpy.update_sync import UpdateSync

    net = network_from_text(BN_NET)
    bn = net.layers[0].bn
    bn.rolling_variance[...] = 1
    r0 = bn.rolling_mean.copy(), bn.rolling_variance.copy()

    def rank1(row):                     # rank 1: other costs and statistics, no stop request
        out = row.copy()
        out[0], out[1], out[2] = 0.0, 5.0, 0.25
        out[3:] = out[3:] * 0.5 + 1
        return out

    sync = UpdateSync(net, FakeRank0(rank1), passes=1)
    x = np.random.default_rng(0).random((4, 3, 5, 5), np.float32)
    sync.begin()
    net.forward(x, np.eye(4, 4, dtype=np.float32), train=True)
    cost, cost_mean = net.cost, net.cost_mean
    sync.record(0, cost, cost_mean)
    net.backward()
    before = sync.grads.copy()
    m0, v0 = bn.mean.astype(np.float64), bn.variance.astype(np.float64)
    total, mean_cost, stop = sync.finish(stop=True)
    assert total == cost + 5.0 and mean_cost == (cost_mean + 0.25) / 2 and stop
    np.testing.assert_array_equal(sync.grads, 2 * before)
    mean, var = r0[0].copy(), r0[1].copy()
    for m, v in ((m0, v0), (m0 * 0.5 + 1, v0 * 0.5 + 1)):      # rank 0's pass, then rank 1's
        apply_rolling(mean, m)
        apply_rolling(var, v)
    np.testing.assert_array_equal(bn.rolling_mean, mean)
    np.testing.assert_array_equal(bn.rolling_variance, var)


def test_ranks_with_different_weights_are_an_error():
    from darkpy.distributed import MpiError
    from darkpy.update_sync import UpdateSync

    net = network_from_text(BN_NET)
    sync = UpdateSync(net, FakeRank0(lambda row: row + 1), passes=1)
    with pytest.raises(MpiError, match="iteration 7: the ranks' weights differ"):
        sync.check_replicas(7)
    UpdateSync(net, FakeRank0(lambda row: row), passes=1).check_replicas(7)


def test_rank_zero_alone_keeps_the_momentum_term():
    from darkpy.update_sync import UpdateSync

    net = network_from_text(BN_NET)

    class Rank1(FakeRank0):
        rank = 1

    sync = UpdateSync(net, Rank1(lambda row: row), passes=1)
    sync.grads[...] = 3.0
    sync.begin()
    assert not sync.grads.any()
    sync0 = UpdateSync(net, FakeRank0(lambda row: row), passes=1)
    sync0.grads[...] = 3.0
    sync0.begin()
    assert (sync0.grads == 3.0).all()


# -- the communicator without MPI ---------------------------------------------------------------------------

def test_world_is_a_single_process_without_a_launcher():
    assert launcher_size({}) is None
    assert launcher_size({"PMI_RANK": "0", "PMI_SIZE": "4"}) == 4
    assert launcher_size({"OMPI_COMM_WORLD_SIZE": "2"}) == 2
    assert launcher_size({"PMIX_RANK": "1"}) == 0
    c = world({})
    assert isinstance(c, SingleProcess) and (c.rank, c.size) == (0, 1)
    assert isinstance(world({"PMI_RANK": "0", "PMI_SIZE": "1"}), SingleProcess)     # mpiexec -n 1
    flat = np.arange(4.0)
    assert c.allreduce(flat) is flat and c.allgather(flat).shape == (1, 4) and c.bcast(3) == 3
    assert threads_per_rank(0, c) == 0 and threads_per_rank(3, c) == 3


def test_missing_mpi_library_says_what_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_library(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "mpi4py" and fromlist and "MPI" in fromlist:
            raise RuntimeError("cannot load MPI library\nlibmpi.so.12: not found")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_library)
    with pytest.raises(DarkpyError, match=r"cannot load an MPI library \(cannot load MPI library\).*pip install "
                                          r"'darkpy\[mpi\]'"):
        import_mpi()


def test_procs_passes_every_option_to_the_ranks(monkeypatch, tmp_path):
    from click.testing import CliRunner

    import darkpy.distributed as D
    from darkpy.cli import main

    seen = {}
    monkeypatch.setattr(D, "launch", lambda argv, procs: seen.update(argv=argv, procs=procs) or 0)
    r = CliRunner().invoke(main, ["--debug", "train", "x.cfg", "--data", "d.data", "--max-batches", "7",
                                  "--procs", "4", "--map", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert seen["procs"] == 4
    argv = seen["argv"]
    assert argv[:3] == ["--debug", "train", "x.cfg"] and "--procs" not in argv
    assert argv[3:] == ["--data", "d.data", "--max-batches", "7", "--threads", "1", "--map"]
    monkeypatch.setenv("PMI_RANK", "0")
    r = CliRunner().invoke(main, ["train", "x.cfg", "--procs", "2"])
    assert r.exit_code == 2 and "under mpiexec, leave it out" in r.output


# -- faults ---------------------------------------------------------------------------------------------------

FAULTY_RANK = """
import os, signal, sys
from mpi4py import MPI
import darkpy.datasets as D
from darkpy.errors import DataError

how, at = sys.argv[1], int(sys.argv[2])
if MPI.COMM_WORLD.Get_rank() == 1:
    real, calls = D.ClassifierData.load, []

    def load(self, *args):
        calls.append(1)
        if len(calls) >= at:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise DataError("data/digits/train/0042_two.png: cannot decode (injected fault)")
        return real(self, *args)
    D.ClassifierData.load = load
from darkpy.cli import main
sys.argv = ["darkpy", *sys.argv[3:]]
main()
"""


def _faulty_job(project, how: str, backup: Path) -> tuple[subprocess.CompletedProcess, float]:
    args = train_args(project[3], project, backup)
    args[args.index("--max-batches") + 1] = "100000"          # it would never end by itself
    data = project["root"] / "often.data"
    data.write_text(Path(project["data"]).read_text() + "savelast=2\n")
    args[args.index("--data") + 1] = str(data)
    t0 = time.perf_counter()
    segments = shm_segments()
    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py", "-c", FAULTY_RANK, how, "8", *args],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    seconds = time.perf_counter() - t0
    left = remove_orphaned_shm(segments)        # (what `--procs` does after a failed job)
    if how == "raise":
        assert not left, "the aborting rank unlinks the job's shared memory"
    return r, seconds


@pytest.mark.slow
@needs_mpi
def test_a_rank_that_raises_ends_the_job_with_its_one_line_error(project):
    backup = project["root"] / "raises"
    r, seconds = _faulty_job(project, "raise", backup)
    assert r.returncode != 0
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: rank 1: data/digits/train/0042_two.png: cannot decode (injected fault)"], r.stderr
    assert "Traceback" not in r.stderr
    assert load_network(project[3], backup / "digits24-s3_last.weights").seen % 24 == 0   # still loadable
    assert seconds < TIMEOUT / 2


@pytest.mark.slow
@needs_mpi
def test_a_killed_rank_ends_the_job(project):
    backup = project["root"] / "killed"
    r, seconds = _faulty_job(project, "kill", backup)
    assert r.returncode != 0
    assert "BAD TERMINATION" in r.stdout + r.stderr and "signal 9" in r.stdout + r.stderr
    assert load_network(project[3], backup / "digits24-s3_last.weights").seen % 24 == 0
    assert seconds < TIMEOUT / 2


@pytest.mark.slow
@needs_mpi
def test_batch_that_does_not_split_over_the_ranks_is_one_error(project):
    r = mpiexec(3, *train_args(project[3], project, project["root"] / "nosplit"), timeout=TIMEOUT)
    assert r.returncode != 0
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, f"exit status {r.returncode}\nstderr: {r.stderr}\nstdout: {r.stdout}"
    assert ("batch=24 does not split over 3 ranks x subdivisions=3" in errors[0]
            and "a multiple of 9" in errors[0]), errors


@pytest.mark.slow
@needs_mpi
def test_ctrl_c_on_the_launcher_saves_last_once_and_exits_zero(project):
    backup = project["root"] / "sigint"
    args = train_args(project[3], project, backup)
    args[args.index("--max-batches") + 1] = "100000"
    proc = subprocess.Popen([sys.executable, "-m", "darkpy", *args, "--procs", "2"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        iterations, deadline = 0, time.time() + TIMEOUT
        while iterations < 3 and time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            iterations += parse_line(line) is not None
        assert iterations >= 3, "training did not start"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out.count("Interrupted at iteration") == 1, out
    k = int(out.split("Interrupted at iteration ")[1].split(":")[0])
    assert k >= 3
    last = backup / "digits24-s3_last.weights"
    assert f"saved {last}" in out
    assert load_network(project[3], last).seen == 24 * k
    assert not (backup / "digits24-s3_final.weights").exists()
    assert len(read_csv(backup / "digits24-s3_log.csv")) == k
