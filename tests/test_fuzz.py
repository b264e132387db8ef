"""Fuzzing the readers (issue #2, item 5): random bytes and random cfg-like text may only ever raise
darkpy's own errors (DarkpyError subclasses), never a Python or numpy exception.

Targets: parse_cfg / load_cfg (.cfg and .yaml paths) / parse_yaml, building and running networks
from random cfg text, and load_weights with random file contents. Sizes in generated networks are
kept small so that a case costs milliseconds; absurd sizes are fuzzed at the parser level only.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from darkpy.cfg import CfgWarning, load_cfg, parse_cfg, parse_yaml, sections_to_yaml
from darkpy.errors import DarkpyError
from darkpy.layers import REGISTRY, UNSUPPORTED
from darkpy.network import Network, build_layers, network_from_text

#: DARKPY_FUZZ_FACTOR=20 for a long bug hunt; the suite's default keeps the file under a minute.
FACTOR = int(os.environ.get("DARKPY_FUZZ_FACTOR", "1"))
FUZZ = settings(max_examples=100 * FACTOR, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ_NET = settings(max_examples=50 * FACTOR, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def only_darkpy_errors(fn, *args, **kwargs):
    """Call fn; a DarkpyError is an answer, anything else propagates (and fails the test)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CfgWarning)
        try:
            return fn(*args, **kwargs)
        except DarkpyError as e:
            msg = str(e)
            assert msg and "\n" not in msg, f"error message must be one non-empty line: {msg!r}"
            return e


# -- cfg-like text ---------------------------------------------------------------------------------

KEYS = {
    "net": ["width", "height", "channels", "inputs", "batch", "subdivisions", "time_steps", "policy",
            "steps", "scales", "learning_rate", "momentum", "decay", "max_batches", "adam", "burn_in"],
    "deconvolutional": ["filters", "size", "stride", "pad", "padding", "activation", "batch_normalize"],
    "convolutional": ["filters", "size", "stride", "pad", "padding", "groups", "activation",
                      "batch_normalize", "dilation", "stride_x", "stride_y", "flipped", "xnor",
                      "binary", "bin_output", "share_index", "antialiasing"],
    "connected": ["output", "activation", "batch_normalize"],
    "maxpool": ["size", "stride", "padding", "stride_x", "stride_y", "maxpool_depth", "out_channels"],
    "local_avgpool": ["size", "stride", "padding"],
    "avgpool": [],
    "route": ["layers", "groups", "group_id"],
    "shortcut": ["from", "activation", "alpha", "beta", "weights_type", "weights_normalization"],
    "upsample": ["stride", "scale"],
    "reorg": ["stride", "reverse", "flatten", "extra"],
    "reorg3d": ["stride", "reverse"],
    "dropout": ["probability"],
    "softmax": ["groups", "temperature", "spatial", "noloss", "tree"],
    "cost": ["type", "scale", "ratio", "noobj", "thresh"],
    "logistic": [],
    "normalization": ["size", "alpha", "beta", "kappa"],
    "l2norm": [],
    "batchnorm": [],
    "activation": ["activation"],
    "crop": ["crop_height", "crop_width", "flip", "noadjust", "shift"],
    "sam": ["from", "activation"],
    "scale_channels": ["from", "scale_wh", "activation"],
    "yolo": ["mask", "anchors", "classes", "num", "max", "jitter", "scale_x_y", "new_coords",
             "iou_loss", "nms_kind", "random", "ignore_thresh", "truth_thresh"],
    "region": ["anchors", "classes", "num", "coords", "softmax", "background", "log", "sqrt", "max",
               "thresh", "bias_match", "absolute"],
    "detection": ["classes", "coords", "num", "side", "softmax", "sqrt", "rescore"],
    "local": ["filters", "size", "stride", "pad", "activation"],
    "rnn": ["output", "hidden", "activation", "batch_normalize", "shortcut", "logistic"],
    "gru": ["output", "batch_normalize", "tanh"],
    "lstm": ["output", "batch_normalize"],
    "embedding": ["vocab", "size", "positions"],
    "layernorm": ["eps"],
    "attention": ["heads", "causal", "pad", "dropout"],
    "crossentropy": ["targets", "ignore_index", "label_smoothing", "temperature"],
    "crnn": ["output_filters", "hidden_filters", "output", "hidden", "size", "pad", "activation",
             "batch_normalize", "shortcut"],
    "conv_lstm": ["output", "size", "activation", "batch_normalize", "peephole"],
    "history": ["history_size"],
    "iseg": ["classes", "ids"],
    "implicit": ["filters", "atoms", "mean", "std"],
    "implicit_add": ["filters"], "implicit_mul": ["filters"],
    "shift_channels": ["from"], "control_channels": ["from"],
    "Gaussian_yolo": ["mask", "anchors", "classes", "num"],
    "contrastive": ["classes", "yolo_layer", "temperature"],
    "empty": [], "silence": [],
}
GENERIC_KEYS = ["learning_rate", "stopbackward", "dontload", "dontsave", "onlyforward", "bogus_key"]
WORDS = ["leaky", "linear", "logistic", "relu", "mish", "swish", "tanh", "relu6", "sse", "smooth",
         "masked", "L1", "steps", "poly", "constant", "none", "per_channel", "giou", "ciou", "mse",
         "nonsense", "nan", "inf", "-inf", "1e3", "0x10", ""]


