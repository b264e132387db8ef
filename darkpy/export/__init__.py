"""darkpy networks as ONNX models (`darkpy export`, `darkpy.export_onnx`), and ONNX Runtime as an
inference engine (`OnnxEngine`, `--engine onnxruntime`).

Every layer is converted by the converter registered for its kind (convert.py), reproducing darkpy's
inference forward exactly; a layer that cannot be expressed is refused with an `ExportError` naming
its section (never an approximate graph). Heads: `raw` gives one output per detection head (the
tensor the [yolo]/[region]/[detection] layer outputs, its activations applied) or the network output
for other networks; `boxes` gives `boxes` (B, N, 4: x1, y1, x2, y2 relative to the network input) and
`scores` (B, N, classes: objectness x class probability), `raw+boxes` both; `nms` adds ONNX NonMaxSuppression with
`iou_threshold`, `score_threshold` and `max_output_boxes_per_class` as graph inputs. `layers`
adds named intermediate outputs: `layer<i>`, layer i's output as darkpy leaves it (batch, c, h, w)
(e.g. the logits feeding a final [softmax]), after the heads' outputs.

This package imports onnx; `import darkpy` does not import it (darkpy.export_onnx is lazy).
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from ..errors import CfgError


class ExportError(CfgError):
    """A network (or one section of it) that cannot be exported to ONNX exactly."""


def cfg_sha256(net) -> str:
    """sha256 of the cfg file's bytes (of the parsed text when the network has no file)."""
    path = getattr(net, "file", None)
    if path and os.path.isfile(path):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    return hashlib.sha256(net.doc.text().encode()).hexdigest()


def export_onnx(net, path=None, *, batch: int | None = None, dynamic_batch: bool = False, opset: int | None = None,
                heads: str = "raw", nms: bool = False, fp16: bool = False, fold: bool = True,
                names=None, letterbox: bool | None = None, layers=()):
    """Export `net` (a darkpy Network at its current input size) to ONNX; write it to `path` when
    given. Returns the onnx.ModelProto. See the module docstring for `heads`, `nms` and `layers`
    (layer indices whose outputs are added as `layer<i>`). `batch`: the fixed batch (default the
    net's), unless `dynamic_batch`."""
    import numpy as np
    import onnx
    from onnx import TensorProto

    from .convert import Ctx, convert_layers
    from .graph import MIN_OPSET, Graph

    opset = MIN_OPSET if opset is None else int(opset)
    heads = "boxes" if nms else heads
    batch = net.batch if batch is None else batch
    head_layers = _check_options(net, opset, heads, batch, dynamic_batch)
    layers = _check_layers(net, layers)
    g = Graph(np.float16 if fp16 else np.float32)
    b = "batch" if dynamic_batch else batch
    g.add_input("input", [b, *net.input_shape])
    x = g.op("Cast", ["input"], "input_fp16", to=TensorProto.FLOAT16) if fp16 else "input"
    ctx = Ctx(g, net, fold=fold, input=(x, tuple(net.input_shape)))
    convert_layers(ctx)
    layout = _add_outputs(ctx, head_layers, heads, nms, b, layers)
    model = g.model(opset, doc=f"darkpy export of {os.path.basename(str(net.file))}")
    if letterbox is None:
        letterbox = bool(head_layers) and all(getattr(h, "letterbox_boxes", False) for h in head_layers)
    meta = _metadata(net, layout, "nms" if nms else heads, letterbox, fold, fp16, names)
    onnx.helper.set_model_props(model, meta)
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model


def _check_options(net, opset: int, heads: str, batch: int, dynamic_batch: bool) -> list:
    """The net's detection heads, after checking that the options fit the net (ExportError)."""
    import onnx

    from .graph import MIN_OPSET
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ExportError(f"--opset {opset}: darkpy's graphs need opset {MIN_OPSET}..{newest}")
    if heads not in ("raw", "boxes", "raw+boxes"):
        raise ExportError(f"--heads {heads!r}: expected raw or boxes")
    if batch < 1:
        raise ExportError(f"--batch {batch}: must be >= 1")
    steps = max([getattr(layer, "steps", 1) for layer in net.layers] + [1])
    if not dynamic_batch and batch % steps:
        raise ExportError(f"--batch {batch}: a recurrent network needs a multiple of time_steps={steps} rows")
    head_layers = [layer for layer in net.layers if getattr(layer, "is_detection_head", False)]
    if heads != "raw" and not head_layers:
        raise ExportError(f"{net.file}: --heads boxes needs a [yolo], [region] or [detection] layer")
    if heads != "raw" and len({layer.classes for layer in head_layers}) > 1:
        raise ExportError(f"{net.file}: the detection heads disagree on the number of classes")
    return head_layers


