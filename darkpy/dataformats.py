"""Darknet's dataset files (spec §10): `.data` files, list and names files, classifier labels and
detector label files. Darknet's formats are followed, and where Darknet fails silently or crashes,
darkpy reports a `DataError` naming the file and line instead:
- `.data`: Darknet's line rules (whole-line `#`/`;` comments, all whitespace removed); a referenced
  file that exists in neither the current directory nor the `.data` file's folder is an error, an
  unknown key a warning. CRLF and a UTF-8 BOM are accepted (Darknet keeps the `\\r`).
- classifier labels: Darknet's substring rule, but a path must match exactly one label (Darknet only
  prints "Too many or too few labels" and trains on a wrong truth row).
- detector label files: malformed lines are collected as "file:line: reason" and skipped (Darknet
  stops reading the file at the first one), never trained on.
"""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .errors import DataError

class DataWarning(UserWarning):
    """A data-file problem that does not stop training (e.g. an unknown `.data` key)."""


# Keys either Darknet reads from a .data file (spec §10.1).
KNOWN_DATA_KEYS = frozenset("""
classes train valid test names labels backup top eval results map tree leaves tag difficult saveweights savelast
text sequences pad answer_after pack
""".split())
# Keys whose value is a file that must exist.
FILE_KEYS = ("train", "valid", "test", "names", "labels", "map", "tree", "leaves", "difficult")
EVAL_KINDS = ("voc", "coco", "imagenet")
_WS = re.compile(r"\s+")


# ---------------------------------------------------------------------------------------------------
# .data, list and names files
# ---------------------------------------------------------------------------------------------------
@dataclass
class DataConfig:
    """A parsed `.data` file. File paths are resolved (see `read_data_file`); `raw` holds every key
    as written (whitespace removed), including ones darkpy does not interpret."""

    path: str
    classes: int
    train: str | None = None
    valid: str | None = None
    names: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    backup: str | None = None
    top: int = 1
    eval: str = "voc"
    raw: dict[str, str] = field(default_factory=dict)


class MissingFile(str):
    """A `.data` list path (train, valid, test) that does not exist: the path as written, carrying the
    error a read of it raises (`read_list`). The check is made when a command reads the list, so
    `map` (which reads only `valid`) does not need the train list to exist."""

    error: str = ""

    def __new__(cls, value: str, error: str) -> "MissingFile":
        obj = super().__new__(cls, value)
        obj.error = error
        return obj


#: `.data` keys naming image lists: checked when a command reads them (see MissingFile)
LIST_KEYS = ("train", "valid", "test")


def _resolve(entry: str, folder: str) -> str | None:
    """An existing path for `entry`: as given (absolute, or relative to the current directory), else
    relative to `folder`; None if neither exists."""
    if os.path.exists(entry):
        return entry
    if not os.path.isabs(entry):
        alt = os.path.join(folder, entry)
        if os.path.exists(alt):
            return alt
    return None


def _read_lines(path: str, what: str) -> list[str]:
    if isinstance(path, MissingFile):
        raise DataError(path.error)
    try:
        with open(path, "r", encoding="utf-8-sig", errors="surrogateescape") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        raise DataError(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a {what}") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read {what} ({e.strerror})") from None


