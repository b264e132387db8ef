"""The Transformer sections equal PyTorch (nn.Embedding, nn.LayerNorm, nn.MultiheadAttention,
F.cross_entropy with ignore_index and label_smoothing, clip_grad_norm_, torch.optim.AdamW) with
copied weights: forward, every parameter gradient, and one clipped AdamW step. Skipped without torch."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from benchmarks.torch_seq import TorchSeqNet, to_seq  # noqa: E402
from darkpy.network import network_from_text  # noqa: E402
from helpers import assert_close  # noqa: E402

T, S, V = 6, 3, 12

CFG = f"""[net]
batch={S}
time_steps={T}
inputs=1
learning_rate=0.01
adamw=1
weight_decay=0.1
B1=0.9
B2=0.98
eps=1e-8
clip_norm={{clip}}

[embedding]
vocab={V}
size=8
positions={{positions}}

[layernorm]

[attention]
heads=2
causal=1
pad={{pad}}

[shortcut]
from=-3
activation=linear

[layernorm]

[connected]
output=16
activation={{act}}

[connected]
output=8
activation=linear

[shortcut]
from=-4
activation=linear

[connected]
output={V}
activation=linear

[crossentropy]
ignore_index=-1
label_smoothing={{smooth}}
"""


def _nets(clip=0.0, positions="learned", pad=0, act="gelu", smooth=0.1):
    net = network_from_text(CFG.format(clip=clip, positions=positions, pad=pad, act=act, smooth=smooth),
                            dtype=np.float64, seed=4)
    rng = np.random.default_rng(1)
    for layer in net.layers:                   # non-trivial LN gains and biases
        for p in layer.params:
            if p.name in ("scales", "biases", "out_biases"):
                p.value[...] = rng.normal(1 if p.name == "scales" else 0, 0.3, p.value.shape)
    ids = rng.integers(1, V, (T, S))
    ids[4:, 1] = 0                             # padding at the end of sequence 1
    tgt = rng.integers(0, V, (T, S))
    tgt[4:, 1] = -1
    return net, TorchSeqNet(net, torch.float64), ids, tgt


def _darkpy_step(net, ids, tgt):
    net.forward(ids.reshape(-1, 1).astype(np.float64), tgt.reshape(-1, 1).astype(np.float64), train=True)
    net.backward()


@pytest.mark.parametrize("act,positions", [("gelu", "learned"), ("gelu_tanh", "sinusoidal")])
def test_forward_and_gradients_equal_torch(act, positions):
    net, tnet, ids, tgt = _nets(act=act, positions=positions)
    _darkpy_step(net, ids, tgt)
    tid, ttg = torch.tensor(ids.T), torch.tensor(tgt.T)
    loss = tnet.loss(tid, ttg, 1)
    loss.backward()
    assert net.layers[-1].cost == pytest.approx(loss.item(), rel=1e-10)
    logits = tnet.logits(tid).detach().numpy()
    assert_close(to_seq(net.layers[-2].output, T), logits, 1e-10, 1e-12, "logits")
    # every parameter: darkpy's grad is the negative summed gradient
    pairs = _param_pairs(net, tnet)
    for name, p, tp in pairs:
        assert_close(-p.grad, tp.grad.numpy(), 1e-8, 1e-11, name)


def _param_pairs(net, tnet):
    out = []
    for layer, m in zip(net.layers, tnet.mods):
        tps = {"embedding": lambda: [m.emb.weight] + ([m.pos] if layer.pos is not None else []),
               "layernorm": lambda: [m.ln.bias, m.ln.weight],
               "attention": lambda: [m.mha.in_proj_weight, m.mha.in_proj_bias, m.mha.out_proj.weight,
                                     m.mha.out_proj.bias],
               "connected": lambda: [m.fc.bias, m.fc.weight]}.get(layer.kind, lambda: [])()
        assert len(tps) == len(layer.params), layer.kind
        out += [(f"{layer.index} {layer.kind} {p.name}", p, tp) for p, tp in zip(layer.params, tps)]
    return out


def test_clipped_adamw_steps_equal_torch():
    net, tnet, ids, tgt = _nets(clip=0.05)
    B = net.config.full_batch
    opt = tnet.optimizer(net.config, 0.01)
    tid, ttg = torch.tensor(ids.T), torch.tensor(tgt.T)
    for _ in range(3):
        _darkpy_step(net, ids, tgt)
        net.update(rate=0.01)
        opt.zero_grad()
        tnet.loss(tid, ttg, B).backward()
        norm = torch.nn.utils.clip_grad_norm_(tnet.parameters(), 0.05)
        assert net.grad_norm == pytest.approx(norm.item(), rel=1e-9)
        opt.step()
    for name, p, tp in _param_pairs(net, tnet):
        assert_close(p.value, tp.detach().numpy(), 1e-8, 1e-11, name)
