"""The network: layer construction through the registry, and the state rules (`[net]`: netconfig.py).

State rules (DESIGN §4), each enforced here and tested:
1. Truth before backward: `backward()` raises unless the last `forward()` was a training forward with
   truth, on the current batch and shape. A forward without truth leaves every cost layer with
   `cost is None` and a zeroed `loss`.
2. Deltas are zeroed at each forward (before any layer runs) and accumulate (+=) in backward, so an
   output consumed twice (route, shortcut) receives the sum of both paths. Under `share_deltas()`
   a shared delta is zeroed again where its life in the backward starts (darkpy/deltas_plan.py).
3. Parameter gradients accumulate across `subdivisions` mini-batches; `update()` consumes them.
4. `resize()` and `set_batch()` reallocate every buffer and invalidate the truth flag. The
   training-only buffers (deltas, losses, backward caches) are dropped there and allocated again by
   the first forward that needs them (`allocate_training`): an inference-only network never holds them.
5. Cost is reported as Darknet's sum (`cost`, mean over cost layers as Darknet does) and per element
   (`cost_mean`), so runs with different batch sizes compare.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import layers as _layers  # noqa: F401  (registers every layer family)
from . import deltas_plan, outputs_plan
from .cfg import CfgDocument, CfgWarning, Section, load_cfg, parse_cfg
from .errors import CfgError, StateError, TrainingError
from .layers.base import REGISTRY, Layer, State, is_image, numel
from .layers.conv_winograd import plan_kept_filters
from .memory import MemoryLimitError, check_network_fits, release_freed_memory
from .memory import shapes_only as _shapes_only
from .netconfig import KNOWN_NET_KEYS, POLICIES, NetConfig  # noqa: F401  (re-exported)
from .optim import clip_global_norm, current_rate, sum_squares, update_params
from .snapshot import restore, snapshot
from .threadplan import ThreadPlan, ThreadPlans, forward_runs

@dataclass
class BuildContext:
    """What a layer's `from_cfg` may look at: the net settings and the layers built so far."""

    net: NetConfig
    layers: list[Layer]
    index: int
    dtype: np.dtype
    file: str = "<cfg>"
    dialect: str = "darknet"            # "yolor": the YOLOR project's cfgs (layers/yolor.py)

    def ref(self, sec: Section, key: str, value: int) -> int:
        """Resolve a layer reference (negative = relative to this layer) to an absolute index."""
        idx = self.index + value if value < 0 else value
        if not 0 <= idx < self.index:
            raise sec.error(f"layer reference {value} points to layer {idx}, outside 0..{self.index - 1}", key)
        return idx


def build_layers(doc: CfgDocument, dtype=np.float32, on_error=None) -> tuple[NetConfig, list[Layer]]:
    """Build every layer. With `on_error`, a section that fails is reported to it and replaced by a
    pass-through placeholder, so later sections are still checked (`cfg check` lists every problem)."""
    from .layers.yolor import dialect

    net = NetConfig.from_section(doc.net)
    layers: list[Layer] = []
    shape = net.input_shape
    size_hinted = False
    kind = dialect(doc)
    for sec in doc.layers:
        try:
            layer = _build_layer(sec, shape, net, layers, dtype, doc.file, kind)
        except CfgError as e:
            hint = None if size_hinted else _input_size_error(doc, net, layers, e)
            size_hinted = size_hinted or hint is not None
            if on_error is None:
                raise (hint or e) from None
            on_error(hint or e)
            layer = Layer(sec.index, shape, shape, dtype)
            layer.section = sec
        layers.append(layer)
        shape = layer.out_shape
    if not layers:
        raise doc.net.error("the network has no layers after [net]")
    if not size_hinted:
        _warn_input_size(doc, net, layers)
    return net, layers


