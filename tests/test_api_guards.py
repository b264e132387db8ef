"""The Python API refuses what it would silently get wrong: input shape and dtype in forward/predict,
a resize that does not fit (the network left exactly as it was), NaN truth, non-finite gradients at
update(); and hostile files: weights that are FIFOs, devices, sparse giants or NaN; non-ASCII numbers in
a cfg; decompression bombs."""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from darkpy.errors import CfgError, DataError, StateError, TrainingError, WeightsError
from darkpy.network import network_from_text

CLASSIFIER = """[net]
batch=2
width=6
height=5
channels=3

[convolutional]
filters=4
size=3
pad=1
activation=leaky

[connected]
output=3
activation=linear

[softmax]
"""

ROUTE_UPSAMPLE = """[net]
batch=1
width=32
height=32
channels=3

[convolutional]
filters=4
size=3
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
filters=4
size=3
pad=1
activation=leaky

[upsample]
stride=2

[route]
layers=-1,0

[convolutional]
filters=2
size=1
activation=linear
"""


def _state(net) -> list:
    """Everything observable about a network's sizes and buffers."""
    out = [net.input_shape, net.batch, net.input.shape, net.truth.shape]
    for layer in net.layers:
        out += [layer.in_shape, layer.out_shape, layer.output.shape, layer.batch]
    return out


# -- forward / predict input checks -------------------------------------------------------------------

@pytest.mark.parametrize("shape, dtype, match", [
    ((2, 5, 6, 3), np.float32, r"input shape \(2, 5, 6, 3\) does not fit.*expected \(N, C, H, W\) = \(N, 3, 5, 6\)"),
    ((2, 3, 6, 5), np.float32, r"input shape \(2, 3, 6, 5\)"),
    ((), np.float32, r"input shape \(\)"),
    ((2, 3, 5, 6), np.int64, r"dtype int64 is not supported"),
    ((2, 3, 5, 6), np.uint8, r"uint8 input; pass from_uint8=True"),
])
def test_forward_refuses_wrong_shape_and_dtype_and_changes_nothing(shape, dtype, match):
    net = network_from_text(CLASSIFIER)
    x = np.random.default_rng(0).uniform(0, 1, (2, 3, 5, 6)).astype(np.float32)
    ref = net.forward(x).copy()
    before, inp = _state(net), net.input.copy()
    with pytest.raises(StateError, match=match):
        net.forward(np.zeros(shape, dtype))
    assert _state(net) == before and np.array_equal(net.input, inp)
    with pytest.raises(StateError, match=match.replace("forward", "predict")):
        net.predict(np.zeros(shape, dtype))
    assert _state(net) == before, "predict does not change the batch before refusing"
    np.testing.assert_array_equal(net.forward(x), ref)


def test_float64_flat_and_explicit_uint8_inputs_are_accepted():
    net = network_from_text(CLASSIFIER)
    rng = np.random.default_rng(1)
    u8 = rng.integers(0, 256, (2, 3, 5, 6), dtype=np.uint8)
    scaled = (u8.astype(np.float32) / np.float32(255))
    a = net.forward(scaled).copy()
    np.testing.assert_array_equal(net.forward(u8, from_uint8=True), a)
    np.testing.assert_array_equal(net.forward(scaled.astype(np.float64)), a)
    np.testing.assert_array_equal(net.forward(scaled.reshape(2, -1)), a)
    one = net.predict(u8[0], from_uint8=True)[0].copy()                     # one (C, H, W) item
    assert net.batch == 1
    # Exact against the same batch-1 path; against the batch-2 forward only to rounding, since BLAS
    # may take another kernel for a one-row GEMM (OpenBLAS's SkylakeX sgemv differs in the last bit).
    np.testing.assert_array_equal(net.predict(scaled[0])[0], one)
    np.testing.assert_allclose(one, a[0], rtol=1e-6, atol=1e-7)


def test_predict_on_a_flat_vector_of_the_wrong_size_leaves_the_batch():
    net = network_from_text(CLASSIFIER)
    with pytest.raises(StateError, match=r"input shape \(256, 7\)"):
        net.predict(np.zeros((256, 7), np.float32))
    assert net.batch == 2


