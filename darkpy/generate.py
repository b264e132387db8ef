"""Sampling text from a trained sequence network, and scoring it on held-out text.

`generate` is Darknet's `rnn generate` (examples/rnn.c test_char_rnn): prime the network with the
seed text, then sample one byte at a time from the output distribution at temperature `temp`
(darknet: probabilities below 1e-4 are set to 0 before sampling; kept). Seeded sampling is
reproducible: the draws come from `numpy.random.default_rng(srand)`.

Two kinds of network:
- recurrent (any layer with `carry_state`): rebuilt with `time_steps=1` and one stream, the state
  carried from call to call, one byte per forward (Darknet's way);
- otherwise (a Transformer over `time_steps` positions): each forward reads the last `time_steps`
  bytes (fewer at first, the rest of the window filled with the pad byte — the causal mask keeps
  later positions from mattering) and the distribution at the last real position is sampled.

`text_bpc` is the mean cross-entropy in bits per byte (character) of held-out text, read as
`streams` contiguous segments. A recurrent network reads each segment in `time_steps`-byte windows
with its state carried across them (every byte scored with all the text before it in its segment).
A Transformer sees at most `time_steps` bytes, so it reads overlapping windows `stride` bytes apart
(default `time_steps / 2`) and scores only each window's last `stride` bytes (the first window: all
of them): every byte is scored once, after at least `time_steps - stride` bytes of context, the
usual sliding-window evaluation. `stride=time_steps` is plain non-overlapping windows. `exact_match` scores a
padded-lines task: a line counts when every answer target is the network's most likely byte (the
same as greedy decoding of the answer).
"""
from __future__ import annotations

import math
import os

import numpy as np

from .errors import DarkpyError

VOCAB = 256


def _is_recurrent(net) -> bool:
    return any(hasattr(layer, "carry_state") for layer in net.layers)


def _encode(ids: np.ndarray, onehot: bool) -> np.ndarray:
    if not onehot:
        return ids.astype(np.float32).reshape(-1, 1)
    x = np.zeros((ids.size, VOCAB), np.float32)
    x[np.arange(ids.size), ids] = 1
    return x


def _set_temperature(net, temp: float) -> None:
    # darknet: test_char_rnn sets every layer's temperature; only the softmax ones read it
    for layer in net.layers:
        if hasattr(layer, "temperature"):
            layer.temperature = temp


def load_text_network(cfg, weights, steps: int | None = None, streams: int = 1):
    """The network of `cfg` with `weights`, `streams` sequences per pass; `steps` overrides
    time_steps (1 for recurrent generation)."""
    from .cfg import load_cfg
    from .network import Network

    doc = load_cfg(cfg)
    if steps is not None:
        doc.set("net.time_steps", str(steps))
    doc.set("net.batch", str(streams))
    doc.set("net.subdivisions", "1")
    net = Network(doc)
    if net.input_shape not in ((VOCAB,), (1,)):
        raise DarkpyError(f"{cfg}: a text network needs inputs={VOCAB} (one-hot bytes) or inputs=1 (token ids); "
                          f"this one has {net.input_shape}")
    if weights is not None:
        net.load_weights(weights)
    return net


def open_generator(cfg, weights):
    from .network import load_network

    probe = load_network(cfg, batch=None)
    steps = 1 if _is_recurrent(probe) else None
    return load_text_network(cfg, weights, steps=steps)


def _sample(p: np.ndarray, rng: np.random.Generator) -> int:
    p = np.where(p < 1e-4, 0.0, p.astype(np.float64))      # darknet: out[j] < .0001 -> 0
    total = p.sum()
    if total <= 0:
        return int(np.argmax(p))
    r = rng.random() * total
    return int(min(np.searchsorted(np.cumsum(p), r, side="right"), p.size - 1))


def generate(net, seed_text: bytes = b"\n", length: int = 1000, temp: float = 0.7, srand: int = 0,
             pad: int = 32) -> bytes:
    """`length` bytes sampled after priming with `seed_text` (returned without the seed)."""
    rng = np.random.default_rng(srand)
    _set_temperature(net, temp)
    onehot = net.input_shape == (VOCAB,)
    seed = list(seed_text) or [ord("\n")]
    out = []
    if _is_recurrent(net):
        for layer in net.layers:
            if hasattr(layer, "carry_state"):
                layer.carry_state = True
                layer.reset_state()
        for c in seed[:-1]:
            net.forward(_encode(np.array([c]), onehot))
        c = seed[-1]
        for _ in range(length):
            p = net.forward(_encode(np.array([c]), onehot)).reshape(-1)
            c = _sample(p, rng)
            out.append(c)
        return bytes(out)
    T = net.config.time_steps
    history = seed[:]
    for _ in range(length):
        window = history[-T:]
        ids = np.full(T, pad, np.int64)
        ids[:len(window)] = window
        p = net.forward(_encode(ids, onehot)).reshape(T, -1)[len(window) - 1]
        c = _sample(p, rng)
        out.append(c)
        history.append(c)
    return bytes(out)


