"""metrics.py against its references: pycocotools' COCOeval (installed), a stable-sort port of
py-faster-rcnn's voc_eval.py written here from its rules, and Darknet's validate_detector_map rules."""
from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from darkpy.detect import Boxes
from darkpy.metrics import COCO_IDS, coco_evaluate, compute_map

KEYS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def random_case(rng, n_img=6, classes=3, crowd=0.1):
    """Truths and detections in pixels: detections are jittered copies of truths (some duplicated),
    plus random boxes; image sizes from 40 to 400 pixels so every COCO area range is used."""
    imgs, gts, dts = [], [], []
    for k in range(n_img):
        W, H = int(rng.integers(40, 400)), int(rng.integers(40, 400))
        imgs.append((W, H))
        for _ in range(int(rng.integers(0, 6))):
            w, h = rng.uniform(3, W / 2), rng.uniform(3, H / 2)
            x, y = rng.uniform(0, W - w), rng.uniform(0, H - h)
            c = int(rng.integers(0, classes))
            gts.append((k, c, [x, y, w, h], bool(rng.random() < crowd)))
            for _ in range(int(rng.integers(0, 3))):
                j = rng.normal(0, 0.15, 4) * [w, h, w, h]
                dc = c if rng.random() < 0.85 else int(rng.integers(0, classes))
                dts.append((k, dc, [x + j[0], y + j[1], max(w + j[2], 1), max(h + j[3], 1)], float(rng.random())))
        for _ in range(int(rng.integers(0, 4))):
            w, h = rng.uniform(2, W / 2), rng.uniform(2, H / 2)
            dts.append((k, int(rng.integers(0, classes)), [rng.uniform(0, W - w), rng.uniform(0, H - h), w, h],
                        float(rng.random())))
    if rng.random() < 0.5 and dts:     # ties in score
        for i in range(0, len(dts), 3):
            dts[i] = dts[i][:3] + (0.5,)
    return imgs, gts, dts


def pycoco_stats(imgs, gts, dts, classes, iou_thrs=None):
    pytest.importorskip("pycocotools")                 # the [test] extra installs it
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    gt = {"images": [{"id": k + 1, "width": w, "height": h} for k, (w, h) in enumerate(imgs)],
          "categories": [{"id": c + 1, "name": str(c)} for c in range(classes)],
          "annotations": [{"id": i + 1, "image_id": k + 1, "category_id": c + 1, "bbox": list(map(float, b)),
                           "area": float(b[2] * b[3]), "iscrowd": int(cr)} for i, (k, c, b, cr) in enumerate(gts)]}
    with contextlib.redirect_stdout(io.StringIO()):
        cg = COCO()
        cg.dataset = gt
        cg.createIndex()
        if not dts:
            return None
        cd = cg.loadRes([{"image_id": k + 1, "category_id": c + 1, "bbox": list(map(float, b)), "score": s}
                         for k, c, b, s in dts])
        ev = COCOeval(cg, cd, "bbox")
        if iou_thrs is not None:
            ev.params.iouThrs = np.asarray(iou_thrs)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev


def ours(gts, dts, classes, iou_thrs=None):
    return coco_evaluate([d[0] for d in dts], [d[1] for d in dts], [d[2] for d in dts], [d[3] for d in dts],
                         [g[0] for g in gts], [g[1] for g in gts], [g[2] for g in gts], [g[3] for g in gts],
                         classes=classes, iou_thrs=iou_thrs)


@pytest.mark.parametrize("seed", range(40))
def test_coco_equals_pycocotools_on_random_cases(seed):
    rng = np.random.default_rng(seed)
    classes = int(rng.integers(1, 5))
    imgs, gts, dts = random_case(rng, n_img=int(rng.integers(1, 9)), classes=classes)
    ref = pycoco_stats(imgs, gts, dts, classes)
    if ref is None:
        pytest.skip("no detections drawn")
    mine = ours(gts, dts, classes)
    for i, key in enumerate(KEYS):
        assert mine.stats[key] == pytest.approx(ref.stats[i], abs=1e-12), key
    np.testing.assert_allclose(mine.precision, ref.eval["precision"][:, :, :, :, 2], atol=1e-12)
    np.testing.assert_allclose(mine.recall, ref.eval["recall"], atol=1e-12)