def small_int():
    return st.integers(-3, 12).map(str)


def value():
    return st.one_of(
        small_int(), small_int(), small_int(),
        st.floats(-2, 4, allow_nan=False, width=32).map(lambda f: f"{f:g}"),
        st.sampled_from(WORDS),
        st.lists(st.integers(-6, 12), min_size=1, max_size=6).map(lambda v: ",".join(map(str, v))),
        st.text("0123456789,.-e x#;=[]", max_size=8),
    )


ACTIVATIONS = ["linear", "leaky", "logistic", "relu", "mish", "swish", "tanh", "relu6", "elu", "selu",
               "ramp", "plse", "stair", "hardtan", "lhtan", "loggy", "relie", "hard_mish", "gelu", "gelu_tanh"]


def _refs():
    return st.lists(st.integers(-4, 3), min_size=1, max_size=3).map(lambda v: ",".join(map(str, v)))


#: Plausible values per key (drawn most of the time for networks, so most cases build and run).
PLAUSIBLE = {
    "filters": st.integers(1, 8), "size": st.integers(1, 5), "stride": st.integers(-2, 3),
    "pad": st.integers(0, 1), "padding": st.integers(0, 3), "groups": st.integers(1, 3),
    "batch_normalize": st.integers(0, 1), "output": st.integers(1, 20), "classes": st.integers(1, 4),
    "num": st.integers(1, 3), "coords": st.just(4), "side": st.integers(1, 3), "dilation": st.integers(1, 2),
    "probability": st.floats(0, 0.9).map(lambda f: f"{f:.2f}"), "temperature": st.sampled_from(["1", "2", ".5"]),
    "crop_height": st.integers(1, 8), "crop_width": st.integers(1, 8), "scale": st.sampled_from(["1", "2", ".5"]),
    "activation": st.sampled_from(ACTIVATIONS), "layers": _refs(), "from": _refs(),
    "mask": st.lists(st.integers(0, 2), min_size=1, max_size=3, unique=True).map(lambda v: ",".join(map(str, v))),
    "anchors": st.lists(st.integers(1, 30), min_size=2, max_size=6).map(lambda v: ",".join(map(str, v))),
    "type": st.sampled_from(["sse", "masked", "smooth", "L1"]), "reverse": st.integers(0, 1),
    "softmax": st.integers(0, 1), "new_coords": st.integers(0, 1), "scale_x_y": st.sampled_from(["1", "1.05", "2"]),
    "group_id": st.integers(0, 1), "alpha": st.sampled_from(["1", ".5"]), "beta": st.sampled_from(["1", ".5"]),
}


def network_value(key: str):
    plausible = PLAUSIBLE.get(key, st.integers(0, 3)).map(str)
    return st.one_of(*([plausible] * 12), value())


@st.composite
def network_text(draw, max_layers: int = 6):
    """A network most of whose sections are sensible: real section names, plausible small values."""
    w, h, c = draw(st.integers(1, 12)), draw(st.integers(1, 12)), draw(st.integers(1, 3))
    lines = ["[net]", f"width={w}", f"height={h}", f"channels={c}"]
    kinds = sorted({cls.kind for cls in REGISTRY.values()})
    for _ in range(draw(st.integers(1, max_layers))):
        kind = draw(st.sampled_from(kinds))
        lines.append(f"[{kind}]")
        for key in draw(st.lists(st.sampled_from(KEYS.get(kind, []) or ["bogus_key"]), max_size=4, unique=True)):
            v = draw(network_value(key))
            if v:
                lines.append(f"{key}={v}")
    return "\n".join(lines) + "\n"


