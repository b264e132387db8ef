"""What the ranks of a data-parallel run exchange at each update, so that N ranks with
`subdivisions=s` train as one process with `subdivisions=N·s`.

One process runs the N·s forward/backward passes of an update in order; rank r runs passes
r·s .. r·s+s-1 of them (its shard of the batch). Then:

- Gradients: every `Param.grad` (Darknet's `*_updates`) is a view into one contiguous buffer
  (`flatten_grads`), summed over the ranks by one in-place allreduce. The buffer also carries the
  momentum term the previous update left in it; only rank 0 keeps that, the others start each
  update from zero, so the sum counts it once. Every rank then applies the same update, so the
  weights stay identical on every rank.
- One small allgather per update brings every rank's per-pass costs (summed in global pass order,
  as one process sums them), its stop request (any rank's Ctrl-C stops all after the same
  iteration) and its passes' batch-norm statistics. The BN rolling statistics are then rewound to
  their value before the update and the gathered statistics applied in rank order, pass by pass,
  with the kernel's rule `rolling = (1 − m)·rolling + m·stat`, as one process applies its
  subdivisions in order: every rank and every checkpoint holds the same values.

Equal to one process, not bit for bit: the gradient sum is associated differently (rank 0's
partial sum plus rank 1's, instead of one running sum over all passes), and the BN replay uses the
statistic rounded to float32 where the kernel used it in float64; both differ in the last float32
bits per update. Costs, `seen`, learning rates, the images, their augmentation and the network's
random draws are the same exactly.
"""
from __future__ import annotations

import zlib

import numpy as np

from .distributed import MpiError
from .errors import DarkpyError
from .kernels.bn import MOMENTUM

ALIGN_BYTES = 64        # each Param.grad view starts on a cache line, like a fresh allocation


