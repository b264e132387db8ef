"""[yolo]: Darknet golden forward + decoded boxes, and the training deltas against a slow numpy
reference (matching, ignore, anchors outside the mask, overlapping truths) and against the float64
numerical gradient of the loss they are the negative gradient of."""
from __future__ import annotations

import math

import numpy as np
import pytest

from darkpy.errors import CfgError, StateError
from darkpy.kernels.boxes import IOU_KINDS, iou_kind_grad
from darkpy.layers import FAMILIES_MISSING
from darkpy.layers.yolo import letterbox_correct
from darkpy.network import load_network, network_from_text
from heads_ref import (bce_logit, ciou_alpha, head_state, ref_iou, ref_quality, sigmoid, valid_truths)
from helpers import assert_close, golden_dir, numerical_grad, read_f32

ANCHORS = [(3, 4), (6, 5), (5, 9), (10, 12), (14, 9), (20, 24)]   # pixels of a 32x32 net
NET = 32
LW = LH = 4
CLASSES = 3


def yolo_cfg(mask="0,1,2", extra="", lw=LW, lh=LH, classes=CLASSES, num=6, max_boxes=8, ignore=".5",
             truth_thresh="1"):
    anchors = ", ".join(f"{w},{h}" for w, h in ANCHORS[:num])
    c = len(mask.split(",")) * (classes + 5)
    return (f"[net]\nwidth={lw}\nheight={lh}\nchannels={c}\n\n[yolo]\nmask={mask}\nanchors={anchors}\n"
            f"classes={classes}\nnum={num}\nmax={max_boxes}\nignore_thresh={ignore}\ntruth_thresh={truth_thresh}\n"
            f"{extra}\n")


def _yolo_golden_head(d, index, lw, lh, mask):
    cfg = yolo_cfg(mask, "jitter=.3\nrandom=0", lw, lh, classes=2, max_boxes=90, ignore=".7")
    cfg = cfg.replace(", ".join(f"{w},{h}" for w, h in ANCHORS), "2,3, 4,5, 6,4, 8,9, 12,7, 14,12")
    net = network_from_text(cfg)
    net.forward(read_f32(d / f"layer_{index - 1:03d}.f32").reshape(1, 21, lh, lw))
    return net.layers[0]


def test_golden_yolo_forward_and_dets():
    d = golden_dir("forward", "yolo")
    rows = []
    for index, lw, lh, mask in ((6, 4, 3, "3,4,5"), (12, 8, 6, "0,1,2")):
        layer = _yolo_golden_head(d, index, lw, lh, mask)
        assert_close(layer.output.ravel(), read_f32(d / f"layer_{index:03d}.f32"), 1e-5, 1e-6, f"layer {index}")
        boxes, obj, probs = layer.get_detections(0, 0.55, 16, 12)
        letterbox_correct(boxes, 48, 30, 16, 12)
        rows.append(np.concatenate([boxes, obj[:, None], probs], axis=1))
    dets = np.loadtxt(d / "dets.txt")
    assert_close(np.concatenate(rows), dets[:, 1:], 1e-5, 1e-6, "dets.txt")


@pytest.mark.skipif(bool({"convolutional", "pooling", "route", "upsample"} & set(FAMILIES_MISSING)),
                    reason="needs the conv/maxpool/route/upsample layers")
def test_golden_yolo_whole_network():
    d = golden_dir("forward", "yolo")
    net = load_network(d / "net.cfg", d / "net.weights")
    net.forward(read_f32(d / "input.f32").reshape(1, 3, 12, 16))
    for i, layer in enumerate(net.layers):
        assert_close(layer.output.ravel(), read_f32(d / f"layer_{i:03d}.f32"), 1e-5, 1e-5, f"layer {i}")


# -- training reference -------------------------------------------------------------------------------

