"""`[Gaussian_yolo]`: activations and detections against numpy, the box/uncertainty deltas against
float64 central differences of the Gaussian negative log-likelihood they come from, Darknet's
assignment rules on a hand-made case, and a few training steps that lower the loss."""
from __future__ import annotations

import math

import numpy as np
import pytest

from darkpy.errors import CfgError
from darkpy.layers.gaussian_yolo import GaussianYoloLayer, gaussian_box_delta
from darkpy.network import network_from_text
from helpers import assert_close, numerical_grad

C = 2                       # classes
E = 9 + C                   # entries per anchor


def _cfg(batch=1, size=4, extra=""):
    return (f"[net]\nbatch={batch}\nwidth={size}\nheight={size}\nchannels={2 * E}\n"
            f"[Gaussian_yolo]\nmask=0,1\nanchors=1,1,2,3\nnum=2\nclasses={C}\nscale_x_y=1.1\n{extra}")


def _sig(x):
    return 1 / (1 + np.exp(-x))


def test_forward_activations_match_numpy():
    net = network_from_text(_cfg(), dtype=np.float64)
    layer = net.layers[0]
    assert isinstance(layer, GaussianYoloLayer) and layer.out_shape == (2 * E, 4, 4)
    x = np.random.default_rng(0).normal(size=net.input.shape)
    out = net.forward(x).reshape(2, E, 16)
    xs = x.reshape(2, E, 16)
    want = _sig(xs)
    want[:, [0, 2]] = 1.1 * _sig(xs[:, [0, 2]]) - 0.05
    want[:, [4, 6]] = xs[:, [4, 6]]
    assert_close(out, want, 1e-12, 1e-14, "activations")


def test_box_deltas_are_the_gaussian_nll_gradient():
    """δμ = −½·s·∂NLL/∂μ · iou_normalizer, δσ = −½·s·∂NLL/∂σ · uc_normalizer with
    NLL = Σ_k d_k²/(2σ_k²) + log(σ_k + 0.3), d_k = target_k − μ_k."""
    hw, lw, lh, net_w, net_h, aw, ah = 4, 2, 2, 16, 16, 6.0, 9.0
    rng = np.random.default_rng(1)
    out = rng.uniform(0.2, 0.8, (1, 8 * hw))
    i, j, tx, ty, tw, th = 1, 0, 0.7, 0.3, 0.4, 0.5
    targets = [tx * lw - i, ty * lh - j, math.log(tw * net_w / aw), math.log(th * net_h / ah)]
    scale, iou_n, uc_n = 2 - tw * th, 0.6, 0.8

    def nll():
        total = 0.0
        for k in range(4):
            m, s = out[0, 2 * k * hw], out[0, (2 * k + 1) * hw]
            total += (targets[k] - m) ** 2 / (2 * s * s) + math.log(s + 0.3)
        return total

    delta = np.zeros_like(out)
    gaussian_box_delta(delta, out, 0, 0, hw, i, j, lw, lh, aw, ah, net_w, net_h, tx, ty, tw, th, scale,
                       -1, iou_n, uc_n, math.inf)
    g = numerical_grad(nll, out)
    want = np.zeros_like(out)
    for k in range(4):
        want[0, 2 * k * hw] = -0.5 * scale * iou_n * g[0, 2 * k * hw]
        want[0, (2 * k + 1) * hw] = -0.5 * scale * uc_n * g[0, (2 * k + 1) * hw]
    assert_close(delta, want, 1e-6, 1e-9, "Gaussian box deltas")
    # another iou_loss: the mu deltas are [yolo]'s IoU-kind derivative, the sigma ones unchanged
    d2 = np.zeros_like(out)
    gaussian_box_delta(d2, out, 0, 0, hw, i, j, lw, lh, aw, ah, net_w, net_h, tx, ty, tw, th, scale,
                       1, iou_n, uc_n, math.inf)
    sig = [(2 * k + 1) * hw for k in range(4)]
    assert_close(d2[0, sig], delta[0, sig], 1e-12, 1e-15, "sigma deltas")
    assert not np.allclose(d2[0, [0, 2 * hw]], delta[0, [0, 2 * hw]])


def test_assignment_objectness_and_classes():
    net = network_from_text(_cfg(extra="ignore_thresh=.99\n"), dtype=np.float64)
    layer = net.layers[0]
    x = np.random.default_rng(2).normal(size=net.input.shape)
    truth = np.zeros(net.truth.shape)
    truth[0, :5] = [0.6, 0.3, 0.5, 0.75, 1]         # 2x3 px in a 4x4 net: anchor 1 fits best
    net.forward(x, truth, train=True)
    out = layer.output.reshape(2, E, 4, 4)
    d = layer.delta.reshape(2, E, 4, 4)
    i, j = 2, 1
    assert d[1, 8, j, i] == pytest.approx(1 - out[1, 8, j, i])            # obj target 1
    assert_close(d[1, 9:, j, i], np.array([0, 1]) - out[1, 9:, j, i], 1e-12, 1e-15, "one-hot classes")
    assert np.all(d[1, :8, j, i] != 0)
    others = np.ones((2, 4, 4), bool)
    others[1, j, i] = False
    assert_close(d[:, 8][others], -out[:, 8][others], 1e-12, 1e-15, "no-object deltas")
    assert np.all(d[:, :8].transpose(0, 2, 3, 1)[others] == 0)      # box deltas only at the positive
    assert layer.stats["count"] == 1 and layer.cost == pytest.approx(float((layer.delta ** 2).sum()))


