"""ONNX export checked against darkpy on every shared cfg (issue #10, item 1).

For one shared cfg: darkpy builds it at batch 1 (at a reduced input size when the cfg's is larger
than KEEP_OWN_SIZE_UP_TO, a [crop] window scaled with it; 8 steps of a longer recurrent one), every parameterised layer gets random but well-scaled values (the
oracle's recipe, tests/oracle.py, plus a plain one for local/deconv/batchnorm), darkpy runs a random
input, and the export (`raw` heads, then `boxes`) must pass onnx.checker (full check), load in ONNX
Runtime and give darkpy's outputs within TOLERANCE relative to each output's magnitude
(max|ort - darkpy| / max|darkpy|). No weights file is written: export reads the layers in memory.

`python -m tests.export_cases --write` runs every shared cfg and writes tests/data/onnx_export.tsv
(cfg, status exported/refused/not built, size, BFLOPs, raw and boxes errors, seconds, reason);
tests/test_export.py re-runs rows and re-checks every reason.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle

ROOT = oracle.ROOT
TABLE = ROOT / "tests" / "data" / "onnx_export.tsv"
FIELDS = ("cfg", "status", "size", "bflops", "raw_rel_err", "boxes_rel_err", "seconds", "reason")
TOLERANCE = 1e-4
#: Deep random nets amplify float32 rounding past TOLERANCE at the output; there the export must agree
#: with darkpy to NOISE_FACTOR x darkpy's own float32 rounding noise (float32 vs darkpy in float64).
NOISE_FACTOR = 10.0
KEEP_OWN_SIZE_UP_TO = 128
SIZES = (64, 96, 128)
MAX_BFLOPS = 3.0
#: Recurrent nets are unrolled step by step: longer sequences are checked at this many steps.
MAX_STEPS = 8


class NotExported(Exception):
    """The cfg is not exported; the message is the reason recorded in the table."""


@dataclass
class Case:
    name: str
    net: object
    x: np.ndarray
    size: tuple
    bflops: float


def build(name: str, width: int | None = None, height: int | None = None):
    """darkpy network for shared cfg `name` at batch 1 (time_steps rows for recurrent nets; at
    width x height when given), without
    random init. Raises NotExported("darkpy: ...") when darkpy does not build it."""
    from darkpy.cfg import parse_cfg
    from darkpy.errors import DarkpyError
    path = oracle.SHARED / "cfg" / name
    try:
        doc = parse_cfg(oracle.darknet_text(path), str(path))
    except DarkpyError as e:
        raise NotExported(f"darkpy cannot build it: {e}") from None
    oracle._stand_ins(doc)          # tree= / map=: generated stand-ins (../shared has no 9k.tree)
    for key, value in (("batch", "1"), ("subdivisions", "1")):
        doc.set(f"net.{key}", value)
    if int(doc.get("net.time_steps") or 1) > MAX_STEPS:
        doc.set("net.time_steps", str(MAX_STEPS))
    if width:
        w0, h0 = int(doc.get("net.width") or width), int(doc.get("net.height") or height or width)
        doc.set("net.width", str(width))
        doc.set("net.height", str(height or width))
        for sec in doc.layers:          # a [crop] window shrinks with the input
            if sec.kind == "crop":
                for key, old, new in (("crop_width", w0, width), ("crop_height", h0, height or width)):
                    if sec.has(key):
                        doc.set(f"{sec.index}.{key}", str(max(1, int(doc.get(f"{sec.index}.{key}")) * new // old)))
    from darkpy.network import load_network
    with warnings.catch_warnings(), oracle._no_random_init():
        warnings.simplefilter("ignore")     # one sequence: time_steps rows (1 for other nets)
        return load_network(parse_cfg(doc.text(), str(path)))


def prepare(name: str) -> Case:
    from darkpy.cfg import parse_cfg
    from darkpy.errors import DarkpyError
    path = oracle.SHARED / "cfg" / name
    doc = parse_cfg(oracle.darknet_text(path), str(path))
    w, h = int(doc.get("net.width") or 0), int(doc.get("net.height") or 0)
    sizes = [(None, None)] if max(w, h) <= KEEP_OWN_SIZE_UP_TO else [(s, s) for s in SIZES] + [(None, None)]
    last = None
    for sw, sh in sizes:
        try:
            net = build(name, sw, sh)
        except DarkpyError as e:
            last = e
            if "not supported by darkpy" in str(e):
                break
            continue
        bflops = sum(layer.flops() for layer in net.layers) / 1e9
        rng = np.random.default_rng(0)
        x = rng.random((net.batch, *net.input_shape), dtype=np.float32)
        randomize(net, x)
        net.forward(x)
        return Case(name, net, x, (net.width, net.height), bflops)
    raise NotExported(f"darkpy cannot build it: {getattr(last, 'message', last)}")


def randomize(net, x: np.ndarray, seed: int = 0) -> None:
    """The oracle's data-dependent random parameters for conv/connected; uniform ones scaled by the
    fan-in for the other parameterised layers (BN variances in [0.5, 2])."""
    from darkpy.layers.base import State
    rng = np.random.default_rng(seed)
    np.copyto(net.input, x.reshape(net.input.shape))
    s = State(input=net.input, delta=None, truth=None, train=False, layers=net.layers, seen=0,
              rng=np.random.default_rng(seed), net=net)
    for layer in net.layers:
        if layer.kind in ("convolutional", "connected"):
            oracle._randomize_layer(layer, s.input[:1], rng)
        else:
            for a in layer.weight_arrays():
                fan = max(a[0].size if a.ndim > 1 else 1, 1)
                a[...] = rng.uniform(-1, 1, a.shape) * math.sqrt(3.0 / fan)
            for holder in [layer] + [i.layer for i in getattr(layer, "inner", [])]:
                bn = getattr(holder, "bn", None)
                if bn is None:
                    continue
                bn.scales.value[...] = rng.uniform(0.5, 1.5, bn.scales.value.shape)
                bn.rolling_variance[...] = rng.uniform(0.5, 2.0, bn.rolling_variance.shape)
                bn.rolling_mean[...] = rng.uniform(-0.1, 0.1, bn.rolling_mean.shape)
        layer.forward(s)
        s.input = layer.output


def rel_err(a, b) -> float:
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    if a.shape != b.shape or not np.isfinite(a).all():
        return math.inf
    scale = np.abs(b).max() if b.size else 0.0
    diff = np.abs(a - b).max() if a.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


def heads(net) -> list:
    return [layer for layer in net.layers if getattr(layer, "is_detection_head", False)]


def darkpy_boxes(net, b: int = 0):
    """(corners (N, 4), scores (N, C)) of every head's candidates, net-relative, no threshold."""
    parts = []
    for layer in heads(net):
        boxes, _, probs = layer.get_detections(b, -math.inf, net.width, net.height)
        corners = np.stack([boxes[:, 0] - boxes[:, 2] / 2, boxes[:, 1] - boxes[:, 3] / 2,
                            boxes[:, 0] + boxes[:, 2] / 2, boxes[:, 1] + boxes[:, 3] / 2], 1)
        parts.append((corners, probs))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def session(model):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def compare(case: Case, check: bool = True) -> tuple[float, float | None]:
    """(raw error, boxes error or None) of the export of case.net against darkpy's outputs."""
    import onnx

    from darkpy.export import export_onnx
    net = case.net
    # one model with both the raw heads and the decoded boxes: one check, one session
    m = export_onnx(net, heads="raw+boxes" if heads(net) else "raw")
    if check:
        onnx.checker.check_model(m, full_check=True)
    outs = session(m).run(None, {"input": case.x})
    refs = heads(net) or [net.output_layer]
    raw = max(rel_err(o, layer.output) for o, layer in zip(outs, refs))
    if not heads(net):
        return raw, None
    boxes, scores = outs[len(refs):]
    ref_boxes, ref_scores = darkpy_boxes(net)
    return raw, max(rel_err(boxes[0], ref_boxes), rel_err(scores[0], ref_scores))