def yolo_reference(z, truth, *, mask, classes=CLASSES, lw=LW, lh=LH, net=NET, ignore=0.5, truth_thresh=1.0,
                   iou_norm=1.0, obj_norm=1.0, cls_norm=1.0, sxy=1.0, eps=0.0, iou_thresh=1.0, max_boxes=8,
                   new_coords=False, thresh_kind="iou"):
    """Darknet's yolo training forward, slowly. Returns (act, T, W): delta = W·(T - act) elementwise."""
    B, n, E = z.shape[0], len(mask), 5 + classes
    z = z.reshape(B, n, E, lh, lw)
    act = z.copy() if new_coords else sigmoid(z)
    act[:, :, :2] = act[:, :, :2] * sxy - (sxy - 1) / 2
    act[:, :, 2:4] = z[:, :, 2:4]
    T, W = np.zeros_like(z), np.zeros_like(z)

    def size(t, anchor):        # the w (or h) target, and the predicted size of a raw output
        return math.sqrt(t * net / (4 * anchor)) if new_coords else math.log(t * net / anchor)

    def pred_size(v, anchor):
        return (4 * v * v if new_coords else math.exp(v)) * anchor / net

    def set_box(b, a, j, i, t, anchor):
        w = (2 - t[2] * t[3]) * iou_norm
        target = np.array((t[0] * lw - i, t[1] * lh - j, size(t[2], anchor[0]), size(t[3], anchor[1])))
        if iou_thresh < 1:      # the fork: box deltas of several truths on a slot add up (averaged below)
            w_old, t_old = W[b, a, :4, j, i].copy(), T[b, a, :4, j, i].copy()
            W[b, a, :4, j, i] = w_old + w
            T[b, a, :4, j, i] = (w_old * t_old + w * target) / (w_old + w)
            return
        W[b, a, :4, j, i] = w
        T[b, a, :4, j, i] = target

    def set_class(b, a, j, i, c):
        on, off = 1 - eps / 2, eps / 2
        if W[b, a, 5, j, i] * (T[b, a, 5, j, i] - act[b, a, 5, j, i]) != 0:
            T[b, a, 5 + c, j, i], W[b, a, 5 + c, j, i] = on, cls_norm
            return
        T[b, a, 5:, j, i], W[b, a, 5:, j, i] = off, cls_norm
        T[b, a, 5 + c, j, i] = on

    for b in range(B):
        boxes = valid_truths(truth[b], classes, max_boxes)
        for j in range(lh):
            for i in range(lw):
                for a in range(n):
                    aw, ah = ANCHORS[mask[a]]
                    pred = ((i + act[b, a, 0, j, i]) / lw, (j + act[b, a, 1, j, i]) / lh,
                            pred_size(z[b, a, 2, j, i], aw), pred_size(z[b, a, 3, j, i], ah))
                    ious = [ref_iou(pred, t[:4]) for t in boxes]
                    best = max(ious, default=0.0)
                    T[b, a, 4, j, i], W[b, a, 4, j, i] = 0.0, obj_norm
                    if best > ignore:
                        W[b, a, 4, j, i] = 0.0
                    if best > truth_thresh:
                        t = boxes[int(np.argmax(ious))]
                        T[b, a, 4, j, i], W[b, a, 4, j, i] = 1.0, obj_norm
                        set_class(b, a, j, i, t[4])
                        set_box(b, a, j, i, t, (aw, ah))
        for t in boxes:
            i, j = min(int(t[0] * lw), lw - 1), min(int(t[1] * lh), lh - 1)
            shape = [ref_iou((0, 0, w / net, h / net), (0, 0, t[2], t[3])) for w, h in ANCHORS]
            best_n = int(np.argmax(shape))      # always plain IoU; iou_thresh_kind only for the extras
            extra = [ref_quality(thresh_kind, (0, 0, w / net, h / net), (0, 0, t[2], t[3])) for w, h in ANCHORS]
            for a, k in enumerate(mask):
                if k != best_n and not (iou_thresh < 1 and extra[k] > iou_thresh):
                    continue
                set_box(b, a, j, i, t, ANCHORS[k])
                T[b, a, 4, j, i], W[b, a, 4, j, i] = 1.0, obj_norm
                set_class(b, a, j, i, t[4])
        if iou_thresh < 1:      # averages_yolo_deltas: / the number of positive class deltas
            for a in range(n):
                for j in range(lh):
                    for i in range(lw):
                        if W[b, a, 4, j, i] * (T[b, a, 4, j, i] - act[b, a, 4, j, i]) == 0:
                            continue
                        k = int((W[b, a, 5:, j, i] * (T[b, a, 5:, j, i] - act[b, a, 5:, j, i]) > 0).sum())
                        if k:
                            W[b, a, :4, j, i] /= k
    return act, T, W


