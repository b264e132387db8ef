"""AlexeyAB's custom-detector recipe without friction (issue 16): detect on barely trained weights,
the printed resume command, the done line after a resume, lists checked when read, partial weights
and --upto, Darknet's command forms, detect on many images with --save-labels, input-size hints,
paths with spaces in .data files, and the chart's mAP axis and ETA.

Detector fixtures: the hand-set 4 px detector of test_detect.py (`_detector_files`) and the tiny
[yolo] net of test_train_detector.py on generated shapes images; classifier: test_train.py's."""
from __future__ import annotations

import io
import json
import math
import os
import shlex
import signal
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import darkpy.train as T
from darkpy import detect
from darkpy.cfg import CfgWarning
from darkpy.chart import AVG_LINE, BOTTOM, H, LEFT, RIGHT, TOP, W, draw_loss_chart
from darkpy.cli import main
from darkpy.cli_darknet import DarknetUsage, translate
from darkpy.datasets import read_data_file, read_list
from darkpy.errors import CfgError, DataError
from darkpy.cfgcheck import check_cfg
from darkpy.network import load_network, network_from_text
from darkpy.partial import class_independent_layers, partial_layers
from darkpy.progress import Progress, Record, parse_line
from darkpy.settings import Settings
from darkpy.weights import expected_bytes, read_header
from test_detect import _detector_files
from test_train import make_project as make_classifier
from test_train_detector import DET_CFG, make_project as make_detector, shapes  # noqa: F401  (fixture)


def invoke(*args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], **kw)


def one_line_error(r, *fragments):
    assert r.exit_code == 1, r.output
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), r.stderr
    for f in fragments:
        assert f in err[0], err[0]
    return err[0]


# -- 1. detect never crashes on non-finite boxes ------------------------------------------------------

def _overflowing_weights(tmp_path):
    """The hand-set detector with anchor 1's width logit at 1000: exp() overflows, every box of that
    anchor has width inf (what barely trained weights give)."""
    cfg, weights, data = _detector_files(tmp_path)
    net = network_from_text(cfg.read_text())
    net.load_weights(weights)
    net.layers[0].biases.value[9] = 1000.0
    bad = tmp_path / "bad.weights"
    net.save_weights(bad)
    return cfg, bad, data


@pytest.mark.parametrize("extra", [[], ["--json"], ["--thresh", "0.9", "--json"]])
def test_detect_drops_non_finite_boxes_and_warns(tmp_path, extra):
    cfg, bad, data = _overflowing_weights(tmp_path)
    r = invoke("detect", cfg, bad, tmp_path / "images" / "im0.png", "--data", data, "--out", tmp_path / "o", *extra)
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    assert "warning: 1 candidate box with non-finite coordinates or probabilities was dropped" in r.stderr
    assert "overflow" not in r.stderr
    if "--json" in extra:
        res = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
        assert res[0]["detections"] == [] and res[0]["non_finite_dropped"] == 1
    else:
        assert "0 objects" in r.stdout


def test_random_weights_scaled_up_do_not_crash_detect(tmp_path):
    """Untrained weights scaled up: inf and NaN outputs everywhere; detect_image drops them."""
    net = network_from_text(DET_CFG.format(max_batches=1, random=0), seed=1)
    for layer in net.layers:
        for a in layer.weight_arrays():
            a *= 1e4
    img = np.random.default_rng(0).uniform(size=(3, 40, 60)).astype(np.float32)
    dets = detect.detect_image(net, img, thresh=0.9)
    assert dets.dropped > 0
    for d in dets:
        d.corners(60, 40)                              # every kept box converts to pixels


def test_corners_clamp_huge_boxes_before_int():
    d = detect.Detection(0.5, 0.5, 1e300, 2.0, 0, 0.9, 0.9, np.array([0.9]))
    assert d.corners(40, 20) == (0, 0, 39, 19)
    with pytest.raises(ValueError, match="non-finite"):
        detect.Detection(0.5, 0.5, math.inf, 1.0, 0, 0.9, 0.9, np.array([0.9])).corners(40, 20)


# -- 2 and 3. the printed resume command works verbatim; the done line after a resume ---------------------

