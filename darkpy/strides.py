"""The total stride of a network (how much its deepest layer shrinks the input) and the input-size
hints built from it.

A network whose routes or shortcuts join layers of different depths only builds when the input
width and height are multiples of its total stride (32 for most YOLOs: five stride-2 steps); a
detector at any other size builds only when the layers' rounding happens to agree, and its grid
cells then do not cover the image evenly. AlexeyAB's Darknet warns about such sizes; darkpy says
which sizes work: `width and height must be multiples of 32 for this network (its strides multiply
to 32); nearest: 96 or 128`.
"""
from __future__ import annotations

import math
from typing import Sequence


def _pow2(ratio: float) -> int:
    return 2 ** max(0, round(math.log2(ratio))) if ratio > 0 else 1


def total_stride(layers: Sequence, width: int, height: int) -> int:
    """The largest factor by which a layer's image output is smaller than the input. Measured on the
    layers built at (width, height) and rounded to a power of two, so the rounding of odd sizes (100
    -> 50 -> 25 -> 13) does not hide the stride that sizes must be a multiple of. 1x1 outputs
    (global pooling) are left out."""
    best = 1
    for layer in layers:
        shape = getattr(layer, "out_shape", ())
        if len(shape) == 3 and shape[1] > 1 and shape[2] > 1:        # not a global pool's 1x1
            best = max(best, _pow2(width / shape[2]), _pow2(height / shape[1]))
    return best


def nearest_sizes(value: int, stride: int) -> list[int]:
    """The multiples of `stride` on either side of `value` (the one above only, when none is below)."""
    low = value // stride * stride
    return [m for m in (low, low + stride) if m > 0]


def size_message(width: int, height: int, stride: int) -> str | None:
    """The hint for an input size that is not a multiple of `stride` (None when both are)."""
    bad = [(k, v) for k, v in (("width", width), ("height", height)) if v % stride]
    if stride <= 1 or not bad:
        return None
    near = "; ".join(f"{k} {v}: nearest " + " or ".join(map(str, nearest_sizes(v, stride))) for k, v in bad) \
        if len({v for _, v in bad}) > 1 else "nearest: " + " or ".join(map(str, nearest_sizes(bad[0][1], stride)))
    return (f"width and height must be multiples of {stride} for this network (its strides multiply to "
            f"{stride}); {near}")
