"""Box geometry shared by the detection heads ([yolo], [region], [detection]) and detect.py.

Boxes are (x, y, w, h): centre and size, in whatever units the caller uses (the heads use image-
relative units). Scalar `@jit` functions, callable from other kernels and from Python.

`box_iou` is Darknet's: a pair that does not overlap (or has zero union) has IoU 0. `iou_kind_grad`
returns an IoU-family quality Q (IoU, GIoU, DIoU, CIoU) and its exact partial derivatives with respect
to the first box's x, y, w, h: these drive the fork's `iou_loss` (loss = 1 - Q). CIoU treats its
trade-off weight alpha as a constant, as the CIoU paper does; DIoU uses the paper's rho²/c² penalty
(the fork's `box_diou` raises it to the power 0.6, its gradient does not).
"""
from __future__ import annotations

import math

from . import jit

IOU, GIOU, DIOU, CIOU = 0, 1, 2, 3
IOU_KINDS = {"iou": IOU, "giou": GIOU, "diou": DIOU, "ciou": CIOU}


@jit
def overlap(x1, w1, x2, w2):
    """Length of the overlap of two 1-D segments given by centre and size (negative if apart)."""
    left = max(x1 - w1 / 2, x2 - w2 / 2)
    right = min(x1 + w1 / 2, x2 + w2 / 2)
    return right - left


@jit
def box_intersection(ax, ay, aw, ah, bx, by, bw, bh):
    w = overlap(ax, aw, bx, bw)
    h = overlap(ay, ah, by, bh)
    if w < 0 or h < 0:
        return 0.0
    return w * h


@jit
def box_iou(ax, ay, aw, ah, bx, by, bw, bh):
    i = box_intersection(ax, ay, aw, ah, bx, by, bw, bh)
    u = aw * ah + bw * bh - i
    if i == 0 or u == 0:
        return 0.0
    return i / u


@jit
def box_diou_nms(ax, ay, aw, ah, bx, by, bw, bh, beta):
    """The fork's DIoU-NMS score: IoU - (rho²/c²)^beta (rho: centre distance, c: enclosing diagonal)."""
    iou = box_iou(ax, ay, aw, ah, bx, by, bw, bh)
    cw = max(ax + aw / 2, bx + bw / 2) - min(ax - aw / 2, bx - bw / 2)
    ch = max(ay + ah / 2, by + bh / 2) - min(ay - ah / 2, by - bh / 2)
    c = cw * cw + ch * ch
    if c == 0:
        return iou
    d = (ax - bx) ** 2 + (ay - by) ** 2
    return iou - (d / c) ** beta


@jit
def iou_kind_grad(kind, x, y, w, h, tx, ty, tw, th):
    """Q(pred, truth) for kind IOU/GIOU/DIOU/CIOU and (dQ/dx, dQ/dy, dQ/dw, dQ/dh) of the pred box."""
    l, r, t, b = x - w / 2, x + w / 2, y - h / 2, y + h / 2
    tl, tr, tt, tb = tx - tw / 2, tx + tw / 2, ty - th / 2, ty + th / 2
    iw = min(r, tr) - max(l, tl)
    ih = min(b, tb) - max(t, tt)
    # partials w.r.t. the pred edges (l, r, t, b) of the intersection I
    inter = 0.0
    di_l = di_r = di_t = di_b = 0.0
    if iw > 0 and ih > 0:
        inter = iw * ih
        di_l = -ih if l > tl else 0.0
        di_r = ih if r < tr else 0.0
        di_t = -iw if t > tt else 0.0
        di_b = iw if b < tb else 0.0
    # convert edge partials to (x, y, w, h): d/dx = d/dl + d/dr, d/dw = (d/dr - d/dl)/2
    di_x, di_w = di_l + di_r, (di_r - di_l) / 2
    di_y, di_h = di_t + di_b, (di_b - di_t) / 2
    union = w * h + tw * th - inter
    du_x, du_y, du_w, du_h = -di_x, -di_y, h - di_w, w - di_h
    q = 0.0
    gx = gy = gw = gh = 0.0
    if union > 0 and inter > 0:
        q = inter / union
        u2 = union * union
        gx = (di_x * union - inter * du_x) / u2
        gy = (di_y * union - inter * du_y) / u2
        gw = (di_w * union - inter * du_w) / u2
        gh = (di_h * union - inter * du_h) / u2
    if kind == IOU:
        return q, gx, gy, gw, gh
    # enclosing box C and its partials
    cl, cr, ct, cb = min(l, tl), max(r, tr), min(t, tt), max(b, tb)
    cw, ch = cr - cl, cb - ct
    dcw_l = -1.0 if l < tl else 0.0
    dcw_r = 1.0 if r > tr else 0.0
    dch_t = -1.0 if t < tt else 0.0
    dch_b = 1.0 if b > tb else 0.0
    dcw_x, dcw_w = dcw_l + dcw_r, (dcw_r - dcw_l) / 2
    dch_y, dch_h = dch_t + dch_b, (dch_b - dch_t) / 2
    if kind == GIOU:
        c = cw * ch
        if c <= 0:
            return q, gx, gy, gw, gh
        # GIoU = IoU - (C - U)/C = IoU - 1 + U/C
        dc_x, dc_y, dc_w, dc_h = dcw_x * ch, dch_y * cw, dcw_w * ch, dch_h * cw
        c2 = c * c
        q += union / c - 1
        gx += (du_x * c - union * dc_x) / c2
        gy += (du_y * c - union * dc_y) / c2
        gw += (du_w * c - union * dc_w) / c2
        gh += (du_h * c - union * dc_h) / c2
        return q, gx, gy, gw, gh
    # DIoU / CIoU: - rho²/c², c² the squared diagonal of C
    c2 = cw * cw + ch * ch
    iou = q
    if c2 > 0:
        rho2 = (x - tx) ** 2 + (y - ty) ** 2
        dr_x, dr_y = 2 * (x - tx), 2 * (y - ty)
        dc_x, dc_y = 2 * cw * dcw_x, 2 * ch * dch_y
        dc_w, dc_h = 2 * cw * dcw_w, 2 * ch * dch_h
        c4 = c2 * c2
        q -= rho2 / c2
        gx -= (dr_x * c2 - rho2 * dc_x) / c4
        gy -= (dr_y * c2 - rho2 * dc_y) / c4
        gw -= (0.0 - rho2 * dc_w) / c4
        gh -= (0.0 - rho2 * dc_h) / c4
    if kind == CIOU and h > 0 and th > 0:
        k = 4 / (math.pi * math.pi)
        da = math.atan(tw / th) - math.atan(w / h)
        v = k * da * da
        alpha = v / (1 - iou + v + 1e-6)      # a constant in the gradient, as in the paper
        q -= alpha * v
        s = w * w + h * h
        gw -= alpha * (-2 * k * da * h / s)
        gh -= alpha * (2 * k * da * w / s)
    return q, gx, gy, gw, gh
