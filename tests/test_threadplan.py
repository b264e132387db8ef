"""Threads per layer (darkpy/threadplan.py): the plan measures each layer on all threads and on one,
keeps the faster, puts numba's thread count back, and never changes a result: every kernel gives the
same bits at any thread count, so training with any per-layer choice equals training on one thread."""
from __future__ import annotations

import numba
import numpy as np
import pytest
from conftest import ROOT

from darkpy import threadplan
from darkpy.network import load_network, network_from_text
from darkpy.threadplan import (CHECK_ROUNDS, LONG_PASS_S, ONE_THREAD_BELOW, SAMPLES, SAMPLES_LONG,
                               SWITCH_S, ThreadPlan, forward_runs)

pytestmark = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                reason="needs 2 numba threads (NUMBA_NUM_THREADS < 2 on this machine)")


@pytest.fixture(autouse=True)
def two_threads():
    """Each test starts on 2 numba threads and leaves the caller's count as it found it."""
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    yield
    numba.set_num_threads(before)


class FakeClock:
    """A clock that a layer's step advances by that layer's cost at numba's current thread count."""

    def __init__(self, costs: dict[int, tuple[float, float]]):
        self.now, self.costs = 0.0, costs

    def __call__(self) -> float:
        return self.now

    def step(self, i: int) -> None:
        many, one = self.costs[i]
        self.now += one if numba.get_num_threads() == 1 else many


@pytest.mark.parametrize("unit", [1.0, 1e-4])
def test_plan_measures_both_arms_then_keeps_the_faster_per_layer(unit):
    # (time on 2 threads, time on 1): layer 0 gains from the second thread, layer 1 loses, 2 ties
    # (it follows layer 1: `_follow`) and 3 is only a little faster on one thread (kept on all:
    # ONE_THREAD_BELOW; by more than SWITCH_S, so not a tie, in either unit). Passes of 11
    # units: in seconds long ones (SAMPLES_LONG passes per arm), in 0.1 ms short ones (SAMPLES)
    costs = {0: (3.0, 5.0), 1: (4.0, 1.0), 2: (2.0, 2.0), 3: (2.0, 1.9)}
    clock = FakeClock({i: (a * unit, b * unit) for i, (a, b) in costs.items()})
    plan = ThreadPlan(4, 2, clock=clock)
    samples = SAMPLES_LONG if 11 * unit >= LONG_PASS_S else SAMPLES
    assert 11e-4 < LONG_PASS_S and SAMPLES > SAMPLES_LONG
    seen = []

    def step(i):
        seen.append((plan.passes, i, numba.get_num_threads()))
        clock.step(i)

    for _ in range(2 * samples + 1):
        assert plan.choice is None
        plan.run(range(4), step)
        assert numba.get_num_threads() == 2          # the caller's count is back after each pass
    assert ONE_THREAD_BELOW * 2.0 < 1.9 and 0.1 * unit > SWITCH_S and plan.choice == [2, 1, 1, 2]
    assert plan.samples == samples and plan.checks == samples * CHECK_ROUNDS
    # pass 0 untimed on all threads, then all threads and one thread in turn
    arms = [n for p, i, n in seen if i == 0]
    assert arms == [2] + [2, 1] * samples
    assert plan.best == [[pytest.approx(a * unit) for a, _ in costs.values()],
                         [pytest.approx(b * unit) for _, b in costs.values()]]
    seen.clear()
    plan.run(range(4), step)
    assert [n for _, _, n in seen] == [2, 1, 1, 2] and numba.get_num_threads() == 2
    # a step that returns True stops the pass
    seen.clear()
    plan.run(range(3), lambda i: seen.append(i) or i == 1)
    assert seen == [0, 1]


class WakeClock(FakeClock):
    """A FakeClock where a layer on two threads after one on a single thread first pays `wake`
    (the pool's workers went to sleep)."""

    def __init__(self, costs, wake: float):
        super().__init__(costs)
        self.wake, self.awake = wake, True

    def step(self, i: int) -> None:
        many = numba.get_num_threads() > 1
        if many and not self.awake:
            self.now += self.wake
        self.awake = many
        super().step(i)


def test_choice_checked_in_place_moves_layers_that_pay_for_waking_the_pool():
    # layer 0 is faster on one thread; layer 1 gains from two with the pool awake (3.0 vs 3.5),
    # but after layer 0 it must wake it (3.0 + 1.0); layer 2 then follows a one-thread layer too
    # and still gains enough (2.0 + 1.0 against 3.4) to stay
    clock = WakeClock({0: (3.0, 2.0), 1: (3.0, 3.5), 2: (2.0, 3.4)}, wake=1.0)
    plan = ThreadPlan(3, 2, clock=clock)
    passes = 0
    while plan.choice is None:
        plan.run(range(3), clock.step)
        passes += 1
    assert passes == 2 * SAMPLES_LONG + 1 and plan.choice == [1, 2, 2] and plan.checks
    while plan.checks:
        plan.run(range(3), clock.step)
        passes += 1
        assert numba.get_num_threads() == 2
    # round 1 moves layer 1 (4.0 in place against 3.5 on one thread); round 2 moves nothing
    assert CHECK_ROUNDS >= 2 and plan.choice == [1, 1, 2] and passes == 4 * SAMPLES_LONG + 1
    before = clock.now
    plan.run(range(3), clock.step)
    assert clock.now - before == 2.0 + 3.5 + 3.0


