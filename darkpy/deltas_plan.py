"""Training memory plan: layer deltas that live only inside the backward share one arena.

Every layer owns its `delta` buffer, the size of its output, and after a backward every one of them
is readable, as in Darknet. Training pays for that: cifar.cfg at batch 128 holds 306 MB of deltas,
when at most two large layers' deltas (98 MB) are in use at any one moment of a backward (the
arena this plan places them in: 110 MB). As PyTorch's autograd frees a gradient once it has been
passed on, `Network.share_deltas` gives the deltas that nothing needs outside the backward views of
one arena, placed so that two share memory only when their lives do not overlap:

- in a backward (layers last to first), layer i's delta lives from the backward of its first
  writer, the highest-index layer that adds into it (the next layer, and every layer whose `refs`
  name it: `outputs_plan.last_uses`), to its own backward, which reads it; the step at which
  that first writer runs zeroes it (`zero_before`), as the forward zeroes an owned delta;
- cost layers, detection heads and the last layer keep deltas of their own (they write theirs in
  the forward), as do layers that do not own a plain delta (`Layer.output_shareable` False:
  composite layers whose delta is an inner layer's);
- placement is `outputs_plan.place`, over backward steps instead of forward ones.

The arena is zeroed at each forward too, so a forward without truth leaves nothing stale that reads
as current. After a backward, the shared deltas hold whatever the last layer to use their memory
left there; `share_deltas(False)` gives every layer its own again.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import outputs_plan
from .outputs_plan import distinct_bytes, last_uses, place

#: False: `share_deltas()` leaves every layer its own delta (for measuring what sharing changes).
SHARE = True


def kept_layers(layers: Sequence) -> set[int]:
    """Layers whose delta is their own: written in the forward (cost layers, detection heads, the
    last layer) or not a plain buffer of their own (composite layers) — the layers the inference
    plan keeps, with the last layer as the one read after."""
    return outputs_plan.kept_layers(layers, len(layers) - 1)


def apply(layers: Sequence, dtype) -> tuple[np.ndarray, dict[int, list[int]]]:
    """Point the shareable layers' `delta` at views of one new arena, shaped `(batch, *out_shape)`
    (run before `allocate_training`, which keeps a delta of that shape). Returns the arena and, for
    each layer index j, the layers whose deltas a backward zeroes just before layer j's backward."""
    n = len(layers)
    kept = kept_layers(layers)
    last = last_uses(layers)
    sizes = [0 if i in kept else layer.batch * layer.outputs for i, layer in enumerate(layers)]
    offsets, total = place(sizes, [n - 1 - last[i] for i in range(n)], [n - 1 - i for i in range(n)])
    arena = np.zeros(max(total, 1), dtype)
    zero_before: dict[int, list[int]] = {}
    for i, layer in enumerate(layers):
        if sizes[i]:
            layer.delta = arena[offsets[i]:offsets[i] + sizes[i]].reshape(layer.batch, *layer.out_shape)
            zero_before.setdefault(last[i], []).append(i)
    return arena, zero_before


def delta_bytes(layers: Sequence) -> int:
    """Bytes of the distinct buffers the layers' deltas live in (an arena counted once)."""
    return distinct_bytes(layer.delta for layer in layers)
