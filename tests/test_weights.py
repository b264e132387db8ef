"""`.weights` files (spec §7): round trips, both header versions, the transpose flag, size errors,
partial loads, dontload/dontsave, and garbage input."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from darkpy import WeightsError, load_network
from darkpy.network import network_from_text
from helpers import golden_dir

CFG = """[net]
batch=2
width=6
height=5
channels=4

[convolutional]
batch_normalize=1
filters=6
size=3
pad=1
activation=leaky

[convolutional]
filters=6
groups=3
size=3
stride=2
pad=1
activation=linear

[connected]
batch_normalize=1
output=5
activation=relu

[connected]
output=3
activation=linear
"""


def randomized(text=CFG, seed=0, **kw):
    """A network whose every stored array (rolling statistics included) holds random values."""
    net = network_from_text(text, seed=seed, **kw)
    rng = np.random.default_rng(seed + 100)
    for layer in net.layers:
        for a in layer.weight_arrays():
            a[...] = rng.uniform(0.5, 1.5, a.shape)
    return net


def arrays(net):
    return [a.copy() for l in net.layers for a in l.weight_arrays()]


def header(major=0, minor=2, revision=0, seen=0, wide=True):
    return struct.pack("<iii", major, minor, revision) + struct.pack("<Q" if wide else "<i", seen)


def body(net, transpose=False):
    parts = []
    for layer in net.layers:
        for a in layer.weight_arrays():
            parts.append((a.T if transpose and a.ndim == 2 else a).astype("<f4").tobytes())
    return b"".join(parts)


def test_round_trip_bit_exact(tmp_path):
    net = randomized()
    net.seen = 12345
    path = tmp_path / "a.weights"
    net.save_weights(path)
    n_floats = sum(a.size for a in arrays(net))
    assert path.stat().st_size == 20 + 4 * n_floats
    other = randomized(seed=7)
    other.load_weights(path)
    for a, b in zip(arrays(net), arrays(other)):
        assert a.tobytes() == b.tobytes()
    assert other.seen == 12345
    other.save_weights(tmp_path / "b.weights")
    assert (tmp_path / "b.weights").read_bytes() == path.read_bytes()


def test_layout_matches_darknet_order(tmp_path):
    """conv: biases, scales, mean, var, weights; connected: biases, weights, scales, mean, var."""
    net = randomized()
    path = tmp_path / "a.weights"
    net.save_weights(path)
    data = np.frombuffer(path.read_bytes(), "<f4", offset=20)
    c0, c1, f2, f3 = net.layers
    expect = [c0.biases.value, c0.bn.scales.value, c0.bn.rolling_mean, c0.bn.rolling_variance,
              c0.weights.value, c1.biases.value, c1.weights.value,
              f2.biases.value, f2.weights.value, f2.bn.scales.value, f2.bn.rolling_mean,
              f2.bn.rolling_variance, f3.biases.value, f3.weights.value]
    assert c1.weights.value.shape == (6, 2, 3, 3)           # groups: c/groups input channels
    assert np.array_equal(data, np.concatenate([a.ravel() for a in expect]).astype("<f4"))


@pytest.mark.parametrize("name", ["conv_bn", "conv_groups", "connected_bn"])
def test_darknet_file_rewrites_byte_identical(tmp_path, name):
    """A file Darknet wrote, loaded and saved again, is the same bytes."""
    d = golden_dir("forward", name)
    if not d.is_dir():
        pytest.skip(f"golden {d} missing")
    net = load_network(d / "net.cfg", d / "net.weights")
    net.save_weights(tmp_path / "x.weights")
    assert (tmp_path / "x.weights").read_bytes() == (d / "net.weights").read_bytes()


def test_old_header_v01_int32_seen(tmp_path):
    src = randomized()
    path = tmp_path / "old.weights"
    path.write_bytes(header(0, 1, 0, 777, wide=False) + body(src))
    net = randomized(seed=3)
    net.load_weights(path)
    assert net.seen == 777
    for a, b in zip(arrays(src), arrays(net)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("major,minor", [(0, 1001), (1001, 0)])
def test_transpose_flag_transposes_connected_only(tmp_path, major, minor):
    src = randomized()
    path = tmp_path / "t.weights"
    # major or minor > 1000 also means the 4-byte `seen`
    path.write_bytes(header(major, minor, 0, 5, wide=False) + body(src, transpose=True))
    net = randomized(seed=9)
    net.load_weights(path)
    for a, b in zip(arrays(src), arrays(net)):
        assert np.array_equal(a, b)
    assert net.seen == 5
    conn = net.layers[3].weights.value
    assert conn.shape == (3, 5) and not np.array_equal(conn.ravel(), src.layers[3].weights.value.T.ravel())


def test_truncated_and_oversized_files_name_byte_counts(tmp_path):
    net = randomized()
    good = tmp_path / "g.weights"
    net.save_weights(good)
    data = good.read_bytes()
    need = len(data)
    for name, blob in (("short", data[:-4]), ("long", data + b"\0" * 8)):
        p = tmp_path / f"{name}.weights"
        p.write_bytes(blob)
        with pytest.raises(WeightsError) as e:
            randomized().load_weights(p)
        msg = str(e.value)
        assert f"expected {need} bytes" in msg and f"found {len(blob)}" in msg, msg
    p = tmp_path / "tiny.weights"
    p.write_bytes(data[:10])
    with pytest.raises(WeightsError, match="10 bytes"):
        randomized().load_weights(p)


def test_upto_partial_load(tmp_path):
    src = randomized()
    part = tmp_path / "part.weights"
    src.save_weights(part, upto=2)                    # a backbone: the two convs only
    full = tmp_path / "full.weights"
    src.save_weights(full)
    for path in (part, full):                         # upto accepts a longer file too
        net = randomized(seed=4)
        before = arrays(net)
        net.load_weights(path, upto=2)
        after = arrays(net)
        n_conv = len(src.layers[0].weight_arrays()) + len(src.layers[1].weight_arrays())
        for a, b in zip(arrays(src)[:n_conv], after[:n_conv]):
            assert np.array_equal(a, b)
        for a, b in zip(before[n_conv:], after[n_conv:]):
            assert np.array_equal(a, b)
    with pytest.raises(WeightsError, match="expected"):
        randomized().load_weights(part)               # without upto the short file is an error


def test_dontsave_and_dontload(tmp_path):
    skip = CFG.replace("output=5\n", "output=5\ndontsave=1\ndontload=1\n")
    src = randomized(skip)
    path = tmp_path / "s.weights"
    src.save_weights(path)
    saved = sum(a.size for i, l in enumerate(src.layers) if i != 2 for a in l.weight_arrays())
    assert path.stat().st_size == 20 + 4 * saved
    net = randomized(skip, seed=5)
    kept = [a.copy() for a in net.layers[2].weight_arrays()]
    net.load_weights(path)
    for a, b in zip(kept, net.layers[2].weight_arrays()):
        assert np.array_equal(a, b)                   # the dontload layer keeps its values
    for i in (0, 1, 3):
        for a, b in zip(src.layers[i].weight_arrays(), net.layers[i].weight_arrays()):
            assert np.array_equal(a, b)
    with pytest.raises(WeightsError):
        randomized().load_weights(path)               # a net that expects layer 2's bytes


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.one_of(
    st.binary(max_size=200),
    st.tuples(st.integers(-3, 3000), st.integers(-3, 3000), st.binary(max_size=600)).map(
        lambda t: struct.pack("<ii", t[0], t[1]) + t[2])))
def test_random_bytes_raise_only_weights_error(tmp_path, blob):
    net = network_from_text("[net]\nwidth=3\nheight=3\nchannels=2\n[convolutional]\nfilters=2\nsize=3\n"
                            "batch_normalize=1\n[connected]\noutput=3\n")
    p = tmp_path / "r.weights"
    p.write_bytes(blob)
    try:
        net.load_weights(p)
    except WeightsError:
        pass
    try:
        net.load_weights(p, upto=1)
    except WeightsError:
        pass