def test_all_threads_measuring_passes_wake_the_pool_first(monkeypatch):
    """Each timed all-threads pass follows a one-thread pass, which let the pool sleep: the plan
    wakes it before the pass's first layer (`_wake`), so that layer's time there is its own, as a
    settled plan's pass finds the pool, not a wake-up's. One-thread passes, the untimed first pass
    and settled passes wake nothing."""
    clock = WakeClock({0: (3.0, 3.5), 1: (2.0, 3.0)}, wake=2.0)
    plan = ThreadPlan(2, 2, clock=clock)
    woken, steps = [], []

    def wake(out):
        woken.append((plan.passes, len(steps)))
        clock.awake = True

    def step(i):
        steps.append(i)
        clock.step(i)

    monkeypatch.setattr(threadplan, "_wake", wake)
    while plan.choice is None:
        plan.run(range(2), step)
    assert woken == [(p, 2 * p) for p in range(1, 2 * SAMPLES_LONG, 2)]
    assert plan.choice == [2, 2] and plan.best[0][0] == 3.0
    while plan.checks:
        plan.run(range(2), step)
    assert len(woken) == SAMPLES_LONG


def test_check_leaves_layers_a_stopped_pass_never_reached():
    clock = FakeClock({0: (3.0, 5.0), 1: (3.0, 5.0), 2: (3.0, 5.0)})
    plan = ThreadPlan(3, 2, clock=clock)
    while plan.choice is None:
        plan.run(range(3), clock.step)
    assert plan.choice == [2, 2, 2]
    while plan.checks:                     # every checking pass stops after layer 1
        plan.run(range(3), lambda i: clock.step(i) or i == 1)
    assert plan.choice == [2, 2, 2]


def test_plan_puts_threads_back_when_a_layer_raises():
    plan = ThreadPlan(2, 2)
    plan.choice = [1, 1]

    def boom(i):
        assert numba.get_num_threads() == 1
        raise ValueError("layer failed")
    with pytest.raises(ValueError):
        plan.run(range(2), boom)
    assert numba.get_num_threads() == 2


def test_a_layer_moves_to_one_thread_only_when_it_gains_more_than_a_switch():
    # in microseconds: layer 0 is 25 % faster on one thread but by less than a switch costs; layer
    # 1 by 3 µs; layer 2 by more than SWITCH_S but not below ONE_THREAD_BELOW of its time
    costs = {0: (2.0, 1.5), 1: (5.0, 2.0), 2: (100.0, 95.0)}
    clock = FakeClock({i: (a * 1e-6, b * 1e-6) for i, (a, b) in costs.items()})
    plan = ThreadPlan(3, 2, clock=clock)
    while plan.choice is None:
        plan.run(range(3), clock.step)
    assert 0.5e-6 < SWITCH_S < 3e-6 and ONE_THREAD_BELOW * 100.0 < 95.0
    assert plan.choice == [2, 1, 2]


@pytest.mark.parametrize("backward", [False, True])
def test_layers_that_tie_run_on_the_count_of_the_layer_run_before_them(backward):
    # in microseconds: 0 and 3 tie (a fused pool doing nothing, a serial kernel), 1 gains from one
    # thread, 2 from two, 4 ties. Forward, 0 follows the pass's start (2 threads), 3 follows 2 and
    # 4 follows 3; backward (4 first), 4 follows the start, 3 follows 4, and 0 follows 1.
    costs = {0: (0.3, 0.3), 1: (9.0, 4.0), 2: (9.0, 20.0), 3: (5.0, 5.5), 4: (0.2, 0.1)}
    clock = FakeClock({i: (a * 1e-6, b * 1e-6) for i, (a, b) in costs.items()})
    plan = ThreadPlan(5, 2, clock=clock)
    order = range(4, -1, -1) if backward else range(5)
    while plan.choice is None:
        plan.run(order, clock.step)
    assert plan.choice == ([2, 1, 2, 2, 2] if not backward else [1, 1, 2, 2, 2])
    plan.checks = 0
    assert plan.runs(list("abcde")) == ([(2, ["a"]), (1, ["b"]), (2, ["c", "d", "e"])] if not backward
                                        else [(1, ["a", "b"]), (2, ["c", "d", "e"])])