def test_detections_scale_probabilities_by_certainty():
    net = network_from_text(_cfg(), dtype=np.float64)
    layer = net.layers[0]
    net.forward(np.random.default_rng(3).normal(size=net.input.shape))
    boxes, obj, probs = layer.get_detections(0, 0.0, 4, 4)
    assert len(obj) == 32
    out = layer.output[0].reshape(2, E, 4, 4)
    a, r, c = 1, 2, 3
    k = [n for n in range(32) if (n // 2, n % 2) == (r * 4 + c, a)][0]      # cell-major, then anchor
    uc = out[a, [1, 3, 5, 7], r, c].mean()
    assert_close(probs[k], out[a, 8, r, c] * (1 - uc) * out[a, 9:, r, c], 1e-12, 1e-15, "probs")
    assert_close(boxes[k], [(c + out[a, 0, r, c]) / 4, (r + out[a, 2, r, c]) / 4,
                            np.exp(out[a, 4, r, c]) * 2 / 4, np.exp(out[a, 6, r, c]) * 3 / 4], 1e-12, 1e-15,
                 "box")


def test_channels_and_unsupported_keys_are_located_errors():
    with pytest.raises(CfgError, match=r"len\(mask\)\*\(classes\+9\)"):
        network_from_text(_cfg().replace(f"channels={2 * E}", "channels=14"))
    with pytest.raises(CfgError, match="yolo_point") as e:
        network_from_text(_cfg(extra="yolo_point=left_top\n"))
    assert e.value.key == "yolo_point"


def test_a_few_iterations_lower_the_loss():
    text = ("[net]\nbatch=2\nwidth=32\nheight=32\nchannels=3\nlearning_rate=0.002\nmomentum=0.9\ndecay=0\n"
            f"[convolutional]\nfilters=8\nsize=3\nstride=4\npad=1\nactivation=leaky\n"
            f"[convolutional]\nfilters={2 * E}\nsize=1\nactivation=linear\n"
            f"[Gaussian_yolo]\nmask=0,1\nanchors=8,8,16,24\nnum=2\nclasses={C}\nmax_delta=5\n")
    net = network_from_text(text, seed=0)
    rng = np.random.default_rng(4)
    x = rng.uniform(0, 1, net.input.shape).astype(np.float32)
    truth = np.zeros(net.truth.shape, np.float32)
    truth[0, :5] = [0.6, 0.3, 0.5, 0.75, 1]
    truth[1, :5] = [0.3, 0.6, 0.25, 0.25, 0]
    losses = []
    for _ in range(40):
        net.forward(x, truth, train=True)
        losses.append(net.cost)
        net.backward()
        net.update()
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3]), losses


def test_a_vanishing_sigma_gives_no_delta_instead_of_a_crash():
    out = np.full((1, 8), 0.5, np.float32)
    out[0, 1] = 1e-20                                      # σx: its cube underflows in float32
    out[0, 3] = 0.0                                        # σy exactly 0
    delta = np.zeros_like(out)
    gaussian_box_delta(delta, out, 0, 0, 1, 0, 0, 1, 1, 1.0, 1.0, 1, 1, 0.3, 0.3, 0.5, 0.5, 1.5, -1, 1.0, 1.0,
                       math.inf)
    assert np.all(np.isfinite(delta)) and delta[0, 2] == 0 and delta[0, 3] == 0 and delta[0, 4] != 0


@pytest.mark.parametrize("kind, anchors", [("iou", [0, 1]), ("diou", [0, 1]), ("giou", [0]), ("ciou", [0])])
def test_iou_thresh_kind_selects_the_extra_anchors(kind, anchors):
    """A 3x1 px truth: best anchor 0 (1x1); anchor 1 (2x3) has IoU .286, GIoU .063 (neither holds the
    other), CIoU .250 (aspect penalty), DIoU = IoU (same centre); iou_thresh=.27 keeps it only for
    iou and diou."""
    net = network_from_text(_cfg(extra=f"ignore_thresh=.99\niou_thresh=.27\niou_thresh_kind={kind}\n"),
                            dtype=np.float64)
    layer = net.layers[0]
    x = np.random.default_rng(2).normal(size=net.input.shape)
    truth = np.zeros(net.truth.shape)
    truth[0, :5] = [0.6, 0.3, 0.75, 0.25, 1]
    net.forward(x, truth, train=True)
    out = layer.output.reshape(2, E, 4, 4)
    d = layer.delta.reshape(2, E, 4, 4)
    positive = np.isclose(d[:, 8], 1 - out[:, 8], rtol=0, atol=1e-12)
    assert sorted(map(tuple, np.argwhere(positive).tolist())) == [(a, 1, 2) for a in anchors]
