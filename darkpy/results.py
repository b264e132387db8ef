"""Detection results for other tools, and Darknet's recall report: the library behind `darkpy valid`
on a detector and `darkpy recall`.

- COCO results JSON (`coco_results.json`): one entry per (box, class) with probability > 0:
  `image_id`, `category_id`, `bbox` [x, y, w, h] in pixels (corners clipped to the image, as
  Darknet's print_cocos) and `score`. `category_id` is COCO's 91-id numbering when the names are
  COCO's 80 (Darknet's coco_ids), else the class index. `image_id` is the trailing number of the image
  file's stem (`COCO_val2014_000000000042.jpg` -> 42, `000123.jpg` -> 123); a stem without one
  gets its 1-based position in the list (darkpy: Darknet would write 0).
- VOC files (`comp4_det_test_<class>.txt`): `<stem> <prob> <xmin> <ymin> <xmax> <ymax>` per (box, class)
  with probability > 0, 1-based pixel corners clipped to [1, w] x [1, h] (Darknet's
  print_detector_detections), ready for voc_eval.py.
- `recall_report`: Darknet's validate_detector_recall: images stretched to the net, candidates with
  objectness > .001, class-agnostic objectness NMS at .4; per truth the best IoU among them; a truth
  is found when that IoU is > .5. One line per image, as Darknet prints it.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence

import numpy as np

from .metrics import COCO_IDS, _corners, _iou_matrix, coco_pixel_boxes, voc_corners

#: the first and last of COCO's 80 names (coco.names): when both match, COCO's ids are used
_COCO_FIRST_LAST = ("person", "toothbrush")


def is_coco_names(names: Sequence[str] | None) -> bool:
    return bool(names) and len(names) == 80 and (names[0], names[-1]) == _COCO_FIRST_LAST


def coco_image_id(path: str, position: int) -> int:
    """The trailing number of the file's stem, else `position` (1-based place in the list)."""
    m = re.search(r"(\d+)$", os.path.splitext(os.path.basename(path))[0])
    return int(m.group(1)) if m else position


def coco_results(run) -> list[dict]:
    """The COCO results entries of a `detect.run_valid` pass (module doc)."""
    coco = is_coco_names(run.names)
    out = []
    for k, (path, size, dets) in enumerate(zip(run.paths, run.sizes, run.detections)):
        image_id = coco_image_id(path, k + 1)
        boxes = coco_pixel_boxes(np.asarray(dets.boxes, np.float64).reshape(-1, 4), size, clip=True)
        rows, cls = np.nonzero(np.asarray(dets.probs)[:, :run.classes] > 0)
        for i, c in zip(rows, cls):
            out.append({"image_id": image_id, "category_id": COCO_IDS[c] if coco else int(c),
                        "bbox": [round(float(v), 4) for v in boxes[i]], "score": round(float(dets.probs[i, c]), 6)})
    return out


def write_coco_results(run, path: str) -> int:
    """Write `coco_results(run)` as a JSON list to `path`; returns the number of entries."""
    entries = coco_results(run)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(entries, f)
    return len(entries)


def write_voc_results(run, folder: str, prefix: str = "comp4_det_test_") -> list[str]:
    """One `<prefix><class name>.txt` per class in `folder` (module doc); returns the paths."""
    os.makedirs(folder, exist_ok=True)
    names = [run.names[c] if run.names and c < len(run.names) else str(c) for c in range(run.classes)]
    lines: list[list[str]] = [[] for _ in range(run.classes)]
    for path, size, dets in zip(run.paths, run.sizes, run.detections):
        stem = os.path.splitext(os.path.basename(path))[0]
        corners = voc_corners(np.asarray(dets.boxes, np.float64).reshape(-1, 4), size, clip=True)
        probs = np.asarray(dets.probs)
        for i in range(len(corners)):
            for c in np.flatnonzero(probs[i, :run.classes] > 0):
                x0, y0, x1, y1 = corners[i]
                lines[c].append(f"{stem} {probs[i, c]:f} {x0:f} {y0:f} {x1:f} {y1:f}\n")
    paths = []
    for c, name in enumerate(names):
        p = os.path.join(folder, f"{prefix}{name}.txt")
        with open(p, "w") as f:
            f.writelines(lines[c])
        paths.append(p)
    return paths


def nms_objectness(boxes: np.ndarray, objectness: np.ndarray, thresh: float) -> np.ndarray:
    """Darknet's do_nms_obj: rank by objectness (stable), drop any box overlapping a kept, higher one by
    more than `thresh`, whatever the classes. Returns the kept objectness (dropped ones zeroed)."""
    obj = np.array(objectness, np.float64)
    order = np.argsort(-obj, kind="mergesort")
    ious = _iou_matrix(_corners(boxes), _corners(boxes))
    for a, i in enumerate(order):
        if obj[i] == 0:
            continue
        later = order[a + 1:]
        obj[later[ious[i, later] > thresh]] = 0
    return obj


def recall_report(net, data_cfg, limit: int | None = None, thresh: float = 0.001, iou_thresh: float = 0.5,
                  nms: float = 0.4, echo: Callable[[str], None] | None = None) -> dict:
    """Darknet's `detector recall` (module doc) over the `valid` list. `echo` gets each per-image line
    `i correct total  RPs/Img: .. IOU: ..% Recall: ..%`; returns the final numbers."""
    from .detect import run_valid

    run = run_valid(net, data_cfg, thresh=thresh, nms=0, letterbox=False, limit=limit)
    total = correct = proposals = 0
    iou_sum = 0.0
    for i, (dets, truth, dif) in enumerate(zip(run.detections, run.truths, run.difficult)):
        truth = truth[~dif]
        obj = nms_objectness(dets.boxes, dets.objectness, nms) if nms else np.asarray(dets.objectness)
        live = obj > thresh
        proposals += int(live.sum())
        if len(truth):
            ious = _iou_matrix(_corners(truth), _corners(np.asarray(dets.boxes)[live]))
            best = ious.max(axis=1, initial=0.0)
            total += len(truth)
            iou_sum += float(best.sum())
            correct += int((best > iou_thresh).sum())
        if echo is not None:
            iou_pct = iou_sum * 100 / total if total else 0.0
            rec = 100.0 * correct / total if total else 0.0
            echo(f"{i:5d} {correct:5d} {total:5d}\tRPs/Img: {proposals / (i + 1):.2f}\tIOU: {iou_pct:.2f}%"
                 f"\tRecall:{rec:.2f}%")
    return {"images": len(run.paths), "correct": correct, "total": total, "proposals": proposals,
            "avg_iou": iou_sum / total if total else 0.0, "recall": correct / total if total else 0.0}
