"""YOLO9000's softmax tree: the .tree parser, `[softmax] tree=` (forward against numpy, delta
against central differences of its cost, training) and `[region] tree=` (group-wise class
softmax, Darknet's hierarchical class deltas, training)."""
from __future__ import annotations

import numpy as np
import pytest

from darkpy.errors import CfgError
from darkpy.layers.tree import TreeRegionLayer, TreeSoftmaxLayer, fill_hierarchy, parse_tree
from darkpy.network import network_from_text
from helpers import assert_close
from layer_checks import loss_gradcheck

# 0 animal, 1 plant (roots) | 2 dog, 3 cat (animal) | 4 tree (plant) | 5 terrier, 6 poodle (dog)
TREE = "animal -1\nplant -1\ndog 0\ncat 0\ntree 1\nterrier 2\npoodle 2\n"
GROUPS = [(0, 2), (2, 4), (4, 5), (5, 7)]


@pytest.fixture
def tree_file(tmp_path):
    p = tmp_path / "t.tree"
    p.write_text(TREE)
    return p


def test_parse_tree_groups_parents_and_leaves():
    t = parse_tree(TREE, "t.tree")
    assert t.n == 7 and t.groups == 4
    assert [(int(o), int(o + s)) for o, s in zip(t.group_offset, t.group_size)] == GROUPS
    assert t.parent.tolist() == [-1, -1, 0, 0, 1, 2, 2]
    assert t.group.tolist() == [0, 0, 1, 1, 2, 3, 3]
    assert t.leaf.tolist() == [False, False, False, True, True, True, True]
    assert t.ancestors(6) == [6, 2, 0]


@pytest.mark.parametrize("text,msg", [("a -1\nb 5\n", "t.tree:2: parent 5 must be -1 or an earlier"),
                                      ("a -1\nb x\n", "t.tree:2: parent 'x' is not an integer"),
                                      ("", "t.tree: the tree file is empty")])
def test_parse_tree_errors_name_the_line(text, msg):
    with pytest.raises(ValueError, match=msg):
        parse_tree(text, "t.tree")


def _softmax_net(tree_file, extra="", dtype=np.float64):
    return network_from_text(f"[net]\nbatch=2\ninputs=7\n[softmax]\ntree={tree_file}\n{extra}", dtype=dtype)


def ref_tree_softmax(x, temp=1.0):
    out = np.empty_like(x, dtype=np.float64)
    for lo, hi in GROUPS:
        e = np.exp((x[..., lo:hi] - x[..., lo:hi].max(axis=-1, keepdims=True)) / temp)
        out[..., lo:hi] = e / e.sum(axis=-1, keepdims=True)
    return out


def test_softmax_tree_forward_matches_numpy(tree_file):
    net = _softmax_net(tree_file, "temperature=2\n")
    assert isinstance(net.layers[0], TreeSoftmaxLayer)
    x = np.random.default_rng(0).normal(size=(2, 7))
    assert_close(net.forward(x), ref_tree_softmax(x, 2.0), 1e-12, 1e-15, "tree softmax")


def test_fill_hierarchy_like_darknet():
    t = parse_tree(TREE)
    filled, care = fill_hierarchy(t, np.array([[0, 0, 0, 0, 0, 0, 1.0], [0, 0, 0, 0, 1.0, 0, 0]]))
    assert filled.tolist() == [[1, 0, 1, 0, 0, 0, 1], [0, 1, 0, 0, 1, 0, 0]]
    assert care.tolist() == [[1, 1, 1, 1, 0, 1, 1], [1, 1, 0, 0, 1, 0, 0]]


def test_softmax_tree_delta_is_the_negative_gradient_of_its_cost(tree_file):
    truth = np.array([[0, 0, 0, 0, 0, 0, 1.0], [0, 0, 0, 1.0, 0, 0, 0]])
    net = loss_gradcheck(f"[net]\nbatch=2\ninputs=7\n[connected]\noutput=7\nactivation=linear\n"
                         f"[softmax]\ntree={tree_file}\n", truth)
    layer = net.layers[-1]
    # don't-care groups (plant's children for both; dog's children for the cat) get no delta
    assert np.all(layer.delta[0, 4] == 0) and np.all(layer.delta[1, 4:] == 0)
    p = layer.output
    assert layer.cost == pytest.approx(-np.log(p[0, [0, 2, 6]]).sum() - np.log(p[1, [0, 3]]).sum())


def test_missing_tree_file_and_size_mismatch_are_located_errors(tree_file, tmp_path):
    with pytest.raises(CfgError, match="no such tree file 'nope.tree'") as e:
        network_from_text("[net]\ninputs=7\n[softmax]\ntree=nope.tree\n")
    assert e.value.key == "tree"
    with pytest.raises(CfgError, match="has 7 nodes; the layer has 8 inputs"):
        network_from_text(f"[net]\ninputs=8\n[softmax]\ntree={tree_file}\n")


def test_tree_file_is_found_beside_the_cfg_folder(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "cfg").mkdir()
    (tmp_path / "data" / "t.tree").write_text(TREE)
    (tmp_path / "cfg" / "x.cfg").write_text("[net]\ninputs=7\n[softmax]\ntree=data/t.tree\n")
    monkeypatch.chdir(tmp_path / "cfg")          # not where Darknet would look
    from darkpy import load_network
    assert isinstance(load_network("x.cfg").layers[0], TreeSoftmaxLayer)


