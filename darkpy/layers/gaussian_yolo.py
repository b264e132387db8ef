"""`[Gaussian_yolo]` (AlexeyAB's `gaussian_yolo_layer.c`, Gaussian YOLOv3): a YOLO head whose box
coordinates each come with an uncertainty.

Layout per item, anchor a of the `mask`: planes `[x, σx, y, σy, w, σw, h, σh, obj, cls_0 ..]`
(9 + classes), each h×w. Forward: logistic on x, σx, y, σy, σw, σh, obj and the classes; x and y
then get the fork's `scale_x_y` (`s·σ(·) − (s−1)/2`); w, h stay raw. Boxes decode as `[yolo]`'s
(x, y in the cell, `e^w·anchor/net`). Detection: a class's probability is
`obj · p_class · (1 − mean(σx, σy, σw, σh))`, kept when above the threshold.

Training (truth given, rows `[x, y, w, h, class]` as `[yolo]`): Darknet's rules — every slot an
objectness delta `obj_normalizer·(0 − obj)`, cleared when its box overlaps a truth (whose class
some class probability of the slot exceeds 0.25 for) by more than `ignore_thresh`; a positive where
the overlap passes `truth_thresh`; every truth trains the best-shaped anchor among all `num` (if
masked here) and, with `iou_thresh < 1`, every masked anchor whose shape IoU (of the kind
`iou_thresh_kind`, as `[yolo]`) passes it. Box deltas
(accumulated, then divided by the number of classes with a positive delta at that slot, Darknet's
averaging), with scale `s = 2 − w·h` and targets as `[yolo]`:
- μ of x, y, w, h with `iou_loss=mse`: `½·s·d/σ²`, d = target − μ — the negative gradient of
  `½·s·NLL`, NLL = d²/(2σ²) + log(σ + 0.3) (Darknet's normaliser has σ + 0.3);
- σ: `½·s·(d²/σ³ − 1/(σ + 0.3))`, the same NLL's, times `uc_normalizer`;
- μ with another iou_loss: `[yolo]`'s IoU-kind derivative (kernels/boxes.py);
μ deltas are multiplied by `iou_normalizer` (the fork's default 0.75). Class deltas are `[yolo]`'s
one-hot (with `label_smooth_eps`). # darknet: `cls_normalizer` is used only together with
`counters_per_class` (not implemented), so it has no effect here. `max_delta` clips box deltas.
`cost = Σ δ²`. Backward adds the deltas to the previous layer's unchanged (Darknet, CPU and GPU:
no logistic derivative, also for σ).

Not implemented (a clear error or warning): `yolo_point` other than center, `objectness_smooth`,
`counters_per_class`, adversarial training.
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from ..kernels import PARALLEL_MIN, jit, pjit
from ..kernels.boxes import IOU_KINDS, box_iou, iou_kind_grad
from .base import Layer, State, register
from .yolo import (BoxHead, _class_delta, _truth_cell, _valid_truth, read_class_map, read_head_anchors,
                   shape_quality, truth_boxes)

MSE = -1
BOX = 8                                   # entries before objectness: 4 coordinates x (μ, σ)
SIGMA_CONST = 0.3                         # darknet: the normaliser's σ + 0.3
_IOU, _CAT, _OBJ, _ANYOBJ, _R50, _R75, _COUNT, _BAD = range(8)


@jit
def _logistic(x):
    return 1.0 / (1.0 + math.exp(-x))


@jit(inline="always")
def _activate_row(out, x, r, n, entries, hw, scale_xy):
    b = r // n
    base = (r % n) * entries * hw
    shift = -0.5 * (scale_xy - 1.0)
    for e in range(entries):
        for k in range(base + e * hw, base + (e + 1) * hw):
            v = x[b, k]
            if e == 4 or e == 6:                  # w, h: raw
                out[b, k] = v
            elif e == 0 or e == 2:                # x, y: logistic and scale_x_y
                out[b, k] = scale_xy * _logistic(v) + shift
            else:
                out[b, k] = _logistic(v)


@pjit
def gaussian_activate(out, x, n, entries, hw, scale_xy):
    """out, x: (batch, n*entries*hw). The head's activations (module docstring)."""
    rows = x.shape[0] * n
    if x.size < PARALLEL_MIN:
        for r in range(rows):
            _activate_row(out, x, r, n, entries, hw, scale_xy)
    else:
        for r in prange(rows):
            _activate_row(out, x, r, n, entries, hw, scale_xy)


@jit
def _pred_box(out, b, idx, hw, i, j, lw, lh, aw, ah, net_w, net_h):
    return ((i + out[b, idx]) / lw, (j + out[b, idx + 2 * hw]) / lh,
            math.exp(out[b, idx + 4 * hw]) * aw / net_w, math.exp(out[b, idx + 6 * hw]) * ah / net_h)


