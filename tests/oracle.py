"""OpenCV's Darknet importer as an oracle for whole-network forward passes (issue #2, item 2).

For one shared cfg: darkpy builds it at batch 1 (at a reduced input size when the cfg's own is large),
fills every layer with random but well-scaled parameters and writes a `.weights` file; darkpy reads
that file back and OpenCV 4.x (`cv2.dnn.readNetFromDarknet`, OpenCV backend, CPU, Winograd and fusion
off) reads it too; both run the same random input. Relative error is max|darkpy - opencv| / max|opencv|.

- Per layer ("local"): each layer runs on OpenCV's outputs of the layers it reads and must agree to
  TOLERANCE (1e-4; in practice ~1e-6). This judges darkpy's layers, wiring and weight layout without
  float32 rounding being amplified on the way.
- End to end: the network output must agree to TOLERANCE, or, in deep random nets where float32
  rounding grows past it, to NOISE_FACTOR x the rounding noise measured with darkpy in float64.
- yolo/region heads are compared as decoded boxes, the form OpenCV outputs.
- Layers OpenCV reads differently from Darknet (softmax temperature, new_coords, ...) are left out and
  named (`opencv_limitations`).

The oracle cfg is the shipped text with Darknet's implicit defaults written out where OpenCV's
importer assumes something else: `activation=logistic` on conv/connected without one, maxpool
`stride`/`size`, upsample and reorg `stride`, yolo `mask`; yolo/region score thresholds and yolo
NMS are set to 0 (OpenCV-only keys). Repeated keys in a section are commented out after the first
(Darknet uses the first; so does darkpy, with a warning). OpenCV's batch norm uses eps 1e-6 where
Darknet and darkpy use 1e-5: OpenCV gets a copy of the file with the variances raised by the
difference (`write_opencv_weights`).

Random parameters are data-dependent so that activations stay O(1) through hundreds of layers
(otherwise deep nets overflow, or every output saturates and the comparison proves little): layer by
layer, each conv/connected layer's random weights get one scale giving a unit-RMS response to the
actual input, each filter is re-centred by its bias (or BN rolling mean), and BN gets variances in
[0.5, 2], scales in [0.5, 1.5], biases in [-0.1, 0.1].

`python -m tests.oracle --write` runs every shared cfg and writes tests/data/opencv_parity.tsv
(cfg, status, input size, BFLOPs, worst per-layer and output relative errors, reason);
tests/test_opencv_parity.py re-runs every `pass` row and re-checks every `skip` reason.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import math
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DARKPY_SHARED", ROOT.parent / "shared")).resolve()
TABLE = ROOT / "tests" / "data" / "opencv_parity.tsv"
TABLE_FIELDS = ("cfg", "status", "size", "bflops", "layer_rel_err", "output_rel_err", "reason")
REPOS = ("pjreddie", "alexeyab")          # upstream Darknet, AlexeyAB's fork

TOLERANCE = 1e-4
OPENCV_BN_EPS_SHIFT = 1e-5 - 1e-6   # see write_opencv_weights()
#: End to end, float32 rounding is amplified layer after layer (each layer alone agrees to ~1e-6):
#: deep nets may differ by more than TOLERANCE at the output, but not by more than this many times
#: the float32 rounding noise there (darkpy's or OpenCV's difference from darkpy run in float64).
NOISE_FACTOR = 10.0
MAX_BFLOPS = 3.0          # at the reduced size; larger nets are skipped with this reason
KEEP_OWN_SIZE_UP_TO = 128
SIZES = (64, 96, 128, 192, 256)   # tried in order when the cfg's own size is larger (all multiples of 32)

#: Darknet's default activation where it is not OpenCV's (OpenCV's importer assumes linear).
DARKNET_ACTIVATION_DEFAULT = {"convolutional": "logistic", "conv": "logistic",
                              "connected": "logistic", "conn": "logistic"}
#: Activations OpenCV 4.x's importer maps (measured: tests/test_opencv_parity.py checks this list).
OPENCV_ACTIVATIONS = ("linear", "leaky", "relu", "logistic", "mish", "swish", "tanh")
#: OpenCV layer-name prefixes that are a layer's activation, not a darknet layer of their own.
_OPENCV_ACTIVATION_NAMES = set(OPENCV_ACTIVATIONS) - {"linear"}
#: Layers whose OpenCV blob is not their output (decoded boxes; [cost] is an identity in OpenCV):
#: the per-layer comparison never copies such a blob into darkpy's buffer.
_NOT_ELEMENTWISE = {"yolo", "region", "cost"}


class OracleSkip(Exception):
    """This cfg cannot be compared; the message is the reason recorded in the table."""


# -- cfg text ------------------------------------------------------------------------------------

def shared_cfgs() -> list[str]:
    """Every shared cfg as 'repo/name.cfg', sorted."""
    out = []
    for repo in REPOS:
        d = SHARED / "cfg" / repo
        out += sorted(f"{repo}/{p.name}" for p in d.glob("*.cfg"))
    return out


def darknet_text(path: Path) -> str:
    """The file's text with later repeats of a key in one section commented out (Darknet: first wins)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    seen: set[str] = set()
    for i, raw in enumerate(lines):
        body = re.sub(r"\s+", "", raw.split("#", 1)[0].split(";", 1)[0])
        if body.startswith("["):
            seen = set()
        elif "=" in body:
            key = body.split("=", 1)[0]
            if key in seen:
                lines[i] = "# repeated key, darknet uses the first: " + raw.lstrip("#;")
            seen.add(key)
    return "".join(lines)


