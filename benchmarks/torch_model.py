"""Translate a darkpy network into PyTorch modules with the same semantics and the same weights.

`TorchNet(layers)` takes darkpy's built layers (`Network.layers`, or `darkpy.network.build_layers`'s
list, with their weights already loaded) and makes one torch step per darkpy layer, so layer `i` of
one is layer `i` of the other and outputs compare index by index. The weights are copied, never
shared. What "the same semantics" means, layer by layer (spec §2, §5):

- convolutional: `nn.Conv2d` (padding = darkpy padding × dilation, groups), then Darknet batch norm
  (eps 1e-5 inside the square root, rolling statistics 0.99/0.01, β = the conv's `biases`) or the
  bias, then the activation (leaky slope 0.1). connected: the same on the flattened input.
- maxpool: Darknet pads a TOTAL of `padding` (default size-1) with the window starting at
  -(padding//2), so the extra row/column is on the bottom/right: `F.pad` with -inf on exactly the
  sides a window reaches, or torch's own padding when that is symmetric.
- avgpool: global mean. dropout: inverted dropout (identity at inference). softmax: over `groups`
  contiguous chunks of the flat input, of x/temperature. route: concatenation (AlexeyAB's
  groups/group_id take one channel chunk). shortcut: alpha·prev + beta·from over Darknet's overlap
  (the first min(c, c2) channels, a resampled `from`), then the activation.
  upsample: nearest neighbour × stride, times scale. yolo: the head's activations (logistic on x, y,
  objectness and classes, identity on w, h; `scale_x_y`, `new_coords`).

`export_onnx` writes a TorchNet as ONNX (for the benchmark's ONNX Runtime contender).

Training (`TorchNet.loss` + `make_optimizer`) is Darknet's step written the PyTorch way (spec §6.3):
loss = softmax cross-entropy summed over the batch, or the sum of the `[yolo]` heads' losses
(`torch_yolo.py`: equal to darkpy's deltas), divided by the full batch B (darkpy's update divides
its summed gradient by B), and SGD with momentum, dampening 0 and weight decay on conv and
connected weights only, at darkpy's learning rate times each layer's `learning_rate` scale.

One difference is on purpose: darkpy normalises a training batch by the UNBIASED batch variance
(÷(N−1), as Darknet); torch's fast batch norm uses the biased one (÷N). The benchmark uses torch's
fast kernel (N is batch × pixels, so the two differ by far less than the check's tolerance); pass
`exact_bn=True` to get darkpy's formula exactly (the translator test does, to compare a training
step to the last bit that float32 allows).
"""
from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import torch_yolo

EPS = 1e-5          # Darknet/darkpy batch norm: sqrt(var + 1e-5)
BN_MOMENTUM = 0.01  # rolling = 0.99·rolling + 0.01·batch statistic


class Unsupported(Exception):
    """The network has a layer (or an option) that this translator does not cover."""


# -- activations -----------------------------------------------------------------------------------

def _act(name: str):
    """A function x -> act(x) that may overwrite x (every caller passes a tensor it just made)."""
    table = {
        "linear": lambda x: x,
        "leaky": lambda x: F.leaky_relu_(x, 0.1),
        "relu": F.relu_,
        "logistic": torch.sigmoid_,
        "tanh": torch.tanh_,
        "relie": lambda x: F.leaky_relu_(x, 0.01),
        "ramp": lambda x: F.relu(x) + 0.1 * x,
        "elu": lambda x: F.elu_(x),
        "loggy": lambda x: 2.0 * torch.sigmoid(x) - 1.0,
        "hardtan": lambda x: x.clamp_(-1.0, 1.0),
        "selu": lambda x: torch.where(x >= 0, 1.0507 * x, (1.0507 * 1.6732) * torch.expm1(x)),
        "swish": F.silu,
        "mish": F.mish,
        "gelu": lambda x: F.gelu(x, approximate="tanh"),
        "relu6": lambda x: F.hardtanh_(x, 0.0, 6.0),
        "revleaky": lambda x: F.leaky_relu_(x, 0.1),
    }
    if name not in table:
        raise Unsupported(f"activation {name!r} has no torch translation")
    return table[name]


def _t(a) -> torch.Tensor:
    """A torch copy of a numpy array (never a view: the two frameworks must not share memory)."""
    return torch.from_numpy(a.copy())


def _image(x: torch.Tensor, shape) -> torch.Tensor:
    """x as (B, C, H, W) for an image layer whose input darkpy sees as `shape`."""
    return x if x.dim() == 4 else x.reshape(x.shape[0], *shape)


