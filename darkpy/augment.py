"""The fork's detector augmentations, on top of `DetectionData`'s per-image jitter/placement/HSV/flip:
`mosaic`, `mixup`, `cutmix`, `blur`, `gaussian_noise` and `letter_box` from `[net]`.

Every draw comes from the batch's generator (`train.augment_rng(seed, k)`), so a batch is a pure
function of (seed, k). Boxes are [x, y, w, h, class] relative to the net input and follow the pixels:

- `letter_box=1`: the placement keeps the image's aspect ratio (no aspect jitter), at a random
  offset on the grey canvas.
- `mosaic=1`: with p = 1/2 per image (the fork turns mosaic off for half of its loads, so half of
  what it trains on are plain images), a cut point (cx, cy), each drawn uniformly in [0.2, 0.8] of
  the width/height (the fork's min_offset), splits the input into 4 quadrants. Each gets its own
  piece (the item itself and 3 others drawn from the dataset), made as the fork's
  `load_data_detection` does: every side of the source cropped or padded by up to ±jitter (the
  padding in the image's mean colour), the crop resized to the whole input, HSV and flip; with
  p = 1/2 a piece's jitter is moved to its sides next to the cut point. The quadrant shows the
  piece's corner that meets the cut point (top-left quadrant: the piece's bottom-right), moved
  inwards past the padding; boxes are moved with the window.
  `mosaic_bound=1` clips them to their quadrant (the fork's rule, and what the pixels show); with 0
  they are clipped to the input only, as the fork does (a box may reach into a neighbour quadrant).
  darkpy drops a box with no visible pixel in its quadrant (the fork can keep it) and, as the fork,
  boxes under a pixel wide or high.
  `mosaic_off=n` (darkpy's own key; Darknet ignores it): from training iteration n on (0-based, the
  count of updates done, as `steps=` counts) no image is a mosaic, the "close mosaic" of YOLOX and
  YOLOv5-v8; the other augmentations stay. Loads that name no iteration (previews) use the cfg's.
- `mixup=1`: the fork's `mixup`: the item and another are blended 50/50 with p = 1/2 per item and
  both box lists kept (the fork draws once per load). With `mosaic=1` too, an item that is not a
  mosaic is a mixup with p = 1/2 (darkpy's own: the fork's parser keeps only mosaic then).
- `cutmix=1`: darkpy's detector cutmix (the fork has none for detectors): with p = 1/2 a rectangle
  of 30-70 % of each side, at a random place, is pasted from another augmented image; the other
  image's boxes are clipped to it (dropped when nothing is left), the item's boxes are kept.
- `blur=1`: with p = 1/2 the background is blurred (Gaussian, sigma = 2 px) and the boxes' pixels
  kept sharp, as the fork's blur=1; `blur=n>1` blurs the whole image with sigma = n/6 px.
- `gaussian_noise=n`: additive noise N(0, s²) with s uniform in [0, n/255], clipped to [0, 1].
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .images import DISTORT_DRAWS, distort_args, flip_distort_inplace, place_image, rand_uniform, resize_image

__all__ = ["AugmentOptions", "augmented_sample"]


@dataclass
class AugmentOptions:
    mosaic: bool = False
    mosaic_bound: bool = False
    mixup: bool = False
    cutmix: bool = False
    blur: int = 0
    gaussian_noise: int = 0
    letter_box: bool = False
    mosaic_off: int = 0           # darkpy: no mosaic from this training iteration on (0: never)

    @classmethod
    def from_net(cls, net_cfg) -> "AugmentOptions":
        def get(key, default=0):
            v = getattr(net_cfg, key, None) if net_cfg is not None else None
            return default if v is None else v

        return cls(bool(get("mosaic")), bool(get("mosaic_bound")), bool(get("mixup")), bool(get("cutmix")),
                   int(get("blur")), int(get("gaussian_noise")), bool(get("letter_box")), int(get("mosaic_off")))

    def at(self, iteration: int | None) -> "AugmentOptions":
        """The options training iteration `iteration` uses: without mosaic from `mosaic_off` on."""
        if self.mosaic and self.mosaic_off and iteration is not None and iteration >= self.mosaic_off:
            return replace(self, mosaic=False)
        return self

    @property
    def active(self) -> bool:
        return any((self.mosaic, self.mixup, self.cutmix, self.blur, self.gaussian_noise, self.letter_box))


def _place(data, img, boxes, rng, w, h, keep_aspect):
    """DetectionData's jitter/placement/HSV/flip; `keep_aspect` (letter_box): no aspect jitter."""
    if not keep_aspect:
        return data._augment(img, boxes, rng, w, h)
    from .datasets import _pack_boxes
    _, oh, ow = img.shape
    scale = min(w / ow, h / oh)
    nw, nh = max(int(ow * scale), 1), max(int(oh * scale), 1)
    dx, dy = int(rand_uniform(0, w - nw, rng)), int(rand_uniform(0, h - nh, rng))
    canvas = np.full((3, h, w), 0.5, np.float32)
    place_image(img, nw, nh, dx, dy, canvas)
    hue_sat_exp = distort_args(data.hue, data.saturation, data.exposure, rng.random(DISTORT_DRAWS))
    flip = rng.random() < 0.5 and data.flip
    flip_distort_inplace(canvas, flip, *hue_sat_exp)
    order = rng.permutation(len(boxes))
    return canvas, _pack_boxes(boxes[order], nw / w, nh / h, dx / w, dy / h, flip, data.max_boxes)


