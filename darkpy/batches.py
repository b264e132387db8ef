"""Which samples and which input size each iteration trains on: pure functions of (seed, iteration),
so a resumed run sees exactly the batches of the one it continues."""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import numpy as np


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
    """One generator for the whole batch k (`image_rngs` gives the trainer's per-image ones)."""
    return np.random.default_rng([seed, k, 1])


def image_rngs(seed: int, k: int, positions: Sequence[int]) -> list[np.random.Generator]:
    """The augmentation generators of the images at `positions` of batch k, one each: a rank that
    loads only its shard of the batch draws for each image what one process would."""
    return [np.random.default_rng([seed, k, 1, int(i)]) for i in positions]


def network_rng(seed: int, k: int) -> np.random.Generator:
    """The generator of update k's own draws (the `random` learning-rate policy)."""
    return np.random.default_rng([seed, k, 2])


def pass_rng(seed: int, k: int, j: int) -> np.random.Generator:
    """The network's generator (dropout masks, crop offsets) in forward pass j of iteration k."""
    return np.random.default_rng([seed, k, 2, j])


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
