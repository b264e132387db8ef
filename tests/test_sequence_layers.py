"""[embedding], [layernorm], [attention], [crossentropy], gelu/gelu_tanh: forward against float64
numpy references, backward against float64 central differences (tests/layer_checks.py style)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from darkpy.errors import CfgError, StateError
from darkpy.kernels import activations as act
from darkpy.layers.base import State
from darkpy.layers import mha
from darkpy.layers.embedding import sinusoidal_table
from darkpy.network import network_from_text
from helpers import assert_close, numerical_grad
from layer_checks import loss_gradcheck

T, S = 5, 3            # time steps, sequences per pass (rows = T·S, time-major)


def _state(net, layer, x, seed=0, train=True):
    return State(input=x, delta=None, truth=None, train=train, layers=net.layers,
                 rng=np.random.default_rng(seed), net=net)


def layer_gradcheck(net, index: int, x: np.ndarray, seed: int = 0, check_input: bool = True,
                    rtol=1e-6, atol=1e-8):
    """Backward of layer `index` on input x (float64) against central differences of Σ R·output,
    for every parameter and (with check_input) the input. The rng is re-seeded for every forward,
    so dropout draws the same mask each time."""
    layer = net.layers[index]
    R = np.random.default_rng(99).normal(size=layer.output.shape)

    def f() -> float:
        layer.forward(_state(net, layer, x, seed))
        return float((R * layer.output).sum())

    f()
    for p in layer.params:
        p.grad.fill(0)
    layer.delta[...] = R
    dx = np.zeros_like(x)
    s = _state(net, layer, x, seed)
    s.delta = dx if check_input else None
    layer.backward(s)
    for p in layer.params:
        assert_close(p.grad, numerical_grad(f, p.value), rtol, atol, f"[{layer.kind}] d/d {p.name}")
    if check_input:
        assert_close(dx, numerical_grad(f, x), rtol, atol, f"[{layer.kind}] d/d input")
    return layer


def seq_net(body: str, inputs: int = 8, extra_net: str = ""):
    net = network_from_text(f"[net]\nbatch={S}\ntime_steps={T}\ninputs={inputs}\n{extra_net}\n{body}",
                            dtype=np.float64, seed=3)
    net.allocate_training()
    return net


def to_seq(rows: np.ndarray) -> np.ndarray:
    """(T·S, n) time-major → (S, T, n)."""
    return rows.reshape(T, S, -1).transpose(1, 0, 2)


# -- [embedding] --------------------------------------------------------------------------------------

@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "none"])
def test_embedding_forward_matches_reference(positions):
    net = seq_net(f"[embedding]\nvocab=7\nsize=4\npositions={positions}\n", inputs=1)
    ids = np.random.default_rng(0).integers(0, 7, (T * S, 1)).astype(np.float64)
    out = net.forward(ids)
    layer = net.layers[0]
    pos = {"learned": layer.pos.value if layer.pos else None, "sinusoidal": sinusoidal_table(T, 4),
           "none": np.zeros((T, 4))}[positions]
    t = np.repeat(np.arange(T), S)
    ref = layer.table.value[ids[:, 0].astype(int)] + pos[t]
    assert_close(out, ref, 1e-12, 1e-12, "embedding forward")


def test_sinusoidal_table_values():
    pe = sinusoidal_table(4, 6)
    assert pe[0].tolist() == [0, 1, 0, 1, 0, 1]
    assert pe[3, 2] == pytest.approx(math.sin(3 / 10000 ** (2 / 6)))
    assert pe[3, 5] == pytest.approx(math.cos(3 / 10000 ** (4 / 6)))


def test_embedding_scatter_add_sums_repeated_tokens():
    net = seq_net("[embedding]\nvocab=5\nsize=3\n", inputs=1)
    ids = np.full((T * S, 1), 2.0)
    ids[:4] = 4.0                                    # token 2 used T·S−4 times, token 4 four times
    net.forward(ids, train=True)
    layer = net.layers[0]
    layer_gradcheck(net, 0, ids, check_input=False)
    R = layer.delta
    assert_close(layer.table.grad[2], R[4:].sum(axis=0), 1e-12, 1e-12, "token 2: sum of its rows")
    assert_close(layer.table.grad[4], R[:4].sum(axis=0), 1e-12, 1e-12, "token 4: sum of its rows")
    assert not layer.table.grad[[0, 1, 3]].any()


def test_embedding_rejects_bad_ids():
    net = seq_net("[embedding]\nvocab=5\nsize=3\n", inputs=1)
    ids = np.zeros((T * S, 1))
    ids[3] = 5
    with pytest.raises(StateError, match="token id 5; ids must be integers in 0..4"):
        net.forward(ids)
    with pytest.raises(CfgError, match="inputs=1"):
        seq_net("[embedding]\nvocab=5\nsize=3\n", inputs=4)


def test_embedding_std_sets_the_initialisation_of_both_tables():
    default = seq_net("[embedding]\nvocab=200\nsize=50\n", inputs=1).layers[0]
    wide = seq_net("[embedding]\nvocab=200\nsize=50\nstd=1\n", inputs=1).layers[0]
    assert default.table.value.std() == pytest.approx(0.02, rel=0.05)
    assert wide.table.value.std() == pytest.approx(1.0, rel=0.05)
    assert wide.pos.value.std() == pytest.approx(1.0, rel=0.2)
    assert_close(wide.table.value, default.table.value * 50, 1e-5, 1e-6, "same draws, scaled")
    with pytest.raises(CfgError, match="std"):
        seq_net("[embedding]\nsize=3\nstd=0\n", inputs=1)


# -- [layernorm] --------------------------------------------------------------------------------------

def test_layernorm_forward_and_gradients():
    net = seq_net("[layernorm]\neps=1e-5\n")
    layer = net.layers[0]
    rng = np.random.default_rng(1)
    layer.scales.value[...] = rng.normal(size=8)
    layer.biases.value[...] = rng.normal(size=8)
    x = rng.normal(size=(T * S, 8)) * 3 + 1
    out = net.forward(x)
    mu, var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    assert_close(out, (x - mu) / np.sqrt(var + 1e-5) * layer.scales.value + layer.biases.value, 1e-12, 1e-12,
                 "layernorm forward")
    layer_gradcheck(net, 0, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows,n", [(5, 37), (300, 128), (1030, 40)])
def test_layernorm_kernels_against_float64_at_any_thread_count(rows, n, dtype):
    """The vector row sums (whole vectors and a scalar tail), the row-chunked parameter gradients
    (a last partial chunk; above PARALLEL_MIN the chunks in parallel) against numpy in float64,
    and the same bits on one thread as on two."""
    import numba
    from darkpy.layers.layernorm import layernorm_backward, layernorm_forward
    rng = np.random.default_rng(rows)
    x = (rng.normal(size=(rows, n)) * 3 + 1).astype(dtype)
    gain, bias = rng.normal(size=n).astype(dtype), rng.normal(size=n).astype(dtype)
    d = rng.normal(size=(rows, n)).astype(dtype)
    runs = []
    saved = numba.get_num_threads()
    for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
        numba.set_num_threads(threads)
        try:
            out, xhat, inv = np.empty_like(x), np.empty_like(x), np.empty((rows, 1), dtype)
            layernorm_forward(out, xhat, inv, x, gain, bias, 1e-5)
            dx, bg, gg = np.ones_like(x), np.ones(n, dtype), np.ones(n, dtype)
            layernorm_backward(dx, bg, gg, d, xhat, inv, gain, True)
        finally:
            numba.set_num_threads(saved)
        runs.append((out, inv, dx, bg, gg))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    out, inv, dx, bg, gg = runs[0]
    x64, d64 = x.astype(np.float64), d.astype(np.float64)
    mu, var = x64.mean(1, keepdims=True), x64.var(1, keepdims=True)
    k = 1 / np.sqrt(var + 1e-5)
    xh = (x64 - mu) * k
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert_close(inv, k, tol, tol, "1/sqrt(var + eps)")
    assert_close(out, xh * gain + bias, tol, tol, "layernorm forward")
    dg = d64 * gain
    want_dx = 1 + k * (dg - dg.mean(1, keepdims=True) - xh * (dg * xh).mean(1, keepdims=True))
    assert_close(dx, want_dx, 20 * tol, 20 * tol, "input gradient")
    assert_close(bg, 1 + d64.sum(0), 20 * tol, 20 * tol, "bias gradient")
    assert_close(gg, 1 + (d64 * xh).sum(0), 20 * tol, 20 * tol, "gain gradient")


# -- [attention] --------------------------------------------------------------------------------------

def attention_reference(x, layer, ids=None):
    """Slow float64 attention, one sequence and one head at a time, on time-major rows x."""
    D, H = layer.dim, layer.heads
    dh = D // H
    W, b, Wo, bo = (p.value for p in layer.params)
    X = to_seq(x)
    out = np.zeros_like(X)
    weights = np.zeros((S, H, T, T))
    for s in range(S):
        qkv = X[s] @ W.T + b
        heads = []
        for h in range(H):
            q, k, v = (qkv[:, i * D + h * dh:i * D + (h + 1) * dh] for i in range(3))
            for i in range(T):
                allowed = [j for j in range(T) if (not layer.causal or j <= i)
                           and (ids is None or layer.pad < 0 or ids[s, j] != layer.pad)]
                sc = np.array([q[i] @ k[j] / math.sqrt(dh) for j in allowed])
                if allowed:
                    e = np.exp(sc - sc.max())
                    weights[s, h, i, allowed] = e / e.sum()
            heads.append(weights[s, h] @ v)
        out[s] = np.concatenate(heads, axis=1) @ Wo.T + bo
    return out.transpose(1, 0, 2).reshape(T * S, D), weights


def _attention_net(keys: str, inputs=8):
    body = f"[attention]\nheads=2\n{keys}\n"
    if inputs == 1:
        body = "[embedding]\nvocab=6\nsize=8\n\n" + body
    net = seq_net(body, inputs=inputs)
    rng = np.random.default_rng(5)
    for p in net.layers[-1].params:
        p.value[...] = rng.normal(size=p.value.shape) * 0.5
    return net


@pytest.mark.parametrize("keys", ["causal=0", "causal=1"])
def test_attention_forward_matches_reference(keys):
    net = _attention_net(keys)
    x = np.random.default_rng(2).normal(size=(T * S, 8))
    out = net.forward(x, train=True)
    ref, w = attention_reference(x, net.layers[0])
    assert_close(out, ref, 1e-10, 1e-12, "attention forward")
    assert_close(net.layers[0].attention_weights, w, 1e-10, 1e-12, "attention weights")


def test_attention_gradients_causal():
    net = _attention_net("causal=1")
    x = np.random.default_rng(3).normal(size=(T * S, 8))
    net.forward(x, train=True)
    layer_gradcheck(net, 0, x)


def test_attention_key_padding_mask_forward_backward():
    net = _attention_net("causal=1\npad=0", inputs=1)
    ids = np.random.default_rng(4).integers(1, 6, (T, S))
    ids[3:, 0] = 0                                   # sequence 0: positions 3, 4 are padding
    ids[1, 2] = 0                                    # sequence 2: a pad in the middle
    ids = ids.reshape(-1, 1).astype(np.float64)
    net.forward(ids, train=True)
    att = net.layers[1]
    x = net.layers[0].output.copy()
    out = att.output.copy()
    ref, w = attention_reference(x, att, ids.reshape(T, S).T)
    assert_close(out, ref, 1e-10, 1e-12, "masked attention forward")
    a = att.attention_weights
    assert (a[0, :, :, 3:] == 0).all() and (a[2, :, :, 1] == 0).all()        # exactly 0
    assert (np.triu(np.ones((T, T)), 1)[None, None] * a == 0).all()
    layer_gradcheck(net, 1, x)
    # a masked key receives no gradient through K or V: with only the outputs of other queries
    # weighted, the pad rows' input gradient comes from their own query alone
    net.forward(ids, train=True)
    att.delta[...] = 0
    att.delta.reshape(T, S, 8)[:3, 0] = 1.0          # the real queries of sequence 0
    for p in att.params:
        p.grad.fill(0)
    dx = np.zeros_like(x)
    s = _state(net, att, x)
    s.delta = dx
    att.backward(s)
    assert not dx.reshape(T, S, 8)[3:, 0].any()


def test_attention_causal_future_rows_do_not_affect_past():
    net = _attention_net("causal=1")
    x = np.random.default_rng(6).normal(size=(T * S, 8))
    before = net.forward(x).copy()
    x2 = x.copy()
    x2.reshape(T, S, 8)[4] += 10                     # change the last step of every sequence
    after = net.forward(x2)
    assert_close(after.reshape(T, S, 8)[:4], before.reshape(T, S, 8)[:4], 0, 0, "causal")
    assert not np.allclose(after.reshape(T, S, 8)[4], before.reshape(T, S, 8)[4])


def test_attention_dropout_gradients_and_scaling():
    net = _attention_net("causal=1\ndropout=0.3")
    x = np.random.default_rng(7).normal(size=(T * S, 8))
    net.forward(x, train=True)
    layer_gradcheck(net, 0, x, seed=11)
    att = net.layers[0]
    att.forward(_state(net, att, x, seed=11))
    kept = att.drop
    assert set(np.unique(kept)) <= {0.0, 1 / 0.7}
    inference = net.forward(x).copy()                # no dropout outside training
    ref, _ = attention_reference(x, att)
    assert_close(inference, ref, 1e-10, 1e-12, "inference ignores dropout")


def _wide_attention(keys: str, dtype=np.float64, dim=64, heads=2, steps=T, seqs=S):
    """An [attention] layer whose heads (32 values) the fused kernels take, on float rows or, with
    a pad mask, on an embedding of token ids."""
    pad = "pad=" in keys
    body = f"[attention]\nheads={heads}\n{keys}\n"
    if pad:
        body = f"[embedding]\nvocab=6\nsize={dim}\n\n" + body
    net = network_from_text(f"[net]\nbatch={seqs}\ntime_steps={steps}\ninputs={1 if pad else dim}\n\n"
                            f"{body}", dtype=dtype, seed=3)
    net.allocate_training()
    rng = np.random.default_rng(5)
    for p in net.layers[-1].params:
        p.value[...] = rng.normal(size=p.value.shape) * 0.3
    if pad:
        ids = np.random.default_rng(4).integers(0, 6, (steps * seqs, 1)).astype(dtype)
        ids[:3] = 0                                  # every sequence's first key is padding
        net.forward(ids, train=True)
        return net, net.layers[0].output.copy()
    return net, np.random.default_rng(2).normal(size=(steps * seqs, dim)).astype(dtype)


def _attention_pass(net, x, fused: bool, monkeypatch):
    """Forward and backward of the last layer on x with the fused kernels on or off: (output,
    weights, parameter gradients, input gradient, and whether the pass was fused)."""
    monkeypatch.setattr(mha, "FUSED", fused)
    att = net.layers[-1]
    for buf in (att.scores, att.dscores):          # what a pass leaves unwritten must not matter
        buf.fill(np.nan)
    st = _state(net, att, x)
    att.forward(st)
    taken = att.fused
    att.delta[...] = np.random.default_rng(9).normal(size=att.delta.shape)
    for p in att.params:
        p.grad.fill(0)
    st.delta = np.zeros_like(x)
    att.backward(st)
    return [att.output.copy(), att.attention_weights.copy(), *(p.grad.copy() for p in att.params),
            st.delta], taken


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("keys", ["causal=0", "causal=1", "causal=1\npad=0", "causal=0\npad=0"])
@pytest.mark.parametrize("steps, seqs", [(5, 3), (7, 1), (33, 2), (64, 1)])
def test_fused_attention_equals_the_gemm_path(keys, dtype, steps, seqs, monkeypatch):
    """The fused kernels (kernels/attention.py) and the GEMM stacks give the same forward, weights
    and gradients, to rounding, with row blocks cut at the last step (5, 7, 33 steps) and with
    rows of whole column pairs written in place (64), over buffers left full of NaN."""
    net, x = _wide_attention(keys, dtype, steps=steps, seqs=seqs)
    fused, taken = _attention_pass(net, x, True, monkeypatch)
    gemm, not_taken = _attention_pass(net, x, False, monkeypatch)
    assert taken and not not_taken
    tol = 1e-12 if dtype == np.float64 else 2e-5
    names = ["output", "weights", "d weights", "d biases", "d out_weights", "d out_biases", "d input"]
    for name, a, b in zip(names, fused, gemm):
        assert_close(a, b, tol, tol * np.abs(b).max(), f"fused attention {name}")
    if "pad" in keys:                                # masked keys: exactly 0, as on the GEMM path
        assert not fused[1][:, :, :, 0].any()


def test_fused_attention_gradients():
    net, x = _wide_attention("causal=1", dim=32, heads=1)
    net.forward(x, train=True)
    assert net.layers[0].fused
    # atol: the central differences of this wider layer's larger Σ R·output carry ~3e-8 of
    # rounding (the GEMM path's gradients miss the 1e-8 default by as much)
    layer_gradcheck(net, 0, x, atol=1e-7)


def test_attention_with_dropout_or_narrow_heads_takes_the_gemm_path():
    net, x = _wide_attention("causal=1\ndropout=0.2")
    net.layers[0].forward(_state(net, net.layers[0], x))
    assert not net.layers[0].fused
    assert not _attention_net("causal=1").layers[0].fused          # heads of 4 values


def test_attention_cfg_errors():
    with pytest.raises(CfgError, match="heads"):
        seq_net("[attention]\nheads=3\n")
    with pytest.raises(CfgError, match="inputs=1"):
        seq_net("[attention]\nheads=2\npad=0\n")


# -- gelu, gelu_tanh ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gelu", "gelu_tanh"])
def test_gelu_values_and_true_derivative(name):
    x = np.linspace(-5, 5, 41)
    if name == "gelu":
        ref = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    else:
        c = math.sqrt(2 / math.pi)
        ref = 0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x ** 3)))
    y = x.copy()
    act.activate_array(y, act.code(name))
    assert_close(y, ref, 1e-12, 1e-12, name)
    d = np.ones_like(x)
    act.gradient_array(d, y, act.code(name), x.copy())
    num = np.zeros_like(x)
    for i, v in enumerate(x):
        a = np.array([v + 1e-6, v - 1e-6])
        act.activate_array(a, act.code(name))
        num[i] = (a[0] - a[1]) / 2e-6
    assert_close(d, num, 1e-6, 1e-8, f"{name}'")


def test_gelu_in_connected_gradcheck():
    net = seq_net("[connected]\noutput=6\nactivation=gelu\n")
    x = np.random.default_rng(8).normal(size=(T * S, 8))
    net.forward(x, train=True)
    layer_gradcheck(net, 0, x)


# -- [crossentropy] -------------------------------------------------------------------------------------

def _rerun_loss(net):
    """Forward the loss layer again on the restored input (the gradient check's last forward ran on a
    perturbed one)."""
    layer, prev = net.layers[-1], net.layers[-2]
    layer.forward(State(input=prev.output, delta=None, truth=net.truth, train=True, layers=net.layers, net=net))
    return layer


def xent_reference(logits, targets, ignore, eps):
    """torch's F.cross_entropy(reduction="sum", ignore_index, label_smoothing), in float64."""
    V = logits.shape[1]
    total, n = 0.0, 0
    for z, t in zip(logits, targets):
        if t == ignore:
            continue
        logp = z - z.max() - math.log(np.exp(z - z.max()).sum())
        q = np.full(V, eps / V)
        q[int(t)] += 1 - eps
        total -= (q * logp).sum()
        n += 1
    return total, n


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_crossentropy_index_targets_ignore_and_smoothing(eps):
    cfg = (f"[net]\nbatch={S}\ntime_steps={T}\ninputs=6\n[connected]\noutput=6\nactivation=linear\n"
           f"[crossentropy]\nignore_index=-1\nlabel_smoothing={eps}\n")
    t = np.random.default_rng(9).integers(0, 6, T * S).astype(np.float64)
    t[[0, 4, 7]] = -1
    net = loss_gradcheck(cfg, t)
    layer = _rerun_loss(net)
    cost, n = xent_reference(net.layers[0].output, t, -1, eps)
    assert layer.cost == pytest.approx(cost, rel=1e-12)
    assert layer.counted == n == T * S - 3
    assert layer.token_mean == pytest.approx(cost / n, rel=1e-12)
    assert not net.layers[-1].delta[[0, 4, 7]].any()         # ignored rows: no gradient


