"""`[yolo]`: the YOLOv3/v4 detection head (spec §2.21, §8.3), with the fork's cheap extras.

Layout per item, anchor a of the `mask`: planes `[x, y, w, h, obj, cls_0 .. cls_{C-1}]`, each `h×w`,
so entry e of anchor a at cell `loc` is at `a·(5+C)·hw + e·hw + loc`.

Forward: copy the input, logistic on x, y, obj and the classes (w, h stay raw); the fork's
`scale_x_y = s` maps x, y to `s·σ - (s-1)/2`; `new_coords=1` applies no activation (the conv before
has it) and decodes sizes as `(2·out)²·anchor`.

Training (truth given): Darknet's rules, in order, per image:
1. every slot (cell, anchor): obj delta `obj_normalizer·(0 - obj)`, zeroed when the slot's predicted
   box overlaps some truth by more than `ignore_thresh`; a slot overlapping a truth by more than
   `truth_thresh` (default 1: never) becomes a positive for it;
2. every truth box (the list ends at the first x == 0, at most `max`): the anchor among ALL `num`
   anchors with the best shape-only IoU; if it is in this head's mask, the slot at the truth's cell
   gets box, objectness (target 1) and class (one-hot) deltas. The fork's `iou_thresh < 1` makes every
   other masked anchor with shape IoU above it a positive too.
Box deltas, `iou_loss=mse` (Darknet's): `s·(t - p)·iou_normalizer` with `s = 2 - w·h`, targets
`tx = x·lw - i`, `tw = log(w·net_w/anchor_w)` (x, y in the activated space, w, h raw). Other
`iou_loss` kinds use the exact derivative of Q = IoU/GIoU/DIoU/CIoU (see kernels/boxes.py) in the
fork's box-space convention: `δx = n·∂Q/∂bx`, `δw = 2n·∂Q/∂bw·e^{tw}` (n = iou_normalizer).
Class delta: `cls_normalizer·(t - p)` for every class; when a second truth lands on the same slot
(its class-0 delta is already non-zero) only its own class entry is set, to `1 - p` (Darknet).

The fork's loss options:
- `focal_loss=1`: at a positive slot every class delta is `(t - p)·α·g` with α = 0.5 and
  `g = -(1 - pt)(2·pt·ln pt + pt - 1)`, pt the truth class's probability, so the truth class's delta
  is the negative gradient of α·FL, FL = -(1 - pt)²·ln pt, with respect to its logit: easy (confident)
  positives get far smaller deltas than with cross-entropy.
- `counters_per_class=n0,n1,..`: class weight `max(n)/n_c` (capped at max_delta) multiplies the box
  deltas (through iou_normalizer), the objectness delta and the truth class's own class delta of
  every positive of class c.
- `iou_thresh=t < 1`: every masked anchor whose shape IoU with the truth is above t is a positive
  too; box deltas of several truths on one slot then add up and are divided by the number of
  positive class deltas there (the fork's averages_yolo_deltas).
- `iou_thresh_kind=iou|giou|diou|ciou`: the measure compared with `iou_thresh` (the best anchor is
  still chosen by plain IoU), of the anchor and the truth both centred at 0 (the fork's
  box_iou_kind on shapes): GIoU = IoU - (C - U)/C with C the larger width times the larger height,
  so it is below IoU whenever neither box contains the other; DIoU equals IoU (the centres coincide);
  CIoU = IoU - alpha·v penalises a different aspect ratio (v = 4/pi²·(atan(w/h) - atan(wt/ht))²,
  alpha = v/(1 - IoU + v)). So giou and ciou select the same anchors or fewer than iou.
- `objectness_smooth=1`: a slot whose best IoU passes ignore_thresh gets the objectness target IoU
  instead of no delta (the fork keeps the larger of the deltas towards 0 and towards the IoU); a
  truth_thresh positive gets IoU² for objectness and its class; an anchor positive keeps any
  objectness delta already set
  (darknet: including the first pass's "no object" delta, so a poorly predicted positive trains
  towards 0).
- `max_delta`: every IoU-kind box delta is clipped to ±max_delta; `new_coords=1` (above).

Deltas are negative gradients of: binary cross-entropy on x, y (targets tx, ty), obj and each class,
and ½·s·(t - z)² on w, h — no sigmoid derivative is applied in backward because the cross-entropy
gradient with respect to the logit already is `σ - t`. `cost = Σ δ²` (what Darknet reports).

Not copied from Darknet: a class id outside 0..classes-1, a box centre outside [0, 1] or a
non-positive size is skipped and counted (`stats["bad_truths"]`) instead of writing out of bounds; a
truth at x == 1 or y == 1 uses the last cell (`# darknet:` it indexes one past the grid).
"""
from __future__ import annotations

