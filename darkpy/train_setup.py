"""What a training run decides before its first iteration (`prepare_training` -> `TrainSetup`): the
network and where it starts (a checkpoint and its `.state`, a partial start, `--clear`), the data
and the dataset, this rank's share of each batch, and the run's opening messages. darkpy/train.py
runs the iterations.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .batches import RESIZE_PERIOD, BatchPlan, image_rngs, multiscale_size, multiscale_sizes
from .checkpoint import SAVE_LAST, SAVE_WEIGHTS, file_crc, read_state, state_path
from .datafile import (cfg_base, check_classes, check_labels, classifier_labels, is_detector,
                       load_data_config, make_dataset, positive_int, read_image_list, require_lists,
                       resolve_data_file)
from .errors import DarkpyError, TrainingError, WeightsError
from .progress import Progress
from .runtime import COMPILING_NOTICE, kernels_need_compiling
from .settings import Settings
from .textdata import is_text_data

if TYPE_CHECKING:  # pragma: no cover
    from .dataformats import DataConfig
    from .network import Network


@dataclass
class TrainSetup:
    """Everything a run decides before its first iteration."""

    cfg: str
    base: str                            # Darknet's <cfgbase>: checkpoint and log names
    data_path: str
    dc: "DataConfig"
    backup_dir: str
    net: "Network"
    weights: str | None                  # what the run started from
    meta: dict | None                    # the resumed .state's meta (None: no exact resume)
    seed: int
    start: int                           # iterations already done
    max_batches: int
    save_last: int
    save_every: int
    train_paths: list[str]
    dataset: object
    plan: BatchPlan
    base_size: tuple[int, int]
    sizes: list[tuple[int, int]]         # multi-scale sizes ([base_size] without random=1)
    head_random: float
    calc_map: bool
    valid_paths: list[str]
    map_every: int
    best_map: float | None
    passes: int                          # forward passes per update on this rank
    shard: range                         # this rank's positions in every batch

    @property
    def batch(self) -> int:
        """Images per update, over all ranks."""
        return self.net.config.full_batch

    def input_size(self, k: int) -> tuple[int, int]:
        if len(self.sizes) > 1:
            return multiscale_size(self.seed, k, self.sizes, self.base_size, self.max_batches)
        return self.base_size

    def load_batch(self, k: int):
        """This rank's shard of batch k at the batch's own input size (x is (shard, c, h, w)): a pure
        function of k, so prefetching changes nothing."""
        bw, bh = self.input_size(k)
        idx = self.plan.indices(k)[self.shard.start:self.shard.stop]
        rngs = image_rngs(self.seed, k, self.shard)
        if hasattr(self.dataset, "options"):         # a detector's: augmentation by iteration (mosaic_off)
            return self.dataset.load(idx, rngs, bw, bh, iteration=k)
        return self.dataset.load(idx, rngs, bw, bh)


def prepare_training(cfg, data, weights, clear, seed, max_batches, backup, settings: Settings,
                     progress: Progress, save_last, save_every, calc_map, map_every, comm,
                     upto: int | None = None, evaluate: bool = True) -> TrainSetup:
    """Read the .data file, build (and resume) the network, check the data, split the batch over
    the ranks. Raises the user's errors before anything is written."""
    cfg = os.fspath(cfg)
    data_path = resolve_data_file(cfg, data)
    dc = load_data_config(data_path)
    raw = dc.raw
    save_last = save_last or positive_int(raw.get("savelast"), SAVE_LAST, "savelast", data_path)
    save_every = save_every or positive_int(raw.get("saveweights"), SAVE_WEIGHTS, "saveweights", data_path)
    net, meta, seed, start, max_batches = _start_network(cfg, weights, clear, seed, max_batches, settings, progress,
                                                         upto, data)
    require_lists(dc, ["valid"] if calc_map or (evaluate and not is_detector(net) and not is_text_data(dc)) else [])
    if comm.size > 1 and is_text_data(dc):
        raise TrainingError(f"{data_path}: text data (char-RNN streams, padded lines) trains on one process "
                            f"only, not on {comm.size} ranks; run it without mpiexec or --procs")
    train_paths, dataset = training_data(net, dc, data_path)
    passes, shard = split_batch(net, comm, cfg)
    base_size = (net.width, net.height)
    head_random = getattr(net.layers[-1], "random", 0) if is_detector(net) else 0
    if calc_map and not is_detector(net):
        raise DarkpyError(f"{cfg}: --map measures detector mAP; this network is a classifier (its accuracy "
                          f"on the valid list is printed at the end)")
    return TrainSetup(
        cfg=cfg, base=cfg_base(cfg), data_path=data_path, dc=dc,
        backup_dir=os.fspath(backup) if backup is not None else (dc.backup or settings.backup),
        net=net, weights=os.fspath(weights) if weights is not None else None, meta=meta, seed=seed,
        start=start, max_batches=max_batches, save_last=save_last, save_every=save_every,
        train_paths=train_paths, dataset=dataset,
        plan=(dataset.plan(net.config.full_batch, seed) if is_text_data(dc)
              else BatchPlan(len(train_paths), net.config.full_batch, seed)),
        base_size=base_size, sizes=multiscale_sizes(*base_size, head_random) if head_random else [base_size],
        head_random=head_random, calc_map=calc_map,
        valid_paths=read_image_list(dc.valid, "valid", data_path) if calc_map else [],
        map_every=map_every or max(100, max_batches // 10),
        best_map=meta.get("best_map") if meta else None, passes=passes, shard=shard)


def _start_network(cfg: str, weights, clear: bool, seed, max_batches, settings: Settings, progress: Progress,
                   upto: int | None = None, data=None):
    """The network and where it starts: (net, resumed meta or None, seed, start, max_batches)."""
    from .network import load_network

    net = load_network(cfg, seed=settings.seed if seed is None else seed)
    net.share_deltas()      # deltas dead outside the backward share memory (darkpy/deltas_plan.py)
    meta = None
    if weights is not None:
        from .partial import partial_layers, weights_hint
        upto = upto if upto is not None else partial_layers(weights)
        if upto is not None and upto > len(net.layers):
            raise WeightsError(f"{weights}: --upto {upto} (or a .conv.{upto} name) is more than the "
                               f"{len(net.layers)} layers of {cfg}")
        try:
            net.load_weights(weights, upto=upto)
        except WeightsError as e:
            raise WeightsError(weights_hint(e, net, cfg, weights, data)) from None
        if upto is not None:
            net.seen = 0
            progress.message(f"Loaded layers 0..{upto - 1} of {weights} (a partial start: the other layers keep "
                             f"their random start, the iteration count starts at 0)")
        elif clear:
            net.seen = 0
            progress.message(f"Loaded {weights}; --clear: the iteration count starts at 0")
        else:
            meta, why = read_state(state_path(weights), net, file_crc(weights))
            if meta is None:
                progress.message(f"Note: {why}; momentum/Adam state restarts, so this run continues "
                                 f"the saved one only approximately")
    seed = seed if seed is not None else (meta["seed"] if meta else settings.seed)
    start = net.seen // net.config.full_batch
    net.updates = int(meta["updates"]) if meta else start
    max_batches = max_batches if max_batches is not None else net.config.max_batches
    if max_batches <= 0:
        raise TrainingError(f"{cfg}: max_batches is not set; add max_batches=N to [net] or pass --max-batches N")
    net.config.max_batches = max_batches      # the poly/sgdr schedules span the run actually made
    if weights is not None and not clear and upto is None:
        progress.message(f"Resuming from {weights}: iteration {start}, {net.seen} images seen"
                         + (", optimiser state restored" if meta else ""))
    if start >= max_batches:
        raise TrainingError(f"{weights}: already trained for {start} iterations (max_batches={max_batches}); "
                            f"pass --max-batches N larger than {start}, or --clear to start the count over")
    return net, meta, seed, start, max_batches


def training_data(net, dc, data_path) -> tuple[list[str], object]:
    """The train list (text data: the dataset's row positions) and the dataset the run reads
    batches from (checked against the network)."""
    check_classes(net, dc)
    text = is_text_data(dc)              # char-RNN / token data (darkpy/textdata.py)
    train_paths = [] if text else read_image_list(dc.train, "train", data_path)
    labels = None
    if not is_detector(net) and not text:
        labels = classifier_labels(dc)
        check_labels(train_paths, labels, dc.train)
    dataset = make_dataset(net, dc, train_paths, augment=True, labels=labels)
    return (range(len(dataset)) if text else train_paths), dataset


def split_batch(net, comm, cfg: str) -> tuple[int, range]:
    """This rank's forward passes per update and its positions in every batch. One process: the
    cfg's subdivisions over the whole batch. N ranks: each runs `subdivisions` passes of
    batch/(N·subdivisions) images (the net is re-batched to that), on its N-th of the batch."""
    c = net.config
    if comm.size == 1:
        return c.subdivisions, range(c.full_batch)
    n, s = comm.size, c.subdivisions
    if c.batch % (n * s):
        raise TrainingError(
            f"{cfg}: batch={c.batch} does not split over {n} ranks x subdivisions={s}: each forward pass "
            f"takes batch / (ranks x subdivisions) images, so batch must be a multiple of {n * s}; "
            f"change batch or subdivisions, or use another number of ranks")
    c.subdivisions = n * s
    net.set_batch(c.minibatch)
    share = c.full_batch // n
    return s, range(comm.rank * share, (comm.rank + 1) * share)


def announce(setup: TrainSetup, progress: Progress, comm) -> None:
    """The run's opening messages (rank 0's progress only)."""
    net, s = setup.net, setup
    if net.config.random and not is_detector(net):
        progress.message(f"Note: [net] random=1 (classifier multi-scale training) is not supported; "
                         f"training at {net.width}x{net.height} only")
    if s.head_random:
        progress.message("random=1: multi-scale training at " + ", ".join(f"{a}x{b}" for a, b in s.sizes)
                         + f", a new size every {RESIZE_PERIOD} iterations; {s.base_size[0]}x{s.base_size[1]} "
                         f"for the last {max(1, s.max_batches // 10)}")
    if s.calc_map:
        progress.message(f"mAP@0.5 on {s.dc.valid} ({len(s.valid_paths)} images) every {s.map_every} "
                         f"iterations and at the end; the best weights go to {s.base}_best.weights")
    if kernels_need_compiling(net):
        progress.message(COMPILING_NOTICE)
    if comm.size > 1:
        import numba
        threads = numba.get_num_threads()
        split = f"{comm.size} ranks x {s.passes} x {net.batch}, {threads} thread{'s' if threads > 1 else ''} each"
    else:
        split = f"{net.config.subdivisions} x {net.batch}"
    if is_text_data(s.dc):               # bytes in stream mode, lines in lines mode; a row per byte
        mode = getattr(s.dataset, "mode", "stream")
        what = (f"{s.dc.raw['text']} ({len(s.train_paths)} {'lines' if mode == 'lines' else 'bytes'})",
                "rows")
    else:
        what = (f"{s.dc.train} ({len(s.train_paths)} images)", "images")
    progress.message(f"Training {s.cfg} on {what[0]}, {s.batch} {what[1]} per "
                     f"iteration ({split}), iterations {s.start + 1}..{s.max_batches}, seed {s.seed}; "
                     f"checkpoints in {os.path.join(s.backup_dir, '')}")
