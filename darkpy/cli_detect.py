"""The detector commands, `darkpy detect` and `darkpy map`; `cli.py` adds them with `register(main)`.

They parse arguments and call `detect.py`; errors are `DarkpyError`s, which the group turns into one
line and exit status 1.
"""
from __future__ import annotations

import json
import os

import click

from .cli_export import engine_option
from .export.engine import with_engine

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def register(group: click.Group) -> None:
    """Add `detect` and `map` to the `darkpy` command group."""
    group.add_command(detect_command)
    group.add_command(map_command)


def _load_detector(cfg: str, weights: str, batch: int = 1):
    from .detect import detection_heads
    from .errors import WeightsError
    from .network import load_network

    from .train import COMPILING_NOTICE, kernels_need_compiling

    net = load_network(cfg, batch=batch)
    detection_heads(net)
    if kernels_need_compiling(net):
        click.echo(COMPILING_NOTICE, err=True)
    try:
        net.load_weights(weights)
    except WeightsError as e:
        raise WeightsError(f"{e} (was it trained with another cfg, input size or number of classes?)") from None
    return net


def _names(cfg: str, data: str | None, classes: int) -> list[str] | None:
    from .errors import DataError
    from .train import find_data_file, load_data_config

    if data is not None and not os.path.isfile(data):
        raise DataError(f"{data}: no such .data file")
    path = data or find_data_file(cfg)
    if path is None:
        return None
    names = load_data_config(path).names
    return names if len(names) >= classes else None


def _threads(threads: int | None) -> None:
    from .settings import load_settings
    from .train import configure_threads

    configure_threads(load_settings().override(threads=threads).threads)


@click.command("detect", context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.argument("weights", type=click.Path(dir_okay=False))
@click.argument("images", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--thresh", type=click.FloatRange(0, 1), default=0.25, show_default=True,
              help="Report classes more probable than this.")
@click.option("--nms", type=click.FloatRange(0, 1), default=0.45, show_default=True,
              help="Non-maximum suppression IoU threshold (0: off).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Folder for the images with labelled boxes (IMAGE_predictions.png).")
@click.option("--data", "data", type=click.Path(dir_okay=False), help="The .data file (for class names).")
@click.option("--no-letterbox", is_flag=True, help="Stretch images to the input size instead of letterboxing.")
@click.option("--json", "as_json", is_flag=True, help="Print the detections as JSON.")
@click.option("--threads", type=click.IntRange(min=0), help="numba/BLAS threads (0 = all cores).")
@engine_option
def detect_command(cfg, weights, images, thresh, nms, out_dir, data, no_letterbox, as_json, threads, engine):
    """Detect objects in each IMAGE: print class, confidence and box, and save the image with
    labelled boxes."""
    from . import detect, images as im

    _threads(threads)
    net = with_engine(_load_detector(cfg, weights), cfg, weights, engine)
    classes = detect.detection_heads(net)[-1].classes
    names = _names(cfg, data, classes)
    os.makedirs(out_dir, exist_ok=True)
    results = []
    for path in images:
        img = im.load_image(path, net.input_shape[0])
        dets = detect.detect_image(net, img, thresh, nms, letterbox=not no_letterbox)
        h, w = img.shape[1:]
        out_path = os.path.join(out_dir, os.path.splitext(os.path.basename(path))[0] + "_predictions.png")
        drawn = detect.draw_detections(img if img.shape[0] == 3 else img.repeat(3, axis=0), dets, names,
                                       thresh, classes)
        im.save_image(drawn, out_path)
        results.append({"image": path, "width": w, "height": h, "output": out_path,
                        "detections": [d.as_dict(names, w, h) for d in dets]})
        if as_json:
            continue
        click.echo(f"{path}: {len(dets)} object{'s' if len(dets) != 1 else ''} -> {out_path}")
        for d in dets:
            left, top, right, bot = d.corners(w, h)
            labels = ", ".join(f"{names[c] if names else c}: {p * 100:.0f}%" for c, p in d.classes_above(thresh))
            click.echo(f"  {labels}  box (left, top, right, bottom) = ({left}, {top}, {right}, {bot})")
    if as_json:
        click.echo(json.dumps(results, indent=1))


@click.command("map", context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.argument("weights", type=click.Path(dir_okay=False))
@click.option("--data", "data", type=click.Path(dir_okay=False),
              help="The .data file whose `valid` list is measured (default: cfg/NAME.cfg -> data/NAME.data).")
@click.option("--iou", type=click.FloatRange(0, 1, min_open=True), default=0.5, show_default=True,
              help="IoU a detection needs with a truth to count.")
@click.option("--thresh", "conf_thresh", type=click.FloatRange(0, 1), default=0.25, show_default=True,
              help="Confidence for precision, recall, F1 and average IoU.")
@click.option("--batch", type=click.IntRange(min=1), default=8, show_default=True, help="Images per forward pass.")
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N images of the list.")
@click.option("--no-letterbox", is_flag=True, help="Stretch images to the input size instead of letterboxing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--threads", type=click.IntRange(min=0), help="numba/BLAS threads (0 = all cores).")
@engine_option
def map_command(cfg, weights, data, iou, conf_thresh, batch, limit, no_letterbox, as_json, threads, engine):
    """Mean average precision of WEIGHTS on the `valid` list: per-class AP (VOC 11-point, all-point
    and COCO 101-point), precision, recall, F1 and average IoU."""
    from .detect import evaluate_map
    from .train import resolve_data_file

    _threads(threads)
    data_path = resolve_data_file(cfg, data)
    net = with_engine(_load_detector(cfg, weights, batch), cfg, weights, engine)
    r = evaluate_map(net, data_path, iou=iou, conf_thresh=conf_thresh, letterbox=not no_letterbox, limit=limit)
    click.echo(json.dumps(r.as_dict(), indent=1) if as_json else r.format())
