"""`darkpy valid` on a detector (COCO JSON for pycocotools, VOC comp4 files), `darkpy recall`, and
`darkpy map --metric/--iou`, on the hand-set bright-block detector of test_detect.py."""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner

from darkpy.cli import main
from darkpy.detect import Boxes, ValidRun
from darkpy.results import coco_image_id, coco_results, nms_objectness, write_voc_results

from test_detect import _detector_files


def _json_out(r):
    """The JSON document in a command's output (a compile notice may come before it)."""
    text = r.output
    return json.loads(text[min(i for i in (text.find("{"), text.find("[")) if i >= 0):])


def test_coco_image_ids():
    assert coco_image_id("x/COCO_val2014_000000000042.jpg", 7) == 42
    assert coco_image_id("000123.png", 7) == 123
    assert coco_image_id("im.png", 7) == 7


def _run(names=None):
    dets = Boxes(np.array([[0.5, 0.5, 0.5, 0.5], [0.95, 0.5, 0.2, 0.2]]), np.array([0.9, 0.8]),
                 np.array([[0.9, 0.0], [0.0, 0.8]]))
    return ValidRun(["a/000005.jpg"], [(100, 50)], [dets], [np.zeros((0, 5))], [np.zeros(0, bool)], 2, names)


def test_coco_results_format_and_clipping():
    e = coco_results(_run())
    assert e[0] == {"image_id": 5, "category_id": 0, "bbox": [25.0, 12.5, 50.0, 25.0], "score": 0.9}
    assert e[1]["bbox"] == [85.0, 20.0, 15.0, 10.0]         # right edge 105 clipped to the width 100
    names = ["person"] + [f"c{i}" for i in range(78)] + ["toothbrush"]
    run = _run(names)
    run.classes = 80
    run.detections[0].probs = np.zeros((2, 80))
    run.detections[0].probs[0, 79] = 0.5
    assert coco_results(run)[0]["category_id"] == 90       # COCO's 91-id numbering


def test_voc_files(tmp_path):
    paths = write_voc_results(_run(["cat", "dog"]), str(tmp_path))
    assert [p.split("/")[-1] for p in paths] == ["comp4_det_test_cat.txt", "comp4_det_test_dog.txt"]
    cat = (tmp_path / "comp4_det_test_cat.txt").read_text().split()
    assert cat == ["000005", "0.900000", "26.000000", "13.500000", "76.000000", "38.500000"]
    dog = (tmp_path / "comp4_det_test_dog.txt").read_text().split()
    assert dog[4] == "100.000000"                         # xmax clipped to w (Darknet, 1-based)


def test_nms_objectness_is_class_agnostic():
    boxes = np.array([[0.5, 0.5, 0.2, 0.2], [0.51, 0.5, 0.2, 0.2], [0.1, 0.1, 0.1, 0.1]])
    obj = nms_objectness(boxes, np.array([0.5, 0.9, 0.3]), 0.4)
    assert obj.tolist() == [0.0, 0.9, 0.3]


def test_valid_writes_results_that_pycocotools_loads(tmp_path, monkeypatch):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    cfg, weights, data = _detector_files(tmp_path)
    out = tmp_path / "res"
    data.write_text(data.read_text() + f"results={out}\n")
    r = CliRunner().invoke(main, ["valid", str(cfg), str(weights), "--data", str(data)])
    assert r.exit_code == 0, r.output
    entries = json.loads((out / "coco_results.json").read_text())
    assert {e["image_id"] for e in entries} == {0, 1, 2} and all(len(e["bbox"]) == 4 for e in entries)
    dog = (out / "comp4_det_test_dog.txt").read_text().splitlines()
    assert len(dog) == 3 and dog[0].startswith("im0 ")
    # a COCO ground truth built from the label files: the results load and evaluate
    dog = (1, 0.3, 0.35, 0.6, 0.8)
    labels = [[dog], [dog, (0, 0.9, 0.9, 0.1, 0.1)], [(0, 0.5, 0.5, 0.2, 0.2)]]
    anns = []
    for k, lab in enumerate(labels):
        for c, x, y, w, h in lab:
            anns.append({"id": len(anns) + 1, "image_id": k, "category_id": c, "iscrowd": 0, "area": w * h * 256,
                         "bbox": [(x - w / 2) * 16, (y - h / 2) * 16, w * 16, h * 16]})
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {"images": [{"id": k} for k in range(3)], "annotations": anns,
                      "categories": [{"id": 0, "name": "cat"}, {"id": 1, "name": "dog"}]}
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(str(out / "coco_results.json")), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    r = CliRunner().invoke(main, ["map", str(cfg), str(weights), "--data", str(data), "--metric", "coco", "--json"])
    assert r.exit_code == 0, r.output
    mine = _json_out(r)["coco"]
    for i, key in enumerate(("AP", "AP50", "AP75")):
        assert mine[key] == pytest.approx(ev.stats[i], abs=1e-4), key


def test_map_several_ious_and_voc(tmp_path):
    cfg, weights, data = _detector_files(tmp_path)
    r = CliRunner().invoke(main, ["map", str(cfg), str(weights), "--data", str(data), "--iou", "0.5",
                                  "--iou", "0.99", "--json"])
    assert r.exit_code == 0, r.output
    res = _json_out(r)
    assert [x["iou_thresh"] for x in res] == [0.5, 0.99]
    assert res[0]["map_all"] == pytest.approx(0.5) and res[1]["map_all"] <= res[0]["map_all"]
    r = CliRunner().invoke(main, ["map", str(cfg), str(weights), "--data", str(data), "--metric", "voc"])
    assert r.exit_code == 0 and "voc rules" in r.output


def test_recall_report(tmp_path):
    cfg, weights, data = _detector_files(tmp_path)
    r = CliRunner().invoke(main, ["recall", str(cfg), str(weights), "--data", str(data)])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if "RPs/Img" in ln]
    assert len(lines) == 3
    assert lines[-1].split()[:3] == ["2", "2", "4"]        # 2 of the 4 truths found (the dog boxes)
    r = CliRunner().invoke(main, ["recall", str(cfg), str(weights), "--data", str(data), "--json"])
    assert _json_out(r)["recall"] == pytest.approx(0.5)


def test_difficult_list_from_the_data_file(tmp_path):
    """Darknet's `difficult=` list (parallel to valid): a detection on a difficult truth leaves the
    ranking (darknet), is neither TP nor FP (voc), and the difficult box is no truth to find."""
    cfg, weights, data = _detector_files(tmp_path)
    dif = tmp_path / "dif"
    (dif / "labels").mkdir(parents=True)
    (dif / "labels" / "im2.txt").write_text("1 0.300000 0.350000 0.600000 0.800000\n")
    paths = [str(dif / "images" / f"im{k}.png") for k in range(3)]
    (tmp_path / "dif.list").write_text("\n".join(paths) + "\n")
    data.write_text(data.read_text() + f"difficult={tmp_path / 'dif.list'}\n")
    for metric in ("darknet", "voc"):
        r = CliRunner().invoke(main, ["map", str(cfg), str(weights), "--data", str(data), "--metric", metric,
                                      "--json"])
        assert r.exit_code == 0, r.output
        dog = _json_out(r)["classes"][1]
        assert (dog["truths"], dog["tp"], dog["fp"]) == (2, 2, 0), metric
    (tmp_path / "dif.list").write_text(paths[0] + "\n")
    r = CliRunner().invoke(main, ["map", str(cfg), str(weights), "--data", str(data)])
    assert r.exit_code != 0 and "difficult" in r.output
