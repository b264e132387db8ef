"""`[history]`: forward against a numpy reference, the exact backward by central differences,
carried state, and a few training steps that lower a loss."""
from __future__ import annotations

import numpy as np

from darkpy.network import network_from_text
from helpers import assert_close, layer_gradcheck

NET = "[net]\nbatch=6\ntime_steps=3\nwidth=2\nheight=1\nchannels=2\n"


def ref_history(x, steps, H):
    """x (steps*batch, c, h, w) time-major -> (steps*batch, c*H, h, w)."""
    n, c = x.shape[:2]
    b = n // steps
    xs = x.reshape(steps, b, *x.shape[1:])
    out = np.zeros((steps, b, c * H, *x.shape[2:]))
    for t in range(steps):
        for k in range(H):
            if t - k >= 0:
                out[t, :, k * c:(k + 1) * c] = xs[t - k]
    return out.reshape(n, c * H, *x.shape[2:])


def test_forward_matches_reference_and_state_carries_only_when_asked():
    net = network_from_text(NET + "[history]\nhistory_size=2\n", dtype=np.float64)
    layer = net.layers[0]
    assert layer.out_shape == (4, 1, 2)
    x = np.random.default_rng(0).normal(size=net.input.shape)
    assert_close(net.forward(x), ref_history(x, 3, 2), 0, 0, "history")
    assert_close(net.forward(x), ref_history(x, 3, 2), 0, 0, "no state carried by default")
    layer.carry_state = True
    y = net.forward(x).copy()
    # step 0's second block is the previous forward's last input
    assert_close(y[:6, 2:], x[12:18], 0, 0, "carried")


def test_backward_is_the_exact_gradient():
    layer_gradcheck(NET + "[convolutional]\nfilters=2\nsize=1\nactivation=linear\n[history]\nhistory_size=3\n", 1)
    layer_gradcheck(NET + "[convolutional]\nfilters=2\nsize=1\nactivation=linear\n[history]\nhistory_size=5\n", 1)


def test_a_few_iterations_lower_the_loss():
    text = ("[net]\nbatch=4\ntime_steps=2\nwidth=2\nheight=2\nchannels=1\nlearning_rate=0.5\nmomentum=0.5\n"
            "decay=0\n[history]\nhistory_size=2\n[convolutional]\nfilters=2\nsize=1\nactivation=linear\n"
            "[avgpool]\n[softmax]\n")
    net = network_from_text(text, seed=0)
    rng = np.random.default_rng(3)
    x = rng.normal(size=net.input.shape).astype(np.float32)
    # the label of step 1 depends on step 0's input: only the history can tell
    truth = np.zeros((8, 2), np.float32)          # 4 sequences x 2 steps, time-major rows
    truth[:4, 0] = 1
    truth[4:, :] = np.eye(2, dtype=np.float32)[(x[:4].mean(axis=(1, 2, 3)) > 0).astype(int)]
    losses = []
    for _ in range(30):
        net.forward(x, truth, train=True)
        losses.append(net.cost)
        net.backward()
        net.update()
    assert np.mean(losses[-3:]) < 0.5 * losses[0], losses
