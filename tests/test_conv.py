"""[convolutional]: Darknet goldens, a slow numpy reference, float64 gradient checks, cfg handling.

Batch norm epsilon: pjreddie's CPU forward (which made the goldens) divides by sqrt(var) + 1e-6,
darkpy by sqrt(var + 1e-5) (GPU/cuDNN semantics). The goldens are therefore checked three ways:
darkpy's default against a tolerance computed from that epsilon difference; darkpy with
`darknet_cpu_bn = True` exactly (1e-5); and a numpy reference with Darknet's epsilon exactly, whose
darkpy-epsilon variant in turn matches darkpy's default exactly.
"""
from __future__ import annotations

import numpy as np
import pytest

from darkpy import CfgError, load_network
from darkpy.layers import REGISTRY, conv_gemm
from darkpy.layers.base import State
from darkpy.network import network_from_text
from helpers import assert_close, golden_dir, layer_gradcheck, read_f32

# -- slow numpy reference ---------------------------------------------------------------------------

ACT = {
    "linear": lambda x: x,
    "leaky": lambda x: np.where(x > 0, x, 0.1 * x),
    "relu": lambda x: np.maximum(x, 0),
    "logistic": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh,
    "elu": lambda x: np.where(x >= 0, x, np.expm1(np.minimum(x, 0))),
    "ramp": lambda x: np.maximum(x, 0) + 0.1 * x,
    "selu": lambda x: np.where(x >= 0, 1.0507 * x, 1.0507 * 1.6732 * np.expm1(np.minimum(x, 0))),
}
#: Largest |f'| of each activation, to bound how an input error grows through it.
LIPSCHITZ = {"linear": 1, "leaky": 1, "relu": 1, "logistic": 0.25, "tanh": 1, "elu": 1, "ramp": 1.1,
             "selu": 1.0507 * 1.6732}


