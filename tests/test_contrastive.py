"""`[contrastive]`: Darknet's inference behaviour (a zero output, no weights) and a clear refusal
to train it (darkpy's [yolo] has no embedding / track-id truths)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_path
from darkpy import load_network
from darkpy.errors import CfgError, TrainingError
from darkpy.network import network_from_text

HEAD = ("[net]\nbatch=1\nwidth=4\nheight=4\nchannels=3\n"
        "[convolutional]\nfilters=18\nsize=1\nactivation=linear\n"
        "[yolo]\nmask=0,1,2\nanchors=1,1,2,2,3,3\nnum=3\nclasses=1\n[route]\nlayers=-2\n")


def test_inference_output_is_zero_like_darknet_and_the_heads_still_detect():
    net = network_from_text(HEAD + "[contrastive]\nclasses=1\nyolo_layer=-2\ntemperature=1.0\n")
    layer = net.layers[-1]
    assert layer.out_shape == (18, 4, 4) and layer.weight_arrays() == []
    x = np.random.default_rng(0).uniform(size=net.input.shape).astype(np.float32)
    out = net.forward(x)
    assert np.all(out == 0)
    assert np.any(net.layers[1].output != 0)          # the [yolo] head ran


def test_training_is_refused_clearly():
    net = network_from_text(HEAD + "[contrastive]\nyolo_layer=1\n")
    with pytest.raises(TrainingError, match=r"\[contrastive\]: training the contrastive loss is not supported"):
        net.forward(np.zeros(net.input.shape, np.float32), np.zeros(net.truth.shape, np.float32), train=True)


@pytest.mark.parametrize("extra,msg", [("", "needs yolo_layer="), ("yolo_layer=0\n", "needs yolo_layer="), ("yolo_layer=-1\n", "must point to a \\[yolo\\]")])
def test_yolo_layer_must_name_a_yolo_head(extra, msg):
    with pytest.raises(CfgError, match=msg) as e:
        network_from_text(HEAD + f"[contrastive]\n{extra}")
    assert e.value.key == "yolo_layer"


def test_shared_contrastive_cfg_builds():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = load_network(shared_path("cfg", "alexeyab", "yolov4-tiny_contrastive.cfg"), batch=1)
    assert net.layers[-1].kind == "contrastive"
