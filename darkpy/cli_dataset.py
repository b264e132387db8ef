"""Dataset commands: `darkpy anchors` and `darkpy labels from-coco|from-voc`; `cli.py` adds them with
`register(main)`. The library is anchors.py and convert.py."""
from __future__ import annotations

import json

import click

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def register(group: click.Group) -> None:
    group.add_command(anchors_command)
    group.add_command(labels)
    group.add_command(augment_preview)


@click.command("anchors", context_settings=CONTEXT)
@click.argument("data", type=click.Path(dir_okay=False))
@click.option("--num", "-n", type=click.IntRange(min=1), default=9, show_default=True, help="Number of anchors.")
@click.option("--width", type=click.IntRange(min=1), help="Network input width (default: --write cfg's [net]).")
@click.option("--height", type=click.IntRange(min=1), help="Network input height (default: --write cfg's [net]).")
@click.option("--seed", type=int, default=0, show_default=True, help="k-means++ seed (same seed, same anchors).")
@click.option("--restarts", type=click.IntRange(min=1), default=10, show_default=True,
              help="k-means runs; the one with the best average IoU is kept.")
@click.option("--write", "write_cfg", type=click.Path(dir_okay=False, exists=True),
              help="Put the anchors into every [yolo] of this cfg (comments and layout kept).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def anchors_command(data, num, width, height, seed, restarts, write_cfg, as_json):
    """Anchors for DATA's `train` list: k-means of the label boxes' sizes (1 - IoU distance), the
    average IoU, and counters_per_class."""
    from .anchors import calc_anchors, write_anchors
    from .datasets import read_data_file
    from .errors import DataError

    if (width is None or height is None) and write_cfg:
        from .cfg import load_cfg
        net = load_cfg(write_cfg).net
        width = width or net.get_int("width", 416)
        height = height or net.get_int("height", 416)
    if width is None or height is None:
        raise click.UsageError("give --width and --height (or --write CFG to read them from its [net])")
    dc = read_data_file(data)
    if not dc.train:
        raise DataError(f"{data}: no train= list to compute anchors from")
    r = calc_anchors(dc.train, num, width, height, dc.classes, seed=seed, restarts=restarts)
    written = write_anchors(write_cfg, r) if write_cfg else []
    if as_json:
        click.echo(json.dumps({"anchors": r.anchors.astype(int).tolist(), "avg_iou": r.avg_iou, "boxes": r.boxes,
                               "counters_per_class": r.counters_per_class, "written": written}))
        return
    click.echo(f"{r.boxes} boxes, {num} anchors for {width}x{height} (seed {seed}, best of {restarts} k-means++ runs)")
    click.echo(f"avg IoU = {100 * r.avg_iou:.2f} %")
    click.echo(f"anchors = {r.anchors_text()}")
    click.echo(f"counters_per_class = {', '.join(map(str, r.counters_per_class))}")
    if written:
        click.echo(f"{write_cfg}: anchors written to the [yolo] layers {', '.join(map(str, written))}")


@click.group("labels", context_settings=CONTEXT)
def labels():
    """Convert COCO or VOC annotations to Darknet's YOLO labels, lists, .names and .data."""


def _report(r) -> None:
    click.echo(f"{r.images} images, {r.boxes} boxes, {len(r.names)} classes -> {r.data_path}")
    click.echo(f"train: {r.train_count} images ({r.train_path}), valid: {r.valid_count} images ({r.valid_path})")
    if r.skipped:
        click.echo(f"skipped {len(r.skipped)} boxes:")
        for reason, n in sorted(r.skipped_counts().items()):
            click.echo(f"  {n:6d}  {reason}")
        for line in r.skipped[:20]:
            click.echo(f"    {line}")
        if len(r.skipped) > 20:
            click.echo(f"    ... and {len(r.skipped) - 20} more")


_common = [
    click.option("--images", "images", required=True, type=click.Path(file_okay=False, exists=True),
                 help="Folder with the images."),
    click.option("--out", "out", required=True, type=click.Path(file_okay=False),
                 help="Output folder (images/ links, labels/, lists, .names, .data)."),
    click.option("--valid-fraction", type=click.FloatRange(0, 1), default=0.1, show_default=True,
                 help="Share of images in valid.txt."),
    click.option("--seed", type=int, default=0, show_default=True, help="Seed of the train/valid split."),
    click.option("--name", default="dataset", show_default=True, help="Base name of the .names/.data files."),
]


def _with_common(f):
    for opt in reversed(_common):
        f = opt(f)
    return f


@labels.command("from-coco", context_settings=CONTEXT)
@click.argument("annotations", type=click.Path(dir_okay=False, exists=True))
@_with_common
def from_coco(annotations, images, out, valid_fraction, seed, name):
    """Convert a COCO annotations JSON (instances_*.json)."""
    from .convert import convert_coco
    _report(convert_coco(annotations, images, out, valid_fraction=valid_fraction, seed=seed, name=name))


@labels.command("from-voc", context_settings=CONTEXT)
@click.argument("annotations", type=click.Path(file_okay=False, exists=True))
@_with_common
@click.option("--classes", help="Comma-separated class names (default: every name seen, sorted).")
@click.option("--keep-difficult", is_flag=True, help="Keep difficult objects as ordinary boxes.")
def from_voc(annotations, images, out, valid_fraction, seed, name, classes, keep_difficult):
    """Convert a folder of VOC XML files (Annotations/)."""
    from .convert import convert_voc
    names = [c.strip() for c in classes.split(",")] if classes else None
    _report(convert_voc(annotations, images, out, valid_fraction=valid_fraction, seed=seed, name=name,
                        names=names, keep_difficult=keep_difficult))


@click.command("augment-preview", context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False, exists=True))
@click.option("--data", "data", type=click.Path(dir_okay=False), help="The .data file (default: by convention).")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Folder for the images.")
@click.option("-n", "count", type=click.IntRange(min=1), default=8, show_default=True, help="How many images.")
@click.option("--seed", type=int, default=0, show_default=True, help="Augmentation seed (training's, per batch).")
def augment_preview(cfg, data, out, count, seed):
    """Write N training samples of CFG's detector as the net sees them (jitter, HSV, flip and the
    [net] mosaic/mixup/cutmix/blur/gaussian_noise/letter_box options), with their boxes drawn
    (Darknet's -show_imgs). Sample i is item i of the train list, drawn with augment_rng(seed, i)."""
    import os

    from .augment import preview_images
    from .datafile import resolve_data_file

    paths = preview_images(cfg, resolve_data_file(cfg, data), out, count, seed)
    click.echo(f"wrote {len(paths)} images to {os.path.abspath(out)}")
