"""Layer families, one module each. Importing this package registers every family in REGISTRY."""
from __future__ import annotations

import importlib

from .base import REGISTRY, Layer, Param, State, register  # noqa: F401

#: Families, imported in this order. A module that does not exist yet is skipped (see FAMILIES_MISSING).
_FAMILIES = (
    "convolutional", "connected", "batchnorm", "pooling", "dropout", "softmax", "cost", "logistic",
    "normalization", "activation", "route", "shortcut", "upsample", "reorg", "crop", "attention",
    "yolo", "region", "detection", "recurrent", "gated", "local", "deconvolutional",
    "xnor", "share", "implicit", "yolor", "tree", "contrastive", "history", "gaussian_yolo", "conv_lstm",
    "embedding", "layernorm", "mha", "xent",
)
FAMILIES_MISSING: list[str] = []
for _name in _FAMILIES:
    try:
        importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _e:
        if _e.name != f"{__name__}.{_name}":
            raise
        FAMILIES_MISSING.append(_name)

#: Sections darknet knows that darkpy does not build (yet): a clear error instead of an identity layer.
UNSUPPORTED_ALL = {
    "deconvolutional": "transposed convolution", "deconv": "transposed convolution",
    "local": "locally connected layer",
    "rnn": "recurrent layer", "gru": "recurrent layer", "lstm": "recurrent layer", "crnn": "recurrent layer",
    "conv_lstm": "convolutional LSTM (AlexeyAB)", "history": "AlexeyAB time-history layer",
    "iseg": "instance segmentation head", "Gaussian_yolo": "Gaussian YOLO head (AlexeyAB)",
    "contrastive": "contrastive loss (AlexeyAB)", "implicit": "YOLOR implicit layer (AlexeyAB)",
    "yolo": "YOLOv3 detection head", "region": "YOLOv2 detection head", "detection": "YOLOv1 detection head",
}
UNSUPPORTED = {k: v for k, v in UNSUPPORTED_ALL.items() if k not in REGISTRY}
