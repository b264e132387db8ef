"""A convolution's kernel call: the compiled kernel, its arguments but the thread count, and what
runs after it, made by a path's `forward_call` (kernels/direct.py, kernels/direct_fv.py). Each
path's `conv_forward` makes one and runs it; an inference forward keeps it while nothing it was
made from changes (layers/convolutional.py).

At batch 1 a small network's layers each spend a few microseconds of Python before their kernel
runs: the input and output viewed in 4-D, the path's sizes and branches, the kernel and its
arguments chosen (digits' first layer: 6.9 µs a forward, of which its compiled kernel 3.7). While
a layer's weights are fixed (`inference_only`, its epilogue kept: `_kept_epilogue`), the same
forward makes the same call every time; `KeptCall` keeps it, checked by identity against the
arrays it was made from (the input and output buffers, the weights, the kept epilogue, and the
maxpool output it writes instead of its own), so any change — new buffers from `set_batch`,
`resize` or `share_outputs`, new weights (`weights_changed` drops the kept epilogue), another
fused pool — makes it anew. The thread count is read at every call (thread plans set it per
layer).
"""
from __future__ import annotations

from . import thread_count


class KeptCall:
    """The kernel and arguments (all but the thread count) of one inference forward, what runs
    after it (None, or a function and its arguments), and what they were made from."""

    __slots__ = ("run", "args", "then", "made_from")

    def __init__(self, run, args: tuple, then: tuple | None = None, made_from: tuple = ()):
        self.run, self.args, self.then, self.made_from = run, args, then, made_from

    def matches(self, made_from: tuple) -> bool:
        """Whether every array of `made_from` is the very object this call was made from."""
        mine = self.made_from
        for i in range(len(mine)):
            if mine[i] is not made_from[i]:
                return False
        return True

    def __call__(self) -> None:
        self.run(*self.args, thread_count())
        if self.then is not None:
            self.then[0](*self.then[1])
