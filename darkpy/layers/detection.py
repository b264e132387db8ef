"""`[detection]`: the YOLOv1 detection head (spec §2.23, §8.5).

Input and output are flat, `side²·((1+coords)·num + classes)` values per item, in three blocks:
`side²×classes` class scores (cell-major), `side²×num` confidences, `side²×num×4` boxes `(x, y, w, h)`
with x, y relative to the cell and w, h to the image (their square roots with `sqrt=1`).

Forward: a copy, with a softmax over each cell's classes when `softmax=1`.

Truth: darkpy feeds every head the same `[x, y, w, h, class]` rows (`truths = max·5`, ending at the
first x == 0); the layer builds Darknet's per-cell grid from them as `fill_truth_region` does (the
first box in a cell owns it, boxes under .005 wide or high are dropped).

Training, per cell: every box's confidence gets `noobject_scale·(0 - c)`. In a cell with an object
the classes get `class_scale·(t - p)`; the responsible box (the highest IoU with the truth, or the
lowest RMSE when no box overlaps it; `forced` and `random` override the choice as in Darknet) gets
`object_scale·(1 - c)` (target: its IoU with `rescore=1`) and `coord_scale·(t - p)` on its
coordinates (square-root targets for w, h with `sqrt=1`). These are the negative gradients of
½·scale·(t - p)² on every raw entry and, with `softmax=1`, of `class_scale`·cross-entropy on the
class logits. `cost = Σ δ²`.
"""
from __future__ import annotations

import math

import numpy as np

from ..kernels import jit
from ..kernels.boxes import box_iou
from .base import Layer, State, numel, register
from .yolo import BoxHead
from .yolo import _valid_truth, truth_boxes

_IOU, _CAT, _ALLCAT, _OBJ, _ANYOBJ, _COUNT, _BAD = range(7)


@jit
def detection_activate(out, x, locations, classes, softmax):
    # out, x: (batch, inputs); the first locations*classes values are the class scores
    for b in range(x.shape[0]):
        for k in range(x.shape[1]):
            out[b, k] = x[b, k]
        if not softmax:
            continue
        for loc in range(locations):
            base = loc * classes
            largest = x[b, base]
            for c in range(1, classes):
                largest = max(largest, x[b, base + c])
            total = 0.0
            for c in range(classes):
                e = math.exp(x[b, base + c] - largest)
                total += e
                out[b, base + c] = e
            for c in range(classes):
                out[b, base + c] /= total


@jit
def fill_truth_grid(grid, stats, truth, max_boxes, side, classes):
    """Darknet's per-cell truth (fill_truth_region) from [x,y,w,h,class] rows."""
    # grid: (batch, side*side, 5+classes) rows [is_obj, one-hot classes, x, y, w, h], zeroed by the caller
    # truth: (batch, >= 5*max_boxes); stats: (7,) float64
    for b in range(grid.shape[0]):
        for t in range(max_boxes):
            v = _valid_truth(truth, b, t, classes)
            if v < 0:
                break
            if v == 0:
                stats[_BAD] += 1
                continue
            x, y, w, h = truth[b, 5 * t], truth[b, 5 * t + 1], truth[b, 5 * t + 2], truth[b, 5 * t + 3]
            if w < 0.005 or h < 0.005:
                continue
            col = min(int(x * side), side - 1)
            row = min(int(y * side), side - 1)
            cell = col + row * side
            if grid[b, cell, 0] != 0:
                continue
            grid[b, cell, 0] = 1
            grid[b, cell, 1 + int(truth[b, 5 * t + 4])] = 1
            grid[b, cell, 1 + classes] = x * side - col
            grid[b, cell, 2 + classes] = y * side - row
            grid[b, cell, 3 + classes] = w
            grid[b, cell, 4 + classes] = h


