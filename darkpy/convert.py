"""COCO and VOC annotations to Darknet's detector layout: the library behind `darkpy labels`.

The output folder gets `images/` (links to the source images, copies where links are not possible),
`labels/` (one `class x y w h` file per image, image-relative centre and size, as Darknet reads them
beside `images/`; an image keeps its sub-path, so COCO's `a/1.jpg` and `b/1.jpg` become
`images/a/1.jpg` and `images/b/1.jpg` with `labels/a/1.txt` and `labels/b/1.txt`; two images that
would still share a label file, such as `1.jpg` and `1.png`, are refused naming both),
`train.txt` / `valid.txt` (a seeded split), `<name>.names` and `<name>.data`.

Boxes are skipped, and reported with the reason, when they have no area (w or h <= 0), lie wholly
outside the image, name a class that is not in the list, are COCO crowd regions or VOC difficult
objects (unless kept; those are written, as Darknet's VOC scripts do, to `difficult/labels/` with a
`difficult.txt` list parallel to `valid.txt` and `difficult=` in the .data file, which `darkpy map`
reads). Boxes partly outside the image are clipped to it. Coordinates: COCO's bbox is
[x, y, w, h] in pixels; VOC's bndbox is 1-based inclusive pixels, converted as voc_label.py does
(centre `(xmin + xmax)/2 - 1`, width `xmax - xmin`).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .errors import DataError


@dataclass
class ConvertResult:
    names: list[str]
    images: int = 0
    boxes: int = 0
    skipped: list[str] = field(default_factory=list)      # "where: reason"
    reasons: list[str] = field(default_factory=list)      # the reason of each skipped box
    data_path: str = ""
    train_path: str = ""
    valid_path: str = ""
    train_count: int = 0
    valid_count: int = 0

    def skip(self, where: str, reason: str) -> None:
        self.skipped.append(f"{where}: {reason}")
        self.reasons.append(reason)

    def skipped_counts(self) -> dict[str, int]:
        return dict(Counter(self.reasons))


def _clip_box(x0, y0, x1, y1, w, h):
    """Clip pixel corners to the image; None when nothing is left."""
    cx0, cy0, cx1, cy1 = max(x0, 0.0), max(y0, 0.0), min(x1, float(w)), min(y1, float(h))
    if cx1 <= cx0 or cy1 <= cy0:
        return None
    return cx0, cy0, cx1, cy1


def _link(src: str, dst: str) -> None:
    if os.path.lexists(dst):
        os.remove(dst)
    try:
        os.symlink(os.path.abspath(src), dst)
    except OSError:
        shutil.copy2(src, dst)


def output_name(name: str) -> str:
    """The path under images/ of an image named `name` in the annotations (COCO's file_name, VOC's
    filename): its relative sub-path, normalised, without a drive, leading separators or `..`."""
    parts = os.path.normpath(re.sub(r"^[A-Za-z]:", "", name.replace("\\", "/"))).replace("\\", "/").split("/")
    kept = [q for q in parts if q not in ("", ".", "..")]
    return "/".join(kept) or os.path.basename(name)


def _unique_outputs(items: list[tuple[str, str, list[str]]]) -> None:
    """A clear error when two images would share an output image or label file."""
    seen: dict[str, str] = {}
    for src, rel, _ in items:
        for key in ("images/" + rel, "labels/" + os.path.splitext(rel)[0] + ".txt"):
            other = seen.setdefault(key, src)
            if other != src:
                raise DataError(f"{other} and {src} would both be written as {key} in the output folder; "
                                f"rename one of them")


def _write_dataset(out: str, name: str, names: list[str], items: list[tuple[str, str, list[str]]],
                   valid_fraction: float, seed: int, r: ConvertResult) -> ConvertResult:
    """items: (source image path, its name under images/ (`output_name`), label lines). Writes
    images/, labels/, lists, .names, .data."""
    _unique_outputs(items)
    img_dir, lab_dir = os.path.join(out, "images"), os.path.join(out, "labels")
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(lab_dir, exist_ok=True)
    paths = []
    for src, rel, lines in items:
        dst = os.path.join(img_dir, *rel.split("/"))
        label = os.path.join(lab_dir, *(os.path.splitext(rel)[0] + ".txt").split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.makedirs(os.path.dirname(label), exist_ok=True)
        _link(src, dst)
        with open(label, "w") as f:
            f.writelines(line + "\n" for line in lines)
        paths.append(os.path.abspath(dst))
    n_valid = int(round(len(paths) * valid_fraction))
    order = np.random.default_rng(seed).permutation(len(paths))
    valid = sorted(paths[i] for i in order[:n_valid])
    train = sorted(paths[i] for i in order[n_valid:])
    r.train_path, r.valid_path = os.path.join(out, "train.txt"), os.path.join(out, "valid.txt")
    for p, lst in ((r.train_path, train), (r.valid_path, valid)):
        with open(p, "w") as f:
            f.writelines(x + "\n" for x in lst)
    names_path = os.path.join(out, f"{name}.names")
    with open(names_path, "w") as f:
        f.writelines(n + "\n" for n in names)
    r.data_path = os.path.join(out, f"{name}.data")
    with open(r.data_path, "w") as f:
        f.write(f"classes={len(names)}\ntrain={os.path.abspath(r.train_path)}\nvalid={os.path.abspath(r.valid_path)}\n"
                f"names={os.path.abspath(names_path)}\nbackup={os.path.abspath(os.path.join(out, 'backup'))}/\n")
    r.images, r.train_count, r.valid_count = len(paths), len(train), len(valid)
    return r


def _line(c: int, x0, y0, x1, y1, w, h) -> str:
    return f"{c} {(x0 + x1) / 2 / w:.6f} {(y0 + y1) / 2 / h:.6f} {(x1 - x0) / w:.6f} {(y1 - y0) / h:.6f}"


def convert_coco(annotations: str, images: str, out: str, valid_fraction: float = 0.1, seed: int = 0,
                 name: str = "dataset") -> ConvertResult:
    """A COCO instances JSON: classes in category-id order; crowd regions skipped (module doc)."""
    try:
        with open(annotations) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"{annotations}: cannot read COCO annotations ({e})") from None
    for key in ("images", "annotations", "categories"):
        if key not in doc:
            raise DataError(f"{annotations}: not COCO instances annotations (no {key!r} list)")
    cats = sorted(doc["categories"], key=lambda c: c["id"])
    cls_of = {c["id"]: k for k, c in enumerate(cats)}
    r = ConvertResult([c["name"] for c in cats])
    per_image: dict[int, list[str]] = {im["id"]: [] for im in doc["images"]}
    info = {im["id"]: im for im in doc["images"]}
    for a in doc["annotations"]:
        where = f"annotation {a.get('id', '?')} (image {a.get('image_id')})"
        im = info.get(a.get("image_id"))
        if im is None:
            r.skip(where, "unknown image id")
            continue
        if a.get("category_id") not in cls_of:
            r.skip(where, "unknown class")
            continue
        if a.get("iscrowd"):
            r.skip(where, "crowd region")
            continue
        x, y, bw, bh = (float(v) for v in a["bbox"])
        if bw <= 0 or bh <= 0:
            r.skip(where, "zero size")
            continue
        W, H = im["width"], im["height"]
        box = _clip_box(x, y, x + bw, y + bh, W, H)
        if box is None:
            r.skip(where, "outside the image")
            continue
        per_image[im["id"]].append(_line(cls_of[a["category_id"]], *box, W, H))
        r.boxes += 1
    items = []
    for im in doc["images"]:
        src = os.path.join(images, im["file_name"])
        if not os.path.isfile(src):
            for _ in per_image[im["id"]]:
                r.boxes -= 1
                r.skip(f"image {im['id']} ({im['file_name']})", "image file missing")
            continue
        items.append((src, output_name(im["file_name"]), per_image[im["id"]]))
    return _write_dataset(out, name, r.names, items, valid_fraction, seed, r)


def _voc_objects(path: str):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise DataError(f"{path}: cannot read VOC XML ({e})") from None
    size = root.find("size")
    try:
        w, h = int(float(size.findtext("width"))), int(float(size.findtext("height")))
    except (AttributeError, TypeError, ValueError):
        raise DataError(f"{path}: no <size><width>/<height>") from None
    objs = []
    for k, o in enumerate(root.findall("object")):
        bb = o.find("bndbox")
        try:
            box = tuple(float(bb.findtext(t)) for t in ("xmin", "ymin", "xmax", "ymax"))
        except (AttributeError, TypeError, ValueError):
            box = None
        objs.append((k, (o.findtext("name") or "").strip(), int(o.findtext("difficult") or 0), box))
    return root.findtext("filename") or os.path.splitext(os.path.basename(path))[0] + ".jpg", w, h, objs


def convert_voc(annotations: str, images: str, out: str, valid_fraction: float = 0.1, seed: int = 0,
                name: str = "dataset", names: list[str] | None = None, keep_difficult: bool = False) -> ConvertResult:
    """A folder of VOC XML files; classes `names` (default: every object name seen, sorted)."""
    files = sorted(os.path.join(annotations, f) for f in os.listdir(annotations) if f.endswith(".xml"))
    if not files:
        raise DataError(f"{annotations}: no .xml annotation files")
    parsed = [(f, *_voc_objects(f)) for f in files]
    if names is None:
        names = sorted({n for *_, objs in parsed for _, n, _, _ in objs if n})
    cls_of = {n: k for k, n in enumerate(names)}
    r = ConvertResult(list(names))
    items = []
    difficult_labels: dict[str, list[str]] = {}
    for path, filename, W, H, objs in parsed:
        lines, hard = [], []
        for k, cname, difficult, box in objs:
            where = f"{path}: object {k + 1} ({cname or '?'})"
            if cname not in cls_of:
                r.skip(where, "unknown class")
                continue
            hard_one = bool(difficult) and not keep_difficult
            if box is None:
                r.skip(where, "no bndbox")
                continue
            x0, y0, x1, y1 = box
            if x1 <= x0 or y1 <= y0:
                r.skip(where, "zero size")
                continue
            # voc_label.py: 1-based pixels -> centre (xmin + xmax)/2 - 1, size xmax - xmin
            c = _clip_box(x0 - 1, y0 - 1, x1 - 1, y1 - 1, W, H)
            if c is None:
                r.skip(where, "outside the image")
                continue
            if hard_one:
                r.skip(where, "difficult (kept in difficult/labels for `map`)")
                hard.append(_line(cls_of[cname], *c, W, H))
                continue
            lines.append(_line(cls_of[cname], *c, W, H))
        src = os.path.join(images, filename)
        if not os.path.isfile(src):
            for _ in lines:
                r.skip(f"{path} ({filename})", "image file missing")
            continue
        r.boxes += len(lines)
        items.append((src, output_name(filename), lines))
        difficult_labels[output_name(filename)] = hard
    r = _write_dataset(out, name, r.names, items, valid_fraction, seed, r)
    _write_difficult(out, r, difficult_labels)
    return r


def _write_difficult(out: str, r: ConvertResult, labels: dict[str, list[str]]) -> None:
    """Darknet's VOC layout for difficult objects: difficult/labels/<stem>.txt, a list parallel to
    valid.txt (difficult/images/<file>) and `difficult=` in the .data file, read by `darkpy map`."""
    if not any(labels.values()):
        return
    lab_dir = os.path.join(out, "difficult", "labels")
    for rel, lines in labels.items():
        label = os.path.join(lab_dir, *(os.path.splitext(rel)[0] + ".txt").split("/"))
        os.makedirs(os.path.dirname(label), exist_ok=True)
        with open(label, "w") as f:
            f.writelines(line + "\n" for line in lines)
    with open(r.valid_path) as f:
        valid = f.read().splitlines()
    img_dir = os.path.abspath(os.path.join(out, "images"))
    dif_list = os.path.join(out, "difficult.txt")
    with open(dif_list, "w") as f:
        f.writelines(os.path.abspath(os.path.join(out, "difficult", "images", os.path.relpath(p, img_dir))) + "\n"
                     for p in valid)
    with open(r.data_path, "a") as f:
        f.write(f"difficult={os.path.abspath(dif_list)}\n")
