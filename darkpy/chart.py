"""The loss chart (`chart.png` in the backup folder), drawn with Pillow: no GUI, no display needed.

Per-iteration losses are light dots, Darknet's running average a dark line; the x axis spans the
whole planned run (max_batches) so the chart also shows how far training has come. The y axis is
cut at a high percentile of the losses, so one early spike does not flatten the rest of the curve.
"""
from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from .atomic import atomic_write

W, H = 800, 500
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 50


def nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """About `n` round tick values covering [lo, hi]."""
    if not hi > lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e5 else f"{v:.0e}"


def draw_loss_chart(path: str | os.PathLike, iterations: Sequence[int], losses: Sequence[float],
                    avg_losses: Sequence[float], max_batches: int = 0, title: str = "") -> None:
    """Write the chart PNG to `path` atomically (temp file + rename)."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    it = np.asarray(iterations, np.float64)
    loss = np.asarray(losses, np.float64)
    avg = np.asarray(avg_losses, np.float64)
    finite = np.concatenate([loss[np.isfinite(loss)], avg[np.isfinite(avg)]])
    x_hi = float(max(max_batches, it.max() if it.size else 1, 1))
    y_hi = float(np.percentile(finite, 98)) * 1.1 if finite.size else 1.0
    y_hi = y_hi if y_hi > 0 else 1.0
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x):
        return LEFT + x / x_hi * pw

    def py(y):
        return TOP + ph - min(max(y / y_hi, 0.0), 1.0) * ph

    for t in nice_ticks(0.0, y_hi):
        y = py(t)
        d.line([(LEFT, y), (LEFT + pw, y)], fill=(225, 225, 225))
        d.text((LEFT - 8, y), _fmt(t), fill="black", font=font, anchor="rm")
    for t in nice_ticks(0.0, x_hi):
        x = px(t)
        d.line([(x, TOP), (x, TOP + ph)], fill=(235, 235, 235))
        d.text((x, TOP + ph + 6), _fmt(t), fill="black", font=font, anchor="mt")
    d.rectangle([LEFT, TOP, LEFT + pw, TOP + ph], outline="black")
    d.text((LEFT + pw / 2, H - 14), "iteration", fill="black", font=font, anchor="mm")
    d.text((12, TOP + ph / 2), "loss", fill="black", font=font, anchor="lm")
    head = title or "training loss"
    if it.size:
        head += f"   iteration {int(it[-1])}" + (f"/{max_batches}" if max_batches else "")
        if np.isfinite(avg[-1]):
            head += f"   avg loss {avg[-1]:.4f}"
    d.text((LEFT, TOP / 2), head, fill="black", font=font, anchor="lm")
    for x, y in zip(it, loss):
        if math.isfinite(y):
            cx, cy = px(x), py(y)
            d.ellipse([cx - 1.5, cy - 1.5, cx + 1.5, cy + 1.5], fill=(150, 185, 240))
    pts = [(px(x), py(y)) for x, y in zip(it, avg) if math.isfinite(y)]
    if len(pts) > 1:
        d.line(pts, fill=(180, 20, 20), width=2)
    d.text((LEFT + pw - 8, TOP + 8), "loss", fill=(90, 130, 210), font=font, anchor="ra")
    d.text((LEFT + pw - 8, TOP + 22), "avg loss", fill=(180, 20, 20), font=font, anchor="ra")

    atomic_write(path, lambda f: img.save(f, format="PNG"))
