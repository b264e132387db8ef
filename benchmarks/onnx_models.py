"""Where onnxruntime's model comes from (`python -m benchmarks.run --onnx-from NAME`).

An exporter is a function `(phase, path, outputs)` that writes the network of `phase` (an
`engine.Phase`: its `spec`, `prep` with the weights file, `batch`) at the phase's batch as an ONNX
file at `path`, whose outputs are, in order, the darkpy layers `outputs` (the heads and the logits
feeding a softmax head: what the output check compares), and its one input the image batch. It
raises `engine.Unavailable` when it cannot. It runs when the phase starts, before any sample (the
torch export in a worker session of its own), never beside one.
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
    """darkpy's own exporter (darkpy.export_onnx, being written elsewhere). The hook calls
    `export_onnx(net, path)` on the network at the phase's batch; its outputs must be, in order,
    the layers `outputs` (the heads and softmax logits). Adjust this call to the exporter's API."""
    import darkpy

    export = getattr(darkpy, "export_onnx", None)
    if export is None:
        raise Unavailable("darkpy.export_onnx does not exist yet (use --onnx-from torch)")
    from darkpy.cfg import CfgWarning, load_cfg
    from darkpy.network import Network

    doc = load_cfg(phase.spec.cfg)
    for key, value in edits_for(phase.spec, phase.batch).items():
        doc.set(key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CfgWarning)
        net = Network(doc, batch=phase.batch)
    net.load_weights(phase.prep.weights)
    export(net, path)
    return path


#: Where onnxruntime's model comes from: `--onnx-from NAME`.
ONNX_EXPORTERS = {"torch": onnx_via_torch, "darkpy": onnx_via_darkpy}