def _explicit_defaults(doc) -> None:
    """Write Darknet's defaults where OpenCV's importer would assume different ones."""
    for sec in doc.layers:
        i, kind = sec.index, sec.kind
        if kind in DARKNET_ACTIVATION_DEFAULT and not sec.has("activation"):
            doc.set(f"{i}.activation", DARKNET_ACTIVATION_DEFAULT[kind])
        if kind in ("maxpool", "max"):
            stride = doc.get(f"{i}.stride") or "1"
            if not sec.has("stride"):
                doc.set(f"{i}.stride", stride)
            if not sec.has("size"):
                doc.set(f"{i}.size", stride)
        if kind == "upsample" and not sec.has("stride"):
            doc.set(f"{i}.stride", "2")
        if kind == "reorg" and not sec.has("stride"):
            doc.set(f"{i}.stride", "1")
        if kind == "yolo":
            if not sec.has("mask"):
                num = int(doc.get(f"{i}.num") or 1)
                doc.set(f"{i}.mask", ",".join(str(k) for k in range(num)))
            doc.set(f"{i}.thresh", "0")            # OpenCV-only keys: no score cut-off, no NMS
            doc.set(f"{i}.nms_threshold", "0")
        if kind == "region":
            doc.set(f"{i}.thresh", "0")     # OpenCV's class-score cut-off; darknet reads it in training only


#: Layer keys that only matter for training: cfgs differing only in these are one network here.
TRAINING_ONLY_KEYS = frozenset("""
stopbackward dontload dontsave dontloadscales learning_rate onlyforward train_only_bn dont_update
burnin_update smooth probability jitter ignore_thresh truth_thresh random iou_loss iou_normalizer
cls_normalizer obj_normalizer delta_normalizer iou_thresh iou_thresh_kind nms_kind beta_nms max_delta
counters_per_class label_smooth_eps objectness_smooth resize focal_loss max rescore object_scale
noobject_scale class_scale coord_scale bias_match absolute thresh beta1 uc_normalizer
""".split())


def network_key(name: str) -> tuple:
    """Equal keys = the same network for the oracle: the same layer sections and inference options,
    and the same input (or both large enough to be reduced to the same size)."""
    from darkpy.cfg import parse_cfg
    doc = parse_cfg(darknet_text(SHARED / "cfg" / name), name)
    net = doc.net.as_dict()
    w, h = int(net.get("width", 0)), int(net.get("height", 0))
    size = (w, h) if max(w, h) <= KEEP_OWN_SIZE_UP_TO else "reduced"
    return (size, net.get("channels"), net.get("inputs"),
            tuple((s.kind, tuple(sorted((k, v) for k, v in s.as_dict().items() if k not in TRAINING_ONLY_KEYS)))
                  for s in doc.layers))


@contextlib.contextmanager
def _no_random_init():
    """darkpy's random initialisation is wasted work here: every parameter is overwritten."""
    import darkpy.network as network
    saved = network.init_weights
    network.init_weights = lambda net, rng: None
    try:
        yield
    finally:
        network.init_weights = saved


@dataclass
class Prepared:
    name: str
    text: str                      # the oracle cfg both darkpy and OpenCV read
    size: tuple[int, int]          # (width, height) used
    bflops: float
    net: object = None             # darkpy Network built from `text` (batch 1)


def _build(text: str, file: str):
    from darkpy.cfg import parse_cfg
    from darkpy.network import load_network
    with warnings.catch_warnings(), _no_random_init():
        warnings.simplefilter("ignore")
        return load_network(parse_cfg(text, file), batch=1)


