"""ONNX Runtime as darkpy's inference engine (`--engine onnxruntime`).

`OnnxEngine` wraps a loaded darkpy `Network`: the network is exported once (raw heads, dynamic
batch) to a file cached beside the weights, named by a hash of the cfg, the weights, the input size
and the darkpy version, and every forward runs in ONNX Runtime. The outputs are written into the
network's own head (or output) layer buffers, so everything downstream (decoding, NMS, mAP,
top-k) runs unchanged. Everything else (layers, sizes, set_batch, ...) is the wrapped network's.
"""
from __future__ import annotations

import hashlib
import os
import tempfile

import numpy as np

from ..errors import StateError


def cache_path(net, cfg, weights) -> str:
    """Where the export of (cfg, weights) at the net's input size is cached: beside the weights."""
    from .. import __version__
    h = hashlib.sha256()
    for p in (cfg, weights):
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    h.update(repr((tuple(net.input_shape), __version__)).encode())
    stem = os.path.splitext(os.fspath(weights))[0]
    return f"{stem}.{h.hexdigest()[:16]}.onnx"


def with_engine(net, cfg, weights, engine: str = "darkpy"):
    """`net` itself (engine "darkpy"), or an OnnxEngine running it ("onnxruntime")."""
    if engine != "onnxruntime":
        return net
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        from ..errors import DarkpyError
        raise DarkpyError(f"--engine onnxruntime needs onnx and onnxruntime: pip install 'darkpy[onnx]' ({e})")
    return OnnxEngine.for_network(net, cfg, weights)


class OnnxEngine:
    """A darkpy Network whose forward runs in ONNX Runtime (CPU provider)."""

    def __init__(self, net, model_path: str, threads: int | None = None):
        import onnxruntime as ort
        self.net = net
        self.path = model_path
        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = threads
        self.session = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
        heads = [layer for layer in net.layers if getattr(layer, "is_detection_head", False)]
        self.targets = heads or [net.output_layer]
        self.output_names = [o.name for o in self.session.get_outputs()]

    @classmethod
    def for_network(cls, net, cfg, weights, threads: int | None = None) -> OnnxEngine:
        """Export `net` (loaded from cfg + weights) unless the cached file exists, and open it."""
        from . import export_onnx
        path = cache_path(net, cfg, weights)
        if not os.path.isfile(path):
            try:
                tmp = path + f".{os.getpid()}.tmp"
                export_onnx(net, tmp, dynamic_batch=True)
                os.replace(tmp, path)
            except OSError:             # a read-only weights folder: a private temporary file
                path = os.path.join(tempfile.mkdtemp(prefix="darkpy-onnx-"), os.path.basename(path))
                export_onnx(net, path, dynamic_batch=True)
        return cls(net, path, threads)

    def forward(self, x: np.ndarray, truth=None, train: bool = False) -> np.ndarray:
        if truth is not None or train:
            raise StateError("the onnxruntime engine runs inference only (no truth, no training)")
        x = np.ascontiguousarray(x, np.float32).reshape(-1, *self.net.input_shape)
        if x.shape[0] != self.net.batch:
            raise StateError(f"input has {x.shape[0]} rows but the network batch is {self.net.batch}; "
                             f"call set_batch({x.shape[0]}) first")
        outs = self.session.run(self.output_names, {"input": x})
        for layer, o in zip(self.targets, outs):
            layer.output[...] = o.reshape(layer.output.shape)
        return self.net.output

    def predict(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if x.ndim == len(self.net.input_shape):
            x = x[None]
        if x.shape[0] != self.net.batch:
            self.net.set_batch(x.shape[0])
        return self.forward(x).copy()

    def __getattr__(self, name):
        return getattr(self.net, name)
