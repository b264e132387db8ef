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
{{tie}}

[crossentropy]
ignore_index=-1
label_smoothing={{smooth}}
"""


def _nets(clip=0.0, positions="learned", pad=0, act="gelu", smooth=0.1, tie=""):
    net = network_from_text(CFG.format(clip=clip, positions=positions, pad=pad, act=act, smooth=smooth, tie=tie),
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


@pytest.mark.parametrize("act,positions,tie", [("gelu", "learned", ""), ("gelu_tanh", "sinusoidal", ""),
                                              ("gelu", "learned", "tie=0")])
def test_forward_and_gradients_equal_torch(act, positions, tie):
    net, tnet, ids, tgt = _nets(act=act, positions=positions, tie=tie)
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
               "connected": lambda: [m.fc.bias] + ([m.fc.weight] if layer.tied is None else [])}.get(layer.kind, lambda: [])()
        assert len(tps) == len(layer.params), layer.kind
        out += [(f"{layer.index} {layer.kind} {p.name}", p, tp) for p, tp in zip(layer.params, tps)]
    return out


@pytest.mark.parametrize("tie", ["", "tie=0"])
def test_clipped_adamw_steps_equal_torch(tie):
    net, tnet, ids, tgt = _nets(clip=0.05, tie=tie)
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


SMALL_GPT = """[net]
batch=3
subdivisions=1
time_steps=5
inputs=1
learning_rate=0.001
adamw=1
weight_decay=0.01
clip_norm=1.0

[embedding]
vocab=128
size=8

[layernorm]

[attention]
heads=2
causal=1

[shortcut]
from=-3
activation=linear

[connected]
output=16
activation=gelu

[connected]
output=128
activation=linear

[crossentropy]
"""


def test_benchmark_harness_runs_a_transformer_step_on_both_sides(tmp_path):
    """benchmarks.run's sequence path: prepare + phase inputs, then the darkpy and torch workers'
    runners in this process: the checked outputs (logits and softmax) and the loss agree, and one
    timed op (forward, backward, clip, AdamW) runs on each side."""
    import numba

    from benchmarks import engine
    from benchmarks.worker import make_runner

    cfg = tmp_path / "gpt.cfg"
    cfg.write_text(SMALL_GPT)
    opts = engine.Options(contenders=("darkpy", "torch", "torch-cl"), tmp=tmp_path,
                          threads=numba.get_num_threads())
    spec = engine.NetSpec("gpt", cfg, None, 3)
    prep = engine.prepare(spec, opts)
    assert prep.seq["steps"] == 5 and prep.train_unsupported is None
    phase = engine.Phase(spec, prep, "train", 3, opts)
    phase.start()
    assert phase.job["batch"] == 15 and phase.kinds == ["darkpy", "torch"]     # no channels_last for tokens
    assert "torch-cl" in phase.result["contenders"] and "skipped" in phase.result["contenders"]["torch-cl"]
    replies = {}
    for kind in ("darkpy", "torch"):
        runner = make_runner(kind, phase.job_for(kind))
        replies[kind] = runner.check(str(tmp_path / f"{kind}.npz"), False)
        runner.op()
    c = engine.compare(str(tmp_path / "darkpy.npz"), str(tmp_path / "torch.npz"))
    assert c["ok"] and c["outputs_compared"] == 2 and c["max_rel_err"] < 1e-5, c
    assert replies["torch"]["loss"] == pytest.approx(replies["darkpy"]["loss"], rel=1e-5)
