"""Anchor boxes from a dataset's labels: the library behind `darkpy anchors` (the fork's
`detector calc_anchors`).

Every label box of the `train` list, scaled to the network input (w·width, h·height), is clustered by
k-means with 1 − IoU as the distance (IoU of two boxes sharing a corner, i.e. shape only). Unlike the
fork (which prints "k-means++" but starts from random boxes, so each run differs), the start is
k-means++ (each next centre drawn with probability ∝ its distance², the distance being 1 − IoU) from a
seeded generator, and the best of several restarts (highest average IoU) is kept: the same seed gives
the same anchors. Centres move to the mean width and height of their boxes until the assignment stops
changing. Anchors are rounded to whole pixels (as the fork prints them) and sorted by area; the
average IoU reported is that of the rounded anchors: mean over boxes of the best IoU with an anchor.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .errors import DataError


@dataclass
class AnchorResult:
    anchors: np.ndarray          # (k, 2) w, h in network pixels, sorted by area
    avg_iou: float
    boxes: int
    counters_per_class: list[int]

    def anchors_text(self) -> str:
        return ", ".join(f"{int(w)},{int(h)}" for w, h in self.anchors)


def shape_iou(boxes: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """IoU (n, k) of (w, h) boxes with (w, h) centres, boxes aligned at a corner."""
    inter = np.minimum(boxes[:, None, 0], centres[None, :, 0]) * np.minimum(boxes[:, None, 1], centres[None, :, 1])
    union = (boxes[:, 0] * boxes[:, 1])[:, None] + (centres[:, 0] * centres[:, 1])[None, :] - inter
    return inter / union


def average_iou(boxes: np.ndarray, anchors: np.ndarray) -> float:
    return float(shape_iou(boxes, np.asarray(anchors, np.float64)).max(axis=1).mean())


def read_label_sizes(list_file: str, width: int, height: int, classes: int) -> tuple[np.ndarray, list[int]]:
    """Label box sizes (n, 2) in network pixels of every image of `list_file`, and boxes per class."""
    from .datasets import label_path_for, read_box_labels, read_list

    sizes, counts = [], np.zeros(classes, np.int64)
    for p in read_list(list_file):
        lp = label_path_for(p)
        if not os.path.isfile(lp):
            continue
        b = read_box_labels(lp, classes)[0]
        sizes.append(b[:, 2:4].astype(np.float64) * [width, height])
        np.add.at(counts, b[:, 4].astype(np.int64), 1)
    boxes = np.concatenate(sizes) if sizes else np.zeros((0, 2))
    if len(boxes) == 0:
        raise DataError(f"{list_file}: no label boxes found (labels/ beside images/, one .txt per image)")
    return boxes, counts.tolist()


def _kmeans_pp(boxes: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    centres = [boxes[rng.integers(len(boxes))]]
    for _ in range(1, k):
        d = 1 - shape_iou(boxes, np.array(centres)).max(axis=1)
        p = d * d
        total = p.sum()
        idx = rng.choice(len(boxes), p=p / total) if total > 0 else rng.integers(len(boxes))
        centres.append(boxes[idx])
    return np.array(centres, np.float64)


def kmeans_iou(boxes: np.ndarray, k: int, seed: int = 0, restarts: int = 10, iterations: int = 1000) -> np.ndarray:
    """The best (highest average IoU) of `restarts` k-means++ runs with 1 − IoU distance; (k, 2)."""
    if len(boxes) < k:
        raise DataError(f"{len(boxes)} label boxes cannot make {k} anchors")
    rng = np.random.default_rng(seed)
    best, best_iou = None, -1.0
    for _ in range(restarts):
        c = _kmeans_pp(boxes, k, rng)
        assign = None
        for _ in range(iterations):
            new = shape_iou(boxes, c).argmax(axis=1)
            if assign is not None and np.array_equal(new, assign):
                break
            assign = new
            for j in range(k):
                members = boxes[assign == j]
                if len(members):
                    c[j] = members.mean(axis=0)
        score = average_iou(boxes, c)
        if score > best_iou:
            best, best_iou = c.copy(), score
    return best


def calc_anchors(list_file: str, num: int, width: int, height: int, classes: int, seed: int = 0,
                 restarts: int = 10) -> AnchorResult:
    """`darkpy anchors`: see the module doc."""
    boxes, counts = read_label_sizes(list_file, width, height, classes)
    c = np.maximum(np.round(kmeans_iou(boxes, num, seed, restarts)), 1)
    c = c[np.argsort(c[:, 0] * c[:, 1], kind="mergesort")]
    return AnchorResult(c, average_iou(boxes, c), len(boxes), counts)


def write_anchors(cfg_path: str, result: AnchorResult) -> list[int]:
    """Put the anchors into every [yolo] section of the cfg (line-preserving edit); each [yolo]'s
    `num` must equal the number of anchors. Returns the edited sections' layer indices."""
    from .cfg import load_cfg

    doc = load_cfg(cfg_path)
    heads = [s for s in doc.layers if s.kind == "yolo"]
    if not heads:
        raise DataError(f"{cfg_path}: no [yolo] section to write anchors into")
    for s in heads:
        num = s.options.get("num")
        n = int(num.value) if num is not None else 1
        if n != len(result.anchors):
            raise DataError(f"{cfg_path}:{num.line if num else s.line}: [yolo] (layer {s.index}) has num={n}, "
                            f"but {len(result.anchors)} anchors were computed (pass --num {n})")
        doc.set(f"{s.index}.anchors", result.anchors_text())
    doc.write(cfg_path)
    return [s.index for s in heads]
