"""Partial weights: the first N layers of a weights file, for starting a new network from a
pretrained backbone (Darknet's `partial` command and its `NAME.conv.N` files, e.g.
`yolov4-tiny.conv.29`), and the hint a weights-size error gives when such a start would work.

Darknet's `partial CFG WEIGHTS OUT N` loads the first N layers of WEIGHTS into the network of CFG and
writes them with `seen` = 0, so training from OUT starts its iteration count at 0. darkpy does the
same (`make_partial`), and `darkpy train --upto N` (or a weights file named `*.conv.N`) loads the
first N layers of any weights file into the network being trained.
"""
from __future__ import annotations

import os
import re
import shlex

from .errors import DarkpyError, WeightsError

_CONV_N = re.compile(r"\.conv\.(\d+)$")


def partial_layers(weights: str | os.PathLike) -> int | None:
    """N for a Darknet partial file named `NAME.conv.N` (yolov4-tiny.conv.29 -> 29), else None."""
    m = _CONV_N.search(os.path.basename(os.fspath(weights)))
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def make_partial(cfg: str | os.PathLike, weights: str | os.PathLike, out: str | os.PathLike, n: int):
    """Write layers 0..n-1 of `weights` (read with the network of `cfg`) to `out`, with seen = 0.
    The weights file may hold more layers than that (any file of the same network does). Returns
    the network, with those layers loaded."""
    from .network import load_network

    net = load_network(cfg)
    if not 0 < n <= len(net.layers):
        raise DarkpyError(f"{cfg}: has {len(net.layers)} layers; N must be 1..{len(net.layers)} (got {n})")
    net.load_weights(weights, upto=n)
    net.seen = 0
    net.save_weights(out, upto=n)
    return net


def class_independent_layers(net) -> int:
    """How many leading layers keep their shapes when the number of classes changes: all before the
    input of the first detection head (whose filters are (classes + 5) * anchors), or, in a
    classifier, all before its last layer with weights."""
    heads = [layer.index for layer in net.layers if getattr(layer, "is_detection_head", False)]
    if heads:
        return max(min(heads) - 1, 0)
    weighted = [layer.index for layer in net.layers if any(a.size for a in layer.weight_arrays())]
    return weighted[-1] if weighted else 0


def weights_hint(error: WeightsError, net, cfg, weights, data=None) -> str:
    """The message for a weights file that does not fit `net`: when the file is long enough for the
    class-independent first layers, the exact commands that start from them."""
    from .weights import expected_bytes, read_header

    if not getattr(error, "mismatch", True):      # not a size mismatch: no hint about other cfgs
        return str(error)
    n = class_independent_layers(net)
    try:
        size = os.path.getsize(weights)
        with open(weights, "rb") as f:
            hsize = read_header(f.read(20), os.fspath(weights))[4]
    except (OSError, WeightsError):
        return str(error)
    if n <= 0 or size < expected_bytes(net, n, hsize) or size == expected_bytes(net, None, hsize):
        return f"{error} (was it trained with another cfg, input size or number of classes?)"
    q = shlex.quote
    w, c = os.fspath(weights), os.fspath(cfg)
    out = f"{os.path.splitext(os.path.basename(w))[0]}.conv.{n}"
    data_arg = f" --data {q(os.fspath(data))}" if data is not None else ""
    base = str(error).split("; to load only the first N layers")[0]    # the exact commands replace the generic hint
    return (f"{base}. If it is this network trained for another number of classes, its first {n} layers "
            f"fit: `darkpy train {q(c)}{data_arg} --weights {q(w)} --upto {n}`, or cut them once with "
            f"`darkpy partial {q(c)} {q(w)} {q(out)} {n}` and train with --weights {q(out)}")