# -- batch norm ------------------------------------------------------------------------------------

class DarknetBN(nn.Module):
    """Batch norm over channels of (B, C, ...) as darkpy computes it (see the module docstring)."""

    def __init__(self, scales, biases, rolling_mean, rolling_variance, exact: bool = False):
        super().__init__()
        self.weight = nn.Parameter(_t(scales))
        self.bias = nn.Parameter(_t(biases))
        self.register_buffer("running_mean", _t(rolling_mean))
        self.register_buffer("running_var", _t(rolling_variance))
        self.exact = exact

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.exact):
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                self.training, BN_MOMENTUM, EPS)
        dims = [0, *range(2, x.dim())]
        shape = (1, -1) + (1,) * (x.dim() - 2)
        mean = x.mean(dims)
        var = x.var(dims, unbiased=True)
        with torch.no_grad():
            self.running_mean.mul_(1 - BN_MOMENTUM).add_(BN_MOMENTUM * mean)
            self.running_var.mul_(1 - BN_MOMENTUM).add_(BN_MOMENTUM * var)
        xn = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + EPS)
        return xn * self.weight.view(shape) + self.bias.view(shape)


def _bn_of(d: dict, exact: bool) -> DarknetBN | None:
    bn = d["bn"]
    if bn is None:
        return None
    return DarknetBN(bn["scales"], d["biases"], bn["rolling_mean"], bn["rolling_variance"], exact)


# -- one step per darkpy layer -----------------------------------------------------------------------

class Step(nn.Module):
    """One darkpy layer: `forward(x, saved)` gets the previous output and the saved outputs of the
    layers that later layers refer to (by absolute index)."""

    def __init__(self, d: dict):
        super().__init__()
        self.index, self.kind = d["index"], d["kind"]
        self.in_shape, self.out_shape, self.refs = d["in_shape"], d["out_shape"], d["refs"]


class Conv(Step):
    def __init__(self, d, exact_bn):
        super().__init__(d)
        self.conv = nn.Conv2d(d["in_shape"][0], d["n"], d["size"], stride=(d["stride_y"], d["stride_x"]),
                              padding=d["padding"] * d["dilation"], dilation=d["dilation"],
                              groups=d["groups"], bias=d["bn"] is None)
        with torch.no_grad():
            self.conv.weight.copy_(_t(d["weights"]))
            if d["bn"] is None:
                self.conv.bias.copy_(_t(d["biases"]))
        self.bn = _bn_of(d, exact_bn)
        self.act = _act(d["activation"])

    def forward(self, x, saved):
        y = self.conv(_image(x, self.in_shape))
        if self.bn is not None:
            y = self.bn(y)
        return self.act(y)


class Connected(Step):
    def __init__(self, d, exact_bn):
        super().__init__(d)
        self.fc = nn.Linear(d["weights"].shape[1], d["n"], bias=d["bn"] is None)
        with torch.no_grad():
            self.fc.weight.copy_(_t(d["weights"]))
            if d["bn"] is None:
                self.fc.bias.copy_(_t(d["biases"]))
        self.bn = _bn_of(d, exact_bn)
        self.act = _act(d["activation"])

    def forward(self, x, saved):
        y = self.fc(x.flatten(1))
        if self.bn is not None:
            y = self.bn(y)
        return self.act(y)


class MaxPool(Step):
    def __init__(self, d):
        super().__init__(d)
        _, h, w = d["in_shape"]
        _, oh, ow = d["out_shape"]
        size, sy, sx = d["size"], d["stride_y"], d["stride_x"]
        self.size, self.stride = size, (sy, sx)
        lead = d["padding"] // 2           # darkpy's window origin is -(padding // 2)
        tail_h = max(0, (oh - 1) * sy + size - (h + lead))
        tail_w = max(0, (ow - 1) * sx + size - (w + lead))
        self.pads = (lead, tail_w, lead, tail_h)     # F.pad order: left, right, top, bottom
        # torch pads symmetrically (with -inf, up to half the window) by itself: use that when it fits
        self.native = (tail_h == tail_w == lead and 2 * lead <= size)

    def forward(self, x, saved):
        x = _image(x, self.in_shape)
        if self.native:
            return F.max_pool2d(x, self.size, self.stride, padding=self.pads[0])
        if any(self.pads):
            x = F.pad(x, self.pads, value=float("-inf"))
        return F.max_pool2d(x, self.size, self.stride)


