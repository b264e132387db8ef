"""The training loop (darkpy/train.py) and its pieces: lr policies, batch plan, checkpoints and their
state files, exact and approximate resume, atomic writes, label errors, the NaN stop, settings,
progress lines, the CSV log and the loss chart.

Most tests train a tiny network (8x8 greyscale, 3 classes) on a synthetic dataset written to a temp
folder, for a dozen iterations: seconds each once the kernels are cached.
"""
from __future__ import annotations

import io
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

import darkpy.checkpoint as C
import darkpy.network
import darkpy.train as T
from darkpy.errors import DataError, TrainingError
from darkpy.network import NetConfig, load_network
from darkpy.optim import current_rate
from darkpy.progress import CsvLog, Progress, Record, parse_line, read_log
from darkpy.settings import Settings, SettingsError, load_settings
from darkpy.weights import read_header

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("alpha", "beta", "gamma")

TINY_CFG = """\
[net]
batch=8
subdivisions=2
width=8
height=8
channels=1
learning_rate=0.05
momentum=0.9
decay=0.0005
policy=steps
steps=5,10
scales=.5,.5
max_batches=12
min_crop=8
max_crop=9
angle=5
flip=0
{net_extra}

[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[dropout]
probability=.2

[convolutional]
filters={classes}
size=1
stride=1
pad=0
activation=linear

[avgpool]

[softmax]
"""


def _pattern(cls: int, rng: np.random.Generator) -> np.ndarray:
    """An 8x8 image of class `cls`: a horizontal bar, a vertical bar or a diagonal, plus noise."""
    img = rng.integers(0, 40, (8, 8)).astype(np.uint8)
    p = int(rng.integers(1, 7))
    if cls == 0:
        img[p, 1:7] = 250
    elif cls == 1:
        img[1:7, p] = 250
    else:
        for i in range(8):
            img[i, (i + p) % 8] = 250
    return img


def make_project(root: Path, n_train: int = 24, n_valid: int = 12, net_extra: str = "",
                 data_extra: str = "", names=NAMES, seed: int = 0) -> SimpleNamespace:
    """A complete tiny project under `root`: images, lists, names, .data (backup=root/backup), cfg."""
    rng = np.random.default_rng(seed)
    (root / "data" / "img").mkdir(parents=True, exist_ok=True)
    (root / "cfg").mkdir(exist_ok=True)
    lists = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        paths = []
        for i in range(n):
            cls = i % len(NAMES)
            p = root / "data" / "img" / f"{split}{i:03d}_{NAMES[cls]}.png"
            Image.fromarray(_pattern(cls, rng), "L").save(p)
            paths.append(str(p))
        lists[split] = root / "data" / f"{split}.list"
        lists[split].write_text("\n".join(paths) + "\n")
    names_file = root / "data" / "tiny.names"
    names_file.write_text("\n".join(names) + "\n")
    data = root / "data" / "tiny.data"
    data.write_text(f"classes={len(NAMES)}\ntrain={lists['train']}\nvalid={lists['valid']}\n"
                    f"names={names_file}\nlabels={names_file}\nbackup={root / 'backup'}\ntop=2\n{data_extra}")
    cfg = root / "cfg" / "tiny.cfg"
    cfg.write_text(TINY_CFG.format(net_extra=net_extra, classes=len(NAMES)))
    return SimpleNamespace(root=root, cfg=str(cfg), data=str(data), backup=str(root / "backup"),
                           train_list=str(lists["train"]), valid_list=str(lists["valid"]))


def run(p, **kw):
    kw.setdefault("settings", Settings())
    kw.setdefault("evaluate", False)
    return T.train(p.cfg, data=p.data, **kw)


@pytest.fixture
def proj(tmp_path):
    return make_project(tmp_path)


# -- learning-rate policies ------------------------------------------------------------------------