@jit
def _clip(v, m):
    """Darknet's fix_nan_inf (a value that is nan or overflows float32 becomes 0), then ±max_delta."""
    if not abs(v) < 3.4028234e38:
        return 0.0
    return min(max(v, -m), m)


@jit
def gaussian_box_delta(delta, out, b, idx, hw, i, j, lw, lh, aw, ah, net_w, net_h, tx, ty, tw, th, scale,
                       iou_kind, iou_norm, uc_norm, max_delta):
    """ADD the 8 box deltas of one positive slot (module docstring); return the prediction's IoU."""
    px, py, pw, ph = _pred_box(out, b, idx, hw, i, j, lw, lh, aw, ah, net_w, net_h)
    iou = box_iou(px, py, pw, ph, tx, ty, tw, th)
    targets = (tx * lw - i, ty * lh - j, math.log(tw * net_w / aw), math.log(th * net_h / ah))
    half = 0.5 * scale
    mu = np.zeros(4)
    for k in range(4):
        m = 1.0 * out[b, idx + 2 * k * hw]            # float64 (σ³ of a float32 σ can underflow)
        s = 1.0 * out[b, idx + (2 * k + 1) * hw]
        d = targets[k] - m
        if s * s * s == 0.0:   # darknet: the division gives inf/nan, which fix_nan_inf makes 0
            continue
        mu[k] = half * d / (s * s)
        uc = half * (d * d / (s * s * s) - 1.0 / (s + SIGMA_CONST)) * uc_norm
        delta[b, idx + (2 * k + 1) * hw] += _clip(uc, max_delta)
    if iou_kind >= 0 and not (pw < 1e30 and ph < 1e30):
        mu[:] = 0.0            # darknet: an overflowed box gives nan deltas, fix_nan_inf zeroes them
    elif iou_kind >= 0:
        if pw == 0:
            pw = 1.0
        if ph == 0:
            ph = 1.0
        q, gx, gy, gw, gh = iou_kind_grad(iou_kind, px, py, pw, ph, tx, ty, tw, th)
        mu[0], mu[1] = gx, gy
        mu[2] = 2 * gw * math.exp(out[b, idx + 4 * hw])
        mu[3] = 2 * gh * math.exp(out[b, idx + 6 * hw])
    for k in range(4):
        delta[b, idx + 2 * k * hw] += _clip(mu[k] * iou_norm, max_delta)
    return iou


@jit
def _class_match(out, b, cidx, hw, classes):
    for c in range(classes):
        if out[b, cidx + c * hw] > 0.25:
            return True
    return False


