"""[region] (YOLOv2): Darknet golden forward + decoded boxes, the training deltas against a slow numpy
reference, and backward (which Darknet's CPU path leaves empty) against the float64 numerical gradient
of the loss."""
from __future__ import annotations

import math

import numpy as np
import pytest

from darkpy.errors import CfgError
from darkpy.layers import FAMILIES_MISSING
from darkpy.layers.yolo import letterbox_correct
from darkpy.network import load_network, network_from_text
from heads_ref import bce_logit, head_state, ref_iou, sigmoid, valid_truths
from helpers import assert_close, golden_dir, numerical_grad, read_f32

ANCHORS = [(1.0, 1.5), (2.0, 1.2), (0.6, 0.7)]   # grid cells
LW, LH, CLASSES = 5, 4, 3


def region_cfg(extra="", lw=LW, lh=LH, classes=CLASSES, anchors=ANCHORS):
    c = len(anchors) * (classes + 5)
    a = ", ".join(f"{w},{h}" for w, h in anchors)
    return (f"[net]\nwidth={lw}\nheight={lh}\nchannels={c}\n\n[region]\nanchors={a}\nclasses={classes}\n"
            f"coords=4\nnum={len(anchors)}\nmax=8\n{extra}\n")


GOLDEN = {"region": "softmax=1\njitter=.2\nrescore=1\nthresh=.6", "region_logistic": "softmax=0"}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden_region_forward_and_dets(name):
    d = golden_dir("forward", name)
    net = network_from_text(region_cfg(GOLDEN[name], 6, 5, 3, [(1.0, 1.5), (2.0, 1.2)]))
    net.forward(read_f32(d / "layer_002.f32").reshape(1, 16, 5, 6))
    layer = net.layers[0]
    assert_close(layer.output.ravel(), read_f32(d / "layer_003.f32"), 1e-5, 1e-6, "region output")
    boxes, obj, probs = layer.get_detections(0, 0.3, 12, 10)
    letterbox_correct(boxes, 40, 30, 12, 10)
    dets = np.loadtxt(d / "dets.txt")
    assert_close(np.concatenate([boxes, obj[:, None], probs], 1), dets[:, 1:], 1e-5, 1e-6, "dets.txt")


@pytest.mark.skipif(bool({"convolutional", "pooling"} & set(FAMILIES_MISSING)), reason="needs conv/maxpool")
@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden_region_whole_network(name):
    d = golden_dir("forward", name)
    net = load_network(d / "net.cfg", d / "net.weights")
    net.forward(read_f32(d / "input.f32").reshape(1, 3, 10, 12))
    for i, layer in enumerate(net.layers):
        assert_close(layer.output.ravel(), read_f32(d / f"layer_{i:03d}.f32"), 1e-5, 1e-5, f"layer {i}")


def softmax_classes(z):
    e = np.exp(z - z.max(axis=2, keepdims=True))
    return e / e.sum(axis=2, keepdims=True)