import math

import numpy as np
from numba import prange

from ..errors import StateError
from ..kernels import PARALLEL_MIN, jit, pjit
from ..kernels import vecmath as vm
from ..kernels.boxes import IOU, IOU_KINDS
from .base import Layer, State, register
from .yolo_delta import (_ANYOBJ, _BAD, _CAT, _COUNT, _IOU, _OBJ, _R50, _R75,  # noqa: F401 (shared)
                         _class_delta, _truth_cell, _valid_truth, shape_quality, yolo_delta)

MSE = -1

#: fork keys darkpy reads but does not implement: a non-default value is warned about
_IGNORED_KEYS = {"delta_normalizer": "1", "track_history_size": None, "sim_thresh": None,
                 "dets_for_track": None, "dets_for_show": None, "track_ciou_norm": None,
                 "embedding_layer": None, "show_details": None}


@jit
def _logistic(x):
    return 1.0 / (1.0 + math.exp(-x))


@jit(inline="always")
def _logistic_plane(o, x, scale, shift, fast):
    """o[k] = logistic(x[k])·scale + shift over a plane. `fast` (a float32 head): e^(−|x|) by
    `vecmath.exp_neg`'s polynomial and no branch, so the loop vectorises (libm's exp is a call a
    value: shapes-tiny's two heads at b64 895 -> 390 µs a step); else libm's, as `_logistic`."""
    if not fast:
        for k in range(o.shape[0]):
            o[k] = _logistic(x[k]) * scale + shift
        return
    for k in range(o.shape[0]):
        v = 1.0 * x[k]
        e = vm.exp_neg(abs(v), True)
        o[k] = (1.0 if v >= 0 else e) / (1.0 + e) * scale + shift


@jit(inline="always")
def _activate_plane(o, x, e, scale_xy, shift, new_coords, fast):
    """o, x: (hw,) the plane of entry e (0..4+classes) of one anchor: see `yolo_activate`."""
    if new_coords or (e == 2 or e == 3):
        if e < 2:
            for k in range(o.shape[0]):
                o[k] = x[k] * scale_xy + shift
        else:
            for k in range(o.shape[0]):
                o[k] = x[k]
    elif e < 2:
        _logistic_plane(o, x, scale_xy, shift, fast)
    else:
        _logistic_plane(o, x, 1.0, 0.0, fast)


@jit(inline="always")
def _activate_row(out, x, r, n, entries, hw, scale_xy, new_coords, fast):
    """Plane r = (b·n + a)·entries + e of `yolo_activate`."""
    b = r // (n * entries)
    lo = (r % (n * entries)) * hw
    _activate_plane(out[b, lo:lo + hw], x[b, lo:lo + hw], r % entries, scale_xy,
                    -0.5 * (scale_xy - 1.0), new_coords, fast)


@pjit(error_model="numpy")
def yolo_activate(out, x, n, entries, hw, scale_xy, new_coords):
    """out = the head's activations of x (see module doc). Parallel over the (item, anchor, entry)
    planes, serial below PARALLEL_MIN values. IEEE division (numba's Python error model checks
    each divisor for zero, a branch that kept the logistic's loop from vectorising: 5.5 against
    0.93 ns a value on one core; 1 + e^(−|x|) is never zero, the values are the same)."""
    # out, x: (batch, n*entries*hw)
    rows = x.shape[0] * n * entries
    fast = out.itemsize == 4
    if x.size < PARALLEL_MIN:
        for r in range(rows):
            _activate_row(out, x, r, n, entries, hw, scale_xy, new_coords, fast)
    else:
        for r in prange(rows):
            _activate_row(out, x, r, n, entries, hw, scale_xy, new_coords, fast)


def _same(value: str, default: str) -> bool:
    try:
        return float(value) == float(default)
    except ValueError:
        return value == default


