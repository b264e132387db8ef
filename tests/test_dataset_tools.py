"""`darkpy anchors` (seeded k-means with 1 - IoU) and `darkpy labels from-coco|from-voc` (toy datasets
generated here, converted, then trained for a few iterations)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import shapes_generator
from PIL import Image

from darkpy.anchors import average_iou, calc_anchors, kmeans_iou, read_label_sizes
from darkpy.cfg import load_cfg
from darkpy.cli import main
from darkpy.datasets import label_path_for, read_box_labels, read_data_file

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    train, valid = shapes_generator().generate(out, n=40, size=128, seed=1, valid_fraction=0.1)
    data = out / "s.data"
    data.write_text(f"classes=4\ntrain={train}\nvalid={valid}\nnames={ROOT / 'data' / 'shapes.names'}\n")
    return out, train, data


def test_kmeans_finds_planted_clusters():
    rng = np.random.default_rng(0)
    truth = np.array([[10, 10], [40, 20], [20, 60]], float)
    boxes = np.concatenate([c * rng.uniform(0.95, 1.05, (50, 2)) for c in truth])
    c = kmeans_iou(boxes, 3, seed=0)
    c = c[np.argsort(c[:, 0] * c[:, 1])]
    np.testing.assert_allclose(c, truth[[0, 1, 2]][np.argsort(truth.prod(1))], rtol=0.05)
    assert average_iou(boxes, c) > 0.9


def test_anchors_beat_the_cfg_and_repeat_with_the_seed(shapes, tmp_path):
    _, train, data = shapes
    cfg = load_cfg(ROOT / "cfg" / "shapes-tiny.cfg")
    width, height = cfg.net.get_int("width"), cfg.net.get_int("height")
    own = np.array(cfg.layers[-1].get_float_list("anchors")).reshape(-1, 2)
    boxes, counts = read_label_sizes(str(train), width, height, 4)
    a = calc_anchors(str(train), len(own), width, height, 4, seed=5)
    b = calc_anchors(str(train), len(own), width, height, 4, seed=5)
    assert np.array_equal(a.anchors, b.anchors)
    assert a.avg_iou > average_iou(boxes, own)
    assert sum(a.counters_per_class) == len(boxes) == a.boxes and counts == a.counters_per_class
    # the command: same numbers, and --write edits every [yolo] keeping the rest of the file
    target = tmp_path / "t.cfg"
    target.write_text((ROOT / "cfg" / "shapes-tiny.cfg").read_text())
    r = CliRunner().invoke(main, ["anchors", str(data), "--num", "6", "--seed", "5", "--write", str(target)])
    assert r.exit_code == 0, r.output
    assert f"anchors = {a.anchors_text()}" in r.output and "counters_per_class = " in r.output
    new = load_cfg(target)
    for s in new.layers:
        if s.kind == "yolo":
            assert np.array_equal(np.array(s.get_float_list("anchors")).reshape(-1, 2), a.anchors)
    before = (ROOT / "cfg" / "shapes-tiny.cfg").read_text().splitlines()
    after = target.read_text().splitlines()
    assert len(before) == len(after) and sum(x != y for x, y in zip(before, after)) == 2
    r = CliRunner().invoke(main, ["anchors", str(data), "--num", "5", "--write", str(target)])
    assert r.exit_code != 0 and "num=6" in r.output


# -- converters ------------------------------------------------------------------------------------------

def _toy_images(folder: Path, n: int, rng) -> list[tuple[str, int, int, list]]:
    """n images with 1-2 filled rectangles; returns (file, w, h, [(cls, x0, y0, x1, y1)]) in pixels."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(n):
        w, h = 64, 48
        img = np.zeros((h, w, 3), np.uint8)
        objs = []
        for _ in range(int(rng.integers(1, 3))):
            c = int(rng.integers(0, 2))
            x0, y0 = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
            x1, y1 = x0 + int(rng.integers(8, 20)), y0 + int(rng.integers(8, 20))
            img[y0:y1, x0:x1, c] = 255
            objs.append((c, x0, y0, x1, y1))
        name = f"img{k:03d}.png"
        Image.fromarray(img).save(folder / name)
        out.append((name, w, h, objs))
    return out


TINY_CFG = """[net]
batch=2
subdivisions=1
width=32
height=32
channels=3
learning_rate=0.001
max_batches=3

[convolutional]
filters=14
size=1
stride=4
activation=linear

[yolo]
mask=0,1
anchors=8,8,16,16
classes=2
num=2
"""