def _net(**kw) -> NetConfig:
    c = NetConfig(learning_rate=0.1)
    for k, v in kw.items():
        setattr(c, k, v)
    return c


@pytest.mark.parametrize("cfg, b, expected", [
    (_net(policy="constant"), 37, 0.1),
    (_net(policy="step", step=10, scale=0.5), 25, 0.1 * 0.25),
    (_net(policy="step", step=10, scale=0.5), 9, 0.1),
    (_net(policy="steps", steps=[10, 20], scales=[0.1, 0.5]), 5, 0.1),
    (_net(policy="steps", steps=[10, 20], scales=[0.1, 0.5]), 10, 0.01),
    (_net(policy="steps", steps=[10, 20], scales=[0.1, 0.5]), 25, 0.005),
    (_net(policy="exp", gamma=0.9), 3, 0.1 * 0.729),
    (_net(policy="poly", power=2, max_batches=100), 50, 0.1 * 0.25),
    (_net(policy="poly", power=2, max_batches=100), 100, 0.0),
    (_net(policy="sigmoid", gamma=0.5, step=10), 12, 0.1 / (1 + math.e)),
    (_net(policy="steps", steps=[10], scales=[0.1], burn_in=10, power=4), 5, 0.1 * 0.5 ** 4),
    (_net(policy="poly", power=4, max_batches=100, burn_in=10), 10, 0.1 * 0.9 ** 4),
    (_net(policy="sgdr", sgdr_cycle=10, sgdr_mult=2, learning_rate_min=1e-5), 15,
     1e-5 + 0.5 * (0.1 - 1e-5) * (1 + math.cos(math.pi * 5 / 20))),
])
def test_lr_policies_match_hand_computed_values(cfg, b, expected):
    assert current_rate(cfg, b) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_lr_random_policy_uses_the_given_generator():
    cfg = _net(policy="random", power=2)
    u = np.random.default_rng(7).random()
    assert current_rate(cfg, 3, np.random.default_rng(7)) == pytest.approx(0.1 * u * u, rel=1e-12)


def test_first_update_uses_iteration_one_and_burn_in(proj):
    """Darknet computes the rate after `seen` counts the update's batch: the first update has b=1."""
    p = make_project(proj.root, net_extra="burn_in=4\npower=2")
    r = run(p, max_batches=5)
    rates = [rec.rate for rec in r.records]
    assert rates[:4] == pytest.approx([0.05 * (b / 4) ** 2 for b in (1, 2, 3, 4)], rel=1e-12)
    assert rates[4] == pytest.approx(0.05 * 0.5)   # b=5 >= steps[0]=5: scaled by .5


# -- the batch plan ----------------------------------------------------------------------------------

def test_batch_plan_is_a_pure_function_of_seed_and_iteration():
    a, b = T.BatchPlan(10, 4, seed=3), T.BatchPlan(10, 4, seed=3)
    assert [list(a.indices(k)) for k in (7, 0, 3)] == [list(b.indices(k)) for k in (7, 0, 3)]
    # every epoch visits every sample exactly once
    seq = np.concatenate([a.indices(k) for k in range(5)])      # 20 samples = epochs 0 and 1
    assert sorted(seq[:10]) == list(range(10)) and sorted(seq[10:]) == list(range(10))
    assert list(seq[:10]) != list(seq[10:])
    assert list(T.BatchPlan(10, 4, seed=4).indices(0)) != list(a.indices(0))


# -- checkpoints, log, chart -------------------------------------------------------------------------

