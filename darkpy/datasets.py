"""Datasets: classifier and detector batch assembly and the background loader; the files they read
(`.data`, list, names and label files) are parsed by darkpy/dataformats.py.

Batches are pure functions of their arguments: `load(indices, rng, w, h)` draws all its randomness
from `rng`, so a trainer that seeds `rng` from (seed, iteration) gets the same batch every time, on
the loader thread or not. `rng` is one generator for the whole batch, or a sequence of one per image
(the trainer's: each image's augmentation is then independent of which other images share its batch,
so a rank that loads part of a batch augments its images as one process would); one generator
gives the same result as that generator repeated once per image.
"""
from __future__ import annotations

import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .dataformats import (DataConfig, DataWarning, classifier_label,  # noqa: F401
                          label_path_candidates, label_path_for, read_box_labels, read_data_file,
                          read_list, read_names)
from .errors import DataError
from .images import (AUGMENT_DRAWS, DISTORT_DRAWS, augment_batch, center_crop_image, distort_args,
                     flip_distort_inplace, letterbox_size, load_image, place_image, rand_uniform, resize_image)

#: The dataset files' readers (darkpy/dataformats.py) are imported from here too.
__all__ = [
    "DataWarning", "DataConfig", "read_data_file", "read_list", "read_names", "classifier_label",
    "label_path_for", "label_path_candidates", "read_box_labels", "ClassifierData", "DetectionData",
    "BatchLoader",
]


# ---------------------------------------------------------------------------------------------------
# batch assembly
# ---------------------------------------------------------------------------------------------------
def _net(net_cfg: Any, key: str, default: float) -> Any:
    """A [net] setting from a NetConfig (or anything with those attributes), with Darknet's default."""
    value = getattr(net_cfg, key, None) if net_cfg is not None else None
    return default if value is None else value


def _per_image(rng, n: int) -> list[np.random.Generator]:
    """`rng` as one generator per image: a single generator is shared (drawn from in image order)."""
    if isinstance(rng, np.random.Generator):
        return [rng] * n
    rngs = list(rng)
    if len(rngs) != n:
        raise ValueError(f"{len(rngs)} generators for {n} images")
    return rngs


