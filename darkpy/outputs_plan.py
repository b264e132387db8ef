"""Inference memory plan: layer outputs that nothing reads after a forward share one arena.

Every layer owns its `output` buffer, and after a forward every one of them is readable, as in
Darknet. Inference at a large batch pays for that: yolov4-tiny at 416 x 416 holds 2.9 GB of layer
outputs at batch 64, when at most ~0.5 GB of them are alive at any one time. `Network.share_outputs`
gives the layers whose outputs are only read during the forward (by the next layer, or by a later
`[route]`/`[shortcut]`/... through `refs`) views of one arena instead, placed so that two outputs
share memory only when their lives do not overlap:

- layer i's output lives from its own forward (a [maxpool]'s: from the layer before's, which may
  write it, `born`) to its last reader's (`last_uses`): the next layer, and every layer that names
  i in `refs`;
- the network's output layer, cost layers, detection heads and any layer the caller names keep
  buffers of their own (they are read after the forward), as do layers that do not own a plain
  output buffer (`Layer.output_shareable` False: composite layers whose output is an inner
  layer's);
- placement is first come, best fit over the free blocks (`place`), each block 64-byte aligned.

While outputs are shared, a [route] copies no more than it must (`views`, ROUTE_VIEWS): a route of
one part that is its source's whole output, or at batch 1 any contiguous part of it (AlexeyAB's
`groups`), is a view of that part; at batch 1 each source of a route of several parts writes its
output straight into its part of the route's (its output is a view of it), where it can: not kept,
not a part twice, not already a view of another output. Such views share their host's block, whose
life is then the union of all their lives. (yolov4-tiny at b1 spent 1.0 ms of its 31 ms forward in
its eleven routes' copies.)

While outputs are shared, `fuse_pools` also lets a convolution whose output only the next layer, a
2x2 stride-2 [maxpool], reads write that maxpool's output itself (its own output is then never
written): the pooling happens while each block of output is in the cache. A linear 1x1 convolution
read only by a global [avgpool] writes the pool's output the same way, averaging its input first
(layers/conv_averaged.py), and the convolution before it, where only that one reads its output and
it is on the direct path across filters, writes those means instead of its output.

A layer never writes over its own input: the input's life reaches at least to that layer, so the
two never share memory. Outputs other than the kept ones hold garbage after a forward, which is
why this is for inference only: a training forward, or a backward, on such a network is refused.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

#: Block alignment in values of 4 bytes: 64 bytes, a cache line and an AVX-512 vector.
ALIGN = 16
#: `fuse_pools`: a convolution writes the 2x2 [maxpool] after it itself. False: never.
FUSE_POOLS = True
#: `fuse_pools`: a linear 1x1 convolution writes the global [avgpool] after it, averaging first
#: (layers/conv_averaged.py). False: never.
AVERAGE_FIRST = True
#: `fuse_pools`: the convolution before such a pair writes the means of its output maps (the
#: direct path across filters, layers/conv_direct_fv.py). False: never. digits' forward at b64
#: (its 32 -> 64 on 4x4 writes the means for the 64 -> 10), alternating processes, 2 threads:
#: 423-445 -> 361-378 µs (the 3x3 layer skips scattering its outputs into NCHW, the pair its
#: parallel average pool); at b1, and darknet19's at b1, level.
WRITE_MEANS = True
#: `views`: [route] parts written in place. False: every route copies its parts.
ROUTE_VIEWS = True


def last_uses(layers: Sequence) -> list[int]:
    """For each layer, the index of the last layer that reads its output during a forward: the next
    layer (which takes it as input) and every layer whose `refs` name it."""
    last = [min(i + 1, len(layers) - 1) for i in range(len(layers))]
    for j, layer in enumerate(layers):
        for i in getattr(layer, "refs", ()):
            last[i] = max(last[i], j)
    return last


def born(layers: Sequence) -> list[int]:
    """For each layer, the step its output is first written: its own forward, or for a layer the
    one before may write (`pooled_by`: a [maxpool] or [avgpool] that `fuse_pools` may fuse), that one's. A
    fused convolution writes the pool's output while it still reads its own input, in any order
    of blocks, so the two must never share memory."""
    return [i - 1 if i > 0 and hasattr(layer, "pooled_by") else i for i, layer in enumerate(layers)]


def kept_layers(layers: Sequence, output_index: int, keep: Iterable[int] = ()) -> set[int]:
    """Layers whose output must stay readable after a forward (see the module docstring)."""
    kept = {output_index, *keep}
    for i, layer in enumerate(layers):
        if (layer.has_cost or getattr(layer, "is_detection_head", False)
                or not getattr(layer, "output_shareable", True)):
            kept.add(i)
    return kept


def place(sizes: Sequence[int], first: Sequence[int], last: Sequence[int]) -> tuple[list[int], int]:
    """Offsets in one arena for blocks of `sizes` values alive from step first[i] to last[i]
    (inclusive; blocks of size 0 are not placed), and the arena's size. Blocks are placed in order
    of their first step, each in the smallest free gap that holds it (else at the end), after every
    block whose life ended before its first step is freed. Two blocks overlap in memory only if
    their lives do not."""
    order = sorted((i for i, n in enumerate(sizes) if n > 0), key=lambda i: (first[i], i))
    offsets = [0] * len(sizes)
    live: list[int] = []                    # blocks placed and not yet freed
    free: list[tuple[int, int]] = []        # (offset, size) gaps below `end`
    end = 0
    for i in order:
        for j in [j for j in live if last[j] < first[i]]:
            live.remove(j)
            free = _merge(free + [(offsets[j], _aligned(sizes[j]))])
        need = _aligned(sizes[i])
        fits = [g for g in free if g[1] >= need]
        if fits:
            gap = min(fits, key=lambda g: (g[1], g[0]))
            free.remove(gap)
            if gap[1] > need:
                free.append((gap[0] + need, gap[1] - need))
            offsets[i] = gap[0]
        else:
            tail = [g for g in free if g[0] + g[1] == end]     # grow the last gap, if it ends the arena
            start = tail[0][0] if tail else end
            if tail:
                free.remove(tail[0])
            offsets[i] = start
            end = start + need
        live.append(i)
    return offsets, end


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _merge(gaps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent free gaps as one."""
    out: list[tuple[int, int]] = []
    for off, size in sorted(gaps):
        if out and out[-1][0] + out[-1][1] == off:
            out[-1] = (out[-1][0], out[-1][1] + size)
        else:
            out.append((off, size))
    return out


