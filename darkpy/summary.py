"""Darknet's layer table (spec §13) plus totals: parameters, BFLOPs, buffer memory.

The table is Darknet's own (header, then `%5d ` and each layer's line), so it reads like the one
Darknet prints when it loads a network; darkpy's own sections (embedding, layernorm, attention,
crossentropy) add their parameter count and FLOPs per token (row) to their line. The totals below it are darkpy's: learnable parameters (and
the `.weights` file size they make), BFLOPs summed over every layer that reports them, and the memory
of the preallocated buffers (output, delta, loss, per-layer caches, the largest im2col workspace).
"""
from __future__ import annotations

HEADER = "layer     filters    size              input                output"


def _buffer_bytes(net) -> int:
    if getattr(net, "shapes_only", False):      # nothing allocated: outputs and workspace, from shapes
        total = sum(net.batch * layer.outputs * net.dtype.itemsize for layer in net.layers)
        cols = [getattr(layer, "col_shape", None) for layer in net.layers]
        return total + max((c[0] * c[1] for c in cols if c is not None and len(c) == 2),
                           default=0) * net.dtype.itemsize
    total = 0
    for layer in net.layers:
        for name in ("output", "delta", "loss"):
            arr = getattr(layer, name, None)
            if arr is not None:
                total += arr.nbytes
        for extra in getattr(layer, "extra_buffers", lambda: [])():
            total += extra.nbytes
    # the im2col workspace is shared by every convolution: its size is the largest one's
    cols = [getattr(layer, "col_shape", None) for layer in net.layers]
    sizes = [c[0] * c[1] for c in cols if c is not None and len(c) == 2]
    total += max(sizes, default=0) * net.dtype.itemsize
    return total


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"  # pragma: no cover


def summary_text(net) -> str:
    """The layer table and the totals, as printed by `darkpy summary`."""
    lines = [HEADER]
    flops = 0.0
    for layer in net.layers:
        flops += layer.flops()
        line = f"{layer.index:5d} {layer.summary()}"
        if getattr(layer, "own_section", False):
            # darkpy's own sections (no Darknet line to match): their parameters and FLOPs per row
            n = sum(arr.size for arr in layer.weight_arrays())
            line += f"  {n:,} params, {layer.flops():,.0f} FLOPs/token"
        lines.append(line)
    params = sum(a.size for layer in net.layers for a in layer.weight_arrays())
    learnable = sum(p.value.size for layer in net.layers for p in layer.params)
    file_bytes = 20 + 4 * params
    bflops = flops / 1e9
    lines.append(f"Input: {' x '.join(str(d) for d in reversed(net.input_shape))}, "
                 f"{len(net.layers)} layers")
    lines.append(f"Parameters: {params:,} in the .weights file ({_human_bytes(file_bytes)}), "
                 f"{learnable:,} learnable")
    lines.append(f"BFLOPs: {bflops:.3f}" if bflops >= 0.01 else f"BFLOPs: {bflops:.6f}")
    what = " (outputs and im2col workspace)" if getattr(net, "shapes_only", False) else ""
    lines.append(f"Buffers: {_human_bytes(_buffer_bytes(net))} at batch {net.batch}{what}")
    return "\n".join(lines)