def ref_conv_raw(x, w, stride_y, stride_x, padding, dilation, groups):
    """x (c, h, w), w (n, c/g, k, k) -> the raw convolution (n, oh, ow), float64, by shifted slices."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n, cg, k, _ = w.shape
    p = padding * dilation
    xp = np.pad(x, ((0, 0), (p, p), (p, p)))
    span = dilation * (k - 1) + 1
    oh = (x.shape[1] + 2 * p - span) // stride_y + 1
    ow = (x.shape[2] + 2 * p - span) // stride_x + 1
    out = np.zeros((n, oh, ow))
    ng = n // groups
    for g in range(groups):
        for ky in range(k):
            for kx in range(k):
                y0, x0 = ky * dilation, kx * dilation
                patch = xp[g * cg:(g + 1) * cg, y0:y0 + stride_y * (oh - 1) + 1:stride_y,
                           x0:x0 + stride_x * (ow - 1) + 1:stride_x]
                out[g * ng:(g + 1) * ng] += np.einsum("fc,cyx->fyx", w[g * ng:(g + 1) * ng, :, ky, kx], patch)
    return out


def bn_denominator(var, darknet_cpu):
    var = np.asarray(var, np.float64)
    return np.sqrt(var) + 1e-6 if darknet_cpu else np.sqrt(var + 1e-5)


def ref_conv_layer(layer, x, darknet_cpu):
    """Inference output of a darkpy conv layer, recomputed in numpy from its parameters."""
    raw = ref_conv_raw(x, layer.weights.value, layer.stride_y, layer.stride_x, layer.padding,
                       layer.dilation, layer.groups)
    b = layer.biases.value.astype(np.float64)[:, None, None]
    if layer.bn is not None:
        bn = layer.bn
        mean = bn.rolling_mean.astype(np.float64)[:, None, None]
        den = bn_denominator(bn.rolling_variance, darknet_cpu)[:, None, None]
        raw = bn.scales.value.astype(np.float64)[:, None, None] * (raw - mean) / den
    return ACT[layer.activation](raw + b)


def eps_tolerance(layer, x):
    """Per-element bound on |darkpy − Darknet CPU| for one BN conv layer on input x, from the two
    epsilon conventions: |γ·(x − μ)|·|1/sqrt(v + 1e-5) − 1/(sqrt(v) + 1e-6)| times the activation's
    Lipschitz constant."""
    raw = ref_conv_raw(x, layer.weights.value, layer.stride_y, layer.stride_x, layer.padding,
                       layer.dilation, layer.groups)
    bn = layer.bn
    v = bn.rolling_variance
    gap = np.abs(1 / bn_denominator(v, False) - 1 / bn_denominator(v, True))[:, None, None]
    dev = np.abs(bn.scales.value[:, None, None] * (raw - bn.rolling_mean[:, None, None]))
    return LIPSCHITZ[layer.activation] * dev * gap


# -- goldens ------------------------------------------------------------------------------------------

GOLDENS = ["conv_basic", "conv_stride2", "conv_bn", "conv_groups"]


def load_golden(name):
    d = golden_dir("forward", name)
    if not d.is_dir():
        pytest.skip(f"golden {d} missing")
    if name == "conv_stride2" and "route" not in REGISTRY:
        pytest.skip("[route] layer not available yet")
    net = load_network(d / "net.cfg", d / "net.weights")
    x = read_f32(d / "input.f32").reshape(net.input.shape)
    outs = [read_f32(d / f"layer_{i:03d}.f32") for i in range(len(net.layers))]
    return net, x, outs


def set_darknet_cpu_bn(net, on):
    for layer in net.layers:
        if hasattr(layer, "darknet_cpu_bn"):
            layer.darknet_cpu_bn = on


def has_bn(net):
    return any(getattr(l, "bn", None) is not None for l in net.layers)


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_forward_darknet_cpu_bn_exact(name):
    """Whole-network forward, every layer's output against Darknet's, with Darknet's BN epsilon."""
    net, x, outs = load_golden(name)
    set_darknet_cpu_bn(net, True)
    net.forward(x)
    for i, layer in enumerate(net.layers):
        assert_close(layer.output.reshape(-1), outs[i], 1e-5, 1e-5, f"{name} layer {i}")


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_forward_default_eps(name):
    """darkpy's own BN epsilon. Without BN this is exact; with BN each layer is run on Darknet's
    input for it and allowed the computed epsilon gap on top of 1e-5."""
    net, x, outs = load_golden(name)
    net.forward(x)
    if not has_bn(net):
        for i, layer in enumerate(net.layers):
            assert_close(layer.output.reshape(-1), outs[i], 1e-5, 1e-5, f"{name} layer {i}")
        return
    for i, layer in enumerate(net.layers):
        if layer.kind != "convolutional":
            continue
        xin = x[0] if i == 0 else outs[i - 1].reshape(net.layers[i - 1].out_shape)
        layer.forward(State(input=xin[None].astype(np.float32), delta=None, truth=None, train=False,
                            layers=net.layers))
        got = layer.output.reshape(-1)
        tol = 1e-5 + 1e-5 * np.abs(outs[i])
        if layer.bn is not None:
            tol = tol + eps_tolerance(layer, xin).reshape(-1)
            # the epsilon difference is real: the strict 1e-5 test alone would not always hold
            assert np.abs(got - outs[i]).max() > 0
        err = np.abs(got - outs[i])
        assert (err <= tol).all(), f"{name} layer {i}: worst excess {(err - tol).max():.3g}"


@pytest.mark.parametrize("name", GOLDENS)
def test_golden_numpy_reference(name):
    """The slow numpy reference, with Darknet's epsilon, reproduces every conv layer of the golden;
    with darkpy's epsilon it reproduces darkpy's default output."""
    net, x, outs = load_golden(name)
    for i, layer in enumerate(net.layers):
        if layer.kind != "convolutional":
            continue
        xin = x[0] if i == 0 else outs[i - 1].reshape(net.layers[i - 1].out_shape)
        ref = ref_conv_layer(layer, xin, darknet_cpu=True)
        assert_close(ref.reshape(-1), outs[i], 1e-5, 1e-5, f"{name} layer {i} (reference vs golden)")
        layer.forward(State(input=xin[None].astype(np.float32), delta=None, truth=None, train=False,
                            layers=net.layers))
        ref = ref_conv_layer(layer, xin, darknet_cpu=False)
        assert_close(layer.output.reshape(-1), ref.reshape(-1), 1e-5, 1e-5, f"{name} layer {i} (darkpy)")


# -- forward against the reference on configurations the goldens lack ------------------------------

