"""Detection on top of the heads: decoding boxes, NMS, mAP, and drawing predictions.

Boxes are `(x, y, w, h)` (centre and size) relative to the image, as in Darknet's label files.

- `network_boxes`: Darknet's `get_network_boxes` for one image of the batch — every [yolo], [region]
  and [detection] layer's candidates, mapped back through the letterbox (yolo and region only, as
  Darknet).
- `do_nms_sort`: Darknet's per-class NMS (a box's probability for class k is zeroed when a higher
  one of class k overlaps it by more than the threshold); `nms_kind=diounms` uses the fork's
  DIoU-NMS.
- `detect_image` / `draw_detections`: what `darkpy detect` prints and draws.
- `run_valid` / `evaluate_map`: the validation pass over a `valid` list and its mAP; the evaluators
  (the fork's `detector map`, voc_eval.py, COCOeval) are in metrics.py.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .errors import DarkpyError
from .kernels import jit
from .kernels.boxes import box_diou_nms, box_iou
from .layers.yolo import letterbox_correct


# -- candidate boxes ------------------------------------------------------------------------------------

@dataclass
class Boxes:
    """Candidate detections of one image, as arrays: boxes (N, 4), objectness (N,), probs (N, C)."""

    boxes: np.ndarray
    objectness: np.ndarray
    probs: np.ndarray

    def __len__(self) -> int:
        return len(self.boxes)


def detection_heads(net) -> list:
    """The net's [yolo], [region] and [detection] layers, in order; a DarkpyError if there is none."""
    heads = [layer for layer in net.layers if getattr(layer, "is_detection_head", False)]
    if not heads:
        raise DarkpyError(f"{net.file}: no [yolo], [region] or [detection] layer, so not a detector")
    return heads


def network_boxes(net, img_w: int, img_h: int, thresh: float, b: int = 0, letterbox: bool = True) -> Boxes:
    """Darknet's get_network_boxes(relative=1) for item `b` of the last forward: every head's
    candidates in layer order, image-relative. `letterbox` says how the image was fitted to the net
    (True: Darknet's letterbox, False: stretched)."""
    parts = []
    for layer in detection_heads(net):
        boxes, obj, probs = layer.get_detections(b, thresh, net.width, net.height)
        if layer.letterbox_boxes:
            letterbox_correct(boxes, img_w, img_h, net.width, net.height, letterbox)
        parts.append((boxes, obj, probs))
    classes = max(p[2].shape[1] for p in parts)
    if any(p[2].shape[1] != classes for p in parts):
        raise DarkpyError(f"{net.file}: the detection heads disagree on the number of classes")
    return Boxes(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                 np.concatenate([p[2] for p in parts]))


@jit
def _nms_sort(probs, boxes, thresh, diou, beta):
    """Per-class NMS in place: zero prob[j, k] when a higher prob[i, k] box overlaps box j."""
    # probs: (N, C); boxes: (N, 4)
    n = probs.shape[0]
    for k in range(probs.shape[1]):
        order = np.argsort(-probs[:, k], kind="mergesort")      # stable, highest first
        for a in range(n):
            i = order[a]
            if probs[i, k] == 0:     # never positive, or suppressed: suppresses nothing
                continue
            for b in range(a + 1, n):
                j = order[b]
                if probs[j, k] == 0:
                    continue
                if diou:
                    ov = box_diou_nms(boxes[i, 0], boxes[i, 1], boxes[i, 2], boxes[i, 3],
                                      boxes[j, 0], boxes[j, 1], boxes[j, 2], boxes[j, 3], beta)
                else:
                    ov = box_iou(boxes[i, 0], boxes[i, 1], boxes[i, 2], boxes[i, 3],
                                 boxes[j, 0], boxes[j, 1], boxes[j, 2], boxes[j, 3])
                if ov > thresh:
                    probs[j, k] = 0


def do_nms_sort(dets: Boxes, thresh: float, kind: str = "default", beta: float = 0.6) -> Boxes:
    """Darknet's do_nms_sort, returning the kept candidates (those with objectness > 0) with the
    suppressed probabilities zeroed. For each class k: sort by prob[k] (descending, stable), and for
    each box with prob[k] > 0 zero prob[k] of every later box overlapping it by more than `thresh`
    (IoU, or the fork's DIoU-NMS score with `kind="diounms"`)."""
    keep = dets.objectness != 0
    boxes = np.ascontiguousarray(dets.boxes[keep], np.float64)
    probs = np.ascontiguousarray(dets.probs[keep], np.float64)
    _nms_sort(probs, boxes, thresh, kind == "diounms", beta)
    return Boxes(boxes, dets.objectness[keep], probs)


