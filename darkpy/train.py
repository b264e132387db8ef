"""Training: the library behind `darkpy train` (validation and prediction: darkpy/evaluate.py).

The loop (Darknet's, spec §6): an iteration runs `subdivisions` training forwards with truth and
backwards, then one `Network.update()`; its loss is the sum of the passes' costs over the full batch
(Darknet's per-image loss). Checkpoints go to the backup folder under Darknet's names:
`<cfg>_last.weights` every `savelast` (100) iterations, `<cfg>_<N>.weights` every `saveweights`
(1000), `<cfg>_final.weights` at the end; every file is written to a temp file and renamed, so a
kill at any instant leaves the previous checkpoint loadable.

The parts: `prepare_training` (darkpy/train_setup.py) decides everything before the first
iteration (the network and where it starts, the data, this rank's share of each batch) into a
`TrainSetup`; `TrainingLoop` runs the iterations (`step` = one update; `checkpoints_due`/`save` = what to write after it).

Determinism: the batch of iteration k (sample indices and augmentation) is a pure function of
(seed, k) — the images come from epoch permutations `default_rng([seed, epoch])`, the augmentation
of the image at position i of the batch from `default_rng([seed, k, 1, i])` (`image_rngs`), the
network's own randomness (dropout, crop) in forward pass j from `default_rng([seed, k, 2, j])`
(`pass_rng`; the update's, policy=random, from `default_rng([seed, k, 2])`), and with random=1 the
input size from `default_rng([seed, k // 10, 3])` (`multiscale_size`; each prefetched batch is
loaded at its own size). Beside each checkpoint a `.state` file (an `.npz`) keeps what the
`.weights` file cannot: momentum buffers (`Param.grad`), Adam moments (`Param.state`), the update
count, the seed and the running average loss. Resuming from a checkpoint with its state gives
exactly the run that was not interrupted, bit for bit; from the `.weights` file alone (all Darknet
keeps) the momentum restarts at zero and the run continues only approximately.

Data parallel (MPI, darkpy/distributed.py): with N ranks the cfg's `batch` is still the images per
update; rank r trains on positions r·B/N .. (r+1)·B/N − 1 of every batch in `subdivisions` passes,
so N ranks with `subdivisions=s` run the passes of one process with `subdivisions=N·s`, and since
every random draw above is per image or per pass, on the same data (darkpy/update_sync.py: what the
ranks exchange per update). Rank 0 alone writes checkpoints, the log, the chart and progress.
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

from .batches import (RESIZE_PERIOD, BatchPlan, augment_rng, image_rngs, multiscale_size,  # noqa: F401
                      multiscale_sizes, network_rng, pass_rng)
from .checkpoint import (SAVE_LAST, SAVE_WEIGHTS, STATE_VERSION, BackupLock, checkpoint_names,  # noqa: F401
                         file_crc, read_state, remove_stale_temp_files, save_checkpoint, state_path,
                         write_state)
from .datafile import (cfg_base, check_classes, check_labels, class_names, classifier_labels,  # noqa: F401
                       data_candidates, find_data_file, is_detector, load_data_config, make_dataset,
                       positive_int, read_image_list, require_lists, resolve_data_file)
from .distributed import threads_per_rank, world
from .errors import DarkpyError, DataError, TrainingError, WeightsError  # noqa: F401
from .evaluate import Prediction, ValidResult, evaluate_classifier, predict, validate  # noqa: F401
from .progress import CsvLog, Progress, Record
from .runtime import COMPILING_NOTICE, configure_threads, kernels_need_compiling  # noqa: F401
from .settings import Settings, load_settings
from .textdata import is_text_data

from .train_setup import TrainSetup, announce, prepare_training

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
          stop_after: int | None = None, calc_map: bool = False, map_every: int | None = None,
          upto: int | None = None, comm=None) -> TrainResult:
    """Train the network of `cfg` on the `train` list of its .data file.

    `weights` resumes from its `seen` count (and from the `.state` beside it when that matches);
    `clear` restarts the count at 0. `upto=N` (implied by a `NAME.conv.N` file, see
    `partial.partial_layers`) loads only layers 0..N-1, the others keep their random start, and the
    count starts at 0 (a pretrained backbone, as Darknet's partial files). `seed` defaults to the
    resumed state's seed, else the settings'.
    `max_batches` overrides the cfg's. Backup folder: `backup`, else the .data's `backup=`, else the
    settings'. `save_last`/`save_every` override the checkpoint periods (the .data's `savelast` /
    `saveweights` keys, else 100/1000). `stop_after` stops (as if interrupted) after that many
    iterations of this run. With `evaluate`, the final network is validated on the `valid` list.
    The settings' thread count is applied first (`configure_threads`; under MPI, 0 = this host's
    cores shared among its ranks).

    Detectors: `random=1` on the last [yolo]/[region] trains at sizes drawn every 10 iterations
    (`multiscale_size`), back at the cfg's size for the final 10% and for every mAP measurement.
    `calc_map` measures mAP@0.5 on the `valid` list every `map_every` iterations (default
    max(100, max_batches/10)) and at the end, logs it (the CSV's `map` column) and keeps
    `<cfg>_best.weights` (and its .state) whenever it improves.

    `comm`: the communicator (darkpy/distributed.py; default `world()`, which is a single process
    unless mpiexec started several ranks). With several ranks every rank calls `train` with the same
    arguments; rank 0's result holds the checkpoints, log and accuracy. An exception on one rank
    would leave the others waiting in a collective: wrap the call in
    `distributed.abort_job_on_error(comm)`, as the CLI does, to end the job instead.
    """
    t_start = time.perf_counter()
    comm = comm if comm is not None else world()
    settings = settings or load_settings()
    if progress is None or comm.rank != 0:
        progress = Progress("none", quiet=True)
    configure_threads(threads_per_rank(settings.threads, comm))
    setup = prepare_training(cfg, data, weights, clear, seed, max_batches, backup, settings, progress,
                             save_last, save_every, calc_map, map_every, comm, upto=upto, evaluate=evaluate)
    announce(setup, progress, comm)
    loop = TrainingLoop(setup, progress, comm, stop_after)
    result = loop.run()
    result.seconds = time.perf_counter() - t_start
    if (evaluate and comm.rank == 0 and not result.interrupted and setup.dc.valid and not is_detector(setup.net)
            and not is_text_data(setup.dc)):
        result.accuracy = evaluate_classifier(setup.net, setup.dc,
                                              read_image_list(setup.dc.valid, "valid", setup.data_path))
        loop.draw(top1=result.accuracy.top1)
    return result


# -- before the first iteration -------------------------------------------------------------------------

# -- the iterations -------------------------------------------------------------------------------------

class TrainingLoop:
    """Runs the iterations of a `TrainSetup`: `step` (one update) and, after each, the log line, the
    mAP measurement and the checkpoints (`checkpoints_due`, `save`). Rank 0 alone writes files and
    progress; every rank runs the same steps, so every collective is reached by all."""

    def __init__(self, setup: TrainSetup, progress: Progress, comm, stop_after: int | None):
        from .datasets import BatchLoader
        from .update_sync import UpdateSync

        self.s, self.net, self.progress, self.comm = setup, setup.net, progress, comm
        self.stop_after = stop_after
        self.writer = comm.rank == 0
        self.log_path = os.path.join(setup.backup_dir, f"{setup.base}_log.csv")
        self.chart_path = os.path.join(setup.backup_dir, "chart.png")
        meta = setup.meta
        self.avg = float(meta["avg_loss"]) if meta and meta.get("avg_loss") is not None else -1.0
        self.log = None
        self.lock = None
        if self.writer:
            os.makedirs(setup.backup_dir, exist_ok=True)
            self.lock = BackupLock(setup.backup_dir, notify=progress.message)   # released at the end of run()
            remove_stale_temp_files(setup.backup_dir, setup.base)
            self.log = CsvLog(self.log_path, resume_from=setup.start if setup.start > 0 else None)
            if self.avg < 0 and self.log.records:
                self.avg = self.log.records[-1].avg_loss
        self.sync = UpdateSync(self.net, comm, setup.passes)
        self.loader = BatchLoader(setup.load_batch, depth=1)
        self.k = setup.start
        self.best_map = setup.best_map
        self.last_ckpt: tuple[str, int] | None = (setup.weights, setup.start) if setup.weights else None
        self.records: list[Record] = []
        self.written: str | None = None
        self.best_written: str | None = None
        self.size_changes: list[tuple[int, int, int]] = []
        self.final_map = None

    def epochs(self) -> float:
        """Passes over the training set so far: rows seen / rows per pass (a text line fills
        `time_steps / pack` rows, an image or a byte one)."""
        s = self.s
        return self.net.seen / (len(s.train_paths) * getattr(s.dataset, "rows_per_sample", 1.0))

    def run(self) -> TrainResult:
        s = self.s
        interrupted = False
        bad_labels = getattr(s.dataset, "bad_labels", None)
        self.progress.begin(s.start, s.max_batches)
        try:
            with _StopRequest() as stop:
                while self.k < s.max_batches:
                    t0 = time.perf_counter()
                    loss, cost_mean, rate, stop_asked = self.step(self.k, stop.requested is not None)
                    self.k += 1
                    k = self.k
                    self.avg = loss if self.avg < 0 else 0.9 * self.avg + 0.1 * loss
                    rec = Record(k, self.epochs(), loss, self.avg, cost_mean, rate,
                                 time.perf_counter() - t0, int(self.net.seen))
                    rec.grad_norm = self.net.grad_norm
                    done = k >= s.max_batches
                    improved = self.measure_map(rec, done)
                    self.records.append(rec)
                    if self.writer:
                        self.log.write(rec)
                    self.progress.iteration(rec)
                    if not math.isnan(rec.map):
                        self.progress.message(
                            f"iteration {k}: mAP@0.5 = {100 * rec.map:.2f} %, best = {100 * self.best_map:.2f} %"
                            + (f"; saving {s.base}_best.weights" if improved else ""))
                    # one process acts on a signal that came while it logged this iteration too; ranks
                    # stop on the requests they exchanged in the step, so all stop after the same iteration
                    asked = stop.requested is not None if self.comm.size == 1 else stop_asked
                    want_stop = asked or (self.stop_after is not None and k - s.start >= self.stop_after)
                    if done:
                        self.set_size(s.base_size, "the cfg's size, for the final weights")
                    self.save(self.checkpoints_due(k, done, want_stop), improved)
                    if want_stop and not done:
                        interrupted = True
                        break
            if bad_labels is not None and self.comm.size > 1:
                bad_labels = _merge_lists(self.comm.allgather_objects(bad_labels))
        except TrainingError:
            if self.writer:
                self.draw()
            raise
        finally:
            self.loader.close()
            if self.log is not None:
                self.log.close()
            self.progress.close()
            if self.writer and bad_labels:
                s.dataset.bad_labels[:] = bad_labels
                bad_list = os.path.join(s.backup_dir, "bad_label.list")
                s.dataset.write_bad_labels(bad_list)
                self.progress.message(s.dataset.bad_labels_summary(bad_list))
            if self.lock is not None:
                self.lock.release()
        return TrainResult(s.cfg, s.backup_dir, s.start, self.k, s.max_batches, self.written, interrupted, 0.0,
                           self.log_path, self.chart_path, self.records,
                           map=None if interrupted else self.final_map,
                           best_map=self.best_map if s.calc_map else None, best=self.best_written,
                           sizes=self.size_changes)

    def step(self, k: int, stop_requested: bool) -> tuple[float, float, float, bool]:
        """Iteration k (0-based): this rank's forward/backward passes over its shard of batch k, the
        exchange with the other ranks, one update. Returns (loss per image, mean cost_mean, rate,
        whether any rank asked to stop)."""
        s, net, sync = self.s, self.net, self.sync
        x, y = self.loader.get(k)
        self.set_size((x.shape[-1], x.shape[-2]), f"iteration {k + 1}")
        mb, seen0 = net.batch, net.seen
        first = self.comm.rank * s.passes          # this rank's first pass, in the whole update's order
        if hasattr(s.dataset, "prepare_network"):     # text streams: carried recurrent state
            s.dataset.prepare_network(net, k)
        sync.begin()
        for j in range(s.passes):
            net.seen = seen0 + (first + j) * mb     # as if every earlier pass of the update ran here
            net.rng = pass_rng(s.seed, k, first + j)
            xs, ys = x[j * mb:(j + 1) * mb], y[j * mb:(j + 1) * mb]
            if hasattr(s.dataset, "begin_pass"):      # text streams: this pass's streams' state
                s.dataset.begin_pass(net, first + j)
            net.forward(xs, ys, train=True)
            if hasattr(s.dataset, "end_pass"):
                s.dataset.end_pass(net, first + j)
            if net.cost is None:
                raise TrainingError(f"{net.file}: the network has no cost layer (softmax, cost, yolo, ...) so it "
                                    f"cannot be trained; end it with one")
            if not math.isfinite(net.cost):
                raise TrainingError(_nan_message(k + 1, net.cost, first_non_finite(net, xs), self.last_ckpt))
            sync.record(j, net.cost, net.cost_mean)
            net.backward()
        cost_sum, cost_mean, stop = sync.finish(stop_requested)
        net.seen = seen0 + s.batch
        net.rng = network_rng(s.seed, k)
        rate = net.update()
        return cost_sum / s.batch, cost_mean, rate, stop

    def set_size(self, size: tuple[int, int], why: str) -> None:
        if len(self.net.input_shape) == 3 and (self.net.width, self.net.height) != size:   # (flat inputs: text)
            self.net.resize(*size)
            self.size_changes.append((self.k, *size))
            self.progress.message(f"Resizing to {size[0]}x{size[1]} ({why})")

    def measure_map(self, rec: Record, done: bool) -> bool:
        """With --map, on its iterations: mAP on the valid list (rank 0 only) into `rec`; returns
        whether it improved on the best so far."""
        s = self.s
        if not (s.calc_map and self.writer and (rec.iteration % s.map_every == 0 or done)):
            return False
        from .detect import evaluate_map

        self.set_size(s.base_size, "the cfg's size, to measure mAP")
        self.final_map = evaluate_map(self.net, s.dc, iou=0.5, paths=s.valid_paths)
        rec.map = self.final_map.map
        improved = self.best_map is None or rec.map > self.best_map
        self.best_map = rec.map if improved else self.best_map
        return improved

    def checkpoints_due(self, k: int, done: bool, stopping: bool) -> list[str]:
        """The checkpoint files to write after iteration k (the same on every rank)."""
        s = self.s
        return checkpoint_names(s.base, k, s.save_last, s.save_every, done, stopping)

    def save(self, names: list[str], improved: bool) -> None:
        """Write `names` (and `_best` when the mAP improved): rank 0 only, after checking that the
        weights are finite and, with several ranks, the same on every rank."""
        s, k = self.s, self.k
        if names:
            self.sync.check_replicas(k)
        if improved:
            names = names + [f"{s.base}_best.weights"]
        if not names or not self.writer:
            return
        bad = _bad_params(self.net)
        if bad is not None:
            raise TrainingError(_nan_message(k, math.nan, f"{bad} (after the update)", self.last_ckpt))
        for name in names:
            path = os.path.join(s.backup_dir, name)
            save_checkpoint(self.net, path, self.checkpoint_meta(k))
            if name.endswith("_best.weights"):
                self.best_written = path
            else:
                self.written = path
                self.last_ckpt = (path, k)
        self.draw()

    def checkpoint_meta(self, k: int) -> dict:
        s = self.s
        return {"iteration": k, "seed": s.seed, "avg_loss": self.avg, "cfg": os.path.abspath(s.cfg),
                "loader": {"seed": s.seed, "iteration": k, "train_list": s.dc.train}, "best_map": self.best_map}

    def draw(self, top1: float | None = None) -> None:
        """chart.png: the loss curves, and mAP (with --map) or the final top-1 on a second axis."""
        from .chart import draw_loss_chart

        recs = self.log.records
        metric = [(r.iteration, r.map) for r in recs if not math.isnan(r.map)]
        if top1 is not None:
            metric = [(recs[-1].iteration if recs else self.k, top1)]
        draw_loss_chart(self.chart_path, [r.iteration for r in recs], [r.loss for r in recs],
                        [r.avg_loss for r in recs], self.s.max_batches, title=self.s.base, metric=metric,
                        metric_name="top-1" if top1 is not None else "mAP@0.5")



def _merge_lists(lists: list[list[str]]) -> list[str]:
    out, seen = [], set()
    for items in lists:
        for item in items:
            if item not in seen:
                seen.add(item)
                out.append(item)
    return out



def _nan_message(iteration: int, loss: float, where: str, last: tuple[str, int] | None) -> str:
    keep = (f"the last good checkpoint is {last[0]} (iteration {last[1]})" if last
            else "no checkpoint was written yet")
    return (f"iteration {iteration}: the loss is {loss}; the first non-finite values come from {where}. "
            f"Training stopped; {keep}. Try a lower learning_rate or a longer burn_in, or check the data")

