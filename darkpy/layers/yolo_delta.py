"""The training deltas of `[yolo]` (the rules are layers/yolo.py's module docstring) and the
helpers the other box heads share (`_valid_truth`, `_truth_cell`, `_class_delta`)."""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from ..kernels import jit, pjit
from ..kernels.boxes import IOU, box_iou, iou_kind_grad

#: stats slots filled by the training kernel
_IOU, _CAT, _OBJ, _ANYOBJ, _R50, _R75, _COUNT, _BAD = range(8)


@jit
def _pred_box(out, b, idx, hw, i, j, lw, lh, aw, ah, net_w, net_h, new_coords):
    """The predicted box (image-relative x, y, w, h) of the slot whose x entry is at out[b, idx]."""
    px = (i + out[b, idx]) / lw
    py = (j + out[b, idx + hw]) / lh
    tw, th = out[b, idx + 2 * hw], out[b, idx + 3 * hw]
    if new_coords:
        return px, py, tw * tw * 4 * aw / net_w, th * th * 4 * ah / net_h
    return px, py, math.exp(tw) * aw / net_w, math.exp(th) * ah / net_h


@jit
def _box_delta(delta, out, b, idx, hw, i, j, lw, lh, aw, ah, net_w, net_h, tx, ty, tw, th, scale,
               iou_kind, iou_norm, max_delta, new_coords):
    """Write the box deltas of one positive slot; return the IoU of its prediction with the truth."""
    px, py, pw, ph = _pred_box(out, b, idx, hw, i, j, lw, lh, aw, ah, net_w, net_h, new_coords)
    iou = box_iou(px, py, pw, ph, tx, ty, tw, th)
    if iou_kind < 0:
        if new_coords:
            gw = math.sqrt(tw * net_w / (4 * aw))
            gh = math.sqrt(th * net_h / (4 * ah))
        else:
            gw = math.log(tw * net_w / aw)
            gh = math.log(th * net_h / ah)
        s = scale * iou_norm
        delta[b, idx] = s * (tx * lw - i - out[b, idx])
        delta[b, idx + hw] = s * (ty * lh - j - out[b, idx + hw])
        delta[b, idx + 2 * hw] = s * (gw - out[b, idx + 2 * hw])
        delta[b, idx + 3 * hw] = s * (gh - out[b, idx + 3 * hw])
        return iou
    if pw == 0:
        pw = 1.0
    if ph == 0:
        ph = 1.0
    q, gx, gy, gw, gh = iou_kind_grad(iou_kind, px, py, pw, ph, tx, ty, tw, th)
    dx = iou_norm * gx
    dy = iou_norm * gy
    dw = 2 * iou_norm * gw * (1.0 if new_coords else math.exp(out[b, idx + 2 * hw]))
    dh = 2 * iou_norm * gh * (1.0 if new_coords else math.exp(out[b, idx + 3 * hw]))
    delta[b, idx] = min(max(dx, -max_delta), max_delta)
    delta[b, idx + hw] = min(max(dy, -max_delta), max_delta)
    delta[b, idx + 2 * hw] = min(max(dw, -max_delta), max_delta)
    delta[b, idx + 3 * hw] = min(max(dh, -max_delta), max_delta)
    return iou


@jit
def _class_delta(delta, out, b, cidx, hw, cls, classes, cls_norm, eps):
    """One-hot class deltas at a positive slot; returns the predicted probability of `cls`."""
    on = 1.0 - 0.5 * eps
    off = 0.5 * eps
    if delta[b, cidx] != 0:   # darknet: an earlier truth already set this slot: only its own class
        delta[b, cidx + cls * hw] = cls_norm * (on - out[b, cidx + cls * hw])
        return out[b, cidx + cls * hw]
    for c in range(classes):
        t = on if c == cls else off
        delta[b, cidx + c * hw] = cls_norm * (t - out[b, cidx + c * hw])
    return out[b, cidx + cls * hw]


@jit
def _class_delta_opts(delta, out, b, cidx, hw, cls, classes, cls_norm, eps, focal, mult):
    """`_class_delta` with the fork's options: `focal` (focal loss, alpha 0.5, gamma 2: every class
    delta scaled by the truth class's modulation) and `mult` (the truth class's counters_per_class
    weight on its own entry). A second truth on the slot takes the plain branch, as in the fork."""
    if not focal or delta[b, cidx] != 0:
        p = _class_delta(delta, out, b, cidx, hw, cls, classes, cls_norm, eps)
        delta[b, cidx + cls * hw] *= mult
        return p
    pt = out[b, cidx + cls * hw] + 1e-15
    grad = -(1.0 - pt) * (2.0 * pt * math.log(pt) + pt - 1.0)
    for c in range(classes):
        t = 1.0 if c == cls else 0.0
        delta[b, cidx + c * hw] = cls_norm * (t - out[b, cidx + c * hw]) * 0.5 * grad
    return out[b, cidx + cls * hw]