def test_softmax_tree_training_lowers_the_loss(tree_file):
    net = network_from_text(f"[net]\nbatch=4\ninputs=3\nlearning_rate=0.5\nmomentum=0.9\ndecay=0\n"
                            f"[connected]\noutput=7\nactivation=linear\n[softmax]\ntree={tree_file}\n", seed=0)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 3)).astype(np.float32)
    truth = np.zeros((4, 7), np.float32)
    truth[[0, 1, 2, 3], [5, 6, 3, 4]] = 1
    losses = []
    for _ in range(30):
        net.forward(x, truth, train=True)
        losses.append(net.cost)
        net.backward()
        net.update()
    assert losses[-1] < 0.3 * losses[0], losses
    pred = net.forward(x)
    assert pred[0, 5] > 0.5 and pred[3, 4] > 0.99


# -- region --------------------------------------------------------------------------------------

def _region_cfg(tree_file, batch=1):
    return (f"[net]\nbatch={batch}\nwidth=3\nheight=3\nchannels={2 * 12}\nlearning_rate=0.05\nmomentum=0.9\n"
            f"decay=0\n[region]\nanchors=1,1,2,2\nnum=2\nclasses=7\ncoords=4\nsoftmax=1\nbias_match=1\n"
            f"tree={tree_file}\nthresh=.6\n")


def test_region_tree_class_planes_and_hierarchical_deltas(tree_file):
    net = network_from_text(_region_cfg(tree_file), dtype=np.float64)
    layer = net.layers[0]
    assert isinstance(layer, TreeRegionLayer)
    rng = np.random.default_rng(0)
    x = rng.normal(size=net.input.shape)
    truth = np.zeros(net.truth.shape)
    truth[0, :5] = [0.5, 0.5, 0.3, 0.3, 6]          # a poodle in the centre cell
    net.forward(x, truth, train=True)
    out = layer.output.reshape(2, 12, 9)
    xin = x.reshape(2, 12, 9)
    assert_close(out[:, 5:], np.moveaxis(ref_tree_softmax(np.moveaxis(xin[:, 5:], 1, -1)), -1, 1),
                 1e-12, 1e-15, "class planes")
    d = layer.delta.reshape(2, 12, 9)[:, 5:]
    trained = [(a, cell) for a in range(2) for cell in range(9) if np.any(d[a, :, cell])]
    assert len(trained) == 1
    a, cell = trained[0]
    assert cell == 4
    p = out[a, 5:, cell]
    want = np.zeros(7)
    for node, (lo, hi) in ((6, (5, 7)), (2, (2, 4)), (0, (0, 2))):
        want[lo:hi] = -p[lo:hi]
        want[node] = 1 - p[node]
    assert_close(d[a, :, cell], want, 1e-12, 1e-15, "delta_region_class with a hierarchy")


def test_region_tree_training_lowers_the_loss(tree_file):
    text = _region_cfg(tree_file, batch=2).replace("channels=24", "channels=3").replace(
        "[region]", "[convolutional]\nfilters=24\nsize=1\nactivation=linear\n[region]")
    net = network_from_text(text, seed=0)
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1, net.input.shape).astype(np.float32)
    truth = np.zeros(net.truth.shape, np.float32)
    truth[0, :5] = [0.5, 0.5, 0.3, 0.3, 6]
    truth[1, :5] = [0.2, 0.8, 0.5, 0.4, 4]
    losses = []
    for _ in range(40):
        net.forward(x, truth, train=True)
        losses.append(net.cost)
        net.backward()
        net.update()
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3]), losses


def test_region_tree_with_a_short_class_map(tree_file, tmp_path):
    """YOLO9000's coco9k.map names fewer ids than the tree has nodes: truth class i trains map[i]."""
    (tmp_path / "short.map").write_text("6\n4\n")
    net = network_from_text(_region_cfg(tree_file) + f"map={tmp_path / 'short.map'}\n", dtype=np.float64)
    assert net.layers[0].class_map.tolist() == [6, 4, 2, 3, 4, 5, 6]
    truth = np.zeros(net.truth.shape)
    truth[0, :5] = [0.5, 0.5, 0.3, 0.3, 1]          # truth class 1 -> node 4 ("tree")
    net.forward(np.random.default_rng(1).normal(size=net.input.shape), truth, train=True)
    d = net.layers[0].delta.reshape(2, 12, 9)[:, 5:]
    a = int(np.flatnonzero(np.any(d[:, :, 4] != 0, axis=1))[0])
    # node 4's group is itself (p = 1, delta 0); its parent "plant" gets 1 - p, "animal" -p
    assert d[a, 4, 4] == 0 and d[a, 1, 4] > 0 and d[a, 0, 4] < 0 and np.all(d[a, [2, 3, 5, 6], 4] == 0)


def test_region_tree_class_delta_is_the_negative_gradient_of_the_path_cross_entropy(tree_file):
    """At the trained slot, the class deltas (passed to the logits unchanged by backward) equal
    −class_scale · ∂/∂logits Σ_{node on the truth's path} −log p_node (group-wise softmax)."""
    net = network_from_text(_region_cfg(tree_file).replace("thresh=.6", "thresh=.6\nclass_scale=1.5"),
                            dtype=np.float64)
    layer = net.layers[0]
    x = np.random.default_rng(4).normal(size=net.input.shape)
    truth = np.zeros(net.truth.shape)
    truth[0, :5] = [0.5, 0.5, 0.3, 0.3, 5]          # terrier: path 5 -> 2 -> 0
    net.forward(x, truth, train=True)
    d = layer.delta.reshape(2, 12, 9)[:, 5:]
    a = int(np.flatnonzero(np.any(d[:, :, 4] != 0, axis=1))[0])
    logits = x.reshape(2, 12, 9)[a, 5:, 4].copy()

    def path_ce():
        p = ref_tree_softmax(logits[None])[0]
        return float(-np.log(p[[5, 2, 0]]).sum())

    from helpers import numerical_grad
    assert_close(d[a, :, 4], -1.5 * numerical_grad(path_ce, logits), 1e-6, 1e-9, "hierarchical class delta")