def test_coco_max_dets_and_many_boxes():
    """More than 100 detections in an image: COCO keeps the 100 best per image and class."""
    rng = np.random.default_rng(7)
    imgs, gts, dts = [(300, 300)], [], []
    for _ in range(30):
        x, y = rng.uniform(0, 250, 2)
        gts.append((0, 0, [x, y, 40, 40], False))
    for _ in range(260):
        g = gts[int(rng.integers(0, 30))][2]
        dts.append((0, 0, [g[0] + rng.normal(0, 6), g[1] + rng.normal(0, 6), 40, 40], float(rng.random())))
    ref = pycoco_stats(imgs, gts, dts, 1)
    mine = ours(gts, dts, 1)
    for i, key in enumerate(KEYS):
        assert mine.stats[key] == pytest.approx(ref.stats[i], abs=1e-12), key


def test_coco_custom_iou_thresholds():
    rng = np.random.default_rng(3)
    imgs, gts, dts = random_case(rng, n_img=5, classes=2)
    thrs = [0.3, 0.5, 0.7]
    ref = pycoco_stats(imgs, gts, dts, 2, thrs)
    mine = ours(gts, dts, 2, thrs)
    assert mine.stats["AP"] == pytest.approx(ref.stats[0], abs=1e-12)
    assert mine.stats["AP50"] == pytest.approx(ref.stats[1], abs=1e-12)


def test_coco_rules_by_hand():
    """IoU exactly at the threshold counts (>=); a detection whose best truth is taken falls back to
    the best free one; a crowd truth absorbs any number of detections without FPs."""
    g = [(0, 0, [0, 0, 10, 10], False), (0, 0, [4, 0, 10, 10], False)]
    d = [(0, 0, [0, 0, 10, 10], 0.9), (0, 0, [1, 0, 10, 10], 0.8)]     # second: best is taken -> the other
    r = ours(g, d, 1, [0.5])
    assert r.stats["AP"] == pytest.approx(1.0)
    # IoU of [0,0,10,10] with [0,0,10,5] is exactly 0.5
    r = ours([(0, 0, [0, 0, 10, 5], False)], [(0, 0, [0, 0, 10, 10], 0.9)], 1, [0.5])
    assert r.stats["AP"] == pytest.approx(1.0)
    crowd = [(0, 0, [0, 0, 100, 100], True), (0, 0, [200, 200, 10, 10], False)]
    dets = [(0, 0, [10, 10, 20, 20], 0.9), (0, 0, [50, 50, 20, 20], 0.8), (0, 0, [200, 200, 10, 10], 0.7)]
    r = ours(crowd, dets, 1, [0.5])
    assert r.stats["AP"] == pytest.approx(1.0)      # the two boxes inside the crowd region are ignored


def _as_darkpy(imgs, gts, dts, classes):
    """The same case as darkpy's per-image Boxes (relative centre/size) and truth rows."""
    boxes, truths, difficult = [], [], []
    for k, (W, H) in enumerate(imgs):
        mine = [d for d in dts if d[0] == k]
        b = np.array([[(x + w / 2) / W, (y + h / 2) / H, w / W, h / H]
                      for _, _, (x, y, w, h), _ in mine]).reshape(-1, 4)
        p = np.zeros((len(mine), classes))
        for i, (_, c, _, s) in enumerate(mine):
            p[i, c] = s
        boxes.append(Boxes(b, p.max(axis=1, initial=0), p))
        tg = [g for g in gts if g[0] == k]
        truths.append(np.array([[(x + w / 2) / W, (y + h / 2) / H, w / W, h / H, c]
                                for _, c, (x, y, w, h), _ in tg]).reshape(-1, 5))
        difficult.append(np.array([g[3] for g in tg], bool))
    return boxes, truths, difficult


@pytest.mark.parametrize("seed", range(10))
def test_compute_map_coco_metric_on_relative_boxes(seed):
    """compute_map(metric="coco") on relative boxes (one box per detection here) equals pycocotools on
    the pixel boxes, up to the rounding of the relative/pixel round trip."""
    rng = np.random.default_rng(100 + seed)
    imgs, gts, dts = random_case(rng, n_img=5, classes=2, crowd=0.0)
    # keep detections inside their image (darkpy clips, as Darknet's coco results)
    dts = [(k, c, [max(x, 0), max(y, 0), min(w, imgs[k][0] - max(x, 0)), min(h, imgs[k][1] - max(y, 0))], s)
           for k, c, (x, y, w, h), s in dts]
    ref = pycoco_stats(imgs, gts, dts, 2)
    if ref is None:
        pytest.skip("no detections drawn")
    boxes, truths, dif = _as_darkpy(imgs, gts, dts, 2)
    r = compute_map(boxes, truths, 2, metric="coco", sizes=imgs, difficult=dif)
    for i, key in enumerate(KEYS):
        assert r.coco[key] == pytest.approx(ref.stats[i], abs=1e-9), key
    assert r.map == r.coco["AP"]
    assert "maxDets=100" in r.format()