@jit
def _box_delta_acc(delta, out, b, idx, hw, i, j, lw, lh, aw, ah, net_w, net_h, tx, ty, tw, th, scale,
                   iou_kind, iou_norm, max_delta, new_coords, accumulate):
    """`_box_delta`, added to the slot's box deltas when `accumulate` (the fork with iou_thresh < 1)."""
    d0, d1, d2, d3 = delta[b, idx], delta[b, idx + hw], delta[b, idx + 2 * hw], delta[b, idx + 3 * hw]
    iou = _box_delta(delta, out, b, idx, hw, i, j, lw, lh, aw, ah, net_w, net_h, tx, ty, tw, th, scale,
                     iou_kind, iou_norm, max_delta, new_coords)
    if accumulate:
        delta[b, idx] += d0
        delta[b, idx + hw] += d1
        delta[b, idx + 2 * hw] += d2
        delta[b, idx + 3 * hw] += d3
    return iou


@jit
def _average_box_deltas(delta, b, n, entries, hw, classes):
    """The fork's averages_yolo_deltas: at each slot with an objectness delta, divide the accumulated
    box deltas by the number of classes with a positive delta."""
    for a in range(n):
        for loc in range(hw):
            idx = a * entries * hw + loc
            if delta[b, idx + 4 * hw] == 0:
                continue
            k = 0
            for c in range(classes):
                if delta[b, idx + (5 + c) * hw] > 0:
                    k += 1
            if k > 0:
                for e in range(4):
                    delta[b, idx + e * hw] /= k


@jit
def _valid_truth(truth, b, t, classes):
    """-1: end of list (x == 0); 0: a malformed box to skip; 1: usable."""
    x = truth[b, 5 * t]
    if x == 0:
        return -1
    y, w, h, c = truth[b, 5 * t + 1], truth[b, 5 * t + 2], truth[b, 5 * t + 3], truth[b, 5 * t + 4]
    if not (0 < x <= 1 and 0 <= y <= 1 and w > 0 and h > 0 and 0 <= c < classes):
        return 0
    return 1


@jit
def shape_quality(kind, aw, ah, tw, th):
    """The fork's box_iou_kind(anchor, truth) with both centred at 0 (`iou_thresh_kind`)."""
    if kind == IOU:
        return box_iou(0.0, 0.0, aw, ah, 0.0, 0.0, tw, th)
    return iou_kind_grad(kind, 0.0, 0.0, aw, ah, 0.0, 0.0, tw, th)[0]


@jit
def _truth_cell(truth, b, t, class_map, lw, lh):
    """Truth box t of item b (truth: (batch, 5*max)): x, y, w, h, mapped class, and its cell i, j."""
    tx, ty = truth[b, 5 * t], truth[b, 5 * t + 1]
    tw, th = truth[b, 5 * t + 2], truth[b, 5 * t + 3]
    cls = class_map[int(truth[b, 5 * t + 4])]
    i = min(int(tx * lw), lw - 1)   # darknet: no clamp, x == 1 indexes past the grid
    j = min(int(ty * lh), lh - 1)
    return tx, ty, tw, th, cls, i, j