def read_head_anchors(sec) -> tuple[int, list[int], list[float]]:
    """A yolo-style head's `classes`, `mask` and `anchors` (the first 2·num values), checked:
    classes and num >= 1, every mask value an anchor index, 2·num anchor sizes, all > 0."""
    classes = sec.get_int("classes", 20)
    total = sec.get_int("num", 1)
    if classes < 1 or total < 1:
        raise sec.error(f"classes and num must be >= 1 (got classes={classes}, num={total})",
                        "classes" if classes < 1 else "num")
    mask = sec.get_int_list("mask", list(range(total)))
    for m in mask:
        if not 0 <= m < total:
            raise sec.error(f"mask value {m} is not an anchor index 0..{total - 1} (num={total})", "mask")
    anchors = sec.get_float_list("anchors", [0.5] * (2 * total))
    if len(anchors) < 2 * total:
        raise sec.error(f"needs 2*num = {2 * total} values (w,h per anchor), got {len(anchors)}", "anchors")
    anchors = anchors[:2 * total]
    if any(v <= 0 for v in anchors):
        raise sec.error("anchor sizes must be > 0", "anchors")
    return classes, mask, anchors


def read_class_map(sec, classes: int) -> np.ndarray | None:
    """The section's `map=` file, if any: one int per line, line i is the class id that truth class
    i trains; each must be a class of this head (checked here, with the section's location)."""
    path = sec.get_str("map", None)
    if not path:
        return None
    try:
        with open(path) as f:
            values = [int(line) for line in f if line.strip()]
    except OSError as e:
        raise sec.error(f"cannot read the class map file {path!r} ({e.strerror})", "map") from None
    except ValueError:
        raise sec.error(f"{path!r} must hold one integer per line", "map") from None
    cmap = np.asarray(values, np.int64)
    if cmap.size < 1 or cmap.min() < 0 or cmap.max() >= classes:
        raise sec.error(f"{path!r}: needs >= 1 ids, each in 0..{classes - 1}", "map")
    # a shorter map (YOLO9000's coco9k.map: 80 ids for 9418 classes) maps the rest to themselves
    # (darknet: reads past its end)
    return np.concatenate([cmap, np.arange(cmap.size, classes, dtype=np.int64)]) if cmap.size < classes else cmap


def class_multipliers(counts, classes: int, max_delta: float, sec=None) -> np.ndarray:
    """The fork's counters_per_class weights: max(count) / count per class (counts below 1 count as
    1), capped at max_delta."""
    if len(counts) != classes:
        msg = f"has {len(counts)} values for classes={classes}"
        raise sec.error(msg, "counters_per_class") if sec is not None else ValueError(msg)
    c = np.maximum(np.asarray(counts, np.float64), 1.0)
    return np.minimum(c.max() / c, max_delta)


def letterbox_correct(boxes: np.ndarray, img_w: int, img_h: int, net_w: int, net_h: int,
                      letterbox: bool = True) -> None:
    """Map net-relative boxes (N, 4) to image-relative ones, in place (Darknet's correct_yolo_boxes).

    With `letterbox` the image was scaled to fit the net keeping its aspect ratio (new sizes use
    integer division, as Darknet) and centred; without it the image was stretched (no change)."""
    if not letterbox:
        return
    if net_w / img_w < net_h / img_h:
        new_w, new_h = net_w, (img_h * net_w) // img_w
    else:
        new_w, new_h = (img_w * net_h) // img_h, net_h
    boxes[:, 0] = (boxes[:, 0] - (net_w - new_w) / 2.0 / net_w) / (new_w / net_w)
    boxes[:, 1] = (boxes[:, 1] - (net_h - new_h) / 2.0 / net_h) / (new_h / net_h)
    boxes[:, 2] *= net_w / new_w
    boxes[:, 3] *= net_h / new_h


def truth_boxes(layer: Layer, truth: np.ndarray) -> int:
    """How many [x,y,w,h,class] rows the heads may read from `truth` (batch, values): `max`, checked."""
    if truth.ndim != 2 or truth.shape[0] != layer.batch or truth.shape[1] < 5 * layer.max_boxes:
        raise StateError(f"layer {layer.index} [{layer.kind}] needs truth of shape (batch, {5 * layer.max_boxes}) "
                         f"(max={layer.max_boxes} boxes of x,y,w,h,class); got {truth.shape}")
    return layer.max_boxes


class BoxHead:
    """What the box heads ([yolo], [Gaussian_yolo], [region], [detection]) share: each image's truth
    is `max_boxes` rows of (x, y, w, h, class), and boxes are decoded against the network's input
    size at this forward (a multi-scale resize changes it; `net_wh` when run alone)."""

    @property
    def truths(self) -> int:
        return self.max_boxes * 5

    def _net_size(self, s: State) -> tuple[int, int]:
        net = s.net
        if net is not None and getattr(net, "width", 0):
            return net.width, net.height
        return self.net_wh