def region_reference(z, truth, *, softmax=True, rescore=False, bias_match=False, thresh=0.5, seen=20000,
                     coord=1.0, obj=1.0, noobj=1.0, cls=1.0, max_boxes=8):
    """Darknet's region training forward, slowly. Returns (act, T, W): delta = W·(T - act)."""
    B, n, E = z.shape[0], len(ANCHORS), 5 + CLASSES
    z = z.reshape(B, n, E, LH, LW)
    act = sigmoid(z)
    act[:, :, 2:4] = z[:, :, 2:4]
    if softmax:
        act[:, :, 5:] = softmax_classes(z[:, :, 5:])
    T, W = np.zeros_like(z), np.zeros_like(z)

    def pred_box(b, a, j, i):
        aw, ah = ANCHORS[a]
        return ((i + act[b, a, 0, j, i]) / LW, (j + act[b, a, 1, j, i]) / LH,
                math.exp(z[b, a, 2, j, i]) * aw / LW, math.exp(z[b, a, 3, j, i]) * ah / LH)

    def set_box(b, a, j, i, t, scale):
        aw, ah = ANCHORS[a]
        W[b, a, :4, j, i] = scale
        T[b, a, :4, j, i] = (t[0] * LW - i, t[1] * LH - j, math.log(t[2] * LW / aw), math.log(t[3] * LH / ah))

    for b in range(B):
        boxes = valid_truths(truth[b], CLASSES, max_boxes)
        for j in range(LH):
            for i in range(LW):
                for a in range(n):
                    best = max((ref_iou(pred_box(b, a, j, i), t[:4]) for t in boxes), default=0.0)
                    T[b, a, 4, j, i], W[b, a, 4, j, i] = 0.0, noobj
                    if best > thresh:
                        W[b, a, 4, j, i] = 0.0
                    if seen < 12800:
                        aw, ah = ANCHORS[a]
                        set_box(b, a, j, i, ((i + .5) / LW, (j + .5) / LH, aw / LW, ah / LH), 0.01)
        for t in boxes:
            i, j = min(int(t[0] * LW), LW - 1), min(int(t[1] * LH), LH - 1)
            shapes = []
            for a in range(n):
                w, h = ((ANCHORS[a][0] / LW, ANCHORS[a][1] / LH) if bias_match else pred_box(b, a, j, i)[2:])
                shapes.append(ref_iou((0, 0, w, h), (0, 0, t[2], t[3])))
            a = int(np.argmax(shapes))
            iou = ref_iou(pred_box(b, a, j, i), t[:4])
            set_box(b, a, j, i, t, coord * (2 - t[2] * t[3]))
            T[b, a, 4, j, i], W[b, a, 4, j, i] = (iou if rescore else 1.0), obj
            c = t[4]
            if not softmax and W[b, a, 5, j, i] * (T[b, a, 5, j, i] - act[b, a, 5, j, i]) != 0:
                T[b, a, 5 + c, j, i], W[b, a, 5 + c, j, i] = 1.0, cls
                continue
            T[b, a, 5:, j, i], W[b, a, 5:, j, i] = 0.0, cls
            T[b, a, 5 + c, j, i] = 1.0
    return act, T, W


def region_loss(z, T, W, softmax):
    """½·W·(T - σ)² on x, y, obj; ½·W·(T - z)² on w, h; class_scale·CE (softmax) or W·BCE (logistic)."""
    z = z.reshape(T.shape)
    s = sigmoid(z)
    loss = 0.5 * (W[:, :, [0, 1, 4]] * (T[:, :, [0, 1, 4]] - s[:, :, [0, 1, 4]]) ** 2).sum()
    loss += 0.5 * (W[:, :, 2:4] * (T[:, :, 2:4] - z[:, :, 2:4]) ** 2).sum()
    if softmax:
        logp = np.log(softmax_classes(z[:, :, 5:]))
        loss += -(W[:, :, 5:] * T[:, :, 5:] * logp).sum()
    else:
        loss += (W[:, :, 5:] * bce_logit(T[:, :, 5:], z[:, :, 5:])).sum()
    return loss


def make_case(seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 0.6, size=(2, len(ANCHORS), 5 + CLASSES, LH, LW))
    truth = np.zeros((2, 40))
    rows = [[(0.30, 0.40, 0.20, 0.35, 1), (0.33, 0.45, 0.22, 0.30, 2), (1.0, 0.95, 0.12, 0.15, 0),
             (0.6, 0.6, 0.1, 0.1, 5)],
            [(0.55, 0.20, 0.35, 0.30, 0), (0.80, 0.70, 0.5, 0.6, 1)]]
    for b, rr in enumerate(rows):
        for t, r in enumerate(rr):
            truth[b, 5 * t:5 * t + 5] = r
    # slot (anchor 1, col 2, row 2) predicts the big truth of image 1 closely: ignored
    z[1, 1, 0, 2, 3], z[1, 1, 1, 2, 3] = 0.0, 0.5
    z[1, 1, 2, 2, 3], z[1, 1, 3, 2, 3] = math.log(0.5 * LW / 2.0), math.log(0.6 * LH / 1.2)
    return z, truth