def test_crossentropy_soft_labels():
    cfg = (f"[net]\nbatch={S}\ntime_steps={T}\ninputs=6\n[connected]\noutput=4\nactivation=linear\n"
           f"[crossentropy]\ntargets=soft\nlabel_smoothing=0.2\n")
    q = np.random.default_rng(10).dirichlet(np.ones(4), T * S)
    q[2] = 0                                                # an all-zero row is ignored
    net = loss_gradcheck(cfg, q)
    layer = _rerun_loss(net)
    z = net.layers[0].output
    logp = z - z.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    qs = 0.8 * q + 0.2 / 4
    qs[2] = 0
    assert layer.cost == pytest.approx(-(qs * logp).sum(), rel=1e-12)
    assert layer.counted == T * S - 1


def test_crossentropy_rejects_bad_targets():
    net = network_from_text("[net]\nbatch=2\ninputs=3\n[crossentropy]\n")
    with pytest.raises(StateError, match="target 3; targets"):
        net.forward(np.zeros((2, 3)), np.array([[1.0], [3.0]]), train=True)


def test_summary_shows_the_new_sections_with_parameters_and_flops():
    from pathlib import Path

    from darkpy.cfg import load_cfg
    from darkpy.network import Network

    cfg = Path(__file__).resolve().parents[1] / "cfg" / "tiny-gpt-sort.cfg"
    net = Network(load_cfg(cfg), batch=18, shapes_only=True)
    lines = net.summary().splitlines()
    by_kind = {}
    for layer, line in zip(net.layers, lines[1:]):
        by_kind.setdefault(layer.kind, (layer, line))
    for kind in ("embedding", "layernorm", "attention"):
        layer, line = by_kind[kind]
        n = sum(a.size for a in layer.weight_arrays())
        assert n > 0 and f"{n:,} params, {layer.flops():,.0f} FLOPs/token" in line, line
    attn = by_kind["attention"][0]
    assert attn.flops() == 2 * 4 * attn.dim ** 2 + 2 * 2 * attn.steps * attn.dim