class AvgPool(Step):
    def forward(self, x, saved):
        return _image(x, self.in_shape).mean((2, 3), keepdim=True)


class Dropout(Step):
    def __init__(self, d):
        super().__init__(d)
        self.p = d["probability"]

    def forward(self, x, saved):
        return F.dropout(x, self.p, self.training)


class Softmax(Step):
    def __init__(self, d):
        super().__init__(d)
        self.groups, self.temperature = d["groups"], d["temperature"]

    def logits(self, x):
        x = x.flatten(1)
        return x if self.temperature == 1 else x / self.temperature

    def forward(self, x, saved):
        z = self.logits(x)
        return F.softmax(z.reshape(z.shape[0], self.groups, -1), dim=-1).reshape(z.shape)


class Route(Step):
    def __init__(self, d):
        super().__init__(d)
        self.groups, self.group_id = d["groups"], d["group_id"]
        self.image = len(d["out_shape"]) == 3

    def forward(self, x, saved):
        parts = []
        for i in self.refs:
            y = saved[i]
            if not self.image:
                y = y.flatten(1)
            if self.groups > 1:
                y = y.chunk(self.groups, dim=1)[self.group_id]
            parts.append(y)
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


class Shortcut(Step):
    """out = prev, with alpha·prev + beta·from over the overlap (Darknet's: the first min(c, c2)
    channels; a larger `from` sampled every stride-th pixel, a smaller one added at every sample-th),
    then the activation. Outside the overlap prev stays unscaled."""

    def __init__(self, d):
        super().__init__(d)
        self.alpha, self.beta = d["alpha"], d["beta"]
        self.maps = [tuple(m) for m in d["maps"]]
        c, h, w = self.out_shape if len(self.out_shape) == 3 else (self.out_shape[0], 1, 1)
        self.full = [m == (1, 1, c, h, w) and tuple(shape) == tuple(self.out_shape)
                     for m, shape in zip(self.maps, d["source_shapes"])]
        self.act = _act(d["activation"])

    def forward(self, x, saved):
        y = x
        for i, (stride, sample, minc, minh, minw), full in zip(self.refs, self.maps, self.full):
            src = saved[i]
            if full:
                y = y if self.alpha == 1 else self.alpha * y
                y = y + src if self.beta == 1 else y + self.beta * src
                continue
            if y is x:
                y = x.clone()
            y4 = y if y.dim() == 4 else y.reshape(y.shape[0], -1, 1, 1)
            s4 = src if src.dim() == 4 else src.reshape(src.shape[0], -1, 1, 1)
            part = y4[:, :minc, ::sample, ::sample][:, :, :minh, :minw]
            add = s4[:, :minc, ::stride, ::stride][:, :, :minh, :minw]
            if self.alpha != 1:
                part.mul_(self.alpha)
            part.add_(add if self.beta == 1 else self.beta * add)
        return self.act(y)


class Upsample(Step):
    def __init__(self, d):
        super().__init__(d)
        if d["stride"] < 0:
            raise Unsupported(f"upsample {self.index}: a negative stride (downsampling) is not translated")
        self.stride, self.scale = d["stride"], d["scale"]

    def forward(self, x, saved):
        y = F.interpolate(_image(x, self.in_shape), scale_factor=self.stride, mode="nearest")
        return y if self.scale == 1 else y * self.scale


class Yolo(Step):
    def __init__(self, d):
        super().__init__(d)
        self.spec = {k: v for k, v in d.items() if k not in ("weights",)}
        self.n, self.entries = d["n"], d["entries"]
        self.scale_xy, self.new_coords = d["scale_x_y"], d["new_coords"]

    def forward(self, x, saved):
        b, c, h, w = x.shape
        t = x.reshape(b, self.n, self.entries, h, w)
        xy, wh, rest = t[:, :, :2], t[:, :, 2:4], t[:, :, 4:]
        if not self.new_coords:
            xy, rest = torch.sigmoid(xy), torch.sigmoid(rest)
        if self.scale_xy != 1:
            xy = xy * self.scale_xy - 0.5 * (self.scale_xy - 1)
        return torch.cat((xy, wh, rest), 2).reshape(b, c, h, w)


class Activation(Step):
    def __init__(self, d):
        super().__init__(d)
        self.act = _act(d["activation"])

    def forward(self, x, saved):
        return self.act(x.clone())


