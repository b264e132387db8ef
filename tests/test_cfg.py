"""The cfg language (darkpy/cfg.py): exact round trips, tolerant reading, one-line errors, editing, YAML.

Every error is checked against its full text: `file:line [section #i type] key: what (got X, expected Y)`
(or `[net]` for the net section), so a change in wording or location is a visible, reviewed change.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from conftest import shared_path
from darkpy.cfg import (CfgWarning, load_cfg, parse_cfg, parse_yaml, sections_to_yaml,
                        yaml_to_cfg_text)
from darkpy.errors import CfgError
from darkpy.layers import REGISTRY
from darkpy.cfgcheck import check_cfg
from darkpy.network import build_layers, load_network, network_from_text

F = "t.cfg"


def shared_cfg_files():
    root = shared_path("cfg")
    return sorted(p for p in root.glob("*/*.cfg"))


def cfg_ids():
    try:
        return [f"{p.parent.name}/{p.name}" for p in shared_cfg_files()]
    except BaseException:  # ../shared missing: one id that skips inside the test
        return ["missing"]


def _shared(name: str):
    if name == "missing":
        shared_path("cfg")  # skips (or fails in CI)
    return shared_path("cfg", *name.split("/"))


def needs(*kinds: str) -> None:
    missing = [k for k in kinds if k not in REGISTRY]
    if missing:
        pytest.skip(f"layer families not written yet: {', '.join(missing)}")


def build_error(text: str) -> str:
    with pytest.raises(CfgError) as ei:
        build_layers(parse_cfg(text, F))
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


def parse_error(text: str) -> str:
    with pytest.raises(CfgError) as ei:
        parse_cfg(text, F)
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


NET = "[net]\nwidth=8\nheight=8\nchannels=2\n"          # lines 1-4; the first layer header is line 5


# -- round trip and tolerant reading ---------------------------------------------------------------

# Shipped cfgs that repeat a [net] key ("# Testing" and "# Training" blocks both left active): as in
# Darknet the first value is used, with a warning naming both lines.
DUPLICATE_KEY_CFGS = {"pjreddie/yolov3-openimages.cfg": 6, "alexeyab/yolov3-openimages.cfg": 6}


@pytest.mark.parametrize("name", cfg_ids())
def test_shared_cfg_round_trip_is_byte_identical(name):
    import warnings

    path = _shared(name)
    data = path.read_bytes()
    if name in DUPLICATE_KEY_CFGS:
        with pytest.warns(UserWarning, match=rf":{DUPLICATE_KEY_CFGS[name]} \[net\] batch: duplicate key: line 3 "
                          r"sets '1', line 6 sets '64'; the first is used \(batch=1\)"):
            doc = load_cfg(path)
        assert doc.net.get_int("batch") == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        doc = load_cfg(path)
    assert doc.text().encode("utf-8") == data
    # YAML round trip: the same sections, in order, with the same option values
    back = parse_yaml(sections_to_yaml(doc.sections), "x.yaml")
    assert [(s.kind, s.as_dict()) for s in back.sections] == [(s.kind, s.as_dict()) for s in doc.sections]
    again = parse_cfg(yaml_to_cfg_text(sections_to_yaml(doc.sections)), "y.cfg")
    assert [(s.kind, s.as_dict()) for s in again.sections] == [(s.kind, s.as_dict()) for s in doc.sections]


def test_crlf_bom_and_inline_comments_are_accepted_and_kept():
    text = ("\ufeff[net]\r\nwidth = 8 # inline\r\nheight=8;semicolon comment\r\nchannels=2\r\n"
            "\r\n# a comment\r\n[maxpool]\r\nsize=2\r\nstride = 2  # inline\r\n")
    doc = parse_cfg(text.encode("utf-8"), F)
    assert doc.text() == text
    assert doc.net.as_dict() == {"width": "8", "height": "8", "channels": "2"}
    assert doc.layers[0].as_dict() == {"size": "2", "stride": "2"}
    assert doc.layers[0].options["stride"].line == 9
    net = load_network(doc)
    assert net.layers[0].out_shape == (2, 4, 4)


def test_whitespace_inside_values_is_removed_like_darknet():
    doc = parse_cfg("[net]\nsteps = 10, 20 ,\t30\n", F)
    assert doc.net.get_int_list("steps") == [10, 20, 30]


def test_old_mac_line_ends_count_lines():
    doc = parse_cfg("[net]\rwidth=8\rheight=x\r", F)
    with pytest.raises(CfgError) as ei:
        doc.net.get_int("height")
    assert str(ei.value) == "t.cfg:3 [net] height: not an integer (got 'x', expected an integer)"


# -- one-line errors, exact text -----------------------------------------------------------------

def test_error_non_integer_and_non_number():
    assert build_error("[net]\nwidth=abc\nheight=8\nchannels=2\n[maxpool]\n") == \
        "t.cfg:2 [net] width: not an integer (got 'abc', expected an integer)"
    assert build_error(NET + "momentum=fast\n[maxpool]\n") == \
        "t.cfg:5 [net] momentum: not a number (got 'fast', expected a number)"
    assert build_error(NET + "[maxpool]\nsize=2\nstride=two\n") == \
        "t.cfg:7 [section #0 maxpool] stride: not an integer (got 'two', expected an integer)"
    assert build_error(NET + "[maxpool]\nsize=2.5\n") == \
        "t.cfg:6 [section #0 maxpool] size: not an integer (got '2.5', expected an integer)"
    assert build_error(NET + "policy=steps\nsteps=10,x\n[maxpool]\n") == \
        "t.cfg:6 [net] steps: not an integer (got 'x', expected an integer)"
    assert build_error(NET + "policy=steps\nsteps=10,20\nscales=.1,y\n[maxpool]\n") == \
        "t.cfg:7 [net] scales: not a number in list (got 'y' in '.1,y', expected numbers)"


def test_error_unknown_section_suggests_the_nearest_name():
    assert build_error(NET + "[maxpol]\nsize=2\n") == \
        "t.cfg:5 [section #0 maxpol]: unknown section [maxpol]; did you mean [maxpool]?"
    assert build_error(NET + "[avgpool]\n[zzzzzz]\n") == "t.cfg:6 [section #1 zzzzzz]: unknown section [zzzzzz]"


def test_error_unsupported_section_names_it():
    from darkpy.layers import UNSUPPORTED
    if not UNSUPPORTED:
        pytest.skip("every section darknet knows is supported")
    kind = sorted(UNSUPPORTED)[0]
    msg = build_error(NET + f"[{kind}]\n")
    assert msg == f"t.cfg:5 [section #0 {kind}]: section [{kind}] is not supported by darkpy yet ({UNSUPPORTED[kind]})"


def test_duplicate_key_keeps_the_first_value_like_darknet_and_warns_once():
    import warnings

    from darkpy.cfg import CfgWarning
    text = NET + "[maxpool]\nsize=2\nstride=2\nsize=3\n"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        doc = parse_cfg(text, "t.cfg")
    msg = ("t.cfg:8 [section #0 maxpool] size: duplicate key: line 6 sets '2', line 8 sets '3'; "
           "the first is used (size=2), as in darknet")
    assert [str(w.message) for w in caught if w.category is CfgWarning] == [msg]
    assert doc.parse_warnings == [msg]
    assert doc.layers[0].get_int("size") == 2 and doc.text() == text
    # `set` edits the line darknet reads (the first); the second stays, still ignored
    doc.set("0.size", "4")
    assert doc.text().splitlines()[5] == "size=4" and doc.text().splitlines()[7] == "size=3"


def test_duplicate_key_with_the_same_value_is_a_warning():
    import warnings

    from darkpy.cfg import CfgWarning
    text = NET + "[maxpool]\nsize=2\nstride=2\nsize=2\n"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        doc = parse_cfg(text, "t.cfg")
    assert [str(w.message) for w in caught if w.category is CfgWarning] == \
        ["t.cfg:8 [section #0 maxpool] size: duplicate key, same value as line 6; the first is used"]
    assert doc.layers[0].options["size"].line == 6 and doc.text() == text


def test_error_key_without_value_and_line_without_equals():
    assert parse_error(NET + "[maxpool]\nsize=\n") == "t.cfg:6 [section #0 maxpool] size: missing value after '='"
    assert parse_error(NET + "[maxpool]\nsize\n") == "t.cfg:6 [section #0 maxpool]: expected key=value (got 'size')"
    assert parse_error(NET + "[maxpool]\n=2\n") == "t.cfg:6 [section #0 maxpool]: missing key before '=' (got '=2')"


def test_error_structure():
    assert parse_error("") == "t.cfg: the file has no sections (expected [net] first)"
    assert parse_error("# only a comment\n\n") == "t.cfg: the file has no sections (expected [net] first)"
    assert parse_error("width=3\n[net]\n") == \
        "t.cfg:1: option before any section (got 'width=3'); start the file with [net]"
    assert parse_error("[maxpool]\n") == "t.cfg:1: the first section must be [net] or [network] (got [maxpool])"
    assert parse_error("[net]\n[conv\n") == "t.cfg:2: malformed section header (got '[conv', expected [name])"
    assert parse_error("[net]\n[]\n") == "t.cfg:2: malformed section header (got '[]', expected [name])"
    assert parse_error(b"[net]\n\xff\xfe\n") == "t.cfg: not a text file (invalid UTF-8 at byte 6)"
    assert parse_error("[net]\x00\n") == "t.cfg: not a text file (contains NUL bytes)"
    assert build_error("[net]\nwidth=8\nheight=8\nchannels=2\n") == \
        "t.cfg:1 [net]: the network has no layers after [net]"
    assert build_error("[net]\nwidth=8\nchannels=2\n[maxpool]\n") == \
        "t.cfg:1 [net] height: no input size: set width, height and channels (or inputs); missing height"


def test_error_image_layer_after_a_flat_input():
    assert build_error("[net]\ninputs=10\n[maxpool]\nsize=2\n") == \
        "t.cfg:3 [section #0 maxpool]: the layer before [maxpool] must output an image (got a flat vector of 10 values)"


def test_error_conv_after_a_flat_layer():
    needs("connected", "convolutional")
    msg = build_error(NET + "[connected]\noutput=5\n[convolutional]\nfilters=2\nsize=1\n")
    assert msg == ("t.cfg:7 [section #1 convolutional]: the layer before [convolutional] must output an "
                   "image (got a flat vector of 5 values)")


def test_error_layer_reference_out_of_range():
    needs("route")
    assert build_error(NET + "[maxpool]\n[route]\nlayers=-3\n") == \
        "t.cfg:7 [section #1 route] layers: layer reference -3 points to layer -2, outside 0..0"
    assert build_error(NET + "[maxpool]\n[route]\nlayers=1\n") == \
        "t.cfg:7 [section #1 route] layers: layer reference 1 points to layer 1, outside 0..0"


def test_error_route_of_different_sizes_feeding_an_image_layer():
    needs("route")
    text = NET + "[maxpool]\nsize=2\nstride=2\n[avgpool]\n[route]\nlayers=-2,-1\n[maxpool]\nsize=2\nstride=2\n"
    doc = parse_cfg(text, F)
    with pytest.raises(CfgError) as ei:
        build_layers(doc)
    msg = str(ei.value)
    # the route itself is fine (a flat concatenation, as in Darknet); the image layer after it is not
    assert msg == ("t.cfg:11 [section #3 maxpool]: the layer before [maxpool] must output an image "
                   "(got a flat vector of 34 values)")


def test_error_shortcut_mismatch():
    needs("shortcut", "connected")
    assert build_error(NET + "[maxpool]\n[connected]\noutput=5\n[shortcut]\nfrom=-2\n") == (
        "t.cfg:9 [section #2 shortcut] from: shortcut mismatch: layer 0 output 8x8x2 cannot be added to "
        "layer 1 output 5 (flat): an image and a flat vector cannot be added")
    # sizes darknet resamples (every k-th pixel) build, with the previous layer's shape
    _, layers = build_layers(parse_cfg(NET + "[convolutional]\nfilters=4\nsize=1\n[maxpool]\nsize=2\n"
                                            "stride=2\n[shortcut]\nfrom=-2\n", F))
    assert layers[2].out_shape == (4, 4, 4)
    assert build_error(NET + "[maxpool]\n[shortcut]\nfrom=-1\nweights_type=nonsense\n") == (
        "t.cfg:8 [section #1 shortcut] weights_type: unknown value (got 'nonsense', expected one of none, "
        "per_feature, per_layer, per_channel); did you mean 'none'?")


def test_error_yolo_filters_must_match_classes_and_mask():
    needs("yolo", "convolutional")
    text = NET + ("[convolutional]\nfilters=20\nsize=1\nactivation=linear\n"
                  "[yolo]\nmask=0,1\nanchors=1,2,3,4,5,6\nclasses=6\nnum=3\n")
    assert build_error(text) == (
        "t.cfg:9 [section #1 yolo]: the layer before must output len(mask)*(classes+5) = 2*(6+5) = 22 "
        "channels (set filters=22 in the last [convolutional]); it has 20")


def test_error_bad_key_paths_for_editing():
    doc = parse_cfg(NET + "[maxpool]\n", F)
    for path, msg in [("nodot", "t.cfg: bad key path 'nodot' (expected SECTION.KEY, e.g. net.batch or 3.filters)"),
                      ("net.", "t.cfg: bad key path 'net.' (no key after the dot)"),
                      ("7.size", "t.cfg: layer index 7 out of range (the file has 1 layers)"),
                      ("foo.size", "t.cfg: unknown section reference 'foo' (expected 'net' or a layer index)")]:
        with pytest.raises(CfgError) as ei:
            doc.set(path, "1")
        assert str(ei.value) == msg
    with pytest.raises(CfgError) as ei:
        doc.unset("0.size")
    assert str(ei.value) == "t.cfg:5 [section #0 maxpool] size: no such key to remove"
    with pytest.raises(CfgError) as ei:
        doc.set("0.size", "  ")
    assert str(ei.value) == "t.cfg:5 [section #0 maxpool] size: empty value (write a value, or remove the key)"


# -- editing -------------------------------------------------------------------------------------

EDIT = """[net]
# input
width=8   # pixels
height = 8 ; rows
channels=2

