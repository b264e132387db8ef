"""Training, validation and prediction: the library behind `darkpy train`, `valid` and `predict`.

The loop (Darknet's, spec §6): an iteration runs `subdivisions` training forwards with truth and
backwards, then one `Network.update()`; its loss is the sum of the passes' costs over the full batch
(Darknet's per-image loss). Checkpoints go to the backup folder under Darknet's names:
`<cfg>_last.weights` every `savelast` (100) iterations, `<cfg>_<N>.weights` every `saveweights`
(1000), `<cfg>_final.weights` at the end; every file is written to a temp file and renamed, so a
kill at any instant leaves the previous checkpoint loadable.

Determinism: the batch of iteration k (sample indices and augmentation) is a pure function of
(seed, k) — the images come from epoch permutations `default_rng([seed, epoch])`, augmentation
from `default_rng([seed, k, 1])`, the network's own randomness (dropout) from
`default_rng([seed, k, 2])`, and with random=1 the input size from `default_rng([seed, k // 10, 3])`
(`multiscale_size`; each prefetched batch is loaded at its own size). Beside each checkpoint a `.state` file (an `.npz`) keeps what the
`.weights` file cannot: momentum buffers (`Param.grad`), Adam moments (`Param.state`), the update
count, the seed and the running average loss. Resuming from a checkpoint with its state gives
exactly the run that was not interrupted, bit for bit; from the `.weights` file alone (all Darknet
keeps) the momentum restarts at zero and the run continues only approximately.
"""
from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .errors import DarkpyError, DataError, TrainingError, WeightsError
from .progress import CsvLog, Progress, Record
from .settings import Settings, load_settings

if TYPE_CHECKING:  # pragma: no cover
    from .detect import MapResult

SAVE_LAST = 100          # Darknet (AlexeyAB): `_last.weights` every 100 iterations
SAVE_WEIGHTS = 1000      # and `_<N>.weights` every 1000
STATE_VERSION = 1
COMPILING_NOTICE = "First run: compiling numba kernels (cached afterwards, so later runs start fast)"


# -- names and files ---------------------------------------------------------------------------------

def cfg_base(cfg_path: str | os.PathLike) -> str:
    """Darknet's `<cfgbase>`: the file name without its folder, cut at the first dot."""
    return os.path.basename(os.fspath(cfg_path)).split(".", 1)[0]


def data_candidates(cfg_path: str | os.PathLike) -> list[Path]:
    """Where the .data file of a cfg is looked for, in order.

    Names: `<cfgbase>.data`, then the name cut at its first '-' (so cfg/shapes-tiny.cfg also finds
    data/shapes.data: a family of cfgs shares one dataset). Each name is looked for in data/ beside
    the cfg folder (cfg/x.cfg -> data/x.data), then in data/ under the current directory, then beside
    the cfg; every place for the full name before any for the cut one."""
    cfg = Path(cfg_path)
    base = cfg_base(cfg)
    unique: list[Path] = []
    for stem in (base, base.split("-", 1)[0]):
        if not stem:
            continue
        name = stem + ".data"
        for p in (cfg.parent.parent / "data" / name, Path("data") / name, cfg.parent / name):
            if p not in unique:
                unique.append(p)
    return unique


def find_data_file(cfg_path: str | os.PathLike) -> Path | None:
    for p in data_candidates(cfg_path):
        if p.is_file():
            return p
    return None


def resolve_data_file(cfg_path, data) -> Path:
    """The given .data file, or the one found by convention; a DataError naming the fix otherwise."""
    if data is not None:
        p = Path(data)
        if not p.is_file():
            raise DataError(f"{p}: no such .data file" + (" (it is a folder)" if p.is_dir() else ""))
        return p
    found = find_data_file(cfg_path)
    if found is None:
        looked = ", ".join(str(p) for p in data_candidates(cfg_path))
        raise DataError(f"{cfg_path}: no .data file found (looked for {looked}); pass --data FILE")
    return found


def state_path(weights_path: str | os.PathLike) -> str:
    """The state file beside a checkpoint: backup/x_last.weights -> backup/x_last.state."""
    base, _ = os.path.splitext(os.fspath(weights_path))
    return base + ".state"


