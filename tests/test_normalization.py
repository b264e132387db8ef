"""[l2norm] and [lrn]/[normalization]: Darknet goldens (incl. Darknet's LRN window), slow numpy
references, float64 gradient checks of the exact backward passes."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy import CfgError
from darkpy.network import network_from_text
from helpers import assert_close, layer_gradcheck
from layer_checks import check_outputs, run_golden, run_standalone


def ref_lrn(x, size, alpha, beta, kappa):
    """x (c, h, w) -> Darknet's LRN in float64, from the closed form of its window (spec §2.13):
    S_k = sum of x_j² over j in [k - (size-1)/2, k + size/2] (clipped), minus x²_{size/2}."""
    c = x.shape[0]
    sq = x.astype(np.float64) ** 2
    out = np.empty_like(sq)
    for k in range(c):
        s = sq[max(0, k - (size - 1) // 2):min(c - 1, k + size // 2) + 1].sum(axis=0)
        if size // 2 < c:
            s = s - sq[size // 2]
        out[k] = x[k] * (kappa + alpha * s) ** -beta
    return out


def image_net(section, c=7, h=4, w=5, batch=2, dtype=np.float64):
    return network_from_text(f"[net]\nbatch={batch}\nwidth={w}\nheight={h}\nchannels={c}\n\n[activation]\n\n"
                             f"{section}\n", dtype=dtype)


# -- goldens ----------------------------------------------------------------------------------------
def test_lrn_golden_whole_network():
    net, d = run_golden("lrn")
    check_outputs(net, d)


@pytest.mark.parametrize("index,source", [(0, None), (1, 0)])
def test_lrn_golden_alone(index, source):
    run_standalone("lrn", index, source)


def test_l2norm_golden_whole_network():
    net, d = run_golden("l2norm")
    check_outputs(net, d)


@pytest.mark.parametrize("index,source", [(1, 0), (3, 2)])
def test_l2norm_golden_alone(index, source):
    run_standalone("l2norm", index, source)


# -- lrn --------------------------------------------------------------------------------------------
LRN_CASES = [(5, 0.1, 0.75, 2.0, 7), (3, 0.05, 0.5, 1.0, 7), (4, 0.2, 0.6, 3.0, 9), (5, 0.1, 0.75, 2.0, 2),
             (1, 0.1, 0.75, 2.0, 4), (6, 0.3, 1.0, 4.0, 11)]


@pytest.mark.parametrize("size,alpha,beta,kappa,c", LRN_CASES)
def test_lrn_forward_matches_darknet_window(size, alpha, beta, kappa, c):
    net = image_net(f"[lrn]\nsize={size}\nalpha={alpha}\nbeta={beta}\nkappa={kappa}", c=c)
    x = np.random.default_rng(c).uniform(-1, 1, net.input.shape)
    out = net.forward(x)
    for b in range(2):
        assert_close(out[b], ref_lrn(x[b], size, alpha, beta, kappa), 1e-12, 1e-14)


@pytest.mark.parametrize("size,alpha,beta,kappa,c", LRN_CASES)
def test_lrn_gradcheck(size, alpha, beta, kappa, c):
    layer_gradcheck(f"[net]\nbatch=2\nwidth=3\nheight=2\nchannels={c}\n\n[activation]\n\n"
                    f"[normalization]\nsize={size}\nalpha={alpha}\nbeta={beta}\nkappa={kappa}\n", 1, atol=1e-7)


def test_lrn_defaults():
    layer = image_net("[lrn]").layers[1]
    assert (layer.size, layer.alpha, layer.beta, layer.kappa) == (5, 1e-4, 0.75, 1.0)


def test_lrn_needs_an_image():
    with pytest.raises(CfgError, match="image"):
        network_from_text("[net]\ninputs=10\n\n[lrn]\n")


# -- l2norm -----------------------------------------------------------------------------------------
def test_l2norm_forward_divides_by_the_channel_norm():
    net = image_net("[l2norm]", c=4)
    x = np.random.default_rng(0).uniform(-1, 1, net.input.shape)
    out = net.forward(x)
    assert_close(out, x / np.sqrt((x ** 2).sum(axis=1, keepdims=True)), 1e-12, 1e-15)


@pytest.mark.parametrize("shape", ["width=3\nheight=2\nchannels=4", "inputs=6"])
def test_l2norm_gradcheck(shape):
    layer_gradcheck(f"[net]\nbatch=2\n{shape}\n\n[activation]\n\n[l2norm]\n", 1)


def test_l2norm_of_a_zero_vector_is_zero_not_nan():
    net = network_from_text("[net]\nbatch=1\ninputs=3\n\n[activation]\n\n[l2norm]\n")
    net.forward(np.zeros((1, 3), np.float32), np.zeros((1, 3), np.float32), train=True)
    assert net.layers[1].output.tolist() == [[0.0, 0.0, 0.0]]
