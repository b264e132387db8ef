"""The `darkpy` command line: train / valid / predict / summary through click's CliRunner, the one-line
errors every user mistake gets, Ctrl-C, settings, and one real subprocess run of `darkpy train`."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from darkpy.cli import main
from darkpy.errors import DarkpyError
from darkpy.progress import Progress, parse_line, read_log
from test_train import ROOT, make_project


@pytest.fixture
def proj(tmp_path):
    return make_project(tmp_path)


def invoke(*args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


def assert_one_line_error(result, *fragments):
    assert result.exit_code == 1, result.output
    err = result.stderr.strip()
    assert "Traceback" not in result.output and "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ")
    for f in fragments:
        assert f in err, err


# -- train -----------------------------------------------------------------------------------------

def test_train_prints_progress_checkpoints_and_accuracy(proj):
    r = invoke("train", proj.cfg, "--data", proj.data, "--max-batches", 6, "--progress", "lines")
    assert r.exit_code == 0, r.output
    lines = [parse_line(ln) for ln in r.stdout.splitlines()]
    assert [x["iteration"] for x in lines if x] == [1, 2, 3, 4, 5, 6]
    assert f"saved {proj.backup}/tiny_final.weights" in r.stdout
    assert "top-1 accuracy" in r.stdout and "top-2" in r.stdout and "(12 images)" in r.stdout
    assert (Path(proj.backup) / "chart.png").is_file()


def test_train_finds_data_by_convention_and_backup_flag_wins(proj, monkeypatch, tmp_path):
    monkeypatch.chdir(proj.root)
    r = invoke("train", "cfg/tiny.cfg", "--max-batches", 2, "--backup", tmp_path / "elsewhere",
               "--progress", "none")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "elsewhere" / "tiny_final.weights").is_file()
    assert not Path(proj.backup).exists()


def test_settings_file_supplies_backup_and_seed(proj, monkeypatch):
    data = Path(proj.data)
    data.write_text("\n".join(ln for ln in data.read_text().splitlines() if not ln.startswith("backup")))
    (proj.root / "darkpy.toml").write_text('[paths]\nbackup = "from_toml"\n[run]\nseed = 5\nprogress = "none"\n')
    monkeypatch.chdir(proj.root)
    r = invoke("train", proj.cfg, "--data", proj.data, "--max-batches", 2)
    assert r.exit_code == 0, r.output
    assert parse_line(r.stdout.splitlines()[0]) is None   # progress = "none": no iteration lines
    assert (proj.root / "from_toml" / "tiny_final.weights").is_file()
    # the seed came from the file: the state file records it
    import numpy as np
    with np.load(proj.root / "from_toml" / "tiny_final.state") as z:
        assert json.loads(z["meta"].tobytes())["seed"] == 5


def test_resume_says_so_and_continues(proj):
    invoke("train", proj.cfg, "--data", proj.data, "--max-batches", 3, "--progress", "none")
    w = Path(proj.backup) / "tiny_final.weights"
    r = invoke("train", proj.cfg, "--data", proj.data, "--weights", w, "--max-batches", 5, "--progress", "lines")
    assert r.exit_code == 0, r.output
    assert f"Resuming from {w}: iteration 3, 24 images seen, optimiser state restored" in r.stdout
    assert [x["iteration"] for x in map(parse_line, r.stdout.splitlines()) if x] == [4, 5]
    assert [x.iteration for x in read_log(Path(proj.backup) / "tiny_log.csv")] == [1, 2, 3, 4, 5]


def test_ctrl_c_saves_last_and_exits_zero(proj, monkeypatch):
    real = Progress.iteration

    def interrupting(self, rec):
        real(self, rec)
        if rec.iteration == 3:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(Progress, "iteration", interrupting)
    r = invoke("train", proj.cfg, "--data", proj.data, "--progress", "lines")
    assert r.exit_code == 0, r.output
    last = Path(proj.backup) / "tiny_last.weights"
    assert f"Interrupted at iteration 3: saved {last}" in r.stdout
    assert last.is_file() and not (Path(proj.backup) / "tiny_final.weights").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the handler is restored"


@pytest.mark.parametrize("case", ["missing_cfg", "bad_data_key", "label_mismatch", "missing_image",
                                  "weights_size", "missing_weights", "bad_toml", "missing_data"])
def test_user_errors_are_one_line_exit_1(proj, case, monkeypatch, tmp_path):
    args = ["train", proj.cfg, "--data", proj.data, "--max-batches", 2, "--progress", "none"]
    expect: tuple[str, ...]
    if case == "missing_cfg":
        args[1] = str(tmp_path / "nope.cfg")
        expect = ("nope.cfg: no such file",)
    elif case == "bad_data_key":
        Path(proj.data).write_text(Path(proj.data).read_text().replace("classes=3", "classes=three"))
        expect = ("tiny.data:1 classes: not an integer (got 'three')",)
    elif case == "label_mismatch":
        Path(proj.cfg).write_text(Path(proj.cfg).read_text().replace("filters=3", "filters=5"))
        expect = ("classes=3 but", "outputs 5 values per image; set classes=5")
    elif case == "missing_image":
        lst = Path(proj.train_list)
        lst.write_text(lst.read_text().replace("train002_gamma", "train002x_gamma"))
        expect = ("train002x_gamma.png: no such image file",)
    elif case == "weights_size":
        invoke("train", proj.cfg, "--data", proj.data, "--max-batches", 1, "--progress", "none")
        w = Path(proj.backup) / "tiny_final.weights"
        Path(proj.cfg).write_text(Path(proj.cfg).read_text().replace("filters=4", "filters=6"))
        args += ["--weights", str(w)]
        expect = (str(w), "too short", "another cfg, input size or number of classes")
    elif case == "missing_weights":
        args += ["--weights", str(tmp_path / "none.weights")]
        expect = ("none.weights: no such weights file",)
    elif case == "bad_toml":
        (tmp_path / "darkpy.toml").write_text("[run]\nthreads = -1\n")
        monkeypatch.chdir(tmp_path)
        expect = ("darkpy.toml: threads must be >= 0",)
    else:
        args[3] = str(tmp_path / "none.data")
        expect = ("none.data: no such .data file",)
    assert_one_line_error(invoke(*args), *expect)


def test_debug_shows_the_exception(tmp_path):
    with pytest.raises(DarkpyError):
        invoke("--debug", "train", tmp_path / "nope.cfg")


def test_version():
    r = invoke("--version")
    assert r.exit_code == 0 and r.stdout.startswith("darkpy, version ")


def test_clear_needs_weights(proj):
    r = CliRunner().invoke(main, ["train", proj.cfg, "--clear"])
    assert r.exit_code == 2 and "--clear needs --weights" in r.output


# -- valid / predict -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    proj = make_project(tmp_path_factory.mktemp("trained"))
    r = invoke("train", proj.cfg, "--data", proj.data, "--max-batches", 12, "--progress", "none")
    assert r.exit_code == 0, r.output
    return proj, Path(proj.backup) / "tiny_final.weights"


def test_valid_prints_accuracy_and_confusion_matrix(trained):
    p, w = trained
    r = invoke("valid", p.cfg, w, "--data", p.data)
    assert r.exit_code == 0, r.output
    out = r.stdout.splitlines()
    assert out[0].startswith("top-1 accuracy ") and "top-2" in out[0] and "(12 images)" in out[0]
    assert out[1].startswith("confusion matrix")
    assert out[2].split() == ["alpha", "beta", "gamma"]
    rows = [ln.split() for ln in out[3:6]]
    assert [row[0] for row in rows] == ["alpha", "beta", "gamma"]
    assert sum(int(v) for row in rows for v in row[1:]) == 12
    j = json.loads(invoke("valid", p.cfg, w, "--data", p.data, "--json").stdout)
    assert j["images"] == 12 and j["k"] == 2 and len(j["confusion"]) == 3
    assert j["top1"] == pytest.approx(sum(j["confusion"][i][i] for i in range(3)) / 12)


def test_predict_text_and_json(trained):
    p, w = trained
    imgs = Path(p.valid_list).read_text().split()[:2]
    r = invoke("predict", p.cfg, w, *imgs, "--data", p.data, "--top", 2)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == f"{imgs[0]}:" and lines[3] == f"{imgs[1]}:"
    for ln in lines[1:3] + lines[4:6]:
        pct, name = ln.split(": ")
        assert name in ("alpha", "beta", "gamma") and 0 <= float(pct.rstrip("%")) <= 100
    j = json.loads(invoke("predict", p.cfg, w, *imgs, "--data", p.data, "--json").stdout)
    assert [x["image"] for x in j] == imgs
    probs = [q["probability"] for q in j[0]["predictions"]]
    assert len(probs) == 2 and probs == sorted(probs, reverse=True)   # top=2 from the .data file
    assert sum(probs) <= 1 + 1e-6


def test_predict_missing_image_is_one_line(trained, tmp_path):
    p, w = trained
    assert_one_line_error(invoke("predict", p.cfg, w, tmp_path / "no.png", "--data", p.data),
                          "no.png: no such image file")


# -- summary ---------------------------------------------------------------------------------------

def test_summary_of_digits(monkeypatch):
    monkeypatch.chdir(ROOT)
    r = invoke("summary", "cfg/digits.cfg")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == "layer     filters    size              input                output"
    assert lines[1].startswith("    0 conv     16  3 x 3 / 1    16 x  16 x   1   ->    16 x  16 x  16")
    assert any(ln.startswith("Parameters: ") for ln in lines)
    assert any(ln.startswith("BFLOPs: ") for ln in lines) and any(ln.startswith("Buffers: ") for ln in lines)
    r = invoke("summary", "cfg/digits.cfg", "--width", 32, "--height", 24)
    assert "   32 x  24 x   1   ->    32 x  24 x  16" in r.stdout


def test_summary_bad_cfg_is_one_line(tmp_path):
    bad = tmp_path / "bad.cfg"
    bad.write_text("[net]\nwidth=8\nheight=8\nchannels=1\n[convolutional]\nfilters=x\n")
    assert_one_line_error(invoke("summary", bad), "bad.cfg:6 [section #0 convolutional] filters: not an integer")


def _env_with_empty_numba_cache(tmp_path):
    cache = tmp_path / "numba-cache"
    cache.mkdir()
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return env, cache


def test_commands_without_kernels_compile_nothing(tmp_path):
    """`--help`, `summary` and `cfg` never compile a numba kernel: an empty cache stays empty."""
    env, cache = _env_with_empty_numba_cache(tmp_path)
    for args in (["--help"], ["summary", "cfg/digits.cfg"], ["cfg", "check", "cfg/digits.cfg"]):
        r = subprocess.run([sys.executable, "-m", "darkpy", *args], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    assert [p for p in cache.rglob("*") if p.is_file()] == []    # (numba makes empty folders)


# -- a real process ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_darkpy_train_end_to_end_in_a_subprocess(proj):
    exe = shutil.which("darkpy")
    cmd = [exe] if exe else [sys.executable, "-m", "darkpy"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(cmd + ["train", proj.cfg, "--data", proj.data, "--max-batches", "12"],
                       cwd=proj.root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    parsed = [parse_line(ln) for ln in r.stdout.splitlines()]
    assert [x["iteration"] for x in parsed if x] == list(range(1, 13))
    assert "top-1 accuracy" in r.stdout
    b = Path(proj.backup)
    for name in ("tiny_final.weights", "tiny_final.state", "tiny_log.csv", "chart.png"):
        assert (b / name).is_file(), name
    r = subprocess.run(cmd + ["predict", proj.cfg, str(b / "tiny_final.weights"),
                              Path(proj.valid_list).read_text().split()[0], "--json"],
                       cwd=proj.root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["predictions"][0]["label"] in ("alpha", "beta", "gamma")


def test_train_strict_turns_a_cfg_warning_into_a_one_line_error(proj):
    cfg = Path(proj.cfg)
    text = cfg.read_text()
    cfg.write_text(text.replace("[net]\n", "[net]\nmomentum=0.9\nmomentum=0.8\n", 1))
    r = invoke("train", proj.cfg, "--data", proj.data, "--max-batches", 1, "--progress", "none", "--strict")
    assert_one_line_error(r, "momentum: duplicate key", "the first is used (momentum=0.9)", "--strict")
    r = invoke("train", proj.cfg, "--data", proj.data, "--max-batches", 1, "--progress", "none")
    assert r.exit_code == 0, r.output
    assert "warning: " in r.stderr and "momentum: duplicate key" in r.stderr