def test_printed_resume_command_runs_verbatim(tmp_path, monkeypatch):
    p = make_classifier(tmp_path)
    data = tmp_path / "elsewhere.data"            # not where the cfg's name would find it
    os.replace(p.data, data)
    backup = tmp_path / "my backup"
    real = Progress.iteration

    def interrupting(self, rec):
        real(self, rec)
        if rec.iteration == 3:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(Progress, "iteration", interrupting)
    monkeypatch.chdir(tmp_path)
    r = invoke("train", p.cfg, "--data", data, "--backup", backup, "--max-batches", 6, "--progress", "none",
               "--seed", 4)
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("Interrupted at iteration 3"))
    command = line.split("resume with `", 1)[1].rstrip("`")
    words = shlex.split(command)
    assert words[:2] == ["darkpy", "train"] and "--data" in words and "--backup" in words
    assert words[words.index("--max-batches") + 1] == "6"
    monkeypatch.setattr(Progress, "iteration", real)
    r2 = invoke(*words[1:])
    assert r2.exit_code == 0, r2.output
    assert f"Resuming from {backup / 'tiny_last.weights'}: iteration 3" in r2.stdout
    assert "optimiser state restored" in r2.stdout
    assert "Done: 6 iterations in all, 3 in this run (resumed at 3) in " in r2.stdout
    # the resumed run is the uninterrupted one, bit for bit
    r3 = invoke("train", p.cfg, "--data", data, "--backup", tmp_path / "straight", "--max-batches", 6,
                "--progress", "none", "--seed", 4)
    assert "Done: 6 iterations in " in r3.stdout and "in this run" not in r3.stdout
    assert (backup / "tiny_final.weights").read_bytes() == (tmp_path / "straight" / "tiny_final.weights").read_bytes()


# -- 4 and 9. .data lists checked when read; paths with spaces -----------------------------------------

def test_map_does_not_need_the_train_list(tmp_path):
    cfg, weights, data = _detector_files(tmp_path)
    data.write_text(data.read_text() + "train=no/such/train.list\n")
    r = invoke("map", cfg, weights, "--data", data, "--batch", 2)
    assert r.exit_code == 0, r.output
    assert "all-point    = 0.500000" in r.stdout
    r = invoke("train", cfg, "--data", data, "--progress", "none", "--max-batches", 1)
    one_line_error(r, f"{data}:4 train: no such file 'no/such/train.list'")


def test_missing_valid_list_stops_a_classifier_run_before_it_trains(tmp_path):
    p = make_classifier(tmp_path)
    Path(p.valid_list).unlink()
    with pytest.raises(DataError, match="valid: no such file"):
        T.train(p.cfg, data=p.data, settings=Settings(), max_batches=1)
    assert not (Path(p.backup) / "tiny_final.weights").exists()


def test_paths_with_spaces_in_a_data_file_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my data").mkdir()
    (tmp_path / "my data" / "train list.txt").write_text("a.png\n")
    (tmp_path / "x.names").write_text("a\n")
    (tmp_path / "x.data").write_text("classes = 1\ntrain = my data/train list.txt\nnames = x.names\n")
    dc = read_data_file(tmp_path / "x.data")               # the list is checked when read
    with pytest.raises(DataError) as e:
        read_list(dc.train)
    assert str(e.value) == (f"{tmp_path / 'x.data'}:2 train: paths in .data files cannot contain spaces "
                            "(Darknet removes every space from a .data line, so 'my data/train list.txt' reads "
                            "as 'mydata/trainlist.txt', which does not exist); rename the file or folder without "
                            "spaces")
    (tmp_path / "x.data").write_text("classes = 1\nnames = my names.txt\n")
    with pytest.raises(DataError, match="x.data:2 names: paths in .data files cannot contain spaces"):
        read_data_file(tmp_path / "x.data")


# -- 5. partial weights and --upto ----------------------------------------------------------------------

def test_partial_layers_from_the_file_name():
    assert partial_layers("weights/yolov4-tiny.conv.29") == 29
    assert partial_layers("darknet53.conv.74") == 74
    assert partial_layers("backup/x_last.weights") is None and partial_layers("x.conv.0") is None


def _three_class_cfg(root: Path, shapes, lr: float = 0.0) -> tuple[str, str]:
    """The tiny detector for 3 classes (its head has 24 filters, not 27), learning rate `lr`."""
    cfg3, data3 = make_detector(root, shapes, max_batches=2, random=0)
    text = DET_CFG.format(max_batches=2, random=0).replace("filters=27", "filters=24").replace(
        "classes=4", "classes=3").replace("learning_rate=0.001", f"learning_rate={lr}")
    Path(cfg3).write_text(text)
    names = root / "three.names"
    names.write_text("a\nb\nc\n")
    lines = [ln for ln in Path(data3).read_text().splitlines() if not ln.startswith("names=")]
    Path(data3).write_text("\n".join(lines).replace("classes=4", "classes=3") + f"\nnames={names}\n")
    return cfg3, data3