@jit
def _item_delta(stats, b, delta, out, truth, biases, mask, class_map, class_mult, opts):
    """Item b's deltas into delta[b] (zeroed by the caller) and its sums into stats (8,); opts:
    `yolo_delta`'s scalar arguments, in its order."""
    (lw, lh, net_w, net_h, classes, max_boxes, ignore_thresh, truth_thresh, iou_kind, iou_norm,
     obj_norm, cls_norm, eps, max_delta, iou_thresh, new_coords, focal, obj_smooth, thresh_kind) = opts
    n = mask.shape[0]
    total = biases.shape[0] // 2
    hw = lw * lh
    entries = 5 + classes
    for j in range(lh):
        for i in range(lw):
            for a in range(n):
                idx = a * entries * hw + j * lw + i
                aw, ah = biases[2 * mask[a]], biases[2 * mask[a] + 1]
                px, py, pw, ph = _pred_box(out, b, idx, hw, i, j, lw, lh, aw, ah, net_w, net_h, new_coords)
                best_iou = 0.0
                best_t = 0
                for t in range(max_boxes):
                    v = _valid_truth(truth, b, t, classes)
                    if v < 0:
                        break
                    if v == 0:
                        continue
                    iou = box_iou(px, py, pw, ph, truth[b, 5 * t], truth[b, 5 * t + 1],
                                  truth[b, 5 * t + 2], truth[b, 5 * t + 3])
                    if iou > best_iou:
                        best_iou = iou
                        best_t = t
                oidx = idx + 4 * hw
                stats[_ANYOBJ] += out[b, oidx]
                delta[b, oidx] = obj_norm * (0.0 - out[b, oidx])
                if best_iou > ignore_thresh:
                    if obj_smooth:      # the fork: target the IoU where it is a better one than 0
                        delta[b, oidx] = max(delta[b, oidx], obj_norm * (best_iou - out[b, oidx]))
                    else:
                        delta[b, oidx] = 0.0
                if best_iou > truth_thresh:
                    target = best_iou * best_iou if obj_smooth else 1.0
                    delta[b, oidx] = obj_norm * (target - out[b, oidx])
                    tx, ty = truth[b, 5 * best_t], truth[b, 5 * best_t + 1]
                    tw, th = truth[b, 5 * best_t + 2], truth[b, 5 * best_t + 3]
                    cls = class_map[int(truth[b, 5 * best_t + 4])]
                    cm = class_mult[cls]
                    cidx = idx + 5 * hw
                    _class_delta_opts(delta, out, b, cidx, hw, cls, classes, cls_norm, eps, focal, cm)
                    if obj_smooth:
                        delta[b, cidx + cls * hw] = cm * (target - out[b, cidx + cls * hw])
                    _box_delta_acc(delta, out, b, idx, hw, i, j, lw, lh, aw, ah, net_w, net_h, tx, ty, tw,
                                   th, 2 - tw * th, iou_kind, iou_norm * cm, max_delta, new_coords,
                                   iou_thresh < 1.0)
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
        for k in range(total):
            iou = box_iou(0.0, 0.0, biases[2 * k] / net_w, biases[2 * k + 1] / net_h, 0.0, 0.0, tw, th)
            if iou > best_iou:
                best_iou = iou
                best_n = k
        for a in range(n):
            k = mask[a]
            if k != best_n:
                if iou_thresh >= 1.0:
                    continue
                shape_iou = shape_quality(thresh_kind, biases[2 * k] / net_w, biases[2 * k + 1] / net_h,
                                          tw, th)
                if shape_iou <= iou_thresh:
                    continue
            idx = a * entries * hw + j * lw + i
            cm = class_mult[cls]
            iou = _box_delta_acc(delta, out, b, idx, hw, i, j, lw, lh, biases[2 * k], biases[2 * k + 1],
                                 net_w, net_h, tx, ty, tw, th, 2 - tw * th, iou_kind, iou_norm * cm,
                                 max_delta, new_coords, iou_thresh < 1.0)
            oidx = idx + 4 * hw
            stats[_OBJ] += out[b, oidx]
            # darknet: with smoothing, any delta set in the first pass stays (even the target-0 one)
            if not obj_smooth or delta[b, oidx] == 0:
                delta[b, oidx] = cm * obj_norm * (1.0 - out[b, oidx])
            stats[_CAT] += _class_delta_opts(delta, out, b, idx + 5 * hw, hw, cls, classes, cls_norm, eps,
                                             focal, cm)
            stats[_IOU] += iou
            stats[_COUNT] += 1
            if iou > 0.5:
                stats[_R50] += 1
            if iou > 0.75:
                stats[_R75] += 1
    if iou_thresh < 1.0:
        _average_box_deltas(delta, b, n, entries, hw, classes)


@jit
def _sum_items(stats, part):
    """stats += the items' sums, item after item (the same total whichever path made them)."""
    for b in range(part.shape[0]):
        for k in range(part.shape[1]):
            stats[k] += part[b, k]


@jit
def _yolo_delta_serial(stats, part, delta, out, truth, biases, mask, class_map, class_mult, opts):
    for b in range(out.shape[0]):
        _item_delta(part[b], b, delta, out, truth, biases, mask, class_map, class_mult, opts)
    _sum_items(stats, part)


@pjit
def _yolo_delta_parallel(stats, part, delta, out, truth, biases, mask, class_map, class_mult, opts):
    for b in prange(out.shape[0]):
        _item_delta(part[b], b, delta, out, truth, biases, mask, class_map, class_mult, opts)
    _sum_items(stats, part)


#: Items' worth of slots x truths below which the deltas are made on the calling thread.
PARALLEL_MIN_CHECKS = 1 << 14


def yolo_delta(delta, stats, out, truth, biases, mask, class_map, lw, lh, net_w, net_h, classes,
               max_boxes, ignore_thresh, truth_thresh, iou_kind, iou_norm, obj_norm, cls_norm, eps,
               max_delta, iou_thresh, new_coords, focal, class_mult, obj_smooth, thresh_kind):
    """Darknet's yolo training deltas (layers/yolo.py's module docstring) into `delta` (zeroed by
    the caller), its sums added into `stats`. delta, out: (batch, n·(5+classes)·lw·lh); truth:
    (batch, >= 5·max_boxes); biases: (2·total,); mask: (n,) anchor index per slot; class_map:
    (classes,) or more; stats: (8,) float64. Items are independent, each with its own sums, added
    in item order: the same bits on one thread or many."""
    part = np.zeros((out.shape[0], stats.shape[0]), np.float64)
    checks = out.shape[0] * mask.shape[0] * lw * lh * max(1, max_boxes)
    run = _yolo_delta_serial if checks < PARALLEL_MIN_CHECKS else _yolo_delta_parallel
    opts = (lw, lh, float(net_w), float(net_h), classes, max_boxes, float(ignore_thresh),
            float(truth_thresh), iou_kind, float(iou_norm), float(obj_norm), float(cls_norm),
            float(eps), float(max_delta), float(iou_thresh), new_coords, focal, obj_smooth, thresh_kind)
    run(stats, part, delta, out, truth, biases, mask, class_map, class_mult, opts)
