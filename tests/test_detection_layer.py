"""[detection] (YOLOv1): Darknet golden forward + decoded boxes, the truth grid and training deltas
against a slow numpy reference, and the deltas against the float64 numerical gradient of the loss."""
from __future__ import annotations

import math

import numpy as np
import pytest

from darkpy.errors import CfgError
from darkpy.layers import FAMILIES_MISSING
from darkpy.network import load_network, network_from_text
from heads_ref import head_state, ref_iou, valid_truths
from helpers import assert_close, golden_dir, numerical_grad, read_f32

SIDE, NUM, CLASSES = 3, 2, 3
INPUTS = SIDE * SIDE * (5 * NUM + CLASSES)


def det_cfg(extra="softmax=1\nsqrt=1", inputs=INPUTS):
    return (f"[net]\ninputs={inputs}\n\n[detection]\nclasses={CLASSES}\ncoords=4\nside={SIDE}\nnum={NUM}\n"
            f"max=8\n{extra}\n")


GOLDEN_KEYS = ("rescore=1\nsoftmax=1\nsqrt=1\njitter=.2\nobject_scale=1\nnoobject_scale=.5\nclass_scale=1\n"
               "coord_scale=5")


def test_golden_detection_forward_and_dets():
    d = golden_dir("forward", "detection")
    net = network_from_text(det_cfg(GOLDEN_KEYS, 117))
    net.forward(read_f32(d / "layer_001.f32").reshape(1, 117))
    layer = net.layers[0]
    assert_close(layer.output.ravel(), read_f32(d / "layer_002.f32"), 1e-5, 1e-6, "detection output")
    boxes, obj, probs = layer.get_detections(0, 0.2, 8, 8)
    boxes *= [40, 30, 40, 30]     # Darknet's YOLOv1 boxes come out in image pixels
    dets = np.loadtxt(d / "dets.txt")
    assert_close(np.concatenate([boxes, obj[:, None], probs], 1), dets[:, 1:], 1e-5, 1e-5, "dets.txt")


@pytest.mark.skipif(bool({"convolutional", "connected"} & set(FAMILIES_MISSING)), reason="needs conv/connected")
def test_golden_detection_whole_network():
    d = golden_dir("forward", "detection")
    net = load_network(d / "net.cfg", d / "net.weights")
    net.forward(read_f32(d / "input.f32").reshape(1, 3, 8, 8))
    for i, layer in enumerate(net.layers):
        assert_close(layer.output.ravel(), read_f32(d / f"layer_{i:03d}.f32"), 1e-5, 1e-5, f"layer {i}")


def truth_grid(truth_row):
    """Darknet's fill_truth_region: per cell [is_obj, one-hot, x, y (cell-relative), w, h]."""
    grid = np.zeros((SIDE * SIDE, 5 + CLASSES))
    for x, y, w, h, c in valid_truths(truth_row, CLASSES, 8):
        if w < 0.005 or h < 0.005:
            continue
        col, row = min(int(x * SIDE), SIDE - 1), min(int(y * SIDE), SIDE - 1)
        cell = grid[col + row * SIDE]
        if cell[0]:
            continue
        cell[0], cell[1 + c] = 1, 1
        cell[1 + CLASSES:] = (x * SIDE - col, y * SIDE - row, w, h)
    return grid


def detection_reference(z, truth, *, softmax=True, sqrt=True, rescore=False, forced=False,
                        coord=1.0, obj=1.0, noobj=1.0, cls=1.0):
    """Returns (out, T, W, grids): delta = W·(T - out)."""
    loc = SIDE * SIDE
    out = z.copy()
    if softmax:
        c = out[:, :loc * CLASSES].reshape(-1, loc, CLASSES)
        e = np.exp(c - c.max(axis=2, keepdims=True))
        out[:, :loc * CLASSES] = (e / e.sum(axis=2, keepdims=True)).reshape(-1, loc * CLASSES)
    T, W = np.zeros_like(z), np.zeros_like(z)
    grids = []
    for b in range(z.shape[0]):
        grid = truth_grid(truth[b])
        grids.append(grid)
        for i in range(loc):
            conf = loc * CLASSES + i * NUM
            W[b, conf:conf + NUM] = noobj
            if not grid[i, 0]:
                continue
            T[b, i * CLASSES:(i + 1) * CLASSES] = grid[i, 1:1 + CLASSES]
            W[b, i * CLASSES:(i + 1) * CLASSES] = cls
            t = (grid[i, 1 + CLASSES] / SIDE, grid[i, 2 + CLASSES] / SIDE, grid[i, 3 + CLASSES], grid[i, 4 + CLASSES])

            def box(j):
                k = loc * (CLASSES + NUM) + (i * NUM + j) * 4
                p = out[b, k:k + 4]
                return (p[0] / SIDE, p[1] / SIDE, p[2] ** 2 if sqrt else p[2], p[3] ** 2 if sqrt else p[3])

            best, best_iou, best_rmse = -1, 0.0, 20.0
            for j in range(NUM):
                iou = ref_iou(box(j), t)
                rmse = math.sqrt(sum((p - q) ** 2 for p, q in zip(box(j), t)))
                if best_iou > 0 or iou > 0:
                    if iou > best_iou:
                        best, best_iou = j, iou
                elif rmse < best_rmse:
                    best, best_rmse = j, rmse
            if forced:
                best = 1 if t[2] * t[3] < 0.1 else 0
            T[b, conf + best] = ref_iou(box(best), t) if rescore else 1.0
            W[b, conf + best] = obj
            k = loc * (CLASSES + NUM) + (i * NUM + best) * 4
            g = grid[i, 1 + CLASSES:]
            T[b, k:k + 4] = (g[0], g[1], math.sqrt(g[2]) if sqrt else g[2], math.sqrt(g[3]) if sqrt else g[3])
            W[b, k:k + 4] = coord
    return out, T, W, grids