def _one(data, k, rng, w, h, opt):
    return _place(data, data._cache.get(k, data.paths[k], 3), data.boxes(k), rng, w, h, opt.letter_box)


def _corners(b):
    return b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2, b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2


def _from_corners(x0, y0, x1, y1, cls):
    return np.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0, cls], axis=1).astype(np.float32)


def _mosaic_piece(data, k, rng, w, h, opt, q):
    """One quadrant's image as the fork's `load_data_detection` makes it for a mosaic: each side of
    the source cropped or padded by up to ±jitter (padding filled with the image's mean colour), the
    crop resized to the whole net input, HSV, flip. With p = 1/2 the jitter of a side pair is moved
    to the side away from the quadrant's outer corner (the fork's "move each 2nd image to the
    corner"). Returns the image, its boxes and the crop's (left, right, top, bottom) offsets in
    source pixels, after the flip."""
    from .datasets import _pack_boxes
    img, boxes = data._cache.get(k, data.paths[k], 3), data.boxes(k)
    _, oh, ow = img.shape
    dw, dh = int(ow * data.jitter), int(oh * data.jitter)
    u = rng.random(4)
    # darknet: rand_precalc_random's float truncated to int
    pl, pr = int(-dw + u[0] * 2 * dw), int(-dw + u[1] * 2 * dw)
    pt, pb = int(-dh + u[2] * 2 * dh), int(-dh + u[3] * 2 * dh)
    if opt.letter_box:          # the fork pads the crop to the net's aspect (it refuses letter_box with mosaic)
        ratio = (ow / oh) / (w / h)
        if ratio > 1:
            d = (ow / (w / h) - oh) / 2
            pt, pb = int(pt - d), int(pb - d)
        else:
            d = (oh * (w / h) - ow) / 2
            pl, pr = int(pl - d), int(pr - d)
    flip = rng.random() < 0.5 and data.flip
    if rng.random() < 0.5:      # all the jitter on the sides next to the cut point
        if (q % 2 == 0) != flip:
            pl, pr = 0, pr + pl
        else:
            pl, pr = pl + pr, 0
        pt, pb = (0, pb + pt) if q // 2 == 0 else (pt + pb, 0)
    sw, sh = ow - pl - pr, oh - pt - pb
    if sw <= 0 or sh <= 0 or ow - pl <= 0 or oh - pt <= 0:
        pl = pr = pt = pb = 0
        sw, sh = ow, oh
    crop = np.empty((3, sh, sw), np.float32)
    crop[:] = img.reshape(3, -1).mean(axis=1)[:, None, None]
    x0, y0, x1, y1 = max(pl, 0), max(pt, 0), min(ow - pr, ow), min(oh - pb, oh)
    if x1 > x0 and y1 > y0:
        crop[:, y0 - pt:y1 - pt, x0 - pl:x1 - pl] = img[:, y0:y1, x0:x1]
    piece = resize_image(crop, w, h)
    hue_sat_exp = distort_args(data.hue, data.saturation, data.exposure, rng.random(DISTORT_DRAWS))
    flip_distort_inplace(piece, flip, *hue_sat_exp)
    order = rng.permutation(len(boxes))
    packed = _pack_boxes(boxes[order], ow / sw, oh / sh, -pl / sw, -pt / sh, flip, data.max_boxes)
    if flip:
        pl, pr = pr, pl
    return piece, packed, (pl, pr, pt, pb), (ow, oh)


