"""darkpy.datasets: .data/list/names files, labels, batch assembly, the loader, the digits dataset."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from darkpy import datasets as D
from darkpy.errors import DataError
from darkpy.images import load_image

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------
# .data, list and names files
# ---------------------------------------------------------------------------------------------------
def _write(p: Path, text: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_read_data_file_rules_and_resolution(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    _write(proj / "cfg" / "my.names", "cat\ndog\n\n")
    _write(proj / "cfg" / "train.list", "a.jpg\n")
    _write(proj / "data" / "valid.list", "b.jpg\n")
    data = _write(proj / "cfg" / "my.data",
                  "# a comment\n; another\n\n classes = 2 \r\n"
                  "train = train.list\nvalid=data/valid.list\nnames=my.names\nbackup = backup/\ntop=2\n")
    monkeypatch.chdir(proj)
    cfg = D.read_data_file(data)
    assert cfg.classes == 2 and cfg.top == 2 and cfg.backup == "backup/" and cfg.eval == "voc"
    assert cfg.names == ["cat", "dog"] and cfg.labels == ["cat", "dog"]   # labels fall back to names
    assert cfg.train == os.path.join(str(proj / "cfg"), "train.list")       # beside the .data file
    assert cfg.valid == "data/valid.list"                                    # from the current directory
    assert cfg.raw["train"] == "train.list"
    # the current directory wins over the .data file's folder
    _write(proj / "train.list", "c.jpg\n")
    assert D.read_data_file(data).train == "train.list"


def test_read_data_file_errors_have_file_and_line(tmp_path):
    data = _write(tmp_path / "x.data", "classes=2\n# c\ntrain=nope.list\n")
    dc = D.read_data_file(data)          # a list is checked when it is read (map needs only valid)
    with pytest.raises(DataError) as e:
        D.read_list(dc.train)
    msg = str(e.value)
    assert msg.startswith(f"{data}:3 train: no such file 'nope.list'") and str(tmp_path) in msg
    data = _write(tmp_path / "y.data", "classes=2\njunk line\n")
    with pytest.raises(DataError, match=r"y\.data:2: cannot parse"):
        D.read_data_file(data)
    data = _write(tmp_path / "z.data", "classes=ten\n")
    with pytest.raises(DataError, match=r"z\.data:1 classes: not an integer"):
        D.read_data_file(data)
    data = _write(tmp_path / "e.data", "eval=pascal\n")
    with pytest.raises(DataError, match=r"e\.data:1 eval: unknown kind"):
        D.read_data_file(data)
    with pytest.raises(DataError, match="missing.data"):
        D.read_data_file(tmp_path / "missing.data")


def test_read_data_file_warnings(tmp_path):
    _write(tmp_path / "n.names", "a\nb\nc\n")
    data = _write(tmp_path / "w.data", "classes=2\nnames=n.names\nfoo=bar\nclasses=5\n")
    with pytest.warns(D.DataWarning) as rec:
        cfg = D.read_data_file(data)
    text = "\n".join(str(w.message) for w in rec)
    assert f"{data}:3 foo: unknown .data key" in text
    assert f"{data}:4 classes: duplicate key" in text
    assert "3 names for classes=2" in text
    assert cfg.classes == 2   # first duplicate wins, as in Darknet
    _write(tmp_path / "d.data", "names=n.names\n")
    assert D.read_data_file(tmp_path / "d.data").classes == 3


def test_read_list_and_names(tmp_path, monkeypatch):
    _write(tmp_path / "lists" / "img" / "a.png", "")
    lst = _write(tmp_path / "lists" / "t.list", "img/a.png\r\n\r\n  img/missing.png  \n/abs/x.jpg\n")
    monkeypatch.chdir(tmp_path)
    assert D.read_list(lst) == [os.path.join(str(tmp_path / "lists"), "img/a.png"), "img/missing.png",
                                "/abs/x.jpg"]
    with pytest.raises(DataError, match="nope.list"):
        D.read_list(tmp_path / "nope.list")
    names = _write(tmp_path / "n.names", "traffic light \r\nperson\n\n\n")
    assert D.read_names(names) == ["traffic light", "person"]
    bad = _write(tmp_path / "b.names", "a\n\nb\n")
    with pytest.raises(DataError, match=r"b\.names:2: empty class name"):
        D.read_names(bad)


# ---------------------------------------------------------------------------------------------------
# labels
# ---------------------------------------------------------------------------------------------------
def test_classifier_label():
    labels = ["cat", "dog", "bird"]
    assert D.classifier_label("data/train/00001_dog.png", labels) == 1
    # a directory name containing another label does not spoil it: the file name decides
    assert D.classifier_label("data/cats/dog_01.jpg", labels) == 1
    # no label in the file name: the whole path is used (ImageNet-style class folders)
    assert D.classifier_label("data/bird/0001.jpg", labels) == 2
    with pytest.raises(DataError) as e:
        D.classifier_label("data/x/0001_horse.png", labels)
    assert "data/x/0001_horse.png" in str(e.value) and "'cat', 'dog', 'bird'" in str(e.value)
    with pytest.raises(DataError) as e:
        D.classifier_label("data/x/catdog.png", labels)
    assert "data/x/catdog.png" in str(e.value)
    assert "'cat' (class 0)" in str(e.value) and "'dog' (class 1)" in str(e.value)
    assert D.classifier_label("x/neg.png", ["pos"]) == -1   # Darknet's single-label negative


def test_label_path_for(tmp_path):
    c = D.label_path_candidates
    assert c("data/images/a.jpg")[0] == "data/labels/a.txt"
    assert c("VOC/JPEGImages/0001.jpg")[0] == "VOC/labels/0001.txt"
    assert c("x/raw/b.png")[0] == "x/labels/b.txt"
    assert c("x/images/b.JPEG")[0] == "x/labels/b.txt"
    # Darknet's pitfalls: substring replacement inside other names
    assert c("data/drawings/images/a.jpg")[0] == "data/dlabelsings/labels/a.txt"
    assert c("data/myimages/a.jpg")[0] == "data/mylabels/a.txt"
    assert c("data/drawings/images/a.jpg")[1] == "data/drawings/labels/a.txt"
    assert c("data/drawings/images/a.jpg")[2] == "data/drawings/images/a.txt"
    assert all(p != "x/pic.jpeg" for p in c("x/pic.jpeg"))   # never the image itself
    # with files on disk: the first existing candidate
    img = tmp_path / "drawings" / "images" / "a.jpg"
    _write(img, "")
    _write(tmp_path / "drawings" / "labels" / "a.txt", "0 .5 .5 .1 .1\n")
    assert D.label_path_for(str(img)) == str(tmp_path / "drawings" / "labels" / "a.txt")
    img2 = _write(tmp_path / "flat" / "b.png", "")
    _write(tmp_path / "flat" / "b.txt", "")                  # AlexeyAB: the .txt beside the image
    assert D.label_path_for(str(img2)) == str(tmp_path / "flat" / "b.txt")
    assert D.label_path_for("nowhere/images/c.jpg") == "nowhere/labels/c.txt"


def test_read_box_labels_collects_bad_lines(tmp_path):
    p = _write(tmp_path / "l.txt", "0 0.5 0.5 0.2 0.3\n"
                                   "7 0.5 0.5 0.2 0.3\n"        # class >= classes
                                   "1 1.5 0.5 0.2 0.3\n"        # x outside [0,1]
                                   "1 0.5 0.5 0 0.3\n"          # w <= 0
                                   "1 0.5 0.5 abc 0.3\n"        # unparsable
                                   "1 0.5 0.5\n"                # too few fields
                                   "\n"
                                   "2 0.1 0.9 0.05 0.1\r\n")
    boxes, bad = D.read_box_labels(str(p), 3)
    np.testing.assert_allclose(boxes, [[0.5, 0.5, 0.2, 0.3, 0], [0.1, 0.9, 0.05, 0.1, 2]])
    assert boxes.dtype == np.float32
    assert [b.split(": ")[0] for b in bad] == [f"{p}:{n}" for n in (2, 3, 4, 5, 6)]
    assert "class 7 out of range (classes=3)" in bad[0]
    assert "outside [0,1]" in bad[1] and "> 0" in bad[2] and "cannot parse" in bad[3] and "5 fields" in bad[4]


# ---------------------------------------------------------------------------------------------------
# detection batches
# ---------------------------------------------------------------------------------------------------
def _square_dataset(tmp_path, n=3):
    """Black images with one white rectangle each, and its label file; returns the image paths."""
    paths = []
    rng = np.random.default_rng(0)
    for i in range(n):
        h, w = (48, 64) if i % 2 == 0 else (70, 40)
        x0, y0 = int(rng.integers(2, w // 2)), int(rng.integers(2, h // 2))
        x1, y1 = x0 + int(rng.integers(14, w // 2 - 1)), y0 + int(rng.integers(14, h // 2 - 1))
        img = np.zeros((h, w, 3), np.uint8)
        img[y0:y1, x0:x1] = 255
        p = tmp_path / "images" / f"{i}.png"
        p.parent.mkdir(exist_ok=True)
        Image.fromarray(img).save(p)
        _write(tmp_path / "labels" / f"{i}.txt",
               f"{i % 2} {(x0 + x1) / 2 / w} {(y0 + y1) / 2 / h} {(x1 - x0) / w} {(y1 - y0) / h}\n")
        paths.append(str(p))
    return paths


def _check_box_on_square(x, row, w, h):
    """The bright pixels (the placed rectangle) lie inside the truth box, and fill its interior."""
    bx, by, bw, bh = row[0] * w, row[1] * h, row[2] * w, row[3] * h
    ys, xs = np.nonzero(x.min(axis=0) > 0.9)
    assert len(xs) > 0
    assert xs.min() >= bx - bw / 2 - 1.5 and xs.max() + 1 <= bx + bw / 2 + 1.5
    assert ys.min() >= by - bh / 2 - 1.5 and ys.max() + 1 <= by + bh / 2 + 1.5
    if min(bw, bh) >= 5:
        inner = x[:, int(np.ceil(by - bh / 2 + 1.5)):int(by + bh / 2 - 1.5),
                  int(np.ceil(bx - bw / 2 + 1.5)):int(bx + bw / 2 - 1.5)]
        assert inner.size > 0 and inner.min() > 0.9


def test_detection_augment_keeps_boxes_on_objects(tmp_path):
    paths = _square_dataset(tmp_path)
    data = D.DetectionData(paths, 2, max_boxes=4, jitter=0.3, hue=0, saturation=1, exposure=1)
    flips = set()
    for seed in range(12):
        x, truth = data.load([0, 1, 2], np.random.default_rng(seed), 64, 56)
        assert x.shape == (3, 3, 56, 64) and truth.shape == (3, 20)
        for i in range(3):
            row = truth[i, :5]
            assert row[4] == i % 2 and np.all(truth[i, 5:] == 0)
            _check_box_on_square(x[i], row, 64, 56)
            # did this one flip? the rectangle moves to the mirrored side of the source
            src = load_image(paths[i])
            sx = np.nonzero(src[0].max(axis=0) > 0.9)[0].mean() / src.shape[2]
            flips.add((row[0] - 0.5) * (sx - 0.5) < 0)
    assert flips == {True, False}
    assert data.bad_labels == []


def test_detection_letterbox_and_determinism(tmp_path):
    paths = _square_dataset(tmp_path)
    plain = D.DetectionData(paths, 2, augment=False)
    x, truth = plain.load([0, 1], np.random.default_rng(0), 64, 64)
    for i in range(2):
        _check_box_on_square(x[i], truth[i, :5], 64, 64)
    assert np.all(x[1][:, :, 0] == 0.5)   # a tall image is letterboxed with grey sides
    aug = D.DetectionData(paths, 2, hue=.1, saturation=1.5, exposure=1.5)
    a = aug.load([2, 0, 1], np.random.default_rng(5), 48, 48)
    b = aug.load([2, 0, 1], np.random.default_rng(5), 48, 48)
    c = aug.load([2, 0, 1], np.random.default_rng(6), 48, 48)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


def test_detection_bad_labels_and_max_boxes(tmp_path):
    paths = _square_dataset(tmp_path, n=2)
    lines = "".join(f"0 {0.1 + 0.05 * k} 0.5 0.04 0.04\n" for k in range(6)) + "5 0.5 0.5 0.1 0.1\n"
    _write(tmp_path / "labels" / "0.txt", lines)
    os.remove(tmp_path / "labels" / "1.txt")
    data = D.DetectionData(paths, 2, max_boxes=4, augment=False)
    assert len(data.bad_labels) == 1 and "1.png: no label file" in data.bad_labels[0]
    _, truth = data.load([0, 1, 0], np.random.default_rng(0), 32, 32)
    assert np.count_nonzero(truth[0].reshape(4, 5)[:, 0]) == 4      # truncated to max_boxes
    assert np.all(truth[1] == 0)                                      # no label file: no objects
    assert len(data.bad_labels) == 2 and data.bad_labels[1].startswith(f"{tmp_path / 'labels' / '0.txt'}:7:")
    out = tmp_path / "bad.list"
    assert data.write_bad_labels(out) == 2
    assert out.read_text().splitlines() == data.bad_labels
    os.remove(tmp_path / "labels" / "0.txt")
    with pytest.raises(DataError, match="none of the 2 images has a label file"):
        D.DetectionData(paths, 2)


# ---------------------------------------------------------------------------------------------------
# classifier batches
# ---------------------------------------------------------------------------------------------------
class _Net:
    """The NetConfig fields ClassifierData reads."""
    min_ratio, max_ratio, angle, aspect = 1.0, 1.5, 10.0, 1.2
    hue, saturation, exposure, flip, center = 0.1, 1.5, 1.5, 1, 0


def test_classifier_data_on_digits():
    paths = D.read_list(ROOT / "data/digits/train.list")[:40]
    names = D.read_names(ROOT / "data/digits.names")
    data = D.ClassifierData(paths, names, _Net(), augment=True)
    assert len(data) == 40
    x, y = data.load(range(10, 26), np.random.default_rng(3), 16, 16)
    assert x.shape == (16, 3, 16, 16) and y.shape == (16, 10) and x.dtype == np.float32
    np.testing.assert_array_equal(y.sum(axis=1), 1)
    for row, k in zip(y, range(10, 26)):
        assert names[int(row.argmax())] in os.path.basename(paths[k])
    x2, y2 = data.load(range(10, 26), np.random.default_rng(3), 16, 16)
    np.testing.assert_array_equal(x, x2)
    assert not np.array_equal(x, data.load(range(10, 26), np.random.default_rng(4), 16, 16)[0])
    plain = D.ClassifierData(paths, names, None, augment=False, channels=1)
    x, _ = plain.load([0, 1], np.random.default_rng(0), 8, 8)
    np.testing.assert_array_equal(x[0], load_image(paths[0], 1))
    x, _ = plain.load([0], np.random.default_rng(0), 12, 10)
    assert x.shape == (1, 1, 10, 12)


@pytest.mark.parametrize("center,mixed,channels", [(0, False, 3), (1, False, 3), (0, True, 3), (0, False, 1)])
def test_classifier_augment_equals_darknet_steps(tmp_path, center, mixed, channels):
    """The batch fast path gives exactly random_augment_image -> flip -> random_distort_image, image
    by image from the same generator (same-sized images in one kernel call, mixed sizes one by one)."""
    from darkpy import images as I
    names = D.read_names(ROOT / "data/digits.names")
    paths = D.read_list(ROOT / "data/digits/test.list")[:6]
    if mixed:
        for i, p in enumerate(paths):
            size = (8 + 3 * i, 20 - i)
            Image.open(p).resize(size).save(tmp_path / os.path.basename(p))
        paths = [str(tmp_path / os.path.basename(p)) for p in paths]
    net = _Net()
    net.center = center
    data = D.ClassifierData(paths, names, net, channels=channels)
    x, _ = data.load(range(6), np.random.default_rng(11), 12, 12)
    assert x.shape == (6, channels, 12, 12)
    rng = np.random.default_rng(11)
    for i, p in enumerate(paths):
        img = load_image(p, channels)
        crop = (I.center_crop_image(img, 12, 12) if center else
                I.random_augment_image(img, net.angle, net.aspect, 12, 18, 12, 12, rng))
        if rng.random() < 0.5:
            crop = I.flip_image(crop)
        np.testing.assert_array_equal(x[i], I.random_distort_image(crop, net.hue, net.saturation,
                                                                   net.exposure, rng))


def test_classifier_data_rejects_bad_paths_up_front():
    with pytest.raises(DataError) as e:
        D.ClassifierData(["a/0_cat.png", "b/1_catdog.png", "c/2_x.png"], ["cat", "dog"])
    msg = str(e.value)
    assert msg.startswith("2 of 3 images") and "1_catdog.png" in msg and "2_x.png" in msg


# ---------------------------------------------------------------------------------------------------
# background loader
# ---------------------------------------------------------------------------------------------------
def _batch(k):
    if k == 7:
        raise ValueError("batch 7 is broken")
    rng = np.random.default_rng([123, k])
    return rng.random((4, 3)), threading.current_thread().name


def test_batch_loader_equals_direct_calls_and_prefetches():
    with D.BatchLoader(_batch, depth=2) as loader:
        threads = set()
        for k in [0, 1, 2, 3, 5, 6, 2]:   # in order, a skip, and going back
            arr, thread = loader.get(k)
            np.testing.assert_array_equal(arr, _batch(k)[0])
            threads.add(thread)
    assert any(t.startswith("darkpy-loader") for t in threads)   # most batches came from the worker
    with pytest.raises(RuntimeError, match="closed"):
        loader.get(0)


def test_batch_loader_raises_worker_errors_in_caller():
    loader = D.BatchLoader(_batch)
    loader.get(6)                         # prefetches 7 on the worker, which raises there
    with pytest.raises(ValueError, match="batch 7 is broken"):
        loader.get(7)
    np.testing.assert_array_equal(loader.get(8)[0], _batch(8)[0])
    with pytest.raises(ValueError, match="batch 7"):
        loader.get(7)                     # not prefetched: raised directly
    loader.close()


# ---------------------------------------------------------------------------------------------------
# the bundled digits dataset
# ---------------------------------------------------------------------------------------------------
def test_digits_dataset_complete(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = D.read_data_file("data/digits.data")
    assert cfg.classes == 10 and cfg.top == 2 and cfg.backup == "backup/"
    assert cfg.names == ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    assert cfg.labels == cfg.names
    train, test = D.read_list(cfg.train), D.read_list(cfg.valid)
    assert (len(train), len(test)) == (1437, 360)
    assert not set(train) & set(test)
    names_on_disk = {f"data/digits/{s}/{f}" for s in ("train", "test") for f in os.listdir(f"data/digits/{s}")}
    assert names_on_disk == set(train) | set(test)
    counts = np.zeros(10, int)
    for p in train + test:
        assert os.path.isfile(p)
        # exactly one label anywhere in the path: Darknet's own rule works too
        assert sum(lab in p for lab in cfg.labels) == 1, p
        counts[D.classifier_label(p, cfg.labels)] += 1
    assert counts.sum() == 1797 and counts.min() >= 170
    im = load_image(train[0])
    assert im.shape == (3, 8, 8) and np.array_equal(im[0], im[2]) and im.max() > 0.9