def views(layers: Sequence, kept: set[int], batch: int) -> dict[int, tuple[int, int]]:
    """The outputs that are to be views of another layer's (see the module docstring), as
    {layer: (host layer, first value of an item of the host's output)}; the [route]s (those with
    `source_parts`: also a [dropout], whose inference output is its input) name the parts that
    are then written in place."""
    host: dict[int, tuple[int, int]] = {}
    for r, layer in enumerate(layers):
        parts = getattr(layer, "source_parts", None)
        if parts is None or not _plain(layer):
            continue
        parts = parts()
        if len(parts) == 1:
            i, start, n = parts[0]
            whole = start == 0 and n == layers[i].output[0].size
            if r not in kept and (whole or batch == 1) and _plain(layers[i]):
                host[r] = (i, start)
            continue
        if batch != 1:
            continue
        offset = 0
        sources = [i for i, _, _ in parts]
        for i, start, n in parts:
            if (start == 0 and n == layers[i].output[0].size and sources.count(i) == 1
                    and i not in host and i not in kept and _plain(layers[i])):
                host[i] = (r, offset)
            offset += n
    return host


def _root(host: dict[int, tuple[int, int]], i: int) -> tuple[int, int]:
    """The layer whose buffer holds layer i's output, and where (the values before it, per item)."""
    offset = 0
    while i in host:
        i, start = host[i]
        offset += start
    return i, offset


def _mark_in_place(layers: Sequence, host: dict[int, tuple[int, int]]) -> None:
    """Tell each [route] (and [dropout], a route of one part) which of its parts are written in
    place."""
    for r, layer in enumerate(layers):
        if hasattr(layer, "source_parts"):
            offsets = np.cumsum([0] + [n for _, _, n in layer.source_parts()])
            layer.in_place = [host.get(r) == (i, start) or host.get(i) == (r, int(off))
                              for (i, start, _), off in zip(layer.source_parts(), offsets)]


