"""Detection on top of the heads: decoding boxes, NMS, mAP, and drawing predictions.

Boxes are `(x, y, w, h)` (centre and size) relative to the image, as in Darknet's label files.

- `network_boxes`: Darknet's `get_network_boxes` for one image of the batch — every [yolo], [region]
  and [detection] layer's candidates, mapped back through the letterbox (yolo and region only, as
  Darknet).
- `do_nms_sort`: Darknet's per-class NMS (a box's probability for class k is zeroed when a higher
  one of class k overlaps it by more than the threshold); `nms_kind=diounms` uses the fork's
  DIoU-NMS.
- `detect_image` / `draw_detections`: what `darkpy detect` prints and draws.
- `compute_map` / `evaluate_map`: the fork's `detector map`: per class AP at an IoU threshold
  (VOC 11-point, all-point area as VOC2010+, and COCO's 101-point interpolation), and precision,
  recall, F1, TP/FP/FN and average IoU at a confidence threshold (0.25).
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
    from .images import draw_box, draw_label
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


# -- mAP ---------------------------------------------------------------------------------------------------

@dataclass
class ClassAP:
    class_id: int
    name: str
    truths: int
    tp: int                 # true positives over every ranked detection
    fp: int
    ap11: float             # VOC2007 11-point interpolated AP
    ap_all: float           # VOC2010+ area under the interpolated curve (every point)
    ap101: float            # COCO 101-point interpolated AP


@dataclass
class MapResult:
    classes: list[ClassAP]
    iou_thresh: float
    conf_thresh: float
    images: int
    tp: int                 # at conf_thresh
    fp: int
    fn: int
    avg_iou: float          # mean IoU of the true positives at conf_thresh
    map11: float
    map_all: float
    map101: float

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def map(self) -> float:
        """The headline mAP: the all-point area (the fork's default, `-points 0`)."""
        return self.map_all

    def format(self) -> str:
        """The report `darkpy map` prints (the fork's detector map lines, both interpolations)."""
        lines = [f"detections on {self.images} images, IoU threshold {self.iou_thresh:.2f}", ""]
        lines.append(f"{'class':>5}  {'name':<20} {'truths':>6} {'TP':>6} {'FP':>6}  "
                     f"{'AP11':>7} {'AP(all)':>7} {'AP101':>7}")
        for c in self.classes:
            lines.append(f"{c.class_id:>5}  {c.name[:20]:<20} {c.truths:>6} {c.tp:>6} {c.fp:>6}  "
                         f"{_pct(c.ap11, c.truths)} {_pct(c.ap_all, c.truths)} {_pct(c.ap101, c.truths)}")
        t = self.conf_thresh
        lines += ["", f"for conf_thresh = {t:.2f}, precision = {self.precision:.2f}, recall = {self.recall:.2f}, "
                      f"F1-score = {self.f1:.2f}",
                  f"for conf_thresh = {t:.2f}, TP = {self.tp}, FP = {self.fp}, FN = {self.fn}, "
                  f"average IoU = {100 * self.avg_iou:.2f} %", "",
                  f"mean average precision (mAP@{self.iou_thresh:.2f}), VOC 11-point = {self.map11:.6f}, "
                  f"or {100 * self.map11:.2f} %",
                  f"mean average precision (mAP@{self.iou_thresh:.2f}), all-point    = {self.map_all:.6f}, "
                  f"or {100 * self.map_all:.2f} %",
                  f"mean average precision (mAP@{self.iou_thresh:.2f}), COCO 101-point = {self.map101:.6f}, "
                  f"or {100 * self.map101:.2f} %"]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"images": self.images, "iou_thresh": self.iou_thresh, "conf_thresh": self.conf_thresh,
                "map11": self.map11, "map_all": self.map_all, "map101": self.map101,
                "precision": self.precision, "recall": self.recall, "f1": self.f1, "tp": self.tp,
                "fp": self.fp, "fn": self.fn, "avg_iou": self.avg_iou,
                "classes": [vars(c) for c in self.classes]}


def _pct(ap: float, truths: int) -> str:
    return f"{100 * ap:6.2f}%" if truths else "    n/a"


