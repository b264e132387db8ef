"""Forward parity with OpenCV's Darknet importer (cv2.dnn.readNetFromDarknet) on real detector cfgs
from ../shared/cfg, at a small input size, with random weights written by darkpy: the raw inputs of
every [yolo]/[region] head, and the boxes each head decodes (x, y, w, h, objectness, class scores).

Every conv in these cfgs names its activation, so OpenCV's different default does not matter.
OpenCV zeroes the class scores that are not above a head's `thresh` key; the test sets it to 0 (a
training-only key for darkpy). OpenCV's [region] output has been through a per-class NMS at 0.4,
so darkpy's region scores go through `detect.do_nms_sort` at 0.4 before the comparison. The BN
epsilons differ (darkpy: sqrt(var + 1e-5), as cuDNN), a relative 1e-5 per layer at the variances used
here, hence the 1e-3 tolerance on the heads' inputs."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from darkpy.cfg import CfgWarning, load_cfg
from darkpy.detect import Boxes, do_nms_sort
from darkpy.network import Network
from helpers import assert_close

cv2 = pytest.importorskip("cv2")

#: (repo, cfg, input size)
CFGS = [("pjreddie", "yolov2-tiny", 160), ("pjreddie", "yolov3-tiny", 160),
        ("alexeyab", "yolov4-tiny-custom", 160), ("alexeyab", "tiny-yolo", 128)]
SLOW_CFGS = [("pjreddie", "yolov3", 128)]


def calibrated_weights(net: Network, x: np.ndarray, seed: int) -> None:
    """Random weights whose activations stay in range through a deep residual net: darkpy's He-scaled
    conv weights, small biases, BN scales in [.5, 1.5], and each BN's rolling statistics set to the
    batch statistics of a training-mode forward of `x` (so inference normalises for real; variances
    at least 1)."""
    rng = np.random.default_rng(seed)
    bns = [l.bn for l in net.layers if getattr(l, "bn", None)]
    for layer in net.layers:
        biases = getattr(layer, "biases", None)
        if biases is not None and hasattr(biases, "value"):
            biases.value[...] = rng.uniform(-0.1, 0.1, biases.value.shape)
    for bn in bns:
        bn.scales.value[...] = rng.uniform(0.5, 1.5, bn.scales.value.shape)
    net.forward(x, train=True)
    for bn in bns:
        bn.rolling_mean[...] = bn.mean
        bn.rolling_variance[...] = np.maximum(bn.variance, 1.0)   # no channel amplified:
        # the BN epsilons differ (darkpy sqrt(var + 1e-5), OpenCV its own), harmless away from 0


def opencv_rows(net: Network, layer, out: np.ndarray) -> np.ndarray:
    """darkpy's decoding of every slot of a head, in OpenCV's row order ((row·cols + col)·anchors + a):
    x, y, w, h (net-relative), objectness, objectness·class."""
    boxes, obj, probs = layer.get_detections(0, -1.0, net.width, net.height)
    _, h, w = layer.out_shape
    if layer.kind == "region":                          # darkpy/Darknet order: anchor-major
        order = np.arange(len(boxes)).reshape(layer.n, h * w).T.reshape(-1)
        boxes, obj, probs = boxes[order], obj[order], probs[order]
    return np.concatenate([boxes, obj[:, None], probs], axis=1)


def run_parity(tmp_path, repo, name, size, shared):
    doc = load_cfg(shared / "cfg" / repo / f"{name}.cfg")
    for key, value in (("width", size), ("height", size), ("batch", 1), ("subdivisions", 1)):
        doc.set(f"net.{key}", str(value))
    for i, sec in enumerate(doc.layers):
        if sec.kind in ("yolo", "region"):
            doc.set(f"{i}.thresh", "0")
    cfg = tmp_path / f"{name}.cfg"
    doc.write(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CfgWarning)     # [yolo] thresh: unused by darkpy
        net = Network(load_cfg(cfg), batch=1)
    x = np.random.default_rng(1).uniform(0, 1, (1, 3, size, size)).astype(np.float32)
    calibrated_weights(net, x, 7)
    weights = tmp_path / f"{name}.weights"
    net.save_weights(weights)
    net.forward(x)

    cvnet = cv2.dnn.readNetFromDarknet(str(cfg), str(weights))
    cvnet.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    cvnet.enableWinograd(False)
    cvnet.setInput(x)
    heads = [l for l in net.layers if getattr(l, "is_detection_head", False)]
    names = list(cvnet.getLayerNames())
    head_names = [n for n in names if n.startswith(("yolo_", "detection_out", "region_"))]
    assert len(head_names) == len(heads), names
    prev_names = [names[names.index(h) - 2] for h in head_names]   # conv_i, permute_i, head_i
    outs = cvnet.forward(prev_names + head_names)
    for k, layer in enumerate(heads):
        raw, decoded = outs[k], outs[len(heads) + k]
        mine_raw = net.layers[layer.index - 1].output
        scale = max(1.0, float(np.abs(raw).max()))
        assert_close(mine_raw, raw, 1e-3, 1e-3 * scale, f"{name}: input of head {layer.index}")
        mine = opencv_rows(net, layer, layer.output)
        decoded = decoded.reshape(mine.shape)
        assert_close(mine[:, :5], decoded[:, :5], 1e-3, 1e-4, f"{name}: boxes of head {layer.index}")
        if layer.kind == "region":      # OpenCV's region layer ends with a per-class NMS at 0.4
            mine[:, 5:] = do_nms_sort(Boxes(mine[:, :4], mine[:, 4], mine[:, 5:]), 0.4).probs
        assert (decoded[:, 5:] > 1e-3).sum() >= 10, f"{name}: too few sizeable class scores to compare"
        assert_close(mine[:, 5:], decoded[:, 5:], 1e-3, 1e-6, f"{name}: class scores of head {layer.index}")


@pytest.mark.parametrize("repo, name, size", CFGS, ids=[c[1] for c in CFGS])
def test_forward_parity_with_opencv(tmp_path, shared, repo, name, size):
    run_parity(tmp_path, repo, name, size, shared)


@pytest.mark.slow
@pytest.mark.parametrize("repo, name, size", SLOW_CFGS, ids=[c[1] for c in SLOW_CFGS])
def test_forward_parity_with_opencv_large(tmp_path, shared, repo, name, size):
    run_parity(tmp_path, repo, name, size, shared)