def flatten_grads(net) -> np.ndarray:
    """Move every `Param.grad` of `net` into one contiguous buffer (values kept): afterwards each
    `p.grad` is a C-contiguous view of it, of the same shape. Returns the buffer."""
    params, seen = [], set()
    for layer in net.layers:
        for p in layer.params:
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    dtypes = {p.grad.dtype for p in params}
    if len(dtypes) > 1:
        raise DarkpyError(f"{net.file}: parameters of several dtypes ({', '.join(map(str, dtypes))}) "
                          f"cannot share one gradient buffer")
    dtype = dtypes.pop() if dtypes else np.dtype(np.float32)
    step = max(1, ALIGN_BYTES // dtype.itemsize)
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += -(-p.grad.size // step) * step
    raw = np.zeros(total + step, dtype)
    skip = (-raw.ctypes.data % ALIGN_BYTES) // dtype.itemsize
    flat = raw[skip:skip + total]
    for p, off in zip(params, offsets):
        view = flat[off:off + p.grad.size].reshape(p.grad.shape)
        view[...] = p.grad
        p.grad = view
    return flat


def bn_blocks(net) -> list:
    """Every batch-norm block of `net` with the statistics of its last training forward: a list of
    (BatchNormParams, stats) where stats() gives (means, variances), each (applications, channels),
    in the order the forward applied them to the rolling statistics (one row for a plain layer; one
    per time step for a recurrent layer's inner layer)."""
    from .layers.convolutional import BatchNormParams

    out = []
    for layer in net.layers:
        inners = getattr(layer, "inner", None)
        if inners:
            for inner in inners:
                if isinstance(inner.bn, BatchNormParams):
                    out.append((inner.bn, lambda i=inner: (i.bn_mean, i.bn_var)))
            continue
        bn = getattr(layer, "bn", None)
        if isinstance(bn, BatchNormParams):
            out.append((bn, lambda b=bn: (b.mean[None], b.variance[None])))
    return out


def apply_rolling(rolling: np.ndarray, stat: np.ndarray) -> None:
    """One rolling update, in place: the BN kernel's rule, computed in float64 as it does."""
    rolling[...] = (1 - MOMENTUM) * rolling.astype(np.float64) + MOMENTUM * stat.astype(np.float64)


class UpdateSync:
    """The exchange of one update (see the module docstring). Per update: `begin()`, then
    `record(j, cost, cost_mean)` after each of this rank's `passes` forwards, then
    `finish(stop)` -> (Σ cost over the whole batch, mean cost_mean over all passes, stop)."""

    def __init__(self, net, comm, passes: int):
        self.net, self.comm, self.passes = net, comm, passes
        self.grads = flatten_grads(net)
        self.costs = np.zeros(passes)
        self.cost_means = np.zeros(passes)
        self._blocks = bn_blocks(net) if comm.size > 1 else []
        self._rolling: list[tuple[np.ndarray, np.ndarray]] = []
        self._row = np.zeros(0)
        self._stats_size = 0

    @property
    def parameters(self) -> int:
        return int(self.grads.size)

    def begin(self) -> None:
        if self.comm.size == 1:
            return
        if self.comm.rank > 0:
            self.grads.fill(0)          # the momentum term is counted once, on rank 0
        self._rolling = [(bn.rolling_mean.copy(), bn.rolling_variance.copy()) for bn, _ in self._blocks]

    def record(self, j: int, cost: float, cost_mean: float) -> None:
        """After pass j's forward: its costs, and (with several ranks) its BN statistics."""
        self.costs[j], self.cost_means[j] = cost, cost_mean
        if self.comm.size == 1 or not self._blocks:
            return
        stats = [a for _, get in self._blocks for a in get()]
        size = sum(a.size for a in stats)
        if j == 0 and size != self._stats_size:        # first update, or the sizes changed
            self._stats_size = size
            self._row = np.zeros(1 + 2 * self.passes + self.passes * size)
        off = 1 + 2 * self.passes + j * size
        for a in stats:
            self._row[off:off + a.size] = a.reshape(-1)
            off += a.size

    def finish(self, stop: bool) -> tuple[float, float, bool]:
        if self.comm.size == 1:
            cost_sum = 0.0
            for c in self.costs:
                cost_sum += float(c)
            return cost_sum, float(sum(float(c) for c in self.cost_means)) / self.passes, stop
        if self._row.size == 0:
            self._row = np.zeros(1 + 2 * self.passes)
        n = self.passes
        self._row[0] = float(stop)
        self._row[1:1 + n] = self.costs
        self._row[1 + n:1 + 2 * n] = self.cost_means
        self.comm.allreduce(self.grads)
        rows = self.comm.allgather(self._row)
        cost_sum = mean_sum = 0.0
        for c in rows[:, 1:1 + n].reshape(-1):      # global pass order, as one process adds them
            cost_sum += float(c)
        for c in rows[:, 1 + n:1 + 2 * n].reshape(-1):
            mean_sum += float(c)
        self._replay_bn(rows[:, 1 + 2 * n:])
        return cost_sum, mean_sum / (n * self.comm.size), bool(rows[:, 0].any())

    def _replay_bn(self, stats: np.ndarray) -> None:
        """Rewind the rolling statistics to the update's start, then apply every rank's passes in
        rank order (rows of `stats`: rank r's passes, each the blocks' means and variances)."""
        if not self._blocks:
            return
        shapes = [a.shape for _, get in self._blocks for a in get()]
        for (bn, _), (mean0, var0) in zip(self._blocks, self._rolling):
            bn.rolling_mean[...] = mean0
            bn.rolling_variance[...] = var0
        per_pass = stats.reshape(self.comm.size * self.passes, -1)
        for row in per_pass:
            off = 0
            arrays = []
            for shape in shapes:
                size = int(np.prod(shape))
                arrays.append(row[off:off + size].reshape(shape))
                off += size
            for b, (bn, _) in enumerate(self._blocks):
                means, variances = arrays[2 * b], arrays[2 * b + 1]
                for t in range(means.shape[0]):
                    apply_rolling(bn.rolling_mean, means[t])
                    apply_rolling(bn.rolling_variance, variances[t])

    def check_replicas(self, iteration: int) -> None:
        """With several ranks: raise when the ranks' weights (and BN statistics) are not identical,
        which the update rule guarantees; a cheap CRC compared at each checkpoint."""
        if self.comm.size == 1:
            return
        crc = 0
        for layer in self.net.layers:
            for a in layer.weight_arrays():
                crc = zlib.crc32(np.ascontiguousarray(a).view(np.uint8), crc)
        crcs = self.comm.allgather(np.array([crc], np.int64))[:, 0]
        if len(set(crcs.tolist())) > 1:
            raise MpiError(f"iteration {iteration}: the ranks' weights differ (checksums "
                              f"{', '.join(f'{c:08x}' for c in crcs)}); the MPI library's allreduce "
                              f"did not give every rank the same sum")
