"""Detection metrics: the fork's `detector map` (`darknet`), py-faster-rcnn's `voc_eval.py` (`voc`) and
pycocotools' COCOeval for boxes (`coco`), on the same per-image detections and truths.

Inputs, for every image: the candidate boxes after NMS (`detect.Boxes`: image-relative centre/size,
`probs` (N, C)), the truth rows `[x, y, w, h, class]` (image-relative), optionally which truths are
*difficult* (a boolean per row) and the image's pixel size.

Every (box, class) with probability > 0 is a ranked detection of that class, in box-major order
(Darknet's loops; it decides ties).

- `darknet` (AlexeyAB's validate_detector_map): a detection matches the same-class truth it overlaps
  most among those with IoU > threshold; in rank order the first detection of a truth is a TP, any
  other an FP. AP: 11-point, all-point (area) and 101-point interpolation of that curve, mean over the
  classes that have truths. A detection that matches no truth but overlaps a difficult truth by more
  than the threshold is dropped from the ranking. Precision, recall, F1, TP/FP/FN at `conf_thresh`
  follow Darknet's per-image rules (box order; a truth already claimed by an earlier detection of the
  image, at any confidence, makes an FP). Darknet's average IoU divides by TP + FP (`darknet_avg_iou`);
  `avg_iou` is the mean IoU of the true positives.
- `voc` (voc_eval.py, with a stable sort by confidence): a detection takes the truth of its class it
  overlaps most (difficult ones included); IoU > threshold: a difficult truth makes it neither TP nor
  FP, a taken truth an FP; else an FP. Recall counts non-difficult truths. With image sizes the IoU is
  VOC's pixel one (+1 on widths, boxes as Darknet's comp4 files and voc_label.py's labels give them).
  AP: VOC2007's 11-point on `np.arange(0, 1.1, 0.1)` and the VOC2010+ area.
- `coco` (COCOeval, iouType="bbox"): boxes in pixels (detections clipped to the image, as Darknet's
  coco results); per image and class the detections are sorted by score and cut to maxDets=100; each
  takes, greedily by score, the unmatched truth with the highest IoU >= threshold (non-ignored truths
  first; a detection that can match a non-ignored truth never takes an ignored one); difficult truths
  are COCO's crowd regions (ignored, IoU over the detection's area, may absorb several detections).
  A truth's area (for small/medium/large) is its box's, in pixels (label files have no masks).
  AP averages the 101 recall points over IoU .50:.05:.95 and the classes with truths; AP50, AP75,
  AP small/medium/large (areas < 32², < 96², more), AR@1/10/100 and AR by size, as COCOeval.summarize.
  The recall and IoU grids are pycocotools' own `np.linspace` values (their float artefacts included).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .metrics_coco import (COCO_AREAS, COCO_IDS, COCO_IOUS, COCO_MAX_DETS, COCO_RECALLS,  # noqa: F401
                           CocoEval, coco_evaluate)

METRICS = ("darknet", "voc", "coco")

def _name(names, c):
    return names[c] if names and 0 <= c < len(names) else str(c)


# -- results -----------------------------------------------------------------------------------------------

@dataclass
class ClassAP:
    class_id: int
    name: str
    truths: int
    tp: int                 # true positives over every ranked detection
    fp: int
    ap11: float             # 11-point interpolated AP (voc: on np.arange(0, 1.1, .1))
    ap_all: float           # area under the interpolated curve (every point)
    ap101: float            # 101-point interpolated AP (coco: COCO's AP@[.5:.95] for the class)


@dataclass
class MapResult:
    classes: list[ClassAP]
    iou_thresh: float
    conf_thresh: float
    images: int
    tp: int                 # at conf_thresh (Darknet's rules)
    fp: int
    fn: int
    avg_iou: float          # mean IoU of the true positives at conf_thresh
    map11: float
    map_all: float
    map101: float
    metric: str = "darknet"
    darknet_avg_iou: float = 0.0   # Darknet's printed average IoU: the TPs' IoU sum over TP + FP
    coco: dict | None = None       # metric coco: COCOeval's 12 summary numbers

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
        """The headline number: the all-point area (the fork's `-points 0`); coco: AP@[.5:.95]."""
        return self.coco["AP"] if self.coco is not None else self.map_all

    def format(self) -> str:
        if self.coco is not None:
            return format_coco(self)
        lines = [f"{self.metric} rules: detections on {self.images} images, IoU threshold {self.iou_thresh:.2f}", ""]
        lines.append(f"{'class':>5}  {'name':<20} {'truths':>6} {'TP':>6} {'FP':>6}  "
                     f"{'AP11':>7} {'AP(all)':>7} {'AP101':>7}")
        for c in self.classes:
            lines.append(f"{c.class_id:>5}  {c.name[:20]:<20} {c.truths:>6} {c.tp:>6} {c.fp:>6}  "
                         f"{_pct(c.ap11, c.truths)} {_pct(c.ap_all, c.truths)} {_pct(c.ap101, c.truths)}")
        t = self.conf_thresh
        lines += ["", f"for conf_thresh = {t:.2f}, precision = {self.precision:.2f}, recall = {self.recall:.2f}, "
                      f"F1-score = {self.f1:.2f}",
                  f"for conf_thresh = {t:.2f}, TP = {self.tp}, FP = {self.fp}, FN = {self.fn}, "
                  f"average IoU = {100 * self.darknet_avg_iou:.2f} % (Darknet's: over TP + FP; "
                  f"{100 * self.avg_iou:.2f} % over TP)", "",
                  f"mean average precision (mAP@{self.iou_thresh:.2f}), VOC 11-point = {self.map11:.6f}, "
                  f"or {100 * self.map11:.2f} %",
                  f"mean average precision (mAP@{self.iou_thresh:.2f}), all-point    = {self.map_all:.6f}, "
                  f"or {100 * self.map_all:.2f} %",
                  f"mean average precision (mAP@{self.iou_thresh:.2f}), COCO 101-point = {self.map101:.6f}, "
                  f"or {100 * self.map101:.2f} %"]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        d = {"metric": self.metric, "images": self.images, "iou_thresh": self.iou_thresh,
             "conf_thresh": self.conf_thresh, "map11": self.map11, "map_all": self.map_all, "map101": self.map101,
             "precision": self.precision, "recall": self.recall, "f1": self.f1, "tp": self.tp,
             "fp": self.fp, "fn": self.fn, "avg_iou": self.avg_iou, "darknet_avg_iou": self.darknet_avg_iou,
             "classes": [vars(c) for c in self.classes]}
        if self.coco is not None:
            d["coco"] = self.coco
        return d


def _pct(ap: float, truths: int) -> str:
    return f"{100 * ap:6.2f}%" if truths else "    n/a"


_COCO_LINES = (("AP", "Average Precision", "0.50:0.95", "all", 100), ("AP50", "Average Precision", "0.50", "all", 100),
               ("AP75", "Average Precision", "0.75", "all", 100),
               ("APs", "Average Precision", "0.50:0.95", "small", 100),
               ("APm", "Average Precision", "0.50:0.95", "medium", 100),
               ("APl", "Average Precision", "0.50:0.95", "large", 100),
               ("AR1", "Average Recall", "0.50:0.95", "all", 1), ("AR10", "Average Recall", "0.50:0.95", "all", 10),
               ("AR100", "Average Recall", "0.50:0.95", "all", 100),
               ("ARs", "Average Recall", "0.50:0.95", "small", 100),
               ("ARm", "Average Recall", "0.50:0.95", "medium", 100),
               ("ARl", "Average Recall", "0.50:0.95", "large", 100))


def format_coco(r: MapResult) -> str:
    """COCOeval.summarize's 12 lines, then the per-class AP@[.5:.95] and AP50."""
    lines = [f"coco rules: detections on {r.images} images", ""]
    for key, title, iou, area, md in _COCO_LINES:
        ab = "(AP)" if title.startswith("Average Precision") else "(AR)"
        lines.append(f" {title:<18} {ab} @[ IoU={iou:<9} | area={area:>6} | maxDets={md:>3} ] = {r.coco[key]:0.3f}")
    lines += ["", f"{'class':>5}  {'name':<20} {'truths':>6}  {'AP':>7} {'AP50':>7}"]
    for c in r.classes:
        lines.append(f"{c.class_id:>5}  {c.name[:20]:<20} {c.truths:>6}  {_pct(c.ap101, c.truths)} "
                     f"{_pct(c.ap_all, c.truths)}")
    return "\n".join(lines)


# -- shared pieces -------------------------------------------------------------------------------------------

def interpolated_ap(precision: np.ndarray, recall: np.ndarray, points: int) -> float:
    """AP from a ranked list's precision/recall: `points` > 0 averages, at recall levels
    0, 1/(points-1), ..., 1, the best precision at that recall or beyond (VOC2007: 11, COCO: 101);
    `points` = 0 is the exact area under that interpolated curve (VOC2010+)."""
    if len(precision) == 0:
        return 0.0
    if points > 0:
        levels = np.arange(points) / (points - 1)
        return float(_best_precision_at(precision, recall, levels - 1e-12).sum() / points)
    mrec = np.concatenate([[0.0], recall, [1.0]])
    mpre = np.concatenate([[0.0], precision, [0.0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    steps = np.flatnonzero(mrec[1:] != mrec[:-1])
    return float(np.sum((mrec[steps + 1] - mrec[steps]) * mpre[steps + 1]))


def _best_precision_at(precision, recall, levels):
    """For each level, max(precision[recall >= level]) (0 where none); recall is non-decreasing."""
    best = np.maximum.accumulate(np.concatenate([precision, [0.0]])[::-1])[::-1]    # best from rank k on
    return best[np.searchsorted(recall, levels, side="left")]


def _iou_matrix(a: np.ndarray, b: np.ndarray, plus_one: float = 0.0) -> np.ndarray:
    """IoU of corner boxes a (N, 4) x b (M, 4) [x0, y0, x1, y1]; `plus_one` is VOC's pixel +1."""
    iw = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]) + plus_one
    ih = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]) + plus_one
    inter = np.maximum(iw, 0) * np.maximum(ih, 0)
    area_a = (a[:, 2] - a[:, 0] + plus_one) * (a[:, 3] - a[:, 1] + plus_one)
    area_b = (b[:, 2] - b[:, 0] + plus_one) * (b[:, 3] - b[:, 1] + plus_one)
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _corners(xywh: np.ndarray) -> np.ndarray:
    """Centre/size rows (N, >=4) -> corners (N, 4)."""
    x, y, w, h = (xywh[:, k].astype(np.float64) for k in range(4))
    return np.stack([x - w / 2, y - h / 2, x + w / 2, y + h / 2], axis=1)