def apply(layers: Sequence, output_index: int, keep: Iterable[int], dtype) -> tuple[np.ndarray, int]:
    """Point the shareable layers' `output` at views of one new arena, or of the output of the
    layer they are a view of (`views`); their current buffers must be the plain `(batch,
    *out_shape)` ones `allocate` made. Returns the arena and the bytes the replaced buffers took."""
    kept = kept_layers(layers, output_index, keep)
    host = views(layers, kept, layers[0].batch) if ROUTE_VIEWS and layers else {}
    first, last = born(layers), last_uses(layers)
    for i in host:                              # a host's block lives as long as all its views
        r, _ = _root(host, i)
        first[r], last[r] = min(first[r], first[i]), max(last[r], last[i])
    sizes = [0 if i in kept or i in host or not _plain(layer) else layer.output.size
             for i, layer in enumerate(layers)]
    offsets, total = place(sizes, first, last)
    raw = np.empty(max(total, 1) + ALIGN, dtype)
    arena = raw[(-raw.ctypes.data // raw.itemsize) % ALIGN:][:max(total, 1)]
    replaced = 0
    for i, layer in enumerate(layers):
        if sizes[i]:
            replaced += layer.output.nbytes
            layer.output = arena[offsets[i]:offsets[i] + sizes[i]].reshape(layer.output.shape)
    for i in host:
        r, offset = _root(host, i)
        out = layers[i].output
        replaced += out.nbytes
        layers[i].output = layers[r].output.reshape(-1)[offset:offset + out.size].reshape(out.shape)
    _mark_in_place(layers, host)
    return arena, replaced


def fuse_pools(layers: Sequence, output_index: int, keep: Iterable[int]) -> int:
    """Let each layer whose output only the next layer, a [maxpool] or an [avgpool], reads (and
    that is not kept) write that pool's output itself where it can: into a 2x2 stride-2 maxpool
    (`can_write_pooled`: a convolution's Winograd or direct path, pooling each block of output
    while the block is in the cache), into a global avgpool (`can_write_averaged`: a linear 1x1
    convolution, averaging its input first; the convolution before it may then write the means
    itself, `_write_means`). Its own output is then never written, and the pool's forward does
    nothing. Returns the pairs fused. Run after `apply`, on layers `allocate` has just
    reset."""
    if not FUSE_POOLS:
        return 0
    kept = kept_layers(layers, output_index, keep)
    last = last_uses(layers)
    fused = 0
    for i in range(len(layers) - 1):
        layer, pool = layers[i], layers[i + 1]
        if i in kept or last[i] != i + 1 or not hasattr(pool, "pooled_by"):
            continue
        if hasattr(layer, "can_write_pooled") and layer.can_write_pooled(pool):
            layer.pool_into = pool
        elif AVERAGE_FIRST and hasattr(layer, "can_write_averaged") and layer.can_write_averaged(pool):
            layer.average_into = pool
            layer.averaged_scratch()
            _write_means(layers, i, kept, last)
        else:
            continue
        pool.pooled_by = layer
        fused += 1
    return fused


def _write_means(layers: Sequence, i: int, kept: set[int], last: list[int]) -> None:
    """Let the layer before layers[i] (a convolution that averages its input first), when only
    layers[i] reads its output and it is not kept, write the means of its output maps straight
    into layers[i] where it can (`can_write_means`): its own output is then never written."""
    if not WRITE_MEANS or i == 0 or i - 1 in kept or last[i - 1] != i:
        return
    prev = layers[i - 1]
    if hasattr(prev, "can_write_means") and prev.can_write_means():
        prev.means_into, layers[i].means_by = layers[i], prev


def output_bytes(layers: Sequence) -> int:
    """Bytes of the distinct buffers the layers' outputs live in (an arena counted once)."""
    return distinct_bytes(layer.output for layer in layers)


def distinct_bytes(arrays: Iterable[np.ndarray]) -> int:
    """Bytes of the distinct buffers the arrays live in (views of one buffer count it once)."""
    seen = {}
    for a in arrays:
        buf = a if a.base is None else a.base
        seen[id(buf)] = buf.nbytes
    return sum(seen.values())


def _plain(layer) -> bool:
    """The layer owns an ordinary C-contiguous `(batch, *out_shape)` output."""
    out = layer.output
    return (isinstance(out, np.ndarray) and out.base is None and out.flags.c_contiguous
            and out.shape == (layer.batch, *layer.out_shape))