@jit
def detection_delta(delta, stats, out, grid, choice, side, n, classes, coord_scale, object_scale,
                    noobject_scale, class_scale, rescore, sqrt, forced):
    """Darknet's YOLOv1 training deltas (module doc) into `delta` (zeroed by the caller)."""
    # delta, out: (batch, inputs); grid: (batch, side*side, 5+classes); choice: (batch, side*side)
    # responsible box forced by `random` (-1: choose by IoU)
    locations = side * side
    for b in range(out.shape[0]):
        for i in range(locations):
            for j in range(n):
                p = locations * classes + i * n + j
                delta[b, p] = noobject_scale * (0.0 - out[b, p])
                stats[_ANYOBJ] += out[b, p]
            if grid[b, i, 0] == 0:
                continue
            for c in range(classes):
                t = grid[b, i, 1 + c]
                delta[b, i * classes + c] = class_scale * (t - out[b, i * classes + c])
                if t != 0:
                    stats[_CAT] += out[b, i * classes + c]
                stats[_ALLCAT] += out[b, i * classes + c]
            tx = grid[b, i, 1 + classes] / side
            ty = grid[b, i, 2 + classes] / side
            tw, th = grid[b, i, 3 + classes], grid[b, i, 4 + classes]
            best = -1
            best_iou = 0.0
            best_rmse = 20.0
            for j in range(n):
                k = locations * (classes + n) + (i * n + j) * 4
                bw, bh = out[b, k + 2], out[b, k + 3]
                if sqrt:
                    bw, bh = bw * bw, bh * bh
                bx, by = out[b, k] / side, out[b, k + 1] / side
                iou = box_iou(bx, by, bw, bh, tx, ty, tw, th)
                rmse = math.sqrt((bx - tx) ** 2 + (by - ty) ** 2 + (bw - tw) ** 2 + (bh - th) ** 2)
                if best_iou > 0 or iou > 0:
                    if iou > best_iou:
                        best_iou = iou
                        best = j
                elif rmse < best_rmse:
                    best_rmse = rmse
                    best = j
            if forced:
                best = 1 if tw * th < 0.1 else 0
            if choice[b, i] >= 0:
                best = choice[b, i]
            if best < 0:   # darknet: indexes box -1 when every RMSE is >= 20
                best = 0
            k = locations * (classes + n) + (i * n + best) * 4
            bw, bh = out[b, k + 2], out[b, k + 3]
            if sqrt:
                bw, bh = bw * bw, bh * bh
            ious = box_iou(out[b, k] / side, out[b, k + 1] / side, bw, bh, tx, ty, tw, th)
            p = locations * classes + i * n + best
            stats[_OBJ] += out[b, p]
            delta[b, p] = object_scale * ((ious if rescore else 1.0) - out[b, p])
            delta[b, k] = coord_scale * (grid[b, i, 1 + classes] - out[b, k])
            delta[b, k + 1] = coord_scale * (grid[b, i, 2 + classes] - out[b, k + 1])
            gw, gh = (math.sqrt(tw), math.sqrt(th)) if sqrt else (tw, th)
            delta[b, k + 2] = coord_scale * (gw - out[b, k + 2])
            delta[b, k + 3] = coord_scale * (gh - out[b, k + 3])
            stats[_IOU] += ious
            stats[_COUNT] += 1


