"""pycocotools' COCOeval for boxes (iouType="bbox", default Params), vectorised: the greedy matching
of evaluateImg runs in one numba kernel over every (class, image) group, accumulate and summarize in
numpy. metrics.py builds its `coco` metric on `coco_evaluate`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kernels import jit

#: pycocotools' default grids (Params.setDetParams), float artefacts included on purpose
COCO_IOUS = np.linspace(.5, 0.95, int(np.round((0.95 - .5) / .05)) + 1, endpoint=True)
COCO_RECALLS = np.linspace(.0, 1.00, int(np.round((1.00 - .0) / .01)) + 1, endpoint=True)
COCO_AREAS = {"all": (0.0, 1e5 ** 2), "small": (0.0, 32.0 ** 2), "medium": (32.0 ** 2, 96.0 ** 2),
              "large": (96.0 ** 2, 1e5 ** 2)}
COCO_MAX_DETS = (1, 10, 100)
#: COCO's 91 category ids for its 80 classes, in coco.names order (Darknet's coco_ids)
COCO_IDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 27, 28,
            31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55,
            56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84,
            85, 86, 87, 88, 89, 90)


@jit
def _coco_match(d_grp, g_lo, g_hi, ious_flat, iou_off, g_ign, g_crowd, d_out, thrs, dtm, dtig):
    """COCOeval.evaluateImg's greedy matching for every (class, image) group and area range.

    d_grp: (G+1,) group starts into the detections (sorted by score within a group); g_lo/g_hi: (G,)
    the group's truths; ious_flat/iou_off: each group's (nd, ng) IoU matrix, row-major; g_ign: (A, Ng)
    truth ignored (crowd or area out of range); d_out: (A, Nd) detection area out of range; outputs
    dtm, dtig: (A, T, Nd)."""
    A, T = g_ign.shape[0], thrs.shape[0]
    for g in range(d_grp.shape[0] - 1):
        d0, d1 = d_grp[g], d_grp[g + 1]
        t0, t1 = g_lo[g], g_hi[g]
        ng = t1 - t0
        base = iou_off[g]
        order = np.empty(ng, np.int64)
        gtm = np.zeros(ng, np.bool_)
        for a in range(A):
            n = 0
            for j in range(ng):             # non-ignored truths first, each part in file order
                if not g_ign[a, t0 + j]:
                    order[n] = j
                    n += 1
            for j in range(ng):
                if g_ign[a, t0 + j]:
                    order[n] = j
                    n += 1
            for t in range(T):
                gtm[:] = False
                for d in range(d0, d1):
                    best = min(thrs[t], 1 - 1e-10)
                    m = -1
                    for q in range(ng):
                        j = order[q]
                        if gtm[j] and not g_crowd[t0 + j]:
                            continue
                        if m > -1 and not g_ign[a, t0 + m] and g_ign[a, t0 + j]:
                            break
                        v = ious_flat[base + (d - d0) * ng + j]
                        if v < best:
                            continue
                        best = v
                        m = j
                    if m == -1:
                        dtig[a, t, d] = d_out[a, d]
                        continue
                    dtig[a, t, d] = g_ign[a, t0 + m]
                    dtm[a, t, d] = True
                    gtm[m] = True


def _pair_iou(d: np.ndarray, g: np.ndarray, crowd: np.ndarray) -> np.ndarray:
    """pycocotools' maskUtils.iou for matching rows of detections d and truths g (n, 4) x, y, w, h: a
    crowd truth's IoU is over the detection's area."""
    iw = np.minimum(d[:, 0] + d[:, 2], g[:, 0] + g[:, 2]) - np.maximum(d[:, 0], g[:, 0])
    ih = np.minimum(d[:, 1] + d[:, 3], g[:, 1] + g[:, 3]) - np.maximum(d[:, 1], g[:, 1])
    inter = np.where((iw > 0) & (ih > 0), iw * ih, 0.0)
    da = d[:, 2] * d[:, 3]
    union = np.where(crowd, da, da + g[:, 2] * g[:, 3] - inter)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


@dataclass
class CocoEval:
    """COCOeval's arrays: precision (T, R, K, A) at maxDets=100, recall (T, K, A, M); -1 where a class
    has no (non-ignored) truths."""

    precision: np.ndarray
    recall: np.ndarray
    iou_thrs: np.ndarray
    stats: dict


def coco_evaluate(dt_img, dt_cls, dt_box, dt_score, gt_img, gt_cls, gt_box, gt_crowd=None, gt_area=None,
                  classes: int | None = None, iou_thrs=None) -> CocoEval:
    """COCOeval (iouType="bbox", useCats=1, default params) on flat arrays: detections (image index,
    class index, [x, y, w, h] pixels, score) and truths (image index, class, box, crowd flag, area
    (default w*h)). Image indices stand for COCO image ids in sorted order; the detections of one
    image and class keep their given order on equal scores."""
    dt_img, dt_cls = np.asarray(dt_img, np.int64), np.asarray(dt_cls, np.int64)
    dt_box, dt_score = np.asarray(dt_box, np.float64).reshape(-1, 4), np.asarray(dt_score, np.float64)
    gt_img, gt_cls = np.asarray(gt_img, np.int64), np.asarray(gt_cls, np.int64)
    gt_box = np.asarray(gt_box, np.float64).reshape(-1, 4)
    gt_crowd = np.zeros(len(gt_img), bool) if gt_crowd is None else np.asarray(gt_crowd, bool)
    gt_area = gt_box[:, 2] * gt_box[:, 3] if gt_area is None else np.asarray(gt_area, np.float64)
    thrs = COCO_IOUS if iou_thrs is None else np.asarray(iou_thrs, np.float64)
    K = classes if classes is not None else int(max(dt_cls.max(initial=-1), gt_cls.max(initial=-1)) + 1)
    n_img = int(max(dt_img.max(initial=-1), gt_img.max(initial=-1)) + 1)
    areas = np.array(list(COCO_AREAS.values()))
    A, T, R, M = len(areas), len(thrs), len(COCO_RECALLS), len(COCO_MAX_DETS)

    # detections: sorted by (class, image, score desc, given order), top 100 per group
    order = np.lexsort((-dt_score, dt_img, dt_cls))
    key = dt_cls[order] * n_img + dt_img[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, np.int64)
    rank = np.arange(len(key)) - np.repeat(starts, np.diff(np.r_[starts, len(key)]))
    keep = rank < COCO_MAX_DETS[-1]
    order, key, rank = order[keep], key[keep], rank[keep]
    d_box, d_score, d_cls = dt_box[order], dt_score[order], dt_cls[order]
    d_area = d_box[:, 2] * d_box[:, 3]
    grp = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, np.int64)
    d_grp = np.r_[grp, len(key)].astype(np.int64)
    gkey_d = key[grp]

    gorder = np.lexsort((np.arange(len(gt_img)), gt_img, gt_cls))
    g_box, g_cls, g_crowd = gt_box[gorder], gt_cls[gorder], gt_crowd[gorder]
    g_area = gt_area[gorder]
    g_key = g_cls * n_img + gt_img[gorder]
    g_lo = np.searchsorted(g_key, gkey_d, "left").astype(np.int64)
    g_hi = np.searchsorted(g_key, gkey_d, "right").astype(np.int64)
    # every group's (nd, ng) IoU matrix, row-major, in one flat vectorised pass
    nd = np.diff(d_grp)
    ng = g_hi - g_lo
    sizes = nd * ng
    offs = np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int64) if len(sizes) else np.zeros(0, np.int64)
    grp_of = np.repeat(np.arange(len(sizes)), sizes)
    q = np.arange(int(sizes.sum())) - np.repeat(offs, sizes)
    ngr = np.maximum(ng[grp_of], 1)
    di = d_grp[:-1][grp_of] + q // ngr
    gi = g_lo[grp_of] + q % ngr
    ious_flat = _pair_iou(d_box[di], g_box[gi], g_crowd[gi])
    g_ign = g_crowd[None, :] | (g_area[None, :] < areas[:, :1]) | (g_area[None, :] > areas[:, 1:])
    d_out = (d_area[None, :] < areas[:, :1]) | (d_area[None, :] > areas[:, 1:])
    dtm = np.zeros((A, T, len(d_box)), bool)
    dtig = np.zeros((A, T, len(d_box)), bool)
    _coco_match(d_grp, g_lo, g_hi, ious_flat, offs, g_ign, g_crowd, d_out, thrs, dtm, dtig)

    precision = -np.ones((T, R, K, A))
    recall = -np.ones((T, K, A, M))
    npig = np.zeros((K, A), np.int64)
    np.add.at(npig, (np.repeat(g_cls, A), np.tile(np.arange(A), len(g_cls))), (~g_ign).T.ravel())
    cls_lo = np.searchsorted(d_cls, np.arange(K), "left")
    cls_hi = np.searchsorted(d_cls, np.arange(K), "right")
    eps = np.spacing(1)
    for k in range(K):
        idx = np.arange(cls_lo[k], cls_hi[k])
        idx = idx[np.argsort(-d_score[idx], kind="mergesort")]      # images in id order, then score
        for a in range(A):
            if npig[k, a] == 0:
                continue
            for mi, md in enumerate(COCO_MAX_DETS):
                sel = idx[rank[idx] < md]
                tps = dtm[a][:, sel] & ~dtig[a][:, sel]
                fps = ~dtm[a][:, sel] & ~dtig[a][:, sel]
                nd = len(sel)
                tp = np.cumsum(tps, axis=1, dtype=np.float64)
                fp = np.cumsum(fps, axis=1, dtype=np.float64)
                rc = tp / npig[k, a]
                recall[:, k, a, mi] = rc[:, -1] if nd else 0
                if md != COCO_MAX_DETS[-1]:
                    continue
                pr = tp / (fp + tp + eps)
                pr = np.maximum.accumulate(pr[:, ::-1], axis=1)[:, ::-1] if nd else pr
                for t in range(T):
                    q = np.zeros(R)
                    inds = np.searchsorted(rc[t], COCO_RECALLS, side="left")
                    ok = inds < nd
                    q[ok] = pr[t, inds[ok]]
                    precision[t, :, k, a] = q
    return CocoEval(precision, recall, thrs, _coco_stats(precision, recall, thrs))


def _coco_stats(precision, recall, thrs) -> dict:
    """COCOeval.summarize's numbers (-1 where nothing is defined)."""
    def mean(s):
        s = s[s > -1]
        return float(np.mean(s)) if s.size else -1.0

    def at(t):
        hit = np.flatnonzero(np.isclose(thrs, t, rtol=0, atol=1e-12))
        return hit[0] if hit.size else None

    area = {name: i for i, name in enumerate(COCO_AREAS)}
    st = {"AP": mean(precision[:, :, :, 0])}
    for key, t in (("AP50", 0.5), ("AP75", 0.75)):
        i = at(t)
        st[key] = mean(precision[i, :, :, 0]) if i is not None else -1.0
    for key, a in (("APs", "small"), ("APm", "medium"), ("APl", "large")):
        st[key] = mean(precision[:, :, :, area[a]])
    for mi, md in enumerate(COCO_MAX_DETS):
        st[f"AR{md}"] = mean(recall[:, :, 0, mi])
    for key, a in (("ARs", "small"), ("ARm", "medium"), ("ARl", "large")):
        st[key] = mean(recall[:, :, area[a], -1])
    return st