# -- voc_eval.py ---------------------------------------------------------------------------------------

def voc_eval_reference(dets, gts, ovthresh, use_07):
    """py-faster-rcnn voc_eval.py's body for one class (rules re-stated here; argsort made stable).
    dets: list of (image, score, [xmin, ymin, xmax, ymax]); gts: image -> (boxes (n, 4), difficult)."""
    npos = sum(int((~d).sum()) for _, d in gts.values())
    det = {k: [False] * len(v[1]) for k, v in gts.items()}
    conf = np.array([d[1] for d in dets])
    BB = np.array([d[2] for d in dets]).reshape(-1, 4)
    ids = [dets[i][0] for i in np.argsort(-conf, kind="stable")]
    BB = BB[np.argsort(-conf, kind="stable")]
    tp, fp = np.zeros(len(ids)), np.zeros(len(ids))
    for d in range(len(ids)):
        bb = BB[d]
        ovmax = -np.inf
        BBGT, dif = gts.get(ids[d], (np.zeros((0, 4)), np.zeros(0, bool)))
        if BBGT.size > 0:
            ixmin = np.maximum(BBGT[:, 0], bb[0])
            iymin = np.maximum(BBGT[:, 1], bb[1])
            ixmax = np.minimum(BBGT[:, 2], bb[2])
            iymax = np.minimum(BBGT[:, 3], bb[3])
            iw = np.maximum(ixmax - ixmin + 1., 0.)
            ih = np.maximum(iymax - iymin + 1., 0.)
            inters = iw * ih
            uni = ((bb[2] - bb[0] + 1.) * (bb[3] - bb[1] + 1.) +
                   (BBGT[:, 2] - BBGT[:, 0] + 1.) * (BBGT[:, 3] - BBGT[:, 1] + 1.) - inters)
            overlaps = inters / uni
            ovmax = np.max(overlaps)
            jmax = np.argmax(overlaps)
        if ovmax > ovthresh:
            if not dif[jmax]:
                if not det[ids[d]][jmax]:
                    tp[d] = 1.
                    det[ids[d]][jmax] = True
                else:
                    fp[d] = 1.
        else:
            fp[d] = 1.
    fp, tp = np.cumsum(fp), np.cumsum(tp)
    rec = tp / float(npos)
    prec = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
    if use_07:
        ap = 0.
        for t in np.arange(0., 1.1, 0.1):
            p = 0 if np.sum(rec >= t) == 0 else np.max(prec[rec >= t])
            ap = ap + p / 11.
        return ap
    mrec = np.concatenate(([0.], rec, [1.]))
    mpre = np.concatenate(([0.], prec, [0.]))
    for i in range(mpre.size - 1, 0, -1):
        mpre[i - 1] = np.maximum(mpre[i - 1], mpre[i])
    i = np.where(mrec[1:] != mrec[:-1])[0]
    return np.sum((mrec[i + 1] - mrec[i]) * mpre[i + 1])


@pytest.mark.parametrize("seed", range(20))
def test_voc_equals_voc_eval(seed):
    rng = np.random.default_rng(500 + seed)
    classes = 2
    imgs, gts, dts = random_case(rng, n_img=6, classes=classes, crowd=0.2)    # crowd -> difficult here
    boxes, truths, dif = _as_darkpy(imgs, gts, dts, classes)
    r = compute_map(boxes, truths, classes, 0.5, metric="voc", sizes=imgs, difficult=dif)
    from darkpy.metrics import voc_corners
    for c in range(classes):
        cd, cg = [], {}
        for k, (W, H) in enumerate(imgs):
            corners = voc_corners(boxes[k].boxes, (W, H), clip=True)
            cd += [(k, float(boxes[k].probs[i, c]), corners[i]) for i in range(len(corners))
                   if boxes[k].probs[i, c] > 0]
            sel = truths[k][:, 4] == c
            if sel.any():
                cg[k] = (voc_corners(truths[k][sel], (W, H), clip=False), dif[k][sel])
        npos = sum(int((~d).sum()) for _, d in cg.values())
        if npos == 0 or not cd:
            continue
        assert r.classes[c].ap11 == pytest.approx(voc_eval_reference(cd, cg, 0.5, True), abs=1e-12)
        assert r.classes[c].ap_all == pytest.approx(voc_eval_reference(cd, cg, 0.5, False), abs=1e-12)
        assert r.classes[c].truths == npos