def yolo_loss(z, T, W, sxy=1.0):
    """The loss whose negative gradient the deltas are: BCE on x, y, obj, classes; ½·W·(T - z)² on w, h."""
    z = z.reshape(T.shape)
    txy = (T[:, :, :2] + (sxy - 1) / 2) / sxy
    return ((W[:, :, :2] * sxy * bce_logit(txy, z[:, :, :2])).sum()
            + (0.5 * W[:, :, 2:4] * (T[:, :, 2:4] - z[:, :, 2:4]) ** 2).sum()
            + (W[:, :, 4:] * bce_logit(T[:, :, 4:], z[:, :, 4:])).sum())


def _set_slot(z, mask, a, i, j, box):
    """Make slot (a, i, j) predict `box` (x, y, w, h image-relative) exactly."""
    aw, ah = ANCHORS[mask[a]]
    fx, fy = box[0] * LW - i, box[1] * LH - j
    z[0, a, 0, j, i] = math.log(fx / (1 - fx))
    z[0, a, 1, j, i] = math.log(fy / (1 - fy))
    z[0, a, 2, j, i] = math.log(box[2] * NET / aw)
    z[0, a, 3, j, i] = math.log(box[3] * NET / ah)


def make_case(mask, seed=0):
    """Random logits plus hand-made truth: two truths on one slot, a truth on the right edge, a box of
    another head, a bad class id, entries after the terminator, and a slot that overlaps a truth."""
    rng = np.random.default_rng(seed)
    n = len(mask)
    z = rng.normal(0, 0.7, size=(2, n, 5 + CLASSES, LH, LW))
    truth = np.zeros((2, 8 * 5))
    rows0 = [(0.30, 0.40, 0.14, 0.16, 1), (0.33, 0.45, 0.15, 0.15, 2), (1.0, 0.90, 0.20, 0.30, 0),
             (0.60, 0.60, 0.70, 0.75, 2), (0.5, 0.5, 0.1, 0.1, 7)]
    rows1 = [(0.55, 0.20, 0.18, 0.26, 0), (0.80, 0.80, 0.10, 0.12, 1)]
    for b, rows in enumerate((rows0, rows1)):
        for t, r in enumerate(rows):
            truth[b, 5 * t:5 * t + 5] = r
    truth[1, 5 * 3:5 * 3 + 5] = (0.9, 0.9, 0.3, 0.3, 1)   # after the x == 0 terminator: never read
    _set_slot(z, mask, 0, 2, 2, (0.62, 0.63, 0.66, 0.70))  # overlaps the 0.7x0.75 truth: ignored
    return z, truth


def _run_head(cfg, z, truth, dtype=np.float64):
    net = network_from_text(cfg, batch=z.shape[0], dtype=dtype)
    layer = net.layers[0]
    x = z.reshape(layer.output.shape).astype(dtype)
    layer.forward(head_state(x, truth.astype(dtype), net_w=NET, net_h=NET))
    return layer, x