# -- user-facing detections -------------------------------------------------------------------------------

@dataclass
class Detection:
    """One detected object: its box (image-relative centre and size), best class and confidence."""

    x: float
    y: float
    w: float
    h: float
    class_id: int
    confidence: float
    objectness: float
    probs: np.ndarray = field(repr=False)

    def corners(self, img_w: int, img_h: int) -> tuple[int, int, int, int]:
        """Pixel (left, top, right, bottom), clamped to the image (Darknet's draw_detections).
        The clamping happens before the conversion to int, so a huge box cannot overflow it; a
        non-finite box is a ValueError (`detect_image` drops those)."""
        if not all(math.isfinite(v) for v in (self.x, self.y, self.w, self.h)):
            raise ValueError(f"non-finite box ({self.x}, {self.y}, {self.w}, {self.h})")

        def clamp(v: float, hi: int) -> int:
            return int(min(max(v, 0.0), float(hi)))

        left = clamp((self.x - self.w / 2) * img_w, img_w - 1)
        right = clamp((self.x + self.w / 2) * img_w, img_w - 1)
        top = clamp((self.y - self.h / 2) * img_h, img_h - 1)
        bot = clamp((self.y + self.h / 2) * img_h, img_h - 1)
        return left, top, right, bot

    def classes_above(self, thresh: float) -> list[tuple[int, float]]:
        return [(int(c), float(self.probs[c])) for c in np.flatnonzero(self.probs > thresh)]

    def as_dict(self, names: Sequence[str] | None = None, img_w: int = 0, img_h: int = 0) -> dict:
        d = {"class_id": self.class_id, "name": _name(names, self.class_id),
             "confidence": round(self.confidence, 6), "objectness": round(self.objectness, 6),
             "box": {"x": self.x, "y": self.y, "w": self.w, "h": self.h}}
        if img_w and img_h:
            left, top, right, bot = self.corners(img_w, img_h)
            d["pixels"] = {"left": left, "top": top, "right": right, "bottom": bot}
        return d


def _name(names: Sequence[str] | None, c: int) -> str:
    return names[c] if names and 0 <= c < len(names) else str(c)


class Detections(list):
    """The detections of one image (a list of `Detection`), and how many candidates were dropped
    because their box or probabilities were not finite (`dropped`): barely trained or diverged
    weights give boxes of size inf (exp overflow) or NaN."""

    dropped: int = 0


def drop_non_finite(dets: Boxes) -> tuple[Boxes, int]:
    """The candidates whose box, objectness and probabilities are all finite, and how many were not."""
    ok = (np.isfinite(dets.boxes).all(axis=1) & np.isfinite(dets.objectness)
          & np.isfinite(dets.probs).all(axis=1))
    bad = int(len(ok) - ok.sum())
    if not bad:
        return dets, 0
    return Boxes(dets.boxes[ok], dets.objectness[ok], dets.probs[ok]), bad


def to_detections(dets: Boxes, thresh: float) -> list[Detection]:
    """Boxes with some class probability above `thresh`, most confident first."""
    out = []
    for i in range(len(dets)):
        c = int(np.argmax(dets.probs[i]))
        p = float(dets.probs[i, c])
        if p > thresh:
            x, y, w, h = map(float, dets.boxes[i])
            out.append(Detection(x, y, w, h, c, p, float(dets.objectness[i]), dets.probs[i].copy()))
    out.sort(key=lambda d: -d.confidence)
    return out


def nms_settings(net) -> tuple[str, float]:
    """The NMS kind and DIoU beta of the net's last head (the fork's `nms_kind`, `beta_nms`)."""
    last = detection_heads(net)[-1]
    return getattr(last, "nms_kind", "default"), getattr(last, "beta_nms", 0.6)


def prepare_image(img: np.ndarray, net, letterbox: bool = True) -> np.ndarray:
    """A (c, h, w) image in [0, 1] fitted to the net input (letterboxed, or stretched)."""
    from .images import letterbox_image, resize_image
    c, h, w = net.input_shape
    if img.shape[0] != c:
        raise ValueError(f"the image has {img.shape[0]} channels, {net.file} expects {c}")
    if img.shape[1:] == (h, w):
        return img.astype(net.dtype, copy=False)
    fit = letterbox_image if letterbox else resize_image
    return fit(img, w, h).astype(net.dtype, copy=False)