# -- darknet ---------------------------------------------------------------------------------------------

def test_darknet_difficult_and_average_iou():
    """A detection on a difficult truth leaves the ranking (no FP) but Darknet still counts it as an FP
    at conf_thresh; Darknet's average IoU divides by TP + FP."""
    truths = [np.array([(0.25, 0.25, 0.2, 0.2, 0), (0.75, 0.75, 0.2, 0.2, 0)])]
    dets = [Boxes(np.array([(0.25, 0.25, 0.2, 0.2), (0.75, 0.75, 0.2, 0.2)]), np.ones(2),
                  np.array([[0.9], [0.8]]))]
    plain = compute_map(dets, truths, 1)
    assert plain.classes[0].ap_all == pytest.approx(1.0) and plain.classes[0].truths == 2
    hard = compute_map(dets, truths, 1, difficult=[np.array([False, True])])
    assert hard.classes[0].truths == 1 and (hard.classes[0].tp, hard.classes[0].fp) == (1, 0)
    assert hard.classes[0].ap_all == pytest.approx(1.0)
    assert (hard.tp, hard.fp) == (1, 1)
    assert hard.darknet_avg_iou == pytest.approx(0.5) and hard.avg_iou == pytest.approx(1.0)
    voc = compute_map(dets, truths, 1, metric="voc", difficult=[np.array([False, True])])
    assert (voc.classes[0].tp, voc.classes[0].fp, voc.classes[0].ap_all) == (1, 0, pytest.approx(1.0))


def test_darknet_threshold_counts_follow_box_order():
    """Darknet's TP at conf_thresh: in box order, a truth already claimed by an earlier box of the image
    (even one below the threshold) makes the later box an FP."""
    truths = [np.array([(0.5, 0.5, 0.2, 0.2, 0)])]
    dets = [Boxes(np.array([(0.5, 0.5, 0.2, 0.2), (0.51, 0.5, 0.2, 0.2)]), np.ones(2), np.array([[0.1], [0.9]]))]
    r = compute_map(dets, truths, 1, conf_thresh=0.25)
    assert (r.tp, r.fp) == (0, 1)
    assert r.classes[0].tp == 1      # the ranking still gives the truth to the 0.9 box


def test_coco_ids_are_coco_91():
    assert len(COCO_IDS) == 80 and COCO_IDS[0] == 1 and COCO_IDS[-1] == 90 and 12 not in COCO_IDS


@pytest.mark.slow
def test_faster_than_pycocotools():
    """The evaluator stays vectorised: on 1,000 images (~9 detections each) COCO rules take well under
    half of pycocotools' time (a ratio, so a loaded machine slows both)."""
    import time
    rng = np.random.default_rng(0)
    imgs, gts, dts = [], [], []
    for k in range(1000):
        imgs.append((640, 480))
        for _ in range(3):
            x, y, w, h = rng.uniform(50, 400), rng.uniform(50, 300), rng.uniform(20, 200), rng.uniform(20, 150)
            c = int(rng.integers(0, 5))
            gts.append((k, c, [x, y, w, h], False))
            for _ in range(3):
                j = rng.normal(0, 8, 4)
                dts.append((k, int(rng.integers(0, 5)), [x + j[0], y + j[1], w + j[2], h + j[3]], float(rng.random())))
    ours(gts[:10], dts[:10], 5)                     # compile outside the timing
    t0 = time.perf_counter()
    mine = ours(gts, dts, 5)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = pycoco_stats(imgs, gts, dts, 5)
    t_ref = time.perf_counter() - t0
    assert mine.stats["AP"] == pytest.approx(ref.stats[0], abs=1e-12)
    assert t_ours < 0.5 * t_ref, (t_ours, t_ref)


# -- AlexeyAB's validate_detector_map, restated -------------------------------------------------------------