def test_partial_and_upto_round_trip(tmp_path, shapes):
    cfg, data = make_detector(tmp_path / "src", shapes, max_batches=2, random=0)
    src = T.train(cfg, data=data, settings=Settings(), evaluate=False)
    source = load_network(cfg, weights=src.weights)
    assert source.seen == 4 and class_independent_layers(source) == 2
    out = tmp_path / "det.conv.2"
    r = invoke("partial", cfg, src.weights, out, 2)
    assert r.exit_code == 0, r.output
    assert f"wrote {out}: layers 0..1 of {src.weights}" in r.stdout
    blob = out.read_bytes()
    assert read_header(blob, str(out))[3] == 0                       # seen reset, as Darknet's partial
    assert len(blob) == expected_bytes(source, 2)
    # train a 3-class net from it (the name says conv.2): layers 0..1 are the source's
    cfg3, data3 = _three_class_cfg(tmp_path / "dst", shapes)
    r = invoke("train", cfg3, "--data", data3, "--weights", out, "--progress", "none")
    assert r.exit_code == 0, r.output
    assert f"Loaded layers 0..1 of {out}" in r.stdout and "iterations 1..2" in r.stdout
    trained = load_network(cfg3, weights=Path(data3).parent / "backup" / "det_final.weights")
    assert trained.seen == 4                                          # the count started at 0
    np.testing.assert_array_equal(trained.layers[0].weights.value, source.layers[0].weights.value)  # lr 0
    # --upto on the full 4-class file does the same
    r = invoke("train", cfg3, "--data", data3, "--weights", src.weights, "--upto", 2, "--progress", "none",
               "--backup", tmp_path / "upto")
    assert r.exit_code == 0, r.output
    upto = load_network(cfg3, weights=tmp_path / "upto" / "det_final.weights")
    np.testing.assert_array_equal(upto.layers[0].weights.value, source.layers[0].weights.value)
    assert upto.seen == 4


def test_weights_of_another_class_count_suggest_the_partial_commands(tmp_path, shapes):
    cfg, data = make_detector(tmp_path / "src", shapes, max_batches=1, random=0)
    src = T.train(cfg, data=data, settings=Settings(), evaluate=False)
    cfg3, data3 = _three_class_cfg(tmp_path / "dst", shapes)
    r = invoke("train", cfg3, "--data", data3, "--weights", src.weights, "--progress", "none")
    msg = one_line_error(r, "file is too long", "its first 2 layers fit")
    assert f"`darkpy train {cfg3} --data {data3} --weights {src.weights} --upto 2`" in msg
    assert f"`darkpy partial {cfg3} {src.weights} det_final.conv.2 2`" in msg
    # the suggested command works
    suggested = shlex.split(msg.split("`")[1])
    r = invoke(*suggested[1:], "--progress", "none")
    assert r.exit_code == 0, r.output


def test_partial_refuses_more_layers_than_the_network_has(tmp_path, shapes):
    cfg, data = make_detector(tmp_path, shapes, max_batches=1, random=0)
    src = T.train(cfg, data=data, settings=Settings(), evaluate=False)
    one_line_error(invoke("partial", cfg, src.weights, tmp_path / "x.conv.9", 9), "has 4 layers; N must be 1..4")
    one_line_error(invoke("train", cfg, "--data", data, "--weights", src.weights, "--upto", 9),
                   "--upto 9 (or a .conv.9 name) is more than the 4 layers")


def test_upto_needs_weights(tmp_path):
    p = make_classifier(tmp_path)
    r = invoke("train", p.cfg, "--data", p.data, "--upto", 3)
    assert r.exit_code == 2 and "--upto needs --weights" in r.output


# -- 6. Darknet's command forms ----------------------------------------------------------------------------

