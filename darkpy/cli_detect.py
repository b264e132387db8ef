"""The detector commands, `darkpy detect` and `darkpy map`; `cli.py` adds them with `register(main)`.

They parse arguments and call `detect.py`; errors are `DarkpyError`s, which the group turns into one
line and exit status 1.
"""
from __future__ import annotations

import json
import os

import click

from .cli_export import engine_option

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def register(group: click.Group) -> None:
    """Add `detect` and `map` to the `darkpy` command group."""
    group.add_command(detect_command)
    group.add_command(map_command)


def _load_detector(cfg: str, weights: str, batch: int = 1):
    from .detect import detection_heads
    from .errors import WeightsError
    from .network import load_network

    from .runtime import COMPILING_NOTICE, kernels_need_compiling

    net = load_network(cfg, batch=batch)
    detection_heads(net)
    if kernels_need_compiling(net, training=False):
        click.echo(COMPILING_NOTICE, err=True)
    try:
        net.load_weights(weights)
    except WeightsError as e:
        raise e.with_cfg_hint() from None
    net.share_outputs()         # inference only: the heads keep their outputs, the rest share memory
    return net


def _names(cfg: str, data: str | None, classes: int) -> list[str] | None:
    from .errors import DataError
    from .datafile import find_data_file, load_data_config

    if data is not None and not os.path.isfile(data):
        raise DataError(f"{data}: no such .data file")
    path = data or find_data_file(cfg)
    if path is None:
        return None
    names = load_data_config(path).names
    return names if len(names) >= classes else None


def _threads(threads: int | None) -> None:
    from .settings import load_settings
    from .runtime import configure_threads

    configure_threads(load_settings().override(threads=threads).threads)


#: what a folder given to `detect` contributes: its files with these extensions (sorted by name)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".gif")
#: an argument with one of these extensions is a list file: one image path per line
LIST_EXTENSIONS = (".txt", ".list")


def image_inputs(args, stdin=None) -> list[str]:
    """The images named by `detect`'s arguments, in order: an image file; a folder (its images,
    sorted); a list file (.txt/.list, one path per line, as Darknet's train/valid lists); `-`: a list
    read from standard input (Darknet's `detector test ... < list.txt`)."""
    from .datasets import read_list
    from .errors import DataError

    out: list[str] = []
    for a in args:
        if a == "-":
            stream = stdin or click.get_text_stream("stdin")
            out += [line.strip() for line in stream if line.strip()]
        elif os.path.isdir(a):
            found = sorted(os.path.join(a, n) for n in os.listdir(a)
                           if n.lower().endswith(IMAGE_EXTENSIONS) and os.path.isfile(os.path.join(a, n)))
            if not found:
                raise DataError(f"{a}: a folder with no images ({', '.join(IMAGE_EXTENSIONS)})")
            out += found
        elif a.lower().endswith(LIST_EXTENSIONS):
            out += read_list(a)
        else:
            out.append(a)
    if not out:
        raise DataError("no images to detect in (the list was empty)")
    return out


def label_file(image: str, out_dir: str | None) -> str:
    """Where `--save-labels` writes an image's predictions: beside it (AlexeyAB's -save_labels), or
    in `out_dir` when given."""
    stem = os.path.splitext(image)[0]
    return os.path.join(out_dir, os.path.basename(stem) + ".txt") if out_dir else stem + ".txt"


def yolo_label_lines(dets) -> list[str]:
    """Detections as YOLO label lines `class x y w h` (image-relative centre and size), each box cut
    to the image first so the file is a valid label file."""
    lines = []
    for d in dets:
        x0, x1 = max(d.x - d.w / 2, 0.0), min(d.x + d.w / 2, 1.0)
        y0, y1 = max(d.y - d.h / 2, 0.0), min(d.y + d.h / 2, 1.0)
        if x1 <= x0 or y1 <= y0:
            continue
        lines.append(f"{d.class_id} {(x0 + x1) / 2:.6f} {(y0 + y1) / 2:.6f} {x1 - x0:.6f} {y1 - y0:.6f}")
    return lines


