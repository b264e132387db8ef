"""Images: decoding, Darknet's own resampling and augmentation, and saving (spec §10.2, §11); drawing
detections is darkpy/drawing.py (re-exported here).

An image is a float array `(c, h, w)` (CHW, channel-planar like Darknet) with values in [0, 1];
float32 for real work, but every function here also accepts float64. Decoding uses Pillow; everything
that changes pixels afterwards (resize, letterbox, placement, rotation, HSV jitter) follows Darknet's
formulas, so a network trained by Darknet sees the same input here (up to Pillow's JPEG decoder,
which may differ from stb_image's by a grey level).

Randomness: every random draw comes from the `rng: numpy.random.Generator` argument, in the order
Darknet draws them, so the same generator state gives bit-identical output. Darknet's `rand()` stream
cannot be reproduced, so results match Darknet in distribution, not draw for draw.

Kernels are `@jit` (numba, GIL released) so a loader thread can augment while the network trains.
"""
from __future__ import annotations

import math
import os
import threading

import numpy as np
from PIL import Image, UnidentifiedImageError

from .drawing import draw_box, draw_label  # noqa: F401 (re-exported: darkpy.images' API)
from .errors import DataError
from .kernels import jit

__all__ = [
    "load_image", "save_image", "resize_image", "letterbox_image", "crop_image", "center_crop_image",
    "flip_image", "place_image", "rotate_crop_image", "distort_image", "random_distort_image",
    "rand_uniform", "rand_scale", "rand_int", "random_augment_image", "augment_args", "distort_args",
    "flip_distort_inplace", "augment_batch", "draw_box", "draw_label",
]

_F32_255 = np.float32(255)


# ---------------------------------------------------------------------------------------------------
# decoding and saving
# ---------------------------------------------------------------------------------------------------
def load_image(path: str | os.PathLike, channels: int = 3) -> np.ndarray:
    """Decode an image file to float32 `(channels, h, w)` in [0, 1].

    `channels=3` gives RGB the way Darknet's stb_image loader forced to 3 channels does: grey is
    replicated, alpha is dropped (not composited), palettes are expanded, 16-bit samples keep their
    high byte. `channels=1` gives luminance. EXIF orientation is ignored, as in Darknet. Values are
    `byte / 255` computed in float32, exactly Darknet's scaling. A missing, unreadable or corrupt file
    raises `DataError` naming it.
    """
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3 (got {channels})")
    try:
        with _open_limited(path) as im:
            arr = _to_uint8(im, channels)
    except FileNotFoundError:
        raise DataError(f"{path}: no such image file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not an image file") from None
    except UnidentifiedImageError:
        raise DataError(f"{path}: not an image file Pillow can decode") from None
    except (OSError, ValueError, SyntaxError) as e:   # truncated or corrupt data
        raise DataError(f"{path}: cannot decode image ({e})") from None
    if arr.ndim == 2:
        out = np.empty((1,) + arr.shape, np.float32)
        np.divide(arr, _F32_255, out=out[0], dtype=np.float32)
    else:
        out = np.empty((arr.shape[2],) + arr.shape[:2], np.float32)
        np.divide(arr.transpose(2, 0, 1), _F32_255, out=out, dtype=np.float32)
    return out


_max_pixels: int | None = None          # None: `[images] max_pixels` of darkpy.toml, read on first use
_PIL_LIMIT = threading.Lock()


def set_max_pixels(n: int | None) -> None:
    """The largest image (w·h pixels) `load_image` decodes; None = darkpy.toml's `[images] max_pixels`
    (default 178,956,970, Pillow's own limit)."""
    global _max_pixels
    if n is not None and n < 1:
        raise ValueError(f"max_pixels must be >= 1 (got {n})")
    _max_pixels = n


def max_pixels() -> int:
    global _max_pixels
    if _max_pixels is None:
        from .settings import load_settings
        _max_pixels = load_settings().max_pixels
    return _max_pixels


def _open_limited(path) -> Image.Image:
    """Image.open, with darkpy's pixel limit instead of Pillow's: an image over it is a one-line
    DataError naming the file, its size and the setting; under it (when the setting raised the limit
    past Pillow's) Pillow's own check is lifted for this one open."""
    limit = max_pixels()
    try:
        im = Image.open(path)
    except Image.DecompressionBombError:
        with _PIL_LIMIT:               # only to read the header: the size decides below
            old, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
            try:
                im = Image.open(path)
            finally:
                Image.MAX_IMAGE_PIXELS = old
    w, h = im.size
    if w * h > limit:
        im.close()
        raise DataError(f"{path}: {w}x{h} image ({w * h:,} pixels) is over the limit of {limit:,} pixels "
                        f"(a guard against decompression bombs); to allow it set max_pixels = {w * h} under "
                        f"[images] in darkpy.toml")
    return im