def _train_a_little(data: Path, tmp_path: Path):
    from darkpy.settings import Settings
    from darkpy.train import train
    cfg = tmp_path / "tiny.cfg"
    cfg.write_text(TINY_CFG)
    r = train(str(cfg), data=str(data), max_batches=3, backup=str(tmp_path / "backup"), settings=Settings(),
              evaluate=False)
    assert r.loss is not None and np.isfinite(r.loss)


def test_from_coco_converts_reports_and_trains(tmp_path):
    rng = np.random.default_rng(0)
    imgs = _toy_images(tmp_path / "src", 6, rng)
    anns, images = [], []
    for k, (name, w, h, objs) in enumerate(imgs):
        images.append({"id": 100 + k, "file_name": name, "width": w, "height": h})
        for c, x0, y0, x1, y1 in objs:
            anns.append({"id": len(anns) + 1, "image_id": 100 + k, "category_id": [3, 7][c], "iscrowd": 0,
                         "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0)})
    good = len(anns)
    anns += [{"id": 901, "image_id": 100, "category_id": 3, "iscrowd": 0, "bbox": [5, 5, 0, 4]},
             {"id": 902, "image_id": 100, "category_id": 3, "iscrowd": 0, "bbox": [70, 60, 5, 5]},
             {"id": 903, "image_id": 100, "category_id": 99, "iscrowd": 0, "bbox": [5, 5, 4, 4]},
             {"id": 904, "image_id": 100, "category_id": 7, "iscrowd": 1, "bbox": [5, 5, 4, 4]},
             {"id": 905, "image_id": 101, "category_id": 7, "iscrowd": 0, "bbox": [60, 40, 10, 10]}]   # clipped
    ann_file = tmp_path / "instances.json"
    ann_file.write_text(json.dumps({"images": images, "annotations": anns,
                                    "categories": [{"id": 7, "name": "green"}, {"id": 3, "name": "red"}]}))
    out = tmp_path / "yolo"
    r = CliRunner().invoke(main, ["labels", "from-coco", str(ann_file), "--images", str(tmp_path / "src"),
                                  "--out", str(out), "--valid-fraction", "0.34", "--name", "toy"])
    assert r.exit_code == 0, r.output
    for reason in ("zero size", "outside the image", "unknown class", "crowd region"):
        assert reason in r.output
    assert "skipped 4 boxes" in r.output
    dc = read_data_file(out / "toy.data")
    assert dc.names == ["red", "green"] and dc.classes == 2
    train = (out / "train.txt").read_text().split()
    valid = (out / "valid.txt").read_text().split()
    assert (len(train), len(valid)) == (4, 2) and not set(train) & set(valid)
    boxes, bad = read_box_labels(str(out / "labels" / "img000.txt"), 2)
    name, w, h, objs = imgs[0]
    assert not bad and len(boxes) == len(objs)
    c, x0, y0, x1, y1 = objs[0]
    np.testing.assert_allclose(boxes[0], [(x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h, c],
                               atol=1e-5)
    clipped = read_box_labels(str(out / "labels" / "img001.txt"), 2)[0][-1]
    assert clipped[0] + clipped[2] / 2 == pytest.approx(1.0, abs=1e-5)
    assert sum(len(read_box_labels(str(p), 2)[0]) for p in (out / "labels").glob("*.txt")) == good + 1
    _train_a_little(out / "toy.data", tmp_path)


def test_from_voc_converts_reports_and_trains(tmp_path):
    rng = np.random.default_rng(1)
    imgs = _toy_images(tmp_path / "JPEGImages", 5, rng)
    ann = tmp_path / "Annotations"
    ann.mkdir()
    names = ["red", "green"]
    for k, (name, w, h, objs) in enumerate(imgs):
        objects = "".join(f"<object><name>{names[c]}</name><difficult>0</difficult><bndbox><xmin>{x0 + 1}</xmin>"
                          f"<ymin>{y0 + 1}</ymin><xmax>{x1 + 1}</xmax><ymax>{y1 + 1}</ymax></bndbox></object>"
                          for c, x0, y0, x1, y1 in objs)
        if k == 0:
            objects += ("<object><name>red</name><difficult>1</difficult><bndbox><xmin>2</xmin><ymin>2</ymin>"
                        "<xmax>9</xmax><ymax>9</ymax></bndbox></object>"
                        "<object><name>cow</name><difficult>0</difficult><bndbox><xmin>2</xmin><ymin>2</ymin>"
                        "<xmax>9</xmax><ymax>9</ymax></bndbox></object>")
        (ann / f"img{k:03d}.xml").write_text(f"<annotation><filename>{name}</filename><size><width>{w}</width>"
                                             f"<height>{h}</height><depth>3</depth></size>{objects}</annotation>")
    out = tmp_path / "yolo"
    r = CliRunner().invoke(main, ["labels", "from-voc", str(ann), "--images", str(tmp_path / "JPEGImages"),
                                  "--out", str(out), "--classes", "red,green"])
    assert r.exit_code == 0, r.output
    assert "difficult" in r.output and "unknown class" in r.output and "skipped 2 boxes" in r.output
    boxes = read_box_labels(str(out / "labels" / "img002.txt"), 2)[0]
    name, w, h, objs = imgs[2]
    c, x0, y0, x1, y1 = objs[0]
    np.testing.assert_allclose(boxes[0], [(x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h, c],
                               atol=1e-5)
    # the difficult object: Darknet's layout, a list parallel to valid.txt that `map` reads
    dc = read_data_file(out / "dataset.data")
    assert dc.raw["difficult"].endswith("difficult.txt")
    listed = (out / "difficult.txt").read_text().split()
    assert len(listed) == len((out / "valid.txt").read_text().split())
    hard = read_box_labels(str(out / "difficult" / "labels" / "img000.txt"), 2)[0]
    np.testing.assert_allclose(hard[0], [(1 + 8) / 2 / 64, (1 + 8) / 2 / 48, 7 / 64, 7 / 48, 0], atol=1e-5)
    _train_a_little(out / "dataset.data", tmp_path)


def _coco_doc(entries):
    """entries: (file_name, w, h, [(cls, x0, y0, x1, y1)]) -> COCO instances dict (ids from 1)."""
    images, anns = [], []
    for k, (name, w, h, objs) in enumerate(entries, 1):
        images.append({"id": k, "file_name": name, "width": w, "height": h})
        anns += [{"id": len(anns) + 1, "image_id": k, "category_id": c + 1, "iscrowd": 0,
                  "bbox": [x0, y0, x1 - x0, y1 - y0]} for c, x0, y0, x1, y1 in objs]
    return {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "red"}, {"id": 2, "name": "green"}]}


def test_from_coco_keeps_sub_folders_of_images_sharing_a_basename(tmp_path):
    """COCO file_names a/img000.png and b/img000.png: both kept, as images/a/... and images/b/..., each
    with its own labels (Darknet's images -> labels rule finds them), stable across runs."""
    src = tmp_path / "src"
    entries = []
    for k, sub in enumerate(("a", "b", "b/deep")):
        (name, w, h, objs), = _toy_images(src / sub, 1, np.random.default_rng(k))
        entries.append((f"{sub}/{name}", w, h, objs))
    assert len({Path(e[0]).name for e in entries}) == 1          # one basename, three folders
    ann = tmp_path / "instances.json"
    ann.write_text(json.dumps(_coco_doc(entries)))
    outs = []
    for run in ("one", "two"):
        out = tmp_path / run
        r = CliRunner().invoke(main, ["labels", "from-coco", str(ann), "--images", str(src), "--out", str(out),
                                      "--valid-fraction", "0"])
        assert r.exit_code == 0, r.output
        outs.append(out)
        listed = (out / "train.txt").read_text().split()
        assert sorted(listed) == sorted(str((out / "images" / e[0]).absolute()) for e in entries)
        for path, (name, w, h, objs) in zip(sorted(listed), sorted(entries)):
            assert np.array_equal(np.asarray(Image.open(path)), np.asarray(Image.open(src / name)))
            boxes, bad = read_box_labels(label_path_for(path), 2)
            assert not bad and len(boxes) == len(objs)
            c, x0, y0, x1, y1 = objs[0]
            np.testing.assert_allclose(boxes[0], [(x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w,
                                                  (y1 - y0) / h, c], atol=1e-5)
    a, b = ([p.relative_to(o) for p in sorted(o.rglob("*.txt"))] for o in outs)
    assert a == b and Path("labels/b/deep/img000.txt") in a


def test_from_coco_refuses_two_images_that_would_share_a_label_file(tmp_path):
    src = tmp_path / "src"
    (name, w, h, objs), = _toy_images(src, 1, np.random.default_rng(0))
    Image.open(src / name).save(src / "img000.jpg")
    ann = tmp_path / "instances.json"
    ann.write_text(json.dumps(_coco_doc([(name, w, h, objs), ("img000.jpg", w, h, objs)])))
    r = CliRunner().invoke(main, ["labels", "from-coco", str(ann), "--images", str(src), "--out", str(tmp_path / "o")])
    assert r.exit_code != 0
    msg = r.output.strip().splitlines()[-1]
    assert "img000.png" in msg and "img000.jpg" in msg and "labels/img000.txt" in msg