@click.command("detect", context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.argument("weights", type=click.Path(dir_okay=False))
@click.argument("images", nargs=-1, required=True)
@click.option("--thresh", type=click.FloatRange(0, 1), default=0.25, show_default=True,
              help="Report classes more probable than this.")
@click.option("--nms", type=click.FloatRange(0, 1), default=0.45, show_default=True,
              help="Non-maximum suppression IoU threshold (0: off).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Folder for the images with labelled boxes (IMAGE_predictions.png; default: the "
                   "current folder) and for --save-labels files.")
@click.option("--no-draw", is_flag=True, help="Do not write the images with labelled boxes.")
@click.option("--save-labels", is_flag=True,
              help="Write each image's detections as a YOLO label file (IMAGE.txt: class x y w h) beside "
                   "it, or in --out (AlexeyAB's -save_labels).")
@click.option("--force", is_flag=True, help="With --save-labels: overwrite label files that exist.")
@click.option("--data", "data", type=click.Path(dir_okay=False), help="The .data file (for class names).")
@click.option("--no-letterbox", is_flag=True, help="Stretch images to the input size instead of letterboxing.")
@click.option("--json", "as_json", is_flag=True, help="Print the detections of all images as one JSON document.")
@click.option("--threads", type=click.IntRange(min=0), help="numba/BLAS threads (0 = all cores).")
@engine_option
def detect_command(cfg, weights, images, thresh, nms, out_dir, no_draw, save_labels, force, data,
                   no_letterbox, as_json, threads, engine):
    """Detect objects in each IMAGE: print class, confidence and box, and save the image with
    labelled boxes.

    IMAGE may be an image file, a folder (its images), a list file (.txt or .list, one image path per
    line) or `-` (such a list on standard input)."""
    from . import detect, images as im

    paths = image_inputs(images)
    labels = [label_file(p, out_dir) for p in paths] if save_labels else []
    if not force:
        _refuse_overwrite(labels)
    _threads(threads)
    from .export.engine import with_engine

    net = with_engine(_load_detector(cfg, weights), cfg, weights, engine)
    classes = detect.detection_heads(net)[-1].classes
    names = _names(cfg, data, classes)
    draw_dir = None if no_draw else (out_dir or ".")
    for folder in {draw_dir, out_dir if save_labels else None} - {None}:
        os.makedirs(folder, exist_ok=True)
    results = []
    for k, path in enumerate(paths):
        img = im.load_image(path, net.input_shape[0])
        dets = detect.detect_image(net, img, thresh, nms, letterbox=not no_letterbox)
        entry = _write_outputs(path, img, dets, names, thresh, classes, draw_dir, labels[k] if labels else None)
        results.append(entry)
        if not as_json:
            _print_detections(entry, dets, names, thresh)
    if as_json:
        click.echo(json.dumps(results, indent=1))
    dropped = sum(r["non_finite_dropped"] for r in results)
    if dropped:
        n = len(paths)
        click.echo(f"warning: {dropped} candidate box{'es' if dropped != 1 else ''} with non-finite coordinates "
                   f"or probabilities {'were' if dropped != 1 else 'was'} dropped (in {n} image"
                   f"{'s' if n != 1 else ''}); the weights {weights} look barely trained or diverged", err=True)


def _refuse_overwrite(labels: list[str]) -> None:
    from .errors import DataError

    existing = [p for p in labels if os.path.exists(p)]
    if existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise DataError(f"{existing[0]}: exists{more}; --save-labels does not overwrite label files "
                        f"unless --force is given")


def _write_outputs(path, img, dets, names, thresh, classes, draw_dir, label_path) -> dict:
    """The drawn image (into `draw_dir`, unless None) and the label file (`label_path`, unless None)
    of one image; returns its JSON entry."""
    from . import detect, images as im

    h, w = img.shape[1:]
    out_path = None
    if draw_dir is not None:
        out_path = os.path.join(draw_dir, os.path.splitext(os.path.basename(path))[0] + "_predictions.png")
        rgb = img if img.shape[0] == 3 else img.repeat(3, axis=0)
        im.save_image(detect.draw_detections(rgb, dets, names, thresh, classes), out_path)
    entry = {"image": path, "width": w, "height": h, "output": out_path,
             "detections": [d.as_dict(names, w, h) for d in dets], "non_finite_dropped": dets.dropped}
    if label_path is not None:
        with open(label_path, "w") as f:
            f.write("".join(line + "\n" for line in yolo_label_lines(dets)))
        entry["labels"] = label_path
    return entry


def _print_detections(entry: dict, dets, names, thresh) -> None:
    where = f" -> {entry['output']}" if entry["output"] else ""
    click.echo(f"{entry['image']}: {len(dets)} object{'s' if len(dets) != 1 else ''}{where}")
    for d in dets:
        left, top, right, bot = d.corners(entry["width"], entry["height"])
        found = ", ".join(f"{names[c] if names else c}: {p * 100:.0f}%" for c, p in d.classes_above(thresh))
        click.echo(f"  {found}  box (left, top, right, bottom) = ({left}, {top}, {right}, {bot})")


@click.command("map", context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.argument("weights", type=click.Path(dir_okay=False))
@click.option("--data", "data", type=click.Path(dir_okay=False),
              help="The .data file whose `valid` list is measured (default: cfg/NAME.cfg -> data/NAME.data).")
@click.option("--iou", type=click.FloatRange(0, 1, min_open=True), multiple=True,
              help="IoU a detection needs with a truth to count (repeat for several; default 0.5; "
                   "coco: replaces the .50:.05:.95 grid).")
@click.option("--metric", type=click.Choice(["darknet", "voc", "coco"]), default="darknet", show_default=True,
              help="Matching and AP rules: the fork's detector map, voc_eval.py, or COCOeval (AP@[.5:.95]).")
@click.option("--thresh", "conf_thresh", type=click.FloatRange(0, 1), default=0.25, show_default=True,
              help="Confidence for precision, recall, F1 and average IoU.")
@click.option("--batch", type=click.IntRange(min=1), default=8, show_default=True, help="Images per forward pass.")
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N images of the list.")
@click.option("--no-letterbox", is_flag=True, help="Stretch images to the input size instead of letterboxing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--threads", type=click.IntRange(min=0), help="numba/BLAS threads (0 = all cores).")
@engine_option
def map_command(cfg, weights, data, iou, metric, conf_thresh, batch, limit, no_letterbox, as_json, threads,
                engine):
    """Mean average precision of WEIGHTS on the `valid` list: per-class AP (VOC 11-point, all-point
    and COCO 101-point), precision, recall, F1 and average IoU; `--metric coco` prints COCOeval's
    summary (AP@[.5:.95], AP50, AP75, by size, AR)."""
    from .detect import map_of_run, run_valid
    from .datafile import resolve_data_file

    _threads(threads)
    data_path = resolve_data_file(cfg, data)
    from .export.engine import with_engine

    net = with_engine(_load_detector(cfg, weights, batch), cfg, weights, engine)
    run = run_valid(net, data_path, letterbox=not no_letterbox, limit=limit)
    if metric == "coco":
        results = [map_of_run(run, 0.5, conf_thresh, "coco", iou_thresholds=sorted(iou) or None)]
    else:
        results = [map_of_run(run, t, conf_thresh, metric) for t in (iou or (0.5,))]
    if as_json:
        out = [r.as_dict() for r in results]
        click.echo(json.dumps(out[0] if len(out) == 1 else out, indent=1))
    else:
        click.echo("\n\n".join(r.format() for r in results))
