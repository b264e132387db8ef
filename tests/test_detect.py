"""detect.py: NMS and mAP on hand-made boxes with hand-computed values, the detect pipeline on a
network whose predictions are set by hand, drawing, and `evaluate_map` on a tiny dataset on disk."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from PIL import Image

from darkpy import detect
from darkpy.detect import Boxes, compute_map, do_nms_sort, interpolated_ap
from darkpy.network import network_from_text


def boxes(rows, probs, obj=None):
    rows = np.array(rows, np.float64)
    probs = np.array(probs, np.float64)
    obj = np.ones(len(rows)) if obj is None else np.array(obj, np.float64)
    return Boxes(rows, obj, probs)


# -- NMS -----------------------------------------------------------------------------------------------

def test_nms_sort_per_class_and_objectness():
    dets = boxes([(0.5, 0.5, 0.4, 0.4), (0.52, 0.5, 0.4, 0.4), (0.1, 0.1, 0.1, 0.1), (0.5, 0.5, 0.4, 0.4)],
                 [(0.9, 0.0), (0.8, 0.7), (0.6, 0.0), (0.95, 0.95)], obj=[1, 1, 1, 0])
    out = do_nms_sort(dets, 0.45)
    assert len(out) == 3                                   # objectness 0: dropped, as Darknet
    # IoU(A, B) = 0.152 / 0.168 = 0.905: B loses class 0 to A but keeps class 1 (A has none)
    np.testing.assert_allclose(out.probs, [(0.9, 0.0), (0.0, 0.7), (0.6, 0.0)])


def test_nms_suppressed_box_suppresses_nothing():
    """A > B > C > D in score; A overlaps B, B overlaps C, C overlaps D, A does not overlap C: B is
    suppressed by A, so C survives (B no longer counts) and suppresses D."""
    rows = [(0.20, 0.5, 0.2, 0.2), (0.30, 0.5, 0.2, 0.2), (0.40, 0.5, 0.2, 0.2), (0.50, 0.5, 0.2, 0.2)]
    out = do_nms_sort(boxes(rows, [(0.9,), (0.8,), (0.7,), (0.6,)]), 0.3)   # neighbours: IoU 1/3
    np.testing.assert_allclose(out.probs[:, 0], [0.9, 0.0, 0.7, 0.0])


def test_nms_threshold_is_strict_and_ties_keep_the_first():
    a = (0.3, 0.5, 0.4, 0.4)
    b = (0.5, 0.5, 0.4, 0.4)                               # IoU(a, b) = 0.08 / 0.24 = 1/3
    out = do_nms_sort(boxes([a, b], [(0.5,), (0.5,)]), 1 / 3 + 1e-9)
    np.testing.assert_allclose(out.probs[:, 0], [0.5, 0.5])
    out = do_nms_sort(boxes([a, b], [(0.5,), (0.5,)]), 0.3)
    np.testing.assert_allclose(out.probs[:, 0], [0.5, 0.0])


def test_diou_nms_keeps_boxes_with_distant_centres():
    a, b = (0.3, 0.5, 0.4, 0.4), (0.5, 0.5, 0.4, 0.4)
    # DIoU score = 1/3 - (0.04 / 0.52)^0.6 = 0.119 < 0.3: kept, where plain NMS suppresses
    out = do_nms_sort(boxes([a, b], [(0.9,), (0.8,)]), 0.3, "diounms", 0.6)
    np.testing.assert_allclose(out.probs[:, 0], [0.9, 0.8])


# -- AP / mAP ------------------------------------------------------------------------------------------

def test_interpolated_ap_hand_computed():
    # ranked: TP FP TP FP TP over 3 truths
    precision = np.array([1, 1 / 2, 2 / 3, 1 / 2, 3 / 5])
    recall = np.array([1, 1, 2, 2, 3]) / 3
    assert interpolated_ap(precision, recall, 11) == pytest.approx((4 * 1 + 3 * 2 / 3 + 4 * 0.6) / 11)
    assert interpolated_ap(precision, recall, 0) == pytest.approx((1 + 2 / 3 + 0.6) / 3)
    assert interpolated_ap(precision, recall, 101) == pytest.approx((34 * 1 + 33 * 2 / 3 + 34 * 0.6) / 101)
    assert interpolated_ap(np.array([1.0]), np.array([1.0]), 11) == 1.0
    assert interpolated_ap(np.zeros(0), np.zeros(0), 0) == 0.0


def map_case():
    truths = [np.array([(0.2, 0.2, 0.2, 0.2, 0), (0.7, 0.7, 0.2, 0.2, 0), (0.5, 0.5, 0.2, 0.2, 2)]),
              np.array([(0.5, 0.5, 0.3, 0.3, 0)])]
    d0 = boxes([(0.2, 0.2, 0.2, 0.2), (0.45, 0.2, 0.2, 0.2), (0.21, 0.2, 0.2, 0.2), (0.7, 0.7, 0.2, 0.2),
                (0.9, 0.1, 0.1, 0.1)],
               [(0.9, 0, 0), (0.8, 0, 0), (0.6, 0, 0), (0.5, 0, 0), (0, 0.3, 0)])
    d1 = boxes([(0.5, 0.5, 0.3, 0.33)], [(0.7, 0, 0)])
    return [d0, d1], truths


def test_compute_map_hand_computed():
    dets, truths = map_case()
    r = compute_map(dets, truths, 3, 0.5, 0.25, names=["a", "b", "c"])
    c0, c1, c2 = r.classes
    # class 0 ranked: .9 TP, .8 FP (no overlap), .7 TP (other image), .6 FP (duplicate), .5 TP
    assert (c0.truths, c0.tp, c0.fp) == (3, 3, 2)
    assert c0.ap11 == pytest.approx(8.4 / 11)
    assert c0.ap_all == pytest.approx((1 + 2 / 3 + 0.6) / 3)
    assert c0.ap101 == pytest.approx(76.4 / 101)
    assert (c1.truths, c1.fp) == (0, 1)                   # no truths: left out of the mean
    assert (c2.truths, c2.tp, c2.ap_all) == (1, 0, 0.0)   # never detected
    assert r.map11 == pytest.approx(8.4 / 11 / 2)
    assert r.map_all == pytest.approx((1 + 2 / 3 + 0.6) / 6)
    assert r.map101 == pytest.approx(76.4 / 101 / 2)
    # at conf .25: TP 3 (d1 has IoU 0.09/0.099), FP 2 + the class-1 box, FN 4 - 3
    assert (r.tp, r.fp, r.fn) == (3, 3, 1)
    assert r.precision == pytest.approx(0.5) and r.recall == pytest.approx(0.75)
    assert r.f1 == pytest.approx(2 * 0.5 * 0.75 / 1.25)
    assert r.avg_iou == pytest.approx((1 + 0.09 / 0.099 + 1) / 3)
    text = r.format()
    assert "n/a" in text and "VOC 11-point" in text and "COCO 101-point" in text


def test_compute_map_iou_threshold_and_conf_threshold():
    dets, truths = map_case()
    r = compute_map(dets, truths, 3, iou_thresh=0.95, conf_thresh=0.75)
    assert r.classes[0].tp == 2                           # the 0.909-IoU box no longer counts
    assert (r.tp, r.fp) == (1, 1)                         # only the .9 and .8 boxes are above .75


# -- the detect pipeline on a hand-set yolo head ------------------------------------------------------

ANCH = "2,2, 3,4, 6,5"


def head_net():
    cfg = f"[net]\nwidth=4\nheight=4\nchannels=21\n\n[yolo]\nmask=0,1,2\nanchors={ANCH}\nclasses=2\nnum=3\n"
    return network_from_text(cfg, batch=1)


def logits_for(slots):
    """A (21, 4, 4) head input: every objectness at -8, except `slots` {(anchor, row, col): (box, cls)}."""
    z = np.full((3, 7, 4, 4), -8.0)
    z[:, 2:4] = 0.0
    anchors = [(2, 2), (3, 4), (6, 5)]
    for (a, j, i), ((x, y, w, h), cls) in slots.items():
        fx, fy = x * 4 - i, y * 4 - j
        z[a, 0, j, i], z[a, 1, j, i] = math.log(fx / (1 - fx)), math.log(fy / (1 - fy))
        z[a, 2, j, i], z[a, 3, j, i] = math.log(w * 4 / anchors[a][0]), math.log(h * 4 / anchors[a][1])
        z[a, 4, j, i] = 8.0
        z[a, 5 + cls, j, i] = 8.0
    return z.reshape(21, 4, 4).astype(np.float32)


def test_detect_image_decodes_and_suppresses():
    net = head_net()
    z = logits_for({(1, 1, 1): ((0.30, 0.35, 0.6, 0.8), 1), (1, 1, 2): ((0.52, 0.36, 0.6, 0.8), 1),
                    (2, 3, 3): ((0.9, 0.9, 1.2, 1.0), 0)})
    dets = detect.detect_image(net, z, thresh=0.25, nms=0.45)
    assert [(d.class_id) for d in dets] == [1, 0]         # the overlapping class-1 pair became one box
    d = dets[0]
    assert (d.x, d.y, d.w, d.h) == pytest.approx((0.30, 0.35, 0.6, 0.8), abs=1e-5)
    assert d.confidence == pytest.approx(1 / (1 + math.exp(-8)) ** 2, rel=1e-5)
    assert detect.detect_image(net, z, thresh=0.25, nms=0) and len(detect.detect_image(net, z, nms=0)) == 3
    js = d.as_dict(["cat", "dog"], 40, 20)
    assert js["name"] == "dog" and js["pixels"] == {"left": 0, "top": 0, "right": 24, "bottom": 15}


def test_draw_detections_draws_box_and_label():
    img = np.zeros((3, 120, 200), np.float32)
    det = detect.Detection(0.5, 0.5, 0.5, 0.5, 1, 0.9, 0.95, np.array([0.0, 0.9]))
    out = detect.draw_detections(img, [det], ["cat", "dog"])
    color = detect.class_color(1, 2)
    for row, col in ((80, 50), (80, 150), (90, 100)):     # left, right and bottom edges
        np.testing.assert_allclose(out[:, row, col], color)
    assert not out[:, 60, 100].any()                     # inside the box: untouched
    assert out[:, :30, 50:120].any()                     # the label tag sits above the box
    assert not out[:, 100:].any()                        # nothing below it
    assert not img.any()                                 # the input is not modified


# -- evaluate_map on a dataset written to disk ----------------------------------------------------------

def test_evaluate_map_on_files(tmp_path):
    """A 1x1 conv turns a bright block of the image into one confident 'dog' box at cell (1, 1); the
    label files decide what that box is worth."""
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    hit = "1 0.300000 0.350000 0.600000 0.800000\n"
    labels = [hit, hit + "0 0.9 0.9 0.1 0.1\n", "0 0.5 0.5 0.2 0.2\n"]
    paths = []
    for k, lab in enumerate(labels):
        p = tmp_path / "images" / f"im{k}.png"
        pixels = np.zeros((16, 16, 3), np.uint8)
        pixels[4:8, 4:8, 0] = 255                 # cell (1, 1) of the 4x4 net input after resizing
        Image.fromarray(pixels).save(p)
        (tmp_path / "labels" / f"im{k}.txt").write_text(lab)
        paths.append(str(p))
    (tmp_path / "valid.list").write_text("\n".join(paths) + "\n")
    (tmp_path / "t.names").write_text("cat\ndog\n")
    data = tmp_path / "t.data"
    data.write_text(f"classes=2\nvalid={tmp_path / 'valid.list'}\nnames={tmp_path / 't.names'}\n")
    cfg = ("[net]\nwidth=4\nheight=4\nchannels=3\nbatch=2\n\n[convolutional]\nfilters=21\nsize=1\nstride=1\n"
           f"activation=linear\n\n[yolo]\nmask=0,1,2\nanchors={ANCH}\nclasses=2\nnum=3\n")
    net = network_from_text(cfg)
    conv = net.layers[0]
    bias = logits_for({(1, 1, 1): ((0.30, 0.35, 0.6, 0.8), 1)}).reshape(21, 16)[:, 5].copy()
    bias[11] = -8.0                               # anchor 1's objectness: 16·red - 8
    conv.biases.value[...] = bias
    conv.weights.value[...] = 0
    conv.weights.value[11, 0, 0, 0] = 16.0
    calls = []
    r = detect.evaluate_map(net, data, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(2, 3), (3, 3)] and net.batch == 2
    # the one box (dog) is right in images 0 and 1 (TP), wrong in image 2 (FP); no cat is found
    assert (r.classes[1].tp, r.classes[1].fp, r.classes[1].truths) == (2, 1, 2)
    assert r.classes[1].ap_all == pytest.approx(1.0)      # ranked TP TP FP (equal scores keep file order)
    assert r.classes[0].truths == 2 and r.classes[0].ap_all == 0
    assert r.map_all == pytest.approx(0.5)
    assert (r.tp, r.fp, r.fn) == (2, 1, 2)
    assert r.avg_iou == pytest.approx(1.0, abs=1e-4)


# -- the commands ----------------------------------------------------------------------------------------

def _detector_files(tmp_path):
    """cfg + weights of the bright-block detector above, images and a .data file."""
    test_evaluate_map_on_files(tmp_path)        # writes images/, labels/, valid.list, t.names, t.data
    cfg = tmp_path / "t.cfg"
    cfg.write_text("[net]\nwidth=4\nheight=4\nchannels=3\n\n[convolutional]\nfilters=21\nsize=1\nstride=1\n"
                   f"activation=linear\n\n[yolo]\nmask=0,1,2\nanchors={ANCH}\nclasses=2\nnum=3\n")
    net = network_from_text(cfg.read_text())
    conv = net.layers[0]
    bias = logits_for({(1, 1, 1): ((0.30, 0.35, 0.6, 0.8), 1)}).reshape(21, 16)[:, 5].copy()
    bias[11] = -8.0
    conv.biases.value[...] = bias
    conv.weights.value[...] = 0
    conv.weights.value[11, 0, 0, 0] = 16.0
    net.save_weights(tmp_path / "t.weights")
    return cfg, tmp_path / "t.weights", tmp_path / "t.data"


def _group():
    import click

    from darkpy.cli_detect import register

    @click.group()
    def g():
        """test group"""

    register(g)
    return g


def test_detect_command_prints_draws_and_json(tmp_path):
    from click.testing import CliRunner

    cfg, weights, data = _detector_files(tmp_path)
    image = tmp_path / "images" / "im0.png"
    out = tmp_path / "out"
    r = CliRunner().invoke(_group(), ["detect", str(cfg), str(weights), str(image), "--data", str(data),
                                      "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "1 object" in r.output and "dog: 100%" in r.output
    assert "(0, 0, 9, 12)" in r.output                  # 16x16 image: (0.3 ± 0.3)·16, (0.35 ± 0.4)·16
    drawn = np.asarray(Image.open(out / "im0_predictions.png"))
    assert drawn.shape == (16, 16, 3) and (drawn[12, 0:9] != 0).any()
    r = CliRunner().invoke(_group(), ["detect", str(cfg), str(weights), str(image), "--data", str(data),
                                      "--out", str(out), "--json"])
    res = json.loads(r.output)
    assert res[0]["detections"][0]["name"] == "dog" and res[0]["detections"][0]["confidence"] > 0.99


def test_map_command(tmp_path):
    from click.testing import CliRunner

    cfg, weights, data = _detector_files(tmp_path)
    r = CliRunner().invoke(_group(), ["map", str(cfg), str(weights), "--data", str(data), "--batch", "2"])
    assert r.exit_code == 0, r.output
    assert "all-point    = 0.500000" in r.output and "TP = 2, FP = 1, FN = 2" in r.output
    r = CliRunner().invoke(_group(), ["map", str(cfg), str(weights), "--data", str(data), "--json"])
    assert json.loads(r.output)["map_all"] == pytest.approx(0.5)
