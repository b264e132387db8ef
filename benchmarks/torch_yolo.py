"""darkpy's `[yolo]` training loss, written the PyTorch way (for the benchmark's torch contender).

darkpy (as Darknet) computes per-entry deltas and passes them to the layer below unchanged (no
sigmoid derivative): they are the negative gradients, with respect to the head's INPUT, of
- binary cross-entropy with logits on x, y (targets `t·l - cell`), weighted by
  `s = (2 - w·h)·iou_normalizer`, at each positive slot;
- `½·s·(t - z)²` on the raw w, h (targets `log(w·net / anchor)`), at each positive slot;
- binary cross-entropy on objectness: target 1 at positive slots, 0 elsewhere, weight
  `obj_normalizer`, and weight 0 at a non-positive slot whose predicted box overlaps some truth by
  more than `ignore_thresh`;
- binary cross-entropy on every class at positive slots (target `1 - ε/2` for the truth's class,
  `ε/2` for the others, weight `cls_normalizer`); a second truth on the same slot only sets its own
  class's target (Darknet's rule);
where a slot (cell, anchor) is positive for a truth when the anchor, among ALL anchors, has the best
shape-only IoU with the truth and is in this head's mask (later truths on the same slot win).
With the fork's `iou_thresh < 1`, every other masked anchor whose shape IoU with the truth is above
it is positive too, the x, y, w, h terms of every truth on a slot add up, and each slot's sum is
divided by the number of classes whose delta there is positive (the fork's averages_yolo_deltas; a
count that reads the predictions, taken as a constant, as darkpy's delta does).
`yolo_loss` returns that loss summed over the head (the caller divides by the batch, as darkpy's
update does) and Darknet's reported cost, `Σ δ²`, computed from the same targets.

Covered: `iou_loss=mse` (Darknet's), `scale_x_y=1`, `new_coords=0`, `truth_thresh=1`, any
`iou_thresh` with `iou_thresh_kind=iou`, no focal loss, objectness smoothing or class counters;
anything else raises `Unsupported` when the network is built for training.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

MSE = -1            # darkpy.layers.yolo.MSE
IOU = 0             # darkpy.kernels.boxes.IOU (iou_thresh_kind=iou)


def unsupported(d: dict) -> str | None:
    """Why `yolo_loss` cannot train this head (a layer spec), or None."""
    problems = []
    if d["iou_loss"] != MSE:
        problems.append("iou_loss other than mse")
    if d["scale_x_y"] != 1:
        problems.append("scale_x_y != 1")
    if d["new_coords"]:
        problems.append("new_coords=1")
    if d["truth_thresh"] < 1:
        problems.append("truth_thresh < 1")
    if d["iou_thresh"] < 1 and d["iou_thresh_kind"] != IOU:
        problems.append("iou_thresh_kind other than iou")
    if d["focal_loss"]:
        problems.append("focal_loss=1")
    if d["objectness_smooth"]:
        problems.append("objectness_smooth=1")
    if np.any(np.asarray(d["class_mult"]) != 1):
        problems.append("counters_per_class")
    if problems:
        return f"layer {d['index']} [yolo]: the torch yolo loss does not cover " + ", ".join(problems)
    return None


def _valid(truth: np.ndarray, classes: int, max_boxes: int) -> np.ndarray:
    """(B, T) bool: truth rows darkpy uses (the list ends at the first x == 0; malformed rows skipped)."""
    t = truth[:, :5 * max_boxes].reshape(truth.shape[0], max_boxes, 5)
    x, y, w, h, c = (t[..., k] for k in range(5))
    alive = np.cumprod(x != 0, axis=1).astype(bool)
    ok = (x > 0) & (x <= 1) & (y >= 0) & (y <= 1) & (w > 0) & (h > 0) & (c >= 0) & (c < classes)
    return alive & ok


def _shape_iou(aw, ah, tw, th):
    inter = np.minimum(aw, tw) * np.minimum(ah, th)
    return inter / (aw * ah + tw * th - inter)


def assign(d: dict, truth: np.ndarray, lh: int, lw: int) -> dict:
    """The positive slots of one head and their targets (prediction-independent), as arrays: `pos`,
    the class targets and weights per slot, and one box entry per (truth, positive slot) in `box`
    (index arrays b, a, j, i and targets x, y, w, h, s); without `iou_thresh` a later truth's entry
    replaces an earlier one's on the same slot, with it they add up."""
    batch = truth.shape[0]
    n, classes = len(d["mask"]), d["classes"]
    net_w, net_h = d["net_wh"]
    anchors = np.asarray(d["biases"], np.float64).reshape(-1, 2)
    slot_of = {int(k): a for a, k in enumerate(d["mask"])}
    eps = d["label_smooth_eps"]
    on, off = 1.0 - 0.5 * eps, 0.5 * eps
    accumulate = d["iou_thresh"] < 1
    shape = (batch, n, lh, lw)
    pos = np.zeros(shape, bool)
    tcls = np.zeros((batch, n, classes, lh, lw), np.float32)
    wcls = np.zeros_like(tcls)
    entries: dict[tuple, list] = {}
    valid = _valid(truth, classes, d["max_boxes"])
    rows = truth[:, :5 * d["max_boxes"]].reshape(batch, -1, 5).astype(np.float64)
    for b, t in zip(*np.nonzero(valid)):
        tx, ty, tw, th, c = rows[b, t]
        ious = _shape_iou(anchors[:, 0] / net_w, anchors[:, 1] / net_h, tw, th)
        best = int(np.argmax(ious)) if ious.max() > 0 else 0
        i, j = min(int(tx * lw), lw - 1), min(int(ty * lh), lh - 1)     # darknet: x == 1 is the last cell
        cls = int(d["class_map"][int(c)])
        for k, a in sorted(slot_of.items(), key=lambda ka: ka[1]):
            if k != best and not (accumulate and ious[k] > d["iou_thresh"]):
                continue
            entry = (tx * lw - i, ty * lh - j, math.log(tw * net_w / anchors[k, 0]),
                     math.log(th * net_h / anchors[k, 1]), (2 - tw * th) * d["iou_normalizer"])
            slot = (b, a, j, i)
            entries[slot] = entries.get(slot, []) + [entry] if accumulate else [entry]
            if pos[slot]:                   # darknet: a second truth on this slot sets only its class
                tcls[b, a, cls, j, i] = on
            else:
                tcls[b, a, :, j, i] = off
                tcls[b, a, cls, j, i] = on
                wcls[b, a, :, j, i] = d["cls_normalizer"]
            pos[slot] = True
    flat = [(*slot, *e) for slot, es in entries.items() for e in es]
    cols = np.array(flat, np.float64).reshape(-1, 9)
    box = {k: torch.from_numpy(cols[:, m].astype(np.int64)) for m, k in enumerate("baji")}
    box.update({k: torch.from_numpy(cols[:, 4 + m].astype(np.float32)) for m, k in enumerate("xywhs")})
    return {"pos": pos, "cls": tcls, "wcls": wcls, "box": box, "average": accumulate, "valid": valid,
            "rows": rows}