@register
class DetectionLayer(BoxHead, Layer):
    """The YOLOv1 head. See the module docstring."""

    kind = "detection"
    has_cost = True
    resizable = False
    is_detection_head = True
    letterbox_boxes = False       # Darknet does not correct YOLOv1 boxes for a letterbox

    def __init__(self, index, in_shape, *, classes, num, side, max_boxes=90, dtype=np.float32):
        inputs = numel(in_shape)
        super().__init__(index, in_shape, (inputs,), dtype)
        self.classes, self.n, self.side = classes, num, side
        self.max_boxes = max_boxes
        self.coords = 4
        self.softmax = self.sqrt = self.rescore = self.forced = False
        self.random = 0
        self.jitter = 0.2
        self.coord_scale = self.object_scale = self.noobject_scale = self.class_scale = 1.0
        self.grid = np.zeros((0,), np.float32)
        self.stats: dict[str, float] = {}
        self._stats = np.zeros(7, np.float64)
        self._no_choice = np.zeros((0, 0), np.int64)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx):
        coords = sec.get_int("coords", 1)
        classes = sec.get_int("classes", 1)
        num = sec.get_int("num", 1)
        side = sec.get_int("side", 7)
        if coords != 4:
            raise sec.error(f"coords={coords} is not supported (YOLOv1 boxes have coords=4)", "coords")
        if classes < 1 or num < 1 or side < 1:
            raise sec.error(f"classes, num and side must be >= 1 (got {classes}, {num}, {side})")
        need = side * side * ((1 + coords) * num + classes)
        if numel(in_shape) != need:
            raise sec.error(f"the layer before must output side²·((1+coords)·num + classes) = {side}²·(5·{num} + "
                            f"{classes}) = {need} values (e.g. [connected] output={need}); it has "
                            f"{numel(in_shape)}")
        layer = cls(sec.index, in_shape, classes=classes, num=num, side=side, max_boxes=sec.get_int("max", 90),
                    dtype=ctx.dtype)
        if layer.max_boxes < 1:
            raise sec.error(f"must be >= 1 (got {layer.max_boxes})", "max")
        layer.rescore = sec.get_bool("rescore", False)
        layer.softmax = sec.get_bool("softmax", False)
        layer.sqrt = sec.get_bool("sqrt", False)
        layer.forced = sec.get_bool("forced", False)
        layer.random = sec.get_int("random", 0)
        layer.jitter = sec.get_float("jitter", 0.2)
        for key in ("coord_scale", "object_scale", "noobject_scale", "class_scale"):
            setattr(layer, key, sec.get_float(key, 1.0))
        sec.get_str("reorg", None)    # read by darknet, unused
        return layer

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.grid = np.zeros((batch, self.side * self.side, 5 + self.classes), self.dtype)
        self._no_choice = np.full((batch, self.side * self.side), -1, np.int64)

    def summary(self) -> str:
        return "Detection Layer"

    def forward(self, s: State) -> None:
        x = s.input.reshape(self.batch, -1)
        locations = self.side * self.side
        detection_activate(self.output, x, locations, self.classes, self.softmax)
        self.delta.fill(0)
        if s.truth is None:
            self.cost = None
            return
        self.allocate_training()         # delta and loss: sized by the first forward with truth
        self._stats.fill(0)
        self.grid.fill(0)
        fill_truth_grid(self.grid, self._stats, s.truth, truth_boxes(self, s.truth), self.side, self.classes)
        choice = self._no_choice
        if self.random and s.train and s.seen < 64000 and s.rng is not None:
            choice = s.rng.integers(0, self.n, size=choice.shape)
        detection_delta(self.delta, self._stats, self.output, self.grid, choice, self.side, self.n, self.classes,
                        self.coord_scale, self.object_scale, self.noobject_scale, self.class_scale,
                        self.rescore, self.sqrt, self.forced)
        np.square(self.delta, out=self.loss)
        self.cost = float(self.loss.sum())
        st = self._stats
        count = max(st[_COUNT], 1.0)
        self.stats = {"avg_iou": st[_IOU] / count, "class": st[_CAT] / count,
                      "all_class": st[_ALLCAT] / (count * self.classes), "obj": st[_OBJ] / count,
                      "no_obj": st[_ANYOBJ] / (self.batch * locations * self.n), "count": int(st[_COUNT]),
                      "bad_truths": int(st[_BAD])}

    def stats_line(self) -> str:
        st = self.stats
        return (f"Detection Avg IOU: {st['avg_iou']:f}, Pos Cat: {st['class']:f}, All Cat: {st['all_class']:f}, "
                f"Pos Obj: {st['obj']:f}, Any Obj: {st['no_obj']:f}, count: {st['count']}")

    def backward(self, s: State) -> None:
        if s.delta is not None:
            s.delta += self.delta.reshape(s.delta.shape)

    def get_detections(self, b: int, thresh: float, net_w: int, net_h: int):
        """Every box of item `b` (side²·num, in the order cell·num + box), relative to the image.

        Objectness is the raw confidence (not thresholded, as Darknet); `probs = conf·p_class`, zeroed
        where not above `thresh`."""
        side, n, classes = self.side, self.n, self.classes
        loc = side * side
        out = self.output[b].astype(np.float64)
        cls_p = out[:loc * classes].reshape(loc, classes)
        conf = out[loc * classes:loc * (classes + n)]                 # (loc*n,)
        box = out[loc * (classes + n):].reshape(loc * n, 4)
        cell = np.repeat(np.arange(loc), n)
        rows, cols = np.divmod(cell, side)
        power = 2 if self.sqrt else 1
        boxes = np.stack([(box[:, 0] + cols) / side, (box[:, 1] + rows) / side,
                          box[:, 2] ** power, box[:, 3] ** power], axis=1)
        probs = conf[:, None] * cls_p[cell]
        probs[probs <= thresh] = 0
        return boxes, conf.copy(), probs