def test_checkpoint_names_log_and_chart(proj):
    r = run(proj, save_last=5, save_every=10)
    b = Path(proj.backup)
    names = sorted(p.name for p in b.iterdir())
    assert names == sorted(["tiny_last.weights", "tiny_last.state", "tiny_10.weights", "tiny_10.state",
                            "tiny_final.weights", "tiny_final.state", "tiny_log.csv", "chart.png"])
    assert r.weights == str(b / "tiny_final.weights") and r.iteration == 12 and not r.interrupted
    # the header's `seen` counts images: 12 iterations x 8
    for name, it in (("tiny_10.weights", 10), ("tiny_last.weights", 10), ("tiny_final.weights", 12)):
        assert read_header((b / name).read_bytes(), name)[3] == it * 8
    log = read_log(b / "tiny_log.csv")
    assert [x.iteration for x in log] == list(range(1, 13))
    assert [x.images for x in log] == [8 * i for i in range(1, 13)]
    assert all(math.isfinite(x.loss) and x.loss > 0 for x in log)
    assert log[0].avg_loss == log[0].loss
    assert log[1].avg_loss == pytest.approx(0.9 * log[0].loss + 0.1 * log[1].loss)
    with Image.open(b / "chart.png") as im:
        assert im.size == (800, 500)
        px = np.asarray(im.convert("RGB"))
    blue = (px[..., 2] > 150) & (px[..., 0] < 60) & (px[..., 1] < 90)      # chart.AVG_LINE
    assert blue.sum() > 30, "the average-loss line is drawn"
    # every checkpoint is a loadable network
    net = load_network(proj.cfg, weights=b / "tiny_10.weights")
    assert net.seen == 80


def test_progress_lines_are_darknet_style_and_parse_back(proj):
    out = io.StringIO()
    r = run(proj, max_batches=3, progress=Progress("lines", stream=out))
    lines = [parse_line(ln) for ln in out.getvalue().splitlines()]
    parsed = [x for x in lines if x is not None]
    assert [x["iteration"] for x in parsed] == [1, 2, 3]
    assert parsed[-1]["images"] == 24
    assert parsed[-1]["loss"] == pytest.approx(r.records[-1].loss, rel=1e-5)
    assert parsed[-1]["epoch"] == pytest.approx(24 / 24, abs=1e-3)


def test_progress_bar_with_eta_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    p = Progress("auto", stream=out)
    assert p.style == "bar"
    p.begin(0, 10)
    p.iteration(Record(4, 0.1, 1.0, 1.5, 0.1, 0.01, 0.2, 32))
    p.close()
    text = out.getvalue()
    assert "4, 0.100: 1.000000, 1.500000 avg" in text
    assert "4/10" in text and "ETA" in text and "40.0%" in text
    assert Progress("auto", stream=io.StringIO()).style == "lines"


