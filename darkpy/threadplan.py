"""Threads per layer, measured on the network itself.

Every parallel region of a kernel wakes numba's thread pool, and what a wake-up costs depends on
the machine: ~2 µs where the workers still spin (the `darkpy` command lets them spin ~20 µs after a
region, darkpy/process.py), 6-10 µs on a bare 2-core machine whose workers sleep
(OMP_WAIT_POLICY=PASSIVE), 50-65 µs on a 2-core Firecracker VM (measured
with `python -m benchmarks.wake_cost`). A layer whose kernels do little work per region is then
faster on the calling thread alone: on that VM a digits training step at b32 took 2.2 ms on one
thread and 3.2 ms on two, while cifar's took 1.6 s on two and 2.7 s on one. Which layers gain
from the second thread depends on the machine, its load, the batch and the input size, so a
`ThreadPlan` measures it:

- the first pass of a kind (forward or backward, inference or training, at one batch, input size
  and thread count) runs as usual and is not timed (first touches of fresh buffers);
- the next 2·SAMPLES passes (2·SAMPLES_LONG when the first of them took LONG_PASS_S or more)
  alternate between all threads and one thread for every layer, timing each layer;
- each layer is then given one thread if its fastest one-thread time was clearly lower (below
  ONE_THREAD_BELOW of its all-thread time), else all threads, except a layer whose two times
  differ by no more than a switch costs: it runs on the count of the layer before it in the pass
  (`_follow`), so it cuts no run in two;
- that choice is checked in place: for up to CHECK_ROUNDS rounds of as many passes run as chosen,
  a layer left on all threads whose time there is not clearly above its one-thread time moves to
  one thread. In the alternating passes every layer found the pool awake (its predecessor had just
  used it; before the first layer of an all-threads pass, which follows a one-thread pass, a
  region that does nothing wakes it, `_wake`); in the chosen plan a layer after one that ran on
  one thread must wake the pool first,
  which costs it what the second thread gained on a machine where waking is slow (on the Firecracker
  VM shapes-tiny's 32 -> 64 layer at b1 took 167 µs on one thread and 186-206 µs on two after a
  one-thread layer, though 144 µs with the pool awake). A round that moves no layer ends the checks.

Results do not depend on the choice: every kernel gives the same bits at any thread count (its work
is split in blocks fixed by the shape, never by the thread count; tests/test_threadplan.py trains
with and without a plan and compares the weights). Only numba's threads are chosen per layer;
BLAS's are chosen per GEMM by darkpy.blas. numba's thread count is per calling thread, so a data
loader thread is not affected, and the caller's count is put back after every pass.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numba
import numpy as np
from numba import prange
from numba.np.ufunc import parallel as _numba_parallel

from .kernels import pjit, thread_count

#: Timed passes per arm (all threads, one thread) before a layer's thread count is chosen, where
#: the first timed pass took less than LONG_PASS_S, else SAMPLES_LONG (a training step of seconds
#: then measures for fewer steps). On the 2-core AVX-512 Xeon VM, whose second core is now and
#: then slow to answer, 3 samples let a noisy one move layers: alternating 6 against 3 in one
#: process, each side's plan made anew, batch-1 inference of shapes-tiny took 0.86-0.94x the time
#: (and 1.05 once), of cifar 0.97-0.99x, of yolov3-tiny 0.98x.
SAMPLES = 6
SAMPLES_LONG = 3
LONG_PASS_S = 0.05
#: A layer moves to one thread only when its fastest one-thread time is below this share of its
#: fastest all-thread time: a layer whose two times are close keeps all threads, so a noisy sample
#: cannot move it (on the Zen 5 VM the layers of yolov3-tiny or darknet.cfg at b1 measure within
#: ~10 % of each other, and choosing them by a plain comparison changed whole passes by ±10 % from
#: one process to the next; the small networks' layers gain 1.5-3x on one thread).
ONE_THREAD_BELOW = 0.9
#: ... and only when it gains more than SWITCH_S seconds there: moving a layer to one thread costs
#: a switch to one and back (0.5 µs for the pair on the Zen 5 VM, `switch_threads`), so a layer of
#: a few microseconds (a small network's softmax at batch 1) whose two times differ by noise alone
#: stays where it is.
SWITCH_S = 1e-6
#: Most rounds of checking the choice in place (each of SAMPLES passes; see the module docstring).
CHECK_ROUNDS = 2


def _moves(many: float, one: float) -> bool:
    """Whether a layer that took `many` seconds on all threads and `one` on one thread moves to one."""
    return one < ONE_THREAD_BELOW * many and many - one > SWITCH_S


def _indifferent(many: float, one: float) -> bool:
    """Whether a layer's two times differ by no more than a switch costs (SWITCH_S): a fused pool
    that does nothing, a kernel that runs serially either way."""
    return abs(many - one) <= SWITCH_S


def _follow(decided: list, order: Sequence[int], threads: int) -> list[int]:
    """`decided` (a count per layer, None where the layer is indifferent) with each None given the
    count of the layer the pass runs just before it (`threads` for the first: the pass starts on
    it), so that an indifferent layer never cuts a run in two. A small network at batch 1 chose
    digits' second and third convolutions (serial kernels) for one thread and left its fused
    maxpool and its average pool, which do nothing there, on two: six switches a pass instead of
    two."""
    choice = list(decided)
    current = threads
    for i in order:
        if choice[i] is None:
            choice[i] = current
        current = choice[i]
    return [threads if n is None else n for n in choice]


def switch_threads(n: int) -> None:
    """numba.set_num_threads(n) for a count already checked (1, or the count the plan was made at):
    numba's own C setter, set once its thread pool is up (it always is here: the plan's first pass
    set the count through the public function), without the public one's checks (1.9 against 0.5 µs
    a call; a small network at batch 1 switches a few times per 100 µs pass). The public function
    where this numba has no such setter."""
    setter = getattr(_numba_parallel, "_set_num_threads", None)
    if setter is None:
        numba.set_num_threads(n)
    else:
        setter(n)


class ThreadPlan:
    """Thread counts for the layers of one kind of pass; `run` applies and, at first, measures them."""

    def __init__(self, layers: int, threads: int, clock: Callable[[], float] = time.perf_counter):
        self.threads = threads
        self.clock = clock
        self.passes = 0
        #: best time seen per layer on [all threads, one thread]
        self.best = [[float("inf")] * layers for _ in range(2)]
        #: chosen thread count per layer, None while measuring
        self.choice: list[int] | None = None
        #: timed passes per arm (SAMPLES, or SAMPLES_LONG once a timed pass was long)
        self.samples = SAMPLES
        #: passes left checking the choice in place, and each layer's best time there
        self.checks = SAMPLES * CHECK_ROUNDS
        self.placed = [float("inf")] * layers
        #: (items, their runs) of the last `runs` call
        self._runs: tuple[Sequence, list] | None = None

    def runs(self, items: Sequence) -> list[tuple[int, list]] | None:
        """Once the choice is settled (made, and no check left): `items` (one per layer, in layer
        order) cut into runs of consecutive layers on the same thread count, as (threads, the
        run's items), for a caller that runs them in its own loop (Network.forward); None before.
        Made once per `items` list."""
        if self.choice is None or self.checks:
            return None
        if self._runs is None or self._runs[0] is not items:
            runs: list[tuple[int, list]] = []
            for item, n in zip(items, self.choice):
                if runs and runs[-1][0] == n:
                    runs[-1][1].append(item)
                else:
                    runs.append((n, [item]))
            self._runs = (items, runs)
        return self._runs[1]

    def run(self, order: Sequence[int], step: Callable[[int], bool | None]) -> None:
        """`step(i)` for each layer index of `order` (stopping when it returns True), each on its
        layer's thread count; numba's count is `self.threads` again afterwards, even on an error."""
        if self.choice is not None:
            self._run_chosen(order, step, self.placed if self.checks else None)
            if self.checks:
                self._check()
            return
        try:
            self._run_measured(order, step)
        finally:
            numba.set_num_threads(self.threads)

    def _run_chosen(self, order, step, best=None) -> None:
        """Switches numba's count only where the choice changes along `order` (a plan that keeps
        every layer on all threads calls nothing), and puts it back only if it switched; with
        `best`, each layer's time lowers best[layer] when it is lower."""
        current = self.threads
        clock = self.clock
        try:
            for i in order:
                want = self.choice[i]
                if want != current:
                    switch_threads(want)
                    current = want
                if best is None:
                    if step(i):
                        return
                    continue
                t0 = clock()
                stop = step(i)
                best[i] = min(best[i], clock() - t0)
                if stop:
                    return
        finally:
            if current != self.threads:
                switch_threads(self.threads)

    def _check(self) -> None:
        """After a pass checking the choice in place: at the end of a round, the layers on all
        threads that were not clearly faster there than on one thread move to one; no move (or
        the last round) ends the checks."""
        self.checks -= 1
        if self.checks % self.samples:
            return
        moved = False
        for i, (n, placed, one) in enumerate(zip(self.choice, self.placed, self.best[1])):
            # (a layer no checking pass reached, after a step that stopped early, stays)
            if n > 1 and placed < float("inf") and _moves(placed, one):
                self.choice[i] = 1
                moved = True
        self.placed = [float("inf")] * len(self.placed)
        if not moved:
            self.checks = 0

    def _run_measured(self, order, step) -> None:
        timed = self.passes > 0
        arm = (self.passes - 1) % 2 if timed else 0          # 0: all threads, 1: one thread
        numba.set_num_threads(self.threads if arm == 0 else 1)
        if timed and arm == 0 and self.threads > 1:
            _wake(_WAKE_OUT)
        best = self.best[arm]
        clock = self.clock
        total = 0.0
        for i in order:
            t0 = clock()
            stop = step(i)
            if timed:
                dt = clock() - t0
                best[i] = min(best[i], dt)
                total += dt
            if stop:
                break
        self.passes += 1
        if self.passes == 2 and total >= LONG_PASS_S:      # the first timed pass was long
            self.samples = SAMPLES_LONG
            self.checks = SAMPLES_LONG * CHECK_ROUNDS
        if self.passes > 2 * self.samples:
            decided = [1 if _moves(many, one) else None if _indifferent(many, one) else self.threads
                       for many, one in zip(*self.best)]
            self.choice = _follow(decided, order, self.threads)