CASES = {
    "default": ("0,1,2", "", {}),
    "other_mask": ("3,4,5", "", {}),
    "truth_thresh": ("0,1,2", "", {"truth_thresh": 0.6}),
    "normalizers": ("0,1,2", "iou_normalizer=.5\nobj_normalizer=2\ncls_normalizer=.7\nscale_x_y=1.1\n"
                    "label_smooth_eps=.1", {"iou_norm": 0.5, "obj_norm": 2.0, "cls_norm": 0.7, "sxy": 1.1,
                                            "eps": 0.1}),
    "iou_thresh": ("0,1,2", "iou_thresh=.25", {"iou_thresh": 0.25}),
    "iou_thresh_giou": ("0,1,2", "iou_thresh=.25\niou_thresh_kind=giou", {"iou_thresh": 0.25, "thresh_kind": "giou"}),
    "iou_thresh_diou": ("0,1,2", "iou_thresh=.25\niou_thresh_kind=diou", {"iou_thresh": 0.25, "thresh_kind": "diou"}),
    "iou_thresh_ciou": ("0,1,2", "iou_thresh=.25\niou_thresh_kind=ciou", {"iou_thresh": 0.25, "thresh_kind": "ciou"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_training_delta_matches_reference_and_gradient(case):
    mask_s, extra, kw = CASES[case]
    mask = [int(m) for m in mask_s.split(",")]
    z, truth = make_case(mask)
    cfg = yolo_cfg(mask_s, extra, truth_thresh=str(kw.get("truth_thresh", 1)))
    layer, x = _run_head(cfg, z, truth)
    act, T, W = yolo_reference(z, truth, mask=mask, **kw)
    assert_close(layer.output.reshape(act.shape), act, 1e-12, 1e-12, "activations")
    expected = W * (T - act)
    assert_close(layer.delta.reshape(act.shape), expected, 1e-9, 1e-12, "delta vs reference")
    assert layer.cost == pytest.approx(float((expected ** 2).sum()), rel=1e-12)
    assert layer.stats["bad_truths"] == 1          # the class-7 box
    sxy = kw.get("sxy", 1.0)
    zz = z.copy()
    num = numerical_grad(lambda: yolo_loss(zz, T, W, sxy), zz)
    assert_close(layer.delta.reshape(act.shape), -num, 1e-5, 1e-7, "delta vs -dL/dz")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_training_delta_same_bits_serial_and_parallel(monkeypatch, dtype):
    """The items' deltas and sums, made on one thread or across threads (`PARALLEL_MIN_CHECKS`),
    are the same bits: each item's sums are its own, added in item order."""
    from darkpy.layers import yolo_delta
    rng = np.random.default_rng(5)
    z, truth = make_case([0, 1, 2])
    zs = np.concatenate([z, z[::-1] * 0.7 + 0.1, rng.standard_normal(z.shape)])
    truths = np.concatenate([truth, truth[::-1], truth])
    got = []
    for limit in (1 << 62, 0):
        monkeypatch.setattr(yolo_delta, "PARALLEL_MIN_CHECKS", limit)
        layer, _ = _run_head(yolo_cfg("0,1,2", "iou_thresh=.25"), zs, truths, dtype)
        got.append((layer.delta.copy(), layer.cost, dict(layer.stats)))
    np.testing.assert_array_equal(got[0][0], got[1][0])
    assert got[0][1] == got[1][1] and got[0][2] == got[1][2]
    assert got[0][2]["count"] > 0 and np.abs(got[0][0]).sum() > 0


def test_new_coords_forward_decode_and_delta():
    """new_coords=1 (scaled-YOLOv4): no activation in the layer, sizes (2·out)²·anchor, sqrt targets."""
    mask = [0, 1, 2]
    z, truth = make_case(mask)
    z = sigmoid(z)                                    # what the logistic conv before the head outputs
    z[0, 0, :4, 2, 2] = (0.3, 0.4, 0.45, 0.5)         # the slot that overlaps the big truth
    layer, _ = _run_head(yolo_cfg("0,1,2", "new_coords=1\nscale_x_y=2"), z, truth)
    act, T, W = yolo_reference(z, truth, mask=mask, sxy=2.0, new_coords=True)
    assert_close(layer.output.reshape(act.shape), act, 1e-12, 1e-12, "activations")
    assert_close(layer.delta.reshape(act.shape), W * (T - act), 1e-9, 1e-12, "delta vs reference")
    boxes, obj, _ = layer.get_detections(0, -1.0, NET, NET)
    k = (2 * LW + 2) * 3                               # cell (row 2, col 2), anchor 0, cell-major order
    aw, ah = ANCHORS[0]
    expected = ((2 + act[0, 0, 0, 2, 2]) / LW, (2 + act[0, 0, 1, 2, 2]) / LH, 4 * 0.45 ** 2 * aw / NET,
                4 * 0.5 ** 2 * ah / NET)
    assert boxes[k] == pytest.approx(expected) and obj[k] == pytest.approx(z[0, 0, 4, 2, 2])


def test_reference_case_exercises_the_rules():
    """The hand-made case really hits: ignore, a shared slot, the edge cell and a foreign anchor."""
    mask = [0, 1, 2]
    z, truth = make_case(mask)
    act, T, W = yolo_reference(z, truth, mask=mask)
    assert W[0, 0, 4, 2, 2] == 0                       # the overlapping slot is ignored
    positives = np.argwhere(T[:, :, 4] == 1).tolist()   # (image, anchor, row, col)
    # two truths share (0, 1, 1, 1); the 0.7x0.75 box belongs to anchor 5 (the other head);
    # the x == 1 truth lands in the last column
    assert sorted(positives) == [[0, 1, 1, 1], [0, 2, 3, 3], [1, 0, 3, 3], [1, 2, 0, 2]]


def test_second_truth_on_a_slot_sets_only_its_class():
    mask = [0, 1, 2]
    z, truth = make_case(mask)
    layer, _ = _run_head(yolo_cfg("0,1,2"), z, truth)
    d = layer.delta.reshape(2, 3, 5 + CLASSES, LH, LW)
    out = layer.output.reshape(d.shape)
    a = int(np.argmax([ref_iou((0, 0, w / NET, h / NET), (0, 0, 0.15, 0.15)) for w, h in ANCHORS[:3]]))
    cls = d[0, a, 5:, 1, 1]
    # first truth (class 1) wrote the one-hot deltas, the second (class 2) only its own entry
    assert cls[0] == pytest.approx(-out[0, a, 5, 1, 1])
    assert cls[1] == pytest.approx(1 - out[0, a, 6, 1, 1])
    assert cls[2] == pytest.approx(1 - out[0, a, 7, 1, 1])


@pytest.mark.parametrize("kind", list(IOU_KINDS))
def test_iou_kind_gradient_is_exact(kind):
    rng = np.random.default_rng(3)
    for _ in range(20):
        truth = (rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7), rng.uniform(0.1, 0.4), rng.uniform(0.1, 0.4))
        pred = np.array([truth[0] + rng.normal(0, 0.1), truth[1] + rng.normal(0, 0.1),
                         truth[2] * rng.uniform(0.5, 2), truth[3] * rng.uniform(0.5, 2)])
        q, *grad = iou_kind_grad(IOU_KINDS[kind], *pred, *truth)
        alpha = ciou_alpha(pred, truth) if kind == "ciou" else None
        assert q == pytest.approx(ref_quality(kind, pred, truth), abs=1e-9)
        num = numerical_grad(lambda: ref_quality(kind, pred, truth, alpha), pred, 1e-7)
        assert_close(np.array(grad), num, 1e-5, 1e-7, f"{kind} gradient")


@pytest.mark.parametrize("kind", ["giou", "ciou"])
def test_iou_loss_box_delta_convention(kind):
    """iou_loss deltas: δx = n·∂Q/∂bx and δw = 2n·∂Q/∂bw·e^tw (the fork's box-space convention)."""
    mask = [0, 1, 2]
    z, truth = make_case(mask)
    layer, _ = _run_head(yolo_cfg("0,1,2", f"iou_loss={kind}\niou_normalizer=.3"), z, truth)
    d = layer.delta.reshape(2, 3, 5 + CLASSES, LH, LW)
    out = layer.output.reshape(d.shape)
    t = (0.55, 0.20, 0.18, 0.26)                        # image 1's first truth, alone in its slot
    i, j = int(t[0] * LW), int(t[1] * LH)
    a = int(np.argmax([ref_iou((0, 0, w / NET, h / NET), (0, 0, t[2], t[3])) for w, h in ANCHORS]))
    assert a in mask
    aw, ah = ANCHORS[a]
    pred = np.array([(i + out[1, a, 0, j, i]) / LW, (j + out[1, a, 1, j, i]) / LH,
                     math.exp(out[1, a, 2, j, i]) * aw / NET, math.exp(out[1, a, 3, j, i]) * ah / NET])
    alpha = ciou_alpha(pred, t) if kind == "ciou" else None
    g = numerical_grad(lambda: ref_quality(kind, pred, t, alpha), pred, 1e-7)
    expected = 0.3 * np.array([g[0], g[1], 2 * g[2] * math.exp(out[1, a, 2, j, i]),
                               2 * g[3] * math.exp(out[1, a, 3, j, i])])
    assert_close(d[1, a, :4, j, i], expected, 1e-5, 1e-8, "iou-loss box delta")


def test_forward_without_truth_has_no_cost_and_zero_delta():
    mask = [0, 1, 2]
    z, truth = make_case(mask)
    net = network_from_text(yolo_cfg(), batch=2)
    net.forward(z.reshape(2, -1).astype(np.float32), truth.astype(np.float32), train=True)
    assert net.layers[0].cost is not None and net.cost is not None
    net.forward(z.reshape(2, -1).astype(np.float32))
    assert net.layers[0].cost is None and net.cost is None
    assert not net.layers[0].delta.any() and not net.layers[0].loss.any()


def test_backward_adds_into_previous_delta():
    mask = [0, 1, 2]
    z, truth = make_case(mask)
    net = network_from_text(yolo_cfg() + "\n[yolo]\nmask=0,1,2\nanchors=" +
                            ",".join(f"{w},{h}" for w, h in ANCHORS) + "\nclasses=3\nnum=6\nmax=8\n",
                            batch=2, dtype=np.float64)
    net.forward(z.reshape(2, -1), truth, train=True)
    first, second = net.layers
    before = first.delta.copy()
    net.backward()
    assert_close(first.delta, before + second.delta, 0, 1e-15, "yolo backward accumulates")


def test_resize_reallocates_and_truth_shape_is_checked():
    net = network_from_text(yolo_cfg(), batch=1)
    net.resize(6, 5)
    assert net.layers[0].output.shape == (1, 24, 5, 6)
    out = net.forward(np.zeros((1, 24 * 30), np.float32), np.zeros((1, 40), np.float32), train=True)
    assert out.shape == (1, 24, 5, 6) and net.layers[0].cost is not None
    layer = net.layers[0]
    with pytest.raises(StateError, match="truth"):
        layer.forward(head_state(layer.output.copy(), np.zeros((1, 10), np.float32), net_w=32, net_h=32))


def test_truths_is_max_times_five():
    net = network_from_text(yolo_cfg(max_boxes=13))
    assert net.layers[0].truths == 65 and net.truths == 65


@pytest.mark.parametrize("bad, match", [
    ("mask=0,1,9", "mask value 9"),
    ("anchors=1,2,3", "needs 2\\*num"),
    ("iou_loss=l1", "unknown value"),
])
def test_cfg_errors(bad, match):
    key = bad.split("=")[0]
    cfg = "\n".join(line for line in yolo_cfg().splitlines() if not line.startswith(key + "="))
    with pytest.raises(CfgError, match=match):
        network_from_text(cfg + "\n" + bad + "\n")


def test_wrong_filters_is_a_clear_error():
    cfg = yolo_cfg().replace("channels=24", "channels=21")
    with pytest.raises(CfgError, match="filters=24"):
        network_from_text(cfg)


@pytest.mark.parametrize("head", ["yolo", "region"])
def test_class_map_file_is_read_and_checked(tmp_path, head):
    """`map=`: line i is the class truth class i trains; ids outside the head's classes are a
    located error (shared by [yolo] and [region])."""
    extra = "mask=0\nanchors=10,14\nnum=1" if head == "yolo" else "anchors=1,1\nnum=1\ncoords=4"
    good, bad = tmp_path / "good.map", tmp_path / "bad.map"
    good.write_text("1\n0\n")
    bad.write_text("0\n2\n")

    def cfg(path):
        return (f"[net]\nwidth=32\nheight=32\nchannels=3\n[convolutional]\nfilters=7\nsize=1\n"
                f"activation=linear\n[{head}]\nclasses=2\n{extra}\nmap={path}\n")
    net = network_from_text(cfg(good), file="t.cfg")
    assert net.layers[1].class_map.tolist() == [1, 0]
    with pytest.raises(CfgError, match=r"^t\.cfg:\d+ \[section #1 \w+\] map: .*needs >= 1 ids, each in 0\.\.1"):
        network_from_text(cfg(bad), file="t.cfg")



def _positives(extra, z, truth):
    """(image, anchor, row, col) of the slots trained as objects (objectness delta 1 - p)."""
    layer, _ = _run_head(yolo_cfg("0,1,2", extra), z, truth)
    d = layer.delta.reshape(z.shape)
    out = layer.output.reshape(z.shape)
    return {tuple(p) for p in np.argwhere(np.isclose(d[:, :, 4], 1 - out[:, :, 4], rtol=0, atol=1e-12)).tolist()}


def test_iou_thresh_kind_changes_the_extra_anchors():
    """iou_thresh=.355 on a fixed batch: truth A (7x5 px) has best anchor 1 (6x5) and anchor 2 (5x9) at
    IoU .455, GIoU .327 (neither box holds the other), CIoU .444; truth B (2x8 px) has best anchor 0
    (3x4) and anchor 2 at IoU = GIoU .356 (B fits inside it), CIoU .354 (aspect penalty). So giou
    drops A's extra anchor, ciou drops B's, diou (= IoU for shapes centred together) drops none."""
    rng = np.random.default_rng(3)
    z = rng.normal(0, 0.7, size=(1, 3, 5 + CLASSES, LH, LW))
    truth = np.zeros((1, 8 * 5))
    truth[0, :10] = (0.30, 0.40, 7 / NET, 5 / NET, 1, 0.80, 0.70, 2 / NET, 8 / NET, 2)
    a_cell, b_cell = (1, 1), (2, 3)                           # (row, col)
    got = {k: _positives(f"iou_thresh=.355\niou_thresh_kind={k}", z, truth) for k in ("iou", "giou", "diou", "ciou")}
    slots = lambda anchors_a, anchors_b: ({(0, a, *a_cell) for a in anchors_a} |
                                          {(0, a, *b_cell) for a in anchors_b})
    assert _positives("", z, truth) == slots([1], [0])       # best anchors only
    assert got["iou"] == got["diou"] == slots([1, 2], [0, 2])
    assert got["giou"] == slots([1], [0, 2])
    assert got["ciou"] == slots([1, 2], [0])
    # the same sets from the slow reference's measures (the fork's box_iou_kind on shapes)
    for k, chosen in got.items():
        expected = set()
        for t, cell in zip(valid_truths(truth[0], CLASSES, 8), (a_cell, b_cell)):
            shapes = [(0, 0, w / NET, h / NET) for w, h in ANCHORS]
            best_n = int(np.argmax([ref_iou(s, (0, 0, t[2], t[3])) for s in shapes]))
            expected |= {(0, a, *cell) for a in range(3)
                         if a == best_n or ref_quality(k, shapes[a], (0, 0, t[2], t[3])) > 0.355}
        assert chosen == expected, k
    # and the deltas equal the slow reference's
    for k in got:
        layer, _ = _run_head(yolo_cfg("0,1,2", f"iou_thresh=.355\niou_thresh_kind={k}"), z, truth)
        act, T, W = yolo_reference(z, truth, mask=[0, 1, 2], iou_thresh=0.355, thresh_kind=k)
        assert_close(layer.delta.reshape(act.shape), W * (T - act), 1e-9, 1e-12, k)


def test_iou_thresh_kind_bad_value_is_one_line_error():
    with pytest.raises(CfgError, match="iou_thresh_kind"):
        network_from_text(yolo_cfg("0,1,2", "iou_thresh=.25\niou_thresh_kind=eiou"))