@pytest.mark.parametrize("conv", [
    "size=3\ndilation=2\npad=1", "size=3\ndilation=2\npadding=0", "size=3\nstride_x=2\nstride_y=1\npad=1",
    "size=1\nstride=2", "size=1\npadding=1", "size=4\nstride=3\npadding=1\ngroups=2",
    "size=3\npad=1\ngroups=4\nfilters=8",
])
def test_forward_matches_reference(conv):
    text = "[net]\nbatch=2\nwidth=9\nheight=7\nchannels=4\n[convolutional]\n"
    text += conv + ("\nfilters=4" if "filters" not in conv else "") + "\nactivation=leaky\n"
    net = network_from_text(text, dtype=np.float64)
    rng = np.random.default_rng(3)
    net.layers[0].biases.value[...] = rng.uniform(-1, 1, net.layers[0].biases.value.shape)
    x = rng.uniform(-1, 1, net.input.shape)
    out = net.forward(x)
    layer = net.layers[0]
    for b in range(2):
        assert_close(out[b], ref_conv_layer(layer, x[b], False), 1e-10, 1e-12, f"{conv} item {b}")


def test_resize_reallocates_and_matches_reference():
    net = network_from_text("[net]\nbatch=1\nwidth=8\nheight=6\nchannels=2\n[convolutional]\nfilters=3\n"
                            "size=3\nstride=2\npad=1\nactivation=linear\n", dtype=np.float64)
    net.resize(11, 9)
    layer = net.layers[0]
    assert layer.out_shape == (3, 5, 6) and layer.output.shape == (1, 3, 5, 6)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 2, 9, 11))
    assert_close(net.forward(x)[0], ref_conv_layer(layer, x[0], False), 1e-10, 1e-12, "resized")


# -- gradient checks (float64, central differences) --------------------------------------------------

HOLDER = "[net]\nbatch=2\nwidth=5\nheight=4\nchannels=4\n[activation]\nactivation=linear\n"
GRAD_CASES = [
    "size=1\nactivation=linear",
    "size=1\nstride=2\nactivation=leaky",
    "size=1\npadding=1\nactivation=linear",
    "size=3\npad=1\nactivation=leaky",
    "size=3\npad=0\nactivation=logistic",
    "size=5\npad=1\nactivation=tanh",
    "size=3\nstride=2\npad=1\nactivation=elu",
    "size=2\nstride=2\nactivation=linear",
    "size=4\nstride=3\npadding=2\nactivation=selu",
    "size=3\nstride_x=2\nstride_y=1\npad=1\nactivation=linear",
    "size=3\npad=1\ngroups=2\nactivation=leaky",
    "size=1\ngroups=2\nactivation=linear",
    "size=3\npad=1\ngroups=4\nactivation=linear",          # depthwise
    "size=3\npad=1\ndilation=2\nactivation=linear",
    "size=3\npad=1\nactivation=mish",
    "size=3\npad=1\nactivation=swish",
    "size=3\npad=1\nactivation=gelu",
    "size=3\npad=1\nbatch_normalize=1\nactivation=leaky",
    "size=3\npad=1\nbatch_normalize=1\nactivation=mish",
    "size=3\nstride=2\npad=1\nbatch_normalize=1\nactivation=swish",
    "size=3\npad=1\ngroups=2\nbatch_normalize=1\nactivation=logistic",
    "size=1\nbatch_normalize=1\nactivation=linear",
]


