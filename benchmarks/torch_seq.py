"""darkpy's sequence networks (cfg/tiny-gpt.cfg and friends) as PyTorch modules with copied weights,
for checking equality (tests/test_torch_seq.py) and timing a training step against torch.

The translation, layer by layer: `[embedding]` → `nn.Embedding` + a position table; `[layernorm]` →
`nn.LayerNorm`; `[attention]` → `nn.MultiheadAttention` (batch_first; darkpy's (3D, D) `weights` is
its `in_proj_weight`, the output projection its `out_proj`; causal and key-padding masks as bool
masks); `[connected]` → `nn.Linear` + the activation (gelu exact / tanh); `[shortcut]` (one `from`,
linear) → a sum; `[crossentropy]` → `F.cross_entropy(ignore_index, label_smoothing)`.

darkpy rows are time-major (`t·S + s`); torch here works on (S, T, D) tensors. The training step
is darkpy's: loss = the SUMMED cross-entropy divided by the full batch B (darkpy's update divides
its summed gradient by B), `clip_grad_norm_`, then `torch.optim.AdamW` with decay on the weight
matrices only (not biases, layer-norm gains or embedding tables).

    python -m benchmarks.torch_seq [--cfg cfg/tiny-gpt.cfg] [--steps 5] [--threads 2] [--rounds 6]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Unsupported(Exception):
    pass


def _p(a, dtype) -> nn.Parameter:
    return nn.Parameter(torch.tensor(np.array(a), dtype=dtype))


def seq_specs(layers) -> list[dict]:
    """darkpy's layers as plain dicts (kind, options, numpy weights): what the torch side needs, so
    that a torch process can build the model without importing darkpy (benchmarks/worker.py)."""
    out = []
    for layer in layers:
        kind = layer.kind
        d: dict = {"kind": kind, "index": layer.index}
        if kind == "embedding":
            pos = layer.pos.value if layer.pos is not None else (
                layer.fixed_pos if layer.fixed_pos is not None else np.zeros((layer.steps, layer.size)))
            d.update(vocab=layer.vocab, size=layer.size, table=np.array(layer.table.value),
                     pos=np.array(pos), learned=layer.pos is not None)
        elif kind == "layernorm":
            d.update(n=layer.n, eps=layer.eps, scales=np.array(layer.scales.value),
                     biases=np.array(layer.biases.value))
        elif kind == "attention":
            d.update(dim=layer.dim, heads=layer.heads, dropout=layer.dropout, causal=layer.causal, pad=layer.pad,
                     weights=np.array(layer.weights.value), biases=np.array(layer.biases.value),
                     out_weights=np.array(layer.out_weights.value), out_biases=np.array(layer.out_biases.value))
        elif kind == "connected":
            if layer.batch_normalize or layer.activation not in ("linear", "gelu", "gelu_tanh", "relu"):
                raise Unsupported(f"[connected] {layer.activation} / batch_normalize")
            d.update(inputs=layer.inputs, n=layer.n, activation=layer.activation,
                     weights=np.array(layer.weights.value), biases=np.array(layer.biases.value),
                     tie=getattr(layer, "tied", None))
        elif kind == "shortcut":
            if len(layer.sources) != 1 or layer.activation != "linear":
                raise Unsupported("[shortcut] with several sources or an activation")
            d.update(source=layer.sources[0].index)
        elif kind == "crossentropy":
            if layer.targets != "index":
                raise Unsupported("[crossentropy] targets=soft")
            d.update(ignore_index=layer.ignore_index, label_smoothing=layer.label_smoothing)
        else:
            raise Unsupported(f"layer {layer.index} [{kind}] has no translation here")
        out.append(d)
    return out


class TorchSeqNet(nn.Module):
    """The torch model of a darkpy sequence network: `TorchSeqNet(net)` (a darkpy Network), or
    `TorchSeqNet(seq_specs(layers), steps=T)`."""

    def __init__(self, net, dtype=torch.float32, steps: int | None = None):
        super().__init__()
        specs = seq_specs(net.layers) if hasattr(net, "layers") else net
        self.steps_t = net.config.time_steps if hasattr(net, "layers") else steps
        self.kinds, self.mods, self.extra = [], nn.ModuleList(), {}
        self.decay_params: list[nn.Parameter] = []
        for i, d in enumerate(specs):
            kind = d["kind"]
            m = nn.Module()
            if kind == "embedding":
                m.emb = nn.Embedding(d["vocab"], d["size"], dtype=dtype)
                m.emb.weight = _p(d["table"], dtype)
                if d["learned"]:
                    m.pos = _p(d["pos"], dtype)
                else:
                    m.register_buffer("pos", torch.tensor(d["pos"], dtype=dtype))
            elif kind == "layernorm":
                m.ln = nn.LayerNorm(d["n"], eps=d["eps"], dtype=dtype)
                m.ln.weight, m.ln.bias = _p(d["scales"], dtype), _p(d["biases"], dtype)
            elif kind == "attention":
                m.mha = nn.MultiheadAttention(d["dim"], d["heads"], dropout=d["dropout"], batch_first=True,
                                              dtype=dtype)
                m.mha.in_proj_weight = _p(d["weights"], dtype)
                m.mha.in_proj_bias = _p(d["biases"], dtype)
                m.mha.out_proj.weight = _p(d["out_weights"], dtype)
                m.mha.out_proj.bias = _p(d["out_biases"], dtype)
                self.decay_params += [m.mha.in_proj_weight, m.mha.out_proj.weight]
                self.extra[i] = (d["causal"], d["pad"])
            elif kind == "connected":
                m.fc = nn.Linear(d["inputs"], d["n"], dtype=dtype)
                m.fc.bias = _p(d["biases"], dtype)
                if d.get("tie") is not None:             # the embedding's table itself (not decayed)
                    m.fc.weight = self.mods[d["tie"]].emb.weight
                else:
                    m.fc.weight = _p(d["weights"], dtype)
                    self.decay_params.append(m.fc.weight)
                self.extra[i] = d["activation"]
            elif kind == "shortcut":
                self.extra[i] = d["source"]
            elif kind == "crossentropy":
                self.extra[i] = (d["ignore_index"], d["label_smoothing"], "index")
            self.kinds.append(kind)
            self.mods.append(m)

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: (S, T) long → the input of the last layer, (S, T, V)."""
        saved: list[torch.Tensor] = []
        x = ids
        T = ids.shape[1]
        for i, (kind, m) in enumerate(zip(self.kinds, self.mods)):
            if kind == "embedding":
                x = m.emb(ids) + m.pos[:T]
            elif kind == "layernorm":
                x = m.ln(x)
            elif kind == "attention":
                causal, pad = self.extra[i]
                mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1) if causal else None
                kpm = (ids == pad) if pad >= 0 else None
                x, _ = m.mha(x, x, x, attn_mask=mask, key_padding_mask=kpm, need_weights=False)
            elif kind == "connected":
                x = m.fc(x)
                a = self.extra[i]
                x = F.gelu(x) if a == "gelu" else F.gelu(x, approximate="tanh") if a == "gelu_tanh" else \
                    F.relu(x) if a == "relu" else x
            elif kind == "shortcut":
                x = x + saved[self.extra[i]]
            elif kind == "crossentropy":
                break
            saved.append(x)
        return x

    def loss(self, ids: torch.Tensor, targets: torch.Tensor, full_batch: int) -> torch.Tensor:
        ignore, smooth, _ = self.extra[len(self.kinds) - 1]
        z = self.logits(ids)
        return F.cross_entropy(z.reshape(-1, z.shape[-1]), targets.reshape(-1), ignore_index=ignore,
                               label_smoothing=smooth, reduction="sum") / full_batch

    def optimizer(self, cfg, rate: float) -> torch.optim.AdamW:
        decay = {id(p) for p in self.decay_params}
        groups = [{"params": [p for p in self.parameters() if id(p) in decay], "weight_decay": cfg.weight_decay},
                  {"params": [p for p in self.parameters() if id(p) not in decay], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=rate, betas=(cfg.B1, cfg.B2), eps=cfg.eps)


def to_seq(rows: np.ndarray, steps: int) -> np.ndarray:
    """darkpy's time-major (T·S, ...) rows → (S, T, ...)."""
    return np.swapaxes(rows.reshape(steps, -1, *rows.shape[1:]), 0, 1)


def time_step(cfg_path: str, steps: int = 5, threads: int = 2, seed: int = 0, rounds: int = 1) -> dict:
    """Seconds per training step (forward, backward, clip, AdamW) of darkpy and torch, same model.
    With `rounds` > 1 the two alternate (`steps` steps each per round, the order swapped every
    round), so both see the same machine load; each figure is the median over rounds and
    `ratios` holds every round's torch ÷ darkpy."""
    from darkpy.network import load_network
    from darkpy.runtime import configure_threads

    configure_threads(threads)
    torch.set_num_threads(threads)
    net = load_network(cfg_path, seed=seed)
    T, B = net.config.time_steps, net.config.full_batch
    rng = np.random.default_rng(seed)
    ids = rng.integers(32, 127, (net.batch, 1)).astype(np.float32)
    tgt = rng.integers(32, 127, (net.batch, 1)).astype(np.float32)
    tnet = TorchSeqNet(net)
    opt = tnet.optimizer(net.config, net.config.learning_rate)
    tid = torch.tensor(to_seq(ids[:, 0].astype(np.int64), T))
    ttg = torch.tensor(to_seq(tgt[:, 0].astype(np.int64), T))

    def darkpy_step():
        net.forward(ids, tgt, train=True)
        net.backward()
        net.update()

    def torch_step():
        opt.zero_grad()
        tnet.loss(tid, ttg, B).backward()
        if net.config.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(tnet.parameters(), net.config.clip_norm)
        opt.step()

    fns = {"darkpy": darkpy_step, "torch": torch_step}
    for fn in fns.values():
        fn()                                             # warm-up (numba load, torch allocator)
    times: dict[str, list[float]] = {"darkpy": [], "torch": []}
    for r in range(rounds):
        for name in (("darkpy", "torch") if r % 2 == 0 else ("torch", "darkpy")):
            t0 = time.perf_counter()
            for _ in range(steps):
                fns[name]()
            times[name].append((time.perf_counter() - t0) / steps)
    out = {name: float(np.median(t)) for name, t in times.items()}
    out["ratios"] = [t / d for t, d in zip(times["torch"], times["darkpy"])]
    out["speedup"] = float(np.median(out["ratios"]))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="darkpy vs torch: one Transformer training step")
    ap.add_argument("--cfg", default="cfg/tiny-gpt.cfg")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="alternate darkpy and torch this many times")
    a = ap.parse_args()
    r = time_step(a.cfg, a.steps, a.threads, rounds=a.rounds)
    print(f"{a.cfg}: darkpy {r['darkpy'] * 1000:.1f} ms/step, torch {r['torch'] * 1000:.1f} ms/step, "
          f"darkpy speed = {r['speedup']:.2f}x torch"
          + (f" (median of {a.rounds} alternating rounds: "
             f"{', '.join(f'{x:.2f}' for x in r['ratios'])})" if a.rounds > 1 else ""))
