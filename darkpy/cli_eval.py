"""Detector evaluation commands: `darkpy recall`, and `valid_detector` which `darkpy valid` calls for
a detector cfg (results files for pycocotools and voc_eval.py). `cli.py` adds them with
`register(main)`; the library is results.py."""
from __future__ import annotations

import json
import os

import click

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def register(group: click.Group) -> None:
    group.add_command(recall_command)


def cfg_is_detector(cfg: str) -> bool:
    """Whether the cfg has a [yolo], [region] or [detection] section (read without building it)."""
    from .cfg import load_cfg
    from .errors import DarkpyError
    try:
        doc = load_cfg(cfg)
    except (DarkpyError, OSError, UnicodeError):   # the classifier path reports it properly
        return False
    return any(s.kind in ("yolo", "region", "detection") for s in doc.layers)


def valid_detector(cfg: str, weights: str, data: str | None, as_json: bool, out: str | None = None) -> None:
    """`darkpy valid` on a detector: Darknet's validate_detector (thresh .005, NMS .45) over the
    `valid` list, writing `<results>/coco_results.json` and `<results>/comp4_det_test_<class>.txt`
    (`results=` of the .data file, default `results`)."""
    from .cli_detect import _load_detector
    from .datasets import read_data_file
    from .detect import run_valid
    from .results import write_coco_results, write_voc_results
    from .datafile import resolve_data_file

    data_path = resolve_data_file(cfg, data)
    dc = read_data_file(os.fspath(data_path))
    folder = out or dc.raw.get("results", "results")
    net = _load_detector(cfg, weights, batch=8)
    run = run_valid(net, dc)
    coco_path = os.path.join(folder, "coco_results.json")
    n = write_coco_results(run, coco_path)
    voc = write_voc_results(run, folder)
    if as_json:
        click.echo(json.dumps({"images": len(run.paths), "coco_results": coco_path, "entries": n, "voc": voc}))
    else:
        click.echo(f"{len(run.paths)} images: {n} detections -> {coco_path}; VOC files "
                   f"{os.path.join(folder, 'comp4_det_test_<class>.txt')} ({len(voc)} classes)")


@click.command("recall", context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.argument("weights", type=click.Path(dir_okay=False))
@click.option("--data", "data", type=click.Path(dir_okay=False), help="The .data file (default: by convention).")
@click.option("--limit", type=click.IntRange(min=1), help="Only the first N images of the list.")
@click.option("--json", "as_json", is_flag=True, help="Print only the final numbers, as JSON.")
def recall_command(cfg, weights, data, limit, as_json):
    """Darknet's recall report on the `valid` list: per image, truths found (best IoU > .5 among the
    proposals with objectness > .001 after objectness NMS), proposals per image, average IoU, recall."""
    from .cli_detect import _load_detector
    from .results import recall_report
    from .datafile import resolve_data_file

    data_path = resolve_data_file(cfg, data)
    net = _load_detector(cfg, weights, batch=8)
    r = recall_report(net, data_path, limit=limit, echo=None if as_json else click.echo)
    if as_json:
        click.echo(json.dumps(r))