def _check_layers(net, layers) -> list[int]:
    """The `layers` option as a list of distinct layer indices (negative ones count from the end)."""
    out = []
    for i in layers:
        try:
            k = int(i)
        except (TypeError, ValueError):
            raise ExportError(f"--layer-output {i!r}: expected a layer index") from None
        if not -len(net.layers) <= k < len(net.layers):
            raise ExportError(f"--layer-output {k}: the network has layers 0..{len(net.layers) - 1}")
        k %= len(net.layers)
        if k not in out:
            out.append(k)
    return out


def _add_outputs(ctx, head_layers, heads: str, nms: bool, b, layers=()) -> dict:
    """The graph outputs (float32 whatever the compute dtype); returns name -> description."""
    import onnx
    from onnx import TensorProto

    from .heads import add_nms, all_boxes
    g = ctx.g
    fp16 = g.dtype != np.dtype(np.float32)

    def output(name: str, t: str, shape, elem=TensorProto.FLOAT) -> None:
        if fp16 and elem == TensorProto.FLOAT:
            t = g.op("Cast", [t], name + "_fp32", to=TensorProto.FLOAT)
        g.nodes.append(onnx.helper.make_node("Identity", [t], [name], name="n_out_" + name))
        g.add_output(name, shape, elem)

    layout = {}
    if heads in ("raw", "raw+boxes"):
        for layer in head_layers or [ctx.net.output_layer]:
            name = f"{layer.kind}_{layer.index}" if head_layers else "output"
            output(name, ctx.tensors[layer.index][0], [b, *layer.out_shape])
            layout[name] = f"layer {layer.index} [{layer.kind}] output (batch, {', '.join(map(str, layer.out_shape))})"
    if heads in ("boxes", "raw+boxes"):
        boxes, scores = all_boxes(ctx, head_layers)
        n = sum(_candidates(layer) for layer in head_layers)
        output("boxes", boxes, [b, n, 4])
        output("scores", scores, [b, n, head_layers[-1].classes])
        layout["boxes"] = "x1, y1, x2, y2 relative to the network input"
        layout["scores"] = "objectness x class probability"
        if nms:
            output("selected_indices", add_nms(g, "boxes", "scores"), ["selected", 3], TensorProto.INT64)
            layout["selected_indices"] = "(batch, class, candidate) rows kept by NonMaxSuppression"
    for i in layers:
        layer = ctx.net.layers[i]
        output(f"layer{i}", ctx.tensors[i][0], [b, *layer.out_shape])
        layout[f"layer{i}"] = f"layer {i} [{layer.kind}] output (batch, {', '.join(map(str, layer.out_shape))})"
    return layout


def _metadata(net, layout: dict, heads: str, letterbox: bool, fold: bool, fp16: bool, names) -> dict:
    from .. import __version__
    meta = {
        "darkpy_version": __version__,
        "cfg": os.path.basename(str(net.file)),
        "cfg_sha256": cfg_sha256(net),
        "input_shape": json.dumps(list(net.input_shape)),
        "input_width": str(net.width), "input_height": str(net.height),
        "input_range": "0..1, RGB, CHW",
        "letterbox": "1" if letterbox else "0",
        "heads": heads,
        "outputs": json.dumps(layout),
        "batch_norm": "folded" if fold else "kept",
        "dtype": "float16" if fp16 else "float32",
    }
    if names:
        meta["class_names"] = json.dumps(list(names))
    return meta


def _candidates(layer) -> int:
    if layer.kind == "detection":
        return layer.side * layer.side * layer.n
    _, h, w = layer.out_shape
    return layer.n * h * w


def __getattr__(name):      # OnnxEngine lazily (it imports onnxruntime)
    if name == "OnnxEngine":
        from .engine import OnnxEngine
        return OnnxEngine
    raise AttributeError(name)