def detection_loss(z, T, W, softmax):
    loc = SIDE * SIDE
    loss = 0.5 * (W[:, loc * CLASSES:] * (T[:, loc * CLASSES:] - z[:, loc * CLASSES:]) ** 2).sum()
    c, tc, wc = (a[:, :loc * CLASSES].reshape(-1, loc, CLASSES) for a in (z, T, W))
    if softmax:
        logp = c - c.max(axis=2, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(axis=2, keepdims=True))
        return loss - (wc * tc * logp).sum()
    return loss + 0.5 * (wc * (tc - c) ** 2).sum()


def make_case(seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 0.5, size=(2, INPUTS))
    z[:, SIDE * SIDE * (CLASSES + NUM):] = np.abs(z[:, SIDE * SIDE * (CLASSES + NUM):]) + 0.1   # sizes > 0
    truth = np.zeros((2, 40))
    rows = [[(0.20, 0.25, 0.30, 0.40, 1), (0.25, 0.20, 0.20, 0.20, 2), (1.0, 1.0, 0.2, 0.2, 0),
             (0.5, 0.5, 0.004, 0.3, 1), (0.5, 0.5, 0.3, 0.3, 9)],
            [(0.55, 0.45, 0.60, 0.50, 0)]]
    for b, rr in enumerate(rows):
        for t, r in enumerate(rr):
            truth[b, 5 * t:5 * t + 5] = r
    return z, truth


CASES = {
    "softmax_sqrt": ("softmax=1\nsqrt=1", {}),
    "plain_rescore_scales": ("rescore=1\ncoord_scale=5\nobject_scale=2\nnoobject_scale=.5\nclass_scale=1.5",
                             {"softmax": False, "sqrt": False, "rescore": True, "coord": 5.0, "obj": 2.0,
                              "noobj": 0.5, "cls": 1.5}),
    "forced": ("softmax=1\nsqrt=1\nforced=1", {"forced": True}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_training_delta_reference_and_gradient(case):
    extra, kw = CASES[case]
    z, truth = make_case()
    net = network_from_text(det_cfg(extra), batch=2, dtype=np.float64)
    layer = net.layers[0]
    layer.forward(head_state(z.copy(), truth, net_w=0, net_h=0))
    out, T, W, grids = detection_reference(z, truth, **kw)
    assert_close(layer.grid, np.stack(grids), 0, 1e-15, "truth grid")
    assert_close(layer.output, out, 1e-12, 1e-12, "output")
    expected = W * (T - out)
    assert_close(layer.delta, expected, 1e-9, 1e-12, "delta vs reference")
    assert layer.cost == pytest.approx(float((expected ** 2).sum()), rel=1e-12)
    assert layer.stats["bad_truths"] == 1 and layer.stats["count"] == 3
    zz = z.copy()
    num = numerical_grad(lambda: detection_loss(zz, T, W, kw.get("softmax", True)), zz)
    assert_close(layer.delta, -num, 1e-5, 1e-8, "delta vs -dL/dz")


def test_grid_first_box_owns_the_cell():
    z, truth = make_case()
    grid = truth_grid(truth[0])
    assert grid[0, 0] == 1 and grid[0, 1 + 1] == 1      # the first of two boxes in cell 0 (class 1)
    assert grid[8, 0] == 1                               # x = y = 1 clamps into the last cell
    assert grid[4, 0] == 0                               # the 0.004-wide box is dropped


def test_random_choice_only_early_in_training():
    z, truth = make_case()
    net = network_from_text(det_cfg("softmax=1\nsqrt=1\nrandom=1"), batch=2, dtype=np.float64)
    layer = net.layers[0]
    layer.forward(head_state(z.copy(), truth, net_w=0, net_h=0, seen=64000))
    _, T, W, _ = detection_reference(z, truth)
    assert_close(layer.delta, W * (T - layer.output), 1e-9, 1e-12, "random has no effect after 64000 images")


def test_wrong_input_size_is_a_clear_error():
    with pytest.raises(CfgError, match="output=117"):
        network_from_text(det_cfg(inputs=100))
