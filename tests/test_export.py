"""`darkpy export` / `darkpy.export_onnx` and the onnxruntime engine (issue #10).

- Every shared cfg is listed in tests/data/onnx_export.tsv (tests/export_cases.py writes it): each
  `exported` row is re-run (a representative subset by default, all of them under `slow`): onnx's
  full check, ONNX Runtime loads it, raw heads and decoded boxes equal darkpy's to 1e-4 relative
  (or 10x darkpy's own float32 rounding noise in deep random nets); every other row's reason is
  re-checked.
- Small networks exercise what the shared cfgs do not (every activation, maxpool padding rules,
  shortcut resampling, reorg variants, softmax groups, lrn, ...), each against darkpy's forward;
  hypothesis draws stacks of sections too (`test_drawn_networks_export_equal_to_darkpy`).
- Dynamic batch 1 and 7, fp16, --no-fold, NMS against `darkpy detect`, the CLI and `--engine`,
  `layers=` (named intermediate outputs).
- The README's plain-onnxruntime script: its network input is bit-identical to darkpy's; and, with
  a shapes-tiny trained by `darkpy train` (slow), the --nms export and the script give `darkpy
  detect`'s detections.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import export_cases as ec
from conftest import ROOT, shared_path
from helpers import shapes_generator, short_shapes_tiny
from test_paths_fuzz import HEADS, SECTIONS, draw_network

from darkpy import DarkpyError
from darkpy.cfg import parse_cfg
from darkpy.export import ExportError, export_onnx
from darkpy.kernels.activations import NAMES as ACTIVATIONS
from darkpy.network import load_network

ROWS = {r["cfg"]: r for r in ec.read_table()} if ec.TABLE.exists() else {}
EXPORTED = [n for n, r in ROWS.items() if r["status"] == "exported"]
OTHER = [n for n, r in ROWS.items() if r["status"] != "exported"]
#: one of each family of shared networks, run by default (the rest under `slow`)
FAST = ["pjreddie/yolov3-tiny.cfg", "pjreddie/yolov2-tiny.cfg", "alexeyab/yolov4-tiny-custom.cfg",
        "pjreddie/yolov1-tiny.cfg", "pjreddie/cifar.test.cfg", "pjreddie/go.cfg", "pjreddie/resnet18.cfg",
        "alexeyab/yolov3-tiny_occlusion_track.cfg", "alexeyab/yolov4-csp-s-mish.cfg", "pjreddie/tiny.cfg",
        "pjreddie/rnn.cfg", "pjreddie/gru.cfg", "alexeyab/tiny-yolo_xnor.cfg"]


def _params():
    """One test per distinct network (a fork's copy of an upstream cfg runs once, for both)."""
    groups: dict = {}
    for name in EXPORTED:
        try:
            key = ec.network_key(name)
        except Exception:          # ../shared missing: the test itself skips
            key = name
        groups.setdefault(key, []).append(name)
    out = []
    for names in groups.values():
        name = next((n for n in names if n in FAST), names[0])
        marks = () if name in FAST else (pytest.mark.slow,)
        out.append(pytest.param(name, marks=marks, id=name + (f"+{len(names) - 1}" if len(names) > 1 else "")))
    return out


def test_table_lists_every_shared_cfg_with_a_status():
    shared_path("cfg")
    assert ROWS, f"{ec.TABLE} is missing: run python tests/export_cases.py --write"
    assert sorted(ROWS) == sorted(ec.oracle.shared_cfgs())
    for name, row in ROWS.items():
        assert row["status"] in ("exported", "refused", "not built"), f"{name}: {row}"
        if row["status"] != "exported":
            assert row["reason"], name
    assert set(FAST) <= set(EXPORTED)


@pytest.mark.parametrize("name", _params())
def test_shared_cfg_export_equals_darkpy(name):
    shared_path("cfg")
    case = ec.prepare(name)
    raw, boxes = ec.compare(case)
    if raw > ec.TOLERANCE or (boxes or 0) > ec.TOLERANCE:
        n_raw, n_boxes = ec.noise(case)
        assert ec.within(raw, n_raw) and ec.within(boxes, n_boxes), \
            f"{name}: raw {raw:.1e}, boxes {boxes}; darkpy's own float32 noise {n_raw:.1e}, {n_boxes}"


@pytest.mark.parametrize("name", OTHER)
def test_reason_for_not_exporting_still_holds(name):
    shared_path("cfg")
    reason = ROWS[name]["reason"]
    if ROWS[name]["status"] == "not built":
        with pytest.raises(ec.NotExported) as ei:
            ec.prepare(name)
        assert str(ei.value) == reason
        return
    case = ec.prepare(name)
    with pytest.raises(ExportError) as ei:
        export_onnx(case.net)
    msg = str(ei.value)
    assert "\n" not in msg and msg.endswith(reason) and msg.startswith(str(case.net.file))


# -- small networks for what the shared cfgs do not cover ------------------------------------------------

def _net(text: str, seed: int = 0):
    """The network of `text` (batch 1, or time_steps rows), random parameters, forward done."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = load_network(parse_cfg(text, "t.cfg"))
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (net.batch, *net.input_shape)).astype(np.float32)
    ec.randomize(net, x, seed)
    net.forward(x)
    return net, x


def _run(model, x, **extra):
    onnx.checker.check_model(model, full_check=True)
    return ec.session(model).run(None, {"input": x, **extra})


def _assert_equal_to_darkpy(text: str, tol: float = 1e-5, **kw):
    net, x = _net(text)
    outs = _run(export_onnx(net, **kw), x)
    refs = ec.heads(net) or [net.output_layer]
    for o, layer in zip(outs, refs):
        err = ec.rel_err(o, layer.output)
        assert err <= tol, f"layer {layer.index} [{layer.kind}]: {err:.2e}"
    return net, x, outs


NET = "[net]\nwidth={w}\nheight={h}\nchannels={c}\n"
CONV = "[convolutional]\nfilters={f}\nsize=3\npad=1\nactivation=linear\n"


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_every_activation_on_a_wide_range(act):
    """The activation alone on values in [-6, 6] (a 1x1 identity conv before it)."""
    text = NET.format(w=12, h=10, c=1) + "[convolutional]\nfilters=1\nsize=1\nactivation=linear\n" + \
        f"[activation]\nactivation={act}\n"
    net, _ = _net(text)
    net.layers[0].weights.value[...] = 1
    net.layers[0].biases.value[...] = 0
    x = np.linspace(-6, 6, 120, dtype=np.float32).reshape(1, 1, 10, 12)
    net.forward(x)
    outs = _run(export_onnx(net), x)
    assert ec.rel_err(outs[0], net.output) <= 1e-6, act


SMALL = {
    "maxpool_odd_padding": NET.format(w=9, h=7, c=3) + CONV.format(f=4) +
    "[maxpool]\nsize=3\nstride=2\npadding=3\n",
    "maxpool_size2_stride1": NET.format(w=6, h=6, c=3) + CONV.format(f=4) + "[maxpool]\nsize=2\nstride=1\n",
    "maxpool_big_padding": NET.format(w=6, h=6, c=2) + CONV.format(f=2) + "[maxpool]\nsize=2\nstride=2\npadding=5\n",
    "maxpool_stride_xy": NET.format(w=8, h=8, c=2) + CONV.format(f=3) + "[maxpool]\nsize=2\nstride_x=2\nstride_y=1\n",
    "local_avgpool": NET.format(w=8, h=6, c=2) + CONV.format(f=3) + "[local_avgpool]\nsize=3\nstride=2\n",
    "avgpool_softmax_groups_temperature": NET.format(w=6, h=6, c=3) + CONV.format(f=12) +
    "[avgpool]\n[softmax]\ngroups=3\ntemperature=2.5\n",
    "route_groups": NET.format(w=6, h=6, c=3) + CONV.format(f=8) + CONV.format(f=4) +
    "[route]\nlayers=-1,-2\ngroups=2\ngroup_id=1\n",
    "route_flat": NET.format(w=8, h=8, c=3) + CONV.format(f=4) + "[maxpool]\nsize=2\nstride=2\n" +
    "[route]\nlayers=-1,-2\n[connected]\noutput=5\nactivation=leaky\n",
    "shortcut_larger_from_alpha_beta": NET.format(w=8, h=8, c=3) + CONV.format(f=6) +
    "[convolutional]\nfilters=4\nsize=3\nstride=2\npad=1\nactivation=linear\n" +
    "[shortcut]\nfrom=-2\nalpha=0.5\nbeta=2\nactivation=leaky\n",
    "shortcut_smaller_from": NET.format(w=8, h=8, c=3) +
    "[convolutional]\nfilters=6\nsize=3\nstride=2\npad=1\nactivation=linear\n" +
    "[upsample]\nstride=2\n[convolutional]\nfilters=4\nsize=1\nactivation=linear\n" +
    "[shortcut]\nfrom=-3\nactivation=swish\n",
    "shortcut_many": NET.format(w=6, h=6, c=3) + CONV.format(f=4) + CONV.format(f=4) + CONV.format(f=4) +
    "[shortcut]\nfrom=-2,-3\n",
    "upsample_scale_downsample": NET.format(w=7, h=9, c=2) + CONV.format(f=3) +
    "[upsample]\nstride=2\nscale=0.5\n[upsample]\nstride=-3\n",
    "reorg": NET.format(w=8, h=8, c=8) + CONV.format(f=8) + "[reorg]\nstride=2\n",
    "reorg_reverse": NET.format(w=4, h=4, c=8) + CONV.format(f=8) + "[reorg]\nstride=2\nreverse=1\n",
    "reorg_flatten": NET.format(w=4, h=4, c=3) + CONV.format(f=3) + "[reorg]\nstride=1\nflatten=1\n",
    "reorg_extra": NET.format(w=3, h=3, c=2) + CONV.format(f=2) + "[reorg]\nstride=1\nextra=1\n",
    "reorg3d": NET.format(w=8, h=8, c=2) + CONV.format(f=3) + "[reorg3d]\nstride=2\n",
    "crop_dropout_logistic": NET.format(w=10, h=10, c=3) + "[crop]\ncrop_width=8\ncrop_height=6\n" +
    CONV.format(f=3) + "[dropout]\nprobability=0.5\n[logistic]\n",
    "l2norm_lrn": NET.format(w=5, h=5, c=3) + CONV.format(f=7) + "[l2norm]\n" + CONV.format(f=9) +
    "[lrn]\nsize=5\nalpha=0.3\nbeta=0.75\nkappa=2\n",
    "sam_scale_channels": NET.format(w=6, h=6, c=3) + CONV.format(f=4) + CONV.format(f=4) +
    "[sam]\nfrom=-2\n[avgpool]\n[scale_channels]\nfrom=-2\nactivation=logistic\n",
    "scale_wh": NET.format(w=6, h=6, c=3) + CONV.format(f=4) + CONV.format(f=1) +
    "[scale_channels]\nfrom=-2\nscale_wh=1\n",
    "conv_groups_dilation_strides_bn": NET.format(w=11, h=9, c=4) +
    "[convolutional]\nbatch_normalize=1\nfilters=6\nsize=3\ngroups=2\ndilation=2\npad=1\nstride_x=2\n"
    "stride_y=1\nactivation=mish\n[convolutional]\nfilters=4\nsize=2\npadding=1\nactivation=gelu\n",
    "deconv_local_batchnorm": NET.format(w=6, h=6, c=3) +
    "[deconvolutional]\nbatch_normalize=1\nfilters=4\nsize=4\nstride=2\npad=1\nactivation=leaky\n"
    "[local]\nfilters=3\nsize=3\nstride=2\npad=1\nactivation=relu\n[batchnorm]\n",
    "connected_bn": NET.format(w=4, h=4, c=2) + "[connected]\noutput=7\nbatch_normalize=1\nactivation=selu\n"
    "[connected]\noutput=5\nactivation=tanh\n[softmax]\n",
    "yolo_new_coords_scale_xy": NET.format(w=32, h=32, c=3) + "[convolutional]\nfilters=14\nsize=3\nstride=8\n"
    "pad=1\nactivation=logistic\n[yolo]\nmask=1,0\nanchors=3,4,10,12,20,9\nclasses=2\nnum=3\nnew_coords=1\n"
    "scale_x_y=2.0\n",
    "yolo_scale_xy": NET.format(w=32, h=24, c=3) + "[convolutional]\nfilters=16\nsize=3\nstride=8\npad=1\n"
    "activation=linear\n[yolo]\nmask=2,1\nanchors=3,4,10,12,20,9\nclasses=3\nnum=3\nscale_x_y=1.05\n",
    "region_softmax": NET.format(w=32, h=32, c=3) + "[convolutional]\nfilters=16\nsize=3\nstride=8\npad=1\n"
    "activation=linear\n[region]\nanchors=1,2,3,1\nclasses=3\nnum=2\nsoftmax=1\n",
    "xnor_binary_share": NET.format(w=6, h=6, c=3) +
    "[convolutional]\nfilters=4\nsize=3\npad=1\nbinary=1\nactivation=leaky\n" +
    "[convolutional]\nbatch_normalize=1\nfilters=4\nsize=3\npad=1\nactivation=leaky\n" +
    "[convolutional]\nbatch_normalize=1\nfilters=4\nsize=3\npad=1\nxnor=1\nactivation=linear\n" +
    "[convolutional]\nbatch_normalize=1\nfilters=4\nsize=3\npad=1\nshare_index=1\nactivation=leaky\n",
    "yolor_focus_implicit_shift_control": NET.format(w=8, h=8, c=3) + "[reorg]\n" + CONV.format(f=4) +
    "[implicit_add]\nfilters=4\n[route]\nlayers=-2\n[shift_channels]\nfrom=-2\n"
    "[implicit_mul]\nfilters=4\n[route]\nlayers=-2\n[control_channels]\nfrom=-2\n",
    "implicit_atoms": NET.format(w=4, h=4, c=3) + "[implicit]\nfilters=3\natoms=2\n",
    "rnn_shortcut_bn": "[net]\ninputs=5\ntime_steps=3\n[rnn]\noutput=6\nhidden=4\nbatch_normalize=1\n"
    "shortcut=1\nactivation=leaky\nlogistic=2\n[connected]\noutput=3\nactivation=linear\n[softmax]\n",
    "gru_lstm": "[net]\ninputs=4\ntime_steps=4\n[gru]\noutput=5\ntanh=1\n[gru]\noutput=3\n"
    "batch_normalize=1\n[lstm]\noutput=4\nbatch_normalize=1\n[lstm]\noutput=2\n",
    "crnn_image": NET.format(w=5, h=4, c=2) + "time_steps=3\n[crnn]\noutput_filters=3\nhidden_filters=4\n"
    "activation=leaky\nbatch_normalize=1\n[crnn]\noutput=2\nhidden=3\nsize=3\npad=1\nshortcut=1\n",
    "detection_sqrt_softmax": NET.format(w=16, h=16, c=3) + "[connected]\noutput=52\nactivation=linear\n"
    "[detection]\nclasses=3\ncoords=4\nnum=2\nside=2\nsoftmax=1\nsqrt=1\n",
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_network_equals_darkpy(name):
    net, x, _ = _assert_equal_to_darkpy(SMALL[name])
    if ec.heads(net):
        boxes, scores = _run(export_onnx(net, heads="boxes"), x)
        ref_boxes, ref_scores = ec.darkpy_boxes(net)
        assert ec.rel_err(boxes[0], ref_boxes) <= 1e-5 and ec.rel_err(scores[0], ref_scores) <= 1e-5


def test_xnor_input_binarisation_counts_zero_as_plus_one():
    """xnor=1 binarises x >= 0 to +1: an input of exact zeros (and the zero padding) agrees."""
    net, _ = _net(NET.format(w=5, h=5, c=2) + "[convolutional]\nfilters=3\nsize=3\npad=1\nxnor=1\n")
    x = np.zeros((1, 2, 5, 5), np.float32)
    x[0, 0, ::2] = -0.5
    net.forward(x)
    assert ec.rel_err(_run(export_onnx(net), x)[0], net.output) <= 1e-6


def test_contrastive_exports_its_zero_inference_output():
    net, x = _net(NET.format(w=4, h=4, c=3) + "[convolutional]\nfilters=18\nsize=1\nactivation=linear\n"
                  "[yolo]\nmask=0,1,2\nanchors=1,1,2,2,3,3\nnum=3\nclasses=1\n[route]\nlayers=-2\n"
                  "[contrastive]\nclasses=1\nyolo_layer=-2\n")
    m = export_onnx(net)
    zeros = next(n.output[0] for n in m.graph.node if n.op_type == "ConstantOfShape")
    m.graph.output.append(onnx.helper.make_tensor_value_info(zeros, onnx.TensorProto.FLOAT, ["n", 18, 4, 4]))
    outs = _run(m, x)
    assert outs[-1].shape == (1, 18, 4, 4) and not outs[-1].any() and not net.output.any()


REFUSED_KINDS = {
    "history": "[net]\ntime_steps=3\nwidth=2\nheight=1\nchannels=2\n[history]\nhistory_size=2\n",
    "Gaussian_yolo": "[net]\nwidth=4\nheight=4\nchannels=22\n[Gaussian_yolo]\nmask=0,1\nanchors=1,1,2,3\n"
    "num=2\nclasses=2\n",
    "conv_lstm": "[net]\ntime_steps=3\nwidth=3\nheight=4\nchannels=2\n[conv_lstm]\noutput=3\nsize=3\npad=1\n",
    "embedding": "[net]\ntime_steps=2\ninputs=1\n[embedding]\nvocab=5\nsize=3\n",
    "layernorm": "[net]\ntime_steps=2\ninputs=8\n[layernorm]\n",
    "attention": "[net]\ntime_steps=2\ninputs=8\n[attention]\nheads=2\n",
    "crossentropy": "[net]\ntime_steps=2\ninputs=8\n[crossentropy]\n",
}


@pytest.mark.parametrize("kind", sorted(REFUSED_KINDS))
def test_layer_kinds_without_a_converter_are_refused_in_one_line(kind):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = load_network(parse_cfg(REFUSED_KINDS[kind], "t.cfg"))
    with pytest.raises(ExportError) as ei:
        export_onnx(net)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("t.cfg")
    assert msg.endswith(f"[{kind}] cannot be exported to ONNX by darkpy")


TREE = "animal -1\nplant -1\ndog 0\ncat 0\ntree 1\nterrier 2\npoodle 2\n"     # groups 0-1, 2-3, 4, 5-6


def test_tree_softmax_equals_darkpy(tmp_path):
    (tmp_path / "t.tree").write_text(TREE)
    _assert_equal_to_darkpy(NET.format(w=2, h=2, c=2) + "[connected]\noutput=7\nactivation=linear\n"
                            f"[softmax]\ntree={tmp_path / 't.tree'}\ntemperature=2\n", 1e-6)


def test_region_tree_equals_darkpy(tmp_path):
    (tmp_path / "t.tree").write_text(TREE)
    net, x, _ = _assert_equal_to_darkpy(
        NET.format(w=3, h=3, c=2) + "[convolutional]\nfilters=24\nsize=1\nactivation=linear\n[region]\n"
        f"anchors=1,1,2,2\nnum=2\nclasses=7\ncoords=4\nsoftmax=1\ntree={tmp_path / 't.tree'}\n", 1e-6)
    boxes, scores = _run(export_onnx(net, heads="boxes"), x)
    ref_boxes, ref_scores = ec.darkpy_boxes(net)
    assert ec.rel_err(boxes[0], ref_boxes) <= 1e-5 and ec.rel_err(scores[0], ref_scores) <= 1e-5


def test_unknown_variant_class_of_a_kind_is_refused_in_one_line():
    """A layer class the converter of its kind was not written for is refused, not exported as the kind."""
    from darkpy.layers.convolutional import ConvolutionalLayer
    net, _ = _net(NET.format(w=4, h=4, c=2) + CONV.format(f=2))
    net.layers[0].__class__ = type("OtherConv", (ConvolutionalLayer,), {})
    with pytest.raises(ExportError) as ei:
        export_onnx(net)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("t.cfg") and \
        msg.endswith("[convolutional] as OtherConv cannot be exported to ONNX by darkpy")


def test_no_fold_keeps_batch_normalization_and_agrees():
    text = SMALL["conv_groups_dilation_strides_bn"]
    net, _, _ = _assert_equal_to_darkpy(text, fold=False)
    ops = {n.op_type for n in export_onnx(net, fold=False).graph.node}
    assert "BatchNormalization" in ops
    assert "BatchNormalization" not in {n.op_type for n in export_onnx(net).graph.node}


def test_unexportable_section_is_refused_with_one_located_line():
    text = "[net]\ninputs=4\n[rnn]\noutput=3\n"
    net, _ = _net(text)
    net.layers[0].carry_state = True
    with pytest.raises(ExportError) as ei:
        export_onnx(net)
    assert str(ei.value) == ("t.cfg:3 [section #0 rnn]: carry_state (a state kept between passes) cannot "
                             "be exported")
    with pytest.raises(ExportError, match="--heads boxes needs"):
        export_onnx(_net(NET.format(w=4, h=4, c=1) + CONV.format(f=2))[0], heads="boxes")
    with pytest.raises(ExportError, match="opset"):
        export_onnx(net, opset=7)


# -- batch, fp16, metadata, NMS ----------------------------------------------------------------------------

def _tiny_yolo(size: int = 96):
    shared_path("cfg")
    net = ec.build("pjreddie/yolov3-tiny.cfg", size, size)
    rng = np.random.default_rng(3)
    x = rng.random((7, *net.input_shape), dtype=np.float32)
    ec.randomize(net, x[:1])
    return net, x


def test_dynamic_batch_1_and_7_agree_with_darkpy():
    net, x = _tiny_yolo()
    model = export_onnx(net, dynamic_batch=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    s = ec.session(model)
    seven = s.run(None, {"input": x})
    ones = [s.run(None, {"input": x[i:i + 1]}) for i in range(7)]
    for k, out in enumerate(seven):
        np.testing.assert_allclose(out, np.concatenate([o[k] for o in ones]), rtol=0, atol=1e-5)
    net.set_batch(7)
    net.forward(x)
    for out, layer in zip(seven, ec.heads(net)):
        assert ec.rel_err(out, layer.output) <= 1e-4


def test_fp16_within_1e_2():
    net, x = _tiny_yolo()
    x = x[:1]
    net.forward(x)
    outs = _run(export_onnx(net, fp16=True), x)
    for out, layer in zip(outs, ec.heads(net)):
        assert out.dtype == np.float32
        assert ec.rel_err(out, layer.output) <= 1e-2


def test_metadata(tmp_path):
    net, _ = _tiny_yolo(64)
    path = tmp_path / "m.onnx"
    export_onnx(net, path, names=["a", "b"], opset=17)
    m = onnx.load(path)
    meta = {p.key: p.value for p in m.metadata_props}
    import darkpy
    assert meta["darkpy_version"] == darkpy.__version__ and meta["letterbox"] == "1"
    assert (meta["input_width"], meta["input_height"]) == ("64", "64")
    assert json.loads(meta["class_names"]) == ["a", "b"]
    import hashlib
    assert meta["cfg_sha256"] == hashlib.sha256(Path(net.file).read_bytes()).hexdigest()
    assert m.opset_import[0].version == 17


def _nms_detections(net, img, thresh, nms_thresh, letterbox, model=None):
    """Detections from the --nms export (`model`, default: exported here): {(class, rounded pixel corners)}."""
    from darkpy import detect
    from darkpy.layers.yolo import letterbox_correct
    model = export_onnx(net, nms=True) if model is None else model
    x = detect.prepare_image(img, net, letterbox)[None]
    boxes, scores, sel = _run(model, x, iou_threshold=np.array(nms_thresh, np.float32),
                              score_threshold=np.array(thresh, np.float32),
                              max_output_boxes_per_class=np.array(10000, np.int64))
    h, w = img.shape[1:]
    found = set()
    for b, c, k in sel:
        x1, y1, x2, y2 = boxes[b, k]
        xywh = np.array([[(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]], np.float64)
        letterbox_correct(xywh, w, h, net.width, net.height, letterbox)
        d = detect.Detection(*xywh[0], int(c), float(scores[b, k, c]), 0.0, np.zeros(1))
        found.add((int(c), d.corners(w, h)))
    return found


def _darkpy_detections(net, img, thresh, nms_thresh, letterbox):
    from darkpy import detect
    dets = detect.detect_image(net, img, thresh, nms_thresh, letterbox=letterbox)
    return {(c, d.corners(img.shape[2], img.shape[1])) for d in dets for c, _ in d.classes_above(thresh)}


@pytest.mark.parametrize("letterbox", [False, True])
def test_nms_export_gives_darkpy_detect_boxes_on_dog(letterbox):
    from darkpy import images as im
    net, _ = _tiny_yolo(160)
    img = im.load_image(shared_path("darknet-data", "dog.jpg"), 3)
    net.set_batch(1)
    mine = _darkpy_detections(net, img, 0.3, 0.45, letterbox)
    theirs = _nms_detections(net, img, 0.3, 0.45, letterbox)
    assert mine, "no detection at all: the comparison would prove nothing"
    if letterbox:
        # NMS runs on network-relative boxes in the graph, on image-relative ones in darkpy: the
        # letterbox scales x and y differently, so a pair near the IoU threshold may go either way
        assert len(mine ^ theirs) <= max(1, len(mine) // 20), (mine ^ theirs)
    else:
        assert mine == theirs


def test_nms_export_on_bundled_shapes_tiny(tmp_path):
    """cfg/shapes-tiny.cfg (random, well-scaled weights) on generated shapes images."""
    from darkpy import images as im
    shapes_generator().generate(tmp_path / "shapes", n=3, size=128, seed=1)
    net = load_network(ROOT / "cfg" / "shapes-tiny.cfg", batch=1)
    rng = np.random.default_rng(5)
    x = rng.random((1, *net.input_shape), dtype=np.float32)
    ec.randomize(net, x)
    found = 0
    for p in sorted((tmp_path / "shapes").rglob("*.jpg")):
        img = im.load_image(p, 3)
        mine = _darkpy_detections(net, img, 0.2, 0.45, True)
        assert mine == _nms_detections(net, img, 0.2, 0.45, True), p
        found += len(mine)
    assert found


def test_layer_outputs_add_the_logits_before_the_softmax():
    """`layers=`: named intermediate outputs `layer<i>` after the heads (the benchmark's ONNX Runtime
    contender compares the logits feeding digits' final [softmax], not the saturated softmax)."""
    net = load_network(ROOT / "cfg" / "digits.cfg", batch=3)
    x = np.random.default_rng(2).random((3, *net.input_shape), dtype=np.float32)
    ec.randomize(net, x)
    net.forward(x)
    model = export_onnx(net, layers=[6, -1, 6])
    assert [o.name for o in model.graph.output] == ["output", "layer6", "layer7"]
    out, logits, last = _run(model, x)
    assert logits.shape == (3, 10, 1, 1) and ec.rel_err(logits, net.layers[6].output) <= 1e-5
    assert ec.rel_err(out, net.layers[7].output) <= 1e-5 and np.array_equal(out, last)
    assert not np.allclose(logits, out)             # a real intermediate, not the softmax again
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["outputs"])["layer6"] == "layer 6 [avgpool] output (batch, 10, 1, 1)"
    with pytest.raises(ExportError, match=r"^--layer-output 8: the network has layers 0\.\.7$"):
        export_onnx(net, layers=[8])


# -- CLI and the engine ------------------------------------------------------------------------------------

def _tiny_files(tmp_path):
    net, _ = _tiny_yolo(96)
    cfg = tmp_path / "tiny.cfg"
    cfg.write_text(net.doc.text())
    weights = tmp_path / "tiny.weights"
    net.save_weights(weights)
    return cfg, weights


def test_cli_export_and_engine(tmp_path):
    from click.testing import CliRunner

    from darkpy.cli import main
    cfg, weights = _tiny_files(tmp_path)
    out = tmp_path / "tiny.onnx"
    r = CliRunner().invoke(main, ["export", str(cfg), str(weights), str(out), "--nms", "--dynamic-batch",
                                  "--opset", "18", "--layer-output", "14"])
    assert r.exit_code == 0, r.output
    m = onnx.load(out)
    assert [o.name for o in m.graph.output] == ["boxes", "scores", "selected_indices", "layer14"]
    dog = str(shared_path("darknet-data", "dog.jpg"))
    runs = []
    for engine in ("darkpy", "onnxruntime"):
        r = CliRunner().invoke(main, ["detect", str(cfg), str(weights), dog, "--json", "--thresh", "0.3",
                                      "--out", str(tmp_path), "--engine", engine])
        assert r.exit_code == 0, r.output
        runs.append(json.loads(r.output[r.output.index("["):]))
    mine, theirs = runs[0][0]["detections"], runs[1][0]["detections"]
    assert mine and [(d["class_id"], d["pixels"]) for d in mine] == [(d["class_id"], d["pixels"]) for d in theirs]
    for a, b in zip(mine, theirs):
        assert abs(a["confidence"] - b["confidence"]) <= 1e-4 and abs(a["box"]["x"] - b["box"]["x"]) <= 1e-4
    assert len(list(tmp_path.glob("tiny.*.onnx"))) == 1       # the engine's cache, beside the weights


def test_cli_export_refusal_is_one_line(tmp_path):
    from click.testing import CliRunner

    from darkpy.cli import main
    cfg = tmp_path / "r.cfg"
    cfg.write_text("[net]\nwidth=6\nheight=6\nchannels=2\n[local_avgpool]\nsize=2\nstride=2\npadding=5\n")
    net = load_network(cfg)
    net.save_weights(tmp_path / "r.weights")
    r = CliRunner().invoke(main, ["export", str(cfg), str(tmp_path / "r.weights"), str(tmp_path / "r.onnx")])
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [
        (f"error: {cfg}:8 [section #0 local_avgpool] padding: padding=5 with size=2: windows over padding "
         "only cannot be exported")]


def test_import_darkpy_does_not_import_onnx():
    import subprocess
    import sys
    code = "import sys, darkpy; assert 'onnx' not in sys.modules and 'onnxruntime' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})



def test_readme_script_runs_without_darkpy_and_finds_darkpys_detections(tmp_path):
    """The README's plain-onnxruntime script, on a --nms export of cfg/shapes-tiny.cfg (random,
    well-scaled weights) and a generated 128x128 shapes image: the same classes and pixel boxes as
    darkpy's detection (thresh 0.25, NMS 0.45)."""
    import subprocess
    import sys

    from darkpy import detect
    from darkpy import images as im
    script = _readme_script()
    (tmp_path / "detect_onnx.py").write_text(script)
    shapes_generator().generate(tmp_path / "shapes", n=2, size=128, seed=2)
    net = load_network(ROOT / "cfg" / "shapes-tiny.cfg", batch=1)
    rng = np.random.default_rng(4)
    ec.randomize(net, rng.random((1, *net.input_shape), dtype=np.float32))
    images = sorted((tmp_path / "shapes").rglob("*.jpg"))
    first = im.load_image(images[0], 3)
    # random weights find objects everywhere: lower every objectness bias until a handful remain
    for _ in range(40):
        if len(detect.detect_image(net, first, 0.25, 0.45)) <= 12:
            break
        for head in ec.heads(net):
            conv = net.layers[head.index - 1]
            conv.biases.value.reshape(head.n, -1)[:, 4] -= 0.25
    net.save_weights(tmp_path / "s.weights")
    model = tmp_path / "s.onnx"
    import os
    r = subprocess.run([sys.executable, "-m", "darkpy", "export", str(ROOT / "cfg" / "shapes-tiny.cfg"),
                        str(tmp_path / "s.weights"), str(model), "--nms", "--data",
                        str(ROOT / "data" / "shapes.names")], capture_output=True, text=True, cwd=ROOT, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and "exported" in r.stdout, r.stderr
    names = (ROOT / "data" / "shapes.names").read_text().split()
    total = 0
    for img_path in images:
        out = subprocess.run([sys.executable, "detect_onnx.py", str(model), str(img_path)], cwd=tmp_path,
                             capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
        got = sorted((f[0], *map(int, f[2:])) for f in (line.split() for line in out.stdout.splitlines()))
        img = im.load_image(img_path, 3)
        dets = detect.detect_image(net, img, 0.25, 0.45)
        want = sorted((names[c], *d.corners(128, 128)) for d in dets for c, _ in d.classes_above(0.25))
        assert got == want, img_path
        total += len(want)
    assert total


def _readme_script() -> str:
    """The README's plain-onnxruntime detector script (checked: at most 15 lines, no darkpy)."""
    import re
    text = (ROOT / "README.md").read_text()
    script = re.search(r"<!-- onnx-script -->\n```python\n(.*?)```", text, re.DOTALL)[1]
    assert len(script.strip().splitlines()) <= 15 and "darkpy" not in script.replace("`darkpy export", "")
    return script


def _script_input_equals_darkpys(tmp_path, monkeypatch, size, letterbox, mode="RGB"):
    import sys

    from PIL import Image

    from darkpy import detect
    from darkpy import images as im
    script = _readme_script()
    prefix = script[:script.index("boxes, scores, keep")]          # everything up to the session run
    net = load_network(ROOT / "cfg" / "shapes-tiny.cfg", batch=1)
    model = tmp_path / "s.onnx"
    export_onnx(net, model, nms=True, letterbox=letterbox)
    w, h = size
    pixels = np.random.default_rng(w * 1000 + h).integers(0, 256, (h, w, 4), dtype=np.uint8)
    pic = Image.fromarray(pixels, "RGBA")
    if mode == "P":
        pic = pic.convert("RGB").quantize(64)
    elif mode != "RGBA":
        pic = pic.convert(mode)
    pic.save(tmp_path / "i.png")
    assert Image.open(tmp_path / "i.png").mode == mode
    monkeypatch.setattr(sys, "argv", ["detect_onnx.py", str(model), str(tmp_path / "i.png")])
    scope: dict = {}
    exec(compile(prefix, "detect_onnx.py", "exec"), scope)
    want = detect.prepare_image(im.load_image(tmp_path / "i.png", 3), net, letterbox)[None]
    assert scope["x"].dtype == np.float32 and np.array_equal(scope["x"], want)


@pytest.mark.parametrize("size", [(64, 64), (96, 80), (80, 96), (50, 41), (200, 37), (1, 9), (64, 1)])
@pytest.mark.parametrize("letterbox", [True, False])
def test_readme_script_prepares_images_exactly_as_darkpy(tmp_path, monkeypatch, size, letterbox):
    """The script's preprocessing (8-bit RGB decode, Darknet's letterbox sizes and its corner-aligned
    float32 linear resize, 0.5 fill) is bit-identical to darkpy detect's: up- and downscaling,
    both orientations, 1-pixel sides, stretched (`letterbox=0`) too."""
    _script_input_equals_darkpys(tmp_path, monkeypatch, size, letterbox)


@pytest.mark.parametrize("mode", ["L", "P", "RGBA"])
def test_readme_script_decodes_grey_palette_and_alpha_images_as_darkpy(tmp_path, monkeypatch, mode):
    _script_input_equals_darkpys(tmp_path, monkeypatch, (90, 70), True, mode)


@pytest.fixture(scope="module")
def trained_shapes(tmp_path_factory):
    """cfg/shapes-tiny.cfg trained by `darkpy train`, shortened to what gives confident detections:
    64 px (helpers.short_shapes_tiny), 48 generated images, 180 iterations of 16 without
    augmentation (it learns those images; 35 s at load 9 on 2 cores), seed 1. Then `darkpy export --heads boxes
    --nms`, and test images of other sizes made from training images (letterbox with bars on
    either side, up- and downscaling, and one at the input size)."""
    from click.testing import CliRunner
    from PIL import Image

    from darkpy.cli import main
    root = tmp_path_factory.mktemp("trained_shapes")
    train_list, _ = shapes_generator().generate(root / "shapes", n=48, size=64, seed=0, valid_fraction=0)
    names = ROOT / "data" / "shapes.names"
    data = root / "shapes.data"
    data.write_text(f"classes=4\ntrain={train_list}\nvalid={train_list}\nnames={names}\nbackup={root / 'backup'}\n")
    cfg = short_shapes_tiny(root / "shapes-tiny.cfg", 64, 180, net={
        "batch": 16, "learning_rate": 0.01, "burn_in": 20, "steps": "162,171", "hue": 0, "saturation": 1,
        "exposure": 1, "flip": 0}, yolo={"jitter": 0})
    r = CliRunner().invoke(main, ["train", str(cfg), "--data", str(data), "--seed", "1", "--progress", "none"])
    assert r.exit_code == 0, r.output
    weights = root / "backup" / "shapes-tiny_final.weights"
    model = root / "shapes.onnx"
    r = CliRunner().invoke(main, ["export", str(cfg), str(weights), str(model), "--heads", "boxes", "--nms",
                                  "--data", str(names)])
    assert r.exit_code == 0, r.output
    sources = [Image.open(root / "shapes" / "images" / f"{k:05d}.jpg") for k in range(5)]
    images = []
    for k, (src, size) in enumerate(zip(sources, [(96, 80), (64, 64), (80, 112), (48, 40), (150, 120)])):
        path = root / f"test{k}.png"
        src.resize(size, Image.BICUBIC).save(path)
        images.append(path)
    return cfg, weights, model, images, data


def _detect_cli(cfg, weights, images, data) -> list[dict]:
    """`darkpy detect`'s printed detections (thresh 0.25, NMS 0.45), per image
    {(class name, left, top, right, bottom): percent}."""
    import re

    from click.testing import CliRunner

    from darkpy.cli import main
    r = CliRunner().invoke(main, ["detect", str(cfg), str(weights), *map(str, images), "--no-draw",
                                  "--data", str(data)])
    assert r.exit_code == 0, r.output
    out = []
    for line in r.output.splitlines():
        if not line.startswith("  "):
            out.append({})
            continue
        found, box = re.fullmatch(r"  (.*)  box \(left, top, right, bottom\) = \((.*)\)", line).groups()
        for item in found.split(", "):
            name, pct = item.split(": ")
            out[-1][(name, *map(int, box.split(", ")))] = int(pct.rstrip("%"))
    assert len(out) == len(images), r.output
    return out


@pytest.mark.slow
def test_trained_shapes_tiny_nms_export_equals_darkpy_detect(trained_shapes):
    """Trained weights: the `--heads boxes --nms` export keeps darkpy detect's boxes on every image."""
    from darkpy import images as im
    cfg, weights, model, images, _ = trained_shapes
    net = load_network(cfg, weights, batch=1)
    onnx_model = onnx.load(model)
    total = 0
    for path in images:
        img = im.load_image(path, 3)
        mine = _darkpy_detections(net, img, 0.25, 0.45, True)
        assert mine == _nms_detections(net, img, 0.25, 0.45, True, model=onnx_model), path
        total += len(mine)
    assert total >= len(images), "too few detections for the comparison to mean much"


@pytest.mark.slow
def test_readme_round_trip_on_trained_shapes_tiny(trained_shapes, tmp_path):
    """The README's round trip: the trained export run by the 15-line script with plain onnxruntime
    (no darkpy on the path) prints `darkpy detect`'s detections: classes, scores to 2 decimals and
    pixel boxes, on images that are letterboxed and resized."""
    import subprocess
    import sys
    cfg, weights, model, images, data = trained_shapes
    (tmp_path / "detect_onnx.py").write_text(_readme_script())
    want_all = _detect_cli(cfg, weights, images, data)
    for path, want in zip(images, want_all):
        out = subprocess.run([sys.executable, "detect_onnx.py", str(model), str(path)], cwd=tmp_path,
                             capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
        got = {(f[0], *map(int, f[2:])): float(f[1]) for f in map(str.split, out.stdout.splitlines())}
        assert got.keys() == want.keys(), path          # the same classes and pixel boxes
        for key, score in got.items():                   # 2 decimals against darkpy's whole percent
            assert abs(score * 100 - want[key]) <= 1, (path, key, score, want[key])
    assert sum(map(len, want_all)) >= len(images)


def test_predict_with_the_onnxruntime_engine_matches_darkpy(tmp_path):
    """`darkpy predict --engine onnxruntime` on the bundled digits classifier (random weights)."""
    from click.testing import CliRunner

    from darkpy.cli import main
    cfg = ROOT / "cfg" / "digits.cfg"
    net = load_network(cfg, batch=1)
    ec.randomize(net, np.random.default_rng(0).random((1, *net.input_shape), dtype=np.float32))
    weights = tmp_path / "digits.weights"
    net.save_weights(weights)
    images = [str(p) for p in sorted((ROOT / "data" / "digits" / "test").glob("*.png"))[:3]]
    runs = []
    for engine in ("darkpy", "onnxruntime"):
        r = CliRunner().invoke(main, ["predict", str(cfg), str(weights), *images, "--json", "--engine", engine])
        assert r.exit_code == 0, r.output
        runs.append(json.loads(r.output[r.output.index("["):]))
    assert len(runs[0]) == 3
    for a, b in zip(*runs):
        assert [t["index"] for t in a["predictions"]] == [t["index"] for t in b["predictions"]]
        assert np.allclose([t["probability"] for t in a["predictions"]],
                           [t["probability"] for t in b["predictions"]], atol=1e-5)


def test_valid_with_the_onnxruntime_engine_matches_darkpy(tmp_path):
    from click.testing import CliRunner

    from darkpy.cli import main
    cfg = ROOT / "cfg" / "digits.cfg"
    net = load_network(cfg, batch=1)
    ec.randomize(net, np.random.default_rng(1).random((1, *net.input_shape), dtype=np.float32))
    weights = tmp_path / "digits.weights"
    net.save_weights(weights)
    runs = []
    for engine in ("darkpy", "onnxruntime"):
        r = CliRunner().invoke(main, ["valid", str(cfg), str(weights), "--json", "--engine", engine],
                               catch_exceptions=False)
        assert r.exit_code == 0, r.output
        runs.append(json.loads(r.output[r.output.index("{"):]))
    assert runs[0]["images"] == 360 and runs[0] == runs[1]


# -- drawn networks --------------------------------------------------------------------------------
#: Sections beyond tests/test_paths_fuzz.py's that the exporter converts on its own terms.
EXPORT_SECTIONS = [
    "[maxpool]\nsize=3\nstride=2", "[maxpool]\nsize=2\nstride=2\npadding=1", "[reorg]\nstride=2",
    "[avgpool]", "[connected]\noutput=7\nactivation=leaky", "[softmax]", "[batchnorm]",
    "[activation]\nactivation=swish", "[local_avgpool]\nsize=3\nstride=1", "[scale_channels]\nfrom=-2",
    "[sam]\nfrom=-2", "[convolutional]\nfilters=8\nsize=3\ngroups=8\npad=1\nactivation=relu",
    "[convolutional]\nfilters=16\nsize=5\nstride=2\npad=2\nbatch_normalize=1\nactivation=swish",
    "[upsample]\nstride=-2", "[dropout]",
]


@pytest.mark.filterwarnings("ignore::darkpy.cfg.CfgWarning")
@hypothesis.settings(max_examples=100, deadline=None, derandomize=True,
                     suppress_health_check=[hypothesis.HealthCheck.too_slow,
                                            hypothesis.HealthCheck.filter_too_much])
@hypothesis.given(st.data())
def test_drawn_networks_export_equal_to_darkpy(data):
    """Drawn stacks of sections (tests/test_paths_fuzz.py's and the ones above, then a head) export
    and give darkpy's outputs in ONNX Runtime to 1e-4 relative; a network darkpy does not build is
    skipped. (1500 random draws passed when this was written.)"""
    text = draw_network(data.draw, SECTIONS + EXPORT_SECTIONS, (4, 20), 7, "leaky", HEADS)
    try:
        _assert_equal_to_darkpy(text, tol=1e-4)
    except ExportError:             # a DarkpyError too, but the exporter refusing fails the test
        raise
    except DarkpyError:             # not a network (shapes that do not fit): darkpy says so
        hypothesis.assume(False)