CASES = {
    "softmax": ("softmax=1", {}, 20000),
    "logistic_rescore": ("softmax=0\nrescore=1", {"softmax": False, "rescore": True}, 20000),
    "bias_match_scales_warmup": ("softmax=1\nbias_match=1\ncoord_scale=2\nobject_scale=5\nnoobject_scale=.5\n"
                                 "class_scale=1.5\nthresh=.4",
                                 {"bias_match": True, "coord": 2.0, "obj": 5.0, "noobj": 0.5, "cls": 1.5,
                                  "thresh": 0.4, "seen": 0}, 0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_training_delta_reference_and_backward_gradient(case):
    extra, kw, seen = CASES[case]
    kw = dict(kw, seen=seen)
    z, truth = make_case()
    net = network_from_text(region_cfg(extra), batch=2, dtype=np.float64)
    layer = net.layers[0]
    x = z.reshape(layer.output.shape).copy()
    layer.forward(head_state(x, truth, net_w=LW, net_h=LH, seen=seen))
    act, T, W = region_reference(z, truth, **kw)
    assert_close(layer.output.reshape(act.shape), act, 1e-12, 1e-12, "activations")
    expected = W * (T - act)
    assert_close(layer.delta.reshape(act.shape), expected, 1e-9, 1e-12, "delta vs reference")
    assert layer.cost == pytest.approx(float((expected ** 2).sum()), rel=1e-12)
    assert layer.stats["bad_truths"] == 1
    prev = np.full(x.shape, 0.25)
    s = head_state(x, truth, net_w=LW, net_h=LH, seen=seen)
    s.delta = prev
    layer.backward(s)
    zz = z.copy()
    num = numerical_grad(lambda: region_loss(zz, T, W, kw.get("softmax", True)), zz)
    assert_close(prev.reshape(z.shape) - 0.25, -num, 1e-5, 1e-8, "backward vs -dL/dz")


#: (image, anchor, row, col) of the positives: the two first truths share one slot, x == 1 uses the last column
POSITIVES = [[0, 1, 1, 1], [0, 2, 3, 4], [1, 0, 0, 2], [1, 1, 2, 4]]


def test_case_exercises_ignore_and_warmup():
    z, truth = make_case()
    _, T, W = region_reference(z, truth, seen=20000)
    assert W[1, 1, 4, 2, 3] == 0            # ignored: predicts a truth
    assert np.argwhere(W[:, :, 0] > 0).tolist() == POSITIVES
    _, T0, W0 = region_reference(z, truth, seen=0)
    assert (W0[:, :, 0] == 0.01).sum() > 0  # warm-up pulls non-positive slots to their prior


def test_without_truth_no_cost():
    z, _ = make_case()
    net = network_from_text(region_cfg("softmax=1"), batch=2)
    net.forward(z.reshape(2, -1).astype(np.float32))
    assert net.layers[0].cost is None and not net.layers[0].delta.any()


@pytest.mark.parametrize("extra, match", [("tree=data/missing.tree", "no such tree file"), ("coords=5", "coords=5"),
                                          ("background=1", "background")])
def test_unsupported_options_are_refused(extra, match):
    cfg = region_cfg("softmax=1")
    if extra.startswith("coords"):
        cfg = cfg.replace("coords=4", extra)
    else:
        cfg += extra + "\n"
    with pytest.raises(CfgError, match=match):
        network_from_text(cfg)


def test_wrong_filters_is_a_clear_error():
    with pytest.raises(CfgError, match="filters=24"):
        network_from_text(region_cfg().replace("channels=24", "channels=20"))