class _ImageCache:
    """Decoded images kept in memory up to a byte budget (small datasets are decoded once)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.used = 0
        self.images: dict[int, np.ndarray] = {}
        self.lock = threading.Lock()

    def get(self, key: int, path: str, channels: int) -> np.ndarray:
        img = self.images.get(key)
        if img is None:
            img = load_image(path, channels)
            with self.lock:
                if self.used + img.nbytes <= self.budget and key not in self.images:
                    self.images[key] = img   # callers never modify images in place
                    self.used += img.nbytes
        return img


def smooth_labels(y: np.ndarray, eps: float) -> np.ndarray:
    """The fork's [net] label_smooth_eps (fill_truth_smooth): one-hot rows become 1 - eps for the class
    and eps/(k-1) for the others; `y` itself when eps is 0."""
    if not eps:
        return y
    k = y.shape[1]
    return np.where(y > 0, 1 - eps, eps / max(k - 1, 1)).astype(y.dtype)


class ClassifierData:
    """Classifier batches: images with one-hot truth from `classifier_label` (spec §10.3, §11).

    With `augment`, each image goes through Darknet's `load_data_augment`: centre crop (`center=1`)
    or `random_augment_image` with min/max = int(min_ratio·w), int(max_ratio·w), then a flip with
    p=1/2 (if `flip`), then `random_distort_image`; the result equals those functions applied in turn
    with the same generator, but is computed in place with one draw call per image. Without it, a
    plain `resize_image` to w×h. `net_cfg` supplies min_ratio/max_ratio/angle/aspect/hue/saturation/
    exposure/flip/center (Darknet's defaults where it is None; like Darknet's loader, an aspect,
    saturation or exposure of 0 means 1). Labels for every path are resolved here, so a path without
    a unique label fails before training starts.
    """

    def __init__(self, paths: Sequence[str], labels: Sequence[str], net_cfg: Any = None, augment: bool = True,
                 channels: int = 3, cache_bytes: int = 256 << 20):
        self.paths = list(paths)
        self.labels = list(labels)
        self.classes = len(self.labels)
        self.augment = augment
        self.channels = channels
        cfg = net_cfg
        self.center = bool(_net(cfg, "center", 0))
        self.min_ratio, self.max_ratio = _net(cfg, "min_ratio", 1.0), _net(cfg, "max_ratio", 2.0)
        self.angle, self.aspect = _net(cfg, "angle", 0.0), _net(cfg, "aspect", 1.0) or 1.0
        self.hue = _net(cfg, "hue", 0.0)
        self.saturation = _net(cfg, "saturation", 1.0) or 1.0
        self.exposure = _net(cfg, "exposure", 1.0) or 1.0
        self.flip = bool(_net(cfg, "flip", 1))
        self.label_smooth_eps = float(_net(cfg, "label_smooth_eps", 0.0))
        truth, errors = [], []
        for p in self.paths:
            try:
                truth.append(classifier_label(p, self.labels))
            except DataError as e:
                errors.append(str(e))
                truth.append(-1)
        if errors:
            more = f"\n... and {len(errors) - 5} more" if len(errors) > 5 else ""
            raise DataError(f"{len(errors)} of {len(self.paths)} images have no unique class label:\n"
                            + "\n".join(errors[:5]) + more)
        self.truth = np.array(truth, np.int64)
        self._cache = _ImageCache(cache_bytes)

    def __len__(self) -> int:
        return len(self.paths)

    def load(self, indices: Iterable[int], rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
        """Images `indices` as x float32 (n, channels, h, w) and one-hot y float32 (n, classes).
        `rng`: a generator, or one per image."""
        indices = list(indices)
        x = np.empty((len(indices), self.channels, h, w), np.float32)
        y = np.zeros((len(indices), self.classes), np.float32)
        imgs = [self._cache.get(k, self.paths[k], self.channels) for k in indices]
        if self.augment:
            self._augment(x, imgs, rng, w, h)
        else:
            for i, img in enumerate(imgs):
                x[i] = img if img.shape[1:] == (h, w) else resize_image(img, w, h)
        for i, k in enumerate(indices):
            if self.truth[k] >= 0:
                y[i, self.truth[k]] = 1
        return x, smooth_labels(y, self.label_smooth_eps)

    def _augment(self, x: np.ndarray, imgs: list[np.ndarray], rng, w: int, h: int) -> None:
        n = len(imgs)
        if n == 0:
            return
        rngs = _per_image(rng, n)
        if self.center:
            u = np.stack([g.random(1 + DISTORT_DRAWS) for g in rngs])   # per image: flip coin, distortion
            for i, img in enumerate(imgs):
                x[i] = center_crop_image(img, w, h)
                hsv = distort_args(self.hue, self.saturation, self.exposure, u[i, 1:])
                flip_distort_inplace(x[i], u[i, 0] < 0.5 and self.flip, *hsv)
            return
        u = np.stack([g.random(AUGMENT_DRAWS + 1 + DISTORT_DRAWS) for g in rngs])   # per image: crop, flip, distortion
        lo = int(self.min_ratio * w)   # darknet: the ratios scale the net width, truncated
        hi = int(self.max_ratio * w)
        args = (self.angle, self.aspect, lo, hi, self.hue, self.saturation, self.exposure, self.flip)
        if all(img.shape == imgs[0].shape for img in imgs):
            augment_batch(x, np.stack(imgs), *args, u)   # one kernel call for the whole batch
        else:
            for i, img in enumerate(imgs):
                augment_batch(x[i:i + 1], img[None], *args, u[i:i + 1])


class DetectionData:
    """Detector batches: images and packed truth boxes (spec §10.4, §11 "Detector").

    With `augment`, Darknet's `load_data_detection` per image: random aspect jitter (±jitter of each
    side), the image placed to fill one full dimension at a random offset on a 0.5 canvas, HSV
    distortion, a flip with p=1/2 (if `flip`), boxes moved and mirrored with it, clamped to [0,1],
    truncated to `max_boxes` after a shuffle, and boxes under .001 wide or high dropped. Without it,
    a letterbox (as Darknet's validation) and the boxes mapped into it.

    Label files are found by `label_path_for`. Bad label lines and images without a label file are
    collected in `bad_labels` ("file:line: reason"), never trained on; `write_bad_labels` saves them.
    hue/saturation/exposure/flip default to `net_cfg`'s values.
    """

    def __init__(self, paths: Sequence[str], classes: int, net_cfg: Any = None, max_boxes: int = 90,
                 augment: bool = True, jitter: float = 0.2, hue: float | None = None,
                 saturation: float | None = None, exposure: float | None = None, flip: bool | None = None,
                 cache_bytes: int = 256 << 20):
        self.paths = list(paths)
        self.classes = classes
        self.max_boxes = max_boxes
        self.augment = augment
        self.jitter = jitter
        self.hue = _net(net_cfg, "hue", 0.0) if hue is None else hue
        self.saturation = (_net(net_cfg, "saturation", 1.0) if saturation is None else saturation) or 1.0
        self.exposure = (_net(net_cfg, "exposure", 1.0) if exposure is None else exposure) or 1.0
        self.flip = bool(_net(net_cfg, "flip", 1) if flip is None else flip)
        self.bad_labels: list[str] = []
        self._seen_bad: set[str] = set()
        self._lock = threading.Lock()
        self.label_paths: list[str | None] = []
        for p in self.paths:
            lp = label_path_for(p)
            if os.path.isfile(lp):
                self.label_paths.append(lp)
            else:
                self.label_paths.append(None)
                self._report([f"{p}: no label file (looked for {', '.join(label_path_candidates(p))}); "
                              f"trained as an image with no objects"])
        if self.paths and all(lp is None for lp in self.label_paths):
            raise DataError(f"none of the {len(self.paths)} images has a label file; e.g. "
                            f"{self.bad_labels[0]}")
        self._boxes: dict[int, np.ndarray] = {}
        self._cache = _ImageCache(cache_bytes)
        from .augment import AugmentOptions
        self.options = AugmentOptions.from_net(net_cfg)     # mosaic, mixup, ... (darkpy/augment.py)

    def __len__(self) -> int:
        return len(self.paths)

    def _report(self, lines: list[str]) -> None:
        with self._lock:
            for line in lines:
                if line not in self._seen_bad:
                    self._seen_bad.add(line)
                    self.bad_labels.append(line)

    def boxes(self, k: int) -> np.ndarray:
        """The valid boxes of image k, (n, 5) [x, y, w, h, class], as in its label file."""
        b = self._boxes.get(k)
        if b is None:
            lp = self.label_paths[k]
            if lp is None:
                b = np.zeros((0, 5), np.float32)
            else:
                b, bad = read_box_labels(lp, self.classes)
                self._report(bad)
            self._boxes[k] = b
        return b

    def bad_labels_summary(self, path: str | os.PathLike) -> str:
        """One line for the user: how many label lines (and images without a label file) were skipped,
        in how many files, and where the list is."""
        lines, files, unlabelled = 0, set(), 0
        for entry in self.bad_labels:
            m = re.match(r"^(.*):(\d+): ", entry)
            if m:
                lines += 1
                files.add(m[1])
            else:
                unlabelled += 1
        text = f"{lines} label line{'s' if lines != 1 else ''} skipped in {len(files)} file{'s' if len(files) != 1 else ''}"
        if unlabelled:
            text += f", {unlabelled} image{'s' if unlabelled != 1 else ''} without a label file"
        return f"{text}; see {os.fspath(path)}"

    def write_bad_labels(self, path: str | os.PathLike) -> int:
        """Write `bad_labels`, one per line; returns how many."""
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in self.bad_labels)
        return len(self.bad_labels)

    def load(self, indices: Iterable[int], rng: np.random.Generator, w: int, h: int,
             iteration: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Images `indices` as x float32 (n, 3, h, w) and truth float32 (n, max_boxes·5): rows of
        [x, y, w, h, class], zero-padded (a yolo layer stops at the first x == 0). `rng`: a
        generator, or one per image. `iteration`: the training iteration the batch is for (it turns
        mosaic off from `mosaic_off` on); None: the cfg's augmentation as written."""
        indices = list(indices)
        options = self.options.at(iteration)
        x = np.empty((len(indices), 3, h, w), np.float32)
        truth = np.zeros((len(indices), self.max_boxes * 5), np.float32)
        rngs = _per_image(rng, len(indices)) if self.augment else None
        for i, k in enumerate(indices):
            img = self._cache.get(k, self.paths[k], 3)
            boxes = self.boxes(k)
            if self.augment and options.active:
                from .augment import augmented_sample
                x[i], packed = augmented_sample(self, k, rngs[i], w, h, options)
            elif self.augment:
                x[i], packed = self._augment(img, boxes, rngs[i], w, h)
            else:
                x[i], packed = self._letterbox(img, boxes, w, h)
            truth[i, :packed.size] = packed.reshape(-1)
        return x, truth

    def _augment(self, img, boxes, rng, w, h):
        _, oh, ow = img.shape
        dw, dh = self.jitter * ow, self.jitter * oh
        num = max(ow + rand_uniform(-dw, dw, rng), 1.0)
        den = max(oh + rand_uniform(-dh, dh, rng), 1.0)
        new_ar = num / den
        if new_ar < 1:
            nh = h
            nw = nh * new_ar
        else:
            nw = w
            nh = nw / new_ar
        dx = rand_uniform(0, w - nw, rng)
        dy = rand_uniform(0, h - nh, rng)
        # darknet: place_image takes integer size and offset, but Darknet moves the boxes with the
        # float values (up to a pixel off); here the boxes follow the pixels actually placed.
        nw, nh, dx, dy = max(int(nw), 1), max(int(nh), 1), int(dx), int(dy)
        canvas = np.full((3, h, w), 0.5, np.float32)
        place_image(img, nw, nh, dx, dy, canvas)
        # distortion, then the flip coin, as Darknet draws them; the distortion is per pixel, so
        # flipping first (in the same pass) gives the same image
        hue_sat_exp = distort_args(self.hue, self.saturation, self.exposure, rng.random(DISTORT_DRAWS))
        flip = rng.random() < 0.5 and self.flip
        flip_distort_inplace(canvas, flip, *hue_sat_exp)
        order = rng.permutation(len(boxes))
        return canvas, _pack_boxes(boxes[order], nw / w, nh / h, dx / w, dy / h, flip, self.max_boxes)

    def _letterbox(self, img, boxes, w, h):
        _, oh, ow = img.shape
        nw, nh = letterbox_size(ow, oh, w, h)
        dx, dy = (w - nw) // 2, (h - nh) // 2
        canvas = np.full((3, h, w), 0.5, np.float32)
        canvas[:, dy:dy + nh, dx:dx + nw] = resize_image(img, nw, nh)
        return canvas, _pack_boxes(boxes, nw / w, nh / h, dx / w, dy / h, False, self.max_boxes)


def _pack_boxes(boxes: np.ndarray, sx: float, sy: float, dx: float, dy: float, flip: bool,
                max_boxes: int) -> np.ndarray:
    """Darknet's correct_boxes + fill_truth_detection: scale by (sx, sy), shift by (dx, dy), mirror if
    flipped, clamp the edges to [0,1], recompute centre and size, keep the first `max_boxes`, then
    drop those under .001 wide or high. Returns (m, 5) [x, y, w, h, class]."""
    b = boxes[:max_boxes].astype(np.float64)
    left = (b[:, 0] - b[:, 2] / 2) * sx + dx
    right = (b[:, 0] + b[:, 2] / 2) * sx + dx
    top = (b[:, 1] - b[:, 3] / 2) * sy + dy
    bottom = (b[:, 1] + b[:, 3] / 2) * sy + dy
    if flip:
        left, right = 1 - right, 1 - left
    left, right, top, bottom = (np.clip(v, 0, 1) for v in (left, right, top, bottom))
    out = np.stack([(left + right) / 2, (top + bottom) / 2, np.clip(right - left, 0, 1),
                    np.clip(bottom - top, 0, 1), b[:, 4]], axis=1).astype(np.float32)
    return out[(out[:, 2] >= .001) & (out[:, 3] >= .001)]


# ---------------------------------------------------------------------------------------------------
# background loading
# ---------------------------------------------------------------------------------------------------
class BatchLoader:
    """Prepares batch k+1 (… k+depth) on a background thread while the caller trains on batch k.

    `get(k)` returns `fn(k)`: the prefetched result when there is one, else computed right away in
    the caller's thread. An exception raised by `fn` on the worker is raised again by the `get` that
    asks for that batch. `fn` must be a pure function of k (the trainer seeds each batch's rng from
    (seed, k)), so results are identical to calling `fn(k)` directly, whatever was prefetched.
    Image decoding (Pillow) and the numba kernels release the GIL, so the work really overlaps.
    """

    def __init__(self, fn: Callable[[int], Any], depth: int = 1):
        if depth < 1:
            raise ValueError(f"depth must be >= 1 (got {depth})")
        self._fn = fn
        self._depth = depth
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(max_workers=1,
                                                                   thread_name_prefix="darkpy-loader")
        self._pending: dict[int, Future] = {}

    def get(self, k: int) -> Any:
        if self._pool is None:
            raise RuntimeError("BatchLoader is closed")
        fut = self._pending.pop(k, None)
        ahead = range(k + 1, k + 1 + self._depth)
        for j in list(self._pending):
            if j not in ahead:
                self._pending.pop(j).cancel()   # stale (the caller skipped or went back)
        for j in ahead:
            if j not in self._pending:
                self._pending[j] = self._pool.submit(self._fn, j)
        return self._fn(k) if fut is None else fut.result()

    def close(self) -> None:
        """Drop pending batches and stop the worker thread (waits for a batch in progress)."""
        if self._pool is not None:
            for fut in self._pending.values():
                fut.cancel()
            self._pending.clear()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> "BatchLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
