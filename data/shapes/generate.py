"""Generate darkpy's bundled detection dataset: coloured shapes on textured backgrounds.

Run from the repository root:   python data/shapes/generate.py      (or  python -m data.shapes.generate)

Writes (all git-ignored; only this generator is committed):
  data/shapes/images/NNNNN.jpg   SIZE×SIZE RGB images (default 3000 of 128×128), JPEG quality 92
  data/shapes/labels/NNNNN.txt   Darknet/YOLO labels, one line per object: `class x y w h`, normalised
                                 to [0, 1] (Darknet finds them by its images -> labels, .jpg -> .txt rule)
  data/shapes/train.list, valid.list   image paths relative to the repository root (valid = the last
                                 10%, held out from training)
`data/shapes.data` and `data/shapes.names` (classes circle, square, triangle, star) are committed.

Each image has 1-4 objects of 16-48 px (at 128×128; sizes scale with --size): circles, squares
(rotated by at most 20°), triangles and five-pointed stars (any rotation), each a random colour kept
apart from the background under it, over one of four textures (value noise, stripes, a checkerboard,
a gradient) with pixel noise. Objects overlap little (at most 15% of the smaller box). Shapes are
drawn at twice the size and averaged down, so their edges are anti-aliased. A label is the tight box
of the drawn shape.

Deterministic: image k depends only on (seed, k), so any --n gives the same first images, byte for
byte, on every run and machine (numpy's PCG64 generator, Pillow's drawing and JPEG encoder).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

NAMES = ("circle", "square", "triangle", "star")
SCALE = 2                                   # supersampling factor for anti-aliased edges


# -- backgrounds -----------------------------------------------------------------------------------------

def _muted_colour(rng: np.random.Generator) -> np.ndarray:
    grey = rng.uniform(0.2, 0.8)
    return np.clip(grey + rng.normal(0, 0.15, 3), 0, 1)


def background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A (size, size, 3) float texture in [0, 1]: value noise, stripes, checkerboard or gradient."""
    kind = rng.integers(4)
    yy, xx = np.mgrid[0:size, 0:size] / size
    a, b = _muted_colour(rng), _muted_colour(rng)
    if kind == 0:      # value noise: a coarse random grid, smoothly upsampled
        cells = int(rng.integers(3, 10))
        grid = (rng.uniform(0, 1, (cells, cells, 3)) * 255).astype(np.uint8)
        up = np.asarray(Image.fromarray(grid).resize((size, size), Image.BICUBIC), np.float64) / 255
        t = 0.5 + 0.6 * (up - 0.5)
        img = a * (1 - t) + b * t
    elif kind == 1:    # stripes at a random angle and frequency
        angle, freq = rng.uniform(0, math.pi), rng.uniform(4, 16)
        t = 0.5 + 0.5 * np.sin(2 * math.pi * freq * (xx * math.cos(angle) + yy * math.sin(angle))
                               + rng.uniform(0, 2 * math.pi))
        img = a * (1 - t[..., None]) + b * t[..., None]
    elif kind == 2:    # checkerboard
        cell = rng.uniform(0.05, 0.2)
        t = ((np.floor(xx / cell) + np.floor(yy / cell)) % 2)[..., None]
        img = a * (1 - t) + b * t
    else:              # linear gradient
        angle = rng.uniform(0, 2 * math.pi)
        t = (xx * math.cos(angle) + yy * math.sin(angle))
        t = ((t - t.min()) / max(t.max() - t.min(), 1e-9))[..., None]
        img = a * (1 - t) + b * t
    return np.clip(img + rng.normal(0, 0.03, img.shape), 0, 1)


# -- shapes ---------------------------------------------------------------------------------------------

