"""What mosaic does to the boxes the shapes detector trains on: training samples drawn with and
without `mosaic=1 mosaic_bound=1` from the same images, and per arm the boxes per image, their
smallest side in pixels, how much of each mosaic box survives its quadrant, and how well
cfg/shapes-tiny.cfg's anchors fit them (the best anchor's IoU, boxes and anchors centred together).

    python benchmarks/mosaic_boxes.py --data /tmp/mosaic/shapes128 --samples 2000 [--anchors 6]

`--anchors N`: per arm, N anchors by `darkpy anchors`' k-means (1 - IoU, k-means++ seed 0, best of 10)
over the boxes that arm feeds the net, rounded to whole pixels, with their average IoU: the anchors
for what mosaic trains on, where `darkpy anchors` clusters the label files.
`--data` is a dataset folder written by benchmarks/mosaic_map.py (its train.list is read).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ANCHORS = np.array([16, 22, 28, 36, 44, 54], float)      # cfg/shapes-tiny.cfg, square, 128 px


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--anchors", type=int, default=0, help="k-means this many anchors on each arm's boxes")
    a = p.parse_args()

    import darkpy.augment as augment
    from darkpy.augment import AugmentOptions, augmented_sample
    from darkpy.batches import augment_rng
    from darkpy.datasets import DetectionData, read_list

    paths = read_list(str(Path(a.data) / "train.list"))
    data = DetectionData(paths, 4, None, augment=True, jitter=0.2, hue=0.1, saturation=1.5, exposure=1.5)
    kept = []                      # per mosaic box: the area left after clipping / the area before
    real_move = augment._move_boxes

    def recording(boxes, sh_x, sh_y, quadrant, w, h, opt):
        out = real_move(boxes, sh_x, sh_y, quadrant, w, h, opt)
        # the boxes that survive keep their order; their unclipped area is that of the same row
        full = boxes[:, 2] * boxes[:, 3]
        qx, qy, qw, qh = quadrant
        x0, x1 = boxes[:, 0] - boxes[:, 2] / 2 + sh_x, boxes[:, 0] + boxes[:, 2] / 2 + sh_x
        y0, y1 = boxes[:, 1] - boxes[:, 3] / 2 + sh_y, boxes[:, 1] + boxes[:, 3] / 2 + sh_y
        vis_w = np.clip(np.minimum(x1, (qx + qw) / w) - np.maximum(x0, qx / w), 0, None)
        vis_h = np.clip(np.minimum(y1, (qy + qh) / h) - np.maximum(y0, qy / h), 0, None)
        frac = vis_w * vis_h / np.maximum(full, 1e-12)
        kept.extend(frac[(vis_w * w > 1) & (vis_h * h > 1)].tolist())
        return out

    augment._move_boxes = recording
    s = a.size
    for name, opt in (("plain", AugmentOptions()), ("mosaic", AugmentOptions(mosaic=True, mosaic_bound=True))):
        kept.clear()
        n_boxes, sides, ious, mosaics, only, wh = [], [], [], 0, [], []
        for k in range(a.samples):
            before = len(kept)
            if opt.active:
                _, boxes = augmented_sample(data, k % len(paths), augment_rng(1, k), s, s, opt)
            else:
                _, boxes = data._augment(data._cache.get(k % len(paths), paths[k % len(paths)], 3),
                                         data.boxes(k % len(paths)), augment_rng(1, k), s, s)
            is_mosaic = len(kept) > before
            mosaics += is_mosaic
            n_boxes.append(len(boxes))
            bw, bh = boxes[:, 2] * s, boxes[:, 3] * s
            sides.extend(np.minimum(bw, bh).tolist())
            wh.append(np.stack([bw, bh], axis=1))
            if is_mosaic:
                only.append((len(boxes), np.minimum(bw, bh)))
            inter = np.minimum(bw[:, None], ANCHORS) * np.minimum(bh[:, None], ANCHORS)
            iou = inter / (bw[:, None] * bh[:, None] + ANCHORS ** 2 - inter)
            ious.extend(iou.max(axis=1).tolist())
        sides, ious = np.array(sides), np.array(ious)
        line = (f"{name:6s} samples {a.samples} (mosaics {mosaics}), boxes/image {np.mean(n_boxes):.2f}, "
                f"min side px: median {np.median(sides):.1f}, <6 px {np.mean(sides < 6):.1%}, "
                f"<12 px {np.mean(sides < 12):.1%}; best-anchor IoU mean {ious.mean():.3f}, <0.5 {np.mean(ious < 0.5):.1%}")
        if kept:
            f = np.array(kept)
            line += f"; mosaic boxes cut by their quadrant: {np.mean(f < 0.999):.1%}, <50 % left {np.mean(f < 0.5):.1%}"
            ms = np.concatenate([m for _, m in only])
            line += (f"; the mosaics alone: boxes/image {np.mean([n for n, _ in only]):.2f}, "
                     f"min side median {np.median(ms):.1f} px, <6 px {np.mean(ms < 6):.1%}")
        print(line, flush=True)
        if a.anchors:
            from darkpy.anchors import average_iou, kmeans_iou
            boxes = np.concatenate(wh).astype(np.float64)
            c = np.maximum(np.round(kmeans_iou(boxes, a.anchors, 0, 10)), 1)
            c = c[np.argsort(c[:, 0] * c[:, 1], kind="mergesort")]
            text = ", ".join(f"{int(w)},{int(h)}" for w, h in c)
            print(f"{name:6s} {a.anchors} anchors on its {len(boxes)} boxes: {text} (avg IoU "
                  f"{average_iou(boxes, c):.3f}; cfg's {average_iou(boxes, np.stack([ANCHORS, ANCHORS], 1)):.3f})",
                  flush=True)


if __name__ == "__main__":
    main()