def test_nan_truth_is_refused_before_anything_runs():
    net = network_from_text(CLASSIFIER)
    x = np.zeros((2, 3, 5, 6), np.float32)
    t = np.zeros((2, 3), np.float32)
    t[1, 2] = np.nan
    seen = net.seen
    with pytest.raises(StateError, match=r"truth has 1 non-finite values.*item 1"):
        net.forward(x, t, train=True)
    assert net.seen == seen


def test_update_refuses_non_finite_gradients_naming_the_layer():
    net = network_from_text(CLASSIFIER)
    x = np.random.default_rng(2).uniform(0, 1, (2, 3, 5, 6)).astype(np.float32)
    net.forward(x, np.eye(3, dtype=np.float32)[:2], train=True)
    net.backward()
    net.layers[1].params[1].grad[0, 0] = np.nan          # connected weights
    before = [p.value.copy() for l in net.layers for p in l.params]
    updates = net.updates
    with pytest.raises(TrainingError, match=r"layer 1 \[connected\] .*non-finite gradient for its weights"):
        net.update()
    after = [p.value for l in net.layers for p in l.params]
    assert all(np.array_equal(a, b) for a, b in zip(before, after)) and net.updates == updates


# -- resize --------------------------------------------------------------------------------------------

def test_resize_that_does_not_fit_leaves_the_network_exactly_as_it_was():
    net = network_from_text(ROUTE_UPSAMPLE)
    x = np.random.default_rng(3).uniform(0, 1, (1, 3, 32, 32)).astype(np.float32)
    ref = net.predict(x)
    before = _state(net)
    with pytest.raises(StateError) as e:
        net.resize(33, 33)
    msg = str(e.value)
    assert "\n" not in msg and "cannot resize to 33x33: layer 4 [route]" in msg and "unchanged (32x32)" in msg, msg
    assert _state(net) == before
    np.testing.assert_array_equal(net.predict(x), ref)
    net.resize(64, 64)                                    # a size that fits still works afterwards
    assert net.predict(np.zeros((1, 3, 64, 64), np.float32)).shape == (1, 2, 64, 64)


# -- weights files -------------------------------------------------------------------------------------

def _small_net():
    return network_from_text(CLASSIFIER)


def test_weights_fifo_and_device_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "w.fifo"
    os.mkfifo(fifo)
    with pytest.raises(WeightsError, match="not a regular file \\(a FIFO\\)"):
        _small_net().load_weights(fifo)
    link = tmp_path / "zero.weights"
    link.symlink_to("/dev/zero")
    with pytest.raises(WeightsError, match="not a regular file \\(a character device\\)"):
        _small_net().load_weights(link)
    with pytest.raises(WeightsError, match="not a regular file \\(a folder\\)|cannot read"):
        _small_net().load_weights(tmp_path)


def test_a_sparse_giant_weights_file_is_refused_by_its_size(tmp_path):
    import resource
    import time

    p = tmp_path / "huge.weights"
    with open(p, "wb") as f:
        f.write(struct.pack("<iiiQ", 0, 2, 0, 0))
        f.truncate(6 << 30)                                # 6 GiB, sparse: nothing on disk
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    with pytest.raises(WeightsError, match=r"too long .*found 6442450944; to load only the first N layers.*"
                                           r"`darkpy train --upto N`"):
        _small_net().load_weights(p)
    assert time.perf_counter() - t < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 200_000     # KiB: nothing read


def test_nan_weights_are_refused_naming_the_layer(tmp_path):
    net = _small_net()
    p = tmp_path / "nan.weights"
    net.layers[1].params[1].value[...] = np.nan
    net.save_weights(p)
    with pytest.raises(WeightsError, match=r"layer 1 \[connected\] has \d+ non-finite values"):
        _small_net().load_weights(p)