def stand_in_file(kind: str, n: int) -> str:
    """A generated stand-in for a data file a cfg names that ../shared lacks (YOLO9000's 9k.tree
    and coco9k.map): `tree`, one root and its n-1 children (one group: the plain softmax OpenCV
    computes), or `map`, the identity map of n classes. Returns its absolute path."""
    folder = Path(tempfile.gettempdir()) / "darkpy-oracle-stand-ins"
    folder.mkdir(exist_ok=True)
    p = folder / f"{n}.{kind}"
    if not p.exists():
        text = ("root -1\n" + "".join(f"n{i} 0\n" for i in range(1, n)) if kind == "tree"
                else "".join(f"{i}\n" for i in range(n)))
        tmp = p.with_name(f"{p.name}.{os.getpid()}.tmp")     # whole or absent: test workers share it
        tmp.write_text(text)
        os.replace(tmp, p)
    return str(p)


def _stand_ins(doc) -> None:
    """Point every `tree=` / `map=` at a generated stand-in (OpenCV ignores both keys)."""
    for sec in doc.layers:
        n = int(sec.options["classes"].value) if "classes" in sec.options else 9418
        for key in ("tree", "map"):
            if key in sec.options:
                doc.set(f"{sec.index}.{key}", stand_in_file(key, n))


