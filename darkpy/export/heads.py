"""The detection heads: `[yolo]`, `[region]`, `[detection]` as darkpy's forward leaves them (raw),
and their decoding into boxes and scores (`--heads boxes`), with ONNX NonMaxSuppression (`--nms`).

Boxes are (x1, y1, x2, y2) relative to the network input (0..1), scores are objectness x class
probability, in the candidate order of each layer's `get_detections` (yolo: cell-major then anchor;
region: anchor-major; detection: cell x box), heads in layer order, so index k of the ONNX output is
candidate k of darkpy's `network_boxes` before any threshold.
"""
from __future__ import annotations

import numpy as np

from ..layers.tree import TreeRegionLayer
from .convert import Ctx, converts
from .graph import Graph
from .ops_misc import tree_softmax


def _sig(g: Graph, x: str) -> str:
    return g.op("Sigmoid", [x], "sigmoid")


def _planes(g: Graph, t: str, lo: int, hi: int) -> str:
    """Entries lo..hi-1 of a (B, n, E, hw) head tensor."""
    return g.slice(t, [lo], [hi], [2])


@converts("yolo")
def yolo(ctx: Ctx, layer):
    g = ctx.g
    c, h, w = layer.out_shape
    e = layer.entries
    t = g.reshape(ctx.x(layer), (-1, layer.n, e, h * w))
    xy, wh, rest = _planes(g, t, 0, 2), _planes(g, t, 2, 4), _planes(g, t, 4, e)
    if not layer.new_coords:            # new_coords: the conv before has the activation
        xy, rest = _sig(g, xy), _sig(g, rest)
    s = layer.scale_x_y
    if s != 1:
        xy = g.add(g.scale(xy, s), g.const(-0.5 * (s - 1)))
    y = g.op("Concat", [xy, wh, rest], axis=2)
    return g.reshape(y, (-1, c, h, w), f"l{layer.index}_yolo"), layer.out_shape


@converts("region", classes=(TreeRegionLayer,))
def region(ctx: Ctx, layer):
    """With tree= (YOLO9000) the class planes get the tree's group-wise softmax instead."""
    g = ctx.g
    c, h, w = layer.out_shape
    e = layer.entries
    t = g.reshape(ctx.x(layer), (-1, layer.n, e, h * w))
    xy, wh, obj, cls = _planes(g, t, 0, 2), _planes(g, t, 2, 4), _planes(g, t, 4, 5), _planes(g, t, 5, e)
    if isinstance(layer, TreeRegionLayer):
        cls = tree_softmax(g, cls, layer, 2)
    else:
        cls = g.op("Softmax", [cls], axis=2) if layer.softmax else _sig(g, cls)
    y = g.op("Concat", [_sig(g, xy), wh, _sig(g, obj), cls], axis=2)
    return g.reshape(y, (-1, c, h, w), f"l{layer.index}_region"), layer.out_shape


@converts("detection")
def detection(ctx: Ctx, layer):
    g = ctx.g
    n = layer.inputs
    cls_n = layer.side * layer.side * layer.classes
    x = ctx.x(layer, (n,))
    if not layer.softmax:
        return x, layer.out_shape
    cls = g.reshape(g.slice(x, [0], [cls_n], [1]), (-1, layer.side * layer.side, layer.classes))
    cls = g.reshape(g.op("Softmax", [cls], axis=2), (-1, cls_n))
    y = g.op("Concat", [cls, g.slice(x, [cls_n], [n], [1])], f"l{layer.index}_detection", axis=1)
    return y, layer.out_shape


# -- decoding -------------------------------------------------------------------------------------------
def _corners(g: Graph, bx, by, bw, bh, axis: int) -> str:
    hw_, hh = g.scale(bw, 0.5), g.scale(bh, 0.5)
    return g.op("Concat", [g.op("Sub", [bx, hw_]), g.op("Sub", [by, hh]), g.add(bx, hw_), g.add(by, hh)],
                "corners", axis=axis)


