"""AdamW, global-norm clipping, warm-up + cosine against hand-computed steps; the text data path
(char-RNN streams, padded lines); generation; training from a text .data file, resumed exactly."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from darkpy.errors import DarkpyError, DataError
from darkpy.generate import generate, load_text_network, open_generator, text_bpc
from darkpy.network import network_from_text
from darkpy.optim import clip_global_norm, current_rate
from darkpy.textdata import StreamPlan, TextData
from helpers import assert_close

# -- optimiser ---------------------------------------------------------------------------------------

ADAMW_NET = """[net]
batch=2
inputs=3
learning_rate=0.1
adamw=1
weight_decay=0.5
B1=0.8
B2=0.9
eps=1e-8
{extra}
[layernorm]
[connected]
output=2
activation=linear
"""


def _adamw_reference(w, grads, lr, wd, b1, b2, eps, decay):
    """torch.optim.AdamW, written out: grads are the mean gradients of successive steps."""
    w = w.astype(np.float64).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        if decay:
            w -= lr * wd * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w -= lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return w


def test_adamw_matches_hand_computed_steps_and_skips_decay_on_biases_and_gains():
    net = network_from_text(ADAMW_NET.format(extra=""), dtype=np.float64)
    B = net.config.full_batch
    rng = np.random.default_rng(0)
    params = [p for layer in net.layers for p in layer.params]
    start = {id(p): p.value.copy() for p in params}
    steps = {id(p): [rng.normal(size=p.value.shape) for _ in range(3)] for p in params}
    for k in range(3):
        for p in params:
            p.grad[...] = -steps[id(p)][k] * B          # darkpy keeps the negative summed gradient
        net.update(rate=0.1)
    for p in params:
        ref = _adamw_reference(start[id(p)], steps[id(p)], 0.1, 0.5, 0.8, 0.9, 1e-8, p.decay)
        assert_close(p.value, ref, 1e-12, 1e-14, f"AdamW {p.name}")
        assert not p.grad.any()
    decayed = {p.name for p in params if p.decay}
    assert decayed == {"weights"}                         # not biases, not the layer-norm gains


def test_clip_global_norm_scales_every_gradient():
    g1, g2 = np.array([3.0, 0.0]), np.array([[0.0], [4.0]])
    B = 2
    grads = [g1 * B, g2 * B]
    norm = clip_global_norm(grads, B, 1.0)
    assert norm == pytest.approx(5.0)
    k = 1.0 / (5.0 + 1e-6)
    assert_close(grads[0], g1 * B * k, 1e-12, 0, "clipped")
    assert_close(grads[1], g2 * B * k, 1e-12, 0, "clipped")
    same = [g1 * B]
    assert clip_global_norm(same, B, 10.0) == pytest.approx(3.0)
    assert_close(same[0], g1 * B, 0, 0, "below the limit: unchanged")


def test_network_update_clips_and_records_the_norm():
    net = network_from_text(ADAMW_NET.format(extra="clip_norm=0.5"), dtype=np.float64)
    for layer in net.layers:
        for p in layer.params:
            p.grad[...] = 1.0
    net.update(rate=0.0)
    n = sum(p.value.size for layer in net.layers for p in layer.params)
    assert net.grad_norm == pytest.approx(math.sqrt(n) / net.config.full_batch)


def test_warmup_then_cosine():
    net = network_from_text("[net]\ninputs=1\nlearning_rate=1\nlearning_rate_min=0.1\nwarmup=4\npolicy=cosine\n"
                            "max_batches=14\n[layernorm]\n")
    c = net.config
    assert [current_rate(c, b) for b in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert current_rate(c, 4) == pytest.approx(1.0)
    assert current_rate(c, 9) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert current_rate(c, 14) == pytest.approx(0.1)


# -- data ----------------------------------------------------------------------------------------------

def test_stream_plan_evenly_spaced_time_major_and_wraps():
    plan = StreamPlan(100, 4, 5, 1)
    assert plan.starts.tolist() == [0, 25, 50, 75]
    rows = plan.indices(0).reshape(5, 4)                # (steps, streams)
    assert rows[:, 1].tolist() == [25, 26, 27, 28, 29]
    assert plan.indices(1).reshape(5, 4)[0].tolist() == [5, 30, 55, 80]
    assert plan.wrapped(0).tolist() == [0, 1, 2, 3]
    assert plan.wrapped(1).tolist() == []
    # stream 3 starts at 75: its window passes byte 100 at iteration 5 (75 + 25)
    assert plan.wrapped(5).tolist() == [3]
    assert (plan.indices(5).reshape(5, 4)[:, 3] == [0, 1, 2, 3, 4]).all()


def test_prepare_network_carries_state_and_zeroes_only_wrapped_streams():
    net = network_from_text("[net]\nbatch=4\ntime_steps=5\ninputs=256\n[gru]\noutput=3\n"
                            "[connected]\noutput=256\nactivation=linear\n[softmax]\n")
    ds = TextData(np.frombuffer(bytes(range(1, 101)), np.uint8), net)      # starts 0, 25, 50, 75
    gru = net.layers[0]
    assert [a.shape for a in gru.carried] == [(4, 3)]
    gru.carried[0][...] = 1.0
    ds.prepare_network(net, 4)                        # no stream wraps between iterations 3 and 4
    ds.begin_pass(net, 0)
    assert gru.carry_state and (gru.h0 == 1).all()
    ds.prepare_network(net, 5)                        # stream 3 (75 + 25) passes the end
    ds.begin_pass(net, 0)
    assert (gru.h0[3] == 0).all() and (gru.h0[:3] == 1).all()
    gru.h0[...] = 2.0
    ds.end_pass(net, 0)                               # the state the pass ended with is kept
    assert (gru.carried[0] == 2).all()
    ds.prepare_network(net, 0)
    assert not gru.carried[0].any()


def test_each_subdivision_pass_carries_its_own_streams_state():
    """subdivisions=2: 4 streams, 2 per pass; pass j loads and stores rows 2j, 2j + 1 of `carried`,
    and a wrap zeroes the stream's row whichever pass holds it."""
    net = network_from_text("[net]\nbatch=4\nsubdivisions=2\ntime_steps=5\ninputs=256\n[gru]\noutput=3\n"
                            "[connected]\noutput=256\nactivation=linear\n[softmax]\n")
    ds = TextData(np.frombuffer(bytes(range(1, 101)), np.uint8), net)      # starts 0, 25, 50, 75
    gru = net.layers[0]
    assert gru.h0.shape == (2, 3) and [a.shape for a in gru.carried] == [(4, 3)]
    assert ds.plan(40, 0).indices(1).reshape(2, 5, 2)[1, 0].tolist() == [55, 80]   # pass 1: streams 2, 3
    gru.carried[0][...] = np.arange(4)[:, None]
    ds.prepare_network(net, 5)                        # stream 3 (75 + 25) passes the end
    ds.begin_pass(net, 1)
    assert gru.h0[:, 0].tolist() == [2, 0]
    gru.h0[...] = 7.0
    ds.end_pass(net, 1)
    ds.begin_pass(net, 0)
    assert gru.h0[:, 0].tolist() == [0, 1]
    assert gru.carried[0][:, 0].tolist() == [0, 1, 7, 7]