[maxpool]
size=2
stride=2 # halve

# the end
[avgpool]
"""


def test_set_and_unset_keep_comments_and_layout():
    doc = parse_cfg(EDIT, F)
    doc.set("net.width", 16)
    doc.set("net.height", "16")
    doc.set("0.stride", "1")
    doc.set("0.padding", "1")      # new key: appended after the section's last option
    doc.set("-1.foo", "3")         # negative index = from the end; a header-only section
    doc.set("net.batch", "4")
    assert doc.text() == """[net]
# input
width=16   # pixels
height = 16 ; rows
channels=2
batch=4

[maxpool]
size=2
stride=1 # halve
padding=1

# the end
[avgpool]
foo=3
"""
    # line numbers follow the edits, so errors still point at the right line
    assert doc.layers[0].options["padding"].line == 11
    assert doc.layers[1].line == 14 and doc.layers[1].options["foo"].line == 15
    again = doc.reparse()
    assert [(s.kind, s.line, s.as_dict()) for s in again.sections] == \
        [(s.kind, s.line, s.as_dict()) for s in doc.sections]
    doc.unset("0.size")
    doc.unset("net.batch")
    doc.unset("1.foo")
    assert doc.text() == EDIT.replace("width=8 ", "width=16 ").replace("height = 8", "height = 16") \
        .replace("size=2\n", "").replace("stride=2", "stride=1").replace("# halve\n", "# halve\npadding=1\n")
    assert doc.reparse().layers[0].as_dict() == {"stride": "1", "padding": "1"}


def test_set_keeps_crlf_and_a_missing_final_newline():
    doc = parse_cfg("[net]\r\nwidth=8\r\nheight=8\r\nchannels=2\r\n[maxpool]\r\nsize=2", F)
    doc.set("0.stride", "2")
    doc.set("net.batch", "3")
    assert doc.text() == "[net]\r\nwidth=8\r\nheight=8\r\nchannels=2\r\nbatch=3\r\n[maxpool]\r\nsize=2\r\nstride=2\r\n"


def test_write_is_atomic_and_byte_exact(tmp_path):
    p = tmp_path / "x.cfg"
    p.write_bytes(EDIT.encode())
    doc = load_cfg(p)
    doc.set("0.size", "3")
    doc.write()
    assert p.read_text() == EDIT.replace("size=2", "size=3")
    assert sorted(q.name for q in tmp_path.iterdir()) == ["x.cfg"]


# -- YAML ----------------------------------------------------------------------------------------

def test_yaml_round_trip_and_values():
    text = NET + "learning_rate=0.0010\nsteps=10,20\npolicy=steps\nscales=.1,.1\n[maxpool]\nsize=2\nstride=2\n"
    doc = parse_cfg(text, F)
    y = sections_to_yaml(doc.sections)
    assert "- net:" in y and "- maxpool:" in y
    back = parse_yaml(y, "n.yaml")
    assert [(s.kind, s.as_dict()) for s in back.sections] == [(s.kind, s.as_dict()) for s in doc.sections]
    # hand-written YAML with native types becomes darknet's text values
    doc2 = parse_yaml("- net: {width: 8, height: 8, channels: 2, steps: [10, 20], adam: true}\n- maxpool:\n"
                      "    size: 2\n- avgpool:\n", "h.yaml")
    assert doc2.net.as_dict() == {"width": "8", "height": "8", "channels": "2", "steps": "10,20", "adam": "1"}
    assert doc2.layers[0].options["size"].line == 3
    assert doc2.layers[1].kind == "avgpool" and doc2.layers[1].as_dict() == {}


def test_yaml_network_loads_like_the_cfg(tmp_path):
    text = NET + "[maxpool]\nsize=2\nstride=2\n[avgpool]\n"
    (tmp_path / "n.cfg").write_text(text)
    parse_cfg(text, str(tmp_path / "n.cfg")).write(tmp_path / "n.yaml")
    a = load_network(tmp_path / "n.cfg")
    b = load_network(tmp_path / "n.yaml")
    assert [(x.kind, x.out_shape) for x in a.layers] == [(y.kind, y.out_shape) for y in b.layers]
    x = np.random.default_rng(0).random((1, 2, 8, 8), dtype=np.float32)
    np.testing.assert_array_equal(a.predict(x), b.predict(x))


def test_yaml_errors_are_located():
    def err(text):
        with pytest.raises(CfgError) as ei:
            parse_yaml(text, "n.yaml")
        assert "\n" not in str(ei.value)
        return str(ei.value)
    assert err("net: {}\n") == "n.yaml:1: a YAML network is a list of sections, e.g. '- net: {batch: 1}'"
    assert err("") == "n.yaml: a YAML network is a list of sections, e.g. '- net: {batch: 1}'"
    assert err("- maxpool: {}\n") == "n.yaml:1: the first section must be net or network (got maxpool)"
    assert err("- net: {}\n- maxpool: 3\n") == \
        "n.yaml:2 [section #0 maxpool]: section options must be a mapping of key: value"
    assert err("- net:\n    a: 1\n    a: 2\n") == "n.yaml:3 [net] a: duplicate key"
    assert err("- net:\n    a: {b: 1}\n") == "n.yaml:2 [net] a: a value must be a number, a string or a list"
    assert err("- net: {a: [[1, 2], [3]]}\n") == "n.yaml:1 [net] a: a value must be a number, a string or a list"
    assert err("- net: {a: &r [*r]}\n") == "n.yaml:1 [net] a: a value must be a number, a string or a list"
    assert err("- net: {a: 2001-01-01}\n") == "n.yaml:1 [net] a: a value must be a number, a string or a list"
    # reader errors (control characters) are one line too; their wording depends on libyaml
    assert err("\x1f").startswith("n.yaml") and "invalid YAML (unacceptable character #x001f" in err("\x1f")
    assert err("- net: {}\n  maxpool: {}\n") == "n.yaml:1: each list item must be one mapping 'type: {key: value}'"
    assert err("- net: [\n").startswith("n.yaml:2: invalid YAML (")


def test_yaml_document_edits_stay_consistent():
    doc = parse_yaml("- net: {width: 8, height: 8, channels: 2}\n- maxpool: {size: 2}\n", "n.yaml")
    doc.set("0.size", "3")
    doc.set("0.stride", "2")
    again = doc.reparse()
    assert [(s.kind, s.as_dict()) for s in again.sections] == [(s.kind, s.as_dict()) for s in doc.sections]
    assert again.layers[0].as_dict() == {"size": "3", "stride": "2"}


# -- checking ------------------------------------------------------------------------------------

def test_check_cfg_reports_unused_keys_with_file_and_line(tmp_path):
    p = tmp_path / "c.cfg"
    p.write_text(NET + "colour=blue\n[maxpool]\nsize=2\nstride=2\nfoo=1\n[avgpool]\nbar = x\n")
    problems = check_cfg(p)
    assert problems == [
        f"{p}:5 [net] colour: unknown [net] key (value 'blue'); darknet ignores it",
        f"{p}:9 [section #0 maxpool] foo: unused key (value '1'); darknet ignores it too",
        f"{p}:11 [section #1 avgpool] bar: unused key (value 'x'); darknet ignores it too",
    ]
    p.write_text(NET + "[maxpool]\nsize=x\n")
    assert check_cfg(p) == [f"{p}:6 [section #0 maxpool] size: not an integer (got 'x', expected an integer)"]
    assert check_cfg(tmp_path / "nope.cfg") == [f"{tmp_path / 'nope.cfg'}: no such file"]
    p.write_text(NET + "[maxpool]\nsize=2\nstride=2\n")
    assert check_cfg(p) == []


def test_unused_keys_warn_when_building():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CfgWarning)
        network_from_text(NET + "[maxpool]\nsize=2\nstride=2\nsizee=3\n", file=F)
    msgs = [str(w.message) for w in caught if issubclass(w.category, CfgWarning)]
    assert msgs == ["t.cfg:8 [section #0 maxpool] sizee: unused key (value '3'); darknet ignores it too"]


def test_load_cfg_file_errors(tmp_path):
    with pytest.raises(CfgError, match=r"^.*nope\.cfg: no such file$"):
        load_cfg(tmp_path / "nope.cfg")
    with pytest.raises(CfgError, match=r": is a directory, not a cfg file$"):
        load_cfg(tmp_path)
    (tmp_path / "bad.yaml").write_bytes(b"- net: \xff\n")
    with pytest.raises(CfgError, match=r"bad\.yaml: not a text file \(invalid UTF-8 at byte 7\)$"):
        load_cfg(tmp_path / "bad.yaml")
