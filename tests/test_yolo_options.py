"""The fork's [yolo] loss options (focal_loss, counters_per_class, objectness_smooth, max_delta with
them) and [net] label_smooth_eps for classifiers: each changes the deltas as documented, checked on a
fixed case; focal loss also against the float64 numerical gradient of the focal loss."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from heads_ref import head_state, sigmoid
from helpers import assert_close
from test_yolo import CLASSES, LH, LW, NET, _set_slot, yolo_cfg

from darkpy.layers.yolo import class_multipliers
from darkpy.network import network_from_text

MASK = [0, 1, 2]
TRUTH = (0.30, 0.40, 0.14, 0.16, 1)          # lands on cell (1, 1); best anchor: index 1 (6x5)
SLOT = (1, 1, 1)                              # (anchor, row, col)


def run(extra="", z=None, truth_rows=(TRUTH,), ignore=".5"):
    cfg = yolo_cfg("0,1,2", extra, ignore=ignore)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # the options are implemented: no "not implemented" warning
        net = network_from_text(cfg, batch=1, dtype=np.float64)
    layer = net.layers[0]
    if z is None:
        z = np.random.default_rng(0).normal(0, 0.7, (1, 3, 5 + CLASSES, LH, LW))
    truth = np.zeros((1, 40))
    for t, r in enumerate(truth_rows):
        truth[0, 5 * t:5 * t + 5] = r
    layer.forward(head_state(z.reshape(layer.output.shape).copy(), truth, net_w=NET, net_h=NET))
    shape = (3, 5 + CLASSES, LH, LW)
    return layer.delta.reshape(shape).copy(), layer.output.reshape(shape).copy()


def _z_with_class_logit(v):
    z = np.random.default_rng(1).normal(0, 0.7, (1, 3, 5 + CLASSES, LH, LW))
    a, j, i = SLOT
    z[0, a, 5 + TRUTH[4], j, i] = v
    return z


def test_focal_loss_down_weights_easy_examples():
    a, j, i = SLOT
    ratios = {}
    for name, v in (("easy", 4.0), ("hard", -2.0)):
        z = _z_with_class_logit(v)
        plain, _ = run("", z)
        focal, _ = run("focal_loss=1", z)
        ratios[name] = focal[a, 5 + TRUTH[4], j, i] / plain[a, 5 + TRUTH[4], j, i]
        # every other entry of the slot (box, objectness) and every other slot is unchanged
        same = np.ones_like(plain, bool)
        same[a, 5:, j, i] = False
        assert_close(focal[same], plain[same], 0, 0, "non-class deltas")
    assert ratios["easy"] < 0.01 and ratios["hard"] > 0.3


def test_focal_delta_is_the_negative_gradient_of_focal_loss():
    """truth-class delta = -d(0.5·FL)/dz with FL = -(1 - p)²·ln p, p = σ(z) (float64 central difference)."""
    a, j, i = SLOT
    c = TRUTH[4]
    for v in (-2.0, 0.3, 2.5):
        d, _ = run("focal_loss=1", _z_with_class_logit(v))

        def fl(zv):
            p = sigmoid(zv)
            return 0.5 * -((1 - p) ** 2) * math.log(p)

        h = 1e-6
        num = (fl(v + h) - fl(v - h)) / (2 * h)
        assert d[a, 5 + c, j, i] == pytest.approx(-num, rel=1e-6, abs=1e-12)


def test_counters_per_class_weights_the_rare_class():
    assert class_multipliers([10, 2, 0], 3, math.inf).tolist() == [1.0, 5.0, 10.0]
    assert class_multipliers([10, 2, 0], 3, 4.0).tolist() == [1.0, 4.0, 4.0]
    a, j, i = SLOT
    plain, _ = run("")
    weighted, _ = run("counters_per_class=100,20,50")        # class 1: weight 5
    assert_close(weighted[a, :5, j, i], 5 * plain[a, :5, j, i], 1e-12, 1e-12, "box and objectness")
    assert weighted[a, 5 + 1, j, i] == pytest.approx(5 * plain[a, 5 + 1, j, i])
    others = [5, 7]
    assert_close(weighted[a, others, j, i], plain[a, others, j, i], 0, 0, "other classes")
    capped, _ = run("counters_per_class=100,20,50\nmax_delta=2")
    assert capped[a, 5 + 1, j, i] == pytest.approx(2 * plain[a, 5 + 1, j, i])
    from darkpy.errors import CfgError
    with pytest.raises(CfgError, match="counters_per_class"):
        network_from_text(yolo_cfg("0,1,2", "counters_per_class=1,2"))


def test_objectness_smooth_targets_the_iou_of_ignored_slots():
    """A slot predicting the truth box well (IoU > ignore_thresh) but not assigned to it: plain rules
    give it no objectness delta, objectness_smooth the target IoU."""
    z = np.random.default_rng(2).normal(0, 0.7, (1, 3, 5 + CLASSES, LH, LW))
    _set_slot(z, MASK, 0, 1, 1, (0.30, 0.40, 0.16, 0.16))   # anchor 0 at the truth's cell: IoU 0.875
    z[0, 0, 4, 1, 1] = -1.0
    plain, out = run("", z)
    smooth, _ = run("objectness_smooth=1", z)
    assert plain[0, 4, 1, 1] == 0
    assert smooth[0, 4, 1, 1] == pytest.approx(0.875 - out[0, 4, 1, 1], rel=1e-6)   # the IoU as target
    z[0, 0, 4, 1, 1] = 3.0                  # above the IoU: pulled down to it, not to 0
    smooth, out = run("objectness_smooth=1", z)
    assert smooth[0, 4, 1, 1] == pytest.approx(0.875 - out[0, 4, 1, 1], rel=1e-6) and smooth[0, 4, 1, 1] < 0
    # the fork's quirk: an assigned slot whose prediction is poor (IoU below ignore_thresh) already has
    # the "no object" delta from the first pass, and the smooth rule keeps it (target 0, not 1)
    a, j, i = SLOT
    assert plain[a, 4, j, i] == pytest.approx(1 - out[a, 4, j, i])
    assert smooth[a, 4, j, i] == pytest.approx(-out[a, 4, j, i])


def test_label_smooth_eps_for_classifiers():
    """[net] label_smooth_eps: the truth row becomes 1 - eps for the class and eps/(k-1) elsewhere."""
    from darkpy.datasets import smooth_labels
    y = np.array([[0, 1, 0, 0], [1, 0, 0, 0]], np.float32)
    s = smooth_labels(y, 0.1)
    assert_close(s, np.array([[0.1 / 3, 0.9, 0.1 / 3, 0.1 / 3], [0.9, 0.1 / 3, 0.1 / 3, 0.1 / 3]]), 1e-7, 1e-7,
                 "smoothed")
    assert smooth_labels(y, 0.0) is y


def test_max_delta_clips_iou_kind_box_deltas():
    """max_delta caps each box delta of the IoU-kind losses (ciou here) at ±max_delta; MSE is untouched."""
    a, j, i = SLOT
    free, _ = run("iou_loss=ciou\niou_normalizer=5")
    capped, _ = run("iou_loss=ciou\niou_normalizer=5\nmax_delta=0.05")
    box_free, box_capped = free[a, :4, j, i], capped[a, :4, j, i]
    assert np.abs(box_free).max() > 0.05
    assert_close(box_capped, np.clip(box_free, -0.05, 0.05), 1e-12, 1e-12, "clipped box deltas")
    same = np.ones_like(free, bool)
    same[:, :4] = False
    assert_close(capped[same], free[same], 0, 0, "other deltas")
    mse_free, _ = run("")
    mse_capped, _ = run("max_delta=0.05")
    assert_close(mse_capped, mse_free, 0, 0, "mse")


def test_iou_thresh_trains_more_anchors():
    """iou_thresh: every masked anchor whose shape IoU with the truth passes it is a positive too."""
    plain, out = run("")
    many, _ = run("iou_thresh=0.2")
    j, i = 1, 1
    pos_plain = [a for a in range(3) if plain[a, 4, j, i] > 0]
    pos_many = [a for a in range(3) if many[a, 4, j, i] > 0]
    assert pos_plain == [1] and len(pos_many) > 1 and set(pos_plain) < set(pos_many)


def test_label_smooth_eps_reaches_classifier_batches():
    """A classifier cfg's [net] label_smooth_eps=0.1 gives its batches 0.9 / 0.1/9 truth rows."""
    from pathlib import Path

    import darkpy.datasets as D
    from darkpy.cfg import parse_cfg
    from darkpy.network import NetConfig
    root = Path(__file__).resolve().parents[1]
    paths = D.read_list(root / "data/digits/train.list")[:6]
    names = D.read_names(root / "data/digits.names")
    net = NetConfig.from_section(parse_cfg("[net]\nwidth=8\nheight=8\nchannels=1\nlabel_smooth_eps=0.1\n").net)
    _, y = D.ClassifierData(paths, names, net, augment=False, channels=1).load(range(6), np.random.default_rng(0), 8, 8)
    assert np.allclose(y.max(axis=1), 0.9) and np.allclose(y.sum(axis=1), 1.0)
    assert np.allclose(np.sort(y, axis=1)[:, 0], 0.1 / 9)
