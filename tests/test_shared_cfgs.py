"""Every shipped cfg builds with Darknet's shapes, or fails with one located line (issue #2, item 4).

For each cfg in ../shared/cfg/{pjreddie,alexeyab}: darkpy builds its layers (no buffers, no weight
init, so the cfg's full input size costs nothing) and every layer's output shape is compared with
`darknet_shapes`, an independent re-derivation of Darknet's shape rules (spec §1.3, §2) that also
checks each detection head gets the number of values it needs. Every cfg builds (issue 13) except
the two that are broken as shipped (KNOWN_BAD), which fail with one located line saying why.
YOLO9000's data/9k.tree and data/coco9k.map (in Darknet's repository, not in ../shared) are
generated stand-ins of the right size.

Shapes are also checked against numbers Darknet printed itself: yolov3-tiny's layer table (spec §13)
and the shapes.txt of every forward golden in ../shared/golden.
"""
from __future__ import annotations

import re
import warnings

import pytest

from conftest import shared_path
from darkpy.cfg import load_cfg
from darkpy.errors import CfgError
from darkpy.network import build_layers, load_network

REPOS = ("pjreddie", "alexeyab")

#: The only shipped cfgs darkpy rejects: each is broken as shipped (every other one must build).
KNOWN_BAD = {
    # mask=16..19 with num=16: the fork reads anchors past the end of its array
    "alexeyab/cspx-p7-mish.cfg": r":2583 \[section #374 yolo\] mask: mask value 16 is not an anchor index",
    # a missing comma in `anchors` ("61,45    61,45" reads as 4561): 31 values for num=16
    "alexeyab/cspx-p7-mish_hp.cfg": r":2351 \[section #346 yolo\] anchors: needs 2\*num = 32 values",
}


def shared_names() -> list[str]:
    try:
        root = shared_path("cfg")
    except BaseException:
        return ["missing"]
    return [f"{repo}/{p.name}" for repo in REPOS for p in sorted((root / repo).glob("*.cfg"))]


# -- Darknet's shape rules, re-derived from the spec (independent of darkpy's layers) ---------------

def _i(opts: dict, key: str, default: int) -> int:
    return int(float(opts[key])) if key in opts else default


def _refs(opts: dict, key: str, index: int) -> list[int]:
    return [int(v) + index if int(v) < 0 else int(v) for v in opts[key].split(",") if v]