def noise(case: Case) -> tuple[float, float | None]:
    """darkpy's own float32 rounding at the outputs: (raw, boxes) errors of the float32 net against
    the same parameters run in float64."""
    from darkpy.cfg import parse_cfg
    from darkpy.network import load_network
    net = case.net
    with warnings.catch_warnings(), oracle._no_random_init():
        warnings.simplefilter("ignore")
        net64 = load_network(parse_cfg(net.doc.text(), str(net.file)), batch=net.batch, dtype=np.float64)
    for a, b in zip(net64.layers, net.layers):
        for dst, src in zip(a.weight_arrays(), b.weight_arrays()):
            dst[...] = src
        for name in ("rolling_mean", "rolling_variance"):
            if getattr(a, "bn", None) is not None:
                getattr(a.bn, name)[...] = getattr(b.bn, name)
    net64.forward(case.x.astype(np.float64))
    refs = heads(net) or [net.output_layer]
    raw = max(rel_err(b.output, a.output) for a, b in zip(heads(net64) or [net64.output_layer], refs))
    if not heads(net):
        return raw, None
    (b32, s32), (b64, s64) = darkpy_boxes(net), darkpy_boxes(net64)
    return raw, max(rel_err(b32, b64), rel_err(s32, s64))


def within(err: float | None, noise_err: float | None) -> bool:
    return err is None or err <= max(TOLERANCE, NOISE_FACTOR * (noise_err or 0.0))