def _best_iou(d: dict, z: torch.Tensor, a: dict) -> torch.Tensor:
    """(B, n, h, w): each slot's predicted box's best IoU with the image's truths (float64)."""
    batch, n, _e, lh, lw = z.shape
    net_w, net_h = d["net_wh"]
    anchors = torch.tensor(np.asarray(d["biases"], np.float64).reshape(-1, 2)[list(d["mask"])])
    zd = z.detach().double()
    ii = torch.arange(lw, dtype=torch.float64).view(1, 1, 1, lw)
    jj = torch.arange(lh, dtype=torch.float64).view(1, 1, lh, 1)
    px, py = (ii + torch.sigmoid(zd[:, :, 0])) / lw, (jj + torch.sigmoid(zd[:, :, 1])) / lh
    pw = torch.exp(zd[:, :, 2]) * anchors[:, 0].view(1, n, 1, 1) / net_w
    ph = torch.exp(zd[:, :, 3]) * anchors[:, 1].view(1, n, 1, 1) / net_h
    t_max = int(a["valid"].sum(1).max()) if a["valid"].size else 0
    if t_max == 0:
        return torch.zeros(batch, n, lh, lw, dtype=torch.float64)
    order = np.argsort(~a["valid"], axis=1, kind="stable")[:, :t_max]          # valid rows first
    rows = np.take_along_axis(a["rows"], order[..., None], axis=1)
    ok = torch.from_numpy(np.take_along_axis(a["valid"], order, axis=1))
    t = torch.from_numpy(rows).view(batch, 1, 1, 1, t_max, 5)
    p = [v.unsqueeze(-1) for v in (px, py, pw, ph)]
    ow = torch.minimum(p[0] + p[2] / 2, t[..., 0] + t[..., 2] / 2) - torch.maximum(p[0] - p[2] / 2, t[..., 0] - t[..., 2] / 2)
    oh = torch.minimum(p[1] + p[3] / 2, t[..., 1] + t[..., 3] / 2) - torch.maximum(p[1] - p[3] / 2, t[..., 1] - t[..., 3] / 2)
    inter = torch.where((ow < 0) | (oh < 0), torch.zeros_like(ow), ow * oh)
    union = p[2] * p[3] + t[..., 2] * t[..., 3] - inter
    iou = torch.where((inter == 0) | (union == 0), torch.zeros_like(inter), inter / union)
    iou = torch.where(ok.view(batch, 1, 1, 1, t_max), iou, torch.zeros_like(iou))
    return iou.max(-1).values