class BatchNorm(Step):
    def __init__(self, d, exact_bn):
        super().__init__(d)
        self.bn = _bn_of(d, exact_bn)

    def forward(self, x, saved):
        return self.bn(_image(x, self.in_shape) if len(self.in_shape) == 3 else x.flatten(1))


class Logistic(Step):
    def forward(self, x, saved):
        return torch.sigmoid(x.flatten(1))


# -- darkpy layers as plain data -------------------------------------------------------------------

#: Per kind, the layer attributes a step reads (besides index, kind, shapes, refs and lr_scale).
_ATTRS = {
    "convolutional": ("n", "size", "stride_y", "stride_x", "padding", "dilation", "groups", "activation"),
    "connected": ("n", "activation"),
    "batchnorm": (),
    "maxpool": ("size", "stride_y", "stride_x", "padding"),
    "avgpool": (),
    "dropout": ("probability",),
    "softmax": ("groups", "temperature"),
    "route": ("groups", "group_id"),
    "shortcut": ("alpha", "beta", "activation", "maps"),
    "upsample": ("stride", "scale"),
    "yolo": ("n", "entries", "scale_x_y", "new_coords", "classes", "mask", "biases", "max_boxes", "net_wh",
             "ignore_thresh", "truth_thresh", "iou_loss", "iou_normalizer", "obj_normalizer", "cls_normalizer",
             "label_smooth_eps", "iou_thresh", "iou_thresh_kind", "class_map", "focal_loss",
             "objectness_smooth", "class_mult", "max_delta"),
    "activation": ("activation",),
    "logistic": (),
}


def layer_spec(layer) -> dict:
    """What the translator needs of one darkpy layer, as plain values and COPIED numpy arrays: it
    pickles without darkpy, so the benchmark's torch process never imports darkpy (or numba)."""
    kind = layer.kind
    if kind not in _ATTRS:
        raise Unsupported(f"layer {layer.index} [{kind}] has no torch translation")
    d = {"index": layer.index, "kind": kind, "in_shape": tuple(layer.in_shape),
         "out_shape": tuple(layer.out_shape), "refs": tuple(getattr(layer, "refs", ())),
         "lr_scale": float(getattr(layer, "lr_scale", 1.0))}
    for name in _ATTRS[kind]:
        value = getattr(layer, name)
        d[name] = value.copy() if hasattr(value, "copy") and not isinstance(value, (str, tuple)) else value
    if kind in ("convolutional", "connected", "batchnorm"):
        d["biases"] = layer.biases.value.copy()
        d["weights"] = layer.weights.value.copy() if kind != "batchnorm" else None
        bn = getattr(layer, "bn", None)
        d["bn"] = None if bn is None else {"scales": bn.scales.value.copy(),
                                           "rolling_mean": bn.rolling_mean.copy(),
                                           "rolling_variance": bn.rolling_variance.copy()}
    if kind == "shortcut":
        d["source_shapes"] = [tuple(src.out_shape) for src in layer.sources]
    return d


def translate_layer(d: dict, exact_bn: bool = False) -> Step:
    """The torch step for one layer spec (see `layer_spec`)."""
    kind = d["kind"]
    if kind == "convolutional":
        return Conv(d, exact_bn)
    if kind == "connected":
        return Connected(d, exact_bn)
    if kind == "batchnorm":
        return BatchNorm(d, exact_bn)
    simple = {"maxpool": MaxPool, "avgpool": AvgPool, "dropout": Dropout, "softmax": Softmax,
              "route": Route, "shortcut": Shortcut, "upsample": Upsample, "yolo": Yolo,
              "activation": Activation, "logistic": Logistic}
    return simple[kind](d)


# -- the network -------------------------------------------------------------------------------------

