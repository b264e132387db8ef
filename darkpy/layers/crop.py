"""`[crop]`: cut a crop_width x crop_height window out of the input image (spec §2.20, §12).

- Training: one random offset per forward pass (the same for the whole batch, as Darknet), drawn
  from the network's random generator, and a random horizontal flip when `flip=1` (without a
  generator in the state, the centre window).
- Inference: the centre window, `((h - crop_h)/2, (w - crop_w)/2)`, never flipped.
- Values become `x*2 - 1` (images in [0,1] -> [-1,1]) unless `noadjust=1`.

`angle`, `saturation`, `exposure` and `shift` are read (so cfgs that set them are clean) but, as on
Darknet's CPU path, do nothing.

Gradients stop here: the layer has no backward, as in Darknet, so nothing before a crop learns. It is
meant to be the first layer, right after the network input.

Resize keeps Darknet's ratio: both new sizes are the new input size times crop_height / height
(height's ratio for the width too, as Darknet does), in float32 and truncated.
"""
from __future__ import annotations

import numpy as np

from .base import Layer, Shape, State, register


@register
class CropLayer(Layer):
    kind = "crop"
    needs_image = True

    def __init__(self, index: int, in_shape: Shape, crop_height: int, crop_width: int, flip: bool = False,
                 noadjust: bool = False, dtype=np.float32):
        c, h, w = in_shape
        super().__init__(index, in_shape, (c, crop_height, crop_width), dtype)
        self.flip = flip
        self.noadjust = noadjust
        self.ratio = np.float32(crop_height) / np.float32(h)   # darknet's l.scale, a float32

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "CropLayer":
        crop_height = sec.get_int("crop_height", 1)
        crop_width = sec.get_int("crop_width", 1)
        flip = sec.get_bool("flip", False)
        noadjust = sec.get_bool("noadjust", False)
        for key, default in (("angle", 0.0), ("saturation", 1.0), ("exposure", 1.0), ("shift", 0.0)):
            sec.get_float(key, default)       # GPU-only augmentation in Darknet: read, no effect
        c, h, w = in_shape
        for key, size, limit, what in (("crop_height", crop_height, h, "height"),
                                       ("crop_width", crop_width, w, "width")):
            if not 1 <= size <= limit:
                raise sec.error(f"must be in 1..{limit}, the input {what} (got {size})", key)
        return cls(sec.index, in_shape, crop_height, crop_width, flip, noadjust, ctx.dtype)

    def compute_out_shape(self, in_shape: Shape) -> Shape:
        c, h, w = in_shape
        return (c, int(self.ratio * np.float32(h)), int(self.ratio * np.float32(w)))

    def resize(self, in_shape: Shape) -> None:
        super().resize(in_shape)
        c, oh, ow = self.out_shape
        if not (1 <= oh <= in_shape[1] and 1 <= ow <= in_shape[2]):
            raise self.error(f"cannot resize to input {in_shape}: the crop would be {ow}x{oh}")

    def forward(self, s: State) -> None:
        c, h, w = self.in_shape
        _, ch, cw = self.out_shape
        x = s.input.reshape(self.batch, c, h, w)
        if s.train and s.rng is not None:
            dh = int(s.rng.integers(0, h - ch + 1))
            dw = int(s.rng.integers(0, w - cw + 1))
            flip = self.flip and bool(s.rng.integers(0, 2))
        else:
            dh, dw, flip = (h - ch) // 2, (w - cw) // 2, False
        window = x[:, :, dh:dh + ch, dw:dw + cw]
        if flip:   # output column j reads input column w - dw - 1 - j
            window = x[:, :, dh:dh + ch, w - dw - cw:w - dw][..., ::-1]
        if self.noadjust:
            np.copyto(self.output, window)
        else:
            np.multiply(window, 2, out=self.output)
            self.output -= 1

    def backward(self, s: State) -> None:
        """None: gradients stop at a crop layer (Darknet has no crop backward either)."""

    def summary(self) -> str:
        c, h, w = self.in_shape
        _, ch, cw = self.out_shape
        return f"Crop Layer: {h} x {w} -> {ch} x {cw} x {c} image"