def test_eta_leaves_out_the_first_iteration(monkeypatch):
    """The first iteration may hold the kernels' compile: the time left comes from the pace after it
    (here 100 s, then 2 s per iteration), and is unknown ("--:--") until a second one is done."""
    import darkpy.progress as progress
    clock = iter([100.0, 102.0, 104.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    p = Progress("lines", stream=out)
    p.begin(0, 10)
    for i in (1, 2, 3):
        p.iteration(Record(i, 0.1 * i, 1.0, 1.0, 0.1, 0.01, 0.2, 32 * i))
    etas = [parse_line(ln)["eta"] for ln in out.getvalue().splitlines()]
    assert np.isnan(etas[0]) and etas[1:] == [16.0, 14.0]


def test_csv_log_drops_rows_after_the_resume_point(tmp_path):
    path = tmp_path / "log.csv"
    log = CsvLog(path, None)
    for i in range(1, 8):
        log.write(Record(i, i / 10, 1.0 / i, 1.0, 0.1, 0.01, 0.1, 8 * i))
    log.close()
    with open(path, "a") as f:
        f.write("8,0.8,0.1")      # a line cut short by a kill
    log = CsvLog(path, resume_from=5)
    log.write(Record(6, 0.6, 9.0, 9.0, 0.1, 0.01, 0.1, 48))
    log.close()
    rows = read_log(path)
    assert [r.iteration for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[-1].loss == 9.0 and rows[2].loss == pytest.approx(1 / 3)


# -- resume ------------------------------------------------------------------------------------------

def _weights_bytes(path) -> bytes:
    return Path(path).read_bytes()


@pytest.mark.parametrize("net_extra", ["", "adam=1\nB1=.9\nB2=.999\neps=.000001"], ids=["sgd", "adam"])
def test_resume_with_state_equals_uninterrupted_run_bit_for_bit(tmp_path, net_extra):
    a = make_project(tmp_path / "a", net_extra=net_extra)
    b = make_project(tmp_path / "b", net_extra=net_extra)
    full = run(a)
    first = run(b, stop_after=5)
    assert first.interrupted and first.iteration == 5
    assert first.weights == str(Path(b.backup) / "tiny_last.weights")
    out = io.StringIO()
    second = run(b, weights=first.weights, progress=Progress("lines", stream=out))
    assert "Resuming from" in out.getvalue() and "iteration 5" in out.getvalue()
    assert "optimiser state restored" in out.getvalue()
    assert second.start_iteration == 5 and second.iteration == 12
    assert _weights_bytes(full.weights) == _weights_bytes(second.weights)
    # the loss curve continues: same iterations, same losses as the uninterrupted run
    la, lb = read_log(full.log), read_log(second.log)
    assert [r.iteration for r in lb] == list(range(1, 13))
    assert [r.loss for r in la] == [r.loss for r in lb]
    assert [r.avg_loss for r in la] == [r.avg_loss for r in lb]


def test_resume_from_weights_alone_continues_only_approximately(tmp_path):
    a = make_project(tmp_path / "a")
    b = make_project(tmp_path / "b")
    full = run(a)
    first = run(b, stop_after=5)
    os.remove(T.state_path(first.weights))
    out = io.StringIO()
    second = run(b, weights=first.weights, progress=Progress("lines", stream=out))
    assert "only approximately" in out.getvalue()
    assert second.start_iteration == 5 and second.iteration == 12
    wa = np.frombuffer(_weights_bytes(full.weights)[20:], np.float32)
    wb = np.frombuffer(_weights_bytes(second.weights)[20:], np.float32)
    assert not np.array_equal(wa, wb), "without momentum buffers the run cannot be exact"
    assert np.abs(wa - wb).max() < 0.5 * np.abs(wa).max(), "but it continues the same training"
    assert [r.iteration for r in read_log(second.log)] == list(range(1, 13))


def test_state_file_of_another_weights_version_is_refused(proj):
    r = run(proj, max_batches=6, save_last=4)
    b = Path(proj.backup)
    shutil.copy(b / "tiny_last.state", b / "tiny_final.state")       # state of iteration 4
    net = load_network(proj.cfg, weights=b / "tiny_final.weights")
    meta, why = T.read_state(str(b / "tiny_final.state"), net, T.file_crc(r.weights))
    assert meta is None and "another version of the weights file" in why
    meta, why = T.read_state(str(b / "tiny_last.state"), net, T.file_crc(b / "tiny_last.weights"))
    assert meta is not None and meta["iteration"] == 4 and meta["seed"] == 0
    # the momentum buffers are restored into Param.grad
    with np.load(b / "tiny_last.state") as z:
        conv = net.layers[0]
        w = next(p for p in conv.params if p.name == "weights")
        np.testing.assert_array_equal(w.grad, z[f"0:{w.name}:grad"])
        assert np.abs(w.grad).sum() > 0


def test_clear_restarts_the_iteration_count(proj):
    first = run(proj, max_batches=4)
    out = io.StringIO()
    again = run(proj, weights=first.weights, clear=True, max_batches=3, progress=Progress("lines", stream=out))
    assert again.start_iteration == 0 and again.iteration == 3
    assert "--clear" in out.getvalue()
    assert [r.iteration for r in read_log(again.log)] == [1, 2, 3]
    assert read_header(_weights_bytes(again.weights), "w")[3] == 24


def test_resume_past_max_batches_says_what_to_do(proj):
    first = run(proj, max_batches=3)
    with pytest.raises(TrainingError, match=r"already trained for 3 iterations.*--max-batches.*--clear"):
        run(proj, weights=first.weights, max_batches=3)


# -- atomic checkpoints --------------------------------------------------------------------------------

def _pair_is_consistent(proj, weights: Path) -> dict:
    net = load_network(proj.cfg, weights=weights)
    meta, why = T.read_state(T.state_path(weights), net, T.file_crc(weights))
    assert meta is not None, why
    return meta


def test_a_crash_while_writing_leaves_the_previous_checkpoint(proj, monkeypatch):
    run(proj, max_batches=4, save_last=2)
    b = Path(proj.backup)
    last = b / "tiny_last.weights"
    before = last.read_bytes(), Path(T.state_path(last)).read_bytes()
    listing = sorted(p.name for p in b.iterdir())
    real = np.savez
    calls = []

    def dying_savez(f, **arrays):       # the process "dies" half-way through the state file
        calls.append(1)
        f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(T.np, "savez", dying_savez)
    with pytest.raises(KeyboardInterrupt):
        run(proj, weights=str(last), max_batches=8, save_last=2)
    monkeypatch.setattr(T.np, "savez", real)
    assert calls
    # the state is written before the weights are renamed: the previous pair is intact, byte for byte
    assert (last.read_bytes(), Path(T.state_path(last)).read_bytes()) == before
    assert _pair_is_consistent(proj, last)["iteration"] == 4
    assert sorted(p.name for p in b.iterdir()) == listing, "no temp file is left behind"
    # a crash at the weights' rename: the same
    real_replace = os.replace

    def no_rename(src, dst):
        if str(dst).endswith(".weights"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(KeyboardInterrupt):
        run(proj, weights=str(last), max_batches=12, save_last=1, clear=True)
    monkeypatch.setattr(os, "replace", real_replace)
    assert (last.read_bytes(), Path(T.state_path(last)).read_bytes()) == before
    assert sorted(p.name for p in b.iterdir()) == listing

    # a crash after the weights' rename, before the state's: the new pair is found
    def no_state_rename(src, dst):
        if str(dst).endswith("_last.state") and not str(src).endswith(f".tmp{os.getpid()}"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", no_state_rename)
    with pytest.raises(KeyboardInterrupt):
        run(proj, weights=str(last), max_batches=12, save_last=1)
    monkeypatch.setattr(os, "replace", real_replace)
    pending = [p.name for p in b.glob("tiny_last.*.state")]
    assert len(pending) == 1 and last.read_bytes() != before[0]
    assert _pair_is_consistent(proj, last)["iteration"] == 5
    T.remove_stale_temp_files(proj.backup, "tiny")          # settles it: x.<crc>.state -> x.state
    assert not list(b.glob("tiny_last.*.state"))
    assert _pair_is_consistent(proj, last)["iteration"] == 5
    assert C.newest_checkpoint(b, "tiny")[0] == str(last)


def test_stale_temp_files_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f"tiny_last.weights.tmp{dead}").write_bytes(b"x")
    (tmp_path / "other_last.weights.tmp1").write_bytes(b"x")
    T.remove_stale_temp_files(tmp_path, "tiny")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other_last.weights.tmp1"]


@pytest.mark.slow
def test_sigkill_mid_run_then_resume(proj):
    """Checkpoint every iteration, SIGKILL the trainer at several moments: `_last` always loads."""
    data = Path(proj.data)
    data.write_text(data.read_text() + "savelast=1\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    last = Path(proj.backup) / "tiny_last.weights"
    for delay in (0.0, 0.37, 0.81):
        cmd = [sys.executable, "-m", "darkpy", "train", proj.cfg, "--data", proj.data, "--max-batches",
               "100000", "--progress", "lines"]
        if last.exists():
            cmd += ["--weights", str(last)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            seen_lines = 0
            deadline = time.time() + 120
            while seen_lines < 4 and time.time() < deadline:    # let it write a few checkpoints
                line = proc.stdout.readline()
                if not line:
                    break
                seen_lines += parse_line(line) is not None
            assert seen_lines >= 4, "the trainer did not start"
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        net = load_network(proj.cfg, weights=last)             # loads: complete and consistent
        assert net.seen > 0 and net.seen % 8 == 0
    k = load_network(proj.cfg, weights=last).seen // 8
    out = io.StringIO()
    r = run(proj, weights=str(last), max_batches=k + 2, progress=Progress("lines", stream=out))
    assert r.iteration == k + 2 and not r.interrupted
    log = read_log(r.log)
    assert [x.iteration for x in log] == list(range(1, k + 3)), "the log continues without gaps"


# -- failures a user can cause -------------------------------------------------------------------------

def test_label_errors_name_the_list_line_and_fix(tmp_path):
    p = make_project(tmp_path)
    lines = Path(p.train_list).read_text().splitlines()
    bad = Path(lines[4]).with_name("unlabelled.png")
    shutil.copy(lines[4], bad)
    lines[4] = str(bad)
    Path(p.train_list).write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as e:
        run(p)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{p.train_list}:5: {bad}: no class label occurs in the path")


def test_classes_and_label_count_mismatches(tmp_path):
    p = make_project(tmp_path)
    Path(p.data).write_text(Path(p.data).read_text().replace("classes=3", "classes=4"))
    with pytest.warns(UserWarning, match="3 names for classes=4"):
        with pytest.raises(DataError, match=r"classes=4 but .*tiny.cfg outputs 3 values per image; set classes=3"):
            run(p)
    q = make_project(tmp_path / "q", names=("alpha", "beta"))
    with pytest.warns(UserWarning):
        with pytest.raises(DataError, match=r"tiny.names: has 2 labels but .* says classes=3"):
            run(q)


def test_missing_data_file_is_found_by_convention_or_named(tmp_path, monkeypatch):
    p = make_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert T.find_data_file("cfg/tiny.cfg") == Path("data/tiny.data")
    assert T.find_data_file(p.cfg).resolve() == Path(p.data).resolve()
    with pytest.raises(DataError, match=r"other.cfg: no .data file found \(looked for .*other.data.*\); pass --data"):
        T.resolve_data_file(str(tmp_path / "cfg" / "other.cfg"), None)
    with pytest.raises(DataError, match="nope.data: no such .data file"):
        T.resolve_data_file(p.cfg, "nope.data")


def test_nan_loss_stops_naming_iteration_and_layer(proj, monkeypatch):
    real = darkpy.network.load_network

    def poisoned(*a, **kw):
        net = real(*a, **kw)
        conv = net.layers[3]
        forward = conv.forward

        def bad_forward(s):
            forward(s)
            if net.seen > 5 * 8:          # from iteration 6 on
                conv.output[0, 0, 0, 0] = np.nan
        conv.forward = bad_forward
        return net

    monkeypatch.setattr(darkpy.network, "load_network", poisoned)
    with pytest.raises(TrainingError) as e:
        run(proj, save_last=2)
    msg = str(e.value)
    assert msg.startswith("iteration 6: the loss is nan")
    assert "layer 3 [convolutional]" in msg and "tiny.cfg:" in msg
    last = Path(proj.backup) / "tiny_last.weights"
    assert f"the last good checkpoint is {last} (iteration 4)" in msg
    assert load_network(proj.cfg, weights=last).seen == 32
    assert not (Path(proj.backup) / "tiny_final.weights").exists()


def test_no_max_batches_is_an_error(tmp_path):
    p = make_project(tmp_path)
    Path(p.cfg).write_text(Path(p.cfg).read_text().replace("max_batches=12", ""))
    with pytest.raises(TrainingError, match="max_batches is not set; add max_batches=N to \\[net\\] or pass --max-batches"):
        run(p)


DET_CFG = """\
[net]
batch=4
subdivisions=1
width=16
height=16
channels=3
learning_rate=0.001
max_batches=3

[convolutional]
batch_normalize=1
filters=4
size=3
stride=2
pad=1
activation=leaky

[convolutional]
filters=18
size=1
activation=linear

[yolo]
mask=0,1,2
anchors=4,4,6,6,8,8
classes=1
num=3
"""


def test_detector_trains_from_box_labels(tmp_path):
    """A [yolo] net trains on images with label files beside them; bad label lines are listed."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(6):
        img = np.full((16, 16, 3), 20, np.uint8)
        x, y = (int(v) for v in rng.integers(2, 10, 2))
        img[y:y + 5, x:x + 5] = 230
        p = tmp_path / f"im{i}.png"
        Image.fromarray(img).save(p)
        boxes = f"0 {(x + 2.5) / 16} {(y + 2.5) / 16} {5 / 16} {5 / 16}\n" + ("7 .5 .5 .1 .1\n" if i == 0 else "")
        p.with_suffix(".txt").write_text(boxes)
        paths.append(str(p))
    (tmp_path / "train.list").write_text("\n".join(paths) + "\n")
    (tmp_path / "det.data").write_text(f"classes=1\ntrain={tmp_path / 'train.list'}\nbackup={tmp_path / 'bk'}\n")
    (tmp_path / "det.cfg").write_text(DET_CFG)
    r = T.train(tmp_path / "det.cfg", data=tmp_path / "det.data", settings=Settings(), evaluate=False)
    assert r.iteration == 3 and r.accuracy is None
    assert all(math.isfinite(x.loss) and x.loss > 0 for x in r.records)
    assert load_network(tmp_path / "det.cfg", weights=r.weights).seen == 12
    assert "class 7 out of range" in (tmp_path / "bk" / "bad_label.list").read_text()


# -- validation and prediction -------------------------------------------------------------------------

def test_validate_and_predict_agree_with_a_manual_forward(proj):
    r = run(proj, max_batches=30)
    v = T.validate(proj.cfg, r.weights, data=proj.data)
    assert v.n == 12 and v.k == 2 and v.confusion.sum() == 12
    assert v.top1 == pytest.approx(np.trace(v.confusion) / 12)
    assert v.top1 <= v.topk <= 1
    paths = Path(proj.valid_list).read_text().split()
    preds = T.predict(proj.cfg, r.weights, paths[:3], data=proj.data, top=3)
    net = load_network(proj.cfg, weights=r.weights, batch=1)
    for path, pred in zip(paths, preds):
        x = np.asarray(Image.open(path), np.float32)[None, None] / np.float32(255)
        probs = net.predict(x).reshape(-1)
        assert [i for i, _, _ in pred.top] == list(np.argsort(-probs, kind="stable"))
        assert [pp for _, _, pp in pred.top] == pytest.approx(sorted(probs, reverse=True), rel=1e-6)
        assert pred.top[0][1] in NAMES


@pytest.mark.slow
def test_digits_short_seeded_run_is_well_above_chance(monkeypatch, tmp_path):
    """The bundled digits classifier: a short seeded run (a quarter of the full one) already reaches
    an accuracy far above the 10 % of chance on the held-out test split."""
    monkeypatch.chdir(ROOT)
    r = T.train("cfg/digits.cfg", max_batches=150, settings=Settings(seed=0), backup=str(tmp_path))
    assert r.accuracy is not None and r.accuracy.n == 360
    assert r.accuracy.top1 >= 0.6, r.accuracy.format()


# -- settings ------------------------------------------------------------------------------------------

def test_settings_file_flags_override_and_errors(tmp_path, monkeypatch):
    (tmp_path / "darkpy.toml").write_text('[paths]\nbackup = "bk"\n[run]\nseed = 7\nthreads = 1\n')
    sub = tmp_path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    s = load_settings()
    assert (s.backup, s.seed, s.threads, s.progress) == ("bk", 7, 1, "auto")
    assert s.override(seed=3, threads=None).seed == 3 and s.override(seed=None).seed == 7
    (tmp_path / "darkpy.toml").write_text("[run]\nsed = 7\n")
    with pytest.raises(SettingsError, match=r"darkpy.toml: unknown key run.sed \(known: run.seed"):
        load_settings()
    (tmp_path / "darkpy.toml").write_text('[run]\nseed = "x"\n')
    with pytest.raises(SettingsError, match="run.seed must be an integer"):
        load_settings()
    (tmp_path / "darkpy.toml").write_text('[run]\nprogress = "fancy"\n')
    with pytest.raises(SettingsError, match="progress must be one of auto, bar, lines, none"):
        load_settings()
    (tmp_path / "darkpy.toml").write_text('[run\n')
    with pytest.raises(SettingsError, match="invalid TOML"):
        load_settings()


def test_repo_settings_file_is_valid():
    s = load_settings(ROOT / "darkpy.toml")
    assert s.backup == "backup" and s.progress in ("auto", "bar", "lines", "none")


def test_kernels_need_compiling_sees_an_empty_cache(proj, monkeypatch, tmp_path):
    net = load_network(proj.cfg)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "empty"))
    assert T.kernels_need_compiling(net)



def test_inference_does_not_wait_for_the_optimisers_kernels(proj, monkeypatch, tmp_path):
    """A cache holding every kernel module an inference run uses, but not the optimiser's (which
    inference never compiles): `predict` must not announce compiling on every warm start."""
    import sys

    from numba.core.registry import CPUDispatcher

    import darkpy.images  # noqa: F401  (the module the check looks up, as a predict run imports it)

    net = load_network(proj.cfg)
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in {type(layer).__module__ for layer in net.layers} | {"darkpy.images"}:
        mod = sys.modules[name]
        for obj in vars(mod).values():
            if isinstance(obj, CPUDispatcher) and obj.py_func.__module__ == name:
                (cache / f"{Path(mod.__file__).stem}.{obj.py_func.__qualname__}-1.py311.nbi").touch()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))
    assert not T.kernels_need_compiling(net, training=False)
    assert T.kernels_need_compiling(net)       # training also runs the optimiser: not cached here

def test_cfg_base_follows_darknet():
    assert T.cfg_base("cfg/yolov3-tiny.cfg") == "yolov3-tiny"
    assert T.cfg_base("a/b/x.1.cfg") == "x"


def test_configure_threads_sets_numba_threads(monkeypatch):
    import numba

    before = numba.get_num_threads()
    try:
        assert T.configure_threads(1) == 1 and numba.get_num_threads() == 1
        # (the OpenMP wait policy is the `darkpy` command's own: tests/test_import_side_effects.py)
        assert T.configure_threads(0) == numba.config.NUMBA_NUM_THREADS
        assert T.configure_threads(10_000) == numba.config.NUMBA_NUM_THREADS
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("spans", [1, 3, 9])
def test_sum_squares_adds_its_spans_in_order(spans):
    """optim.sum_squares: the float64 span sums added in order whether the spans run one after
    the other (fewer than SUM_PARALLEL_SPANS) or in parallel; equal to the float64 Σ g²."""
    from darkpy import optim
    span = 1 << 16
    g = np.random.default_rng(spans).standard_normal(spans * span - 5).astype(np.float32)
    g64 = g.astype(np.float64)
    want = 0.0
    for lo in range(0, g.size, span):
        want += float(optim.vm.dot_lanes(g[lo:lo + span], g[lo:lo + span], min(span, g.size - lo)))
    got = optim.sum_squares(g)
    assert got == want
    assert abs(got - float(g64 @ g64)) <= 1e-9 * got