def test_text_data_one_hot_rows_are_next_bytes():
    net = network_from_text("[net]\nbatch=2\ntime_steps=3\ninputs=256\n[connected]\noutput=256\n"
                            "activation=linear\n[softmax]\n")
    text = np.frombuffer(b"abcdefghij", np.uint8)
    ds = TextData(text, net)
    x, y = ds.load(ds.plan(6, 0).indices(0), None, 0, 0)
    assert x.shape == y.shape == (6, 256)
    got = [chr(i) for i in x.argmax(1)]
    assert got == ["a", "f", "b", "g", "c", "h"]          # time-major: step 0 of both streams first
    assert [chr(i) for i in y.argmax(1)] == ["b", "g", "c", "h", "d", "i"]


def test_lines_mode_pads_and_ignores_pad_and_prompt():
    net = network_from_text("[net]\nbatch=2\ntime_steps=6\ninputs=1\n[embedding]\nsize=4\n"
                            "[connected]\noutput=256\nactivation=linear\n[crossentropy]\nignore_index=-1\n")
    text = np.frombuffer(b"31=13\n2=2\n", np.uint8)
    ds = TextData(text, net, "lines", pad=32, answer_after=ord("="))
    x, y = ds.sequences([0, 1])
    assert bytes(x[0].astype(np.uint8)) == b"31=13 " and bytes(x[1].astype(np.uint8)) == b"2=2   "
    assert y[0].tolist() == [-1, -1, ord("1"), ord("3"), 10, -1]
    assert y[1].tolist() == [-1, ord("2"), 10, -1, -1, -1]
    xs, ys = ds.load(np.array([0, 1]), None, 0, 0)
    assert xs.shape == (12, 1) and ys.shape == (12, 1)
    assert xs[:, 0].reshape(6, 2)[:, 1].tolist() == list(b"2=2   ")        # time-major rows


