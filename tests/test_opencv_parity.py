"""Whole-network forward parity with Darknet through OpenCV 4.x's importer (issue #2, item 2).

tests/data/opencv_parity.tsv lists every shared cfg with its status: `pass` rows are re-run here
(darkpy writes random weights, darkpy and OpenCV load the file, every layer must agree to 1e-4
relative, see tests/oracle.py); every `skip` row's reason is re-checked, so the table cannot go
stale silently. Regenerate it with `python -m tests.oracle --write` after a change that moves a cfg.
DARKPY_PARITY_MAX_BFLOPS=1 runs only the smaller networks (a quick local check; CI runs them all).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

import oracle  # noqa: E402  (tests/oracle.py)
from conftest import shared_path  # noqa: E402
from darkpy.cfg import parse_cfg  # noqa: E402
from darkpy.kernels.activations import NAMES as DARKPY_ACTIVATIONS  # noqa: E402
from darkpy.network import load_network  # noqa: E402

ROWS = {r["cfg"]: r for r in oracle.read_table()} if oracle.TABLE.exists() else {}
SKIP = [name for name, r in ROWS.items() if r["status"] == "skip"]


#: A quicker partial run: only `pass` rows at most this many BFLOPs (default: every `pass` row).
BUDGET = float(os.environ.get("DARKPY_PARITY_MAX_BFLOPS", "inf"))


def _pass_groups() -> list[list[str]]:
    """`pass` cfgs grouped by network (a fork copy of an upstream cfg is run once, for both)."""
    groups: dict = {}
    for name, r in ROWS.items():
        if r["status"] == "pass" and float(r["bflops"]) <= BUDGET:
            try:
                key = oracle.network_key(name)
            except Exception:      # ../shared missing: the test itself skips
                key = name
            groups.setdefault(key, []).append(name)
    return list(groups.values())


PASS_GROUPS = _pass_groups()


def test_table_lists_every_shared_cfg_with_a_status_and_reason():
    shared_path("cfg")
    assert ROWS, f"{oracle.TABLE} is missing: run python -m tests.oracle --write"
    assert sorted(ROWS) == sorted(oracle.shared_cfgs())
    for name, row in ROWS.items():
        assert row["status"] in ("pass", "skip"), \
            f"{name}: status {row['status']!r} ({row['reason']}); find out why, then regenerate the table"
        if row["status"] == "skip":
            assert row["reason"], f"{name}: a skipped cfg needs a reason"
        else:
            assert float(row["layer_rel_err"]) <= oracle.TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("names", PASS_GROUPS, ids=lambda g: g[0] + (f"+{len(g) - 1}" if len(g) > 1 else ""))
def test_forward_matches_opencv(names, tmp_path):
    shared_path("cfg")
    name = names[0]
    try:
        r = oracle.compare(name, tmp_path)
    finally:   # big nets write hundreds of MB of weights: pytest keeps tmp_path of the last 3 runs
        for f in tmp_path.glob("*.weights"):
            f.unlink()
    where, worst = r.worst_local
    assert worst <= oracle.TOLERANCE, f"{name}: {where} differs from OpenCV by {worst:.2e} (relative)"
    assert r.final_ok, (f"{name}: the network output differs from OpenCV by {r.final:.2e}, more than "
                        f"{oracle.NOISE_FACTOR:g}x the float32 rounding noise ({r.noise:.2e})")
    assert len(r.local) >= 1
    # every layer left out of the comparison is named in the table
    for why in r.limitations.values():
        assert why in ROWS[name]["reason"], f"{name}: not compared but not recorded: {why}"


@pytest.mark.parametrize("name", SKIP)
def test_skip_reason_still_holds(name):
    shared_path("cfg")
    reason = ROWS[name]["reason"]
    if reason.startswith(("darkpy", "flat network input", "OpenCV cannot load it")):
        with pytest.raises(oracle.OracleSkip) as ei:
            oracle.prepare(name)
        assert str(ei.value) == reason
    elif reason.startswith("too large"):
        prep = oracle.prepare(name)
        assert prep.bflops > oracle.MAX_BFLOPS
        assert reason.startswith(f"too large for the test budget: {prep.bflops:.1f} BFLOPs")
    elif reason.startswith("OpenCV fails to run it"):
        found = oracle.opencv_limitations(oracle.prepare(name).net)
        assert found and all(why in reason for why in found.values())
    else:
        pytest.fail(f"{name}: reason of an unknown kind: {reason}")


# -- facts the oracle relies on, checked directly -------------------------------------------------

def _one_conv(tmp_path, activation: str | None, bn: bool = False):
    act = f"activation={activation}\n" if activation else ""
    text = ("[net]\nwidth=6\nheight=5\nchannels=3\n[convolutional]\nfilters=4\nsize=3\npad=1\n"
            f"batch_normalize={int(bn)}\n{act}")
    net = load_network(parse_cfg(text, "one.cfg"), batch=1)
    rng = np.random.default_rng(1)
    x = rng.uniform(-4, 4, (1, 3, 5, 6)).astype(np.float32)
    oracle.randomize(net, x)
    (tmp_path / "one.cfg").write_text(text)
    net.save_weights(tmp_path / "one.weights")
    return net, x


def test_darkpy_conv_and_connected_default_to_logistic_like_darknet():
    text = "[net]\nwidth=4\nheight=4\nchannels=2\n[convolutional]\nfilters=3\nsize=1\n[connected]\noutput=5\n"
    net = load_network(parse_cfg(text, "d.cfg"), batch=1)
    assert [layer.activation for layer in net.layers] == ["logistic", "logistic"]
    assert set(oracle.DARKNET_ACTIVATION_DEFAULT.values()) == {"logistic"}


@pytest.mark.parametrize("activation", DARKPY_ACTIVATIONS)
def test_which_activations_opencv_reads_and_that_they_agree(activation, tmp_path):
    """OpenCV maps exactly oracle.OPENCV_ACTIVATIONS (others: "Unsupported activation"); each of
    those computes what darkpy computes (inputs in [-4, 4] cover both sides of every kink)."""
    net, x = _one_conv(tmp_path, activation)
    if activation not in oracle.OPENCV_ACTIVATIONS:
        with pytest.raises(cv2.error, match="Unsupported activation"):
            with oracle._quiet_stderr():
                cv2.dnn.readNetFromDarknet(str(tmp_path / "one.cfg"), str(tmp_path / "one.weights"))
        return
    cv = oracle.opencv_net(tmp_path / "one.cfg", tmp_path / "one.weights")
    cv.setInput(x)
    ref = cv.forward()
    got = net.forward(x)
    assert oracle.rel_err(got, ref) <= 1e-5


def test_opencv_batchnorm_epsilon_is_1e_6(tmp_path):
    """The fact behind OPENCV_BN_EPS_SHIFT: with the variance raised by 9e-6, OpenCV's BN equals
    darkpy's sqrt(var + 1e-5); without it they differ measurably for small variances."""
    net, x = _one_conv(tmp_path, "linear", bn=True)
    var = oracle.bn_variance(net.layers[0])
    var[...] = 1e-4
    net.save_weights(tmp_path / "one.weights")
    got = net.forward(x).copy()
    cv = oracle.opencv_net(tmp_path / "one.cfg", tmp_path / "one.weights")
    cv.setInput(x)
    assert oracle.rel_err(got, cv.forward()) > 1e-2
    var += oracle.OPENCV_BN_EPS_SHIFT
    net.save_weights(tmp_path / "one.weights")
    cv = oracle.opencv_net(tmp_path / "one.cfg", tmp_path / "one.weights")
    cv.setInput(x)
    assert oracle.rel_err(got, cv.forward()) <= 1e-5


