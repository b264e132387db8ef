"""Drawing detections on a (C, H, W) float image in place, as Darknet draws them: a box of nested
one-pixel rectangles, a label in black on a tag of the box's colour (Pillow's default font).
`darkpy.images` re-exports both."""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont


def draw_box(img: np.ndarray, x1: int, y1: int, x2: int, y2: int, rgb, width: int = 1) -> None:
    """Darknet's `draw_box_width`, in place: `width` nested one-pixel rectangles, the outermost at
    (x1, y1)-(x2, y2) (inclusive pixel coordinates, clamped to the image)."""
    c, h, w = img.shape
    color = np.asarray(rgb, img.dtype)
    for i in range(max(1, int(width))):
        a = min(max(int(x1) + i, 0), w - 1)
        b = min(max(int(x2) - i, 0), w - 1)
        t = min(max(int(y1) + i, 0), h - 1)
        u = min(max(int(y2) - i, 0), h - 1)
        for k in range(c):
            v = color[k % len(color)]
            img[k, t, a:b + 1] = v
            img[k, u, a:b + 1] = v
            img[k, t:u + 1, a] = v
            img[k, t:u + 1, b] = v


def draw_label(img: np.ndarray, text: str, x: int, y: int, rgb) -> None:
    """Draw `text` in black on a tag of colour `rgb`, in place, as Darknet labels detections: the
    tag's left edge at x and its bottom at y (a box's top) when it fits above, else its top at y."""
    c, h, w = img.shape
    font = _font(max(10, min(40, int(h * 0.04))))
    left, top, right, bottom = font.getbbox(text)
    pad = max(1, (bottom - top) // 4)
    tw, th = right - left + 2 * pad, bottom - top + 2 * pad
    tag = Image.new("L", (tw, th), 255)
    ImageDraw.Draw(tag).text((pad - left, pad - top), text, fill=0, font=font)
    mask = np.asarray(tag, np.float32) / 255   # 1 = tag colour, 0 = text
    x, y = int(x), int(y)
    if y - th >= 0:
        y -= th
    x0, y0 = max(x, 0), max(y, 0)
    x1, y1 = min(x + tw, w), min(y + th, h)
    if x1 <= x0 or y1 <= y0:
        return
    m = mask[y0 - y:y1 - y, x0 - x:x1 - x]
    color = np.asarray(rgb, np.float32)
    for k in range(c):
        img[k, y0:y1, x0:x1] = color[k % len(color)] * m


_FONTS: dict[int, ImageFont.ImageFont] = {}


def _font(size: int):
    if size not in _FONTS:
        try:
            _FONTS[size] = ImageFont.load_default(size=size)
        except (TypeError, OSError, ImportError):   # Pillow without FreeType: fixed bitmap font
            _FONTS[size] = ImageFont.load_default()
    return _FONTS[size]