def detect_image(net, img: np.ndarray, thresh: float = 0.25, nms: float = 0.45,
                 letterbox: bool = True) -> Detections:
    """Detect objects in one `(c, h, w)` image in [0, 1] (images.load_image): forward, decode, NMS.
    Returns the detections whose best class probability is above `thresh`, most confident first;
    candidates with a non-finite box or probability are dropped first and counted in `.dropped`."""
    if net.batch != 1:
        net.set_batch(1)
    with np.errstate(over="ignore", invalid="ignore"):      # counted in `.dropped` instead
        net.forward(prepare_image(img, net, letterbox)[None])
        dets = network_boxes(net, img.shape[2], img.shape[1], thresh, 0, letterbox)
    dets, dropped = drop_non_finite(dets)
    if nms:
        dets = do_nms_sort(dets, nms, *nms_settings(net))
    out = Detections(to_detections(dets, thresh))
    out.dropped = dropped
    return out


#: Darknet's palette for class colours (get_color)
_COLORS = np.array([[1, 0, 1], [0, 0, 1], [0, 1, 1], [0, 1, 0], [1, 1, 0], [1, 0, 0]], np.float64)


def class_color(c: int, classes: int) -> tuple[float, float, float]:
    """Darknet's colour for class c of `classes` (r, g, b in [0, 1])."""
    offset = c * 123457 % max(classes, 1)

    def channel(ch: int) -> float:
        ratio = offset / max(classes, 1) * 5
        i, j = int(np.floor(ratio)), int(np.ceil(ratio))
        ratio -= i
        return float((1 - ratio) * _COLORS[i % 6][ch] + ratio * _COLORS[j % 6][ch])

    return channel(2), channel(1), channel(0)


def draw_detections(img: np.ndarray, dets: Sequence[Detection], names: Sequence[str] | None = None,
                    thresh: float = 0.0, classes: int | None = None) -> np.ndarray:
    """A copy of `img` (c, h, w) with each detection's box and a label of its classes above `thresh`
    (Darknet's draw_detections: box width .6% of the height, per-class colours)."""
    from .drawing import draw_box, draw_label
    out = np.array(img, dtype=np.float32, copy=True)
    _, h, w = out.shape
    ncls = classes or (len(names) if names else max((len(d.probs) for d in dets), default=1))
    width = max(1, int(h * 0.006))
    for d in dets:
        found = d.classes_above(thresh) or [(d.class_id, d.confidence)]
        rgb = class_color(found[0][0], ncls)
        left, top, right, bot = d.corners(w, h)
        draw_box(out, left, top, right, bot, rgb, width)
        label = ", ".join(f"{_name(names, c)} {p:.2f}" for c, p in found)
        draw_label(out, label, left, top + width, rgb)
    return out


# -- mAP (the evaluators live in metrics.py) ------------------------------------------------------------

from .metrics import ClassAP, MapResult, compute_map, interpolated_ap  # noqa: E402,F401  (re-exported)


@dataclass
class ValidRun:
    """The detections of a `valid` list: per image its path, pixel size, candidates after NMS, truths
    and difficult flags (from the .data file's `difficult=` list, Darknet's layout)."""

    paths: list[str]
    sizes: list[tuple[int, int]]
    detections: list[Boxes]
    truths: list[np.ndarray]
    difficult: list[np.ndarray]
    classes: int
    names: list[str] | None


def _labels_with_difficult(path: str, dif_path: str | None, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Truth rows of an image's label file, and those of its difficult label file (Darknet's separate
    `difficult=` list) appended with their flag set."""
    from .datasets import label_path_for, read_box_labels
    lp = label_path_for(path)
    truth = read_box_labels(lp, classes)[0] if os.path.isfile(lp) else np.zeros((0, 5), np.float32)
    dif = np.zeros((0, 5), np.float32)
    if dif_path:
        dlp = label_path_for(dif_path)
        if os.path.isfile(dlp):
            dif = read_box_labels(dlp, classes)[0]
    flags = np.r_[np.zeros(len(truth), bool), np.ones(len(dif), bool)]
    return np.concatenate([truth, dif]), flags


def difficult_list(dc) -> str | None:
    """The .data file's `difficult=` list, resolved as read_data_file resolves file keys."""
    from .dataformats import _resolve
    entry = dc.raw.get("difficult") if dc.raw else None
    return _resolve(entry, os.path.dirname(dc.path) or ".") if entry else None


