"""Darknet's layer table (spec §13) plus totals: parameters, BFLOPs, buffer memory."""
from __future__ import annotations


def summary_text(net) -> str:
    lines = ["layer     filters    size              input                output"]
    total_flops = 0.0
    for layer in net.layers:
        total_flops += layer.flops()
        lines.append(f"{layer.index:5d} {layer.summary()}")
    params = sum(a.size for l in net.layers for a in l.weight_arrays())
    buffers = 0
    for layer in net.layers:
        for name in ("output", "delta", "loss"):
            arr = getattr(layer, name, None)
            if arr is not None:
                buffers += arr.nbytes
        for extra in getattr(layer, "extra_buffers", lambda: [])():
            buffers += extra.nbytes
    lines.append(f"Total: {len(net.layers)} layers, {params:,} parameters, {total_flops / 1e9:.3f} BFLOPs, "
                 f"{buffers / 2**20:.1f} MiB of buffers at batch {net.batch}")
    return "\n".join(lines)