class TorchNet(nn.Module):
    """darkpy's layers (or their `layer_spec`s) as torch steps. `forward(x)` returns the head outputs
    (`heads`: the network's output layer and every yolo layer, in index order); `forward(x,
    keep_all=True)` every layer's output."""

    def __init__(self, layers, exact_bn: bool = False):
        super().__init__()
        specs = [d if isinstance(d, dict) else layer_spec(d) for d in layers]
        self.steps = nn.ModuleList([translate_layer(d, exact_bn) for d in specs])
        self.needed = {i for step in self.steps for i in step.refs}
        kinds = [d["kind"] for d in specs]
        out = max((i for i, k in enumerate(kinds) if k != "cost"), default=len(kinds) - 1)
        self.heads = sorted({out} | {i for i, k in enumerate(kinds) if k == "yolo"})
        self.lr_scales = [d["lr_scale"] for d in specs]

    def forward(self, x: torch.Tensor, keep_all: bool = False, outputs: list[int] | None = None):
        """The heads' outputs; every layer's with `keep_all`; the layers `outputs` when given."""
        want = set(range(len(self.steps))) if keep_all else set(outputs if outputs is not None else self.heads)
        saved: dict[int, torch.Tensor] = {}
        for i, step in enumerate(self.steps):
            x = step(x, saved)
            if i in want or i in self.needed:
                saved[i] = x
        if keep_all:
            return [saved[i] for i in range(len(self.steps))]
        return [saved[i] for i in (outputs if outputs is not None else self.heads)]

    def forward_timed(self, x: torch.Tensor) -> list[float]:
        """One forward, returning each step's wall time in seconds (torch CPU ops are synchronous)."""
        saved: dict[int, torch.Tensor] = {}
        times = []
        for i, step in enumerate(self.steps):
            t0 = time.perf_counter()
            x = step(x, saved)
            times.append(time.perf_counter() - t0)
            if i in self.needed or i in self.heads:
                saved[i] = x
        return times

    def train_unsupported(self) -> str | None:
        """Why `loss` cannot train this network, or None: it must end in a [softmax] groups=1
        (cross-entropy) or have [yolo] heads the yolo loss covers, and no other cost."""
        last = self.steps[-1]
        if isinstance(last, Softmax):
            return None if last.groups == 1 else "training is translated for [softmax] with groups=1 only"
        yolos = [st for st in self.steps if isinstance(st, Yolo)]
        if not yolos:
            return "training is translated only for networks that end in [softmax] or have [yolo] heads"
        return next((why for st in yolos if (why := torch_yolo.unsupported(st.spec))), None)

    def loss(self, x: torch.Tensor, labels: torch.Tensor, full_batch: int) -> torch.Tensor:
        """The training loss, divided by `full_batch` (darkpy's update divides its summed gradient by
        the batch): Darknet's softmax cross-entropy summed over the batch, or the sum of every
        [yolo] head's loss (`torch_yolo`; `labels` is then darkpy's truth array (B, 5·max)).
        `last_cost` is then what darkpy reports as the network's cost for the same batch."""
        why = self.train_unsupported()
        if why:
            raise Unsupported(why)
        last = self.steps[-1]
        saved: dict[int, torch.Tensor] = {}
        if isinstance(last, Softmax):
            for i, step in enumerate(self.steps[:-1]):
                x = step(x, saved)
                if i in self.needed:
                    saved[i] = x
            total = F.cross_entropy(last.logits(x), labels, reduction="sum")
            self.last_cost = float(total)
            return total / full_batch
        losses, costs = [], []
        for i, step in enumerate(self.steps):
            if isinstance(step, Yolo):
                head_loss, cost = torch_yolo.yolo_loss(step.spec, x, labels)
                losses.append(head_loss)
                costs.append(cost)
            x = step(x, saved)
            if i in self.needed:
                saved[i] = x
        self.last_cost = sum(costs) / len(costs)        # darkpy: the mean over its cost layers
        return sum(losses) / full_batch


def export_onnx(model: TorchNet, x: torch.Tensor, path: str, outputs: list[int], opset: int = 17) -> None:
    """Write `model` at the input shape of `x` as ONNX (TorchScript exporter, static shapes), its
    outputs the layers `outputs` named `layer<i>`, its input `input`."""

    class Outputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, inp):
            return tuple(self.net(inp, outputs=outputs))

    wrapper = Outputs().eval()
    with torch.no_grad():
        torch.onnx.export(wrapper, (x.contiguous(),), path, dynamo=False, opset_version=opset,
                          input_names=["input"], output_names=[f"layer{i}" for i in outputs])


def make_optimizer(model: TorchNet, rate: float, momentum: float, decay: float) -> torch.optim.SGD:
    """torch SGD equal to darkpy's update (spec §6.3): decay on conv/connected weights only, each
    layer at `rate` × its `learning_rate` scale."""
    groups: dict[tuple[float, bool], list] = {}
    for step, scale in zip(model.steps, model.lr_scales):
        for name, p in step.named_parameters():
            decays = name.endswith("weight") and not name.startswith("bn.")
            groups.setdefault((scale, decays), []).append(p)
    return torch.optim.SGD([{"params": ps, "lr": rate * scale, "weight_decay": decay if decays else 0.0}
                            for (scale, decays), ps in groups.items()],
                           lr=rate, momentum=momentum, dampening=0.0)