def darknet_shapes(doc) -> list[tuple | None]:
    """Darknet's output shape of every layer: (c, h, w) for an image, (n,) for a flat vector, None
    where this re-derivation does not model the section (the check stops there). Raises
    AssertionError where a detection head would not get the values it needs."""
    net = doc.net.as_dict()
    if "inputs" in net and not all(k in net for k in ("width", "height", "channels")):
        shape: tuple = (int(net["inputs"]),)
    else:
        shape = (int(net["channels"]), int(net["height"]), int(net["width"]))
    out: list[tuple | None] = []

    def numel(s):
        n = 1
        for d in s:
            n *= d
        return n

    for sec in doc.layers:
        o, i, kind = sec.as_dict(), sec.index, sec.kind
        if shape is None:
            out.append(None)
            continue
        img = len(shape) == 3
        if kind in ("convolutional", "conv"):
            c, h, w = shape
            size, stride = _i(o, "size", 1), _i(o, "stride", 1)
            sy, sx = _i(o, "stride_y", stride), _i(o, "stride_x", stride)
            pad = size // 2 if _i(o, "pad", 0) else _i(o, "padding", 0)
            new = (_i(o, "filters", 1), (h + 2 * pad - size) // sy + 1, (w + 2 * pad - size) // sx + 1)
        elif kind in ("maxpool", "max", "local_avgpool", "local_avg"):
            c, h, w = shape
            stride = _i(o, "stride", 1)
            sy, sx = _i(o, "stride_y", stride), _i(o, "stride_x", stride)
            size = _i(o, "size", stride)
            padding = _i(o, "padding", size - 1)
            new = (c, (h + padding - size) // sy + 1, (w + padding - size) // sx + 1)
        elif kind in ("avgpool", "avg"):
            new = (shape[0], 1, 1)
        elif kind in ("connected", "conn"):
            new = (_i(o, "output", 1), 1, 1)            # darknet: a 1x1xN image
        elif kind in ("route",):
            groups, srcs = _i(o, "groups", 1), [out[j] for j in _refs(o, "layers", i)]
            if any(s is None for s in srcs):
                new = None
            elif all(len(s) == 3 and s[1:] == srcs[0][1:] for s in srcs):
                new = (sum(s[0] for s in srcs) // groups, *srcs[0][1:])
            else:
                new = (sum(numel(s) for s in srcs) // groups,)
        elif kind in ("shortcut", "sam", "dropout", "batchnorm", "activation", "normalization", "lrn",
                      "l2norm", "empty", "silence", "contrastive", "shift_channels", "control_channels"):
            new = shape
        elif kind in ("implicit", "implicit_add", "implicit_mul"):
            new = (_i(o, "filters", 128), _i(o, "atoms", 1), 1)
        elif kind == "scale_channels":
            new = out[_refs(o, "from", i)[0]]
        elif kind in ("softmax", "soft", "cost", "logistic"):
            new = (numel(shape),)
        elif kind == "upsample":
            c, h, w = shape
            s = _i(o, "stride", 2)
            new = (c, h * s, w * s) if s > 0 else (c, h // -s, w // -s)
        elif kind in ("reorg", "reorg3d"):
            c, h, w = shape
            s = _i(o, "stride", 1)
            if _i(o, "extra", 0):
                new = (numel(shape) + _i(o, "extra", 0),)
            elif _i(o, "reverse", 0):
                new = (c // (s * s), h * s, w * s)
            else:
                new = (c * s * s, h // s, w // s)
        elif kind in ("rnn", "gru", "lstm"):
            new = (_i(o, "output", 1),)
        elif kind == "crnn":           # upstream: output_filters, fixed 3x3/1 pad 1; fork: output, size, pad
            c, h, w = shape
            size, stride = _i(o, "size", 3), _i(o, "stride", 1)
            pad = size // 2 if _i(o, "pad", 1) else _i(o, "padding", 0)
            filters = _i(o, "output_filters", _i(o, "output", 1))
            new = (filters, (h + 2 * pad - size) // stride + 1, (w + 2 * pad - size) // stride + 1)
        elif kind == "local":
            c, h, w = shape
            size, stride = _i(o, "size", 1), _i(o, "stride", 1)
            k = 1 if _i(o, "pad", 0) else size
            new = (_i(o, "filters", 1), (h - k) // stride + 1, (w - k) // stride + 1)
        elif kind in ("deconvolutional", "deconv"):
            c, h, w = shape
            size, stride = _i(o, "size", 1), _i(o, "stride", 1)
            pad = size // 2 if _i(o, "pad", 0) else _i(o, "padding", 0)
            new = (_i(o, "filters", 1), (h - 1) * stride + size - 2 * pad, (w - 1) * stride + size - 2 * pad)
        elif kind == "crop":
            new = (shape[0], _i(o, "crop_height", 1), _i(o, "crop_width", 1))
        elif kind == "yolo":
            num = _i(o, "num", 1)
            mask = [int(v) for v in o["mask"].split(",") if v] if "mask" in o else list(range(num))
            need = len(mask) * (_i(o, "classes", 20) + 5)
            assert img and shape[0] == need, f"layer {i} [yolo] needs {need} channels, gets {shape}"
            new = shape
        elif kind == "region":
            need = _i(o, "num", 1) * (_i(o, "coords", 4) + 1 + _i(o, "classes", 20))
            assert img and shape[0] == need, f"layer {i} [region] needs {need} channels, gets {shape}"
            new = shape
        elif kind == "detection":
            side = _i(o, "side", 7)
            need = side * side * ((1 + _i(o, "coords", 1)) * _i(o, "num", 1) + _i(o, "classes", 1))
            assert numel(shape) == need, f"layer {i} [detection] needs {need} inputs, gets {numel(shape)}"
            new = (need,)
        elif kind in ("rnn", "gru", "lstm"):
            new = (_i(o, "output", 1),)
        elif kind == "crnn":
            c, h, w = shape if img else (numel(shape), 1, 1)
            if "output" in o or "hidden" in o:          # AlexeyAB's keys: same-size convolutions
                new = (_i(o, "output", 1), h, w)
            else:                                       # pjreddie passes (w, h) swapped
                new = (_i(o, "output_filters", 1), w, h)
        elif kind == "local":
            c, h, w = shape
            size, stride, pad = _i(o, "size", 1), _i(o, "stride", 1), _i(o, "pad", 0)
            k = 1 if pad else size
            new = (_i(o, "filters", 1), (h - k) // stride + 1, (w - k) // stride + 1)
        elif kind in ("deconvolutional", "deconv"):
            c, h, w = shape
            size, stride = _i(o, "size", 1), _i(o, "stride", 1)
            pad = size // 2 if _i(o, "pad", 0) else _i(o, "padding", 0)
            new = (_i(o, "filters", 1), (h - 1) * stride + size - 2 * pad, (w - 1) * stride + size - 2 * pad)
        else:
            new = None
        out.append(new)
        shape = new
    return out


def _same(darkpy_shape: tuple, expected: tuple) -> bool:
    """Images compare exactly; where either side is flat (Darknet's 0x0x0 layers, darkpy's flat
    connected/softmax/...) only the number of values must agree."""
    n = 1
    for d in darkpy_shape:
        n *= d
    m = 1
    for d in expected:
        m *= d
    if len(darkpy_shape) == 3 and len(expected) == 3 and expected[1:] != (1, 1):
        return tuple(darkpy_shape) == tuple(expected)
    return n == m


# -- the shared cfgs ---------------------------------------------------------------------------------

def _stand_in_data_files(path, folder) -> None:
    """Files the cfg names that ship with Darknet's repository, not with ../shared (YOLO9000's
    data/9k.tree and data/coco9k.map), generated in `folder` (the test's current directory) with
    the sizes the cfg needs: a tree of one root and its 9417 children, a map of 80 COCO classes."""
    text = path.read_text()
    if "tree=" not in text.replace(" ", ""):
        return
    n = 9418
    (folder / "data").mkdir(exist_ok=True)
    (folder / "data" / "9k.tree").write_text("root -1\n" + "".join(f"n{i} 0\n" for i in range(1, n)))
    (folder / "data" / "coco9k.map").write_text("".join(f"{i * 100}\n" for i in range(80)))   # 80 COCO ids


@pytest.mark.parametrize("name", shared_names())
def test_shared_cfg_builds_with_darknet_shapes_or_names_what_is_unsupported(name, tmp_path, monkeypatch):
    if name == "missing":
        shared_path("cfg")
    path = shared_path("cfg", *name.split("/"))
    _stand_in_data_files(path, tmp_path)
    monkeypatch.chdir(tmp_path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            doc = load_cfg(path)
            _, layers = build_layers(doc)
    except CfgError as e:
        msg = str(e)
        assert "\n" not in msg and msg.startswith(f"{path}:"), msg
        if name in KNOWN_BAD:
            assert re.search(KNOWN_BAD[name], msg), msg
            return
        pytest.fail(f"{name} does not build (every shared cfg but KNOWN_BAD must): {msg}")
    assert name not in KNOWN_BAD, f"{name} builds now: remove it from KNOWN_BAD"
    expected = darknet_shapes(doc)
    checked = 0
    for layer, exp in zip(layers, expected):
        if exp is None:
            break
        assert _same(layer.out_shape, exp), \
            f"{name}: layer {layer.index} [{layer.kind}] has shape {layer.out_shape}, darknet's is {exp}"
        checked += 1
    assert checked == len(layers), f"{name}: shapes re-derived for only {checked}/{len(layers)} layers"


# -- shapes Darknet printed itself ---------------------------------------------------------------

# pjreddie Darknet's own summary of cfg/yolov3-tiny.cfg at 416x416 (spec §13): (c, h, w) per layer
YOLOV3_TINY = [
    (16, 416, 416), (16, 208, 208), (32, 208, 208), (32, 104, 104), (64, 104, 104), (64, 52, 52),
    (128, 52, 52), (128, 26, 26), (256, 26, 26), (256, 13, 13), (512, 13, 13), (512, 13, 13),
    (1024, 13, 13), (256, 13, 13), (512, 13, 13), (255, 13, 13), (255, 13, 13), (256, 13, 13),
    (128, 13, 13), (128, 26, 26), (384, 26, 26), (256, 26, 26), (255, 26, 26), (255, 26, 26),
]


@pytest.mark.parametrize("repo", REPOS)
def test_yolov3_tiny_matches_darknets_printed_table(repo):
    net = load_network(shared_path("cfg", repo, "yolov3-tiny.cfg"), batch=1)
    assert [layer.out_shape for layer in net.layers] == YOLOV3_TINY
    assert [layer.kind for layer in net.layers][16:18] == ["yolo", "route"]
    # resizing to 608 gives Darknet's 19x19 and 38x38 heads
    net.resize(608, 608)
    assert net.layers[16].out_shape == (255, 19, 19) and net.layers[23].out_shape == (255, 38, 38)


def golden_names() -> list[str]:
    try:
        root = shared_path("golden", "forward")
    except BaseException:
        return ["missing"]
    return sorted(p.name for p in root.iterdir() if (p / "shapes.txt").exists())


@pytest.mark.parametrize("name", golden_names())
def test_golden_networks_have_darknets_shapes(name):
    if name == "missing":
        shared_path("golden")
    d = shared_path("golden", "forward", name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, layers = build_layers(load_cfg(d / "net.cfg"))
    except CfgError as e:
        assert "not supported by darkpy" in str(e), str(e)
        pytest.skip(str(e))
    rows = [line.split() for line in (d / "shapes.txt").read_text().splitlines() if line.strip()]
    assert len(rows) == len(layers)
    for layer, (idx, kind, w, h, c, outputs) in zip(layers, rows):
        w, h, c, outputs = int(w), int(h), int(c), int(outputs)
        assert layer.outputs == outputs, f"{name}: layer {idx} [{kind}] {layer.out_shape} vs darknet's {outputs} values"
        if w and h and c and len(layer.out_shape) == 3:
            assert layer.out_shape == (c, h, w), f"{name}: layer {idx} [{kind}] {layer.out_shape} vs ({c}, {h}, {w})"