def forward_runs(runs: list, threads: int, s, clear_costs: bool) -> None:
    """The layers' forwards (each `layer.forward(s)`, then `s.input` its output; with
    `clear_costs`, a cost layer's cost cleared) in a settled plan's runs (`ThreadPlan.runs`), each
    run on its thread count, numba's count `threads` again afterwards, even on an error: the loop
    of Network.forward without a call around each layer's (`ThreadPlan.run`'s step: a small
    network at batch 1 spent ~0.1 µs a layer there)."""
    current = threads
    try:
        for n, run in runs:
            if n != current:
                switch_threads(n)
                current = n
            for layer in run:
                layer.forward(s)
                if clear_costs and layer.has_cost:
                    layer.clear_cost()
                s.input = layer.output
    finally:
        if current != threads:
            switch_threads(threads)


class ThreadPlans:
    """The network's plans, one per kind of pass; `plan(key, layers)` is None on one thread."""

    def __init__(self) -> None:
        self.enabled = True
        #: per-layer thread counts every new plan starts with instead of measuring (None: measure)
        self.fixed: list[int] | None = None
        self._plans: dict[tuple, ThreadPlan] = {}

    def plan(self, key: tuple, layers: int) -> ThreadPlan | None:
        threads = thread_count()
        if not self.enabled or threads < 2:
            return None
        key = (*key, threads)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = ThreadPlan(layers, threads)
            if self.fixed is not None:
                plan.choice = [min(n, threads) for n in self.fixed]
                plan.checks = 0
        return plan

    def settled(self) -> bool:
        """True when no plan is still measuring or checking (one more pass of each kind then runs
        as chosen)."""
        return all(plan.choice is not None and not plan.checks for plan in self._plans.values())

    def chosen(self) -> dict[tuple, list[int] | None]:
        """Every plan's per-layer thread counts (None while still measuring), by kind of pass."""
        return {key: plan.choice for key, plan in self._plans.items()}

    def clear(self) -> None:
        self._plans.clear()


#: `_wake`'s output: one value per thread of any pool up to this size.
_WAKE_OUT = np.zeros(256)


@pjit
def _wake(out):
    """A parallel region that does nothing useful: it wakes numba's pool before an all-threads
    measuring pass, whose first layer would otherwise pay the wake-up the one-thread pass before
    left it (36 µs on the 2-core AVX-512 Xeon VM, `benchmarks/wake_cost.py`), where a settled
    plan's pass finds the pool as the pass before left it. On the 2-core Zen 5 VM cifar.cfg's
    first layer at b1 was put on one thread for it: 70 µs there, 43-45 on two."""
    for i in prange(out.shape[0]):
        out[i] = i