def _c_iou(a, b):
    """Darknet's box_iou on centre/size boxes."""
    def overlap(x1, w1, x2, w2):
        return min(x1 + w1 / 2, x2 + w2 / 2) - max(x1 - w1 / 2, x2 - w2 / 2)
    w, h = overlap(a[0], a[2], b[0], b[2]), overlap(a[1], a[3], b[1], b[3])
    inter = w * h if w > 0 and h > 0 else 0.0
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def darknet_reference(dets, truths, difficult, classes, iou_thresh, thresh, points):
    """The loop of detector.c's validate_detector_map, step by step (ranking sort made stable)."""
    detections, truth_count = [], [0] * classes
    unique = 0
    tp_t = fp_t = 0
    avg_iou = 0.0
    for d, t, dif in zip(dets, truths, difficult):
        regular, hard = t[~dif], t[dif]
        for row in regular:
            truth_count[int(row[4])] += 1
        checkpoint = len(detections)
        for i in range(len(d.boxes)):
            for c in range(classes):
                prob = d.probs[i, c]
                if prob <= 0:
                    continue
                detections.append([d.boxes[i], prob, c, -1])
                truth_index, max_iou = -1, 0.0
                for j, row in enumerate(regular):
                    cur = _c_iou(d.boxes[i], row)
                    if cur > iou_thresh and c == int(row[4]) and cur > max_iou:
                        max_iou, truth_index = cur, unique + j
                if truth_index > -1:
                    detections[-1][3] = truth_index
                else:
                    for row in hard:
                        if _c_iou(d.boxes[i], row) > iou_thresh and c == int(row[4]):
                            detections.pop()
                            break
                if prob > thresh:
                    found = any(x[3] == truth_index for x in detections[checkpoint:len(detections) - 1])
                    if truth_index > -1 and not found:
                        avg_iou += max_iou
                        tp_t += 1
                    else:
                        fp_t += 1
        unique += len(regular)
    avg_iou = avg_iou / (tp_t + fp_t) if tp_t + fp_t else 0.0
    order = sorted(range(len(detections)), key=lambda k: -detections[k][1])
    flags = set()
    tp, fp = [0] * classes, [0] * classes
    pr = [[] for _ in range(classes)]         # per rank: (precision, recall) of every class
    for k in order:
        _, _, c, ti = detections[k]
        if ti > -1 and ti not in flags:
            flags.add(ti)
            tp[c] += 1
        else:
            fp[c] += 1
        for i in range(classes):
            prec = tp[i] / (tp[i] + fp[i]) if tp[i] + fp[i] else 0.0
            rec = tp[i] / truth_count[i] if truth_count[i] else 0.0
            pr[i].append((prec, rec))
    aps = []
    for i in range(classes):
        ap = 0.0
        if not pr[i]:
            aps.append(0.0)
            continue
        if points == 0:
            last_rec, last_prec = pr[i][-1][1], pr[i][-1][0]
            for rank in range(len(pr[i]) - 2, -1, -1):
                ap += (last_rec - pr[i][rank][1]) * last_prec
                last_rec = pr[i][rank][1]
                last_prec = max(last_prec, pr[i][rank][0])
            ap += last_rec * last_prec
        else:
            for p in range(points):
                cur_rec = p * 1.0 / (points - 1)
                ap += max([prec for prec, rec in pr[i] if rec >= cur_rec], default=0.0)
            ap /= points
        aps.append(ap)
    return aps, truth_count, tp_t, fp_t, avg_iou


@pytest.mark.parametrize("seed", range(15))
def test_darknet_equals_validate_detector_map(seed):
    rng = np.random.default_rng(900 + seed)
    classes = 3
    imgs, gts, dts = random_case(rng, n_img=5, classes=classes, crowd=0.15)
    boxes, truths, dif = _as_darkpy(imgs, gts, dts, classes)
    for iou in (0.5, 0.7):
        r = compute_map(boxes, truths, classes, iou, 0.25, difficult=dif)
        for points, key in ((0, "ap_all"), (11, "ap11"), (101, "ap101")):
            aps, counts, tp, fp, avg = darknet_reference(boxes, truths, dif, classes, iou, 0.25, points)
            for c in range(classes):
                assert getattr(r.classes[c], key) == pytest.approx(aps[c], abs=1e-12), (key, c)
                assert r.classes[c].truths == counts[c]
        assert (r.tp, r.fp) == (tp, fp)
        assert r.darknet_avg_iou == pytest.approx(avg, abs=1e-12)
        scored = [aps[c] for c in range(classes) if counts[c]]
        assert r.map101 == pytest.approx(np.mean(scored) if scored else 0.0, abs=1e-12)