@pytest.mark.parametrize("conv", GRAD_CASES, ids=[c.replace("\n", ",") for c in GRAD_CASES])
def test_gradcheck(conv):
    layer_gradcheck(HOLDER + f"[convolutional]\nfilters=4\n{conv}\n", 1, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("bn", [0, 1])
def test_1x1_layer_on_a_1x1_map_is_one_gemm_of_the_batch(bn, transposed, monkeypatch):
    """A classifier's last 1x1 layer on a 1x1 map runs as one GEMM of the batch's rows (its forward
    as W @ xᵀ, then transposed, or as x @ Wᵀ): the reference forward, and gradients by central
    differences (input delta added, not assigned)."""
    monkeypatch.setattr(conv_gemm, "ROWS_TRANSPOSED_MIN_WEIGHTS", 0 if transposed else 1 << 62)
    cfg = ("[net]\nbatch=3\nwidth=1\nheight=1\nchannels=8\n[activation]\nactivation=linear\n"
           f"[convolutional]\nfilters=5\nsize=1\nbatch_normalize={bn}\nactivation=leaky\n")
    net = layer_gradcheck(cfg, 1, rtol=1e-5, atol=1e-7)
    layer = net.layers[1]
    assert layer.rows_gemm and layer.rows_transposed == transposed and not layer.direct
    x = np.random.default_rng(6).uniform(-1, 1, net.input.shape)
    out = net.forward(x)
    for b in range(3):
        assert_close(out[b], ref_conv_layer(layer, x[b], False), 1e-10, 1e-12, f"item {b}")


def test_rows_transposed_takes_large_weights_in_small_batches():
    """The transposed forward of `rows_gemm` only where it measured faster: a classifier's 1024 ->
    1000 up to batch 64, not past it, nor for a few filters (512 -> 10)."""
    assert conv_gemm.rows_transposed(64, 1000, 1024) and conv_gemm.rows_transposed(2, 1000, 1024)
    assert not conv_gemm.rows_transposed(65, 1000, 1024)
    assert not conv_gemm.rows_transposed(16, 10, 512)


@pytest.mark.parametrize("batch", [16, 12])
def test_transposed_rows_run_on_the_own_gemm_where_it_fits(batch, monkeypatch):
    """In float32 the transposed forward takes darkpy's own GEMM (kernels/gemm.py) where the batch
    is a multiple of 16, else OpenBLAS: the reference forward either way."""
    from darkpy.kernels import gemm
    calls, orig = [], gemm.product
    monkeypatch.setattr(gemm, "product", lambda *a, **k: (calls.append(1), orig(*a, **k))[1])
    net = network_from_text(f"[net]\nbatch={batch}\nwidth=1\nheight=1\nchannels=512\n"
                            "[convolutional]\nfilters=512\nsize=1\nactivation=leaky\n")
    layer = net.layers[0]
    assert layer.rows_gemm and layer.rows_transposed
    rng = np.random.default_rng(3)
    layer.biases.value[:] = rng.uniform(-1, 1, layer.biases.value.shape)
    x = rng.uniform(-1, 1, net.input.shape).astype(np.float32)
    out = net.forward(x)
    assert len(calls) == (1 if batch % 16 == 0 else 0)
    for b in range(batch):
        assert_close(out[b], ref_conv_layer(layer, x[b], False), 1e-4, 1e-5, f"item {b}")


def test_gradcheck_darknet_cpu_bn_is_darknets_formula():
    """With darknet_cpu_bn the BN backward is Darknet's: the exact gradient except that the variance
    term divides by N instead of N−1. Check that relation in float64."""
    text = HOLDER + "[convolutional]\nfilters=3\nsize=3\npad=1\nbatch_normalize=1\nactivation=linear\n"
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (2, 4, 4, 5))
    r = rng.standard_normal((2, 3, 4, 5))
    grads = {}
    for mode in (False, True):
        net = network_from_text(text, dtype=np.float64)
        layer = net.layers[1]
        layer.darknet_cpu_bn = mode
        net.forward(x, train=True)
        layer.delta[...] = r
        layer.backward(State(net.layers[0].output, net.layers[0].delta, None, True, net.layers))
        grads[mode] = layer.delta.copy()
        if not mode:
            xn = layer.xnorm.copy()
            gamma, var = layer.bn.scales.value, layer.bn.variance
    n = 2 * 4 * 5
    # the two differ only in the variance term: r·Σ(γδ·r)/σ³ with r = x − μ, ÷(N−1) versus ÷N,
    # and in the forward's denominator used to recover x − μ from x̂
    sd_x = (gamma[None, :, None, None] * r * xn).sum(axis=(0, 2, 3))
    sig = np.sqrt(var + 1e-5)
    fwd_cpu = np.sqrt(var) + 1e-6
    exact_term = xn * (sd_x * sig * sig / (sig ** 3 * (n - 1)))[None, :, None, None]
    xn_cpu = xn * sig[None, :, None, None] / fwd_cpu[None, :, None, None]
    cpu_term = xn_cpu * (sd_x * sig / fwd_cpu * fwd_cpu * fwd_cpu / (sig ** 3 * n))[None, :, None, None]
    assert_close(grads[True] - grads[False], exact_term - cpu_term, 1e-6, 1e-9, "N vs N-1 term")


