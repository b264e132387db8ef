"""The benchmark's translator (benchmarks/torch_model.py) computes what darkpy computes.

This is the "outputs checked equal first" guarantee of the benchmark suite: on tiny networks that use
every translated layer kind, every layer's output equals darkpy's, and one training step (forward,
backward, SGD update) leaves the same weights. Skipped when torch is not installed.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from benchmarks.torch_model import TorchNet, Unsupported, make_optimizer  # noqa: E402
from darkpy.network import network_from_text  # noqa: E402

# 9x9 input: odd sizes exercise maxpool's bottom/right padding (2/2 -> 5x5, 2/1 keeps the size).
CLASSIFIER = """
[net]
batch=4
width=9
height=9
channels=3
[convolutional]
batch_normalize=1
filters=6
size=3
stride=1
pad=1
activation=leaky
[maxpool]
size=2
stride=2
[convolutional]
filters=6
size=1
stride=1
activation=leaky
[shortcut]
from=-2
activation=linear
[route]
layers=-1,-3
[upsample]
stride=2
[maxpool]
size=2
stride=1
[convolutional]
batch_normalize=1
filters=5
size=3
stride=2
pad=1
activation=relu
[maxpool]
size=3
stride=2
[avgpool]
[connected]
output=7
activation=linear
[softmax]
"""

# Darknet's shortcut over a partial overlap: fewer channels, a larger `from` sampled every 2nd pixel,
# a smaller one added at every 2nd pixel; alpha/beta and an activation.
SHORTCUTS = """
[net]
batch=4
width=8
height=8
channels=3
[convolutional]
filters=4
size=3
stride=1
pad=1
activation=leaky
[convolutional]
batch_normalize=1
filters=6
size=3
stride=2
pad=1
activation=leaky
[shortcut]
from=0
alpha=0.5
beta=2
activation=leaky
[upsample]
stride=2
[shortcut]
from=1
activation=linear
[convolutional]
filters=3
size=1
stride=1
activation=linear
[avgpool]
[softmax]
"""

YOLO = """
[net]
batch=2
width=16
height=16
channels=3
[convolutional]
batch_normalize=1
filters=8
size=3
stride=2
pad=1
activation=leaky
[convolutional]
filters=14
size=1
stride=1
activation=linear
[yolo]
mask=0,1
anchors=2,3, 4,5, 6,7
classes=2
num=3
[route]
layers=-3
[upsample]
stride=2
[convolutional]
filters=14
size=1
stride=1
activation=linear
[yolo]
mask=1,2
anchors=2,3, 4,5, 6,7
classes=2
num=3
"""


def _sane(net, seed=1):
    """Non-trivial BN statistics and biases (darkpy's init leaves rolling variance 0)."""
    rng = np.random.default_rng(seed)
    for layer in net.layers:
        bn = getattr(layer, "bn", None)
        if bn is not None:
            bn.scales.value[...] = rng.uniform(0.5, 1.5, bn.scales.value.shape)
            bn.rolling_mean[...] = rng.normal(0, 0.2, bn.rolling_mean.shape)
            bn.rolling_variance[...] = rng.uniform(0.5, 2.0, bn.rolling_variance.shape)
        if hasattr(layer, "biases") and hasattr(layer.biases, "value"):
            layer.biases.value[...] = rng.normal(0, 0.1, layer.biases.value.shape)
    return rng


def _compare_all(net, x):
    model = TorchNet(net.layers).eval()
    net.forward(x)
    with torch.no_grad():
        outs = model(torch.from_numpy(x), keep_all=True)
    assert len(outs) == len(net.layers)
    for layer, out in zip(net.layers, outs):
        want = layer.output.reshape(x.shape[0], -1)
        got = out.reshape(x.shape[0], -1).numpy()
        assert got.shape == want.shape, f"layer {layer.index} [{layer.kind}]"
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"layer {layer.index} [{layer.kind}]")
    return model


def test_every_layer_output_equals_darkpy():
    net = network_from_text(CLASSIFIER, batch=4)
    rng = _sane(net)
    model = _compare_all(net, rng.random((4, 3, 9, 9), dtype=np.float32))
    assert model.heads == [len(net.layers) - 1]


def test_partial_shortcuts_equal_darkpy():
    net = network_from_text(SHORTCUTS, batch=4)
    rng = _sane(net)
    _compare_all(net, rng.random((4, 3, 8, 8), dtype=np.float32))


def test_yolo_heads_equal_darkpy():
    net = network_from_text(YOLO, batch=2)
    rng = _sane(net)
    model = _compare_all(net, rng.random((2, 3, 16, 16), dtype=np.float32))
    assert model.heads == [2, 6]