def _to_uint8(im: Image.Image, channels: int) -> np.ndarray:
    """Pillow image -> uint8 array (h, w) for 1 channel or (h, w, 3) for 3."""
    if im.mode in ("I", "F") or im.mode.startswith("I;16"):
        # 16-bit (or 32-bit) grey: keep the high byte, as stb_image's 8-bit loader does.
        wide = np.asarray(im).astype(np.int64)
        gray = np.clip(wide >> 8 if im.mode != "F" else wide, 0, 255).astype(np.uint8)
        return gray if channels == 1 else np.repeat(gray[:, :, None], 3, axis=2)
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")   # Pillow warns if a palette with transparency goes straight to RGB
    target = "L" if channels == 1 else "RGB"
    if im.mode != target:
        im = im.convert(target)   # RGBA/LA -> RGB drops alpha; L -> RGB replicates
    return np.asarray(im, dtype=np.uint8)


def save_image(img: np.ndarray, path: str | os.PathLike) -> None:
    """Write a `(c, h, w)` image (c = 1 or 3, values clipped to [0, 1]) in the format of `path`'s
    extension (.png, .jpg, ...). Values are rounded to bytes (Darknet truncates)."""
    c = img.shape[0]
    if c not in (1, 3):
        raise ValueError(f"save_image needs 1 or 3 channels (got {c})")
    data = (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)
    pil = Image.fromarray(data[0]) if c == 1 else Image.fromarray(np.ascontiguousarray(data.transpose(1, 2, 0)))
    try:
        pil.save(path)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot write image ({e})") from None


# ---------------------------------------------------------------------------------------------------
# random draws (Darknet's rand_uniform / rand_scale / rand_int, on a numpy Generator)
# ---------------------------------------------------------------------------------------------------
# Each helper turns uniforms u in [0, 1) into Darknet's draw, elementwise over numpy arrays too. The
# public functions take their uniforms from the generator in order; since n separate draws consume
# exactly what one rng.random(n) does, the batch loaders draw all of a batch's uniforms at once and
# get the same result as these functions called image by image.
def _uniform_from(u, a, b):
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    return lo + u * (hi - lo)


def _scale_from(u, coin, s):
    r = _uniform_from(u, 1.0, s)
    return np.where(coin < 0.5, r, 1.0 / r)


def _int_from(u, a, b):
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    return lo + np.minimum((u * (hi - lo + 1)).astype(np.int64), hi - lo)


def rand_uniform(a: float, b: float, rng: np.random.Generator) -> float:
    """Uniform in [min(a,b), max(a,b)); one draw, even when a == b."""
    return float(_uniform_from(rng.random(), a, b))


def rand_scale(s: float, rng: np.random.Generator) -> float:
    """r = U(1, s) (so s < 1 works too), then r or 1/r with probability 1/2 each. Two draws."""
    u = rng.random(2)
    return float(_scale_from(u[0], u[1], s))


def rand_int(a: int, b: int, rng: np.random.Generator) -> int:
    """Uniform integer in [min(a,b), max(a,b)], both ends included. One draw."""
    return int(_int_from(rng.random(), a, b))


# ---------------------------------------------------------------------------------------------------
# resampling
# ---------------------------------------------------------------------------------------------------
def _resize_taps(n_in: int, n_out: int, dtype) -> tuple:
    """Per output index: two source indices and two weights of Darknet's corner-aligned linear
    interpolation, computed in the image dtype exactly as Darknet's float arithmetic does.

    scale = (n_in-1)/(n_out-1); s = o*scale; i = trunc(s); out = (1-(s-i))*in[i] + (s-i)*in[i+1].
    The last output index (and every index when n_in == 1) takes in[n_in-1] alone.
    """
    t = np.dtype(dtype).type
    i0 = np.full(n_out, n_in - 1, np.int64)
    w0 = np.ones(n_out, dtype)
    w1 = np.zeros(n_out, dtype)
    if n_out > 1 and n_in > 1:
        scale = t(n_in - 1) / t(n_out - 1)
        s = np.arange(n_out - 1).astype(dtype) * scale
        ix = s.astype(np.int64)
        d = s - ix.astype(dtype)
        i0[:-1] = ix
        w1[:-1] = d
        w0[:-1] = t(1) - d
    i1 = np.minimum(i0 + 1, n_in - 1)
    return i0, i1, w0, w1