def mosaic(data, k, rng, w, h, opt) -> tuple[np.ndarray, np.ndarray]:
    """The fork's 4-image mosaic (module doc). Quadrant q (0 top-left, 1 top-right, 2 bottom-left,
    3 bottom-right) shows the part of its piece next to the cut point: the window's corner at the
    cut point is the piece's matching corner, moved inwards past the padding (as the fork computes
    it, padding × net size / source size, at most the quadrant's size)."""
    cx = int(rng.integers(int(0.2 * w), int(0.8 * w) + 1))
    cy = int(rng.integers(int(0.2 * h), int(0.8 * h) + 1))
    others = rng.integers(0, len(data), 3)
    out = np.empty((3, h, w), np.float32)
    parts = []
    for q, idx in enumerate([k, *others.tolist()]):
        img, boxes, (pl, pr, pt, pb), (ow, oh) = _mosaic_piece(data, int(idx), rng, w, h, opt, q)
        qx, qy = (0, cx)[q % 2], (0, cy)[q // 2]
        qw, qh = (cx, w - cx)[q % 2], (cy, h - cy)[q // 2]
        # darknet: the padding is converted with the source size, not the crop's (C integer division)
        left, top = min(cx, max(0, -pl * w // ow)), min(cy, max(0, -pt * h // oh))
        right, bottom = min(w - cx, max(0, -pr * w // ow)), min(h - cy, max(0, -pb * h // oh))
        sx = w - cx - right if q % 2 == 0 else left
        sy = h - cy - bottom if q // 2 == 0 else top
        out[:, qy:qy + qh, qx:qx + qw] = img[:, sy:sy + qh, sx:sx + qw]
        if len(boxes):
            parts.append(_move_boxes(boxes, (qx - sx) / w, (qy - sy) / h, (qx, qy, qw, qh), w, h, opt))
    boxes = np.concatenate(parts) if parts else np.zeros((0, 5), np.float32)
    return out, boxes[:data.max_boxes]


def _move_boxes(boxes, sh_x, sh_y, quadrant, w, h, opt):
    """A piece's boxes shifted by (sh_x, sh_y), clipped to the quadrant (`mosaic_bound`) or to the
    input; dropped when nothing of them is in the quadrant or under a pixel wide or high."""
    qx, qy, qw, qh = quadrant
    x0, y0, x1, y1 = _corners(boxes.astype(np.float64))
    x0, x1, y0, y1 = x0 + sh_x, x1 + sh_x, y0 + sh_y, y1 + sh_y
    bx0, bx1, by0, by1 = qx / w, (qx + qw) / w, qy / h, (qy + qh) / h
    visible = (np.minimum(x1, bx1) > np.maximum(x0, bx0)) & (np.minimum(y1, by1) > np.maximum(y0, by0))
    if opt.mosaic_bound:
        x0, x1, y0, y1 = np.clip(x0, bx0, bx1), np.clip(x1, bx0, bx1), np.clip(y0, by0, by1), np.clip(y1, by0, by1)
    else:
        x0, x1, y0, y1 = np.clip(x0, 0, 1), np.clip(x1, 0, 1), np.clip(y0, 0, 1), np.clip(y1, 0, 1)
    b = _from_corners(x0, y0, x1, y1, boxes[:, 4])
    return b[visible & (b[:, 2] > 1.0 / w) & (b[:, 3] > 1.0 / h)]


def mixup(data, k, rng, w, h, opt, base=None):
    a, ba = base if base is not None else _one(data, k, rng, w, h, opt)
    b, bb = _one(data, int(rng.integers(0, len(data))), rng, w, h, opt)
    return 0.5 * a + 0.5 * b, np.concatenate([ba, bb])[:data.max_boxes]


def cutmix(data, k, rng, w, h, opt, base=None):
    a, ba = base if base is not None else _one(data, k, rng, w, h, opt)
    b, bb = _one(data, int(rng.integers(0, len(data))), rng, w, h, opt)
    rw, rh = int(rng.uniform(0.3, 0.7) * w), int(rng.uniform(0.3, 0.7) * h)
    rx, ry = int(rng.integers(0, w - rw + 1)), int(rng.integers(0, h - rh + 1))
    out = a.copy()
    out[:, ry:ry + rh, rx:rx + rw] = b[:, ry:ry + rh, rx:rx + rw]
    if len(bb):
        x0, y0, x1, y1 = _corners(bb.astype(np.float64))
        l, t, r, btm = rx / w, ry / h, (rx + rw) / w, (ry + rh) / h
        cut = _from_corners(np.clip(x0, l, r), np.clip(y0, t, btm), np.clip(x1, l, r), np.clip(y1, t, btm), bb[:, 4])
        bb = cut[(cut[:, 2] > 1.0 / w) & (cut[:, 3] > 1.0 / h)]
    return out, np.concatenate([ba, bb])[:data.max_boxes]


def gaussian_blur(img: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of a (c, h, w) image, edges replicated."""
    r = max(int(3 * sigma), 1)
    t = np.arange(-r, r + 1, dtype=np.float64)
    k = np.exp(-t * t / (2 * sigma * sigma))
    k /= k.sum()
    out = np.pad(img, ((0, 0), (r, r), (0, 0)), mode="edge")
    out = sum(k[i] * out[:, i:i + img.shape[1]] for i in range(2 * r + 1))
    out = np.pad(out, ((0, 0), (0, 0), (r, r)), mode="edge")
    out = sum(k[i] * out[:, :, i:i + img.shape[2]] for i in range(2 * r + 1))
    return out.astype(img.dtype)


def blur(img: np.ndarray, boxes: np.ndarray, level: int, rng) -> np.ndarray:
    if rng.random() >= 0.5:
        return img
    if level == 1:
        out = gaussian_blur(img, 2.0)
        _, h, w = img.shape
        for x, y, bw, bh, _ in boxes:
            x0, x1 = max(int((x - bw / 2) * w), 0), min(int(np.ceil((x + bw / 2) * w)), w)
            y0, y1 = max(int((y - bh / 2) * h), 0), min(int(np.ceil((y + bh / 2) * h)), h)
            out[:, y0:y1, x0:x1] = img[:, y0:y1, x0:x1]
        return out
    return gaussian_blur(img, level / 6.0)


def augmented_sample(data, k: int, rng: np.random.Generator, w: int, h: int,
                     opt: AugmentOptions) -> tuple[np.ndarray, np.ndarray]:
    """One training sample of item k under `opt` (module doc): image (3, h, w), boxes (m, 5)."""
    # darknet: load_data_detection turns mosaic (and mixup) off for half of its loads
    # (`random_gen() % 2 == 0`), so only about half the training images are mosaics; darkpy tosses
    # the coin per image (the fork per loader thread's share of the batch)
    if opt.mosaic and rng.random() < 0.5:
        img, boxes = mosaic(data, k, rng, w, h, opt)
    else:
        img, boxes = _one(data, k, rng, w, h, opt)
        if opt.mixup and rng.random() < 0.5:
            img, boxes = mixup(data, k, rng, w, h, opt, (img, boxes))
    if opt.cutmix and rng.random() < 0.5:
        img, boxes = cutmix(data, k, rng, w, h, opt, (img, boxes))
    if opt.blur:
        img = blur(img, boxes, opt.blur, rng)
    if opt.gaussian_noise:
        s = rng.uniform(0, opt.gaussian_noise / 255.0)
        img = np.clip(img + rng.normal(0, s, img.shape), 0, 1).astype(np.float32)
    return img.astype(np.float32, copy=False), boxes.astype(np.float32, copy=False)


def preview_images(cfg: str, data_path, out: str, count: int, seed: int = 0) -> list[str]:
    """`darkpy augment-preview`: `count` augmented samples of the cfg's train list, boxes drawn
    (class colours as `detect`), saved as aug_<i>.png; returns the paths."""
    import os

    from .cfg import load_cfg
    from .datasets import DetectionData, read_data_file, read_list
    from .detect import class_color
    from .errors import DataError
    from .drawing import draw_box
    from .images import save_image
    from .network import NetConfig
    from .train import augment_rng

    doc = load_cfg(cfg)
    net_cfg = NetConfig.from_section(doc.net)
    heads = [s for s in doc.layers if s.kind in ("yolo", "region", "detection")]
    if not heads:
        raise DataError(f"{cfg}: no [yolo], [region] or [detection] layer: augment-preview shows detector samples")
    jitter = heads[-1].get_float("jitter", 0.2)
    dc = read_data_file(os.fspath(data_path))
    if not dc.train:
        raise DataError(f"{dc.path}: no train= list")
    paths = read_list(dc.train)
    data = DetectionData(paths, dc.classes, net_cfg, augment=True, jitter=jitter)
    os.makedirs(out, exist_ok=True)
    written = []
    for i in range(count):
        x, truth = data.load([i % len(paths)], augment_rng(seed, i), net_cfg.width, net_cfg.height)
        img = x[0].copy()
        _, h, w = img.shape
        for bx, by, bw, bh, c in truth[0].reshape(-1, 5):
            if bx == 0:
                break
            draw_box(img, int((bx - bw / 2) * w), int((by - bh / 2) * h), int((bx + bw / 2) * w),
                     int((by + bh / 2) * h), class_color(int(c), dc.classes), 1)
        p = os.path.join(out, f"aug_{i:03d}.png")
        save_image(img, p)
        written.append(p)
    return written