def test_channels_last_gives_the_same_outputs():
    net = network_from_text(CLASSIFIER, batch=4)
    rng = _sane(net)
    x = rng.random((4, 3, 9, 9), dtype=np.float32)
    model = TorchNet(net.layers).eval()
    with torch.no_grad():
        want = model(torch.from_numpy(x))[0]
        model = model.to(memory_format=torch.channels_last)
        got = model(torch.from_numpy(x).to(memory_format=torch.channels_last))[0]
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("text", [CLASSIFIER, SHORTCUTS], ids=["classifier", "shortcuts"])
def test_training_step_leaves_the_same_weights(text):
    net = network_from_text(text, batch=4)
    rng = _sane(net)
    x = rng.random((4, *net.input_shape), dtype=np.float32)
    classes = net.layers[-1].outputs
    labels = rng.integers(0, classes, 4)
    truth = np.eye(classes, dtype=np.float32)[labels]
    rate, momentum, decay = 0.05, 0.9, 0.0005
    net.config.momentum, net.config.decay = momentum, decay
    model = TorchNet(net.layers, exact_bn=True).train()
    before = [p.detach().clone() for p in model.parameters()]
    opt = make_optimizer(model, rate, momentum, decay)
    for _ in range(2):                       # the second step exercises the momentum buffers
        opt.zero_grad()
        loss = model.loss(torch.from_numpy(x), torch.from_numpy(labels), full_batch=4)
        loss.backward()
        opt.step()
        net.forward(x, truth, train=True)
        net.backward()
        net.update(rate)
        assert loss.item() * 4 == pytest.approx(net.cost, rel=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    for layer, step in zip(net.layers, model.steps):
        pairs = []
        if layer.kind == "convolutional":
            pairs = [(layer.weights.value, step.conv.weight)]
        elif layer.kind == "connected":
            pairs = [(layer.weights.value, step.fc.weight)]
        if getattr(layer, "bn", None) is not None:
            pairs += [(layer.bn.scales.value, step.bn.weight), (layer.biases.value, step.bn.bias),
                      (layer.bn.rolling_mean, step.bn.running_mean),
                      (layer.bn.rolling_variance, step.bn.running_var)]
        elif layer.kind in ("convolutional", "connected"):
            pairs.append((layer.biases.value, (step.conv if layer.kind == "convolutional" else step.fc).bias))
        for want, got in pairs:
            np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-4, atol=1e-6,
                                       err_msg=f"layer {layer.index} [{layer.kind}]")


def test_untranslatable_layer_is_named():
    net = network_from_text("[net]\nwidth=4\nheight=4\nchannels=4\n[reorg]\nstride=2\n", batch=1)
    with pytest.raises(Unsupported, match=r"\[reorg\]"):
        TorchNet(net.layers)


def _truth(batch, max_boxes, boxes):
    truth = np.zeros((batch, 5 * max_boxes), np.float32)
    for b, rows in enumerate(boxes):
        flat = np.asarray(rows, np.float32).reshape(-1)
        truth[b, :flat.size] = flat
    return truth


@pytest.mark.parametrize("iou_thresh", [None, 0.3])
def test_yolo_training_step_equals_darkpy(iou_thresh):
    """The torch yolo loss (benchmarks/torch_yolo.py) gives darkpy's cost and darkpy's gradients:
    two SGD steps leave the same weights. The truth puts two boxes of different classes on one slot
    (the second only sets its own class), boxes for anchors outside a head's mask, a box at x == 1
    (last cell), a malformed row that is skipped and an ignore threshold low enough to ignore some
    slots. With the fork's iou_thresh=0.3 most truths have several positive anchors, and the two
    boxes on one slot add their box terms, halved (two positive classes there)."""
    text = YOLO.replace("num=3", "num=3\nignore_thresh=0.05" + (f"\niou_thresh={iou_thresh}" if iou_thresh else ""))
    net = network_from_text(text, batch=2)
    rng = _sane(net)
    x = rng.random((2, *net.input_shape), dtype=np.float32)
    max_boxes = net.layers[2].max_boxes
    truth = _truth(2, max_boxes, [
        [(0.30, 0.40, 0.20, 0.30, 1), (0.32, 0.42, 0.21, 0.29, 0), (0.7, 0.2, 0.5, 0.4, 1)],
        [(1.0, 0.55, 0.3, 0.2, 0), (0.5, 0.5, -0.1, 0.2, 1), (0.2, 0.8, 0.12, 0.2, 1)],
    ])
    rate, momentum, decay = 0.05, 0.9, 0.0005
    net.config.momentum, net.config.decay = momentum, decay
    model = TorchNet(net.layers, exact_bn=True).train()
    assert model.train_unsupported() is None
    opt = make_optimizer(model, rate, momentum, decay)
    labels = torch.from_numpy(truth)
    for _ in range(2):
        opt.zero_grad()
        loss = model.loss(torch.from_numpy(x), labels, full_batch=2)
        loss.backward()
        opt.step()
        net.forward(x, truth, train=True)
        net.backward()
        net.update(rate)
        assert model.last_cost == pytest.approx(net.cost, rel=1e-4)
    positives = sum(l.stats["count"] for l in net.layers if l.kind == "yolo")
    assert positives >= (8 if iou_thresh else 3)       # positives happened (several per truth with iou_thresh)
    for layer, step in zip(net.layers, model.steps):
        if layer.kind != "convolutional":
            continue
        np.testing.assert_allclose(step.conv.weight.detach().numpy(), layer.weights.value, rtol=1e-4, atol=1e-6,
                                   err_msg=f"layer {layer.index}")
        if layer.bn is not None:
            np.testing.assert_allclose(step.bn.bias.detach().numpy(), layer.biases.value, rtol=1e-4, atol=1e-6)
        else:
            np.testing.assert_allclose(step.conv.bias.detach().numpy(), layer.biases.value, rtol=1e-4, atol=1e-6)


def test_yolo_training_outside_the_translation_is_named():
    net = network_from_text(YOLO.replace("num=3", "num=3\nscale_x_y=1.05"), batch=2)
    assert "scale_x_y" in TorchNet(net.layers).train_unsupported()


def test_onnx_export_gives_the_same_outputs(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from benchmarks.torch_model import export_onnx

    net = network_from_text(YOLO, batch=2)
    rng = _sane(net)
    x = rng.random((2, 3, 16, 16), dtype=np.float32)
    model = TorchNet(net.layers).eval()
    path = str(tmp_path / "y.onnx")
    export_onnx(model, torch.from_numpy(x), path, [2, 6])
    outs = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x})
    net.forward(x)
    for got, index in zip(outs, (2, 6)):
        np.testing.assert_allclose(got.reshape(2, -1), net.layers[index].output.reshape(2, -1), rtol=1e-4, atol=1e-5)