def interpolated_ap(precision: np.ndarray, recall: np.ndarray, points: int) -> float:
    """AP from a ranked list's precision/recall: `points` > 0 averages, at recall levels
    0, 1/(points-1), ..., 1, the best precision at that recall or beyond (VOC2007: 11, COCO: 101);
    `points` = 0 is the exact area under that interpolated curve (VOC2010+)."""
    if len(precision) == 0:
        return 0.0
    if points > 0:
        total = 0.0
        for k in range(points):
            r = k / (points - 1)
            ok = recall >= r - 1e-12
            total += precision[ok].max() if ok.any() else 0.0
        return total / points
    mrec = np.concatenate([[0.0], recall, [1.0]])
    mpre = np.concatenate([[0.0], precision, [0.0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    steps = np.flatnonzero(mrec[1:] != mrec[:-1])
    return float(np.sum((mrec[steps + 1] - mrec[steps]) * mpre[steps + 1]))


def compute_map(detections: Sequence[Boxes], truths: Sequence[np.ndarray], classes: int,
                iou_thresh: float = 0.5, conf_thresh: float = 0.25,
                names: Sequence[str] | None = None) -> MapResult:
    """mAP of per-image detections (after NMS) against per-image truth rows [x, y, w, h, class].

    Every (box, class) with probability > 0 is a ranked detection of that class. It matches the truth
    of the same class it overlaps most, if that IoU is above `iou_thresh`; in rank order (highest
    probability first, over all images), the first detection of a truth is a true positive and any
    other a false positive. Classes without truths are left out of the means (shown as n/a)."""
    ranked: list[list[tuple[float, int, int]]] = [[] for _ in range(classes)]  # (prob, image, truth or -1)
    n_truth = np.zeros(classes, np.int64)
    tp_t = fp_t = 0
    iou_sum = 0.0
    total_truths = 0
    for img, (dets, truth) in enumerate(zip(detections, truths)):
        truth = np.asarray(truth, np.float64).reshape(-1, 5)
        tcls = truth[:, 4].astype(np.int64)
        np.add.at(n_truth, tcls[(tcls >= 0) & (tcls < classes)], 1)
        total_truths += len(truth)
        pairs = []
        for i in range(len(dets)):
            for c in np.flatnonzero(dets.probs[i] > 0):
                best, best_iou = -1, 0.0
                for t in np.flatnonzero(tcls == c):
                    iou = box_iou(*dets.boxes[i], *truth[t, :4])
                    if iou > iou_thresh and iou > best_iou:
                        best, best_iou = int(t), iou
                prob = float(dets.probs[i, c])
                ranked[c].append((prob, img, best))
                pairs.append((prob, best, best_iou))
        used: set[int] = set()
        for prob, best, best_iou in sorted(pairs, key=lambda p: -p[0]):
            if prob <= conf_thresh:
                continue
            if best >= 0 and best not in used:
                used.add(best)
                tp_t += 1
                iou_sum += best_iou
            else:
                fp_t += 1
    per_class = []
    for c in range(classes):
        items = sorted(ranked[c], key=lambda r: -r[0])
        seen: set[tuple[int, int]] = set()
        hits = np.zeros(len(items), bool)
        for k, (_, img, t) in enumerate(items):
            if t >= 0 and (img, t) not in seen:
                seen.add((img, t))
                hits[k] = True
        tp = np.cumsum(hits)
        fp = np.cumsum(~hits)
        precision = tp / np.maximum(tp + fp, 1)
        recall = tp / n_truth[c] if n_truth[c] else np.zeros(len(items))
        per_class.append(ClassAP(c, _name(names, c), int(n_truth[c]), int(hits.sum()), int((~hits).sum()),
                                 interpolated_ap(precision, recall, 11), interpolated_ap(precision, recall, 0),
                                 interpolated_ap(precision, recall, 101)))
    scored = [c for c in per_class if c.truths]

    def mean(key):
        return float(np.mean([getattr(c, key) for c in scored])) if scored else 0.0

    return MapResult(per_class, iou_thresh, conf_thresh, len(detections), tp_t, fp_t, total_truths - tp_t,
                     iou_sum / tp_t if tp_t else 0.0, mean("ap11"), mean("ap_all"), mean("ap101"))


def evaluate_map(net, data_cfg, iou: float = 0.5, thresh: float = 0.005, nms: float = 0.45,
                 conf_thresh: float = 0.25, letterbox: bool = True, paths: Sequence[str] | None = None,
                 limit: int | None = None, progress: Callable[[int, int], None] | None = None) -> MapResult:
    """mAP of `net` on the `valid` list of `data_cfg` (a .data path or a datasets.DataConfig), or on
    `paths`. Images are fitted to the net's current input size and run `net.batch` at a time (the
    net's batch and weights are left as they are). Labels come from Darknet's label paths;
    malformed label lines are skipped (`datasets.read_box_labels`). `progress(done, total)` is called
    after each batch."""
    from .datasets import BatchLoader, label_path_for, read_box_labels, read_data_file, read_list
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
    classes = detection_heads(net)[-1].classes
    names = dc.names or None
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
            lp = label_path_for(p)
            truths.append(read_box_labels(lp, classes)[0] if os.path.isfile(lp) else np.zeros((0, 5)))
        return x, sizes, truths

    all_dets: list[Boxes] = []
    all_truths: list[np.ndarray] = []
    chunks = (len(paths) + B - 1) // B
    with BatchLoader(load) as loader:
        for k in range(chunks):
            x, sizes, truths = loader.get(k)
            net.forward(x)
            for i, (iw, ih) in enumerate(sizes):
                dets = network_boxes(net, iw, ih, thresh, i, letterbox)
                all_dets.append(do_nms_sort(dets, nms, kind, beta) if nms else dets)
            all_truths += truths
            if progress is not None:
                progress(min((k + 1) * B, len(paths)), len(paths))
    return compute_map(all_dets, all_truths, classes, iou, conf_thresh, names)
