"""`[embedding]`: token ids → vectors, plus a position vector (darkpy; no Darknet has it).

Input: one value per row, the token id (a float holding an integer in 0..vocab-1); the network has
`inputs=1`. Rows follow the sequence convention of the recurrent layers (time-major: with `steps =
[net] time_steps` and S sequences per pass, row `t·S + s` is position t of sequence s).

    y[row] = table[id[row]] + pos[t]

Keys: `vocab` (default 256), `size` (the vector width, required), `positions` = `learned` (a
`time_steps × size` table, trained), `sinusoidal` (fixed sin/cos of Vaswani et al.) or `none`;
`std` (default 0.02, GPT-2's): the standard deviation of the tables' normal initialisation (1 is
torch's `nn.Embedding` default).

Backward scatter-adds: a token used several times in the batch receives the sum of the gradients of
all its rows (and each position the sum over its sequences). The ids receive no gradient (nothing is
added into the previous delta). Neither table is decayed by AdamW. File order: table, then the
learned position table.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import StateError
from ..kernels import jit
from .base import Layer, Param, State, register

POSITIONS = ("learned", "sinusoidal", "none")


def sinusoidal_table(steps: int, size: int, dtype=np.float64) -> np.ndarray:
    """(steps, size): pe[t, 2i] = sin(t / 10000^(2i/size)), pe[t, 2i+1] = cos(same angle)."""
    t = np.arange(steps, dtype=np.float64)[:, None]
    i = np.arange(size, dtype=np.float64)[None, :]
    angle = t / np.power(10000.0, 2 * np.floor(i / 2) / size)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle)).astype(dtype)


@jit
def embed_rows(out, ids, raw, table, pos):
    """out: (R, size) = table[raw[r]] + pos[r // S] (pos: (steps, size), or (0, size) for none; S =
    R / steps), ids: (R,) int64 = raw. Returns the first row whose raw id is not an integer in
    0..vocab−1, writing nothing, or −1."""
    V = table.shape[0]
    for r in range(raw.shape[0]):
        v = raw[r]
        if not (v >= 0 and v < V and v == math.floor(v)):       # NaN fails too
            return r
    S = raw.shape[0] // max(pos.shape[0], 1)
    for r in range(raw.shape[0]):
        k = int(raw[r])
        ids[r] = k
        src, o = table[k], out[r]
        if pos.shape[0] > 0:
            p = pos[r // S]
            for j in range(o.shape[0]):
                o[j] = src[j] + p[j]
        else:
            for j in range(o.shape[0]):
                o[j] = src[j]
    return -1


@jit
def scatter_add_rows(table_grad, ids, d):
    """table_grad[ids[r]] += d[r] for every row r, in row order (np.add.at's result, ~30× faster);
    serial: two rows may name one token."""
    for r in range(ids.shape[0]):
        g = table_grad[ids[r]]
        for j in range(d.shape[1]):
            g[j] += d[r, j]


@register
class EmbeddingLayer(Layer):
    kind = "embedding"
    own_section = True      # darkpy's own section: `darkpy summary` adds its parameters and FLOPs
    resizable = False

    def __init__(self, index: int, vocab: int, size: int, steps: int, positions: str = "learned",
                 dtype=np.float32, std: float = 0.02):
        super().__init__(index, (1,), (size,), dtype)
        self.vocab, self.size, self.steps, self.positions = vocab, size, steps, positions
        self.std = std
        self.table = Param("table", np.zeros((vocab, size), self.dtype), np.zeros((vocab, size), self.dtype))
        self.params = [self.table]
        self.pos: Param | None = None
        self.fixed_pos: np.ndarray | None = None
        if positions == "learned":
            self.pos = Param("positions", np.zeros((steps, size), self.dtype), np.zeros((steps, size), self.dtype))
            self.params.append(self.pos)
        elif positions == "sinusoidal":
            self.fixed_pos = sinusoidal_table(steps, size, self.dtype)
        self.ids = np.zeros(0, np.int64)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "EmbeddingLayer":
        if tuple(in_shape) != (1,):
            raise sec.error(f"reads one token id per row: the input must be 1 value (set inputs=1 in [net] "
                            f"and make [embedding] the first layer); got {in_shape}")
        vocab = sec.get_int("vocab", 256)
        size = sec.get_int("size")
        if vocab < 1:
            raise sec.error(f"must be >= 1 (got {vocab})", "vocab")
        if size < 1:
            raise sec.error(f"must be >= 1 (got {size})", "size")
        positions = sec.get_choice("positions", POSITIONS, "learned")
        std = sec.get_float("std", 0.02)
        if not std > 0:
            raise sec.error(f"must be > 0 (got {std})", "std")
        return cls(sec.index, vocab, size, ctx.net.time_steps, positions, ctx.dtype, std)

    def init_weights(self, rng: np.random.Generator) -> None:
        """Both tables N(0, std²) (std = 0.02 by default, GPT-2's initialisation)."""
        self.table.value[...] = rng.normal(0, self.std, self.table.value.shape)
        if self.pos is not None:
            self.pos.value[...] = rng.normal(0, self.std, self.pos.value.shape)

    def allocate(self, batch: int) -> None:
        if batch % self.steps:
            raise StateError(f"layer {self.index} [embedding]: {batch} rows is not a multiple of "
                             f"time_steps={self.steps}")
        super().allocate(batch)
        self.ids = np.zeros(batch, np.int64)

    def _position_table(self) -> np.ndarray | None:
        return self.pos.value if self.pos is not None else self.fixed_pos

    def forward(self, s: State) -> None:
        raw = s.input.reshape(self.batch)
        pos = self._position_table()
        pos = pos if pos is not None else np.zeros((0, self.size), self.dtype)
        r = embed_rows(self.output.reshape(self.batch, self.size), self.ids, raw, self.table.value, pos)
        if r >= 0:
            raise StateError(f"layer {self.index} [embedding]: row {r} has token id {float(raw[r]):g}; ids must be "
                             f"integers in 0..{self.vocab - 1} (vocab={self.vocab})")

    def backward(self, s: State) -> None:
        self.require_training_buffers()
        scatter_add_rows(self.table.grad, self.ids, self.delta.reshape(self.batch, self.size))
        if self.pos is not None:
            d = self.delta.reshape(self.steps, self.batch // self.steps, self.size)
            self.pos.grad += d.sum(axis=1)

    def weight_arrays(self) -> list[np.ndarray]:
        return [self.table.value] + ([self.pos.value] if self.pos is not None else [])

    def flops(self) -> float:
        return float(self.size)

    def summary(self) -> str:
        return (f"embedding  {self.vocab:5d} x {self.size:<4d} pos={self.positions:<10}"
                f"  1  ->  {self.size:4d}")


def position_rows(batch: int, steps: int) -> np.ndarray:
    """The position t of each row of a time-major pass (for references and tests)."""
    return np.repeat(np.arange(steps), batch // steps)