@jit
def gaussian_delta(delta, stats, out, truth, biases, mask, class_map, lw, lh, net_w, net_h, classes, max_boxes,
                   ignore_thresh, truth_thresh, iou_kind, iou_norm, uc_norm, obj_norm, eps, max_delta,
                   iou_thresh, thresh_kind):
    """Darknet's forward_gaussian_yolo_layer training rules (module docstring). delta, out:
    (batch, n*entries*hw); truth: (batch, 5*max)."""
    B = out.shape[0]
    n = mask.size
    hw = lw * lh
    entries = BOX + 1 + classes
    total = biases.size // 2
    for b in range(B):
        for j in range(lh):
            for i in range(lw):
                for a in range(n):
                    base = a * entries * hw + j * lw + i
                    oidx, cidx = base + BOX * hw, base + (BOX + 1) * hw
                    aw, ah = biases[2 * mask[a]], biases[2 * mask[a] + 1]
                    px, py, pw, ph = _pred_box(out, b, base, hw, i, j, lw, lh, aw, ah, net_w, net_h)
                    best_match, best, best_t = 0.0, 0.0, 0
                    for t in range(max_boxes):
                        v = _valid_truth(truth, b, t, classes)
                        if v < 0:
                            break
                        if v == 0:
                            continue
                        iou = box_iou(px, py, pw, ph, truth[b, 5 * t], truth[b, 5 * t + 1],
                                      truth[b, 5 * t + 2], truth[b, 5 * t + 3])
                        if iou > best_match and _class_match(out, b, cidx, hw, classes):
                            best_match = iou
                        if iou > best:
                            best, best_t = iou, t
                    stats[_ANYOBJ] += out[b, oidx]
                    delta[b, oidx] = obj_norm * (0.0 - out[b, oidx])
                    if best_match > ignore_thresh:
                        delta[b, oidx] = 0.0
                    if best > truth_thresh:
                        tx, ty, tw, th, cls, _, _ = _truth_cell(truth, b, best_t, class_map, lw, lh)
                        delta[b, oidx] = obj_norm * (1.0 - out[b, oidx])
                        _class_delta(delta, out, b, cidx, hw, cls, classes, 1.0, eps)
                        gaussian_box_delta(delta, out, b, base, hw, i, j, lw, lh, aw, ah, net_w, net_h, tx, ty,
                                           tw, th, 2.0 - tw * th, iou_kind, iou_norm, uc_norm, max_delta)
        for t in range(max_boxes):
            v = _valid_truth(truth, b, t, classes)
            if v < 0:
                break
            if v == 0:
                stats[_BAD] += 1
                continue
            tx, ty, tw, th, cls, i, j = _truth_cell(truth, b, t, class_map, lw, lh)
            best, best_n = 0.0, 0
            for k in range(total):
                iou = box_iou(0.0, 0.0, biases[2 * k] / net_w, biases[2 * k + 1] / net_h, 0.0, 0.0, tw, th)
                if iou > best:
                    best, best_n = iou, k
            for a in range(n):
                k = mask[a]
                if k != best_n:
                    if iou_thresh >= 1.0:
                        continue
                    if shape_quality(thresh_kind, biases[2 * k] / net_w, biases[2 * k + 1] / net_h,
                                     tw, th) <= iou_thresh:
                        continue
                base = a * entries * hw + j * lw + i
                oidx, cidx = base + BOX * hw, base + (BOX + 1) * hw
                iou = gaussian_box_delta(delta, out, b, base, hw, i, j, lw, lh, biases[2 * k], biases[2 * k + 1],
                                         net_w, net_h, tx, ty, tw, th, 2.0 - tw * th, iou_kind, iou_norm,
                                         uc_norm, max_delta)
                stats[_OBJ] += out[b, oidx]
                delta[b, oidx] = obj_norm * (1.0 - out[b, oidx])
                stats[_CAT] += _class_delta(delta, out, b, cidx, hw, cls, classes, 1.0, eps)
                stats[_COUNT] += 1
                stats[_IOU] += iou
                if iou > 0.5:
                    stats[_R50] += 1
                if iou > 0.75:
                    stats[_R75] += 1
        # darknet: averages_gaussian_yolo_deltas, per slot
        for a in range(n):
            for loc in range(hw):
                base = a * entries * hw + loc
                cidx = base + (BOX + 1) * hw
                count = 0
                for c in range(classes):
                    if delta[b, cidx + c * hw] > 0:
                        count += 1
                if count > 0:
                    for e in range(BOX):
                        delta[b, base + e * hw] /= count