def _row_logprob(net, x: np.ndarray) -> np.ndarray:
    """log p of every row's output distribution."""
    p = net.forward(x).reshape(x.shape[0], -1).astype(np.float64)
    return np.log(np.maximum(p, 1e-300))


def text_bpc(cfg, weights, path: str, streams: int = 16, limit: int | None = None,
             stride: int | None = None) -> tuple[float, int]:
    """(bits per byte, bytes scored) of the text file `path` under the network; `stride`: a
    Transformer's window step (module docstring; default time_steps / 2, ignored by a recurrent
    network)."""
    net = load_text_network(cfg, weights, streams=streams)
    _set_temperature(net, 1.0)
    text = np.fromfile(path, np.uint8).astype(np.int64)
    if limit:
        text = text[:limit]
    T = net.config.time_steps
    onehot = net.input_shape == (VOCAB,)
    seg = (text.size - 1) // streams // T * T
    if seg == 0:
        raise DarkpyError(f"{path}: too short to score ({text.size} bytes for {streams} streams of {T})")
    recurrent = _is_recurrent(net)
    if recurrent:
        stride = T
        for layer in net.layers:
            if hasattr(layer, "carry_state"):
                layer.carry_state = True
                layer.reset_state()
    else:
        stride = stride or max(T // 2, 1)
        if not 1 <= stride <= T or T % stride:
            raise DarkpyError(f"--stride {stride}: must divide time_steps={T}")
    starts = np.arange(streams) * seg
    total, n = 0.0, 0
    for w in range(0, seg - T + 1, stride):
        first = 0 if w == 0 else T - stride          # the window's first scored position
        pos = (starts[None, :] + w + np.arange(T)[:, None]).reshape(-1)      # time-major rows
        logp = _row_logprob(net, _encode(text[pos], onehot))
        rows = np.arange(first * streams, pos.size)
        total -= logp[rows, text[pos[rows] + 1]].sum()
        n += rows.size
    return total / n / math.log(2), n


def exact_match(cfg, weights, data=None, batch: int = 100) -> tuple[float, int]:
    """(fraction of lines exactly right, lines) on the `valid` lines of a `sequences=lines` .data."""
    from .datafile import load_data_config, resolve_data_file
    from .textdata import TextData, _split_lines, read_bytes

    data_path = resolve_data_file(cfg, data)
    dc = load_data_config(data_path)
    if dc.raw.get("sequences") != "lines" or not dc.valid:
        raise DarkpyError(f"{data_path}: exact match needs sequences=lines and a valid= file")
    net = load_text_network(cfg, weights, streams=batch)
    _set_temperature(net, 1.0)
    after = dc.raw.get("answer_after")
    ds = TextData(read_bytes(dc.valid, "valid"), net, "lines", int(dc.raw.get("pad", 0)),
                  ord(after) if after else None, source=dc.valid)
    lines = len(_split_lines(ds.text, net.config.time_steps, dc.valid))
    T = net.config.time_steps
    right = 0
    for lo in range(0, lines, batch):
        idx = np.arange(lo, min(lo + batch, lines))
        x, y = ds.sequences(np.resize(idx, batch))                           # (batch, T)
        p = net.forward(ds.encode_inputs(x.T.reshape(-1))).reshape(T, batch, -1).transpose(1, 0, 2)
        guess = p.argmax(axis=-1)
        ok = np.where(y >= 0, guess == y, True).all(axis=1)
        right += int(ok[:idx.size].sum())
    return right / lines, lines


def valid_text_file(cfg, data=None) -> str:
    from .datafile import load_data_config, resolve_data_file

    dc = load_data_config(resolve_data_file(cfg, data))
    if not dc.valid or not os.path.isfile(dc.valid):
        raise DarkpyError(f"{dc.path}: no valid= text file to score")
    return dc.valid