def classify(name: str) -> dict:
    from darkpy.errors import DarkpyError
    from darkpy.export import ExportError
    row = dict.fromkeys(FIELDS, "")
    row["cfg"] = name
    t0 = time.perf_counter()
    try:
        case = prepare(name)
    except (NotExported, DarkpyError) as e:
        row.update(status="not built", reason=str(e))
        return row
    steps = case.net.config.time_steps
    row.update(size=(f"{case.size[0]}x{case.size[1]}" if case.size[0] else f"{case.net.input_shape[0]} (flat)")
               + (f" x{steps} steps" if steps > 1 else ""), bflops=f"{case.bflops:.3f}")
    try:
        raw, boxes = compare(case)
    except ExportError as e:
        row.update(status="refused", reason=e.message)
        return row
    row.update(raw_rel_err=f"{raw:.1e}", boxes_rel_err="" if boxes is None else f"{boxes:.1e}",
               seconds=f"{time.perf_counter() - t0:.1f}")
    ok = raw <= TOLERANCE and (boxes is None or boxes <= TOLERANCE)
    if not ok:
        n_raw, n_boxes = noise(case)
        ok = within(raw, n_raw) and within(boxes, n_boxes)
        row["reason"] = (f"output within {NOISE_FACTOR:g}x float32 rounding noise ({max(n_raw, n_boxes or 0):.1e}: "
                         f"darkpy float32 vs float64)")
    row["status"] = "exported" if ok else "mismatch"
    return row


def network_key(name: str) -> tuple:
    """Equal keys: the same network here (a fork's copy of an upstream cfg, or cfgs differing only
    in training keys), so the tests run one of them."""
    from darkpy.cfg import parse_cfg
    doc = parse_cfg(oracle.darknet_text(oracle.SHARED / "cfg" / name), name)
    steps = min(int(doc.net.as_dict().get("time_steps", 1)), MAX_STEPS)
    return oracle.network_key(name), steps


def read_table(path: Path = TABLE) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def write_table(rows: list[dict], path: Path = TABLE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        wr = csv.DictWriter(f, FIELDS, delimiter="\t", lineterminator="\n")
        wr.writeheader()
        wr.writerows(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write tests/data/onnx_export.tsv")
    ap.add_argument("cfgs", nargs="*", help="shared cfgs (repo/name.cfg); default all")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    names = args.cfgs or oracle.shared_cfgs()
    rows = []
    for name in names:
        row = classify(name)
        rows.append(row)
        print("\t".join(row[k] for k in FIELDS), flush=True)
    if args.write:
        if args.cfgs and TABLE.exists():
            old = {r["cfg"]: r for r in read_table()}
            old.update({r["cfg"]: r for r in rows})
            rows = [old[k] for k in oracle.shared_cfgs() if k in old]
        write_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