def test_lines_mode_packs_several_lines_per_sequence_each_with_its_ignore_rule():
    net = network_from_text("[net]\nbatch=2\ntime_steps=12\ninputs=1\n[embedding]\nsize=4\n"
                            "[connected]\noutput=256\nactivation=linear\n[crossentropy]\nignore_index=-1\n")
    text = np.frombuffer(b"31=13\n2=2\n54=45\n7=7\n", np.uint8)
    ds = TextData(text, net, "lines", pad=32, answer_after=ord("="), pack=2)
    x, y = ds.sequences([0, 1, 2, 3], 2)
    assert bytes(x[0].astype(np.uint8)) == b"31=13\n2=2   "
    # line 1's answer and newline are targets; line 2's prompt ("2", "=") is not, nor the pads
    assert y[0].tolist() == [-1, -1, ord("1"), ord("3"), 10, -1, -1, ord("2"), 10, -1, -1, -1]
    assert bytes(x[1].astype(np.uint8)) == b"54=45\n7=7   "
    assert ds.plan(24, 0).indices(0).size == 4           # 2 sequences x 2 lines per pass
    xs, ys = ds.load(ds.plan(24, 0).indices(0), None, 0, 0)
    assert xs.shape == ys.shape == (24, 1)
    one = TextData(text, net, "lines", pad=32, answer_after=ord("="))
    a, b = one.sequences([0, 1])                          # pack=1 is the one-line rule
    assert np.array_equal(b[0][:6], y[0][:6]) and a.shape == (2, 12)
    with pytest.raises(DataError, match="pack=4"):
        TextData(text, net, "lines", pad=32, pack=4)      # 4 x 6 bytes > time_steps + 1


def test_text_data_errors(tmp_path):
    net = network_from_text("[net]\nbatch=1\ninputs=3\n[connected]\noutput=3\n[softmax]\n")
    with pytest.raises(DataError, match="inputs=256"):
        TextData(np.zeros(10, np.uint8), net)


# -- training, resume, generation -------------------------------------------------------------------

RNN_CFG = """[net]
subdivisions=1
inputs=256
batch=4
time_steps=4
learning_rate=0.01
adamw=1
clip_norm=1
max_batches=6

[gru]
output=8

[connected]
output=256
activation=linear

[softmax]
"""


def _text_project(tmp_path: Path, cfg: str, name: str) -> Path:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "data").mkdir()
    body = b"the quick brown fox jumps over the lazy dog. " * 4
    (tmp_path / "data" / "t.txt").write_bytes(body)
    (tmp_path / "data" / "v.txt").write_bytes(body[:120])
    (tmp_path / "data" / f"{name}.data").write_text("text=t.txt\nvalid=v.txt\n")
    p = tmp_path / "cfg" / f"{name}.cfg"
    p.write_text(cfg)
    return p


@pytest.mark.slow
def test_char_rnn_trains_carries_state_and_resumes_exactly(tmp_path):
    from darkpy.train import train

    cfg = _text_project(tmp_path, RNN_CFG, "rnn")
    full = train(cfg, backup=tmp_path / "a", seed=3, evaluate=False)
    assert full.iteration == 6
    with np.load(tmp_path / "a" / "rnn_final.state") as z:
        carried = z["0:carry:0"]
    assert carried.shape == (4, 8) and np.abs(carried).sum() > 0      # the GRU state of each stream
    part = train(cfg, backup=tmp_path / "b", seed=3, evaluate=False, stop_after=3)
    assert part.interrupted
    rest = train(cfg, weights=part.weights, backup=tmp_path / "b", evaluate=False)
    a = (tmp_path / "a" / "rnn_final.weights").read_bytes()
    b = (tmp_path / "b" / "rnn_final.weights").read_bytes()
    assert a == b, "resumed run differs from the uninterrupted one"
    assert [r.loss for r in full.records[3:]] == [r.loss for r in rest.records]
    bpc, n = text_bpc(cfg, tmp_path / "a" / "rnn_final.weights", str(tmp_path / "data" / "v.txt"), streams=2)
    assert 0 < bpc < 9 and n > 0