def _grid_boxes(ctx: Ctx, layer, t: str, aw: np.ndarray, ah: np.ndarray, sizes: str):
    """(B, n, 4, hw) corners and (B, n, C, hw) scores of a yolo/region tensor t (B, n, E, hw)."""
    g = ctx.g
    _, h, w = layer.out_shape
    hw = h * w
    cols = g.const((np.arange(hw) % w).reshape(1, 1, 1, hw))
    rows = g.const((np.arange(hw) // w).reshape(1, 1, 1, hw))
    tx, ty, tw, th = (_planes(g, t, k, k + 1) for k in range(4))
    bx = g.op("Div", [g.add(tx, cols), g.const(float(w))])
    by = g.op("Div", [g.add(ty, rows), g.const(float(h))])
    aw_c, ah_c = g.const(aw.reshape(1, -1, 1, 1)), g.const(ah.reshape(1, -1, 1, 1))
    if sizes == "square":           # yolo new_coords: (2·t)²·anchor = 4·t²·anchor
        bw, bh = g.mul(g.mul(g.mul(tw, tw), g.const(4.0)), aw_c), g.mul(g.mul(g.mul(th, th), g.const(4.0)), ah_c)
    else:
        bw, bh = g.mul(g.op("Exp", [tw]), aw_c), g.mul(g.op("Exp", [th]), ah_c)
    boxes = _corners(g, bx, by, bw, bh, axis=2)
    scores = g.mul(_planes(g, t, 4, 5), _planes(g, t, 5, layer.entries))
    return boxes, scores


def decode(ctx: Ctx, layer) -> tuple[str, str]:
    """(boxes (B, N, 4), scores (B, N, classes)) of one head, from its raw output tensor."""
    g = ctx.g
    name, _ = ctx.src(layer.index)
    net_w, net_h = ctx.net.width, ctx.net.height
    if layer.kind in ("yolo", "region"):
        _, h, w = layer.out_shape
        hw = h * w
        t = g.reshape(name, (-1, layer.n, layer.entries, hw))
        if layer.kind == "yolo":
            anchors = np.asarray(layer.biases, np.float64)[np.stack([2 * layer.mask, 2 * layer.mask + 1], 1)]
            aw, ah = anchors[:, 0] / net_w, anchors[:, 1] / net_h
            boxes, scores = _grid_boxes(ctx, layer, t, aw, ah, "square" if layer.new_coords else "exp")
            perm = [0, 3, 1, 2]         # cell-major, then anchor
        else:
            anchors = np.asarray(layer.biases, np.float64).reshape(-1, 2)[:layer.n]
            boxes, scores = _grid_boxes(ctx, layer, t, anchors[:, 0] / w, anchors[:, 1] / h, "exp")
            perm = [0, 1, 3, 2]         # anchor-major
        boxes = g.reshape(g.op("Transpose", [boxes], perm=perm), (0, -1, 4))
        scores = g.reshape(g.op("Transpose", [scores], perm=perm), (0, -1, layer.classes))
        return boxes, scores
    # [detection]: classes (loc, C), confidences (loc, n), boxes (loc, n, 4)
    side, n, classes = layer.side, layer.n, layer.classes
    loc = side * side
    flat = ctx.view((name, layer.out_shape), (layer.outputs,))
    cls = g.reshape(g.slice(flat, [0], [loc * classes], [1]), (-1, loc, 1, classes))
    conf = g.reshape(g.slice(flat, [loc * classes], [loc * (classes + n)], [1]), (-1, loc, n, 1))
    box = g.reshape(g.slice(flat, [loc * (classes + n)], [layer.outputs], [1]), (-1, loc, n, 4))
    cols = g.const((np.arange(loc) % side).reshape(1, loc, 1, 1))
    rows = g.const((np.arange(loc) // side).reshape(1, loc, 1, 1))
    part = [g.slice(box, [k], [k + 1], [3]) for k in range(4)]
    bx = g.op("Div", [g.add(part[0], cols), g.const(float(side))])
    by = g.op("Div", [g.add(part[1], rows), g.const(float(side))])
    bw, bh = (g.mul(p, p) if layer.sqrt else p for p in part[2:])
    boxes = g.reshape(_corners(g, bx, by, bw, bh, axis=3), (0, -1, 4))
    scores = g.reshape(g.mul(conf, cls), (0, -1, classes))
    return boxes, scores


def all_boxes(ctx: Ctx, head_layers) -> tuple[str, str]:
    parts = [decode(ctx, layer) for layer in head_layers]
    if len(parts) == 1:
        return parts[0]
    g = ctx.g
    return (g.op("Concat", [p[0] for p in parts], axis=1), g.op("Concat", [p[1] for p in parts], axis=1))


def add_nms(g: Graph, boxes: str, scores: str) -> str:
    """ONNX NonMaxSuppression per class; thresholds and the per-class cap are graph inputs.
    Returns selected_indices (K, 3): (batch, class, candidate)."""
    from onnx import TensorProto
    g.add_input("iou_threshold", [], TensorProto.FLOAT)
    g.add_input("score_threshold", [], TensorProto.FLOAT)
    g.add_input("max_output_boxes_per_class", [], TensorProto.INT64)
    per_class = g.op("Transpose", [scores], perm=[0, 2, 1])
    # the box corners are (x1, y1, x2, y2): NMS's IoU is the same for (y1, x1, y2, x2)
    return g.op("NonMaxSuppression", [boxes, per_class, "max_output_boxes_per_class", "iou_threshold",
                                      "score_threshold"], "nms", center_point_box=0)