def run_valid(net, data_cfg, thresh: float = 0.005, nms: float = 0.45, letterbox: bool = True,
              paths: Sequence[str] | None = None, limit: int | None = None,
              progress: Callable[[int, int], None] | None = None) -> ValidRun:
    """Run `net` over the `valid` list of `data_cfg` (a .data path or a dataformats.DataConfig), or over
    `paths`: Darknet's validation pass (candidates above `thresh`, NMS). Images are fitted to the
    net's current input size and run `net.batch` at a time (the net's batch and weights are left as
    they are). Labels come from Darknet's label paths; malformed label lines are skipped
    (`datasets.read_box_labels`). `progress(done, total)` is called after each batch."""
    from .datasets import BatchLoader, read_data_file, read_list
    from .errors import DataError
    from .images import load_image

    dc = read_data_file(os.fspath(data_cfg)) if isinstance(data_cfg, (str, os.PathLike)) else data_cfg
    if paths is None:
        if not dc.valid:
            raise DataError(f"{dc.path}: no valid= list to measure mAP on")
        paths = read_list(dc.valid)
    paths = list(paths)[:limit] if limit else list(paths)
    if not paths:
        raise DataError(f"{dc.path}: the valid list is empty")
    dif_paths: list[str | None] = [None] * len(paths)
    dif_list = difficult_list(dc)
    if dif_list:
        listed = read_list(dif_list)
        if len(listed) < len(paths):
            raise DataError(f"{dc.path}: difficult= {dif_list} lists {len(listed)} images, the valid list "
                            f"{len(paths)} (Darknet reads them side by side)")
        dif_paths = listed[:len(paths)]
    classes = detection_heads(net)[-1].classes
    kind, beta = nms_settings(net)
    B = net.batch
    c, h, w = net.input_shape

    def load(k: int):
        chunk = paths[k * B:(k + 1) * B]
        x = np.zeros((B, c, h, w), net.dtype)
        sizes, truths = [], []
        for i, p in enumerate(chunk):
            img = load_image(p, c)
            sizes.append((img.shape[2], img.shape[1]))
            x[i] = prepare_image(img, net, letterbox)
            truths.append(_labels_with_difficult(p, dif_paths[k * B + i], classes))
        return x, sizes, truths

    run = ValidRun(paths, [], [], [], [], classes, dc.names or None)
    chunks = (len(paths) + B - 1) // B
    with BatchLoader(load) as loader:
        for k in range(chunks):
            x, sizes, truths = loader.get(k)
            net.forward(x)
            for i, (iw, ih) in enumerate(sizes):
                dets = network_boxes(net, iw, ih, thresh, i, letterbox)
                run.detections.append(do_nms_sort(dets, nms, kind, beta) if nms else dets)
            run.sizes += sizes
            run.truths += [t for t, _ in truths]
            run.difficult += [f for _, f in truths]
            if progress is not None:
                progress(min((k + 1) * B, len(paths)), len(paths))
    return run


def map_of_run(run: ValidRun, iou: float = 0.5, conf_thresh: float = 0.25, metric: str = "darknet",
               iou_thresholds: Sequence[float] | None = None) -> MapResult:
    """`compute_map` on the detections of a `run_valid` pass."""
    return compute_map(run.detections, run.truths, run.classes, iou, conf_thresh, run.names, metric=metric,
                       sizes=run.sizes, difficult=run.difficult, iou_thresholds=iou_thresholds)


def evaluate_map(net, data_cfg, iou: float = 0.5, thresh: float = 0.005, nms: float = 0.45,
                 conf_thresh: float = 0.25, letterbox: bool = True, paths: Sequence[str] | None = None,
                 limit: int | None = None, progress: Callable[[int, int], None] | None = None,
                 metric: str = "darknet") -> MapResult:
    """mAP of `net` on the `valid` list of `data_cfg` (see `run_valid`) under `metric`'s rules
    (metrics.py: darknet, voc or coco)."""
    run = run_valid(net, data_cfg, thresh, nms, letterbox, paths, limit, progress)
    return map_of_run(run, iou, conf_thresh, metric)