def test_runs_cut_a_settled_choice_into_runs_on_one_thread_count():
    plan = ThreadPlan(5, 2)
    items = ["a", "b", "c", "d", "e"]
    assert plan.runs(items) is None                       # still measuring
    plan.choice = [1, 2, 2, 1, 1]
    assert plan.checks and plan.runs(items) is None       # still checking the choice in place
    plan.checks = 0
    assert plan.runs(items) == [(1, ["a"]), (2, ["b", "c"]), (1, ["d", "e"])]
    assert plan.runs(items) is plan.runs(items)           # made once per list


class _Layer:
    has_cost = False

    def __init__(self, seen, fail=False):
        self.seen, self.fail, self.output = seen, fail, object()

    def forward(self, s):
        self.seen.append((self, numba.get_num_threads(), s.input))
        if self.fail:
            raise ValueError("layer failed")


def test_forward_runs_chains_outputs_on_each_runs_threads_and_puts_the_count_back():
    class S:
        input = "x"
    seen = []
    a, b, c = _Layer(seen), _Layer(seen), _Layer(seen)
    forward_runs([(2, [a]), (1, [b, c])], 2, S, clear_costs=True)
    assert seen == [(a, 2, "x"), (b, 1, a.output), (c, 1, b.output)]
    assert numba.get_num_threads() == 2 and S.input is c.output
    with pytest.raises(ValueError):
        forward_runs([(1, [_Layer(seen, fail=True)])], 2, S, clear_costs=True)
    assert numba.get_num_threads() == 2


#: every family with a parallel kernel that a detector or classifier uses, at sizes above the
#: kernels' serial thresholds (8 x 16 x 48 x 48 = 295k values), so their parallel branches run
NET = """[net]
batch=8
width=48
height=48
channels=3
learning_rate=0.01
momentum=0.9
decay=0.0005

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=leaky

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=mish

[shortcut]
from=-2
activation=linear

[maxpool]
size=2
stride=2

[convolutional]
filters=32
size=1
stride=1
pad=1
activation=swish

[dropout]
probability=0.2

[upsample]
stride=2

[route]
layers=-1,0

[convolutional]
batch_normalize=1
filters=32
size=3
stride=2
pad=1
activation=logistic

[avgpool]

[connected]
output=10
activation=linear

[softmax]
"""


def _train(make, threads: int, plan: str, steps: int):
    numba.set_num_threads(threads)
    net = make()
    net.thread_plans.enabled = plan != "off"
    if plan == "mixed":                  # layers alternate between one thread and two
        net.thread_plans.fixed = [1 + i % 2 for i in range(len(net.layers))]
    rng = np.random.default_rng(0)
    outs = []
    for _ in range(steps):
        x = rng.random((net.batch, *net.input_shape), dtype=np.float32)
        truth = np.zeros(net.truth.shape, np.float32)
        if net.layers[-1].kind == "yolo":
            t = truth.reshape(net.batch, -1, 5)
            t[:, 0] = (0.5, 0.5, 0.3, 0.3, 1)
            t[:, 1] = (0.2, 0.3, 0.1, 0.15, 2)
        else:
            truth[np.arange(net.batch), rng.integers(0, truth.shape[1], net.batch)] = 1
        net.forward(x, truth, train=True)
        net.backward()
        net.update()
        outs.append(net.output.copy())
    if plan == "measured":                # measured, then run as chosen for the last steps
        assert net.thread_plans.settled()
    return np.concatenate([o.ravel() for o in outs]
                          + [p.value.ravel() for layer in net.layers for p in layer.params])


@pytest.mark.parametrize("name", ["families", "shapes-tiny"])
def test_training_gives_the_same_bits_on_any_threads_per_layer(name):
    make = ((lambda: network_from_text(NET)) if name == "families"
            else (lambda: load_network(ROOT / "cfg" / "shapes-tiny.cfg", batch=4)))
    steps = 2 * SAMPLES + SAMPLES * CHECK_ROUNDS + 3
    one = _train(make, 1, "off", steps)
    for plan in ("off", "mixed", "measured"):
        got = _train(make, 2, plan, steps)
        np.testing.assert_array_equal(got, one,
                                      err_msg=f"{name}: 2 threads, plan {plan} differs from 1 thread")


def test_network_plans_by_pass_kind_and_restores_threads():
    net = network_from_text(NET)
    x = np.random.default_rng(1).random((net.batch, *net.input_shape), dtype=np.float32)
    for _ in range(2 * SAMPLES + 1 + SAMPLES * CHECK_ROUNDS):
        net.forward(x)
        assert numba.get_num_threads() == 2
    chosen = net.thread_plans.chosen()
    assert list(chosen) == [("forward", False, 8, (3, 48, 48), 2)]
    assert all(n in (1, 2) for n in chosen[("forward", False, 8, (3, 48, 48), 2)])
    assert net.thread_plans.settled()
    net.set_batch(2)                      # another batch is another kind of pass: measured anew
    net.forward(x[:2])
    assert not net.thread_plans.settled()
    numba.set_num_threads(1)              # one thread: no plan at all
    net.thread_plans.clear()
    net.forward(x[:2])
    assert net.thread_plans.chosen() == {}