def test_translate_darknet_forms():
    assert translate("detector", "train", ["obj.data", "x.cfg", "y.conv.29", "-map", "-dont_show", "-gpus", "0"]) \
        == ["train", "x.cfg", "--data", "obj.data", "--weights", "y.conv.29", "--map"]
    assert translate("detector", "train", ["obj.data", "x.cfg", "w", "-clear"])[-1] == "--clear"
    assert translate("detector", "train", ["obj.data", "x.cfg", "-clear"]) == ["train", "x.cfg", "--data", "obj.data"]
    assert translate("detector", "test", ["o.data", "x.cfg", "w", "dog.jpg", "-thresh", "0.3", "-save_labels"]) \
        == ["detect", "x.cfg", "w", "dog.jpg", "--data", "o.data", "--save-labels", "--thresh", "0.3"]
    assert translate("detector", "test", ["o.data", "x.cfg", "w"]) == ["detect", "x.cfg", "w", "-", "--data",
                                                                        "o.data", "--no-draw"]
    assert translate("detector", "map", ["o.data", "x.cfg", "w", "-iou_thresh", "0.75", "-points", "101"]) \
        == ["map", "x.cfg", "w", "--data", "o.data", "--iou", "0.75"]
    assert translate("classifier", "train", ["c.data", "c.cfg"]) == ["train", "c.cfg", "--data", "c.data"]
    assert translate("classifier", "predict", ["c.data", "c.cfg", "w", "i.png", "-t", "3"]) \
        == ["predict", "c.cfg", "w", "i.png", "--data", "c.data", "--top", "3"]
    assert translate("classifier", "valid", ["c.data", "c.cfg", "w"]) == ["valid", "c.cfg", "w", "--data", "c.data"]
    with pytest.raises(DarknetUsage, match="unknown Darknet option -foo .*darkpy train --help"):
        translate("detector", "train", ["o.data", "x.cfg", "-foo"])
    with pytest.raises(DarknetUsage, match=r"usage: darkpy detector map DATA CFG WEIGHTS"):
        translate("detector", "map", ["o.data", "x.cfg"])
    with pytest.raises(DarknetUsage, match="no equivalent of `darknet detector calc_anchors`"):
        translate("detector", "calc_anchors", ["o.data"])


def test_detector_test_and_map_forms_run_the_darkpy_commands(tmp_path, monkeypatch):
    cfg, weights, data = _detector_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    r = invoke("detector", "test", data, cfg, weights, tmp_path / "images" / "im0.png")
    assert r.exit_code == 0, r.output
    assert f"note: `darkpy detector test` is Darknet's form; darkpy's own is `darkpy detect {cfg} {weights}" in r.stderr
    assert "dog: 100%" in r.stdout
    r = invoke("detector", "test", data, cfg, weights, "-dont_show", input=str(tmp_path / "images" / "im1.png") + "\n")
    assert r.exit_code == 0, r.output
    assert "im1.png: 1 object" in r.stdout and not (tmp_path / "im1_predictions.png").exists()
    r = invoke("detector", "map", data, cfg, weights)
    assert r.exit_code == 0, r.output
    assert "all-point    = 0.500000" in r.stdout
    r = invoke("detector", "valid", data, cfg, weights)
    assert r.exit_code == 0 and "measures the mAP on the valid list directly" in r.stderr
    r = invoke("detector", "demo", data, cfg, weights)
    one_line_error(r, "no equivalent of `darknet detector demo`")


def test_detector_train_form_with_map(tmp_path, shapes):
    cfg, data = make_detector(tmp_path, shapes, max_batches=2, random=0)
    r = invoke("detector", "train", data, cfg, "-map", "-dont_show")
    assert r.exit_code == 0, r.output
    assert f"darkpy's own is `darkpy train {cfg} --data {data} --map`" in r.stderr
    assert "Done: 2 iterations" in r.stdout and "mAP@0.5 of the final weights" in r.stdout
    px = np.asarray(Image.open(tmp_path / "backup" / "chart.png").convert("RGB")).astype(int)
    assert _red(px).sum() > 20, "the mAP point is drawn in red"


def test_classifier_forms(tmp_path):
    p = make_classifier(tmp_path)
    r = invoke("classifier", "train", p.data, p.cfg, "-clear")
    assert r.exit_code == 0, r.output
    px = np.asarray(Image.open(Path(p.backup) / "chart.png").convert("RGB")).astype(int)
    assert _red(px).sum() > 20, "the final top-1 accuracy is drawn in red"
    w = Path(p.backup) / "tiny_final.weights"
    img = read_list(p.valid_list)[0]
    r = invoke("classifier", "predict", p.data, p.cfg, w, img, "-t", 1)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"{img}:") and len(r.stdout.strip().splitlines()) == 2
    r = invoke("classifier", "valid", p.data, p.cfg, w)
    assert r.exit_code == 0 and "top-1 accuracy" in r.stdout