def test_opencv_layer_map():
    names = ["conv_0", "bn_0", "leaky_1", "pool_1", "identity_2", "shortcut_3", "leaky_4",
             "permute_4", "yolo_4", "permute_5", "detection_out"]
    assert oracle.opencv_layer_map(names, 6) == {0: "leaky_1", 1: "pool_1", 2: "identity_2",
                                                 3: "leaky_4", 4: "yolo_4", 5: "detection_out"}
    with pytest.raises(AssertionError):
        oracle.opencv_layer_map(names, 7)


def test_rel_err():
    assert oracle.rel_err([1.0, 2.0], [1.0, 2.0]) == 0
    assert oracle.rel_err([1.0, 2.5], [1.0, 2.0]) == 0.25
    assert oracle.rel_err([0.0], [0.0]) == 0
    assert oracle.rel_err([1.0], [1.0, 2.0]) == float("inf")
    assert oracle.rel_err([np.nan], [1.0]) == float("inf")


def test_darknet_text_keeps_the_first_of_repeated_keys(tmp_path):
    p = tmp_path / "r.cfg"
    p.write_text("[net]\nbatch=1\n# Training\nbatch = 64\n[maxpool]\nbatch=3\n")
    text = oracle.darknet_text(p)
    doc = parse_cfg(text, str(p))
    assert doc.net.as_dict() == {"batch": "1"} and doc.layers[0].as_dict() == {"batch": "3"}
    assert len(text.splitlines()) == 6