@jit
def _resize_kernel(out, part, img, xi0, xi1, xw0, xw1, yi0, yi1, yw0, yw1):
    # out (c, h, w); part (c, ih, w) scratch; img (c, ih, iw)
    # xi0, xi1, xw0, xw1 (w,): column taps; yi0, yi1, yw0, yw1 (h,): row taps
    c, ih, w = part.shape
    h = out.shape[1]
    for k in range(c):
        for r in range(ih):
            for x in range(w):
                part[k, r, x] = xw0[x] * img[k, r, xi0[x]] + xw1[x] * img[k, r, xi1[x]]
        for r in range(h):
            a = yi0[r]
            b = yi1[r]
            wa = yw0[r]
            wb = yw1[r]
            for x in range(w):
                out[k, r, x] = wa * part[k, a, x] + wb * part[k, b, x]


def resize_image(img: np.ndarray, w: int, h: int) -> np.ndarray:
    """Darknet's `resize_image`: separable bilinear (columns first, then rows) with corner-aligned
    scales (in-1)/(out-1), so the corner pixels map exactly onto the corner pixels.

    # darknet: Darknet gives the last output row `(1-dy)*row[iy]` only and skips the `dy*row[iy+1]`
    # term. When float rounding makes (h-1)*scale land one ulp below in_h-1 (about 4% of size pairs,
    # e.g. 2 -> 42 rows) that row comes out nearly black, and h=1 divides by zero. Here the last
    # row takes the last input row, as Darknet already does for the last column.
    """
    c, ih, iw = img.shape
    if w < 1 or h < 1:
        raise ValueError(f"resize_image: target size must be positive (got {w}x{h})")
    dtype = img.dtype if img.dtype in (np.float32, np.float64) else np.dtype(np.float32)
    img = np.ascontiguousarray(img, dtype=dtype)
    out = np.empty((c, h, w), dtype)
    part = np.empty((c, ih, w), dtype)
    _resize_kernel(out, part, img, *_resize_taps(iw, w, dtype), *_resize_taps(ih, h, dtype))
    return out


def letterbox_image(img: np.ndarray, w: int, h: int) -> np.ndarray:
    """Darknet's `letterbox_image`: resize to fit inside w×h keeping the aspect ratio (integer sizes
    as Darknet computes them), centred on a canvas filled with 0.5."""
    new_w, new_h = letterbox_size(img.shape[2], img.shape[1], w, h)
    out = np.full((img.shape[0], h, w), 0.5, dtype=img.dtype)
    x0, y0 = (w - new_w) // 2, (h - new_h) // 2
    out[:, y0:y0 + new_h, x0:x0 + new_w] = resize_image(img, new_w, new_h)
    return out


