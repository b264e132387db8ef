"""The layer contract (DESIGN §3) and the registry that maps cfg section names to layer classes.

A layer family subclasses `Layer`, sets `kind` (the canonical section name) and `aliases`, and is
registered with `@register`. The network builder looks classes up by section name; nothing in darkpy
dispatches on layer names with if/elif.

Buffers: every layer owns `output` and `delta`, shaped `(batch, *out_shape)`. `allocate(batch)`
sizes `output` and every buffer inference needs; `allocate_training()` sizes the training-only ones
(`delta`, `loss`, backward caches) and is called by the network before the first training forward
after an `allocate`; cost layers call it themselves in a forward with truth, where they write their
delta and loss (a validation loss needs no other training buffer). `allocate` drops them again
(empty arrays), so an inference-only network never holds them and none survives a resize or batch
change. Cost-bearing layers also own `loss` (same shape as their output or input) and a scalar
`cost` that is `None` whenever the last forward had no truth. Parameters are
`Param`s whose `grad` is Darknet's `*_updates` buffer: the accumulated NEGATIVE gradient, summed
over the batch, so the update rule and the goldens read the same numbers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..cfg import Section
from ..errors import CfgError, StateError

if TYPE_CHECKING:  # pragma: no cover
    from ..network import BuildContext

Shape = tuple  # (c, h, w) for images, (n,) for flat vectors

REGISTRY: dict[str, type["Layer"]] = {}


def register(cls: type["Layer"]) -> type["Layer"]:
    """Class decorator: make `cls` the builder for `cls.kind` and each of `cls.aliases`."""
    for name in (cls.kind, *cls.aliases):
        if name in REGISTRY:
            raise RuntimeError(f"section [{name}] registered twice")
        REGISTRY[name] = cls
    return cls


@dataclass
class Param:
    """A learnable array. `grad` accumulates the negative gradient (Darknet's `*_updates`)."""

    name: str
    value: np.ndarray
    grad: np.ndarray
    decay: bool = False                     # weight decay applies (Darknet: weights yes, biases/scales no)
    state: dict[str, Any] = field(default_factory=dict)   # optimiser state (Adam moments)


@dataclass(slots=True)
class State:
    """What a layer sees during forward/backward (Darknet's `network` struct, reduced)."""

    input: np.ndarray                       # previous layer's output (or the net input), (batch, *in_shape)
    delta: np.ndarray | None                # previous layer's delta, None for layer 0
    truth: np.ndarray | None                # (batch, truths) or None
    train: bool
    layers: list["Layer"]                   # all layers (route/shortcut read other layers' buffers)
    seen: int = 0                           # images seen so far (region's warm-up uses it)
    rng: np.random.Generator | None = None  # dropout masks, crop offsets
    net: Any = None                         # the Network (for net-level sizes, e.g. yolo's net w/h)
    #: In a backward: `delta` holds zeros that this layer is the first to write (Network.share_deltas
    #: gave it no fill): a layer with `assigns_fresh_delta` writes its input gradient into every
    #: value instead of adding it; any other layer finds the zeros (the network fills them first).
    delta_fresh: bool = False


def is_image(shape: Shape) -> bool:
    return len(shape) == 3 and all(d > 0 for d in shape)


def numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Layer:
    kind: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    has_cost: ClassVar[bool] = False        # softmax/cost/logistic/yolo/... : owns loss and cost
    needs_image: ClassVar[bool] = False     # raise "layer before X must output an image" if flat input
    resizable: ClassVar[bool] = True        # Network.resize may change its input size
    #: Earlier layers read besides the input (route sources, shortcut/sam `from`), as absolute
    #: indices. Network.resize re-sizes such a layer even when its input shape did not change.
    refs: tuple[int, ...] = ()
    #: Network.share_outputs may replace `output` by a view of a shared arena (inference): False
    #: for layers whose output is not a plain buffer of their own (an inner layer's) or carries
    #: state from one forward to the next.
    output_shareable: ClassVar[bool] = True
    #: backward() assigns the whole previous delta when `State.delta_fresh` (instead of adding into
    #: zeros), so the network skips zeroing it: one pass over the delta instead of three.
    assigns_fresh_delta: ClassVar[bool] = False

    def __init__(self, index: int, in_shape: Shape, out_shape: Shape, dtype=np.float32):
        self.index = index
        self.in_shape = tuple(in_shape)
        self.out_shape = tuple(out_shape)
        self.dtype = np.dtype(dtype)
        self.batch = 0
        self.params: list[Param] = []
        self.output = np.zeros((0,), self.dtype)
        self.delta = np.zeros((0,), self.dtype)
        self.loss: np.ndarray | None = None
        self.cost: float | None = None
        # generic per-layer keys (spec §1.5), set by the network builder
        self.lr_scale = 1.0
        self.stopbackward = False
        self.dontload = False
        self.dontsave = False
        self.section: Section | None = None

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_cfg(cls, sec: Section, in_shape: Shape, ctx: "BuildContext") -> "Layer":
        raise NotImplementedError

    @property
    def inputs(self) -> int:
        return numel(self.in_shape)

    @property
    def outputs(self) -> int:
        return numel(self.out_shape)

    @property
    def truths(self) -> int:
        """Truth values per item this layer reads (0 = the network's output size)."""
        return 0

    def allocate(self, batch: int) -> None:
        """(Re)allocate every buffer inference needs, sized by batch and shape, and drop the
        training-only ones (empty until `allocate_training`). Subclasses extend."""
        self.batch = batch
        self.output = np.zeros((batch, *self.out_shape), self.dtype)
        self.delta = np.zeros((0,), self.dtype)
        if self.has_cost:
            self.loss = np.zeros((0,), self.dtype)
            self.cost = None

    def allocate_training(self) -> None:
        """Size the buffers only training needs (`delta`; `loss` for cost layers, which also write
        their delta in a forward with truth), for the batch and shape of the last `allocate`.
        Allocates only what is missing: a no-op once they exist. Subclasses extend with their
        backward caches, each sized the same way (`training_buffer`)."""
        self.delta = self.training_buffer(self.delta)
        if self.has_cost:
            self.loss = self.training_buffer(self.loss)

    def require_training_buffers(self) -> None:
        """For a backward driven without the network (which checks its own state first): a clear
        error instead of a shape error when the training buffers were never allocated."""
        if self.delta.shape != (self.batch, *self.out_shape):
            raise StateError(f"layer {self.index} [{self.kind}]: backward needs a training-mode forward "
                             f"first (no delta allocated; see Network.allocate_training)")

    def training_buffer(self, current: np.ndarray | None, shape: Shape | None = None) -> np.ndarray:
        """`current` if it already has `shape` (default: the output's, `(batch, *out_shape)`), else
        a new zeroed array of that shape."""
        shape = (self.batch, *self.out_shape) if shape is None else tuple(shape)
        if current is not None and current.shape == shape:
            return current
        return np.zeros(shape, self.dtype)

    def resize(self, in_shape: Shape) -> None:
        """Take a new input shape and recompute out_shape (the network calls allocate after)."""
        if not self.resizable:
            raise self.error(f"cannot resize a [{self.kind}] layer (input {self.in_shape} -> {tuple(in_shape)})")
        self.in_shape = tuple(in_shape)
        self.out_shape = self.compute_out_shape(self.in_shape)

    def compute_out_shape(self, in_shape: Shape) -> Shape:
        return tuple(in_shape)

    # -- compute -------------------------------------------------------------------------------
    def forward(self, s: State) -> None:
        raise NotImplementedError

    def backward(self, s: State) -> None:
        """`self.delta` is fully accumulated on entry; ADD into params' grads and into s.delta."""

    def clear_cost(self) -> None:
        """Called for cost-bearing layers after a forward without truth: nothing stale stays readable."""
        self.cost = None
        if self.loss is not None:
            self.loss.fill(0)

    # -- parameters and file layout -----------------------------------------------------------
    def weight_arrays(self) -> list[np.ndarray]:
        """The arrays in exact `.weights` file order (views into the layer's own storage).
        2-D arrays are connected matrices `[out][in]`, transposed when a file's header says so."""
        return []

    def flops(self) -> float:
        return 0.0

    def summary(self) -> str:
        """The layer's own part of Darknet's summary line (after the index)."""
        return f"{self.kind:<10}"

    def error(self, message: str, key: str | None = None) -> CfgError:
        if self.section is not None:
            return self.section.error(message, key)
        return CfgError(message, None, None, self.index, self.kind, key)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} #{self.index} {self.in_shape}->{self.out_shape}>"


def fmt_shape(shape: Shape) -> str:
    if len(shape) == 3:
        c, h, w = shape
        return f"{w:4d} x{h:4d} x{c:4d}"
    return f"{numel(shape):4d}"
