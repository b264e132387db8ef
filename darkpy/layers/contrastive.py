"""`[contrastive]` (AlexeyAB): supervised contrastive learning on a detector's embeddings.

What darkpy builds: the layer's inference behaviour, exactly Darknet's. `forward_contrastive_layer`
returns at once outside training, so the output (the input's size, Darknet's `outputs = inputs`)
stays zero and no weights exist; a network that ends in one (yolov4-tiny_contrastive) detects
with its `[yolo]` heads as usual. Keys read: classes, temperature, yolo_layer (must point to a
`[yolo]`; Darknet dereferences a missing one and crashes), cls_normalizer, max_delta,
contrastive_neg_max.

What it refuses: training. Darknet's loss compares every pair of anchor-cell embeddings of the
batch, labelled through the `[yolo]` layer's `embedding_layer` / track-id truth (class and track
id per box), which darkpy's `[yolo]` does not produce; a training forward is a TrainingError that
says so, instead of training without the loss.
"""
from __future__ import annotations

import numpy as np

from ..errors import TrainingError
from .base import Layer, State, fmt_shape, register


@register
class ContrastiveLayer(Layer):
    kind = "contrastive"

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "ContrastiveLayer":
        sec.get_int("classes", 1000)
        for key, default in (("temperature", 1.0), ("cls_normalizer", 1.0), ("max_delta", np.inf)):
            sec.get_float(key, default)
        sec.get_int("contrastive_neg_max", 3)
        value = sec.get_int("yolo_layer", 0)
        if value == 0:                  # darknet: 0 means none, and then it crashes
            raise sec.error("needs yolo_layer= (the [yolo] layer whose boxes label the embeddings; "
                            "darknet crashes without it, 0 included)", "yolo_layer")
        ref = ctx.ref(sec, "yolo_layer", value)
        if ctx.layers[ref].kind != "yolo":
            raise sec.error(f"must point to a [yolo] layer (layer {ref} is [{ctx.layers[ref].kind}])",
                            "yolo_layer")
        layer = cls(sec.index, in_shape, in_shape, ctx.dtype)
        layer.yolo_layer = ref
        layer._truths = ctx.layers[ref].truths     # darknet: l.truths = yolo_layer->truths
        return layer

    @property
    def truths(self) -> int:
        return self._truths

    def forward(self, s: State) -> None:
        if s.train:
            raise TrainingError(f"layer {self.index} [contrastive]: training the contrastive loss is not "
                                f"supported by darkpy (it needs the [yolo] layer's embedding and track-id "
                                f"truths); remove the section to train the detector")
        self.output.fill(0)      # darknet: nothing is computed outside training

    def summary(self) -> str:
        return f"contrastive  yolo {self.yolo_layer:>3}        {fmt_shape(self.in_shape)}   ->  {fmt_shape(self.out_shape)}"