@dataclass
class _Image:
    """One image's ranked detections (box-major) and truths."""

    boxes: np.ndarray       # (N, 4) centre/size, relative
    det_box: np.ndarray     # (D,) index into boxes of each ranked detection
    det_cls: np.ndarray     # (D,)
    det_prob: np.ndarray    # (D,)
    truth: np.ndarray       # (T, 5)
    difficult: np.ndarray   # (T,) bool
    size: tuple[int, int] | None = None
    extra: dict = field(default_factory=dict)


def _images(detections, truths, classes, difficult, sizes) -> list[_Image]:
    out = []
    for k, (dets, truth) in enumerate(zip(detections, truths)):
        truth = np.asarray(truth, np.float64).reshape(-1, 5)
        ok = (truth[:, 4] >= 0) & (truth[:, 4] < classes)
        dif = (np.zeros(len(truth), bool) if difficult is None or difficult[k] is None
               else np.asarray(difficult[k], bool).reshape(-1))
        if len(dif) != len(truth):
            raise ValueError(f"image {k}: {len(dif)} difficult flags for {len(truth)} truths")
        probs = np.asarray(dets.probs, np.float64)[:, :classes]
        rows, cls = np.nonzero(probs > 0)                  # box-major, class inner: Darknet's loops
        out.append(_Image(np.asarray(dets.boxes, np.float64).reshape(-1, 4), rows, cls, probs[rows, cls],
                          truth[ok], dif[ok], None if sizes is None else tuple(sizes[k])))
    return out