def prepare(name: str, max_bflops: float = MAX_BFLOPS) -> Prepared:
    """Oracle cfg text for shared cfg `name`, at the first size darkpy builds within `max_bflops`
    (or, if none is, the first it builds); raises OracleSkip when darkpy cannot build it at all."""
    from darkpy.cfg import parse_cfg
    from darkpy.errors import CfgError, DarkpyError
    path = SHARED / "cfg" / name
    doc = parse_cfg(darknet_text(path), str(path))
    _stand_ins(doc)
    for key, value in (("batch", "1"), ("subdivisions", "1")):
        doc.set(f"net.{key}", value)
    _explicit_defaults(doc)
    w = int(doc.get("net.width") or 0)
    h = int(doc.get("net.height") or 0)
    if not (w and h):
        raise OracleSkip("flat network input (`inputs=`): OpenCV's importer needs width/height/channels")
    with tempfile.TemporaryDirectory() as tmp:      # can OpenCV read the cfg at all? (cheap)
        (Path(tmp) / "oracle.cfg").write_text(doc.text(), encoding="utf-8")
        opencv_net(Path(tmp) / "oracle.cfg")
    if max(w, h) <= KEEP_OWN_SIZE_UP_TO:      # its own size, then smaller ones if it is too costly
        sizes = [(w // k, h // k) for k in (1, 2, 3, 4) if min(w, h) // k >= 4]
    else:                                     # reduced sizes, then its own (e.g. a [crop] needs it)
        sizes = [(s, s) for s in SIZES] + [(w, h)]
    first, last_error = None, None
    for sw, sh in sizes:
        doc.set("net.width", str(sw))
        doc.set("net.height", str(sh))
        try:
            net = _build(doc.text(), str(path))
        except CfgError as e:
            if "not supported by darkpy" in str(e):
                raise OracleSkip(f"darkpy: {e.message}") from None
            last_error = e
            continue
        except DarkpyError as e:
            raise OracleSkip(f"darkpy: {e}") from None
        prep = Prepared(name, doc.text(), (sw, sh), sum(layer.flops() for layer in net.layers) / 1e9, net)
        if prep.bflops <= max_bflops:
            return prep
        first = first or prep
        if max(w, h) > KEEP_OWN_SIZE_UP_TO:     # ascending sizes: a larger one costs more
            break
    if first is not None:
        return first
    raise OracleSkip(f"darkpy cannot build it at any size tried: {last_error}")


# -- random but well-scaled parameters --------------------------------------------------------------

def _int(sec, key: str, default: int) -> int:
    v = sec.options.get(key)
    return int(float(v.value)) if v is not None else default


def _conv_response(layer, x: np.ndarray, w: np.ndarray, rng, samples: int = 16) -> np.ndarray:
    """(P, n) responses of filters `w` (n, c/g, k, k) at up to `samples` random output positions of
    input `x` (c, h, w) — enough to set each filter's scale; geometry from the layer's cfg section."""
    sec = layer.section
    k = w.shape[2]
    _, oh, ow = layer.out_shape
    sy = _int(sec, "stride_y", _int(sec, "stride", 1))
    sx = _int(sec, "stride_x", _int(sec, "stride", 1))
    dil = _int(sec, "dilation", 1)
    pad = (k // 2 if _int(sec, "pad", 0) else _int(sec, "padding", 0)) * dil
    groups = _int(sec, "groups", 1)
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    pos = rng.choice(oh * ow, size=min(samples, oh * ow), replace=False)
    oy, ox = pos // ow, pos % ow
    rows = oy[:, None] * sy + np.arange(k)[None, :] * dil                  # (P, k)
    cols = ox[:, None] * sx + np.arange(k)[None, :] * dil
    patches = xp[:, rows[:, :, None], cols[:, None, :]]                   # (c, P, k, k)
    patches = patches.reshape(groups, -1, len(pos), k * k).transpose(0, 1, 3, 2)   # (g, c/g, k*k, P)
    patches = np.ascontiguousarray(patches.reshape(groups, -1, len(pos)))         # (g, K, P)
    n = w.shape[0]
    wg = w.reshape(groups, n // groups, -1)                                        # (g, n/g, K)
    z = np.concatenate([wg[g] @ patches[g] for g in range(groups)])               # (n, P)
    return z.T.astype(np.float64)


def _fill_normalised(arrays, z_fn, n: int, rng, bn_first: bool) -> None:
    """Shared by conv and connected: random weights scaled to a unit RMS response, each filter centred."""
    if bn_first:     # conv file order: biases, [scales, mean, var], weights
        biases, bn, weights = arrays[0], arrays[1:-1], arrays[-1]
    else:            # connected: biases, weights, [scales, mean, var]
        biases, weights, bn = arrays[0], arrays[1], arrays[2:]
    rng.random(dtype=weights.dtype, out=weights)        # uniform, centred below: fast, zero mean
    weights -= weights.dtype.type(0.5)
    z = z_fn(weights)                                                     # (P, n) float64
    # One scale for the whole layer (a per-filter one would amplify whatever a filter barely sees in
    # this input, and with it rounding noise); per-filter centring only shifts, it adds no gain.
    rms = math.sqrt(float((z ** 2).mean())) or 1.0
    mean = z.mean(axis=0) / rms if z.shape[0] >= 4 else np.zeros(n)
    weights *= weights.dtype.type(1.0 / rms)
    jitter = rng.uniform(-0.1, 0.1, n)
    if bn:
        scales, rolling_mean, rolling_var = bn
        scales[...] = rng.uniform(0.5, 1.5, n)
        rolling_mean[...] = mean + jitter
        rolling_var[...] = rng.uniform(0.5, 2.0, n)
        biases[...] = rng.uniform(-0.1, 0.1, n)
    else:
        biases[...] = -mean + jitter


def bn_variance(layer) -> np.ndarray | None:
    """The rolling-variance array of a conv/connected layer with batch_normalize=1, else None."""
    if layer.kind in ("convolutional", "connected") and _int(layer.section, "batch_normalize", 0):
        arrays = layer.weight_arrays()
        return arrays[3] if layer.kind == "convolutional" else arrays[4]
    return None


def _randomize_layer(layer, x: np.ndarray, rng) -> None:
    arrays = layer.weight_arrays()
    if not arrays:
        return
    kind = layer.kind
    if kind == "convolutional":
        img = x.reshape(layer.in_shape)
        _fill_normalised(arrays, lambda w: _conv_response(layer, img, w, rng), arrays[0].size, rng,
                         bn_first=True)
    elif kind == "connected":
        flat = x.reshape(1, -1)
        _fill_normalised(arrays, lambda w: (flat @ w.T).astype(np.float64), arrays[0].size, rng,
                         bn_first=False)
    else:
        raise OracleSkip(f"no random-parameter recipe for [{kind}] layers in the oracle")


def randomize(net, x: np.ndarray, seed: int = 0) -> None:
    """Give every parameterised layer of `net` random, well-scaled values (see the module docstring),
    running the forward pass layer by layer on `x` (1, *input_shape) to measure each layer's input."""
    from darkpy.layers.base import State
    rng = np.random.default_rng(seed)
    np.copyto(net.input, x.reshape(net.input.shape))
    s = State(input=net.input, delta=None, truth=None, train=False, layers=net.layers, seen=0,
              rng=np.random.default_rng(seed), net=net)
    for layer in net.layers:
        _randomize_layer(layer, s.input, rng)     # the values a loaded file would leave in memory
        layer.forward(s)
        s.input = layer.output


# -- OpenCV ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet_stderr():
    """OpenCV's importer prints to the C-level stderr; keep test output readable."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, io.UnsupportedOperation):
        yield
        return
    saved = os.dup(fd)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)


def opencv_net(cfg: Path, weights: Path | None = None):
    import cv2
    try:
        with _quiet_stderr():
            net = cv2.dnn.readNetFromDarknet(str(cfg), *([str(weights)] if weights else []))
    except cv2.error as e:
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        msg = lines[-1] if lines else str(e)
        msg = re.sub(r"^OpenCV\([^)]*\)\s*\S+:\d+:\s*", "", msg)
        msg = re.sub(r"\s*in function '[^']*'$", "", msg)
        raise OracleSkip(f"OpenCV cannot load it: {msg}") from None
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
    net.enableWinograd(False)
    # no fusion: fused layers (conv+BN+activation, and inputs written straight into a concat's
    # buffer) leave the outputs of the fused-away layers stale, and every layer's output is compared
    net.enableFusion(False)
    return net


def opencv_layer_map(names, n_layers: int) -> dict[int, str]:
    """darknet layer index -> the OpenCV layer holding its final output.

    OpenCV names each darknet layer `<op>_<index>` (`conv_3`, `bn_3`, `permute_7`, `yolo_7`, ...) and
    appends its activation as a separate layer named after the NEXT index (`leaky_4`), so an
    activation belongs to the layer before it; `detection_out` (region) has no index.
    """
    out: dict[int, str] = {}
    current = -1
    for name in names:
        prefix, _, num = name.rpartition("_")
        if prefix and num.isdigit() and prefix not in _OPENCV_ACTIVATION_NAMES:
            current = int(num)
        if current >= 0:
            out[current] = name
    if sorted(out) != list(range(n_layers)):
        raise AssertionError(f"cannot map OpenCV layers {list(names)[:8]}... onto {n_layers} darknet layers")
    return out


# -- yolo / region decoding (what OpenCV's Region layer outputs) -----------------------------------

def _float_list(sec, key):
    v = sec.options.get(key)
    return [float(t) for t in v.value.split(",") if t] if v is not None else []


def decode_yolo(layer, net_w: int, net_h: int) -> np.ndarray:
    """darkpy [yolo] output (anchors, 5+classes, h, w) -> OpenCV's rows (h, w, anchor) x
    [x, y, w, h, obj, obj*class...] (relative to the image)."""
    sec = layer.section
    out = layer.output[0].reshape(-1, layer.out_shape[-2] * layer.out_shape[-1])
    c, h, w = layer.out_shape
    mask = [int(m) for m in _float_list(sec, "mask")]
    anchors = _float_list(sec, "anchors")
    na = len(mask)
    e = c // na
    o = out.reshape(na, e, h, w).astype(np.float64)
    res = np.zeros((h, w, na, e))
    gx = np.arange(w)[None, None, :]
    gy = np.arange(h)[None, :, None]
    aw = np.array([anchors[2 * m] for m in mask])[:, None, None]
    ah = np.array([anchors[2 * m + 1] for m in mask])[:, None, None]
    bx = (gx + o[:, 0]) / w
    by = (gy + o[:, 1]) / h
    bw = np.exp(o[:, 2]) * aw / net_w
    bh = np.exp(o[:, 3]) * ah / net_h
    obj = o[:, 4]
    for k, v in enumerate((bx, by, bw, bh, obj)):
        res[..., k] = v.transpose(1, 2, 0)
    res[..., 5:] = (o[:, 5:] * obj[:, None]).transpose(2, 3, 0, 1)
    return res.reshape(h * w * na, e)


def decode_region(layer) -> np.ndarray:
    """darkpy [region] output (num, coords+1+classes, h, w) -> OpenCV's rows (h, w, anchor) x
    [x, y, w, h, obj, obj*class...] with anchors in grid cells."""
    sec = layer.section
    c, h, w = layer.out_shape
    na = _int(sec, "num", 1)
    e = c // na
    anchors = _float_list(sec, "anchors")
    o = layer.output[0].reshape(na, e, h, w).astype(np.float64)
    res = np.zeros((h, w, na, e))
    gx = np.arange(w)[None, None, :]
    gy = np.arange(h)[None, :, None]
    aw = np.array(anchors[0::2][:na])[:, None, None]
    ah = np.array(anchors[1::2][:na])[:, None, None]
    vals = ((gx + o[:, 0]) / w, (gy + o[:, 1]) / h, np.exp(o[:, 2]) * aw / w, np.exp(o[:, 3]) * ah / h, o[:, 4])
    for k, v in enumerate(vals):
        res[..., k] = v.transpose(1, 2, 0)
    res[..., 5:] = (o[:, 5:] * o[:, 4][:, None]).transpose(2, 3, 0, 1)
    return res.reshape(h * w * na, e)


# -- static reasons why OpenCV's numbers cannot match ---------------------------------------------

def opencv_limitations(net) -> dict[int, str]:
    """Layers OpenCV's importer reads differently from Darknet: index -> why. Their outputs are not
    compared (the layers after them still are, each fed OpenCV's own inputs)."""
    out: dict[int, str] = {}

    def note(layer, why):
        out[layer.index] = f"layer {layer.index} [{layer.kind}]: {why}"

    for layer in net.layers:
        sec = layer.section
        if layer.kind == "connected" and _int(sec, "batch_normalize", 0):
            note(layer, "OpenCV reads [connected] batch-norm arrays before the weights (Darknet writes them after)")
        if layer.kind == "convolutional":
            if _int(sec, "xnor", 0) or _int(sec, "binary", 0):
                note(layer, "OpenCV ignores xnor/binary (a plain convolution)")
            if _int(sec, "dilation", 1) != 1:
                note(layer, f"OpenCV ignores dilation={sec.options['dilation'].value}")
            stride = _int(sec, "stride", 1)
            if _int(sec, "stride_x", stride) != stride or _int(sec, "stride_y", stride) != stride:
                note(layer, "OpenCV ignores stride_x/stride_y")
        if layer.kind == "softmax" and sec.has("tree"):
            note(layer, "OpenCV ignores tree= (one softmax over every class)")
        if layer.kind == "region" and sec.has("tree"):
            note(layer, "OpenCV's region layer refuses tree= ('Yolo9000 is not implemented')")
        if layer.kind == "softmax":
            if sec.has("temperature") and float(sec.options["temperature"].value) != 1:
                note(layer, f"OpenCV ignores softmax temperature={sec.options['temperature'].value}")
            if len(layer.in_shape) == 3 and layer.in_shape[1] * layer.in_shape[2] > 1:
                note(layer, f"OpenCV's softmax runs per pixel over channels, Darknet's over the whole flat "
                            f"{layer.inputs}-vector")
        if layer.kind == "maxpool" and any(sec.has(k) for k in ("maxpool_depth", "stride_x", "stride_y")):
            note(layer, "OpenCV ignores maxpool_depth/stride_x/stride_y")
        if layer.kind == "yolo" and _int(sec, "new_coords", 0):
            note(layer, "OpenCV ignores new_coords=1 when decoding")
        if layer.kind == "shortcut":
            for j in getattr(layer, "refs", ()):
                src = net.layers[j]     # a channel mismatch is fine (OpenCV truncates/pads like Darknet)
                if src.out_shape[1:] != layer.out_shape[1:]:
                    note(layer, f"OpenCV cannot add layer {j}'s {src.out_shape} output to {layer.out_shape}")
            if sec.has("weights_type") and sec.options["weights_type"].value != "none":
                note(layer, "OpenCV ignores weights_type")
        if layer.kind == "reorg" and any(_int(sec, k, 0) for k in ("extra", "flatten", "reverse")):
            note(layer, "OpenCV ignores reorg extra/flatten/reverse")
        if layer.kind == "upsample" and sec.has("scale") and float(sec.options["scale"].value) != 1.0:
            note(layer, "OpenCV ignores upsample scale")
    return out


# -- the comparison --------------------------------------------------------------------------------

def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max|a-b| / max|b| (b the reference); inf on a shape mismatch or a non-finite value."""
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return math.inf
    scale = np.abs(b).max() if b.size else 0.0
    diff = np.abs(a - b).max() if a.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


@dataclass
class Result:
    name: str
    size: tuple[int, int]
    bflops: float
    local: dict[str, float]           # "layer 12 [convolutional]" -> rel. error, layer fed OpenCV's inputs
    end_to_end: dict[str, float]      # the same, every layer fed darkpy's own outputs
    final: float                      # end-to-end error of the network output (inf: not comparable)
    noise: float | None               # float32 rounding noise at the output: the larger of darkpy's and
                                      # OpenCV's difference from darkpy in float64 (when final > TOL)
    limitations: dict[int, str]       # layers not compared, and why
    seconds: float

    @property
    def worst_local(self) -> tuple[str, float]:
        k = max(self.local, key=self.local.get)
        return k, self.local[k]

    @property
    def final_ok(self) -> bool:
        """The output agrees to TOLERANCE, or to NOISE_FACTOR x darkpy's own float32 rounding noise."""
        if self.limitations:
            return True           # a layer OpenCV reads differently: only the per-layer errors count
        return self.final <= max(TOLERANCE, NOISE_FACTOR * (self.noise or 0.0))

    @property
    def passed(self) -> bool:
        return self.worst_local[1] <= TOLERANCE and self.final_ok


def _opencv_forward(cv, x: np.ndarray, names: list[str], limitations: dict) -> dict[str, np.ndarray]:
    import cv2
    cv.setInput(x)
    try:
        with _quiet_stderr():
            return dict(zip(names, cv.forward(names)))
    except cv2.error as e:
        msg = [ln for ln in str(e).strip().splitlines() if ln.strip()][-1]
        msg = re.sub(r"^OpenCV\([^)]*\)\s*\S+:\d+:\s*", "", msg)
        why = "; ".join(limitations.values()) if limitations else msg.strip()
        raise OracleSkip(f"OpenCV fails to run it: {why}") from None


def layer_err(layer, blob: np.ndarray, size) -> float:
    """Relative error of a darkpy layer's output against OpenCV's blob for it. yolo/region heads are
    decoded to OpenCV's box rows first; for region, OpenCV's importer always runs NMS (it does not
    read nms_threshold there), which zeroes suppressed class scores: those entries are not compared."""
    if layer.kind == "yolo":
        return rel_err(decode_yolo(layer, *size), blob)
    if layer.kind == "region":
        mine = decode_region(layer)
        ref = blob.reshape(mine.shape)
        mine[:, 5:][ref[:, 5:] == 0] = 0
        return rel_err(mine, ref)
    return rel_err(layer.output, blob)


def _layer_errors(dp, blobs: dict, index: dict, size, skip: dict, local: bool) -> dict[str, float]:
    """Relative error of every comparable layer (not in `skip`; a layer whose size differs after one
    in `skip` is added to it). `local`: each layer runs again after every earlier layer's output was
    replaced by OpenCV's, so each is judged on identical inputs."""
    from darkpy.layers.base import State
    s = State(input=dp.input, delta=None, truth=None, train=False, layers=dp.layers, seen=0,
              rng=np.random.default_rng(0), net=dp)
    errors: dict[str, float] = {}
    for layer in dp.layers:
        if local:
            layer.forward(s)
        blob = blobs[index[layer.index]]
        key = f"layer {layer.index} [{layer.kind}]"
        if blob.size != layer.output.size and layer.index not in skip and any(j < layer.index for j in skip):
            skip[layer.index] = (f"{key}: follows a layer OpenCV reads differently, and has "
                                 f"{blob.size} values there, {layer.output.size} in darkpy")
        if layer.index not in skip and layer.kind != "cost":
            errors[key] = layer_err(layer, blob, size)
        if local and layer.kind not in _NOT_ELEMENTWISE and layer.output.size == blob.size:
            layer.output[...] = blob.reshape(layer.output.shape)
        s.input = layer.output
    return errors


def write_opencv_weights(net, darkpy_file: Path, opencv_file: Path) -> None:
    """Copy darkpy's file for OpenCV, every BN rolling variance raised by OPENCV_BN_EPS_SHIFT.

    OpenCV's batch norm divides by sqrt(var + 1e-6); Darknet's (GPU, cuDNN, the fork) and darkpy's by
    sqrt(var + 1e-5). The variances are found in the file by Darknet's layout (spec §7), computed
    here independently of darkpy's writer: header 20 bytes, then per layer its arrays in order.
    """
    shutil.copyfile(darkpy_file, opencv_file)
    pos = 20
    with open(opencv_file, "r+b") as f:
        for layer in net.layers:
            sizes = [a.size for a in layer.weight_arrays()]
            var = bn_variance(layer)
            if var is not None:
                n = var.size
                at = pos + 4 * (3 * n if layer.kind == "convolutional" else n + sizes[1] + 2 * n)
                f.seek(at)
                stored = np.frombuffer(f.read(4 * n), dtype="<f4")
                assert np.array_equal(stored, var), f"layer {layer.index}: not Darknet's layout"
                f.seek(at)
                f.write((stored + np.float32(OPENCV_BN_EPS_SHIFT)).astype("<f4").tobytes())
            pos += 4 * sum(sizes)
        assert pos == f.seek(0, os.SEEK_END), "darkpy's file is not Darknet's layout"


def _param_copies(net) -> list[np.ndarray]:
    return [a.copy() for layer in net.layers for a in layer.weight_arrays()]


def compare(name: str, workdir: Path, seed: int = 0, max_bflops: float = MAX_BFLOPS) -> Result:
    """Run darkpy and OpenCV on shared cfg `name`; raises OracleSkip when they cannot be compared."""
    from darkpy.network import load_network
    t0 = time.perf_counter()
    prep = prepare(name, max_bflops)
    if prep.bflops > max_bflops:
        raise OracleSkip(f"too large for the test budget: {prep.bflops:.1f} BFLOPs at "
                         f"{prep.size[0]}x{prep.size[1]} (limit {max_bflops:g})")
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path, weights_path = workdir / "oracle.cfg", workdir / "oracle.weights"
    cfg_path.write_text(prep.text, encoding="utf-8")
    dp = prep.net
    limitations = opencv_limitations(dp)
    rng = np.random.default_rng(seed)
    x = rng.random((1, *dp.input_shape), dtype=np.float32)
    randomize(dp, x, seed)          # leaves every layer's output of this input in place
    dp.save_weights(weights_path)
    # OpenCV's batch norm divides by sqrt(var + 1e-6), Darknet's (GPU, cuDNN, fork) and darkpy's by
    # sqrt(var + 1e-5): OpenCV gets its own copy of the file with every rolling variance raised by the
    # difference, so both compute the same normalisation.
    cv_weights_path = workdir / "oracle.opencv.weights"
    write_opencv_weights(dp, weights_path, cv_weights_path)
    # darkpy reads its file back into wiped parameters: every value must come back bit for bit
    kept = _param_copies(dp)
    for layer in dp.layers:
        for a in layer.weight_arrays():
            a.fill(np.nan)
    dp.load_weights(weights_path)
    for a, b in zip(_param_copies(dp), kept):
        if not np.array_equal(a, b):
            raise AssertionError(f"{name}: darkpy did not read back the weights it wrote")

    cv = opencv_net(cfg_path, cv_weights_path)
    names = list(cv.getLayerNames())
    index = opencv_layer_map(names, len(dp.layers))
    wanted = sorted(set(index.values()), key=names.index)
    blobs = _opencv_forward(cv, x, wanted, limitations)

    end_to_end = _layer_errors(dp, blobs, index, prep.size, limitations, local=False)
    out = dp.output_layer
    final = next((v for k, v in end_to_end.items() if k.startswith(f"layer {out.index} ")), math.inf)
    local = _layer_errors(dp, blobs, index, prep.size, limitations, local=True)
    noise = None
    if final > TOLERANCE and not limitations:
        # darkpy's own float32 rounding, amplified by this network: float32 output against float64
        with warnings.catch_warnings(), _no_random_init():
            warnings.simplefilter("ignore")
            dp64 = load_network(cfg_path, weights_path, batch=1, dtype=np.float64)
        dp64.forward(x.astype(np.float64))
        dp.forward(x)
        out64 = dp64.output_layer
        exact = (decode_yolo(out64, *prep.size) if out64.kind == "yolo" else
                 decode_region(out64) if out64.kind == "region" else out64.output)
        noise = max(layer_err(out, exact, prep.size), layer_err(out64, blobs[index[out.index]], prep.size))
    return Result(name, prep.size, prep.bflops, local, end_to_end, final, noise, limitations,
                  time.perf_counter() - t0)


def classify(name: str, workdir: Path) -> dict:
    """One table row for `name` (see TABLE_FIELDS)."""
    row = dict.fromkeys(TABLE_FIELDS, "")
    row.update(cfg=name, status="skip")
    try:
        r = compare(name, workdir)
    except OracleSkip as e:
        row["reason"] = str(e)
        return row
    where, worst = r.worst_local
    row.update(size=f"{r.size[0]}x{r.size[1]}", bflops=f"{r.bflops:.3f}", layer_rel_err=f"{worst:.1e}",
               output_rel_err="" if math.isinf(r.final) else f"{r.final:.1e}")
    notes = [f"not compared: {v}" for v in r.limitations.values()]
    if r.noise is not None:
        notes.append(f"output within {NOISE_FACTOR:g}x float32 rounding noise ({r.noise:.1e}: float32 vs "
                     f"darkpy in float64)")
    if r.passed:
        row["status"] = "pass"
    else:
        row["status"] = "fail"
        notes.insert(0, f"unexplained difference: {where} {worst:.1e}" if worst > TOLERANCE else
                     f"unexplained difference at the output: {r.final:.1e}")
    row["reason"] = "; ".join(notes)
    return row


def read_table(path: Path = TABLE) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def write_table(rows: list[dict], path: Path = TABLE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        wr = csv.DictWriter(f, TABLE_FIELDS, delimiter="\t", lineterminator="\n")
        wr.writeheader()
        wr.writerows(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {TABLE.relative_to(ROOT)}")
    ap.add_argument("cfgs", nargs="*", help="shared cfgs to run (repo/name.cfg); default all")
    args = ap.parse_args(argv)
    names = args.cfgs or shared_cfgs()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            t0 = time.perf_counter()
            row = classify(name, Path(tmp) / name.replace("/", "_"))
            rows.append(row)
            print(f"{row['status']:5} {name:50} {row['size']:8} {row['bflops']:>7} {row['layer_rel_err']:>8} "
                  f"{row['output_rel_err']:>8} "
                  f"{time.perf_counter() - t0:6.1f}s  {row['reason']}", flush=True)
    if args.write:
        if args.cfgs:
            old = {r["cfg"]: r for r in read_table()} if TABLE.exists() else {}
            old.update({r["cfg"]: r for r in rows})
            rows = [old[k] for k in sorted(old, key=lambda n: (REPOS.index(n.split("/")[0]), n))]
        write_table(rows)
    counts = {}
    for r in rows:
        counts[(r["cfg"].split("/")[0], r["status"])] = counts.get((r["cfg"].split("/")[0], r["status"]), 0) + 1
    print(counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
