"""Where onnxruntime's model comes from (`python -m benchmarks.run --onnx-from NAME`).

An exporter is a function `(phase, path, outputs)` that writes the network of `phase` (an
`engine.Phase`: its `spec`, `prep` with the weights file, `batch`) at the phase's batch as an ONNX
file at `path` whose outputs include `layer<i>` for each darkpy layer i of `outputs` (the heads
and the logits feeding a softmax head: what the output check compares; the ONNX Runtime worker runs
those outputs, by name, and nothing else), and its one input `input`, the image batch. It raises
`engine.Unavailable` when it cannot. It runs when the phase starts, before any sample (the torch
export in a worker session of its own), never beside one.

`darkpy` (the default) is darkpy's own exporter, the model `darkpy export` writes; `torch` exports
the torch translation with torch.onnx.export (a cross-check of the exporter, not the normal source).
"""
from __future__ import annotations

import warnings

from .engine import Phase, Unavailable, edits_for


def onnx_via_torch(phase: Phase, path: str, outputs: list[int]) -> str:
    """Export the torch translation (same weights; NCHW) with torch.onnx.export, in a torch worker."""
    if not phase.prep.spec:
        raise Unavailable(f"no torch translation to export ({phase.prep.unsupported})")
    phase.session("torch", [("export_onnx", {"path": path, "outputs": outputs})], record=False, drop=False)
    return path


def onnx_via_darkpy(phase: Phase, path: str, outputs: list[int]) -> str:
    """darkpy's exporter (`darkpy.export_onnx`, BN folded, raw heads) on the network at the phase's
    batch, with `layers=outputs`: each compared layer also as the output `layer<i>`."""
    try:
        from darkpy.export import export_onnx
    except ImportError as e:
        raise Unavailable(f"darkpy's exporter needs onnx ({e})") from None
    from darkpy.cfg import CfgWarning, load_cfg
    from darkpy.network import Network

    doc = load_cfg(phase.spec.cfg)
    for key, value in edits_for(phase.spec, phase.batch).items():
        doc.set(key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CfgWarning)
        net = Network(doc, batch=phase.batch)
    net.load_weights(phase.prep.weights)
    export_onnx(net, path, layers=outputs)
    return path


#: Where onnxruntime's model comes from: `--onnx-from NAME`.
ONNX_EXPORTERS = {"darkpy": onnx_via_darkpy, "torch": onnx_via_torch}