def _input_size_error(doc: CfgDocument, net: NetConfig, layers: list[Layer], e: CfgError) -> CfgError | None:
    """A layer failed at an input size that is not a multiple of the total stride (the usual cause
    of route/shortcut size errors): the error says which sizes work, and what failed."""
    from .strides import size_message, total_stride

    if len(net.input_shape) != 3:
        return None
    stride = total_stride(layers, net.width, net.height)
    message = size_message(net.width, net.height, stride)
    if message is None or not _builds_at(doc, -(-net.width // stride) * stride, -(-net.height // stride) * stride,
                                         e.index):
        return None
    key = "width" if net.width % stride else "height"
    return doc.net.error(f"{message} (at {net.width}x{net.height}, layer {e.index} [{e.kind}] fails: "
                         f"{e.message})", key if doc.net.has(key) else None)


def _builds_at(doc: CfgDocument, width: int, height: int, index: int | None) -> bool:
    """Whether the network gets past layer `index` at another input size (so the size was the cause)."""
    other = parse_cfg(doc.text(), doc.file)
    other.set("net.width", str(width))
    other.set("net.height", str(height))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            build_layers(other)
        except CfgError as e:
            return e.index is None or index is None or e.index > index
    return True


def _warn_input_size(doc: CfgDocument, net: NetConfig, layers: list[Layer]) -> None:
    """AlexeyAB warns about a detector whose input is not a multiple of its total stride."""
    from .strides import size_message, total_stride

    if len(net.input_shape) != 3 or not any(getattr(l, "is_detection_head", False) for l in layers):
        return
    message = size_message(net.width, net.height, total_stride(layers, net.width, net.height))
    if message is not None:
        warnings.warn(f"{doc.file} [net]: {message}; other sizes build but the grid does not cover the "
                      f"image evenly", CfgWarning, stacklevel=3)


def _build_layer(sec: Section, shape, net: NetConfig, layers: list[Layer], dtype, file: str,
                 dialect: str = "darknet") -> Layer:
    """Build one layer section on input `shape` (raises CfgError)."""
    cls = REGISTRY.get(sec.kind)
    if cls is None:
        raise sec.error(_unknown_section_message(sec.kind))
    ctx = BuildContext(net, layers, sec.index, np.dtype(dtype), file, dialect)
    if cls.needs_image and not is_image(shape):
        raise sec.error(f"the layer before [{sec.kind}] must output an image (got a flat vector of "
                        f"{numel(shape)} values)")
    try:
        layer = cls.from_cfg(sec, shape, ctx)
    except MemoryLimitError as e:
        raise sec.error(str(e)) from None
    layer.section = sec
    layer.lr_scale = sec.get_float("learning_rate", 1.0)
    layer.stopbackward = sec.get_bool("stopbackward", False)
    layer.dontload = sec.get_bool("dontload", False)
    layer.dontsave = sec.get_bool("dontsave", False)
    for key in ("onlyforward", "dont_update", "burnin_update", "train_only_bn", "dontloadscales",
                "truth", "numload", "smooth", "clip", "stream", "wait_stream"):
        if sec.has(key):
            sec.raw(key)
    sec.warn_unused()
    return layer


def _unknown_section_message(kind: str) -> str:
    import difflib

    from .layers import UNSUPPORTED

    if kind in UNSUPPORTED:
        return f"section [{kind}] is not supported by darkpy yet ({UNSUPPORTED[kind]})"
    hint = difflib.get_close_matches(kind, list(REGISTRY) + list(UNSUPPORTED), n=1)
    tip = f"; did you mean [{hint[0]}]?" if hint else ""
    return f"unknown section [{kind}]{tip}"


class Network:
    """A Darknet network with preallocated buffers. See the module docstring for the state rules."""

    def __init__(self, doc: CfgDocument, batch: int | None = None, dtype=np.float32, seed: int | None = 0,
                 shapes_only: bool = False):
        """Build every layer, check that the network fits in memory, initialise the weights and
        allocate the buffers. `shapes_only=True` builds shapes and sizes only (`darkpy summary`): the
        parameter arrays take no memory and must not be written, no buffer is allocated, and the
        network cannot run."""
        self.doc = doc
        self.file = doc.file
        self.dtype = np.dtype(dtype)
        self.shapes_only = shapes_only
        with _shapes_only(shapes_only):
            self.config, self.layers = build_layers(doc, self.dtype)
        self._cost_layers = [layer for layer in self.layers if layer.has_cost]
        self.seen = 0
        self.updates = 0                    # number of update() calls (Adam's t, lr schedule)
        self.grad_norm = float("nan")        # global L2 norm of the last update's gradient (clip_norm)
        self.rng = np.random.default_rng(seed)
        self.cost: float | None = None
        self.cost_mean: float | None = None
        self._input_shape = self.config.input_shape
        self._ready_for_backward = False
        self._deltas_dirty = True
        self.input: np.ndarray | None = None
        self.truth: np.ndarray | None = None
        self._share_keep: tuple[int, ...] | None = None     # share_outputs() in force
        self._arena: np.ndarray | None = None
        self._share_deltas = False                          # share_deltas() in force
        self._delta_arena: np.ndarray | None = None
        self._delta_zero: dict[int, list[int]] = {}         # layer j -> deltas zeroed before its backward
        #: threads per layer, measured over the first passes of each kind (`.enabled = False`: all
        #: layers on numba's current count)
        self.thread_plans = ThreadPlans()
        if shapes_only:
            for layer in self.layers:
                layer.batch = batch or self.config.minibatch
            return
        check_network_fits(self.layers, batch or self.config.minibatch, self.dtype, self.file)
        init_weights(self, np.random.default_rng(seed))
        self.allocate(batch or self.config.minibatch)

    # -- sizes -----------------------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return self.layers[0].batch

    @property
    def input_shape(self) -> tuple:
        return self._input_shape

    @property
    def width(self) -> int:
        return self._input_shape[2] if len(self._input_shape) == 3 else 0

    @property
    def height(self) -> int:
        return self._input_shape[1] if len(self._input_shape) == 3 else 0

    @property
    def output_layer(self) -> Layer:
        """The last layer that is not a trailing [cost] (Darknet's get_network_output_layer)."""
        for layer in reversed(self.layers):
            if layer.kind != "cost":
                return layer
        return self.layers[-1]

    @property
    def output(self) -> np.ndarray:
        return self.output_layer.output

    @property
    def truths(self) -> int:
        """Truth values per item: the last layer's own count (yolo: max·5) or the output size."""
        t = self.layers[-1].truths
        return t if t else self.output_layer.outputs

    # -- allocation ------------------------------------------------------------------------------
    def allocate(self, batch: int) -> None:
        if batch < 1:
            raise StateError(f"batch must be >= 1 (got {batch})")
        if self.shapes_only:
            raise StateError(f"{self.file}: this network was built with shapes_only=True (sizes only); "
                             f"build it without to run it")
        check_network_fits(self.layers, batch, self.dtype, self.file)
        fixed = self._share_keep is not None
        plan_kept_filters(self.layers, batch, fixed=fixed)
        for layer in self.layers:
            if hasattr(layer, "inference_only"):
                layer.inference_only = fixed
            layer.allocate(batch)
        self.input = np.zeros((batch, *self._input_shape), self.dtype)
        self.truth = np.zeros((batch, self.truths), self.dtype)
        self._ready_for_backward = False
        self._deltas_dirty = False
        self.cost = self.cost_mean = None
        self._arena = self._delta_arena = None
        self._delta_zero = {}
        if self._share_keep is not None:
            out = self.layers.index(self.output_layer)
            self._arena, _ = outputs_plan.apply(self.layers, out, self._share_keep, self.dtype)
            outputs_plan.fuse_pools(self.layers, out, self._share_keep)
        release_freed_memory()        # the buffers just replaced (darkpy/memory.py)

    def share_outputs(self, keep: Sequence[int] = ()) -> int:
        """Inference only: the outputs of layers nothing reads after a forward (all but the output
        layer, cost layers, detection heads and the layers in `keep`) share one arena, placed so
        that no two outputs alive at the same time overlap (darkpy/outputs_plan.py). After a
        forward only those layers' outputs are readable. Stays in force across `set_batch` and
        `resize`; a training forward or a backward is refused until `unshare_outputs()`. The
        weights count as fixed meanwhile: layers may keep what they compute from them (Winograd's
        filter transform, layers/conv_winograd.py); `load_weights` and `update` drop it, and code
        that writes into a weight array itself calls `weights_changed()` after. Returns the bytes
        of buffers given back (yolov4-tiny at 416, batch 64: 2.5 GB)."""
        n = len(self.layers)
        bad = [k for k in keep if not -n <= k < n]
        if bad:
            raise StateError(f"share_outputs: no layer {bad[0]} (the network has layers 0..{n - 1})")
        self._share_keep = tuple(sorted({k % n for k in keep}))
        before = outputs_plan.output_bytes(self.layers)
        self.allocate(self.batch)
        return before - outputs_plan.output_bytes(self.layers)

    def weights_changed(self) -> None:
        """Every layer drops what it computed from its weights (after they were written)."""
        for layer in self.layers:
            changed = getattr(layer, "weights_changed", None)
            if changed is not None:
                changed()

    def unshare_outputs(self) -> None:
        """Every layer gets its own output buffer again (reallocates them)."""
        self._share_keep = None
        self.allocate(self.batch)

    def allocate_training(self) -> None:
        """Make every layer's training-only buffers exist (deltas, losses, backward caches) at the
        current batch and shape; a no-op for those that do. A training forward calls it; so may a
        caller that drives `Layer.backward` itself."""
        if self._share_keep is not None:
            raise StateError("this network shares its layers' output buffers for inference "
                             "(share_outputs()); call unshare_outputs() before training")
        if self._share_deltas and deltas_plan.SHARE and self._delta_arena is None:
            self._delta_arena, self._delta_zero = deltas_plan.apply(self.layers, self.dtype)
        for layer in self.layers:
            layer.allocate_training()

    def share_deltas(self, on: bool = True) -> None:
        """Training memory: the deltas of layers that nothing reads outside a backward share one arena
        (darkpy/deltas_plan.py; cifar.cfg at batch 128: 306 MB of deltas -> 110 MB), as PyTorch frees
        a gradient once it is passed on. Same arithmetic, same results; after a backward only the
        kept layers' deltas (cost layers, detection heads, the last) are readable. Stays in force
        across `set_batch` and `resize`; `on=False` gives every layer its own delta again.
        `darkpy train` turns it on."""
        self._share_deltas = on
        self.allocate(self.batch)

    def set_batch(self, batch: int) -> None:
        """Change the rows per forward pass; reallocates every buffer (DESIGN §4 rule 4)."""
        self.allocate(batch)

    def resize(self, w: int, h: int) -> None:
        """Change the input width/height; recomputes every shape and reallocates every buffer. A size
        that does not fit (a route or shortcut whose inputs no longer match, an input smaller than a
        kernel) raises a one-line StateError naming the layer and the sizes, and leaves the network
        exactly as it was."""
        if len(self._input_shape) != 3:
            raise StateError("cannot resize a network whose input is a flat vector")
        if w < 1 or h < 1:
            raise StateError(f"cannot resize to {w}x{h}: width and height must be >= 1")
        saved = snapshot([self])
        shape = (self._input_shape[0], h, w)
        new_input = shape
        try:
            for layer in self.layers:
                if layer.in_shape != shape or layer.refs:
                    try:
                        was_image = is_image(layer.out_shape)
                        layer.resize(shape)
                        if any(d < 1 for d in layer.out_shape):
                            raise ValueError(f"its output would be {layer.out_shape}")
                        if was_image and not is_image(layer.out_shape):
                            raise ValueError(f"its output would become a flat vector of {layer.outputs} "
                                             f"values (its inputs no longer have one width and height)")
                    except StateError:
                        raise
                    except Exception as e:  # noqa: BLE001  (a layer's own error, whatever its type)
                        where = (f" ({layer.section.file}:{layer.section.line})"
                                 if layer.section is not None else "")
                        why = e.message if isinstance(e, CfgError) else f"{e}"
                        kind = CfgError if isinstance(e, CfgError) else StateError   # (the type callers catch)
                        raise kind(
                            f"cannot resize to {w}x{h}: layer {layer.index} [{layer.kind}]{where} does not "
                            f"fit input {fmt_dims(shape)}: {why}; the network is unchanged "
                            f"({self.width}x{self.height})") from None
                shape = layer.out_shape
            self._input_shape = new_input
            self.allocate(self.batch)
        except BaseException:
            restore(saved)
            raise

    # -- compute ---------------------------------------------------------------------------------
    def _state(self, x, truth, train) -> State:
        return State(input=x, delta=None, truth=truth, train=train, layers=self.layers,
                     seen=self.seen, rng=self.rng, net=self)

    def _check_input(self, x, what: str = "forward", from_uint8: bool = False) -> np.ndarray:
        """`x` as an array of shape (N, *input_shape) (or the flat (N, inputs)) in a float dtype;
        anything else is a StateError naming what was expected and what was passed."""
        x = np.asarray(x)
        if x.dtype == np.uint8:
            if not from_uint8:
                raise StateError(f"{what}: uint8 input; pass from_uint8=True to scale 0..255 to [0, 1] "
                                 f"(Darknet's byte/255), or give float32/float64 values in [0, 1]")
            x = x.astype(self.dtype) / self.dtype.type(255)
        elif x.dtype.kind != "f":
            raise StateError(f"{what}: input dtype {x.dtype} is not supported; expected float32 or float64 "
                             f"(or uint8 with from_uint8=True)")
        n = numel(self._input_shape)
        if x.ndim >= 2 and (x.shape[1:] == tuple(self._input_shape) or x.shape[1:] == (n,)):
            return x
        want = "(N, " + ", ".join(("C", "H", "W") if len(self._input_shape) == 3 else ("inputs",)) + ")"
        dims = "x".join(str(d) for d in self._input_shape)
        raise StateError(f"{what}: input shape {x.shape} does not fit the network: expected {want} = "
                         f"(N, {', '.join(map(str, self._input_shape))}) (or (N, {n}) flat) for its "
                         f"{dims} input")

    def forward(self, x: np.ndarray, truth: np.ndarray | None = None, train: bool = False,
                from_uint8: bool = False) -> np.ndarray:
        """Run every layer on `x`, (N, C, H, W) (or (N, inputs) flat) float32/float64 in [0, 1] with
        N = the network's batch; uint8 only with `from_uint8=True` (scaled by 1/255, Darknet's rule).
        Returns the output layer's buffer (a view: copy it to keep it). A call that raises (wrong
        shape, dtype, batch or truth) changes nothing."""
        x = self._check_input(x, "forward", from_uint8)
        n = x.shape[0]
        if n != self.batch:
            raise StateError(f"input has {n} rows but the network batch is {self.batch}; "
                             f"call set_batch({n}) first")
        if truth is not None:
            truth = np.asarray(truth)
            if truth.dtype.kind not in "fiub" or truth.size != self.truth.size:
                raise StateError(f"truth has {truth.size // max(n, 1)} values per item ({truth.dtype}), the "
                                 f"network expects {self.truths} numbers per item")
            bad = ~np.isfinite(truth.astype(np.float64, copy=False))
            if bad.any():
                row = int(np.argwhere(bad.reshape(n, -1))[0][0])
                raise StateError(f"truth has {int(bad.sum())} non-finite values (NaN/inf), the first in "
                                 f"item {row}; nothing was run")
        # (x's dtype is a float, checked above: a plain copy casts as casting="same_kind" would)
        self.input[...] = x if x.shape == self.input.shape else x.reshape(self.input.shape)
        if truth is not None:
            np.copyto(self.truth, truth.reshape(self.truth.shape), casting="unsafe")
        t = self.truth if truth is not None else None
        if train:                       # (a forward with truth alone: cost layers size their own)
            self.allocate_training()
        if self._deltas_dirty:
            for layer in self.layers:
                if self._delta_arena is None or layer.delta.base is not self._delta_arena:
                    layer.delta.fill(0)
            if self._delta_arena is not None:
                self._delta_arena.fill(0)
        self._deltas_dirty = train
        if train:
            self.seen += self.batch
        s = self._state(self.input, t, train)
        layers = self.layers
        plan = self._plan(("forward", train))
        runs = plan.runs(layers) if plan is not None else None
        if runs is not None:
            forward_runs(runs, plan.threads, s, t is None)
        else:
            def step(i: int) -> None:
                layer = layers[i]
                layer.forward(s)
                if layer.has_cost and t is None:
                    layer.clear_cost()
                s.input = layer.output
            self._run_layers(plan, range(len(layers)), step)
        self._ready_for_backward = train and truth is not None
        self._compute_cost()
        return self.output

    def predict(self, x: np.ndarray, from_uint8: bool = False) -> np.ndarray:
        """Inference on `x` (N, C, H, W), (C, H, W) for one item, or (N, inputs) flat, float32/float64
        in [0, 1] (uint8 with `from_uint8=True`, scaled by 1/255). Changes the batch to N when it
        differs. Returns a copy of the output. A wrong shape or dtype changes nothing."""
        x = np.asarray(x)
        if x.ndim == len(self._input_shape) and x.ndim >= 1 and tuple(x.shape) == tuple(self._input_shape):
            x = x[None]
        x = self._check_input(x, "predict", from_uint8).astype(self.dtype, copy=False)
        if x.shape[0] != self.batch:
            self.set_batch(x.shape[0])
        return self.forward(x, None, train=False).copy()

    def _compute_cost(self) -> None:
        costs = [(l.cost, l.batch * l.outputs) for l in self._cost_layers if l.cost is not None]
        if not costs:
            self.cost = self.cost_mean = None
            return
        self.cost = float(sum(c for c, _ in costs) / len(costs))
        self.cost_mean = float(sum(c / n for c, n in costs) / len(costs))

    def backward(self) -> None:
        if not self._ready_for_backward:
            raise StateError("backward() needs a training forward with truth first: "
                             "call forward(x, truth, train=True)")
        self._ready_for_backward = False
        self._deltas_dirty = True
        s = self._state(self.input, self.truth, True)
        layers = self.layers

        def step(i: int) -> bool:
            layer = layers[i]
            if layer.stopbackward:
                return True
            s.delta_fresh = False
            for k in self._delta_zero.get(i, ()):       # share_deltas(): a delta's life starts here
                if k == i - 1 and layer.assigns_fresh_delta:
                    s.delta_fresh = True                # this layer writes it whole: no zeros needed
                else:
                    layers[k].delta.fill(0)
            if i > 0:
                s.input, s.delta = layers[i - 1].output, layers[i - 1].delta
            else:
                s.input, s.delta = self.input, None
            layer.backward(s)
            return False
        self._run_layers(self._plan(("backward",)), range(len(layers) - 1, -1, -1), step)

    def _plan(self, kind: tuple) -> ThreadPlan | None:
        """The ThreadPlan of this kind of pass at this batch and input size (darkpy/threadplan.py);
        None on one thread."""
        return self.thread_plans.plan((*kind, self.batch, self._input_shape), len(self.layers))

    @staticmethod
    def _run_layers(plan: ThreadPlan | None, order: range, step) -> None:
        """`step(i)` for the layers in `order` until one returns True, each on the thread count
        `plan` chose (all threads without one)."""
        if plan is not None:
            plan.run(order, step)
            return
        for i in order:
            if step(i):
                return

    def frozen_upto(self) -> int:
        """Index of the last layer with stopbackward=1 (-1 if none): it and earlier layers don't learn."""
        last = -1
        for i, layer in enumerate(self.layers):
            if layer.stopbackward:
                last = i
        return last

    def current_rate(self) -> float:
        return current_rate(self.config, self.seen // self.config.full_batch, self.rng)

    def update(self, rate: float | None = None, check_finite: bool = True) -> float:
        """One optimiser step over every learnable layer; returns the rate used. Gradients with a NaN
        or inf (from NaN truth, a diverging loss, a layer that produced NaN) raise a TrainingError
        naming the layer before any weight changes; `check_finite=False` skips that check (Darknet's
        behaviour: the NaN spreads into the weights)."""
        rate = self.current_rate() if rate is None else rate
        layers = [l for l in self.layers[self.frozen_upto() + 1:] if l.params]
        clip = self.config.clip_norm > 0
        total = 0.0                             # Σ g², the finiteness check and the clip norm both read it
        for layer in layers if check_finite or clip else ():
            for p in layer.params:
                sq = sum_squares(p.grad.reshape(-1))
                if check_finite and not math.isfinite(sq):
                    where = f" ({layer.section.file}:{layer.section.line})" if layer.section is not None else ""
                    raise TrainingError(f"update: layer {layer.index} [{layer.kind}]{where} has a non-finite "
                                        f"gradient for its {p.name} (NaN/inf: check the truth and the loss); "
                                        f"no weight was changed")
                total += sq
        self.updates += 1
        B = self.config.full_batch
        if clip:
            self.grad_norm = clip_global_norm([p.grad for layer in layers for p in layer.params], B,
                                              self.config.clip_norm, total)
        for layer in layers:
            update_params(layer.params, self.config, rate * layer.lr_scale, B, self.updates)
        self.weights_changed()
        return rate

    # -- weights -----------------------------------------------------------------------------------
    def save_weights(self, path, upto: int | None = None, order: str | None = None) -> None:
        from .weights import save_weights
        save_weights(self, path, upto, order)

    def load_weights(self, path, upto: int | None = None, order: str | None = None) -> None:
        """`order`: the file's layout of gru/lstm/batchnorm (darkpy/weights.py; None: by header)."""
        from .weights import load_weights
        try:
            load_weights(self, path, upto, order)
        finally:        # what layers computed from the old weights goes, even after a partial load
            self.weights_changed()

    def summary(self) -> str:
        from .summary import summary_text
        return summary_text(self)


def fmt_dims(shape) -> str:
    """(c, h, w) as `WxHxC`; a flat shape as its size."""
    return f"{shape[2]}x{shape[1]}x{shape[0]}" if len(shape) == 3 else str(numel(shape))


def init_weights(net: Network, rng: np.random.Generator) -> None:
    """Darknet-style random initialisation for every layer that has an `init_weights(rng)`."""
    for layer in net.layers:
        init = getattr(layer, "init_weights", None)
        if init is not None:
            init(rng)


def load_network(cfg: str | os.PathLike | CfgDocument, weights: str | os.PathLike | None = None,
                 batch: int | None = None, dtype=np.float32, seed: int | None = 0) -> Network:
    """Build a network from a `.cfg`/`.yaml` path (or a parsed document), optionally load weights."""
    doc = cfg if isinstance(cfg, CfgDocument) else load_cfg(cfg)
    net = Network(doc, batch=batch, dtype=dtype, seed=seed)
    if weights is not None:
        net.load_weights(weights)
    return net


def network_from_text(text: str, batch: int | None = None, dtype=np.float32, seed: int | None = 0,
                      file: str = "<cfg>") -> Network:
    return Network(parse_cfg(text, file), batch=batch, dtype=dtype, seed=seed)