def test_backward_adds_into_previous_delta_1x1():
    """# darknet: pjreddie's CPU 1x1 conv overwrites the previous delta; darkpy adds."""
    net = network_from_text(HOLDER + "[convolutional]\nfilters=3\nsize=1\nactivation=linear\n",
                            dtype=np.float64)
    rng = np.random.default_rng(2)
    net.forward(rng.uniform(-1, 1, net.input.shape), train=True)
    conv, prev = net.layers[1], net.layers[0]
    d = rng.standard_normal(conv.delta.shape)
    conv.delta[...] = d
    prev.delta[...] = 5.0
    conv.backward(State(prev.output, prev.delta, None, True, net.layers))
    w = conv.weights.value.reshape(3, 4)
    expect = 5.0 + np.einsum("fc,bfyx->bcyx", w, d)
    assert_close(prev.delta, expect, 1e-12, 1e-12, "1x1 conv delta")


def test_backward_leaves_preactivation_delta():
    """After backward, `delta` holds the gradient w.r.t. the pre-activation (Darknet's delta_out)."""
    net = network_from_text(HOLDER + "[convolutional]\nfilters=3\nsize=3\npad=1\nactivation=logistic\n",
                            dtype=np.float64)
    rng = np.random.default_rng(4)
    net.forward(rng.uniform(-1, 1, net.input.shape), train=True)
    conv = net.layers[1]
    d = rng.standard_normal(conv.delta.shape)
    conv.delta[...] = d
    conv.backward(State(net.layers[0].output, net.layers[0].delta, None, True, net.layers))
    y = conv.output
    assert_close(conv.delta, d * y * (1 - y), 1e-12, 1e-14, "pre-activation delta")
    assert_close(conv.biases.grad, (d * y * (1 - y)).sum(axis=(0, 2, 3)), 1e-12, 1e-12, "bias grad")


# -- construction, init, summary ----------------------------------------------------------------------

def build(conv, width=8, height=8, channels=4):
    return network_from_text(f"[net]\nbatch=1\nwidth={width}\nheight={height}\nchannels={channels}\n"
                             f"[convolutional]\n{conv}\n")


@pytest.mark.parametrize("conv,key", [
    ("filters=4\nbin_output=1", "bin_output"),     # (xnor / binary: tests/test_xnor.py)
    ("filters=4\nantialiasing=1", "antialiasing"),
])
def test_unsupported_keys_are_errors(conv, key):
    with pytest.raises(CfgError, match="not supported") as e:
        build(conv)
    assert e.value.key == key


@pytest.mark.parametrize("conv,key,msg", [
    ("filters=5\ngroups=2", "groups", "divide"),
    ("filters=0", "filters", ">= 1"),
    ("filters=4\nsize=11", "size", "does not fit"),
    ("filters=4\nactivation=leakyy", "activation", "did you mean 'leaky'"),
])
def test_bad_values_are_errors(conv, key, msg):
    with pytest.raises(CfgError, match=msg) as e:
        build(conv)
    assert e.value.key == key


def test_defaults_and_padding_rule():
    layer = build("filters=2\nsize=5\npad=1\npadding=7").layers[0]
    assert layer.padding == 2 and layer.out_shape == (2, 8, 8)          # pad=1 overrides padding
    layer = build("filters=2\nsize=3\npadding=2").layers[0]
    assert layer.padding == 2 and layer.out_shape == (2, 10, 10)
    layer = build("filters=2").layers[0]
    assert (layer.size, layer.stride_x, layer.activation) == (1, 1, "logistic")


def test_init_weights_like_darknet():
    layer = build("filters=64\nsize=3\ngroups=2\nbatch_normalize=1", width=4, height=4, channels=32).layers[0]
    w = layer.weights.value
    assert w.shape == (64, 16, 3, 3)
    assert abs(w.std() / np.sqrt(2 / (9 * 16)) - 1) < 0.05 and abs(w.mean()) < 0.01
    assert (layer.biases.value == 0).all() and (layer.bn.scales.value == 1).all()
    assert (layer.bn.rolling_mean == 0).all() and (layer.bn.rolling_variance == 0).all()
    names = [(p.name, p.decay) for p in layer.params]
    assert names == [("biases", False), ("scales", False), ("weights", True)]
    arrays = layer.weight_arrays()
    assert [a.shape for a in arrays] == [(64,)] * 4 + [(64, 16, 3, 3)]
    assert arrays[1] is layer.bn.scales.value and arrays[3] is layer.bn.rolling_variance


