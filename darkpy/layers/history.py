"""`[history]` (AlexeyAB, `conv_lstm_layer.c`): the last `history_size` inputs of a sequence,
stacked along channels. Key: history_size (4).

Shapes: (c, h, w) -> (c·history_size, h, w). Rows are time-major, as every sequence layer in
darkpy (DESIGN §2): step t of sequence b is row t·batch + b, with batch = rows / time_steps.
Forward at step t: channel block 0 is x_t, block k is x_{t−k} (zero before the sequence start),
i.e. `out_t = [x_t, out_{t−1}[blocks 0..H−2]]`, Darknet's shift.

Backward: the exact gradient, x_t receives block k of every out_{t+k}.
# darknet: its backward passes only block 0 of each step (x_t's own slot) to the input; the
# copies in later steps get no gradient. darkpy gives them theirs.
State: each forward starts from zeros (a pure function of its input, as darkpy's recurrent
layers); `carry_state = True` starts from the previous forward's last step instead (Darknet
always carries it); gradients never flow into a carried state. With time_steps=1, Darknet copies
`inputs·batch` values into an `outputs·batch` buffer (right for batch 1 only: later items land in
the first item's history blocks); darkpy gives every item [x, carried/zero blocks].
"""
from __future__ import annotations

import numpy as np

from .base import Layer, State, fmt_shape, register


@register
class HistoryLayer(Layer):
    kind = "history"
    needs_image = True
    resizable = False

    def __init__(self, index: int, in_shape, history_size: int, steps: int, dtype=np.float32):
        c, h, w = in_shape
        super().__init__(index, in_shape, (c * history_size, h, w), dtype)
        self.history_size, self.steps = history_size, steps
        self.carry_state = False
        self.prev = np.zeros((0,), self.dtype)

    @classmethod
    def from_cfg(cls, sec, in_shape, ctx) -> "HistoryLayer":
        size = sec.get_int("history_size", 4)
        if size < 1:
            raise sec.error(f"must be >= 1 (got {size})", "history_size")
        return cls(sec.index, in_shape, size, ctx.net.time_steps, ctx.dtype)

    @property
    def seq_batch(self) -> int:
        return max(self.batch // self.steps, 1)

    def allocate(self, batch: int) -> None:
        super().allocate(batch)
        self.prev = np.zeros((self.seq_batch, *self.out_shape), self.dtype)

    def reset_state(self) -> None:
        self.prev.fill(0)

    def _initial_state(self) -> list[np.ndarray]:
        return [self.prev]

    def _steps(self, a: np.ndarray, shape) -> np.ndarray:
        return a.reshape(self.steps, self.seq_batch, *shape)

    def forward(self, s: State) -> None:
        c = self.in_shape[0]
        x = self._steps(s.input, self.in_shape)
        y = self._steps(self.output, self.out_shape)
        prev = self.prev if self.carry_state else np.zeros_like(self.prev)
        for t in range(self.steps):
            y[t, :, :c] = x[t]
            y[t, :, c:] = prev[:, :-c] if self.history_size > 1 else 0
            prev = y[t]
        self.prev[...] = y[-1]

    def backward(self, s: State) -> None:
        if s.delta is None:
            return
        c, H = self.in_shape[0], self.history_size
        dx = self._steps(s.delta, self.in_shape)
        dy = self._steps(self.delta, self.out_shape)
        for t in range(self.steps):
            for k in range(min(H, self.steps - t)):
                dx[t] += dy[t + k, :, k * c:(k + 1) * c]

    def summary(self) -> str:
        return (f"history {self.history_size:3d}                {fmt_shape(self.in_shape)}   ->  "
                f"{fmt_shape(self.out_shape)}")
