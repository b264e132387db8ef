"""`[region]`: the YOLOv2 detection head (spec §2.22, §8.4).

Layout as `[yolo]`: per anchor, planes `[x, y, w, h, obj, cls_0 .. cls_{C-1}]` of `h×w` values. Anchors
are in GRID units: `bw = e^{tw}·anchor_w / lw`.

Forward: logistic on x, y and obj; the classes get a softmax over the C entries of each cell and
anchor (`softmax=1`) or a logistic each (`softmax=0`); w, h stay raw.

Training (truth given; `truths = max·5`, rows `[x, y, w, h, class]` ending at the first x == 0):
1. every slot: obj delta `noobject_scale·(0 - obj)`, zeroed when its predicted box overlaps a truth
   by more than `thresh`; while fewer than 12800 images have been seen, every slot's box is also
   pulled towards its anchor prior (centre of the cell, anchor size) with scale .01;
2. every truth: at its cell, the anchor whose box (the predicted one, or the anchor itself with
   `bias_match=1`) best matches the truth's shape gets box deltas with scale
   `coord_scale·(2 - w·h)`, obj delta `object_scale·(1 - obj)` (target = the prediction's IoU with
   `rescore=1`) and class deltas `class_scale·(t - p)`.
Deltas of x, y and obj are kept in the activated space, as Darknet stores them; backward applies the
logistic derivative to those three (Darknet's GPU path) and passes w, h and class deltas unchanged (a
softmax cross-entropy gradient). So the deltas are the negative gradient of ½·scale·(t - p)² on x, y,
obj, w, h plus `class_scale`·cross-entropy on the classes. `cost = Σ δ²`.

Not copied from Darknet: its CPU backward is empty (`# darknet:` nothing reaches the layers below on
the CPU); `background=1` and `coords > 4` (instance masks) are refused at load time instead of
half-supported. `tree=` (YOLO9000's softmax tree) builds layers/tree.py's TreeRegionLayer.
"""
from __future__ import annotations

import math

import numpy as np

from ..kernels import jit
from ..kernels.boxes import box_iou
from .base import Layer, State, register
from .yolo import BoxHead, _truth_cell, _valid_truth, read_class_map, truth_boxes

_IOU, _CAT, _OBJ, _ANYOBJ, _R50, _COUNT, _BAD = range(7)


@jit
def _logistic(x):
    return 1.0 / (1.0 + math.exp(-x))


@jit
def region_activate(out, x, n, classes, hw, softmax):
    """out = the head's activations of x (see module doc)."""
    # out, x: (batch, n*(5+classes)*hw)
    entries = 5 + classes
    for b in range(x.shape[0]):
        for a in range(n):
            base = a * entries * hw
            for k in range(base, base + 2 * hw):
                out[b, k] = _logistic(x[b, k])
            for k in range(base + 2 * hw, base + 4 * hw):
                out[b, k] = x[b, k]
            for k in range(base + 4 * hw, base + 5 * hw):
                out[b, k] = _logistic(x[b, k])
            cbase = base + 5 * hw
            if not softmax:
                for k in range(cbase, cbase + classes * hw):
                    out[b, k] = _logistic(x[b, k])
                continue
            for loc in range(hw):
                largest = x[b, cbase + loc]
                for c in range(1, classes):
                    largest = max(largest, x[b, cbase + c * hw + loc])
                total = 0.0
                for c in range(classes):
                    e = math.exp(x[b, cbase + c * hw + loc] - largest)
                    total += e
                    out[b, cbase + c * hw + loc] = e
                for c in range(classes):
                    out[b, cbase + c * hw + loc] /= total


@jit
def _pred_box(out, b, idx, hw, i, j, lw, lh, aw, ah):
    return ((i + out[b, idx]) / lw, (j + out[b, idx + hw]) / lh,
            math.exp(out[b, idx + 2 * hw]) * aw / lw, math.exp(out[b, idx + 3 * hw]) * ah / lh)


