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

import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .batches import (RESIZE_PERIOD, BatchPlan, augment_rng, multiscale_size,  # noqa: F401  (re-exported)
                      multiscale_sizes, network_rng)
from .checkpoint import (SAVE_LAST, SAVE_WEIGHTS, STATE_VERSION, BackupLock, checkpoint_names,  # noqa: F401
                         file_crc, read_state, remove_stale_temp_files, save_checkpoint, state_path,
                         write_state)
from .datafile import (cfg_base, check_classes, check_labels, class_names, classifier_labels,  # noqa: F401
                       data_candidates, find_data_file, is_detector, load_data_config, make_dataset,
                       positive_int, read_image_list, resolve_data_file)
from .errors import DarkpyError, DataError, TrainingError, WeightsError  # noqa: F401
from .evaluate import Prediction, ValidResult, evaluate_classifier, predict, validate  # noqa: F401
from .progress import CsvLog, Progress, Record
from .runtime import COMPILING_NOTICE, configure_threads, kernels_need_compiling  # noqa: F401
from .settings import Settings, load_settings

if TYPE_CHECKING:  # pragma: no cover
    from .detect import MapResult


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
    save_last = save_last or positive_int(raw.get("savelast"), SAVE_LAST, "savelast", data_path)
    save_every = save_every or positive_int(raw.get("saveweights"), SAVE_WEIGHTS, "saveweights", data_path)

    # -- the network and where it starts ----------------------------------------------------------
    net = load_network(cfg, seed=settings.seed if seed is None else seed)
    meta = None
    if weights is not None:
        try:
            net.load_weights(weights)
        except WeightsError as e:
            raise e.with_cfg_hint() from None
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
    lock = BackupLock(backup_dir, notify=progress.message)    # released in the `finally` below
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
            bad_list = os.path.join(backup_dir, "bad_label.list")
            dataset.write_bad_labels(bad_list)
            progress.message(dataset.bad_labels_summary(bad_list))
        lock.release()
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



def _nan_message(iteration: int, loss: float, where: str, last: tuple[str, int] | None) -> str:
    keep = (f"the last good checkpoint is {last[0]} (iteration {last[1]})" if last
            else "no checkpoint was written yet")
    return (f"iteration {iteration}: the loss is {loss}; the first non-finite values come from {where}. "
            f"Training stopped; {keep}. Try a lower learning_rate or a longer burn_in, or check the data")