@pytest.mark.slow
def test_char_rnn_with_subdivisions_carries_each_streams_state_and_resumes_exactly(tmp_path):
    """subdivisions=2 (2 of the 4 streams per pass): the .state file keeps all 4 streams' GRU state,
    an interrupted and resumed run equals the uninterrupted one bit for bit, and the run follows the
    subdivisions=1 run of the same 4 streams (the same gradient sum, in another float order). Had a
    pass started from the other pass's streams' state, or from zero, it would not."""
    from darkpy.train import train

    two = RNN_CFG.replace("subdivisions=1", "subdivisions=2")
    cfg = _text_project(tmp_path, two, "rnn")
    full = train(cfg, backup=tmp_path / "a", seed=3, evaluate=False)
    with np.load(tmp_path / "a" / "rnn_final.state") as z:
        carried = z["0:carry:0"]
    assert carried.shape == (4, 8) and (np.abs(carried).sum(1) > 0).all()
    part = train(cfg, backup=tmp_path / "b", seed=3, evaluate=False, stop_after=3)
    rest = train(cfg, weights=part.weights, backup=tmp_path / "b", evaluate=False)
    a = (tmp_path / "a" / "rnn_final.weights").read_bytes()
    assert a == (tmp_path / "b" / "rnn_final.weights").read_bytes(), "resumed run differs"
    assert [r.loss for r in full.records[3:]] == [r.loss for r in rest.records]
    cfg.write_text(RNN_CFG)
    one = train(cfg, backup=tmp_path / "c", seed=3, evaluate=False)
    w1 = np.frombuffer((tmp_path / "c" / "rnn_final.weights").read_bytes()[20:], "<f4")
    w2 = np.frombuffer(a[20:], "<f4")
    assert_close(w2, w1, 1e-4, 1e-5, "subdivisions=2 vs 1")
    assert_close([r.loss for r in full.records], [r.loss for r in one.records], 1e-4, 0, "losses")
    with np.load(tmp_path / "c" / "rnn_final.state") as z:
        assert_close(carried, z["0:carry:0"], 1e-4, 1e-5, "carried state")


@pytest.mark.slow
def test_generate_is_reproducible_and_tracks_temperature(tmp_path):
    cfg = _text_project(tmp_path, RNN_CFG, "rnn")
    w = tmp_path / "w.weights"
    network_from_text(RNN_CFG, seed=1).save_weights(w)
    net = open_generator(cfg, w)
    a = generate(net, b"the ", 30, 0.7, srand=5)
    b = generate(open_generator(cfg, w), b"the ", 30, 0.7, srand=5)
    c = generate(open_generator(cfg, w), b"the ", 30, 0.7, srand=6)
    assert len(a) == 30 and a == b and a != c
    net = load_text_network(cfg, w, steps=1)
    assert net.config.time_steps == 1 and net.batch == 1


GPT_CFG = """[net]
batch=2
time_steps=8
inputs=1
learning_rate=0.01
adamw=1
warmup=2
policy=cosine
max_batches=4

[embedding]
vocab=256
size=8

[layernorm]

[attention]
heads=2

[shortcut]
from=-3
activation=linear

[connected]
output=256
activation=linear

[crossentropy]
"""


@pytest.mark.slow
def test_transformer_trains_on_text_and_generates(tmp_path):
    from darkpy.train import train

    cfg = _text_project(tmp_path, GPT_CFG, "gpt")
    r = train(cfg, backup=tmp_path / "a", seed=1, evaluate=False)
    assert r.iteration == 4 and all(math.isfinite(x.loss) for x in r.records)
    w = tmp_path / "a" / "gpt_final.weights"
    out = generate(open_generator(cfg, w), b"the", 12, 1.0, srand=2)
    assert out == generate(open_generator(cfg, w), b"the", 12, 1.0, srand=2) and len(out) == 12


@pytest.mark.slow
def test_cli_generate_and_textscore(tmp_path):
    from click.testing import CliRunner

    from darkpy.cli import main

    cfg = _text_project(tmp_path, RNN_CFG, "rnn")
    w = tmp_path / "w.weights"
    network_from_text(RNN_CFG, seed=1).save_weights(w)
    runner = CliRunner()
    args = ["generate", str(cfg), str(w), "--seed-text", "the ", "--len", "20", "--srand", "4"]
    a = runner.invoke(main, args)
    b = runner.invoke(main, args)
    assert a.exit_code == 0, a.output
    assert a.stdout_bytes == b.stdout_bytes and a.stdout_bytes.startswith(b"the ")
    assert len(a.stdout_bytes) == 4 + 20 + 1
    r = runner.invoke(main, ["textscore", str(cfg), str(w), "--data", str(tmp_path / "data" / "rnn.data"),
                             "--streams", "2"])
    assert r.exit_code == 0 and "bits per character:" in r.output
    bad = runner.invoke(main, ["generate", str(cfg), str(tmp_path / "missing.weights")])
    assert bad.exit_code != 0 and "Traceback" not in bad.output