@jit
def _box_delta(delta, out, b, idx, hw, i, j, lw, lh, aw, ah, tx, ty, tw, th, scale):
    """Box deltas (x, y in activated space, w, h raw) of one slot; returns the prediction's IoU."""
    px, py, pw, ph = _pred_box(out, b, idx, hw, i, j, lw, lh, aw, ah)
    iou = box_iou(px, py, pw, ph, tx, ty, tw, th)
    delta[b, idx] = scale * (tx * lw - i - out[b, idx])
    delta[b, idx + hw] = scale * (ty * lh - j - out[b, idx + hw])
    delta[b, idx + 2 * hw] = scale * (math.log(tw * lw / aw) - out[b, idx + 2 * hw])
    delta[b, idx + 3 * hw] = scale * (math.log(th * lh / ah) - out[b, idx + 3 * hw])
    return iou


@jit
def region_delta(delta, stats, out, truth, biases, class_map, lw, lh, classes, max_boxes, thresh,
                 coord_scale, object_scale, noobject_scale, class_scale, rescore, bias_match, softmax,
                 warmup):
    """Darknet's region training deltas (module doc) into `delta` (zeroed by the caller)."""
    # delta, out: (batch, n*(5+classes)*lw*lh); truth: (batch, >= 5*max_boxes); biases: (2*n,)
    # class_map: (>= classes,); stats: (7,) float64 sums
    n = biases.shape[0] // 2
    hw = lw * lh
    entries = 5 + classes
    for b in range(out.shape[0]):
        for j in range(lh):
            for i in range(lw):
                for a in range(n):
                    idx = a * entries * hw + j * lw + i
                    aw, ah = biases[2 * a], biases[2 * a + 1]
                    px, py, pw, ph = _pred_box(out, b, idx, hw, i, j, lw, lh, aw, ah)
                    best_iou = 0.0
                    for t in range(max_boxes):
                        v = _valid_truth(truth, b, t, classes)
                        if v < 0:
                            break
                        if v == 0:
                            continue
                        iou = box_iou(px, py, pw, ph, truth[b, 5 * t], truth[b, 5 * t + 1],
                                      truth[b, 5 * t + 2], truth[b, 5 * t + 3])
                        best_iou = max(best_iou, iou)
                    oidx = idx + 4 * hw
                    stats[_ANYOBJ] += out[b, oidx]
                    delta[b, oidx] = noobject_scale * (0.0 - out[b, oidx])
                    if best_iou > thresh:
                        delta[b, oidx] = 0.0
                    if warmup:
                        _box_delta(delta, out, b, idx, hw, i, j, lw, lh, aw, ah, (i + 0.5) / lw,
                                   (j + 0.5) / lh, aw / lw, ah / lh, 0.01)
        for t in range(max_boxes):
            v = _valid_truth(truth, b, t, classes)
            if v < 0:
                break
            if v == 0:
                stats[_BAD] += 1
                continue
            tx, ty, tw, th, cls, i, j = _truth_cell(truth, b, t, class_map, lw, lh)
            best_iou = 0.0
            best_n = 0
            for a in range(n):
                idx = a * entries * hw + j * lw + i
                if bias_match:
                    pw, ph = biases[2 * a] / lw, biases[2 * a + 1] / lh
                else:
                    _, _, pw, ph = _pred_box(out, b, idx, hw, i, j, lw, lh, biases[2 * a], biases[2 * a + 1])
                iou = box_iou(0.0, 0.0, pw, ph, 0.0, 0.0, tw, th)
                if iou > best_iou:
                    best_iou = iou
                    best_n = a
            idx = best_n * entries * hw + j * lw + i
            iou = _box_delta(delta, out, b, idx, hw, i, j, lw, lh, biases[2 * best_n], biases[2 * best_n + 1],
                             tx, ty, tw, th, coord_scale * (2 - tw * th))
            stats[_IOU] += iou
            stats[_COUNT] += 1
            if iou > 0.5:
                stats[_R50] += 1
            oidx = idx + 4 * hw
            stats[_OBJ] += out[b, oidx]
            target = iou if rescore else 1.0
            delta[b, oidx] = object_scale * (target - out[b, oidx])
            cidx = idx + 5 * hw
            stats[_CAT] += out[b, cidx + cls * hw]
            if delta[b, cidx] != 0 and not softmax:   # darknet: a second truth on this slot
                delta[b, cidx + cls * hw] = class_scale * (1.0 - out[b, cidx + cls * hw])
                continue
            for c in range(classes):
                delta[b, cidx + c * hw] = class_scale * ((1.0 if c == cls else 0.0) - out[b, cidx + c * hw])


