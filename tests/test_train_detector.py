"""Training detectors (darkpy/train.py, `darkpy train`): multi-scale training (random=1 on the last
[yolo]), exact resume across size changes, `--map` with `<cfg>_best.weights`, and the .data file
found by the cfg family's name (cfg/shapes-tiny.cfg -> data/shapes.data).

A tiny [yolo] net (96 px input, stride 4) trains on a few 64 px images of the bundled shapes
generator (data/shapes/generate.py) written to a temp folder.
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import shapes_generator

import darkpy.network
import darkpy.train as T
from darkpy.cli import main
from darkpy.progress import Progress, read_log
from darkpy.settings import Settings

ROOT = Path(__file__).resolve().parents[1]

DET_CFG = """\
[net]
batch=2
subdivisions=1
width=96
height=96
channels=3
learning_rate=0.001
momentum=0.9
decay=0.0005
max_batches={max_batches}

[convolutional]
batch_normalize=1
filters=4
size=3
stride=2
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
filters=27
size=1
activation=linear

[yolo]
mask=0,1,2
anchors=8,8,16,16,24,24
classes=4
num=3
jitter=.2
random={random}
"""


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """8 generated 64 px shapes images (6 train, 2 valid) with labels and list files."""
    out = tmp_path_factory.mktemp("shapes")
    train, valid = shapes_generator().generate(out, n=8, size=64, seed=3, valid_fraction=0.25)
    return out, train, valid


def make_project(root: Path, shapes, max_batches: int = 30, random: int = 1) -> tuple[str, str]:
    """A cfg and a .data file (backup=root/backup) over the shared generated images."""
    _, train, valid = shapes
    root.mkdir(parents=True, exist_ok=True)
    cfg = root / "det.cfg"
    cfg.write_text(DET_CFG.format(max_batches=max_batches, random=random))
    data = root / "det.data"
    data.write_text(f"classes=4\ntrain={train}\nvalid={valid}\nnames={ROOT / 'data' / 'shapes.names'}\n"
                    f"backup={root / 'backup'}\n")
    return str(cfg), str(data)


def run(cfg, data, **kw):
    kw.setdefault("settings", Settings())
    return T.train(cfg, data=data, **kw)


def watch_forwards(monkeypatch):
    """Record the input width of every training forward, checking after each that every layer's
    buffers have the shapes its current in/out shapes call for."""
    real = darkpy.network.load_network
    seen: list[int] = []
    nets = []

    def loading(*a, **kw):
        net = real(*a, **kw)
        nets.append(net)
        forward = net.forward

        def checked(x, truth=None, train=False):
            out = forward(x, truth, train)
            if train:
                seen.append(x.shape[-1])
                assert (net.width, net.height) == (x.shape[-1], x.shape[-2])
                shape = x.shape[1:]
                for layer in net.layers:
                    assert layer.in_shape == shape
                    assert layer.output.size == net.batch * math.prod(layer.out_shape)
                    shape = layer.out_shape
                assert net.layers[-1].out_shape == (27, x.shape[-2] // 4, x.shape[-1] // 4)
            return out
        net.forward = checked
        return net

    monkeypatch.setattr(darkpy.network, "load_network", loading)
    return seen, nets


# -- the schedule ------------------------------------------------------------------------------------------

def test_multiscale_sizes_scale_with_the_cfg():
    assert T.multiscale_sizes(128, 128, 1) == [(96, 96), (128, 128), (160, 160)]
    assert [w for w, _ in T.multiscale_sizes(416, 416, 1)] == list(range(320, 577, 32))
    assert T.multiscale_sizes(96, 96, 1) == [(96, 96), (128, 128)]
    assert T.multiscale_sizes(64, 64, 1) == [(64, 64)]              # too small to vary: no resizing
    assert T.multiscale_sizes(128, 128, 2.0) == [(64, 64), (96, 96), (128, 128), (160, 160), (192, 192), (224, 224), (256, 256)]
    assert T.multiscale_sizes(256, 128, 1)[0] == (192, 96)          # the aspect ratio is kept


def test_multiscale_size_is_a_pure_function_of_seed_and_iteration():
    sizes = T.multiscale_sizes(416, 416, 1)
    draw = [T.multiscale_size(7, k, sizes, (416, 416), 1000) for k in range(1000)]
    assert draw == [T.multiscale_size(7, k, sizes, (416, 416), 1000) for k in range(1000)]
    assert all(draw[k] == draw[k - k % 10] for k in range(900))              # one size per 10 iterations
    assert set(draw[:900]) == set(sizes)
    assert set(draw[900:]) == {(416, 416)}                                   # the final 10%: the cfg's size
    assert draw[:900] != [T.multiscale_size(8, k, sizes, (416, 416), 1000) for k in range(900)]


def test_data_file_found_by_the_name_cut_at_the_first_dash(tmp_path, monkeypatch):
    assert T.find_data_file(ROOT / "cfg" / "shapes-tiny.cfg").resolve() == (ROOT / "data" / "shapes.data").resolve()
    (tmp_path / "cfg").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shapes.data").write_text("classes=4\n")
    monkeypatch.chdir(tmp_path)
    assert T.find_data_file("cfg/shapes-tiny.cfg") == Path("data/shapes.data")
    (tmp_path / "data" / "shapes-tiny.data").write_text("classes=4\n")
    assert T.find_data_file("cfg/shapes-tiny.cfg") == Path("data/shapes-tiny.data")   # the full name first


# -- multi-scale training ------------------------------------------------------------------------------------

def test_random_1_trains_at_the_drawn_sizes_and_ends_at_the_cfg_size(tmp_path, shapes, monkeypatch):
    seen, nets = watch_forwards(monkeypatch)
    cfg, data = make_project(tmp_path, shapes, max_batches=30)
    out = io.StringIO()
    r = run(cfg, data, seed=1, evaluate=False, progress=Progress("lines", stream=out))
    sizes = T.multiscale_sizes(96, 96, 1)
    expected = [T.multiscale_size(1, k, sizes, (96, 96), 30)[0] for k in range(30)]
    assert seen == expected
    assert set(seen) == {96, 128} and seen[27:] == [96, 96, 96]
    assert "random=1: multi-scale training at 96x96, 128x128" in out.getvalue()
    changes = [(k, w) for k, w, _ in r.sizes]
    assert changes == [(k, expected[k]) for k in range(30) if expected[k] != (expected[k - 1] if k else 96)]
    assert f"Resizing to 128x128 (iteration {changes[0][0] + 1})" in out.getvalue()
    assert (nets[0].width, nets[0].height) == (96, 96)
    assert all(math.isfinite(x.loss) and x.loss > 0 for x in r.records)
    # the final weights load into the cfg-size network
    assert darkpy.network.load_network(cfg, weights=r.weights).seen == 60


def test_random_0_never_resizes(tmp_path, shapes, monkeypatch):
    seen, _ = watch_forwards(monkeypatch)
    cfg, data = make_project(tmp_path, shapes, max_batches=4, random=0)
    r = run(cfg, data, evaluate=False)
    assert seen == [96] * 4 and r.sizes == []


def test_resume_with_state_is_bit_exact_across_size_changes(tmp_path, shapes):
    cfg_a, data_a = make_project(tmp_path / "a", shapes, max_batches=25)
    cfg_b, data_b = make_project(tmp_path / "b", shapes, max_batches=25)
    full = run(cfg_a, data_a, seed=1, evaluate=False)
    assert len({w for _, w, _ in full.sizes}) == 2       # the run did change size
    first = run(cfg_b, data_b, seed=1, evaluate=False, stop_after=13)
    assert first.interrupted and first.iteration == 13
    second = run(cfg_b, data_b, weights=first.weights, evaluate=False)
    assert second.iteration == 25
    assert Path(full.weights).read_bytes() == Path(second.weights).read_bytes()
    la, lb = read_log(full.log), read_log(second.log)
    assert [r.loss for r in la] == [r.loss for r in lb]
    # the resumed run started at the cfg size and moved to iteration 14's drawn size at once
    drawn = T.multiscale_size(1, 13, T.multiscale_sizes(96, 96, 1), (96, 96), 25)
    assert drawn == (128, 128) and second.sizes[0] == (13, 128, 128)


# -- --map ---------------------------------------------------------------------------------------------

def test_map_is_measured_logged_and_the_best_weights_kept(tmp_path, shapes):
    cfg, data = make_project(tmp_path, shapes, max_batches=6)
    out = io.StringIO()
    r = run(cfg, data, evaluate=False, calc_map=True, map_every=3, progress=Progress("lines", stream=out))
    logged = {x.iteration: x.map for x in read_log(r.log)}
    assert [k for k, m in logged.items() if not math.isnan(m)] == [3, 6]
    assert r.map is not None and r.map.map == logged[6] and r.map.images == 2
    assert r.best_map == max(logged[3], logged[6])
    best = Path(r.backup) / "det_best.weights"
    assert r.best == str(best) and best.is_file()
    with np.load(T.state_path(best)) as z:
        meta = json.loads(z["meta"].tobytes())
    assert meta["best_map"] == r.best_map
    assert meta["iteration"] == (3 if logged[3] >= logged[6] else 6)
    assert "iteration 3: mAP@0.5 = " in out.getvalue()
    # _best.weights holds the network of the best measurement: measuring it again gives that mAP
    from darkpy.detect import evaluate_map
    net = darkpy.network.load_network(cfg, batch=2, weights=best)
    assert evaluate_map(net, data, iou=0.5).map == pytest.approx(r.best_map, abs=1e-12)
    # random=1: iterations 1-3 trained at 128 px (seed 0's draw), the mAP is measured at the cfg's 96
    assert T.multiscale_size(0, 2, T.multiscale_sizes(96, 96, 1), (96, 96), 6) == (128, 128)
    assert "Resizing to 96x96 (the cfg's size, to measure mAP)" in out.getvalue()
    assert (Path(r.backup) / "det_final.weights").is_file() and r.weights.endswith("det_final.weights")


def test_map_on_a_classifier_is_refused(tmp_path):
    from test_train import make_project as make_classifier
    p = make_classifier(tmp_path)
    with pytest.raises(T.DarkpyError, match="--map measures detector mAP"):
        T.train(p.cfg, data=p.data, settings=Settings(), calc_map=True)


# -- the command line -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_trains_the_bundled_shapes_tiny_cfg(tmp_path, shapes, monkeypatch):
    out, train, valid = shapes
    data = tmp_path / "shapes.data"
    data.write_text(f"classes=4\ntrain={train}\nvalid={valid}\nnames={ROOT / 'data' / 'shapes.names'}\n"
                    f"backup={tmp_path / 'backup'}\n")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["train", str(ROOT / "cfg" / "shapes-tiny.cfg"), "--max-batches", "2",
                                  "--data", str(data), "--progress", "none", "--map-every", "1"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert f"saved {tmp_path / 'backup'}/shapes-tiny_final.weights" in r.stdout
    assert "mAP@0.5 of the final weights: " in r.stdout
    assert (tmp_path / "backup" / "shapes-tiny_best.weights").is_file()
    logged = read_log(tmp_path / "backup" / "shapes-tiny_log.csv")
    assert [x.iteration for x in logged] == [1, 2] and not any(math.isnan(x.map) for x in logged)
