"""Slow, plain-numpy references shared by the detection-head tests (yolo, region, detection, detect).

Written from the spec's formulas, independently of darkpy's numba kernels.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from darkpy.layers.base import State


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _overlaps(a, b):
    ow = min(a[0] + a[2] / 2, b[0] + b[2] / 2) - max(a[0] - a[2] / 2, b[0] - b[2] / 2)
    oh = min(a[1] + a[3] / 2, b[1] + b[3] / 2) - max(a[1] - a[3] / 2, b[1] - b[3] / 2)
    return ow, oh


def ref_iou(a, b) -> float:
    """Darknet IoU of two (x, y, w, h) boxes: 0 when they do not overlap."""
    ow, oh = _overlaps(a, b)
    if ow < 0 or oh < 0:
        return 0.0
    inter = ow * oh
    union = a[2] * a[3] + b[2] * b[3] - inter
    return 0.0 if inter == 0 or union == 0 else inter / union


def ref_quality(kind: str, a, b, alpha: float | None = None) -> float:
    """IoU / GIoU / DIoU / CIoU of pred a vs truth b; CIoU's alpha may be frozen (for derivatives)."""
    iou = ref_iou(a, b)
    if kind == "iou":
        return iou
    cw = max(a[0] + a[2] / 2, b[0] + b[2] / 2) - min(a[0] - a[2] / 2, b[0] - b[2] / 2)
    ch = max(a[1] + a[3] / 2, b[1] + b[3] / 2) - min(a[1] - a[3] / 2, b[1] - b[3] / 2)
    if kind == "giou":
        ow, oh = _overlaps(a, b)
        inter = ow * oh if ow > 0 and oh > 0 else 0.0
        union = a[2] * a[3] + b[2] * b[3] - inter
        return iou - (cw * ch - union) / (cw * ch)
    rho2 = (a[0] - b[0]) ** 2 + (a[1] - b[1]) ** 2
    q = iou - rho2 / (cw * cw + ch * ch)
    if kind == "diou":
        return q
    v = 4 / math.pi ** 2 * (math.atan(b[2] / b[3]) - math.atan(a[2] / a[3])) ** 2
    if alpha is None:
        alpha = v / (1 - iou + v + 1e-6)
    return q - alpha * v


def ciou_alpha(a, b) -> float:
    v = 4 / math.pi ** 2 * (math.atan(b[2] / b[3]) - math.atan(a[2] / a[3])) ** 2
    return v / (1 - ref_iou(a, b) + v + 1e-6)


def valid_truths(row, classes, max_boxes):
    """[x,y,w,h,class] rows of one image up to the first x == 0, skipping malformed ones."""
    out = []
    for t in range(max_boxes):
        x, y, w, h, c = row[5 * t:5 * t + 5]
        if x == 0:
            break
        if 0 < x <= 1 and 0 <= y <= 1 and w > 0 and h > 0 and 0 <= c < classes:
            out.append((x, y, w, h, int(c)))
    return out


def head_state(x, truth, *, net_w, net_h, seen=0, train=True, rng=None):
    """A State for calling one head directly, with a stand-in network that only knows its size."""
    return State(input=x, delta=None, truth=truth, train=train, layers=[], seen=seen,
                 rng=rng or np.random.default_rng(0), net=SimpleNamespace(width=net_w, height=net_h))


def bce_logit(t, z):
    """Binary cross-entropy of target t against sigmoid(z), written on the logit (stable)."""
    return np.logaddexp(0.0, z) - t * z