@jit
def region_backward(prev_delta, delta, out, n, entries, hw):
    """prev_delta += delta, with the logistic derivative applied to the x, y and obj entries."""
    # prev_delta, delta, out: (batch, n*entries*hw)
    for b in range(delta.shape[0]):
        for a in range(n):
            base = a * entries * hw
            for k in range(base, base + entries * hw):
                e = (k - base) // hw
                if e == 0 or e == 1 or e == 4:
                    prev_delta[b, k] += delta[b, k] * out[b, k] * (1.0 - out[b, k])
                else:
                    prev_delta[b, k] += delta[b, k]


@register
class RegionLayer(BoxHead, Layer):
    """The YOLOv2 head. See the module docstring."""

    kind = "region"
    has_cost = True
    needs_image = True
    is_detection_head = True
    letterbox_boxes = True

    def __init__(self, index, in_shape, *, classes, biases, max_boxes=30, dtype=np.float32):
        super().__init__(index, in_shape, in_shape, dtype)
        self.classes = classes
        self.biases = np.asarray(biases, np.float64)
        self.n = len(biases) // 2
        self.max_boxes = max_boxes
        self.coords = 4
        self.softmax = False
        self.jitter = 0.2
        self.rescore = False
        self.thresh = 0.5
        self.bias_match = False
        self.random = 0
        self.coord_scale = self.object_scale = self.noobject_scale = self.class_scale = 1.0
        self.class_map = np.arange(classes, dtype=np.int64)
        self.stats: dict[str, float] = {}
        self._stats = np.zeros(7, np.float64)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx):
        coords = sec.get_int("coords", 4)
        classes = sec.get_int("classes", 20)
        num = sec.get_int("num", 1)
        if coords != 4:
            raise sec.error(f"coords={coords} (instance masks) is not supported by darkpy; use coords=4", "coords")
        if classes < 1 or num < 1:
            raise sec.error(f"classes and num must be >= 1 (got classes={classes}, num={num})",
                            "classes" if classes < 1 else "num")
        if cls is RegionLayer and sec.get_str("tree", None) not in (None, "0"):
            from .tree import TreeRegionLayer      # YOLO9000's softmax tree (layers/tree.py)
            return TreeRegionLayer.from_cfg(sec, in_shape, ctx)
        if sec.get_str("background", None) not in (None, "0"):
            raise sec.error("background=1 is not supported by darkpy", "background")
        anchors = sec.get_float_list("anchors", [0.5] * (2 * num))
        if len(anchors) < 2 * num:
            raise sec.error(f"needs 2*num = {2 * num} values (w,h per anchor), got {len(anchors)}", "anchors")
        if any(v <= 0 for v in anchors[:2 * num]):
            raise sec.error("anchor sizes must be > 0", "anchors")
        c, h, w = in_shape
        need = num * (classes + 5)
        if c != need:
            raise sec.error(f"the layer before must output num*(classes+coords+1) = {num}*({classes}+5) = "
                            f"{need} channels (set filters={need} in the last [convolutional]); it has {c}")
        layer = cls(sec.index, in_shape, classes=classes, biases=anchors[:2 * num],
                    max_boxes=sec.get_int("max", 30), dtype=ctx.dtype)
        if layer.max_boxes < 1:
            raise sec.error(f"must be >= 1 (got {layer.max_boxes})", "max")
        layer.softmax = sec.get_bool("softmax", False)
        layer.jitter = sec.get_float("jitter", 0.2)
        layer.rescore = sec.get_bool("rescore", False)
        layer.thresh = sec.get_float("thresh", 0.5)
        layer.bias_match = sec.get_bool("bias_match", False)
        layer.random = sec.get_int("random", 0)
        for key in ("coord_scale", "object_scale", "noobject_scale", "class_scale"):
            setattr(layer, key, sec.get_float(key, 1.0))
        for key in ("log", "sqrt", "classfix", "absolute", "mask_scale"):   # read by darknet, unused
            sec.get_str(key, None)
        cmap = read_class_map(sec, classes)
        if cmap is not None:
            layer.class_map = cmap
        return layer

    @property
    def entries(self) -> int:
        return self.classes + 5

    def summary(self) -> str:
        return "detection"

    def forward(self, s: State) -> None:
        c, h, w = self.out_shape
        x = s.input.reshape(self.batch, -1)
        out = self.output.reshape(self.batch, -1)
        region_activate(out, x, self.n, self.classes, h * w, self.softmax)
        self.delta.fill(0)
        if s.truth is None:
            self.cost = None
            return
        self.allocate_training()         # delta and loss: sized by the first forward with truth
        self._stats.fill(0)
        region_delta(self.delta.reshape(self.batch, -1), self._stats, out, s.truth, self.biases, self.class_map,
                     w, h, self.classes, truth_boxes(self, s.truth), self.thresh, self.coord_scale,
                     self.object_scale, self.noobject_scale, self.class_scale, self.rescore, self.bias_match,
                     self.softmax, s.seen < 12800)
        np.square(self.delta, out=self.loss)
        self.cost = float(self.loss.sum())
        st = self._stats
        count = max(st[_COUNT], 1.0)
        self.stats = {"avg_iou": st[_IOU] / count, "class": st[_CAT] / count, "obj": st[_OBJ] / count,
                      "no_obj": st[_ANYOBJ] / (self.batch * self.n * h * w), "recall50": st[_R50] / count,
                      "count": int(st[_COUNT]), "bad_truths": int(st[_BAD])}

    def stats_line(self) -> str:
        st = self.stats
        return (f"Region Avg IOU: {st['avg_iou']:f}, Class: {st['class']:f}, Obj: {st['obj']:f}, "
                f"No Obj: {st['no_obj']:f}, Avg Recall: {st['recall50']:f},  count: {st['count']}")

    def backward(self, s: State) -> None:
        # darknet: the CPU backward_region_layer is empty; this is its GPU version
        if s.delta is not None:
            c, h, w = self.out_shape
            region_backward(s.delta.reshape(self.batch, -1), self.delta.reshape(self.batch, -1),
                            self.output.reshape(self.batch, -1), self.n, self.entries, h * w)

    def get_detections(self, b: int, thresh: float, net_w: int, net_h: int):
        """Every slot of item `b` (w·h·n boxes, anchor-major as Darknet), relative to the net input.

        Objectness is zeroed where not above `thresh`; `probs = obj·p_class`, zeroed where not above."""
        c, h, w = self.out_shape
        out = self.output[b].reshape(self.n, self.entries, h, w).astype(np.float64)
        rows, cols = np.divmod(np.arange(h * w), w)
        anch = np.repeat(np.arange(self.n), h * w)
        rows, cols = np.tile(rows, self.n), np.tile(cols, self.n)
        boxes = np.stack([(cols + out[anch, 0, rows, cols]) / w, (rows + out[anch, 1, rows, cols]) / h,
                          np.exp(out[anch, 2, rows, cols]) * self.biases[2 * anch] / w,
                          np.exp(out[anch, 3, rows, cols]) * self.biases[2 * anch + 1] / h], axis=1)
        obj = out[anch, 4, rows, cols]
        obj = np.where(obj > thresh, obj, 0.0)
        probs = obj[:, None] * out[anch, 5:, rows, cols]
        probs[probs <= thresh] = 0
        return boxes, obj, probs
