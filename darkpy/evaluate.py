"""Classifier validation and prediction: the library behind `darkpy valid` and `darkpy predict`."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .datafile import (check_classes, check_labels, class_names, classifier_labels, find_data_file, is_detector,
                       load_data_config, make_dataset, read_image_list, resolve_data_file)
from .errors import DarkpyError, DataError, WeightsError
from .runtime import COMPILING_NOTICE, kernels_need_compiling
from .settings import Settings


@dataclass
class ValidResult:
    top1: float
    topk: float
    k: int
    n: int
    confusion: np.ndarray                  # [truth, predicted] counts
    names: list[str]
    list_file: str

    def format(self) -> str:
        return (f"top-1 accuracy {self.top1 * 100:.2f} %, top-{self.k} {self.topk * 100:.2f} % "
                f"on {self.list_file} ({self.n} images)")

    def confusion_text(self, limit: int = 30) -> str:
        c = self.confusion
        if c.shape[0] > limit:
            return f"(confusion matrix omitted: {c.shape[0]} classes)"
        names = [str(n)[:8] for n in self.names]
        width = max(5, max(len(n) for n in names) + 1, len(str(int(c.max(initial=0)))) + 1)
        head = " " * (width + 2) + "".join(f"{n:>{width}}" for n in names)
        lines = ["confusion matrix (rows: true class, columns: predicted)", head]
        for n, row in zip(names, c):
            lines.append(f"{n:>{width}}  " + "".join(f"{int(v):>{width}d}" for v in row))
        return "\n".join(lines)


def evaluate_classifier(net, dc, paths: list[str], k: int | None = None, batch: int = 64) -> ValidResult:
    """Top-1/top-k accuracy and the confusion matrix of `net` on `paths` (no augmentation)."""
    labels = classifier_labels(dc)
    truth = check_labels(paths, labels, dc.valid or "<list>")
    classes = dc.classes
    k = min(k or (dc.top if "top" in dc.raw else 5), classes)
    names = class_names(dc) or labels
    dataset = make_dataset(net, dc, paths, augment=False, labels=labels)
    rng = np.random.default_rng(0)
    n = len(paths)
    bs = min(batch, n)
    if net.batch != bs:
        net.set_batch(bs)
    conf = np.zeros((classes, classes), np.int64)
    hits1 = hitsk = 0
    for lo in range(0, n, bs):
        idx = np.arange(lo, min(lo + bs, n))
        x, _ = dataset.load(idx, rng, net.width, net.height)
        if len(idx) < bs:
            x = np.concatenate([x, np.zeros((bs - len(idx), *x.shape[1:]), x.dtype)])
        out = net.forward(x, None, train=False).reshape(bs, -1)[:len(idx)]
        order = np.argsort(-out, axis=1, kind="stable")
        t = truth[idx]
        pred = order[:, 0]
        hits1 += int((pred == t).sum())
        hitsk += int((order[:, :k] == t[:, None]).any(axis=1).sum())
        np.add.at(conf, (t, pred), 1)
    return ValidResult(hits1 / n, hitsk / n, k, n, conf, names, dc.valid or "<list>")


def validate(cfg, weights, data=None, settings: Settings | None = None, engine: str = "darkpy") -> ValidResult:
    """`darkpy valid`: accuracy of `weights` on the .data file's `valid` list (`engine` as predict's)."""
    from .export.engine import with_engine

    data_path = resolve_data_file(cfg, data)
    dc = load_data_config(data_path)
    net = with_engine(_load_for_inference(cfg, weights), cfg, weights, engine)
    if is_detector(net):
        raise DarkpyError(f"{cfg}: `valid` measures classifier accuracy; this network is a detector: "
                          f"use `darkpy map`")
    check_classes(net, dc)
    return evaluate_classifier(net, dc, read_image_list(dc.valid, "valid", data_path))


def _load_for_inference(cfg, weights, notify=None):
    """Build the net at batch 1 and load `weights`; `notify(message)` hears about kernel compiling."""
    from .network import load_network

    net = load_network(cfg, batch=1)
    if notify is not None and kernels_need_compiling(net, training=False):
        notify(COMPILING_NOTICE)
    try:
        net.load_weights(weights)
    except WeightsError as e:
        raise e.with_cfg_hint() from None
    net.share_outputs()         # inference only: the output layer keeps its buffer, the rest share one
    return net


@dataclass
class Prediction:
    image: str
    top: list[tuple[int, str, float]]      # (class index, name, probability), best first

    def as_dict(self) -> dict:
        return {"image": self.image,
                "predictions": [{"index": i, "label": n, "probability": p} for i, n, p in self.top]}


def predict(cfg, weights, images: Sequence[str], data=None, top: int | None = None,
            notify=None, engine: str = "darkpy") -> list[Prediction]:
    """`darkpy predict`: the top classes of each image (resized to the network's input);
    `engine="onnxruntime"` runs the network exported to ONNX (export/engine.py)."""
    from . import images as im
    from .export.engine import with_engine

    net = with_engine(_load_for_inference(cfg, weights, notify), cfg, weights, engine)
    if is_detector(net):
        raise DarkpyError(f"{cfg}: `predict` shows classifier labels; this network is a detector: "
                          f"use `darkpy detect`")
    names = None
    k = top
    data_path = Path(data) if data is not None else find_data_file(cfg)
    if data is not None and not Path(data).is_file():
        raise DataError(f"{data}: no such .data file")
    if data_path is not None:
        dc = load_data_config(data_path)
        names = class_names(dc)
        k = k or (dc.top if "top" in dc.raw else None)
    out: list[Prediction] = []
    c = net.input_shape[0]
    for path in images:
        img = im.load_image(path, channels=c)
        x = im.resize_image(img, net.width, net.height)
        probs = net.predict(x[None]).reshape(-1)
        n = probs.size
        kk = min(k or 5, n)
        order = np.argsort(-probs, kind="stable")[:kk]
        label = (lambda i: names[i] if names and i < len(names) else str(i))
        out.append(Prediction(os.fspath(path), [(int(i), label(int(i)), float(probs[i])) for i in order]))
    return out