def test_not_a_weights_file_gets_no_cfg_hint(tmp_path):
    p = tmp_path / "neg.weights"
    p.write_bytes(struct.pack("<iiiQ", -1, 2, 0, 0) + b"\0" * 64)
    with pytest.raises(WeightsError) as e:
        _small_net().load_weights(p)
    assert "not a darknet weights file" in str(e.value)
    assert "another cfg" not in str(e.value.with_cfg_hint())
    p.write_bytes(struct.pack("<iiiQ", 0, 2, 0, 0) + b"\0" * 8)
    with pytest.raises(WeightsError) as e:
        _small_net().load_weights(p)
    assert "too short" in str(e.value) and "another cfg" in str(e.value.with_cfg_hint())
    assert "--upto" not in str(e.value)


# -- cfg numbers, huge images -------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["３", "1_0", "٣"])
def test_non_ascii_numbers_are_refused(value):
    with pytest.raises(CfgError, match=r"pad: not a number .*ASCII digits only"):
        network_from_text(CLASSIFIER.replace("pad=1", f"pad={value}"))
    with pytest.raises(CfgError, match=r"learning_rate: not a number"):
        network_from_text(CLASSIFIER.replace("[net]\n", f"[net]\nlearning_rate=0.{value}\n"))


def _png_claiming(path: Path, w: int, h: int) -> None:
    """A tiny PNG whose header claims w x h (the pixel data is never reached)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16))
                     + chunk(b"IEND", b""))


def test_decompression_bomb_is_one_line_naming_the_file_and_setting(tmp_path, monkeypatch):
    import darkpy.images as im

    p = tmp_path / "bomb.png"
    _png_claiming(p, 15000, 15000)
    monkeypatch.setattr(im, "_max_pixels", None)
    monkeypatch.chdir(tmp_path)                                # no darkpy.toml: the default limit
    with pytest.raises(DataError) as e:
        im.load_image(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: 15000x15000 image (225,000,000 pixels) is over the limit of 178,956,970")
    assert "max_pixels = 225000000 under [images] in darkpy.toml" in msg
    (tmp_path / "darkpy.toml").write_text("[images]\nmax_pixels = 300000000\n")
    monkeypatch.setattr(im, "_max_pixels", None)
    with pytest.raises(DataError) as e:                        # past the limit: Pillow decodes (and fails
        im.load_image(p)                                       # on the fake data), no bomb error
    assert "over the limit" not in str(e.value)
    (tmp_path / "darkpy.toml").write_text("[images]\nmax_pixels = 0\n")
    from darkpy.settings import SettingsError, load_settings
    with pytest.raises(SettingsError, match="max_pixels must be >= 1"):
        load_settings()


# -- bounded memory ------------------------------------------------------------------------------------

HUGE = """[net]
batch=1
width=100000
height=100000
channels=3

[convolutional]
filters=16
size=3
pad=1
activation=leaky

[connected]
output={output}
activation=linear
"""


def test_summary_and_cfg_check_allocate_nothing_for_a_huge_network(tmp_path):
    import resource

    from click.testing import CliRunner

    from darkpy.cli import main

    p = tmp_path / "huge.cfg"
    p.write_text(HUGE.format(output=10))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = CliRunner().invoke(main, ["summary", str(p)])
    assert r.exit_code == 0, r.output
    assert "Buffers: " in r.output and "TiB at batch 1" in r.output
    r = CliRunner().invoke(main, ["cfg", "check", str(p)])
    assert r.exit_code == 0 and r.output.strip().endswith(": ok"), r.output
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 100_000      # KiB


def test_building_a_network_too_big_for_the_machine_is_refused_in_one_line(tmp_path):
    from darkpy.errors import DarkpyError
    from darkpy.memory import physical_memory

    if physical_memory() is None:
        pytest.skip("the system does not report its memory")
    with pytest.raises(DarkpyError) as e:                  # the outputs: refused before allocating
        network_from_text(HUGE.split("[connected]")[0])
    msg = str(e.value)
    assert "\n" not in msg and "the network needs" in msg and "TiB" in msg and "this machine has" in msg, msg
    with pytest.raises(CfgError, match=r"\[section #1 connected\]: needs .* for its weights; this machine has"):
        network_from_text(HUGE.format(output=10))          # a weight matrix larger than the machine
    net = network_from_text(CLASSIFIER)
    with pytest.raises(DarkpyError, match="the network needs"):
        net.set_batch(10 ** 12)
    assert net.batch == 2 or net.input.shape[0] == 2
