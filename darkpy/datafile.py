"""The .data file of a run and what it names: finding it by the cfg's name, its classes and labels
checked against the network, its image lists, and the dataset object a run reads."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import DataError


def cfg_base(cfg_path: str | os.PathLike) -> str:
    """Darknet's `<cfgbase>`: the file name without its folder, cut at the first dot."""
    return os.path.basename(os.fspath(cfg_path)).split(".", 1)[0]


def data_candidates(cfg_path: str | os.PathLike) -> list[Path]:
    """Where the .data file of a cfg is looked for, in order.

    Names: `<cfgbase>.data`, then the name cut at its first '-' (so cfg/shapes-tiny.cfg also finds
    data/shapes.data: a family of cfgs shares one dataset). Each name is looked for in data/ beside
    the cfg folder (cfg/x.cfg -> data/x.data), then in data/ under the current directory, then beside
    the cfg; every place for the full name before any for the cut one."""
    cfg = Path(cfg_path)
    base = cfg_base(cfg)
    unique: list[Path] = []
    for stem in (base, base.split("-", 1)[0]):
        if not stem:
            continue
        name = stem + ".data"
        for p in (cfg.parent.parent / "data" / name, Path("data") / name, cfg.parent / name):
            if p not in unique:
                unique.append(p)
    return unique


def find_data_file(cfg_path: str | os.PathLike) -> Path | None:
    for p in data_candidates(cfg_path):
        if p.is_file():
            return p
    return None


def resolve_data_file(cfg_path, data) -> Path:
    """The given .data file, or the one found by convention; a DataError naming the fix otherwise."""
    if data is not None:
        p = Path(data)
        if not p.is_file():
            raise DataError(f"{p}: no such .data file" + (" (it is a folder)" if p.is_dir() else ""))
        return p
    found = find_data_file(cfg_path)
    if found is None:
        looked = ", ".join(str(p) for p in data_candidates(cfg_path))
        raise DataError(f"{cfg_path}: no .data file found (looked for {looked}); pass --data FILE")
    return found


def is_detector(net) -> bool:
    """A net whose last layer reads its own truth layout (yolo/region/detection: boxes)."""
    return bool(net.layers[-1].truths)


def load_data_config(path):
    from .datasets import read_data_file
    return read_data_file(os.fspath(path))


def class_names(dc) -> list[str] | None:
    return list(dc.names or dc.labels) or None


def check_classes(net, dc) -> None:
    """The .data file's classes (and labels) must fit the network's output."""
    if "text" in dc.raw:                 # text: bytes, checked by textdata.TextData
        return
    if is_detector(net):
        classes = getattr(net.layers[-1], "classes", None)
        if classes is not None and dc.classes and classes != dc.classes:
            raise DataError(f"{dc.path}: classes={dc.classes} but the last layer of {net.file} has "
                            f"classes={classes}; make them equal")
        return
    out = net.output_layer.outputs
    if dc.classes != out:
        raise DataError(f"{dc.path}: classes={dc.classes} but {net.file} outputs {out} values per image; "
                        f"set classes={out} in {dc.path} or give the last layer {dc.classes} filters/outputs")


def classifier_labels(dc) -> list[str]:
    labels = list(dc.labels or dc.names)
    if not labels:
        raise DataError(f"{dc.path}: no labels= (or names=) file; a classifier needs one label per class")
    if len(labels) != dc.classes:
        key = "labels" if "labels" in dc.raw else "names"
        raise DataError(f"{dc.raw.get(key, dc.path)}: has {len(labels)} labels but {dc.path} says "
                        f"classes={dc.classes}; make them agree")
    return labels


def check_labels(paths: Sequence[str], labels: Sequence[str], list_file: str) -> np.ndarray:
    """Each image's class, checked up front so a bad name stops training before it starts (one
    line: the first bad entry, and how many more there are)."""
    from .datasets import classifier_label

    out = np.empty(len(paths), np.int64)
    first, bad = "", 0
    for i, p in enumerate(paths):
        try:
            out[i] = classifier_label(p, labels)
        except DataError as e:
            bad += 1
            first = first or f"{list_file}:{i + 1}: {e}"
    if bad:
        more = f" (and {bad - 1} more of the {len(paths)} images)" if bad > 1 else ""
        raise DataError(first + more)
    return out


def make_dataset(net, dc, paths: list[str], augment: bool, labels: list[str] | None = None):
    from .datasets import ClassifierData, DetectionData
    from .textdata import is_text_data, make_text_dataset

    if is_text_data(dc):
        return make_text_dataset(net, dc)
    if is_detector(net):
        last = net.layers[-1]
        return DetectionData(paths, dc.classes, net.config, max_boxes=net.truths // 5, augment=augment,
                             jitter=getattr(last, "jitter", 0.2))
    return ClassifierData(paths, labels, net.config, augment=augment, channels=net.input_shape[0])


def read_image_list(path: str | None, what: str, data_path) -> list[str]:
    from .datasets import read_list

    if not path:
        raise DataError(f"{data_path}: no {what}= list file; add one (one image path per line)")
    paths = read_list(path)
    if not paths:
        raise DataError(f"{path}: the {what} list is empty; add image paths, one per line")
    return paths



def require_lists(dc, keys: Sequence[str]) -> None:
    """Raise now, not after training, the error of a list among `keys` that a run will read but
    that does not exist (the .data file's lists are otherwise checked when read)."""
    from .dataformats import MissingFile

    for key in keys:
        value = getattr(dc, key, None)
        if isinstance(value, MissingFile):
            raise DataError(value.error)


def positive_int(value, default: int, key: str, data_path) -> int:
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n <= 0:
        raise DataError(f"{data_path}: {key} must be a positive integer (got {value!r})")
    return n

