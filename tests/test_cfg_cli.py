"""`darkpy cfg check|get|set|convert`: every problem at once, values by SECTION.KEY (negative indices
too), in-place edits that keep comments and layout and are validated before they are written, and
the .cfg <-> .yaml round trip."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from darkpy.cfg import load_cfg
from darkpy.cli import main
from darkpy.network import load_network

CFG = """\
[net]
# input
batch=4    # per update
width=8
height=8
channels=1

[convolutional]
filters=8
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
filters=10
size=1
activation=linear

[avgpool]

[softmax]
"""

LOCATED = re.compile(r"^\S+:\d+ \[(net|section #\d+ \w+)\]( \S+)?: .+")


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "x.cfg"
    p.write_text(CFG)
    return p


def test_check_clean(cfg):
    r = invoke("cfg", "check", cfg)
    assert r.exit_code == 0 and r.stdout.strip() == f"{cfg}: ok"


def test_check_lists_every_problem_at_once(tmp_path):
    p = tmp_path / "bad.cfg"
    p.write_text(CFG.replace("stride=1\npad=1", "stride=1\npad=1\nfilterz=3")
                 .replace("filters=10", "filters=ten")
                 .replace("[avgpool]", "[avgpool]\nsize=2\n\n[maxpol]"))
    r = invoke("cfg", "check", p)
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    assert lines == [
        f"{p}:13 [section #0 convolutional] filterz: unused key (value '3'); darknet ignores it too",
        f"{p}:21 [section #2 convolutional] filters: not an integer (got 'ten', expected an integer)",
        f"{p}:26 [section #3 avgpool] size: unused key (value '2'); darknet ignores it too",
        f"{p}:28 [section #4 maxpol]: unknown section [maxpol]; did you mean [maxpool]?",
    ]
    assert all(LOCATED.match(ln) for ln in lines)
    assert "4 problems" in r.stderr


def test_check_missing_file_and_parse_error(tmp_path):
    r = invoke("cfg", "check", tmp_path / "none.cfg")
    assert r.exit_code == 1 and r.stdout.strip() == f"{tmp_path / 'none.cfg'}: no such file"
    p = tmp_path / "p.cfg"
    p.write_text("[net]\nbatch\n")
    r = invoke("cfg", "check", p)
    assert r.exit_code == 1 and r.stdout.startswith(f"{p}:2 [net]: expected key=value")


def test_get_values_and_negative_indices(cfg):
    r = invoke("cfg", "get", cfg, "net.batch", "0.filters", "-3.filters", "-1.groups")
    assert r.exit_code == 1
    assert r.stdout.splitlines() == ["4", "8", "10"]
    assert r.stderr.strip() == f"error: {cfg}:26 [section #4 softmax] groups: not set in this section"
    r = invoke("cfg", "get", cfg, "9.filters")
    assert r.exit_code == 1 and "layer index 9 out of range (the file has 5 layers)" in r.stderr
    r = invoke("cfg", "get", cfg, "batch")
    assert r.exit_code == 1 and "bad key path 'batch' (expected SECTION.KEY" in r.stderr


def test_set_edits_in_place_keeping_comments(cfg):
    r = invoke("cfg", "set", cfg, "net.batch=64", "-3.filters=12", "1.padding=0")
    assert r.exit_code == 0, r.output
    text = cfg.read_text()
    assert text == (CFG.replace("batch=4    # per update", "batch=64    # per update")
                    .replace("filters=10", "filters=12")
                    .replace("[maxpool]\nsize=2\nstride=2\n", "[maxpool]\nsize=2\nstride=2\npadding=0\n"))
    net = load_network(cfg)
    assert net.config.batch == 64 and net.layers[2].out_shape[0] == 12


def test_set_dry_run_shows_a_diff_and_writes_nothing(cfg):
    r = invoke("cfg", "set", cfg, "net.batch=64", "--dry-run")
    assert r.exit_code == 0
    assert "-batch=4    # per update\n+batch=64    # per update\n" in r.stdout
    assert r.stdout.startswith(f"--- {cfg}\n+++ {cfg}\n")
    assert cfg.read_text() == CFG


def test_set_is_validated_before_writing(cfg):
    for bad, msg in (("0.filters=abc", "filters: not an integer (got 'abc'"),
                     ("net.channels=0", "no input size"),
                     ("0.activation=leeky", "activation")):
        r = invoke("cfg", "set", cfg, bad)
        assert r.exit_code == 1, bad
        assert msg in r.stderr, r.stderr
        assert "not changed: the edited network has 1 error" in r.stderr
        assert cfg.read_text() == CFG
    r = invoke("cfg", "set", cfg, "net.batch")
    assert r.exit_code == 1 and "bad assignment 'net.batch' (expected SECTION.KEY=VALUE" in r.stderr


def test_set_unset_and_warnings(cfg):
    r = invoke("cfg", "set", cfg, "--unset", "1.stride", "0.foo=1")
    assert r.exit_code == 0, r.output
    assert "warning: " in r.stderr and "foo: unused key" in r.stderr
    doc = load_cfg(cfg)
    assert doc.get("1.stride") is None and doc.get("0.foo") == "1"


def test_convert_round_trip(cfg, tmp_path):
    y = tmp_path / "x.yaml"
    back = tmp_path / "back.cfg"
    assert invoke("cfg", "convert", cfg, y).exit_code == 0
    assert "- convolutional:" in y.read_text() and "filters: 8" in y.read_text()
    assert invoke("cfg", "convert", y, back).exit_code == 0
    a, b = load_cfg(cfg), load_cfg(back)
    assert [(s.kind, s.as_dict()) for s in a.sections] == [(s.kind, s.as_dict()) for s in b.sections]
    # a .yaml network works wherever a .cfg does: same shapes
    assert [l.out_shape for l in load_network(y).layers] == [l.out_shape for l in load_network(cfg).layers]
    r = invoke("cfg", "convert", cfg, y)
    assert r.exit_code == 1 and "exists; pass --force" in r.stderr
    assert invoke("cfg", "convert", cfg, y, "--force").exit_code == 0
    # editing a yaml file keeps it yaml
    assert invoke("cfg", "set", y, "net.batch=16").exit_code == 0
    assert "batch: 16" in y.read_text() and load_cfg(y).get("net.batch") == "16"
    r = CliRunner().invoke(main, ["cfg", "convert", str(cfg), str(tmp_path / "x.txt")])
    assert r.exit_code == 2 and "expected a .cfg, .yaml or .yml" in r.output


def test_cfg_commands_on_shipped_cfgs(monkeypatch):
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    r = invoke("cfg", "check", "cfg/digits.cfg")
    assert r.exit_code == 0, r.stdout
    r = invoke("cfg", "get", "cfg/digits.cfg", "net.max_batches", "net.flip", "-1.groups")
    assert r.stdout.split() == ["600", "0", "1"]


# -- duplicate keys and --strict (issue 13) ---------------------------------------------------------

def test_check_warnings_alone_exit_0_and_strict_makes_them_errors(tmp_path):
    p = tmp_path / "dup.cfg"
    p.write_text(CFG.replace("batch=4    # per update", "batch=4    # per update\nbatch=64"))
    r = invoke("cfg", "check", p)
    line = (f"{p}:4 [net] batch: duplicate key: line 3 sets '4', line 4 sets '64'; the first is used "
            f"(batch=4), as in darknet")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [line, f"{p}: ok (1 warning)"]
    assert "1 problem in" in r.stderr and "(0 errors, 1 warning)" in r.stderr
    r = invoke("cfg", "check", "--strict", p)
    assert r.exit_code == 1 and r.stdout.splitlines() == [line] and "(1 error, 0 warnings)" in r.stderr
    assert load_network(load_cfg(p)).config.batch == 4


def test_set_on_a_file_with_a_duplicate_warns_once_and_edits_the_first(tmp_path):
    p = tmp_path / "dup.cfg"
    p.write_text(CFG.replace("batch=4    # per update", "batch=4    # per update\nbatch=64"))
    r = invoke("cfg", "set", p, "net.width=16")
    assert r.exit_code == 0, r.output
    assert r.stderr.count("duplicate key") == 1
    r = invoke("cfg", "set", p, "net.batch=2")
    assert p.read_text().splitlines()[2:4] == ["batch=2    # per update", "batch=64"]


def test_strict_in_darkpy_toml(tmp_path):
    from darkpy.settings import SettingsError, load_settings
    p = tmp_path / "darkpy.toml"
    p.write_text("[run]\nstrict = true\n")
    assert load_settings(p).strict is True
    assert load_settings(p).override(strict=None).strict is True       # no flag: the file's value
    p.write_text("[run]\nstrict = 1\n")
    with pytest.raises(SettingsError, match="run.strict must be true or false"):
        load_settings(p)


def test_strict_warnings_is_local_to_its_block():
    import warnings

    from darkpy.cfg import CfgWarning, parse_cfg
    from darkpy.errors import StrictError, strict_warnings
    text = "[net]\nbatch=1\nbatch=2\n"
    before = list(warnings.filters)
    with pytest.raises(StrictError, match=r"duplicate key.*\(an error under --strict\)"):
        with strict_warnings():
            parse_cfg(text, "s.cfg")
    assert warnings.filters == before
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with strict_warnings(False):
            parse_cfg(text, "s.cfg")
    assert [w.category for w in caught] == [CfgWarning]


def test_check_on_a_stock_fork_cfg_with_only_warnings_exits_0(tmp_path):
    from conftest import shared_path
    stock = shared_path("cfg", "alexeyab", "yolov7.cfg")
    assert invoke("cfg", "check", stock).exit_code == 0
    # the stock file with a key Darknet ignores (a warning, not an error)
    p = tmp_path / "yolov7.cfg"
    p.write_text(stock.read_text().replace("[net]", "[net]\nnot_a_darknet_key=1", 1))
    r = invoke("cfg", "check", p)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1].startswith(f"{p}: ok (") and "0 errors" in r.stderr
    assert invoke("cfg", "check", "--strict", p).exit_code == 1


def test_digits_joined_by_removed_whitespace_are_warned_about(tmp_path):
    """Darknet (and darkpy) strip every space, so a missing comma silently merges two numbers:
    the warning says so, and explains cspx-p7-mish_hp.cfg's 31 anchor values."""
    from conftest import shared_path
    p = tmp_path / "j.cfg"
    p.write_text(CFG.replace("filters=8", "filters=1  6   # comment 1 2"))
    r = invoke("cfg", "check", p)
    assert r.exit_code == 0 and r.stdout.splitlines()[0] == (
        f"{p}:9 [section #0 convolutional] filters: whitespace between digits ('1  6') is removed, joining "
        f"them into one number, as in darknet; a missing comma?")
    assert load_network(load_cfg(p)).layers[0].out_shape[0] == 16
    r = invoke("cfg", "check", shared_path("cfg", "alexeyab", "cspx-p7-mish_hp.cfg"))
    lines = r.stdout.splitlines()
    assert r.exit_code == 1
    first = next(i for i, ln in enumerate(lines) if "anchors: whitespace between digits ('5    6')" in ln)
    error = next(i for i, ln in enumerate(lines) if "anchors: needs 2*num = 32 values" in ln)
    assert first < error and ":2351 " in lines[first] and ":2351 " in lines[error]