def yolo_loss(d: dict, x: torch.Tensor, truth: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(loss summed over this head, Darknet's cost Σδ²) for the head's raw input `x` (B, C, h, w)."""
    batch, _c, lh, lw = x.shape
    n, classes = len(d["mask"]), d["classes"]
    z = x.reshape(batch, n, 5 + classes, lh, lw)
    a = assign(d, truth.detach().cpu().numpy(), lh, lw)
    pos = torch.from_numpy(a["pos"])
    posf = pos.to(z.dtype)
    ignore = _best_iou(d, z, a) > d["ignore_thresh"]
    w_obj = torch.where(pos | ~ignore, torch.full_like(posf, d["obj_normalizer"]), torch.zeros_like(posf))
    tcls, wcls = torch.from_numpy(a["cls"]), torch.from_numpy(a["wcls"])
    box = a["box"]
    slot = (box["b"], box["a"], box["j"], box["i"])
    s = box["s"]
    if a["average"]:                 # the fork: each slot's box terms over its positive class deltas
        with torch.no_grad():
            k = ((wcls * (tcls - torch.sigmoid(z[:, :, 5:]))) > 0).sum(2)
            s = s / k[slot].clamp(min=1).to(s.dtype)
    zx, zy, zw, zh = (z[:, :, e][slot] for e in range(4))

    def bce(logit, target, weight):
        return (F.binary_cross_entropy_with_logits(logit, target, reduction="none") * weight).sum()

    loss = (bce(zx, box["x"], s) + bce(zy, box["y"], s)
            + (0.5 * s * (box["w"] - zw) ** 2).sum() + (0.5 * s * (box["h"] - zh) ** 2).sum()
            + bce(z[:, :, 4], posf, w_obj) + bce(z[:, :, 5:], tcls, wcls))
    with torch.no_grad():
        sig = torch.sigmoid(z)
        cost = 0.0
        for e, (zz, target) in enumerate(((torch.sigmoid(zx), box["x"]), (torch.sigmoid(zy), box["y"]),
                                          (zw, box["w"]), (zh, box["h"]))):
            per_slot = torch.zeros(batch, n, lh, lw, dtype=z.dtype)
            per_slot.index_put_(slot, s * (target - zz), accumulate=True)
            cost += float((per_slot ** 2).sum())
        cost += float(((w_obj * (posf - sig[:, :, 4])) ** 2).sum() + ((wcls * (tcls - sig[:, :, 5:])) ** 2).sum())
    return loss, cost