def polygon(cls: int, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Vertices of a square/triangle/star of 'radius' r (centre to corner/tip) around (cx, cy)."""
    if cls == 1:
        corners = [(angle + math.pi / 4 + k * math.pi / 2, r) for k in range(4)]
    elif cls == 2:
        corners = [(angle - math.pi / 2 + k * 2 * math.pi / 3, r) for k in range(3)]
    else:
        corners = [(angle - math.pi / 2 + k * math.pi / 5, r if k % 2 == 0 else 0.45 * r) for k in range(10)]
    return [(cx + d * math.cos(t), cy + d * math.sin(t)) for t, d in corners]


def shape_geometry(rng: np.random.Generator, cls: int, size: int):
    """(vertices or None for a circle, radius, centre) with the shape's tight box inside the image."""
    r = rng.uniform(8, 24) * size / 128
    if cls == 0:
        verts, angle = None, 0.0
    else:
        angle = rng.uniform(-math.pi / 9, math.pi / 9) if cls == 1 else rng.uniform(0, 2 * math.pi)
        verts = polygon(cls, 0.0, 0.0, r, angle)
    xs = [-r, r] if verts is None else [v[0] for v in verts]
    ys = [-r, r] if verts is None else [v[1] for v in verts]
    cx = rng.uniform(1 - min(xs), size - 1 - max(xs))
    cy = rng.uniform(1 - min(ys), size - 1 - max(ys))
    box = (cx + min(xs), cy + min(ys), cx + max(xs), cy + max(ys))
    return (None if verts is None else [(cx + x, cy + y) for x, y in verts]), r, (cx, cy), box


def _overlap_fraction(a, b) -> float:
    """Intersection area over the smaller box's area, boxes as (x0, y0, x1, y1)."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return iw * ih / smaller


def _shape_colour(rng: np.random.Generator, under: np.ndarray) -> np.ndarray:
    """A saturated colour at least 0.4 (RGB distance) away from the mean background under the shape."""
    for _ in range(20):
        c = rng.uniform(0, 1, 3)
        c[rng.integers(3)] = rng.uniform(0.85, 1.0)      # one strong channel: vivid colours
        if np.linalg.norm(c - under) >= 0.4:
            return c
    return 1.0 - under                                   # fallback: the complementary colour


def make_image(seed: int, k: int, size: int = 128) -> tuple[Image.Image, list[tuple[int, float, float, float, float]]]:
    """Image k of the dataset and its labels [(class, x, y, w, h)] (normalised centre and size)."""
    rng = np.random.default_rng([seed, k])
    big = size * SCALE
    img = background(rng, big)
    n_objects = int(rng.choice([1, 2, 3, 4], p=[0.3, 0.35, 0.2, 0.15]))
    boxes: list[tuple[float, float, float, float]] = []
    labels = []
    for _ in range(n_objects):
        cls = int(rng.integers(len(NAMES)))
        for _try in range(50):
            verts, r, (cx, cy), box = shape_geometry(rng, cls, size)
            if all(_overlap_fraction(box, other) <= 0.15 for other in boxes):
                break
        else:
            continue
        mask = Image.new("L", (big, big), 0)
        draw = ImageDraw.Draw(mask)
        if verts is None:
            draw.ellipse([SCALE * (cx - r), SCALE * (cy - r), SCALE * (cx + r), SCALE * (cy + r)], fill=255)
        else:
            draw.polygon([(SCALE * x, SCALE * y) for x, y in verts], fill=255)
        m = np.asarray(mask, np.float64)[..., None] / 255
        x0, y0, x1, y1 = (int(SCALE * v) for v in box)
        under = img[max(y0, 0):y1 + 1, max(x0, 0):x1 + 1].reshape(-1, 3).mean(axis=0)
        colour = _shape_colour(rng, under)
        shade = 1 + 0.15 * (np.mgrid[0:big, 0:big][0] / big - 0.5)[..., None] * rng.choice([-1, 1])
        fill = np.clip(colour * shade + rng.normal(0, 0.02, img.shape), 0, 1)
        img = img * (1 - m) + fill * m
        boxes.append(box)
        bx0, by0, bx1, by1 = (min(max(v, 0.0), size) for v in box)
        labels.append((cls, (bx0 + bx1) / 2 / size, (by0 + by1) / 2 / size, (bx1 - bx0) / size,
                       (by1 - by0) / size))
    pixels = Image.fromarray((img * 255 + 0.5).astype(np.uint8)).resize((size, size), Image.BOX)
    return pixels, labels


def generate(out: str | os.PathLike = "data/shapes", n: int = 3000, size: int = 128, seed: int = 0,
             valid_fraction: float = 0.1, list_prefix: str | None = None) -> tuple[Path, Path]:
    """Write n images, their labels and train/valid lists under `out`; returns the two list paths.

    List entries are `list_prefix/images/NNNNN.jpg`; the prefix defaults to `out` as given (so run from
    the repository root with the default, the lists hold `data/shapes/images/...`, as Darknet expects)."""
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "labels").mkdir(parents=True, exist_ok=True)
    prefix = Path(list_prefix) if list_prefix is not None else out
    n_valid = int(round(n * valid_fraction))
    entries = []
    for k in range(n):
        image, labels = make_image(seed, k, size)
        name = f"{k:05d}"
        image.save(out / "images" / f"{name}.jpg", quality=92)
        with open(out / "labels" / f"{name}.txt", "w") as f:
            f.writelines(f"{c} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n" for c, x, y, w, h in labels)
        entries.append((prefix / "images" / f"{name}.jpg").as_posix())
    train, valid = out / "train.list", out / "valid.list"
    train.write_text("".join(e + "\n" for e in entries[:n - n_valid]))
    valid.write_text("".join(e + "\n" for e in entries[n - n_valid:]))
    return train, valid


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="data/shapes", help="output folder (default: data/shapes)")
    p.add_argument("--n", type=int, default=3000, help="number of images (default: 3000)")
    p.add_argument("--size", type=int, default=128, help="image width and height (default: 128)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--valid-fraction", type=float, default=0.1, help="held-out share (default: 0.1)")
    args = p.parse_args(argv)
    if args.n < 1 or args.size < 32 or not 0 <= args.valid_fraction < 1:
        p.error("need --n >= 1, --size >= 32 and 0 <= --valid-fraction < 1")
    train, valid = generate(args.out, args.n, args.size, args.seed, args.valid_fraction)
    print(f"wrote {args.n} images to {Path(args.out) / 'images'}; lists {train} and {valid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