def test_summary_line_and_flops():
    net = build("filters=16\nsize=3\nstride=1\npad=1\nactivation=leaky", 416, 416, 3)
    line = net.summary().splitlines()[1]
    assert line == "    0 conv     16  3 x 3 / 1   416 x 416 x   3   ->   416 x 416 x  16  0.150 BFLOPs"
    assert net.layers[0].flops() == 2 * 16 * 9 * 3 * 416 * 416
    g = build("filters=8\nsize=3\npad=1\ngroups=4", 4, 4, 8).layers[0]
    assert g.flops() == 2 * 8 * 9 * 2 * 16


def test_flipped_transposes_after_load(tmp_path):
    net = network_from_text("[net]\nwidth=3\nheight=3\nchannels=2\n[convolutional]\nfilters=3\nsize=1\n"
                            "flipped=1\nactivation=linear\n")
    layer = net.layers[0]
    stored = np.arange(6, dtype=np.float32).reshape(2, 3)        # [c·k·k][n] as the file holds it
    body = np.concatenate([np.zeros(3, np.float32), stored.ravel()])
    path = tmp_path / "f.weights"
    path.write_bytes(np.array([0, 2, 0], "<i4").tobytes() + np.zeros(1, "<u8").tobytes() + body.tobytes())
    net.load_weights(path)
    assert_close(layer.weights.value.reshape(3, 2), stored.T, 0, 0, "flipped")


@pytest.mark.parametrize("size,stride,pad,groups,batch", [(3, 2, 1, 2, 3), (1, 1, 0, 1, 4), (3, 1, 1, 1, 1)])
def test_wide_gemm_path_matches_stacked(monkeypatch, size, stride, pad, groups, batch):
    """Items side by side in one GEMM (big layers) give the stacked per-item GEMM's forward,
    parameter gradients and input delta."""
    from darkpy.layers import convolutional as convmod

    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (batch, 4, 7, 6))
    dy = None
    results = []
    for threshold in (1 << 62, 0):
        monkeypatch.setattr(convmod, "WIDE_MIN_MACS", threshold)
        layer = convmod.ConvolutionalLayer(0, (4, 7, 6), 6, size, stride, stride, pad, groups,
                                           batch_normalize=True, activation="swish", dtype=np.float64)
        layer.init_weights(np.random.default_rng(1))
        layer.allocate(batch)
        layer.allocate_training()           # delta: this test drives backward without a network
        assert layer.wide == (threshold == 0 and batch > 1)
        prev = np.zeros_like(x)
        s = State(input=x, delta=prev, truth=None, train=True, layers=[])
        layer.forward(s)
        if dy is None:
            dy = rng.uniform(-1, 1, layer.output.shape)
        layer.delta[...] = dy
        layer.backward(s)
        results.append([layer.output.copy(), layer.weights.grad.copy(), layer.biases.grad.copy(),
                        layer.bn.scales.grad.copy(), prev])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("size,stride,pad,batch", [(3, 2, 1, 3), (1, 1, 0, 4), (3, 1, 1, 2)])
def test_one_gemm_forward_equals_chunked(monkeypatch, size, stride, pad, batch):
    """The forward's single stacked GEMM over the whole batch (`one_gemm`) gives the bits of the
    chunk-by-chunk loop it replaces (workspace cut to one item per chunk), float32."""
    from darkpy.kernels import im2col as ic
    from darkpy.layers import convolutional as convmod

    x = np.random.default_rng(4).uniform(-1, 1, (batch, 5, 9, 8)).astype(np.float32)
    outs = []
    for one_item_chunks in (False, True):
        if one_item_chunks:
            monkeypatch.setattr(ic, "CHUNK_VALUES", 1)
        layer = convmod.ConvolutionalLayer(0, (5, 9, 8), 6, size, stride, stride, pad, 1,
                                           batch_normalize=False, activation="leaky", dtype=np.float32)
        layer.init_weights(np.random.default_rng(2))
        layer.biases.value[:] = np.linspace(-0.5, 0.5, 6)
        layer.allocate(batch)
        assert not (layer.winograd or layer.direct or layer.wide)
        assert layer.one_gemm is not one_item_chunks
        layer.forward(State(input=x, delta=None, truth=None, train=False, layers=[]))
        outs.append(layer.output.copy())
    assert np.array_equal(outs[0], outs[1])
