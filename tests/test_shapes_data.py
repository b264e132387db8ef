"""The bundled shapes dataset: the generator is deterministic and writes labels Darknet's rules find
and darkpy's reader accepts; the committed .data/.names/cfg fit together; and a short seeded training
run of cfg/shapes-tiny.cfg beats a stated mAP on held-out images."""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import shapes_generator, short_shapes_tiny

from darkpy.datasets import label_path_for, read_box_labels, read_names
from darkpy.cfgcheck import check_cfg
from darkpy.network import load_network

ROOT = Path(__file__).resolve().parents[1]


gen = shapes_generator()


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_generator_is_deterministic_and_prefix_stable(tmp_path):
    gen.generate(tmp_path / "a", n=6, size=64, seed=3, list_prefix="x")
    gen.generate(tmp_path / "b", n=6, size=64, seed=3, list_prefix="x")
    gen.generate(tmp_path / "c", n=4, size=64, seed=3, list_prefix="x")
    a, b, c = (_digest(tmp_path / k) for k in "abc")
    assert a == b
    for name in ("images/00003.jpg", "labels/00003.txt"):
        assert c[name] == a[name]                   # image k depends on (seed, k) only
    gen.generate(tmp_path / "d", n=6, size=64, seed=4, list_prefix="x")
    assert _digest(tmp_path / "d")["images/00000.jpg"] != a["images/00000.jpg"]


def test_generated_labels_follow_darknet_layout(tmp_path):
    out = tmp_path / "shapes"
    train, valid = gen.generate(out, n=20, size=128, seed=0)
    train_paths, valid_paths = train.read_text().split(), valid.read_text().split()
    assert len(train_paths) == 18 and len(valid_paths) == 2 and not set(train_paths) & set(valid_paths)
    classes_seen = set()
    for p in train_paths + valid_paths:
        assert Path(p).is_file()
        lp = label_path_for(p)
        assert lp == p.replace("/images/", "/labels/").replace(".jpg", ".txt")
        boxes, bad = read_box_labels(lp, 4)
        assert not bad and 1 <= len(boxes) <= 4
        x, y, w, h = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
        assert ((x - w / 2 >= 0) & (x + w / 2 <= 1) & (y - h / 2 >= 0) & (y + h / 2 <= 1)).all()
        assert ((w * 128 >= 10) & (w * 128 <= 50)).all()
        classes_seen.update(boxes[:, 4].astype(int).tolist())
    assert classes_seen == {0, 1, 2, 3}


def test_label_is_the_tight_box_of_the_drawn_shape():
    """On the mask the generator draws, the shape's pixels fill its label box to the edge."""
    rng = np.random.default_rng(5)
    for cls in range(4):
        verts, r, (cx, cy), box = gen.shape_geometry(rng, cls, 128)
        pts = np.array(verts) if verts is not None else np.array([(cx - r, cy), (cx + r, cy), (cx, cy - r),
                                                                   (cx, cy + r)])
        assert np.allclose(pts.min(axis=0), box[:2]) and np.allclose(pts.max(axis=0), box[2:])
        assert 1 <= box[0] and box[2] <= 127 and 1 <= box[1] and box[3] <= 127
    star = gen.polygon(3, 0, 0, 10, 0.0)
    assert len(star) == 10 and math.isclose(star[0][1], -10) and math.isclose(math.hypot(*star[1]), 4.5)


def test_committed_files_fit_together():
    assert read_names(ROOT / "data" / "shapes.names") == list(gen.NAMES)
    data = (ROOT / "data" / "shapes.data").read_text()
    for line in ("classes=4", "train=data/shapes/train.list", "valid=data/shapes/valid.list",
                 "names=data/shapes.names"):
        assert line in data.splitlines()
    assert check_cfg(ROOT / "cfg" / "shapes-tiny.cfg") == []
    net = load_network(ROOT / "cfg" / "shapes-tiny.cfg")
    heads = [l for l in net.layers if l.kind == "yolo"]
    assert [h.classes for h in heads] == [4, 4] and net.input_shape == (3, 128, 128)
    assert [h.out_shape[1:] for h in heads] == [(8, 8), (16, 16)]


# -- training ---------------------------------------------------------------------------------------------

#: What the shortened run below must beat: mAP@0.5 (all-point) on its 80 held-out images. It reached
#: 0.172 (1 thread) and 0.171 (2 threads) when this was written; the full recipe (128×128, 3000
#: images, 1500 iterations) reaches 0.95.
SHORT_RUN_MAP = 0.10


@pytest.mark.slow
def test_short_seeded_training_run_beats_stated_map(tmp_path):
    """cfg/shapes-tiny.cfg at half resolution (64×64 images and input, anchors halved), 800 generated
    images, 300 iterations of 32 (about a minute on 2 idle cores), seed 1."""
    from darkpy.detect import evaluate_map
    from darkpy.train import train

    size, iterations = 64, 300
    out = tmp_path / "shapes"
    gen.generate(out, n=800, size=size, seed=0)
    data = tmp_path / "shapes.data"
    data.write_text(f"classes=4\ntrain={out / 'train.list'}\nvalid={out / 'valid.list'}\n"
                    f"names={ROOT / 'data' / 'shapes.names'}\nbackup={tmp_path / 'backup'}\n")
    cfg = short_shapes_tiny(tmp_path / "shapes-tiny.cfg", size, iterations)
    result = train(cfg, data=data, seed=1)
    assert result.iteration == iterations
    r = evaluate_map(load_network(cfg, result.weights, batch=16), data)
    print(r.format())
    assert r.map_all > SHORT_RUN_MAP, r.format()


def test_docs_detect_example_script_draws_the_grid(tmp_path):
    """docs/detect_example.py (draws docs/detect-example.png) runs on any four images and weights:
    a 2x2 grid of the images enlarged 2x with 12 px gaps, one line per image on stdout."""
    import subprocess
    import sys

    from PIL import Image
    gen.generate(tmp_path / "shapes", n=4, size=64, seed=0, valid_fraction=0)
    weights = tmp_path / "random.weights"
    load_network(ROOT / "cfg" / "shapes-tiny.cfg", batch=1).save_weights(weights)
    out = tmp_path / "grid.png"
    images = [str(tmp_path / "shapes" / "images" / f"{k:05d}.jpg") for k in range(4)]
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "detect_example.py"), str(weights), "--images",
                        *images, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert Image.open(out).size == (2 * 128 + 12, 2 * 128 + 12)
    assert [line.split()[0] for line in r.stdout.splitlines()[:4]] == images