def letterbox_size(iw: int, ih: int, w: int, h: int) -> tuple[int, int]:
    """The (new_w, new_h) Darknet's letterbox resizes an iw×ih image to inside a w×h canvas."""
    if w / iw < h / ih:
        return w, max(1, (ih * w) // iw)
    return max(1, (iw * h) // ih), h


def crop_image(img: np.ndarray, dx: int, dy: int, w: int, h: int) -> np.ndarray:
    """Darknet's `crop_image`: the w×h window at (dx, dy); coordinates outside the image are clamped
    to the nearest edge pixel."""
    _, ih, iw = img.shape
    rows = np.clip(np.arange(h) + dy, 0, ih - 1)
    cols = np.clip(np.arange(w) + dx, 0, iw - 1)
    return np.ascontiguousarray(img[:, rows][:, :, cols])


def center_crop_image(img: np.ndarray, w: int, h: int) -> np.ndarray:
    """Darknet's `center_crop_image`: the central min(iw, ih) square, resized to w×h."""
    _, ih, iw = img.shape
    m = min(iw, ih)
    return resize_image(crop_image(img, (iw - m) // 2, (ih - m) // 2, m, m), w, h)


def flip_image(img: np.ndarray) -> np.ndarray:
    """Mirror left-right (a new array; Darknet flips in place)."""
    return np.ascontiguousarray(img[:, :, ::-1])


@jit
def _sample_into(out, oy, ox, img, x, y):
    # out (c, h, w): out[:, oy, ox] = Darknet's bilinear_interpolate of img (c, ih, iw) at (x, y),
    # where pixels outside the image count as 0. The weights are computed once for all channels.
    c, ih, iw = img.shape
    ix = int(math.floor(x))
    iy = int(math.floor(y))
    dx = x - ix
    dy = y - iy
    w00 = (1 - dy) * (1 - dx)
    w01 = dy * (1 - dx)
    w10 = (1 - dy) * dx
    w11 = dy * dx
    if ix >= 0 and iy >= 0 and ix + 1 < iw and iy + 1 < ih:
        for k in range(c):
            out[k, oy, ox] = (w00 * img[k, iy, ix] + w01 * img[k, iy + 1, ix]
                              + w10 * img[k, iy, ix + 1] + w11 * img[k, iy + 1, ix + 1])
    else:
        x0 = 0 <= ix < iw
        x1 = 0 <= ix + 1 < iw
        y0 = 0 <= iy < ih
        y1 = 0 <= iy + 1 < ih
        for k in range(c):
            v = 0.0
            if x0 and y0:
                v += w00 * img[k, iy, ix]
            if x0 and y1:
                v += w01 * img[k, iy + 1, ix]
            if x1 and y0:
                v += w10 * img[k, iy, ix + 1]
            if x1 and y1:
                v += w11 * img[k, iy + 1, ix + 1]
            out[k, oy, ox] = v


@jit
def _place_kernel(canvas, img, w, h, dx, dy):
    # canvas (c, H, W) written in place; img (c, ih, iw)
    _, H, W = canvas.shape
    _, ih, iw = img.shape
    for y in range(max(0, -dy), min(h, H - dy)):
        ry = y / h * ih
        for x in range(max(0, -dx), min(w, W - dx)):
            _sample_into(canvas, y + dy, x + dx, img, x / w * iw, ry)


def place_image(img: np.ndarray, w: int, h: int, dx: int, dy: int, canvas: np.ndarray) -> None:
    """Darknet's `place_image`: draw `img` scaled to w×h into `canvas` (in place) with its top-left
    corner at (dx, dy). Source point of pixel x is x/w·iw (left edges aligned); the bilinear sample
    treats pixels past the image's right/bottom edge as 0, as Darknet does."""
    if w > 0 and h > 0:
        _place_kernel(canvas, np.ascontiguousarray(img, dtype=canvas.dtype), int(w), int(h), int(dx), int(dy))


@jit
def _rotate_crop_into(out, img, rad, s, dx, dy, aspect):
    # out (c, h, w); img (c, ih, iw)
    _, h, w = out.shape
    _, ih, iw = img.shape
    cx = iw / 2.0
    cy = ih / 2.0
    cr = math.cos(rad)
    sr = math.sin(rad)
    for y in range(h):
        v = (y - h / 2.0) / s + dy / s
        for x in range(w):
            u = (x - w / 2.0) / s * aspect + dx / s * aspect
            _sample_into(out, y, x, img, cr * u - sr * v + cx, sr * u + cr * v + cy)


def rotate_crop_image(img: np.ndarray, rad: float, s: float, w: int, h: int, dx: float, dy: float,
                      aspect: float, out: np.ndarray | None = None) -> np.ndarray:
    """Darknet's `rotate_crop_image`: a w×h view of `img` scaled by s (x additionally by 1/aspect),
    shifted by (dx, dy) output pixels and rotated by `rad` about the image centre; outside is 0.
    Written into `out` (c, h, w) when given."""
    if out is None:
        out = np.empty((img.shape[0], h, w), img.dtype)
    _rotate_crop_into(out, np.ascontiguousarray(img), float(rad), float(s), float(dx), float(dy),
                      float(aspect))
    return out


#: Uniforms used by random_augment_image (aspect 2, r 1, angle 1, dx 1, dy 1).
AUGMENT_DRAWS = 6


def augment_args(ih, iw, angle: float, aspect: float, low: int, high: int, w: int, u: np.ndarray) -> tuple:
    """Darknet's `random_augment_args` from AUGMENT_DRAWS uniforms u[..., :6], elementwise over
    leading axes (ih, iw may be arrays too): (rad, scale, dx, dy, aspect)."""
    aspect = _scale_from(u[..., 0], u[..., 1], aspect)
    r = _int_from(u[..., 2], low, high)
    short = np.maximum(1, np.minimum(ih, iw * aspect).astype(np.int64))   # darknet: truncated to int
    scale = r / short
    rad = _uniform_from(u[..., 3], -angle, angle) * 2 * math.pi / 360
    dx = (iw * scale / aspect - w) / 2
    dy = (ih * scale - w) / 2                     # darknet: P uses the crop width w here, not h
    return rad, scale, _uniform_from(u[..., 4], -dx, dx), _uniform_from(u[..., 5], -dy, dy), aspect


def random_augment_image(img: np.ndarray, angle: float, aspect: float, low: int, high: int, w: int, h: int,
                         rng: np.random.Generator) -> np.ndarray:
    """Darknet's classifier crop (`random_augment_image`, spec §11): random aspect, scale so the short
    side becomes r ∈ [low, high] pixels, rotation in ±angle degrees, and shift, then a w×h crop.

    Draw order: aspect (rand_scale), r, angle, dx, dy.
    """
    rad, scale, dx, dy, aspect = augment_args(img.shape[1], img.shape[2], angle, aspect, low, high, w,
                                              rng.random(AUGMENT_DRAWS))
    return rotate_crop_image(img, rad, scale, w, h, dx, dy, aspect)


# ---------------------------------------------------------------------------------------------------
# colour
# ---------------------------------------------------------------------------------------------------
@jit
def _hsv_distort(r, g, b, hue, sat, val):
    # One pixel of Darknet's distort_image: RGB -> HSV (H in [0,1]), S*=sat, V*=val, H+=hue wrapped
    # once, HSV -> RGB, clamp to [0, 1]. Returns (r, g, b).
    mx = max(r, g, b)
    mn = min(r, g, b)
    delta = mx - mn
    v = mx
    hh = 0.0
    s = 0.0
    if mx != 0:
        s = delta / mx
        if delta != 0:   # Darknet divides 0/0 here; the hue of a grey pixel is never used
            if r == mx:
                hh = (g - b) / delta
            elif g == mx:
                hh = 2 + (b - r) / delta
            else:
                hh = 4 + (r - g) / delta
            if hh < 0:
                hh += 6
            hh = hh / 6.0
    s = s * sat
    v = v * val
    hh = hh + hue
    if hh > 1:
        hh -= 1
    if hh < 0:
        hh += 1
    if s == 0:
        r = g = b = v
    else:
        hh = 6 * hh
        index = int(math.floor(hh))
        f = hh - index
        p = v * (1 - s)
        q = v * (1 - s * f)
        t = v * (1 - s * (1 - f))
        if index == 0:
            r, g, b = v, t, p
        elif index == 1:
            r, g, b = q, v, p
        elif index == 2:
            r, g, b = p, v, t
        elif index == 3:
            r, g, b = p, q, v
        elif index == 4:
            r, g, b = t, p, v
        else:
            r, g, b = v, p, q
    return min(max(r, 0.0), 1.0), min(max(g, 0.0), 1.0), min(max(b, 0.0), 1.0)


# distortion modes of _flip_distort_into
_CLAMP, _HSV, _VALUE = 0, 1, 2


@jit
def _flip_distort_into(img, flip, mode, hue, sat, val):
    # img (c, h, w), changed in place: mirror left-right if `flip`, then by `mode`: clamp to [0, 1]
    # (_CLAMP), HSV distortion of 3 channels (_HSV), or value scaling `img*val` clamped (_VALUE).
    c, h, w = img.shape
    if flip:
        for k in range(c):
            for y in range(h):
                for x in range(w // 2):
                    t = img[k, y, x]
                    img[k, y, x] = img[k, y, w - 1 - x]
                    img[k, y, w - 1 - x] = t
    if mode == _HSV:
        for y in range(h):
            for x in range(w):
                r, g, b = _hsv_distort(float(img[0, y, x]), float(img[1, y, x]), float(img[2, y, x]),
                                       hue, sat, val)
                img[0, y, x] = r
                img[1, y, x] = g
                img[2, y, x] = b
    else:
        scale = val if mode == _VALUE else 1.0
        for k in range(c):
            for y in range(h):
                for x in range(w):
                    img[k, y, x] = min(max(img[k, y, x] * scale, 0.0), 1.0)


def _distort_modes(c: int, dtype, hue, sat, val) -> tuple:
    """Per image: the _flip_distort_into mode, and `val` as the kernel needs it (for value scaling,
    rounded to the image dtype first, so the float64 product rounds like Darknet's float one)."""
    identity = (hue == 0) & (sat == 1) & (val == 1)
    if c == 3:
        return np.where(identity, _CLAMP, _HSV), val
    if c == 1:
        return np.where(identity, _CLAMP, _VALUE), np.asarray(val).astype(dtype).astype(np.float64)
    raise ValueError(f"distort_image needs 1 or 3 channels (got {c})")


def flip_distort_inplace(img: np.ndarray, flip: bool, hue: float, sat: float, val: float) -> None:
    """Mirror `img` (c, h, w) if `flip` and `distort_image` it, in place and in one pass (the same
    result as `distort_image(flip_image(img), ...)`; the distortion is per pixel)."""
    mode, val = _distort_modes(img.shape[0], img.dtype, hue, sat, val)
    _flip_distort_into(img, bool(flip), int(mode), float(hue), float(sat), float(val))


def distort_image(img: np.ndarray, hue: float, sat: float, val: float) -> np.ndarray:
    """Darknet's `distort_image` on a new array: shift hue by `hue` (H in [0,1], wrapped), scale
    saturation by `sat` and value by `val` in HSV, clamp to [0, 1]. One-channel images only scale
    their value. hue=0, sat=val=1 is the identity (up to the clamp), and skips the HSV round trip."""
    out = np.array(img, copy=True, order="C")
    flip_distort_inplace(out, False, hue, sat, val)
    return out


#: Uniforms used by random_distort_image (hue 1, saturation 2, exposure 2).
DISTORT_DRAWS = 5


def distort_args(hue: float, sat: float, exposure: float, u: np.ndarray) -> tuple:
    """Darknet's random_distort_image draws from DISTORT_DRAWS uniforms u[..., :5], elementwise over
    leading axes: (dhue, dsat, dexp)."""
    return (_uniform_from(u[..., 0], -hue, hue), _scale_from(u[..., 1], u[..., 2], sat),
            _scale_from(u[..., 3], u[..., 4], exposure))


def random_distort_image(img: np.ndarray, hue: float, sat: float, exposure: float,
                         rng: np.random.Generator) -> np.ndarray:
    """Darknet's `random_distort_image`: hue shift U(-hue, hue), saturation rand_scale(sat), value
    rand_scale(exposure), drawn in that order, applied by `distort_image`."""
    return distort_image(img, *distort_args(hue, sat, exposure, rng.random(DISTORT_DRAWS)))


# ---------------------------------------------------------------------------------------------------
# the classifier loader's fast path: crop, flip and distortion of a whole batch in one kernel call
# ---------------------------------------------------------------------------------------------------
@jit
def _augment_batch_kernel(out, imgs, rad, scale, dx, dy, aspect, flip, mode, hue, sat, val):
    # out (n, c, h, w); imgs (n, c, ih, iw); rad, scale, dx, dy, aspect, flip, mode, hue, sat, val (n,)
    for i in range(out.shape[0]):
        _rotate_crop_into(out[i], imgs[i], rad[i], scale[i], dx[i], dy[i], aspect[i])
        _flip_distort_into(out[i], flip[i], mode[i], hue[i], sat[i], val[i])


def augment_batch(out: np.ndarray, imgs: np.ndarray, angle: float, aspect: float, low: int, high: int,
                  hue: float, sat: float, exposure: float, flip: bool, u: np.ndarray) -> None:
    """Darknet's classifier augmentation for a stack of same-sized images, into `out` (n, c, h, w):
    for image i, exactly `random_augment_image`, a flip if u < 1/2 (and `flip`), then
    `random_distort_image`, drawing from the row u[i] of AUGMENT_DRAWS + 1 + DISTORT_DRAWS uniforms
    (so a generator's rng.random((n, 12)) gives the same batch as the image-by-image functions)."""
    _, c, h, w = out.shape
    _, _, ih, iw = imgs.shape
    rad, scale, dx, dy, asp = augment_args(ih, iw, angle, aspect, low, high, w, u)
    flips = (u[:, AUGMENT_DRAWS] < 0.5) & bool(flip)
    dh, ds, dv = distort_args(hue, sat, exposure, u[:, AUGMENT_DRAWS + 1:])
    mode, dv = _distort_modes(c, out.dtype, dh, ds, dv)
    f64 = np.float64
    _augment_batch_kernel(out, np.ascontiguousarray(imgs), rad.astype(f64), scale.astype(f64), dx.astype(f64),
                          dy.astype(f64), asp.astype(f64), flips, mode.astype(np.int64), dh.astype(f64),
                          ds.astype(f64), dv.astype(f64))