def compute_map(detections: Sequence, truths: Sequence[np.ndarray], classes: int,
                iou_thresh: float = 0.5, conf_thresh: float = 0.25, names: Sequence[str] | None = None,
                metric: str = "darknet", sizes: Sequence[tuple[int, int]] | None = None,
                difficult: Sequence[np.ndarray | None] | None = None,
                iou_thresholds: Sequence[float] | None = None) -> MapResult:
    """mAP of per-image detections (after NMS) against per-image truth rows [x, y, w, h, class] under
    `metric`'s rules (module doc). `sizes` are the images' (width, height) in pixels (needed for VOC's
    pixel IoU and COCO's area ranges; without them boxes stay relative). `difficult` holds one boolean
    array per image (or None). `iou_thresholds` (coco only) replaces COCO's .50:.05:.95 grid."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (expected one of {', '.join(METRICS)})")
    imgs = _images(detections, truths, classes, difficult, sizes)
    base = _darknet_map(imgs, classes, iou_thresh, conf_thresh, names)
    if metric == "voc":
        base.classes = _voc_classes(imgs, classes, iou_thresh, names, base.classes)
        base.metric = "voc"
        _set_means(base)
    elif metric == "coco":
        _coco_from_images(base, imgs, classes, names, iou_thresholds)
    return base


def _set_means(r: MapResult) -> None:
    scored = [c for c in r.classes if c.truths]
    for key in ("ap11", "ap_all", "ap101"):
        setattr(r, "map" + key[2:], float(np.mean([getattr(c, key) for c in scored])) if scored else 0.0)


# -- darknet -----------------------------------------------------------------------------------------------

def _darknet_map(imgs: list[_Image], classes: int, iou_thresh: float, conf_thresh: float, names) -> MapResult:
    probs, cls_all, hit_all, order_img = [], [], [], []
    n_truth = np.zeros(classes, np.int64)
    tp_t = fp_t = 0
    iou_sum = 0.0
    total_truths = 0
    offset = 0
    for k, im in enumerate(imgs):
        regular, dif = im.truth[~im.difficult], im.truth[im.difficult]
        rcls, dcls = regular[:, 4].astype(np.int64), dif[:, 4].astype(np.int64)
        np.add.at(n_truth, rcls, 1)
        total_truths += len(regular)
        D = len(im.det_box)
        db = _corners(im.boxes[im.det_box]) if D else np.zeros((0, 4))
        ious = np.where(rcls[None, :] == im.det_cls[:, None], _iou_matrix(db, _corners(regular)), 0.0)
        ious = np.where(ious > iou_thresh, ious, 0.0)
        best = np.where(ious.max(axis=1, initial=0) > 0, ious.argmax(axis=1) if len(regular) else -1, -1)
        best_iou = ious.max(axis=1, initial=0)
        keep = np.ones(D, bool)
        if len(dif):
            dious = np.where(dcls[None, :] == im.det_cls[:, None], _iou_matrix(db, _corners(dif)), 0.0)
            keep = (best >= 0) | ~(dious > iou_thresh).any(axis=1)   # unmatched, on a difficult truth: dropped
        seen_truth: set[int] = set()
        for d in range(D):          # darknet: box order; a truth claimed by an earlier detection at any prob
            t = int(best[d])
            if im.det_prob[d] > conf_thresh:
                if t >= 0 and t not in seen_truth:
                    tp_t += 1
                    iou_sum += best_iou[d]
                else:
                    fp_t += 1       # darknet: a dropped (difficult) detection is still counted as an FP here
            if keep[d]:
                seen_truth.add(t)
        probs.append(im.det_prob[keep])
        cls_all.append(im.det_cls[keep])
        hit_all.append(np.where(best[keep] >= 0, best[keep] + offset, -1))
        order_img.append(np.full(int(keep.sum()), k))
        offset += len(regular)
    per_class = _ranked_aps(np.concatenate(probs) if probs else np.zeros(0),
                            np.concatenate(cls_all) if cls_all else np.zeros(0, np.int64),
                            np.concatenate(hit_all) if hit_all else np.zeros(0, np.int64), n_truth, classes, names)
    r = MapResult(per_class, iou_thresh, conf_thresh, len(imgs), tp_t, fp_t, total_truths - tp_t,
                  iou_sum / tp_t if tp_t else 0.0, 0.0, 0.0, 0.0,
                  darknet_avg_iou=iou_sum / (tp_t + fp_t) if tp_t + fp_t else 0.0)
    _set_means(r)
    return r


def _ranked_aps(prob, cls, truth_id, n_truth, classes, names) -> list[ClassAP]:
    """Per class: rank by probability (stable), first hit of a truth id is a TP; the three APs."""
    out = []
    for c in range(classes):
        sel = np.flatnonzero(cls == c)
        order = sel[np.argsort(-prob[sel], kind="mergesort")]
        tid = truth_id[order]
        hits = np.zeros(len(order), bool)
        if len(order):
            first = np.unique(tid, return_index=True)[1]
            hits[first] = True
            hits &= tid >= 0
        tp, fp = np.cumsum(hits), np.cumsum(~hits)
        precision = tp / np.maximum(tp + fp, 1)
        recall = tp / n_truth[c] if n_truth[c] else np.zeros(len(order))
        out.append(ClassAP(c, _name(names, c), int(n_truth[c]), int(hits.sum()), int((~hits).sum()),
                           interpolated_ap(precision, recall, 11), interpolated_ap(precision, recall, 0),
                           interpolated_ap(precision, recall, 101)))
    return out


# -- voc ---------------------------------------------------------------------------------------------------

def voc_corners(xywh: np.ndarray, size: tuple[int, int] | None, clip: bool) -> np.ndarray:
    """Relative centre/size boxes -> VOC pixel corners (1-based: Darknet's comp4 files, voc_label.py);
    detections are clipped to [1, w] x [1, h] as Darknet writes them. Without a size: relative corners."""
    c = _corners(xywh)
    if size is None:
        return c
    w, h = size
    c = c * np.array([w, h, w, h], np.float64) + 1.0
    if clip:
        c[:, 0] = np.maximum(c[:, 0], 1)
        c[:, 1] = np.maximum(c[:, 1], 1)
        c[:, 2] = np.minimum(c[:, 2], w)
        c[:, 3] = np.minimum(c[:, 3], h)
    return c


def voc_ap(rec: np.ndarray, prec: np.ndarray, use_07_metric: bool) -> float:
    """voc_eval.py's voc_ap: VOC2007's 11 points on np.arange(0, 1.1, 0.1), or the VOC2010+ area."""
    if use_07_metric:
        ap = 0.0
        for t in np.arange(0.0, 1.1, 0.1):
            ok = rec >= t
            ap += (prec[ok].max() if ok.any() else 0.0) / 11.0
        return float(ap)
    return interpolated_ap(prec, rec, 0)


def voc_eval_class(dets: Sequence[tuple[int, float, np.ndarray]], gts: dict[int, tuple[np.ndarray, np.ndarray]],
                   iou_thresh: float, plus_one: float) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """voc_eval.py for one class, stable sort. dets: (image, score, corners (4,)); gts: image ->
    (corners (T, 4), difficult (T,)). Returns recall, precision, npos, tp, fp."""
    npos = int(sum(int((~d).sum()) for _, d in gts.values()))
    if not dets:
        return np.zeros(0), np.zeros(0), npos, 0, 0
    scores = np.array([d[1] for d in dets])
    order = np.argsort(-scores, kind="mergesort")
    taken = {k: np.zeros(len(v[1]), bool) for k, v in gts.items()}
    tp = np.zeros(len(order))
    fp = np.zeros(len(order))
    for r, i in enumerate(order):
        img, _, box = dets[i]
        g = gts.get(img)
        if g is None or len(g[0]) == 0:
            fp[r] = 1
            continue
        ov = _iou_matrix(box[None], g[0], plus_one)[0]
        j = int(np.argmax(ov))
        if ov[j] > iou_thresh:
            if not g[1][j]:
                if not taken[img][j]:
                    tp[r] = 1
                    taken[img][j] = True
                else:
                    fp[r] = 1
        else:
            fp[r] = 1
    ctp, cfp = np.cumsum(tp), np.cumsum(fp)
    rec = ctp / npos if npos else np.zeros(len(ctp))
    prec = ctp / np.maximum(ctp + cfp, np.finfo(np.float64).eps)
    return rec, prec, npos, int(tp.sum()), int(fp.sum())


def _voc_classes(imgs, classes, iou_thresh, names, darknet_classes) -> list[ClassAP]:
    plus_one = 1.0 if all(im.size is not None for im in imgs) else 0.0
    dets = [[] for _ in range(classes)]
    gts = [dict() for _ in range(classes)]
    for k, im in enumerate(imgs):
        corners = voc_corners(im.boxes, im.size if plus_one else None, clip=True)
        for b, c, p in zip(im.det_box, im.det_cls, im.det_prob):
            dets[c].append((k, float(p), corners[b]))
        tc = voc_corners(im.truth, im.size if plus_one else None, clip=False)
        tcls = im.truth[:, 4].astype(np.int64)
        for c in np.unique(tcls):
            gts[c][k] = (tc[tcls == c], im.difficult[tcls == c])
    out = []
    for c in range(classes):
        rec, prec, npos, tp, fp = voc_eval_class(dets[c], gts[c], iou_thresh, plus_one)
        out.append(ClassAP(c, _name(names, c), npos, tp, fp, voc_ap(rec, prec, True) if npos else 0.0,
                           voc_ap(rec, prec, False) if npos else 0.0,
                           interpolated_ap(prec, rec, 101) if npos else 0.0))
    return out


# -- coco --------------------------------------------------------------------------------------------------

def coco_pixel_boxes(xywh: np.ndarray, size: tuple[int, int], clip: bool) -> np.ndarray:
    """Relative centre/size -> COCO's pixel [x, y, w, h]; `clip`: corners clipped to the image (Darknet's
    print_cocos)."""
    w, h = size
    c = _corners(xywh) * np.array([w, h, w, h], np.float64)
    if clip:
        c[:, [0, 2]] = np.clip(c[:, [0, 2]], 0, w)
        c[:, [1, 3]] = np.clip(c[:, [1, 3]], 0, h)
    return np.stack([c[:, 0], c[:, 1], c[:, 2] - c[:, 0], c[:, 3] - c[:, 1]], axis=1)


def _coco_from_images(r: MapResult, imgs: list[_Image], classes: int, names, iou_thrs) -> None:
    dt_img, dt_cls, dt_box, dt_score = [], [], [], []
    gt_img, gt_cls, gt_box, gt_crowd = [], [], [], []
    for k, im in enumerate(imgs):
        size = im.size or (1, 1)
        pix = coco_pixel_boxes(im.boxes, size, clip=True)
        dt_img.append(np.full(len(im.det_box), k))
        dt_cls.append(im.det_cls)
        dt_box.append(pix[im.det_box])
        dt_score.append(im.det_prob)
        gt_img.append(np.full(len(im.truth), k))
        gt_cls.append(im.truth[:, 4].astype(np.int64))
        gt_box.append(coco_pixel_boxes(im.truth, size, clip=False))
        gt_crowd.append(im.difficult)
    cat = np.concatenate
    ev = coco_evaluate(cat(dt_img), cat(dt_cls), cat(dt_box), cat(dt_score), cat(gt_img), cat(gt_cls),
                       cat(gt_box), cat(gt_crowd), classes=classes, iou_thrs=iou_thrs)
    r.metric = "coco"
    r.coco = ev.stats
    i50 = np.flatnonzero(np.isclose(ev.iou_thrs, 0.5, rtol=0, atol=1e-12))
    for c in r.classes:
        p = ev.precision[:, :, c.class_id, 0]
        c.truths = int(sum(int(((im.truth[:, 4] == c.class_id) & ~im.difficult).sum()) for im in imgs))
        c.ap101 = float(p.mean()) if (p > -1).all() else 0.0
        c.ap_all = float(p[i50[0]].mean()) if i50.size and (p > -1).all() else 0.0
        c.ap11 = -1.0           # not defined under COCO rules (COCO writes -1)
    r.map101 = r.coco["AP"]
    r.map_all = r.coco["AP50"]
    r.map11 = -1.0