@register
class YoloLayer(BoxHead, Layer):
    """The YOLOv3 head. See the module docstring for forward, loss and the fork keys."""

    kind = "yolo"
    has_cost = True
    needs_image = True
    is_detection_head = True
    letterbox_boxes = True      # detect.py maps its boxes back through the letterbox (correct_yolo_boxes)

    def __init__(self, index, in_shape, *, classes, mask, biases, max_boxes=90, net_wh=(0, 0), dtype=np.float32):
        super().__init__(index, in_shape, in_shape, dtype)
        self.classes = classes
        self.mask = np.asarray(mask, np.int64)
        self.n = len(mask)
        self.total = len(biases) // 2
        self.biases = np.asarray(biases, np.float64)
        self.max_boxes = max_boxes
        self.net_wh = net_wh
        self.jitter = 0.2
        self.ignore_thresh = 0.5
        self.truth_thresh = 1.0
        self.random = 0.0
        self.class_map = np.arange(classes, dtype=np.int64)
        self.scale_x_y = 1.0
        self.iou_loss = MSE
        self.iou_normalizer = 1.0
        self.obj_normalizer = 1.0
        self.cls_normalizer = 1.0
        self.label_smooth_eps = 0.0
        self.max_delta = math.inf
        self.iou_thresh = 1.0
        self.iou_thresh_kind = IOU
        self.new_coords = False
        self.focal_loss = False
        self.objectness_smooth = False
        self.class_mult = np.ones(classes, np.float64)     # counters_per_class weights
        self.nms_kind = "default"
        self.beta_nms = 0.6
        self.resize_factor = 1.0
        self.stats: dict[str, float] = {}
        self._stats = np.zeros(8, np.float64)

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_cfg(cls, sec, in_shape, ctx):
        classes, mask, anchors = read_head_anchors(sec)
        c, h, w = in_shape
        need = len(mask) * (classes + 5)
        if c != need:
            raise sec.error(f"the layer before must output len(mask)*(classes+5) = {len(mask)}*({classes}+5)"
                            f" = {need} channels (set filters={need} in the last [convolutional]); it has {c}")
        layer = cls(sec.index, in_shape, classes=classes, mask=mask, biases=anchors,
                    max_boxes=sec.get_int("max", 90), net_wh=(ctx.net.width, ctx.net.height), dtype=ctx.dtype)
        if layer.max_boxes < 1:
            raise sec.error(f"must be >= 1 (got {layer.max_boxes})", "max")
        layer.jitter = sec.get_float("jitter", 0.2)
        layer.ignore_thresh = sec.get_float("ignore_thresh", 0.5)
        layer.truth_thresh = sec.get_float("truth_thresh", 1.0)
        layer.random = sec.get_float("random", 0.0)
        cmap = read_class_map(sec, classes)
        if cmap is not None:
            layer.class_map = cmap
        layer.scale_x_y = sec.get_float("scale_x_y", 1.0)
        kind = sec.get_choice("iou_loss", ("mse", *IOU_KINDS), "mse")
        layer.iou_loss = MSE if kind == "mse" else IOU_KINDS[kind]
        # darknet: the fork's default iou_normalizer is 0.75; darkpy keeps pjreddie's unscaled loss
        layer.iou_normalizer = sec.get_float("iou_normalizer", 1.0)
        layer.obj_normalizer = sec.get_float("obj_normalizer", 1.0)
        layer.cls_normalizer = sec.get_float("cls_normalizer", 1.0)
        layer.label_smooth_eps = sec.get_float("label_smooth_eps", 0.0)
        layer.max_delta = sec.get_float("max_delta", math.inf)
        layer.iou_thresh = sec.get_float("iou_thresh", 1.0)
        layer.iou_thresh_kind = IOU_KINDS[sec.get_choice("iou_thresh_kind", tuple(IOU_KINDS), "iou")]
        layer.new_coords = sec.get_bool("new_coords", False)
        layer.focal_loss = sec.get_bool("focal_loss", False)
        layer.objectness_smooth = sec.get_bool("objectness_smooth", False)
        counts = sec.get_int_list("counters_per_class", None)
        if counts is not None:
            layer.class_mult = class_multipliers(counts, classes, layer.max_delta, sec)
        layer.nms_kind = sec.get_choice("nms_kind", ("default", "greedynms", "diounms", "cornersnms"), "default")
        layer.beta_nms = sec.get_float("beta_nms", 0.6)
        layer.resize_factor = sec.get_float("resize", 1.0)
        for key, default in _IGNORED_KEYS.items():
            value = sec.get_str(key, None)
            if value is not None and default is not None and not _same(value, default):
                sec.warn(f"not implemented by darkpy (value {value!r}); it is ignored", key)
        return layer

    @property
    def entries(self) -> int:
        return self.classes + 5

    def summary(self) -> str:
        return "yolo"

    # -- compute -----------------------------------------------------------------------------------
    def forward(self, s: State) -> None:
        c, h, w = self.out_shape
        hw = h * w
        x = s.input.reshape(self.batch, -1)
        out = self.output.reshape(self.batch, -1)
        yolo_activate(out, x, self.n, self.entries, hw, self.scale_x_y, self.new_coords)
        self.delta.fill(0)
        if s.truth is None:
            self.cost = None
            return
        self.allocate_training()         # delta and loss: sized by the first forward with truth
        net_w, net_h = self._net_size(s)
        self._stats.fill(0)
        yolo_delta(self.delta.reshape(self.batch, -1), self._stats, out, s.truth, self.biases,
                   self.mask, self.class_map, w, h, net_w, net_h, self.classes, truth_boxes(self, s.truth),
                   self.ignore_thresh, self.truth_thresh, self.iou_loss, self.iou_normalizer,
                   self.obj_normalizer, self.cls_normalizer, self.label_smooth_eps, self.max_delta,
                   self.iou_thresh, self.new_coords, self.focal_loss, self.class_mult, self.objectness_smooth,
                   self.iou_thresh_kind)
        np.square(self.delta, out=self.loss)
        self.cost = float(self.loss.sum())
        self._set_stats(self.batch * self.n * hw)

    def _set_stats(self, slots: int) -> None:
        st = self._stats
        count = max(st[_COUNT], 1.0)
        self.stats = {"avg_iou": st[_IOU] / count, "class": st[_CAT] / count, "obj": st[_OBJ] / count,
                      "no_obj": st[_ANYOBJ] / max(slots, 1), "recall50": st[_R50] / count,
                      "recall75": st[_R75] / count, "count": int(st[_COUNT]), "bad_truths": int(st[_BAD])}

    def stats_line(self) -> str:
        """Darknet's per-head training line (`Region <i> Avg IOU: ...`)."""
        st = self.stats
        return (f"Region {self.index} Avg IOU: {st['avg_iou']:f}, Class: {st['class']:f}, Obj: {st['obj']:f}, "
                f"No Obj: {st['no_obj']:f}, .5R: {st['recall50']:f}, .75R: {st['recall75']:f},  "
                f"count: {st['count']}")

    def backward(self, s: State) -> None:
        if s.delta is not None:
            s.delta += self.delta.reshape(s.delta.shape)

    # -- decoding ----------------------------------------------------------------------------------
    def get_detections(self, b: int, thresh: float, net_w: int, net_h: int):
        """Boxes of item `b` whose objectness is above `thresh`, relative to the net input.

        Returns (boxes (N, 4) x,y,w,h; objectness (N,); probs (N, classes)) in Darknet's order (cell-major,
        then anchor); `probs = obj·p_class`, zeroed where not above `thresh`."""
        c, h, w = self.out_shape
        out = self.output[b].reshape(self.n, self.entries, h, w).astype(np.float64)
        obj = out[:, 4]                                          # (n, h, w)
        keep = np.argwhere(obj.transpose(1, 2, 0) > thresh)      # (row, col, anchor), cell-major
        rows, cols, anch = keep[:, 0], keep[:, 1], keep[:, 2]
        tx, ty = out[anch, 0, rows, cols], out[anch, 1, rows, cols]
        tw, th = out[anch, 2, rows, cols], out[anch, 3, rows, cols]
        aw, ah = self.biases[2 * self.mask[anch]], self.biases[2 * self.mask[anch] + 1]
        if self.new_coords:
            bw, bh = tw * tw * 4 * aw / net_w, th * th * 4 * ah / net_h
        else:
            bw, bh = np.exp(tw) * aw / net_w, np.exp(th) * ah / net_h
        boxes = np.stack([(cols + tx) / w, (rows + ty) / h, bw, bh], axis=1)
        objectness = obj[anch, rows, cols]
        probs = objectness[:, None] * out[anch, 5:, rows, cols]
        probs[probs <= thresh] = 0
        return boxes, objectness, probs