@register
class GaussianYoloLayer(BoxHead, Layer):
    kind = "Gaussian_yolo"
    has_cost = True
    needs_image = True
    is_detection_head = True
    letterbox_boxes = True

    def __init__(self, index, in_shape, *, classes, mask, biases, max_boxes=200, net_wh=(0, 0), dtype=np.float32):
        super().__init__(index, in_shape, in_shape, dtype)
        self.classes = classes
        self.mask = np.asarray(mask, np.int64)
        self.n = len(mask)
        self.biases = np.asarray(biases, np.float64)
        self.max_boxes = max_boxes
        self.net_wh = net_wh
        self.class_map = np.arange(classes, dtype=np.int64)
        self.jitter, self.ignore_thresh, self.truth_thresh, self.random = 0.2, 0.5, 1.0, 0.0
        self.scale_x_y = 1.0
        self.iou_loss = MSE
        self.iou_normalizer, self.uc_normalizer, self.obj_normalizer = 0.75, 1.0, 1.0
        self.label_smooth_eps, self.max_delta, self.iou_thresh = 0.0, math.inf, 1.0
        self.iou_thresh_kind = IOU_KINDS["iou"]
        self.nms_kind, self.beta_nms = "default", 0.6
        self.stats: dict[str, float] = {}
        self._stats = np.zeros(8, np.float64)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx):
        classes, mask, anchors = read_head_anchors(sec)
        need = len(mask) * (classes + BOX + 1)
        if in_shape[0] != need:
            raise sec.error(f"the layer before must output len(mask)*(classes+9) = {len(mask)}*({classes}+9) = "
                            f"{need} channels (set filters={need} in the last [convolutional]); it has {in_shape[0]}")
        layer = cls(sec.index, in_shape, classes=classes, mask=mask, biases=anchors,
                    max_boxes=sec.get_int("max", 200), net_wh=(ctx.net.width, ctx.net.height), dtype=ctx.dtype)
        if layer.max_boxes < 1:
            raise sec.error(f"must be >= 1 (got {layer.max_boxes})", "max")
        for key in ("jitter", "ignore_thresh", "truth_thresh", "random", "scale_x_y", "iou_normalizer",
                    "uc_normalizer", "obj_normalizer", "label_smooth_eps", "max_delta", "iou_thresh",
                    "beta_nms"):
            setattr(layer, key, sec.get_float(key, getattr(layer, key)))
        sec.get_float("cls_normalizer", 1.0)   # darknet: used only with counters_per_class
        sec.get_float("resize", 1.0)
        kind = sec.get_choice("iou_loss", ("mse", *IOU_KINDS), "mse")
        layer.iou_loss = MSE if kind == "mse" else IOU_KINDS[kind]
        layer.iou_thresh_kind = IOU_KINDS[sec.get_choice("iou_thresh_kind", tuple(IOU_KINDS), "iou")]
        layer.nms_kind = sec.get_choice("nms_kind", ("default", "greedynms", "diounms", "cornersnms"), "default")
        if sec.get_choice("yolo_point", ("center", "left_top", "right_bottom"), "center") != "center":
            raise sec.error("yolo_point other than center is not supported by darkpy", "yolo_point")
        for key in ("objectness_smooth", "counters_per_class"):
            if sec.get_str(key, None) not in (None, "0"):
                raise sec.error(f"{key} is not supported by darkpy for [Gaussian_yolo]", key)
        cmap = read_class_map(sec, classes)
        if cmap is not None:
            layer.class_map = cmap
        return layer

    @property
    def entries(self) -> int:
        return self.classes + BOX + 1

    def summary(self) -> str:
        return "Gaussian_yolo"

    def forward(self, s: State) -> None:
        c, h, w = self.out_shape
        x = s.input.reshape(self.batch, -1)
        out = self.output.reshape(self.batch, -1)
        gaussian_activate(out, x, self.n, self.entries, h * w, self.scale_x_y)
        self.delta.fill(0)
        if s.truth is None:
            self.cost = None
            return
        self.allocate_training()
        net_w, net_h = self._net_size(s)
        self._stats.fill(0)
        gaussian_delta(self.delta.reshape(self.batch, -1), self._stats, out, s.truth, self.biases, self.mask,
                       self.class_map, w, h, net_w, net_h, self.classes, truth_boxes(self, s.truth),
                       self.ignore_thresh, self.truth_thresh, self.iou_loss, self.iou_normalizer,
                       self.uc_normalizer, self.obj_normalizer, self.label_smooth_eps, self.max_delta,
                       self.iou_thresh, self.iou_thresh_kind)
        np.square(self.delta, out=self.loss)
        self.cost = float(self.loss.sum())
        st = self._stats
        count = max(st[_COUNT], 1.0)
        self.stats = {"avg_iou": st[_IOU] / count, "class": st[_CAT] / count, "obj": st[_OBJ] / count,
                      "no_obj": st[_ANYOBJ] / max(self.batch * self.n * h * w, 1),
                      "recall50": st[_R50] / count, "recall75": st[_R75] / count, "count": int(st[_COUNT]),
                      "bad_truths": int(st[_BAD])}

    def stats_line(self) -> str:
        st = self.stats
        return (f"Region {self.index} Avg IOU: {st['avg_iou']:f}, Class: {st['class']:f}, Obj: {st['obj']:f}, "
                f"No Obj: {st['no_obj']:f}, .5R: {st['recall50']:f}, .75R: {st['recall75']:f},  "
                f"count: {st['count']}")

    def backward(self, s: State) -> None:
        if s.delta is not None:       # darknet: the deltas go back unchanged (no logistic derivative)
            s.delta += self.delta.reshape(s.delta.shape)

    def get_detections(self, b: int, thresh: float, net_w: int, net_h: int):
        """As YoloLayer.get_detections; probabilities scaled by (1 − mean uncertainty)."""
        c, h, w = self.out_shape
        out = self.output[b].reshape(self.n, self.entries, h, w).astype(np.float64)
        obj = out[:, BOX]
        keep = np.argwhere(obj.transpose(1, 2, 0) > thresh)
        rows, cols, anch = keep[:, 0], keep[:, 1], keep[:, 2]
        aw, ah = self.biases[2 * self.mask[anch]], self.biases[2 * self.mask[anch] + 1]
        boxes = np.stack([(cols + out[anch, 0, rows, cols]) / w, (rows + out[anch, 2, rows, cols]) / h,
                          np.exp(out[anch, 4, rows, cols]) * aw / net_w,
                          np.exp(out[anch, 6, rows, cols]) * ah / net_h], axis=1)
        objectness = obj[anch, rows, cols]
        uc = out[anch][:, [1, 3, 5, 7]][np.arange(len(anch)), :, rows, cols].mean(axis=1)
        probs = (objectness * (1.0 - uc))[:, None] * out[anch, BOX + 1:, rows, cols]
        probs[probs <= thresh] = 0
        return boxes, objectness, probs