@pytest.mark.parametrize("pack", [1, 2])
def test_epoch_column_counts_lines_in_lines_mode(pack):
    """The log's epoch is rows seen / (samples x rows per sample): in lines mode one pass over the
    plan's lines is exactly one epoch, whatever `pack` is."""
    net = network_from_text("[net]\nbatch=2\ntime_steps=12\ninputs=1\n[embedding]\nsize=4\n"
                            "[connected]\noutput=256\nactivation=linear\n[crossentropy]\nignore_index=-1\n")
    text = np.frombuffer(b"31=13\n2=2\n54=45\n7=7\n" * 2, np.uint8)
    ds = TextData(text, net, "lines", pad=32, answer_after=ord("="), pack=pack)
    rows = 24                                               # one pass: 24 rows
    lines_per_pass = ds.plan(rows, 0).indices(0).size
    passes = len(ds) // lines_per_pass                      # passes that read every line once
    assert passes * rows / (len(ds) * ds.rows_per_sample) == pytest.approx(1.0)
    stream = TextData(text, net, "stream")
    assert stream.rows_per_sample == 1.0                    # a byte is a row


@pytest.mark.parametrize("stride", [8, 4, 2])
def test_transformer_bpc_scores_every_byte_once_after_the_stated_context(tmp_path, stride):
    """Sliding-window scoring equals a slow reference: byte i of a segment is scored by a window
    ending at the end of i's stride block (so with >= T - stride bytes before it), or by the first
    window; every byte once."""
    cfg = _text_project(tmp_path, GPT_CFG, "gpt")
    w = tmp_path / "w.weights"
    network_from_text(GPT_CFG, seed=1).save_weights(w)
    valid = tmp_path / "data" / "v.txt"
    bpc, n = text_bpc(cfg, w, str(valid), streams=2, stride=stride)
    net = load_text_network(cfg, w, streams=1)
    text = np.fromfile(valid, np.uint8).astype(np.int64)
    T = 8
    seg = (text.size - 1) // 2 // T * T
    total = 0.0
    for start in (0, seg):
        for i in range(seg):
            end = max(T, (i // stride + 1) * stride)        # the window that scores byte i ends here
            window = text[start + end - T:start + end]
            p = net.forward(window.reshape(T, 1).astype(np.float32)).reshape(T, -1).astype(np.float64)
            total -= math.log(p[i - (end - T), text[start + i + 1]])
    assert n == 2 * seg
    assert bpc == pytest.approx(total / n / math.log(2), rel=1e-5)
    if stride < T:
        assert bpc != pytest.approx(text_bpc(cfg, w, str(valid), streams=2, stride=T)[0], rel=1e-6)
    with pytest.raises(DarkpyError, match="must divide"):
        text_bpc(cfg, w, str(valid), streams=2, stride=3)


def test_float32_adamw_is_float32_arithmetic_close_to_float64():
    """A float32 layer's AdamW step runs in float32 (as torch's): three steps on 70k values (in
    parallel spans) stay within a few float32 roundings of the same steps in float64, and clear g."""
    from darkpy.optim import adamw_step
    rng = np.random.default_rng(3)
    n = 70_000
    f32 = np.float32                       # starting values that both precisions hold exactly
    w0, m0 = rng.normal(size=n).astype(f32), (rng.normal(size=n) * 0.1).astype(f32)
    v0 = (rng.random(n) * 0.01).astype(f32)
    grads = [(rng.normal(size=n) * 16).astype(f32) for _ in range(3)]
    runs = {}
    for dtype in (np.float32, np.float64):
        w, m, v = w0.astype(dtype), m0.astype(dtype), v0.astype(dtype)
        for t, g in enumerate(grads, start=1):
            g = g.astype(dtype)
            adamw_step(w, g, m, v, 1e-3, 16, 0.9, 0.99, 1e-8, t, 0.01)
            assert not g.any()
        runs[dtype] = w, m, v
    for a, b in zip(runs[np.float32], runs[np.float64]):
        assert a.dtype == np.float32
        ratio = np.abs(a - b) / (np.finfo(np.float32).eps * (np.abs(b) + np.abs(b).mean()))
        assert ratio.max() < 8, ratio.max()                # a few roundings a step, 3 steps