@st.composite
def cfg_text(draw, max_layers: int = 6, for_network: bool = False):
    """Cfg-ish text: mostly well-formed sections with known keys and small values, plus noise."""
    lines = []
    if draw(st.integers(0, 9)) or for_network:
        lines.append(draw(st.sampled_from(["[net]", "[network]", " [ net ] ", "[net]#c"])))
        w, h = draw(st.integers(1, 12)), draw(st.integers(1, 12))
        c = draw(st.integers(1, 4))
        if draw(st.integers(0, 9)):
            lines += [f"width={w}", f"height={h}", f"channels={c}"]
        else:
            lines.append(f"inputs={draw(st.integers(1, 40))}")
        for key in draw(st.lists(st.sampled_from(KEYS["net"][4:]), max_size=3, unique=True)):
            lines.append(f"{key}={draw(value())}")
    kinds = sorted(set(KEYS) | set(REGISTRY)) + ["bogus", "maxpol"] + sorted(UNSUPPORTED)
    for _ in range(draw(st.integers(0 if not for_network else 1, max_layers))):
        kind = draw(st.sampled_from(kinds))
        lines.append(f"[{kind}]")
        canon = REGISTRY[kind].kind if kind in REGISTRY else kind
        keys = KEYS.get(canon, []) + GENERIC_KEYS
        for key in draw(st.lists(st.sampled_from(keys), max_size=5, unique=True)) if keys else []:
            v = draw(value())
            if not v and for_network:
                continue
            sep = draw(st.sampled_from(["=", " = ", "="]))
            comment = draw(st.sampled_from(["", "", " # note", " ;x"]))
            lines.append(f"{key}{sep}{v}{comment}")
        if not for_network and not draw(st.integers(0, 5)):
            lines.append(draw(st.text(max_size=12)))             # noise line
        if not for_network and not draw(st.integers(0, 7)):
            lines.append(draw(st.sampled_from(["", "# comment", "; c", "\t", "key", "=", "k=", "[x"])))
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    bom = "\ufeff" if draw(st.integers(0, 15)) == 0 else ""
    return bom + eol.join(lines) + (eol if draw(st.booleans()) else "")


# -- parsers ---------------------------------------------------------------------------------------

@FUZZ
@given(st.binary(max_size=300))
def test_parse_cfg_random_bytes(data):
    doc = only_darkpy_errors(parse_cfg, data, "f.cfg")
    if not isinstance(doc, DarkpyError):
        assert doc.text().encode("utf-8") == data


@FUZZ
@given(cfg_text())
def test_parse_cfg_text_round_trips_or_errors(text):
    doc = only_darkpy_errors(parse_cfg, text, "f.cfg")
    if isinstance(doc, DarkpyError):
        return
    assert doc.text() == text
    # every doc that parses converts to YAML and back with the same sections and values
    back = only_darkpy_errors(parse_yaml, sections_to_yaml(doc.sections), "f.yaml")
    assert not isinstance(back, DarkpyError), back
    assert [(s.kind, s.as_dict()) for s in back.sections] == [(s.kind, s.as_dict()) for s in doc.sections]


@FUZZ
@given(cfg_text(), st.data())
def test_editing_random_documents(text, data):
    doc = only_darkpy_errors(parse_cfg, text, "f.cfg")
    if isinstance(doc, DarkpyError) or not doc.layers:
        return
    i = data.draw(st.integers(-len(doc.layers), len(doc.layers) - 1))
    key = data.draw(st.sampled_from(["size", "filters", "new_key", "activation"]))
    val = data.draw(st.sampled_from(["3", "leaky", "1,2", "x y"]))
    only_darkpy_errors(doc.set, f"{i}.{key}", val)
    again = doc.reparse()
    assert [(s.kind, s.as_dict()) for s in again.sections] == [(s.kind, s.as_dict()) for s in doc.sections]
    only_darkpy_errors(doc.unset, f"{i}.{key}")
    assert [s.as_dict() for s in doc.reparse().sections] == [s.as_dict() for s in doc.sections]


@FUZZ
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_parse_yaml_random_text(text):
    only_darkpy_errors(parse_yaml, text, "f.yaml")


YAML_SCALARS = st.one_of(st.integers(-5, 50), st.floats(allow_nan=True), st.booleans(), st.none(),
                         st.text(max_size=6), st.lists(st.integers(-3, 9), max_size=4))


@FUZZ
@given(st.lists(st.one_of(
    st.dictionaries(st.sampled_from(["net", "convolutional", "maxpool", "route", "x"]),
                    st.one_of(st.dictionaries(st.text(max_size=6), YAML_SCALARS, max_size=4), YAML_SCALARS),
                    max_size=2),
    YAML_SCALARS), max_size=5))
def test_parse_yaml_random_structures(items):
    import yaml
    only_darkpy_errors(parse_yaml, yaml.safe_dump(items), "f.yaml")