def test_darknet_order_given_to_darkpy_commands_says_what_to_type(tmp_path):
    r = invoke("train", "obj.data", "cfg/x.cfg", "yolov4-tiny.conv.29", "-map")
    one_line_error(r, "obj.data is a .data file; darkpy takes the network's cfg first: "
                      "`darkpy train cfg/x.cfg --data obj.data --weights yolov4-tiny.conv.29 --map`",
                   "`darkpy detector train obj.data cfg/x.cfg yolov4-tiny.conv.29 -map`")
    r = invoke("train", "obj.data")
    one_line_error(r, "obj.data is a .data file; darkpy takes the network's cfg first and the .data file with "
                      "--data: `darkpy train CFG --data obj.data ...`")
    r = invoke("train", "--data", "obj.data", "missing.cfg")         # an option's value is not the cfg
    one_line_error(r, "obj.data: no such .data file")
    r = invoke("map", "obj.data", "x.cfg", "x.weights")
    one_line_error(r, "`darkpy map x.cfg x.weights --data obj.data`")


# -- 7. detect on many images, --save-labels ------------------------------------------------------------

def test_detect_folder_list_and_stdin_with_json_and_labels(tmp_path):
    cfg, weights, data = _detector_files(tmp_path)
    images = sorted(str(p) for p in (tmp_path / "images").iterdir())
    (tmp_path / "some.txt").write_text(images[2] + "\n\n" + images[0] + "\n")
    out = tmp_path / "out"
    r = invoke("detect", cfg, weights, tmp_path / "images", tmp_path / "some.txt", "-", "--data", data,
               "--out", out, "--json", "--save-labels", input=images[1] + "\n")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert [x["image"] for x in res] == images + [images[2], images[0], images[1]]
    assert all(x["detections"][0]["name"] == "dog" for x in res)
    assert (out / "im0_predictions.png").is_file() and (out / "im0.txt").is_file()
    # the box (0.3, 0.35, 0.6, 0.8) cut to the image: y from 0 to 0.75
    assert (out / "im0.txt").read_text() == "1 0.300000 0.375000 0.600000 0.750000\n"
    assert res[0]["labels"] == str(out / "im0.txt")
    # without --out: beside each image; an existing label file is kept unless --force
    r = invoke("detect", cfg, weights, images[0], "--save-labels", "--no-draw")
    assert r.exit_code == 0, r.output
    beside = Path(images[0]).with_suffix(".txt")
    assert beside.read_text().startswith("1 0.300000") and not Path("im0_predictions.png").exists()
    r = invoke("detect", cfg, weights, images[0], "--save-labels", "--no-draw")
    one_line_error(r, f"{beside}: exists; --save-labels does not overwrite label files unless --force is given")
    r = invoke("detect", cfg, weights, images[0], "--save-labels", "--no-draw", "--force")
    assert r.exit_code == 0, r.output


def test_detect_empty_folder_is_an_error(tmp_path):
    cfg, weights, data = _detector_files(tmp_path)
    (tmp_path / "empty").mkdir()
    one_line_error(invoke("detect", cfg, weights, tmp_path / "empty"), "a folder with no images")


# -- 8. input-size hints -------------------------------------------------------------------------------

ROUTE_CFG = """\
[net]
width={w}
height={h}
channels=3

[convolutional]
filters=4
size=3
stride=2
pad=1
activation=leaky

[convolutional]
filters=4
size=3
stride=2
pad=1
activation=leaky

[upsample]
stride=2

[route]
layers=-1,-3

[convolutional]
filters=21
size=1
activation=linear

[yolo]
mask=0,1,2
anchors=8,8,16,16,24,24
classes=2
num=3
"""


def test_sizes_off_the_total_stride_get_the_sizes_that_work():
    network_from_text(ROUTE_CFG.format(w=96, h=100))                 # multiples of 4 build
    with pytest.raises(CfgError) as e, pytest.warns(CfgWarning, match="inputs have different sizes"):
        network_from_text(ROUTE_CFG.format(w=98, h=96))
    msg = str(e.value)
    assert msg.startswith("<cfg>:2 [net] width: width and height must be multiples of 4 for this network "
                          "(its strides multiply to 4); nearest: 96 or 100 (at 98x96, layer 4 [convolutional] fails")
    assert "\n" not in msg