def file_crc(path: str | os.PathLike) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def remove_stale_temp_files(folder: str | os.PathLike, base: str) -> None:
    """Temp files `<base>_*.tmp<pid>` left by a killed run (their process is gone) are removed."""
    for p in Path(folder).glob(f"{base}*.tmp*"):
        pid = p.name.rsplit(".tmp", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            try:
                p.unlink()
            except OSError:
                pass


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- optimiser state beside a checkpoint ----------------------------------------------------------------

def write_state(path: str, net, meta: dict) -> None:
    """Write the optimiser state of `net` plus `meta` (JSON-able) to `path`, atomically."""
    arrays: dict[str, np.ndarray] = {}
    for layer in net.layers:
        for p in layer.params:
            arrays[f"{layer.index}:{p.name}:grad"] = p.grad
            for key, value in p.state.items():
                arrays[f"{layer.index}:{p.name}:state:{key}"] = value
    blob = json.dumps({"version": STATE_VERSION, **meta}).encode()
    arrays["meta"] = np.frombuffer(blob, np.uint8)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_state(path: str, net, weights_crc: int | None) -> tuple[dict | None, str]:
    """Restore the optimiser state saved at `path` into `net`. Returns (meta, "") on success, or
    (None, reason) when there is no usable state (then nothing in `net` was changed)."""
    if not os.path.isfile(path):
        return None, f"no state file {path}"
    try:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except Exception as e:  # noqa: BLE001  (a damaged state file only means an approximate resume)
        return None, f"{path} is unreadable ({type(e).__name__})"
    if meta.get("version") != STATE_VERSION:
        return None, f"{path} has state version {meta.get('version')}, expected {STATE_VERSION}"
    if weights_crc is not None and meta.get("weights_crc") != weights_crc:
        return None, f"{path} belongs to another version of the weights file"
    grads, states = {}, {}
    for layer in net.layers:
        for p in layer.params:
            key = f"{layer.index}:{p.name}"
            g = arrays.get(f"{key}:grad")
            if g is None or g.shape != p.grad.shape or g.dtype != p.grad.dtype:
                return None, f"{path} does not fit this network (parameter {key})"
            grads[key] = g
            states[key] = {k.rsplit(":", 1)[1]: v for k, v in arrays.items()
                           if k.startswith(f"{key}:state:")}
    for layer in net.layers:
        for p in layer.params:
            key = f"{layer.index}:{p.name}"
            p.grad[...] = grads[key]
            p.state.clear()
            p.state.update({k: v.copy() for k, v in states[key].items()})
    net.updates = int(meta.get("updates", 0))
    return meta, ""


def save_checkpoint(net, path: str, meta: dict) -> None:
    """`.weights` (Darknet's format) and its `.state` beside it, each atomically."""
    net.save_weights(path)
    write_state(state_path(path), net, {**meta, "seen": int(net.seen), "updates": int(net.updates),
                                         "weights_crc": file_crc(path)})


# -- threads and kernels ------------------------------------------------------------------------------

def configure_threads(threads: int) -> int:
    """Set numba's thread count (0 = all cores), and BLAS's when threadpoolctl is installed.

    (OpenMP's wait policy is set to PASSIVE when darkpy.kernels is imported; see there.)"""
    import numba

    n = numba.config.NUMBA_NUM_THREADS if threads <= 0 else min(threads, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        pass   # BLAS keeps its own default: environment variables set now would be too late
    else:
        threadpool_limits(limits=n)
    return n


def kernels_need_compiling(net) -> bool:
    """True when the first run will compile kernels: some module the run uses (the layers' families,
    the optimiser, the image augmentation) has numba kernels but none of them cached on disk yet.
    A heuristic (a module cached by a run that used only part of it counts as cached), good enough
    to announce the minute a first run spends compiling."""
    import sys

    from numba.core.registry import CPUDispatcher

    modules = {type(layer).__module__ for layer in net.layers} | {"darkpy.optim", "darkpy.images"}
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    for name in modules:
        mod = sys.modules.get(name)
        if mod is None or not getattr(mod, "__file__", None):
            continue
        stem = Path(mod.__file__).stem
        kernels = [obj.py_func.__qualname__ for obj in vars(mod).values()
                   if isinstance(obj, CPUDispatcher) and obj.py_func.__module__ == name]
        if not kernels:
            continue
        where = Path(cache_dir) if cache_dir else Path(mod.__file__).parent / "__pycache__"
        search = where.rglob if cache_dir else where.glob
        if not any(any(search(f"{stem}.{q}-*.nbi")) for q in kernels):
            return True
    return False


# -- the batches --------------------------------------------------------------------------------------

class BatchPlan:
    """Which samples iteration k trains on: a pure function of (seed, k).

    Samples are taken in order from an endless chain of epoch permutations; epoch e's permutation is
    `default_rng([seed, e]).permutation(n)`."""

    def __init__(self, n: int, batch: int, seed: int):
        if n <= 0:
            raise ValueError("empty training set")
        self.n, self.batch, self.seed = n, batch, seed
        self._perm = lru_cache(maxsize=4)(self._permutation)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def indices(self, k: int) -> np.ndarray:
        pos = k * self.batch + np.arange(self.batch)
        epochs, offsets = np.divmod(pos, self.n)
        return np.array([self._perm(int(e))[o] for e, o in zip(epochs, offsets)], dtype=np.int64)


def augment_rng(seed: int, k: int) -> np.random.Generator:
    return np.random.default_rng([seed, k, 1])


def network_rng(seed: int, k: int) -> np.random.Generator:
    return np.random.default_rng([seed, k, 2])


# -- multi-scale training (random=1 on the last detection layer) ------------------------------------------

RESIZE_PERIOD = 10       # Darknet draws a new input size every 10 iterations
RESIZE_STEP = 32         # sizes are multiples of 32 (the usual total stride of a detector)
RANDOM_SCALE = 1.4       # random=1 spans the cfg size / 1.4 .. x 1.4 (the fork's default scale)


def multiscale_sizes(width: int, height: int, random: float) -> list[tuple[int, int]]:
    """The input sizes multi-scale training draws from, smallest first.

    Darknet (random=1, a 416 cfg) draws `32·(10 + rand()%10)` = 320..608, a fixed range meant for
    ~416 px cfgs, far too large for darkpy's 128 px shapes-tiny. darkpy scales the range to the cfg
    instead: the multiples of 32 between width/s and width·s, s = 1.4 (the fork's rand_scale(1.4),
    so 416 -> 320..576, close to Darknet's) or s = random when the head gives a float above 1 (the
    fork's random=1.5 etc.). The height keeps the cfg's aspect ratio (rounded to a multiple of 32).
    The cfg's own size is always one of them; a cfg too small for any other multiple of 32 gets
    only its own size (no resizing)."""
    s = float(random) if random > 1 else RANDOM_SCALE
    lo = math.ceil(width / s / RESIZE_STEP)
    hi = math.floor(width * s / RESIZE_STEP)
    widths = sorted({RESIZE_STEP * m for m in range(max(lo, 1), hi + 1)} | {width})
    out = []
    for w in widths:
        h = height if w == width else max(RESIZE_STEP, RESIZE_STEP * round(w * height / width / RESIZE_STEP))
        out.append((w, h))
    return out


def multiscale_size(seed: int, k: int, sizes: Sequence[tuple[int, int]], base: tuple[int, int],
                    max_batches: int) -> tuple[int, int]:
    """The input size of iteration k (0-based): a pure function of (seed, k) and the schedule, so a
    resumed run trains at the sizes of the uninterrupted one. Each period of RESIZE_PERIOD iterations
    draws one of `sizes` with `default_rng([seed, period, 3])`; the final 10% of the iterations
    train at the cfg's size `base` (Darknet uses its largest size for the last 200: darkpy ends at
    the size the weights are saved and evaluated at)."""
    if k >= max_batches - max(1, max_batches // 10):
        return base
    i = np.random.default_rng([seed, k // RESIZE_PERIOD, 3]).integers(len(sizes))
    return tuple(sizes[int(i)])


# -- data -------------------------------------------------------------------------------------------

def is_detector(net) -> bool:
    """A net whose last layer reads its own truth layout (yolo/region/detection: boxes)."""
    return bool(net.layers[-1].truths)


def load_data_config(path):
    from .datasets import read_data_file
    return read_data_file(os.fspath(path))


def class_names(dc) -> list[str] | None:
    return list(dc.names or dc.labels) or None


def check_classes(net, dc) -> None:
    """The .data file's classes (and labels) must fit the network's output."""
    if is_detector(net):
        classes = getattr(net.layers[-1], "classes", None)
        if classes is not None and dc.classes and classes != dc.classes:
            raise DataError(f"{dc.path}: classes={dc.classes} but the last layer of {net.file} has "
                            f"classes={classes}; make them equal")
        return
    out = net.output_layer.outputs
    if dc.classes != out:
        raise DataError(f"{dc.path}: classes={dc.classes} but {net.file} outputs {out} values per image; "
                        f"set classes={out} in {dc.path} or give the last layer {dc.classes} filters/outputs")


def classifier_labels(dc) -> list[str]:
    labels = list(dc.labels or dc.names)
    if not labels:
        raise DataError(f"{dc.path}: no labels= (or names=) file; a classifier needs one label per class")
    if len(labels) != dc.classes:
        key = "labels" if "labels" in dc.raw else "names"
        raise DataError(f"{dc.raw.get(key, dc.path)}: has {len(labels)} labels but {dc.path} says "
                        f"classes={dc.classes}; make them agree")
    return labels


def check_labels(paths: Sequence[str], labels: Sequence[str], list_file: str) -> np.ndarray:
    """Each image's class, checked up front so a bad name stops training before it starts (one
    line: the first bad entry, and how many more there are)."""
    from .datasets import classifier_label

    out = np.empty(len(paths), np.int64)
    first, bad = "", 0
    for i, p in enumerate(paths):
        try:
            out[i] = classifier_label(p, labels)
        except DataError as e:
            bad += 1
            first = first or f"{list_file}:{i + 1}: {e}"
    if bad:
        more = f" (and {bad - 1} more of the {len(paths)} images)" if bad > 1 else ""
        raise DataError(first + more)
    return out


def make_dataset(net, dc, paths: list[str], augment: bool, labels: list[str] | None = None):
    from .datasets import ClassifierData, DetectionData

    if is_detector(net):
        last = net.layers[-1]
        return DetectionData(paths, dc.classes, net.config, max_boxes=net.truths // 5, augment=augment,
                             jitter=getattr(last, "jitter", 0.2))
    return ClassifierData(paths, labels, net.config, augment=augment, channels=net.input_shape[0])


def read_image_list(path: str | None, what: str, data_path) -> list[str]:
    from .datasets import read_list

    if not path:
        raise DataError(f"{data_path}: no {what}= list file; add one (one image path per line)")
    paths = read_list(path)
    if not paths:
        raise DataError(f"{path}: the {what} list is empty; add image paths, one per line")
    return paths


# -- training ---------------------------------------------------------------------------------------

@dataclass
class TrainResult:
    cfg: str
    backup: str
    start_iteration: int                 # iterations already done when this run began
    iteration: int                       # iterations done when it ended
    max_batches: int
    weights: str | None                  # the last checkpoint written (final, or last on interrupt)
    interrupted: bool
    seconds: float
    log: str
    chart: str
    records: list[Record] = field(default_factory=list)   # this run's iterations
    accuracy: "ValidResult | None" = None
    map: "MapResult | None" = None       # with calc_map: the final network's mAP on the valid list
    best_map: float | None = None        # with calc_map: the best mAP so far (this run or the resumed one)
    best: str | None = None              # with calc_map: `<cfg>_best.weights`, once written
    sizes: list[tuple[int, int, int]] = field(default_factory=list)  # (iterations done, w, h) at each resize

    @property
    def loss(self) -> float | None:
        return self.records[-1].loss if self.records else None

    @property
    def avg_loss(self) -> float | None:
        return self.records[-1].avg_loss if self.records else None


class _StopRequest:
    """SIGINT/SIGTERM set a flag the loop checks between iterations (a second Ctrl-C aborts)."""

    def __init__(self):
        self.requested: str | None = None
        self._old: dict[int, object] = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.requested = signal.Signals(signum).name
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


def first_non_finite(net, x: np.ndarray) -> str:
    """Where a non-finite loss came from: the input, or the first layer whose output or cost is."""
    if not np.isfinite(x).all():
        return "the input batch (an image with NaN/inf values)"
    for layer in net.layers:
        bad_out = not np.isfinite(layer.output).all()
        bad_cost = layer.has_cost and layer.cost is not None and not math.isfinite(layer.cost)
        if bad_out or bad_cost:
            where = ""
            if layer.section is not None:
                where = f" ({layer.section.file}:{layer.section.line})"
            return f"layer {layer.index} [{layer.kind}]{where} {'output' if bad_out else 'cost'}"
    return "the cost layers"


def _bad_params(net) -> str | None:
    for layer in net.layers:
        for p in layer.params:
            if not np.isfinite(p.value).all():
                return f"layer {layer.index} [{layer.kind}] {p.name}"
    return None


def train(cfg: str | os.PathLike, data: str | os.PathLike | None = None,
          weights: str | os.PathLike | None = None, clear: bool = False, seed: int | None = None,
          max_batches: int | None = None, backup: str | os.PathLike | None = None,
          settings: Settings | None = None, progress: Progress | None = None,
          evaluate: bool = True, save_last: int | None = None, save_every: int | None = None,
          stop_after: int | None = None, calc_map: bool = False, map_every: int | None = None) -> TrainResult:
    """Train the network of `cfg` on the `train` list of its .data file.

    `weights` resumes from its `seen` count (and from the `.state` beside it when that matches);
    `clear` restarts the count at 0. `seed` defaults to the resumed state's seed, else the settings'.
    `max_batches` overrides the cfg's. Backup folder: `backup`, else the .data's `backup=`, else the
    settings'. `save_last`/`save_every` override the checkpoint periods (the .data's `savelast` /
    `saveweights` keys, else 100/1000). `stop_after` stops (as if interrupted) after that many
    iterations of this run. With `evaluate`, the final network is validated on the `valid` list.
    The settings' thread count is applied first (`configure_threads`).

    Detectors: `random=1` on the last [yolo]/[region] trains at sizes drawn every 10 iterations
    (`multiscale_size`), back at the cfg's size for the final 10% and for every mAP measurement.
    `calc_map` measures mAP@0.5 on the `valid` list every `map_every` iterations (default
    max(100, max_batches/10)) and at the end, logs it (the CSV's `map` column) and keeps
    `<cfg>_best.weights` (and its .state) whenever it improves.
    """
    from .network import load_network

    t_start = time.perf_counter()
    settings = settings or load_settings()
    progress = progress or Progress("none", quiet=True)
    configure_threads(settings.threads)
    cfg = os.fspath(cfg)
    data_path = resolve_data_file(cfg, data)
    dc = load_data_config(data_path)
    base = cfg_base(cfg)
    backup_dir = os.fspath(backup) if backup is not None else (dc.backup or settings.backup)
    raw = dc.raw
    save_last = save_last or _positive_int(raw.get("savelast"), SAVE_LAST, "savelast", data_path)
    save_every = save_every or _positive_int(raw.get("saveweights"), SAVE_WEIGHTS, "saveweights", data_path)

    # -- the network and where it starts ----------------------------------------------------------
    net = load_network(cfg, seed=settings.seed if seed is None else seed)
    meta = None
    if weights is not None:
        try:
            net.load_weights(weights)
        except WeightsError as e:
            raise WeightsError(f"{e} (was it trained with another cfg, input size or number of classes?)") from None
        if clear:
            net.seen = 0
            progress.message(f"Loaded {weights}; --clear: the iteration count starts at 0")
        else:
            meta, why = read_state(state_path(weights), net, file_crc(weights))
            if meta is None:
                progress.message(f"Note: {why}; momentum/Adam state restarts, so this run continues "
                                 f"the saved one only approximately")
    seed = seed if seed is not None else (meta["seed"] if meta else settings.seed)
    B = net.config.full_batch
    start = net.seen // B
    net.updates = int(meta["updates"]) if meta else start
    max_batches = max_batches if max_batches is not None else net.config.max_batches
    if max_batches <= 0:
        raise TrainingError(f"{cfg}: max_batches is not set; add max_batches=N to [net] or pass --max-batches N")
    net.config.max_batches = max_batches      # the poly/sgdr schedules span the run actually made
    if weights is not None and not clear:
        progress.message(f"Resuming from {weights}: iteration {start}, {net.seen} images seen"
                         + (", optimiser state restored" if meta else ""))
    if start >= max_batches:
        raise TrainingError(f"{weights}: already trained for {start} iterations (max_batches={max_batches}); "
                            f"pass --max-batches N larger than {start}, or --clear to start the count over")

    # -- data ---------------------------------------------------------------------------------------
    check_classes(net, dc)
    train_paths = read_image_list(dc.train, "train", data_path)
    labels = None
    if not is_detector(net):
        labels = classifier_labels(dc)
        check_labels(train_paths, labels, dc.train)
    dataset = make_dataset(net, dc, train_paths, augment=True, labels=labels)
    plan = BatchPlan(len(train_paths), B, seed)
    base_size = (net.width, net.height)
    head_random = getattr(net.layers[-1], "random", 0) if is_detector(net) else 0
    sizes = multiscale_sizes(*base_size, head_random) if head_random else [base_size]

    def batch_size(k: int) -> tuple[int, int]:
        return multiscale_size(seed, k, sizes, base_size, max_batches) if len(sizes) > 1 else base_size

    def load_batch(k: int):
        """Batch k at its own input size (x is (B, c, h, w)): prefetching stays a pure function of k."""
        bw, bh = batch_size(k)
        return dataset.load(plan.indices(k), augment_rng(seed, k), bw, bh)

    if calc_map and not is_detector(net):
        raise DarkpyError(f"{cfg}: --map measures detector mAP; this network is a classifier (its accuracy "
                          f"on the valid list is printed at the end)")
    valid_paths = read_image_list(dc.valid, "valid", data_path) if calc_map else []
    map_every = map_every or max(100, max_batches // 10)
    best_map = meta.get("best_map") if meta else None

    # -- output files -------------------------------------------------------------------------------
    os.makedirs(backup_dir, exist_ok=True)
    remove_stale_temp_files(backup_dir, base)
    log_path = os.path.join(backup_dir, f"{base}_log.csv")
    chart_path = os.path.join(backup_dir, "chart.png")
    log = CsvLog(log_path, resume_from=start if start > 0 else None)
    avg = float(meta["avg_loss"]) if meta and meta.get("avg_loss") is not None else -1.0
    if avg < 0 and log.records:
        avg = log.records[-1].avg_loss

    def ckpt_meta(k: int) -> dict:
        return {"iteration": k, "seed": seed, "avg_loss": avg, "cfg": os.path.abspath(cfg),
                "loader": {"seed": seed, "iteration": k, "train_list": dc.train}, "best_map": best_map}

    def draw():
        from .chart import draw_loss_chart
        recs = log.records
        draw_loss_chart(chart_path, [r.iteration for r in recs], [r.loss for r in recs],
                        [r.avg_loss for r in recs], max_batches, title=base)

    if net.config.random and not is_detector(net):
        progress.message(f"Note: [net] random=1 (classifier multi-scale training) is not supported; "
                         f"training at {net.width}x{net.height} only")
    if head_random:
        progress.message("random=1: multi-scale training at " + ", ".join(f"{a}x{b}" for a, b in sizes)
                         + f", a new size every {RESIZE_PERIOD} iterations; {base_size[0]}x{base_size[1]} "
                         f"for the last {max(1, max_batches // 10)}")
    if calc_map:
        progress.message(f"mAP@0.5 on {dc.valid} ({len(valid_paths)} images) every {map_every} iterations "
                         f"and at the end; the best weights go to {base}_best.weights")
    if kernels_need_compiling(net):
        progress.message(COMPILING_NOTICE)
    progress.message(f"Training {cfg} on {dc.train} ({len(train_paths)} images), {B} images per iteration "
                     f"({net.config.subdivisions} x {net.batch}), iterations {start + 1}..{max_batches}, "
                     f"seed {seed}; checkpoints in {os.path.join(backup_dir, '')}")

    from .datasets import BatchLoader

    loader = BatchLoader(load_batch, depth=1)
    progress.begin(start, max_batches)
    last_ckpt: tuple[str, int] | None = (os.fspath(weights), start) if weights is not None else None
    records: list[Record] = []
    written: str | None = None
    best_written: str | None = None
    size_changes: list[tuple[int, int, int]] = []
    final_map = None
    interrupted = False
    k = start

    def set_size(size: tuple[int, int], why: str) -> None:
        if (net.width, net.height) != size:
            net.resize(*size)
            size_changes.append((k, *size))
            progress.message(f"Resizing to {size[0]}x{size[1]} ({why})")

    def measure_map():
        from .detect import evaluate_map

        set_size(base_size, "the cfg's size, to measure mAP")
        return evaluate_map(net, dc, iou=0.5, paths=valid_paths)

    try:
        with _StopRequest() as stop:
            while k < max_batches:
                t0 = time.perf_counter()
                x, y = loader.get(k)
                set_size((x.shape[-1], x.shape[-2]), f"iteration {k + 1}")
                net.rng = network_rng(seed, k)
                cost_sum, cost_mean = _train_iteration(net, x, y, lambda where, cost: TrainingError(
                    _nan_message(k + 1, cost, where, last_ckpt)))
                rate = net.update()
                k += 1
                loss = cost_sum / B
                avg = loss if avg < 0 else 0.9 * avg + 0.1 * loss
                rec = Record(k, net.seen / len(train_paths), loss, avg, cost_mean, rate,
                             time.perf_counter() - t0, int(net.seen))
                done = k >= max_batches
                improved = False
                if calc_map and (k % map_every == 0 or done):
                    final_map = measure_map()
                    rec.map = final_map.map
                    improved = best_map is None or rec.map > best_map
                    best_map = rec.map if improved else best_map
                records.append(rec)
                log.write(rec)
                progress.iteration(rec)
                if not math.isnan(rec.map):
                    progress.message(f"iteration {k}: mAP@0.5 = {100 * rec.map:.2f} %, best = {100 * best_map:.2f} %"
                                     + (f"; saving {base}_best.weights" if improved else ""))
                want_stop = stop.requested is not None or (stop_after is not None and k - start >= stop_after)
                names = checkpoint_names(base, k, save_last, save_every, done, want_stop)
                if improved:
                    names.append(f"{base}_best.weights")
                if done:
                    set_size(base_size, "the cfg's size, for the final weights")
                if names:
                    bad = _bad_params(net)
                    if bad is not None:
                        raise TrainingError(_nan_message(k, math.nan, f"{bad} (after the update)", last_ckpt))
                    for name in names:
                        path = os.path.join(backup_dir, name)
                        save_checkpoint(net, path, ckpt_meta(k))
                        if name.endswith("_best.weights"):
                            best_written = path
                        else:
                            written = path
                            last_ckpt = (path, k)
                    draw()
                if want_stop and not done:
                    interrupted = True
                    break
    except TrainingError:
        draw()
        raise
    finally:
        loader.close()
        log.close()
        progress.close()
        bad_labels = getattr(dataset, "bad_labels", None)
        if bad_labels:
            dataset.write_bad_labels(os.path.join(backup_dir, "bad_label.list"))
    result = TrainResult(cfg, backup_dir, start, k, max_batches, written, interrupted,
                         time.perf_counter() - t_start, log_path, chart_path, records,
                         map=None if interrupted else final_map,
                         best_map=best_map if calc_map else None, best=best_written, sizes=size_changes)
    if evaluate and not interrupted and dc.valid and not is_detector(net):
        result.accuracy = evaluate_classifier(net, dc, read_image_list(dc.valid, "valid", data_path))
    return result


def _train_iteration(net, x: np.ndarray, y: np.ndarray, nan_error) -> tuple[float, float]:
    """`subdivisions` training forwards (with truth) and backwards over the full batch x, y;
    gradients accumulate for the one update that follows. Returns (Σ cost, mean cost_mean). A
    non-finite cost raises `nan_error(where, cost)` before its backward can spread it."""
    mb, n = net.batch, net.config.subdivisions
    cost_sum = cost_mean_sum = 0.0
    for j in range(n):
        xs, ys = x[j * mb:(j + 1) * mb], y[j * mb:(j + 1) * mb]
        net.forward(xs, ys, train=True)
        if net.cost is None:
            raise TrainingError(f"{net.file}: the network has no cost layer (softmax, cost, yolo, ...) so it "
                                f"cannot be trained; end it with one")
        if not math.isfinite(net.cost):
            raise nan_error(first_non_finite(net, xs), net.cost)
        cost_sum += net.cost
        cost_mean_sum += net.cost_mean
        net.backward()
    return cost_sum, cost_mean_sum / n


def checkpoint_names(base: str, k: int, save_last: int, save_every: int, done: bool, stopping: bool) -> list[str]:
    """The checkpoint files written after iteration k (Darknet's names and periods)."""
    names = []
    if k % save_last == 0 or (stopping and not done):
        names.append(f"{base}_last.weights")
    if k % save_every == 0:
        names.append(f"{base}_{k}.weights")
    if done:
        names.append(f"{base}_final.weights")
    return names


def _positive_int(value, default: int, key: str, data_path) -> int:
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n <= 0:
        raise DataError(f"{data_path}: {key} must be a positive integer (got {value!r})")
    return n


def _nan_message(iteration: int, loss: float, where: str, last: tuple[str, int] | None) -> str:
    keep = (f"the last good checkpoint is {last[0]} (iteration {last[1]})" if last
            else "no checkpoint was written yet")
    return (f"iteration {iteration}: the loss is {loss}; the first non-finite values come from {where}. "
            f"Training stopped; {keep}. Try a lower learning_rate or a longer burn_in, or check the data")


# -- validation and prediction ------------------------------------------------------------------------

@dataclass
class ValidResult:
    top1: float
    topk: float
    k: int
    n: int
    confusion: np.ndarray                  # [truth, predicted] counts
    names: list[str]
    list_file: str

    def format(self) -> str:
        return (f"top-1 accuracy {self.top1 * 100:.2f} %, top-{self.k} {self.topk * 100:.2f} % "
                f"on {self.list_file} ({self.n} images)")

    def confusion_text(self, limit: int = 30) -> str:
        c = self.confusion
        if c.shape[0] > limit:
            return f"(confusion matrix omitted: {c.shape[0]} classes)"
        names = [str(n)[:8] for n in self.names]
        width = max(5, max(len(n) for n in names) + 1, len(str(int(c.max(initial=0)))) + 1)
        head = " " * (width + 2) + "".join(f"{n:>{width}}" for n in names)
        lines = ["confusion matrix (rows: true class, columns: predicted)", head]
        for n, row in zip(names, c):
            lines.append(f"{n:>{width}}  " + "".join(f"{int(v):>{width}d}" for v in row))
        return "\n".join(lines)


def evaluate_classifier(net, dc, paths: list[str], k: int | None = None, batch: int = 64) -> ValidResult:
    """Top-1/top-k accuracy and the confusion matrix of `net` on `paths` (no augmentation)."""
    labels = classifier_labels(dc)
    truth = check_labels(paths, labels, dc.valid or "<list>")
    classes = dc.classes
    k = min(k or (dc.top if "top" in dc.raw else 5), classes)
    names = class_names(dc) or labels
    dataset = make_dataset(net, dc, paths, augment=False, labels=labels)
    rng = np.random.default_rng(0)
    n = len(paths)
    bs = min(batch, n)
    if net.batch != bs:
        net.set_batch(bs)
    conf = np.zeros((classes, classes), np.int64)
    hits1 = hitsk = 0
    for lo in range(0, n, bs):
        idx = np.arange(lo, min(lo + bs, n))
        x, _ = dataset.load(idx, rng, net.width, net.height)
        if len(idx) < bs:
            x = np.concatenate([x, np.zeros((bs - len(idx), *x.shape[1:]), x.dtype)])
        out = net.forward(x, None, train=False).reshape(bs, -1)[:len(idx)]
        order = np.argsort(-out, axis=1, kind="stable")
        t = truth[idx]
        pred = order[:, 0]
        hits1 += int((pred == t).sum())
        hitsk += int((order[:, :k] == t[:, None]).any(axis=1).sum())
        np.add.at(conf, (t, pred), 1)
    return ValidResult(hits1 / n, hitsk / n, k, n, conf, names, dc.valid or "<list>")


def validate(cfg, weights, data=None, settings: Settings | None = None, engine: str = "darkpy") -> ValidResult:
    """`darkpy valid`: accuracy of `weights` on the .data file's `valid` list (`engine` as predict's)."""
    from .export.engine import with_engine

    data_path = resolve_data_file(cfg, data)
    dc = load_data_config(data_path)
    net = with_engine(_load_for_inference(cfg, weights), cfg, weights, engine)
    if is_detector(net):
        raise DarkpyError(f"{cfg}: `valid` measures classifier accuracy; this network is a detector: "
                          f"use `darkpy map`")
    check_classes(net, dc)
    return evaluate_classifier(net, dc, read_image_list(dc.valid, "valid", data_path))


def _load_for_inference(cfg, weights, notify=None):
    """Build the net at batch 1 and load `weights`; `notify(message)` hears about kernel compiling."""
    from .network import load_network

    net = load_network(cfg, batch=1)
    if notify is not None and kernels_need_compiling(net):
        notify(COMPILING_NOTICE)
    try:
        net.load_weights(weights)
    except WeightsError as e:
        raise WeightsError(f"{e} (was it trained with another cfg, input size or number of classes?)") from None
    return net


@dataclass
class Prediction:
    image: str
    top: list[tuple[int, str, float]]      # (class index, name, probability), best first

    def as_dict(self) -> dict:
        return {"image": self.image,
                "predictions": [{"index": i, "label": n, "probability": p} for i, n, p in self.top]}


def predict(cfg, weights, images: Sequence[str], data=None, top: int | None = None,
            notify=None, engine: str = "darkpy") -> list[Prediction]:
    """`darkpy predict`: the top classes of each image (resized to the network's input);
    `engine="onnxruntime"` runs the network exported to ONNX (export/engine.py)."""
    from . import images as im
    from .export.engine import with_engine

    net = with_engine(_load_for_inference(cfg, weights, notify), cfg, weights, engine)
    if is_detector(net):
        raise DarkpyError(f"{cfg}: `predict` shows classifier labels; this network is a detector: "
                          f"use `darkpy detect`")
    names = None
    k = top
    data_path = Path(data) if data is not None else find_data_file(cfg)
    if data is not None and not Path(data).is_file():
        raise DataError(f"{data}: no such .data file")
    if data_path is not None:
        dc = load_data_config(data_path)
        names = class_names(dc)
        k = k or (dc.top if "top" in dc.raw else None)
    out: list[Prediction] = []
    c = net.input_shape[0]
    for path in images:
        img = im.load_image(path, channels=c)
        x = im.resize_image(img, net.width, net.height)
        probs = net.predict(x[None]).reshape(-1)
        n = probs.size
        kk = min(k or 5, n)
        order = np.argsort(-probs, kind="stable")[:kk]
        label = (lambda i: names[i] if names and i < len(names) else str(i))
        out.append(Prediction(os.fspath(path), [(int(i), label(int(i)), float(probs[i])) for i in order]))
    return out