def read_data_file(path: str | os.PathLike) -> DataConfig:
    """Read a Darknet `.data` file (spec §10.1).

    Lines: whole-line `#`/`;` comments and blank lines skipped, all whitespace removed, `key=value`.
    A duplicate key keeps the first value (as Darknet) with a warning; an unknown key is warned about.
    File keys (train, valid, test, names, labels, map, tree, leaves, difficult) are resolved against
    the current directory first, then the `.data` file's folder; a missing one is a `DataError`
    `file.data:line key: no such file 'x' (...)`, raised here, except for the lists (train, valid,
    test): those raise it when read (`MissingFile`), so a command only needs the lists it reads. A
    path written with spaces gets an error saying .data paths cannot have them. `names` falls back to `labels` (as Darknet) and
    `labels` to `names` (darkpy: a classifier then needs only one list); `classes` defaults to the
    number of names, or Darknet's 2 without names. `backup` is None when absent (the caller's default
    applies, not Darknet's `/backup/`).
    """
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    raw: dict[str, str] = {}
    where: dict[str, int] = {}
    written: dict[str, str] = {}          # values as written, spaces kept (for the error about them)
    for n, line in enumerate(_read_lines(path, ".data file"), 1):
        s = _WS.sub("", line)
        if not s or s[0] in "#;":
            continue
        key, eq, value = s.partition("=")
        if not eq or not key:
            raise DataError(f"{path}:{n}: cannot parse {line.strip()!r} (expected key=value)")
        if not value:
            raise DataError(f"{path}:{n} {key}: no value after '='")
        if key in raw:
            warnings.warn(f"{path}:{n} {key}: duplicate key; the first value ({raw[key]!r}, line "
                          f"{where[key]}) is used, as Darknet does", DataWarning, stacklevel=2)
            continue
        if key not in KNOWN_DATA_KEYS:
            warnings.warn(f"{path}:{n} {key}: unknown .data key (value {value!r}); ignored",
                          DataWarning, stacklevel=2)
        raw[key], where[key] = value, n
        written[key] = line.partition("=")[2].strip()

    def err(key: str, msg: str) -> DataError:
        return DataError(f"{path}:{where[key]} {key}: {msg}")

    files: dict[str, str] = {}
    for key in FILE_KEYS:
        if key in raw:
            found = _resolve(raw[key], folder)
            if found is None:
                problem = err(key, _missing_message(raw[key], written[key], folder))
                if key not in LIST_KEYS:
                    raise problem
                found = MissingFile(raw[key], str(problem))
            files[key] = found

    def get_int(key: str, default: int) -> int:
        if key not in raw:
            return default
        try:
            return int(raw[key])
        except ValueError:
            raise err(key, f"not an integer (got {raw[key]!r})") from None

    names = read_names(files["names"]) if "names" in files else []
    labels = read_names(files["labels"]) if "labels" in files else []
    names = names or labels
    labels = labels or names
    classes = get_int("classes", len(names) if names else 2)
    if classes < 1:
        raise err("classes", f"must be >= 1 (got {classes})")
    if names and len(names) != classes:
        key = "names" if "names" in raw else "labels"
        warnings.warn(f"{path}:{where[key]} {key}: {len(names)} names for classes={classes}",
                      DataWarning, stacklevel=2)
    top = get_int("top", 1)
    ev = raw.get("eval", "voc")
    if ev not in EVAL_KINDS:
        raise err("eval", f"unknown kind {ev!r} (expected one of {', '.join(EVAL_KINDS)})")
    return DataConfig(path=path, classes=classes, train=files.get("train"), valid=files.get("valid"),
                      names=names, labels=labels, backup=raw.get("backup"), top=top, eval=ev, raw=raw)


def _missing_message(value: str, as_written: str, folder: str) -> str:
    """Why a .data file's path is not found: the places looked in, or, for a path written with
    spaces, that .data paths cannot have any."""
    if _WS.search(as_written):
        # darknet: every space of a .data line is removed (option_list.c strip), so a path with
        # spaces names another file; darkpy reads it the same way and says so.
        return (f"paths in .data files cannot contain spaces (Darknet removes every space from a "
                f".data line, so {as_written!r} reads as {value!r}, which does not exist); rename the file "
                f"or folder without spaces")
    looked = (f"looked in the current directory {os.getcwd()!r} and in the .data file's folder "
              f"{os.path.abspath(folder)!r}") if not os.path.isabs(value) else "absolute path"
    return f"no such file {value!r} ({looked})"