def test_detector_at_a_size_that_builds_but_is_off_the_stride_warns():
    with pytest.warns(UserWarning, match=r"multiples of 4 .* nearest: 96 or 100; other sizes build"):
        network_from_text(DET_CFG.format(max_batches=1, random=0).replace("width=96", "width=98"))


def test_yolov4_tiny_at_100_and_150(tmp_path):
    from conftest import shared_path
    text = shared_path("cfg", "alexeyab", "yolov4-tiny-custom.cfg").read_text()
    cfg = tmp_path / "t.cfg"
    cfg.write_text(text.replace("width=416", "width=100").replace("height=416", "height=100"))
    problems = check_cfg(cfg)
    assert any("width and height must be multiples of 32 for this network (its strides multiply to 32); "
               "nearest: 96 or 128" in p for p in problems), problems
    cfg.write_text(text.replace("width=416", "width=150").replace("height=416", "height=150"))
    assert any("nearest: 128 or 160; other sizes build" in p for p in check_cfg(cfg))


# -- 10. the chart and the ETA ---------------------------------------------------------------------------

def _red(px):
    return (px[..., 0] > 190) & (px[..., 1] < 60) & (px[..., 2] < 60)


def _chart(tmp_path, metric=()):
    it = np.arange(1, 201)
    loss = 1 + 59 * np.exp(-it / 4.0)                  # 60 at the start, then about 1
    avg = np.empty_like(loss)
    a = -1.0
    for i, v in enumerate(loss):
        a = v if a < 0 else 0.9 * a + 0.1 * v
        avg[i] = a
    p = tmp_path / "chart.png"
    draw_loss_chart(p, it, loss, avg, 200, "t", metric=metric)
    with Image.open(p) as im:
        assert im.size == (W, H)
        return np.asarray(im.convert("RGB")).astype(int)


def test_chart_axes_log_loss_and_red_map_line(tmp_path):
    px = _chart(tmp_path)
    dark = px.sum(axis=2) < 100
    ph = H - TOP - BOTTOM
    assert dark[TOP:TOP + ph, LEFT].mean() > 0.95 and dark[TOP + ph, LEFT:W - RIGHT].mean() > 0.95   # the axes
    assert _red(px).sum() == 0, "no metric: nothing red"
    # the average-loss line after the first 40 iterations (values near 1..2) spans a real part of the
    # height: a linear axis up to 60 would squeeze it into a couple of pixels
    line = (np.abs(px - np.array(AVG_LINE)).sum(axis=2) < 60)
    x40 = int(LEFT + 40 / 200 * (W - LEFT - RIGHT))
    rows = np.flatnonzero(line[:, x40 + 3:W - RIGHT - 3].any(axis=1))
    assert rows.max() - rows.min() > 0.1 * ph
    px = _chart(tmp_path, metric=[(50, 0.2), (100, 0.5), (150, 0.6), (200, 0.75)])
    red = _red(px)
    assert red.sum() > 200
    # the line reaches 75 % of the height at the right end
    cols = red[:, W - RIGHT - 6:W - RIGHT - 1]
    y = np.flatnonzero(cols.any(axis=1)).mean()
    assert abs((TOP + ph - y) / ph - 0.75) < 0.03


def test_line_progress_has_the_time_left():
    out = io.StringIO()
    pr = Progress("lines", stream=out)
    pr.begin(0, 10)
    pr.iteration(Record(1, 0.1, 2.0, 2.0, 0.1, 0.001, 0.5, 8))
    pr.iteration(Record(2, 0.2, 2.0, 2.0, 0.1, 0.001, 0.5, 16))
    first, line = out.getvalue().strip().splitlines()
    assert first.endswith(", --:-- left")           # unknown until a second iteration is done
    parsed = parse_line(first)
    assert parsed["iteration"] == 1 and parsed["images"] == 8 and np.isnan(parsed["eta"])
    assert line.endswith(" left") and ", 16 images, " in line
    parsed = parse_line(line)
    assert parsed["iteration"] == 2 and parsed["images"] == 16 and parsed["eta"] >= 0
    assert parse_line("3, 0.100: 1.0, 1.0 avg, 0.1 rate, 0.2 seconds, 24 images")["images"] == 24
