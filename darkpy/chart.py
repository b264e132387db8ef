"""The loss chart (`chart.png` in the backup folder), drawn with Pillow: no GUI, no display needed.

Per-iteration losses are light dots, Darknet's running average a dark blue line; the x axis spans
the whole planned run (max_batches) so the chart also shows how far training has come. The loss axis
is logarithmic when the losses span a wide range (a detector starts near 60 and ends near 1), else
linear and cut at a high percentile, so the early iterations do not flatten the rest of the curve.
mAP (`--map`) or top-1 accuracy is a red line on a 0-100 % axis on the right, as in AlexeyAB's chart.
"""
from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from .atomic import atomic_write

W, H = 800, 500
LEFT, RIGHT, TOP, BOTTOM = 70, 40, 40, 50


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


#: colours: AlexeyAB's chart has a blue loss and a red mAP line
LOSS_DOTS = (150, 185, 240)
AVG_LINE = (20, 60, 170)
METRIC_LINE = (220, 20, 20)
#: above this ratio of the largest to the smallest loss, the loss axis is logarithmic
LOG_RANGE = 10.0


def _log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks covering [lo, hi] (a logarithmic axis)."""
    ticks = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0 ** e
            if lo <= v <= hi:
                ticks.append(v)
    return ticks


def draw_loss_chart(path: str | os.PathLike, iterations: Sequence[int], losses: Sequence[float],
                    avg_losses: Sequence[float], max_batches: int = 0, title: str = "",
                    metric: Sequence[tuple[int, float]] = (), metric_name: str = "mAP@0.5") -> None:
    """Write the chart PNG to `path` atomically (temp file + rename).

    `metric`: (iteration, value in [0, 1]) points (mAP with --map, a classifier's top-1 accuracy),
    drawn as a red line against a 0-100 % axis on the right. The loss axis is logarithmic when the
    losses span more than a factor LOG_RANGE (the first iterations of a detector: 60, then 2), so
    the early losses do not flatten the rest of the curve; else linear, cut at a high percentile."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    it = np.asarray(iterations, np.float64)
    loss = np.asarray(losses, np.float64)
    avg = np.asarray(avg_losses, np.float64)
    finite = np.concatenate([loss[np.isfinite(loss)], avg[np.isfinite(avg)]])
    positive = finite[finite > 0]
    x_hi = float(max(max_batches, it.max() if it.size else 1, 1))
    log_axis = positive.size > 1 and positive.max() / positive.min() > LOG_RANGE
    if log_axis:
        y_lo, y_hi = float(positive.min()) / 1.1, float(positive.max()) * 1.1
    else:
        y_lo = 0.0
        y_hi = float(np.percentile(finite, 98)) * 1.1 if finite.size else 1.0
        y_hi = y_hi if y_hi > 0 else 1.0
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x):
        return LEFT + x / x_hi * pw

    def py(y):
        if log_axis:
            f = (math.log(max(y, y_lo)) - math.log(y_lo)) / (math.log(y_hi) - math.log(y_lo))
        else:
            f = y / y_hi
        return TOP + ph - min(max(f, 0.0), 1.0) * ph

    for t in (_log_ticks(y_lo, y_hi) if log_axis else nice_ticks(0.0, y_hi)):
        y = py(t)
        d.line([(LEFT, y), (LEFT + pw, y)], fill=(225, 225, 225))
        d.text((LEFT - 8, y), _fmt(t), fill="black", font=font, anchor="rm")
    for t in nice_ticks(0.0, x_hi):
        x = px(t)
        d.line([(x, TOP), (x, TOP + ph)], fill=(235, 235, 235))
        d.text((x, TOP + ph + 6), _fmt(t), fill="black", font=font, anchor="mt")
    d.rectangle([LEFT, TOP, LEFT + pw, TOP + ph], outline="black")
    d.text((LEFT + pw / 2, H - 14), "iteration", fill="black", font=font, anchor="mm")
    d.text((12, TOP + ph / 2), "loss" + (" (log)" if log_axis else ""), fill="black", font=font, anchor="lm")
    head = title or "training loss"
    if it.size:
        head += f"   iteration {int(it[-1])}" + (f"/{max_batches}" if max_batches else "")
        if np.isfinite(avg[-1]):
            head += f"   avg loss {avg[-1]:.4f}"
    points = [(float(x), float(v)) for x, v in metric if math.isfinite(v)]
    if points:
        head += f"   {metric_name} {100 * points[-1][1]:.1f} % (best {100 * max(v for _, v in points):.1f} %)"
    d.text((LEFT, TOP / 2), head, fill="black", font=font, anchor="lm")
    for x, y in zip(it, loss):
        if math.isfinite(y):
            cx, cy = px(x), py(y)
            d.ellipse([cx - 1.5, cy - 1.5, cx + 1.5, cy + 1.5], fill=LOSS_DOTS)
    pts = [(px(x), py(y)) for x, y in zip(it, avg) if math.isfinite(y)]
    if len(pts) > 1:
        d.line(pts, fill=AVG_LINE, width=2)
    d.text((LEFT + pw - 8, TOP + 8), "loss", fill=(90, 130, 210), font=font, anchor="ra")
    d.text((LEFT + pw - 8, TOP + 22), "avg loss", fill=AVG_LINE, font=font, anchor="ra")
    if points:
        _draw_metric(d, font, points, metric_name, px, pw, ph)

    atomic_write(path, lambda f: img.save(f, format="PNG"))


def _draw_metric(d, font, points, name: str, px, pw: float, ph: float) -> None:
    """The red metric line and its 0-100 % axis on the right of the plot."""
    def my(v: float) -> float:
        return TOP + ph - min(max(v, 0.0), 1.0) * ph

    right = LEFT + pw
    for pct in range(0, 101, 20):
        y = my(pct / 100)
        d.line([(right, y), (right + 4, y)], fill=METRIC_LINE)
        d.text((right + 6, y), f"{pct}", fill=METRIC_LINE, font=font, anchor="lm")
    xy = [(px(x), my(v)) for x, v in points]
    if len(xy) > 1:
        d.line(xy, fill=METRIC_LINE, width=2)
    for cx, cy in xy:
        d.ellipse([cx - 3, cy - 3, cx + 3, cy + 3], fill=METRIC_LINE)
    d.text((right - 8, TOP + 36), f"{name} (%)", fill=METRIC_LINE, font=font, anchor="ra")