def read_list(path: str | os.PathLike) -> list[str]:
    """Read a list file: one path per line, `\\r` and surrounding whitespace stripped, blank lines
    skipped (Darknet strips only `\\n`). A relative entry is kept as written if it exists from the
    current directory, else taken relative to the list file's folder if it exists there, else kept
    as written (loading it then reports the missing file)."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    out = []
    for line in _read_lines(path, "list file"):
        entry = line.strip()
        if entry:
            out.append(_resolve(entry, folder) or entry)
    return out


def read_names(path: str | os.PathLike) -> list[str]:
    """Read a names/labels file: line i is the name of class i (surrounding whitespace and `\\r`
    stripped; trailing blank lines ignored). A blank line before the last name is a `DataError`,
    because it would be a class with an empty name that, as a label, matches every path."""
    path = os.fspath(path)
    lines = [line.strip() for line in _read_lines(path, "names file")]
    while lines and not lines[-1]:
        lines.pop()
    for n, name in enumerate(lines, 1):
        if not name:
            raise DataError(f"{path}:{n}: empty class name (each line names class line-1; remove "
                            f"the blank line)")
    return lines


# ---------------------------------------------------------------------------------------------------
# labels
# ---------------------------------------------------------------------------------------------------
def classifier_label(image_path: str, labels: Sequence[str]) -> int:
    """The class of an image for a classifier: the one label that is a substring of its path.

    Darknet sets truth j for every label j found anywhere in the path (`strstr`) and trains on
    whatever that gives, warning "Too many or too few labels". darkpy looks in the file name first,
    so a directory name that happens to contain another label (e.g. `cats/dog_1.jpg` with labels
    cat, dog) does not spoil it; only if no label occurs in the file name is the whole path used.
    Zero or several matches (at the level where the first match was found) is a `DataError` naming
    the file and the candidates. As in Darknet, a single-label set allows no match: -1 (negative).
    """
    name = os.path.basename(image_path)
    hits = [j for j, lab in enumerate(labels) if lab and lab in name]
    where = "file name"
    if not hits:
        hits = [j for j, lab in enumerate(labels) if lab and lab in image_path]
        where = "path"
    if len(hits) == 1:
        return hits[0]
    if not hits:
        if len(labels) == 1:
            return -1
        shown = ", ".join(repr(x) for x in labels[:10]) + (f", ... ({len(labels)} in all)" if len(labels) > 10 else "")
        raise DataError(f"{image_path}: no class label occurs in the path (each image path must contain "
                        f"exactly one of the labels: {shown})")
    found = ", ".join(f"{labels[j]!r} (class {j})" for j in hits)
    raise DataError(f"{image_path}: several class labels occur in the {where}: {found}; each image "
                    f"must match exactly one label, so rename the file or make the labels distinct")


# Darknet's (P) successive first-occurrence replacements that turn an image path into its label path.
_P_LABEL_REPLACEMENTS = (("images", "labels"), ("JPEGImages", "labels"), ("raw", "labels"),
                         (".jpg", ".txt"), (".png", ".txt"), (".JPG", ".txt"), (".JPEG", ".txt"))
_LABEL_DIRS = ("images", "JPEGImages", "raw")


def label_path_candidates(image_path: str) -> list[str]:
    """Where a detection image's label file may be, in the order tried (distinct, never the image):

    1. Darknet's (P) path: first-occurrence substring replacements images→labels, JPEGImages→labels,
       raw→labels, then .jpg/.png/.JPG/.JPEG→.txt, on the whole path. Kept first so a project that
       works with Darknet finds the same files. It has pitfalls: "raw" matches inside "drawings",
       "images" inside "myimages".
    2. The same with only whole directory names images/JPEGImages/raw replaced and the extension
       replaced at the end, which avoids those pitfalls.
    3. The .txt beside the image (AlexeyAB's layout).
    """
    p = image_path
    for a, b in _P_LABEL_REPLACEMENTS:
        p = p.replace(a, b, 1)
    stem = os.path.splitext(image_path)[0]
    parts = re.split(r"([/\\])", stem)
    dirs = ["labels" if (i < len(parts) - 1 and part in _LABEL_DIRS) else part for i, part in enumerate(parts)]
    out = []
    for cand in (p, "".join(dirs) + ".txt", stem + ".txt"):
        if cand != image_path and cand not in out:
            out.append(cand)
    return out


def label_path_for(image_path: str) -> str:
    """The label file of a detection image: the first candidate of `label_path_candidates` that
    exists, or Darknet's own path (the first candidate) when none does."""
    cands = label_path_candidates(image_path)
    for c in cands:
        if os.path.isfile(c):
            return c
    return cands[0]


def read_box_labels(path: str, classes: int) -> tuple[np.ndarray, list[str]]:
    """Read a detector label file: lines `class x_center y_center width height`, normalised to [0,1].

    Returns boxes float32 (n, 5) as [x, y, w, h, class] and the bad lines, each "file:line: reason"
    (not 5 fields, unparsable, class outside [0, classes), x/y/w/h outside [0,1], w or h <= 0).
    Bad lines are skipped; the rest of the file is still read. A missing file is a `DataError`.
    """
    boxes, bad = [], []
    for n, line in enumerate(_read_lines(path, "label file"), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 5:
            bad.append(f"{path}:{n}: expected 5 fields 'class x y w h', got {len(parts)}")
            continue
        try:
            cls = int(parts[0])
            x, y, w, h = (float(v) for v in parts[1:])
        except ValueError:
            bad.append(f"{path}:{n}: cannot parse {line.strip()!r} (expected an integer class and 4 numbers)")
            continue
        if not 0 <= cls < classes:
            bad.append(f"{path}:{n}: class {cls} out of range (classes={classes})")
        elif not (w > 0 and h > 0):
            bad.append(f"{path}:{n}: box width and height must be > 0 (got w={w:g}, h={h:g})")
        elif not all(0 <= v <= 1 for v in (x, y, w, h)):
            bad.append(f"{path}:{n}: coordinates outside [0,1] (x={x:g} y={y:g} w={w:g} h={h:g}); "
                       f"labels are normalised by the image size")
        else:
            boxes.append((x, y, w, h, cls))
    return np.array(boxes, np.float32).reshape(-1, 5), bad