def test_yaml_recursive_alias_is_an_error_not_a_crash():
    for text in ("- &a [*a]\n", "- net: &a {x: *a}\n", "- net: {x: &b [*b]}\n", "- net: {x: &b [1, [*b]]}\n"):
        assert isinstance(only_darkpy_errors(parse_yaml, text, "f.yaml"), DarkpyError)


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([".cfg", ".yaml", ".yml", ""]))
def test_load_cfg_random_files(tmp_path_factory, data, suffix):
    p = tmp_path_factory.mktemp("f") / f"x{suffix}"
    p.write_bytes(data)
    only_darkpy_errors(load_cfg, p)


# -- networks --------------------------------------------------------------------------------------

def _build_and_run(text: str):
    net = only_darkpy_errors(network_from_text, text, batch=1, file="f.cfg")
    if isinstance(net, DarkpyError):
        return None
    x = np.random.default_rng(0).random(net.input.shape, dtype=np.float32)
    out = only_darkpy_errors(net.forward, x)
    if not isinstance(out, DarkpyError):
        assert out.shape[0] == 1
    return net


@FUZZ_NET
@given(st.one_of(network_text(), cfg_text(max_layers=5, for_network=True)))
def test_random_networks_build_and_run_or_raise_cfg_errors(text):
    _build_and_run(text)


@FUZZ_NET
@given(st.lists(st.sampled_from([
    "[convolutional]\nfilters=4\nsize=3\npad=1\nactivation=leaky",
    "[convolutional]\nfilters=3\nsize=1\nbatch_normalize=1\nactivation=mish",
    "[maxpool]\nsize=2\nstride=2", "[maxpool]\nsize=2\nstride=1", "[avgpool]", "[dropout]",
    "[route]\nlayers=-1,-2", "[route]\nlayers=-2", "[shortcut]\nfrom=-2", "[upsample]\nstride=2",
    "[reorg]\nstride=2", "[softmax]", "[connected]\noutput=7", "[batchnorm]", "[sam]\nfrom=-2",
    "[scale_channels]\nfrom=-2", "[activation]\nactivation=swish", "[normalization]", "[cost]",
    "[local_avgpool]\nsize=3\nstride=1", "[reorg3d]\nstride=2", "[upsample]\nstride=-2",
    "[yolo]\nmask=0\nanchors=1,1\nnum=1\nclasses=1", "[region]\nnum=1\nclasses=1\nanchors=1,1",
]), min_size=1, max_size=7), st.integers(1, 9), st.integers(1, 9), st.integers(1, 3))
def test_random_stacks_of_real_sections(sections, w, h, c):
    text = f"[net]\nwidth={w}\nheight={h}\nchannels={c}\n" + "\n".join(sections) + "\n"
    _build_and_run(text)


WEIGHTS_NET = ("[net]\nwidth=5\nheight=4\nchannels=2\n[convolutional]\nfilters=3\nsize=3\npad=1\n"
               "batch_normalize=1\nactivation=leaky\n[connected]\noutput=4\nactivation=linear\n")


@FUZZ
@given(st.one_of(
    st.binary(max_size=400),
    st.tuples(st.integers(-2, 2000), st.integers(-2, 2000), st.binary(max_size=400)).map(
        lambda t: np.array(t[:2] + (0,), "<i4").tobytes() + t[2]),
))
def test_load_weights_random_files(tmp_path_factory, data):
    net = Network(parse_cfg(WEIGHTS_NET, "w.cfg"), batch=1)
    p = tmp_path_factory.mktemp("w") / "x.weights"
    p.write_bytes(data)
    only_darkpy_errors(net.load_weights, p)


def test_generated_networks_are_not_all_rejected():
    """The network strategies must reach forward passes, or the fuzzing above proves little. (About
    one generated network in 170 builds three layers: 300 unseeded examples missed in about one run
    in six, so the search is seeded and long enough to miss in about one in 10^5 with any seed.)"""
    import random

    from hypothesis import find
    def builds_three_layers(text):
        layers = _quiet_build(text)
        return layers is not None and len(layers) >= 3
    assert find(network_text(max_layers=4), builds_three_layers, random=random.Random(0),
                settings=settings(max_examples=2000, deadline=None, database=None, phases=[Phase.generate]))


def _quiet_build(text):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return build_layers(parse_cfg(text, "f.cfg"))[1]
        except DarkpyError:
            return None


@pytest.mark.parametrize("kind", sorted({cls.kind for cls in REGISTRY.values()}))
def test_every_registered_section_is_reachable_by_the_fuzzer(kind):
    assert kind in KEYS, f"[{kind}] is registered but the fuzzer knows none of its keys: add them to KEYS"
