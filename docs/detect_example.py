"""Draw docs/detect-example.png: `darkpy detect --thresh 0.5` on four held-out shapes images.

    python data/shapes/generate.py
    darkpy train cfg/shapes-tiny.cfg --seed 1
    python docs/detect_example.py backup/shapes-tiny_final.weights

Each image is enlarged 2x (bilinear) before detection, so the boxes and labels are drawn at the
enlarged size; the four go in a 2x2 grid with white gaps. The default images are held out (in
data/shapes/valid.list with the generator's defaults).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
IMAGES = [f"data/shapes/images/{k:05d}.jpg" for k in (2719, 2732, 2740, 2757)]
GAP = 12


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("weights")
    p.add_argument("--cfg", default=str(ROOT / "cfg" / "shapes-tiny.cfg"))
    p.add_argument("--images", nargs=4, default=[str(ROOT / i) for i in IMAGES])
    p.add_argument("--thresh", type=float, default=0.5)
    p.add_argument("--out", default=str(ROOT / "docs" / "detect-example.png"))
    a = p.parse_args()

    from darkpy.detect import detect_image, draw_detections
    from darkpy.images import load_image, resize_image, save_image
    from darkpy.network import load_network

    net = load_network(a.cfg, a.weights, batch=1)
    names = (ROOT / "data" / "shapes.names").read_text().split()
    tiles = []
    for path in a.images:
        img = load_image(path)
        big = resize_image(img, img.shape[2] * 2, img.shape[1] * 2)
        dets = detect_image(net, big, thresh=a.thresh)
        tiles.append(draw_detections(big, dets, names, a.thresh, classes=len(names)))
        print(path, ", ".join(f"{names[d.class_id]} {d.confidence:.2f}" for d in dets) or "nothing")
    c, h, w = tiles[0].shape
    grid = np.ones((c, 2 * h + GAP, 2 * w + GAP), np.float32)
    for k, tile in enumerate(tiles):
        y, x = (k // 2) * (h + GAP), (k % 2) * (w + GAP)
        grid[:, y:y + h, x:x + w] = tile
    save_image(grid, a.out)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
