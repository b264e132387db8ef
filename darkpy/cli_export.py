"""`darkpy export`: a network to ONNX; `cli.py` adds it with `register(main)`. Also the shared
`--engine` option of predict/valid/detect/map (export/engine.py's `with_engine` applies it).

The command parses arguments and calls `darkpy.export.export_onnx`; errors are `DarkpyError`s, which
the group turns into one line and exit status 1.
"""
from __future__ import annotations

import os

import click

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

ENGINES = ("darkpy", "onnxruntime")


def register(group: click.Group) -> None:
    group.add_command(export_command)


def engine_option(fn):
    """`--engine darkpy|onnxruntime` for the inference commands."""
    return click.option("--engine", type=click.Choice(ENGINES), default="darkpy", show_default=True,
                        help="Inference engine: darkpy's own kernels, or the network exported to ONNX "
                             "(cached beside the weights) run by ONNX Runtime.")(fn)


@click.command("export", context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.argument("weights", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--width", type=click.IntRange(min=1), help="Input width (default: the cfg's).")
@click.option("--height", type=click.IntRange(min=1), help="Input height (default: the cfg's).")
@click.option("--batch", type=click.IntRange(min=1),
              help="Fixed batch size (default 1; time_steps rows for a recurrent network).")
@click.option("--dynamic-batch", is_flag=True, help="A symbolic batch dimension instead of --batch.")
@click.option("--opset", type=int, help="ONNX opset (default: the lowest darkpy's graphs need, 13).")
@click.option("--heads", type=click.Choice(("raw", "boxes")), default="raw", show_default=True,
              help="raw: each head's output as darkpy leaves it; boxes: decoded boxes and scores.")
@click.option("--nms", is_flag=True, help="Append NonMaxSuppression (implies --heads boxes).")
@click.option("--fp16", is_flag=True, help="Compute in float16 (inputs and outputs stay float32).")
@click.option("--no-fold", is_flag=True, help="Keep BatchNormalization nodes instead of folding them.")
@click.option("--data", "data", type=click.Path(dir_okay=False),
              help="The .data file, or a .names file, for the class names in the metadata.")
@click.option("--no-letterbox", is_flag=True, help="Record that images are stretched, not letterboxed.")
@click.option("--layer-output", "layer_outputs", type=int, multiple=True, metavar="N",
              help="Also output layer N's output as `layerN` (e.g. the logits before a final [softmax]); "
                   "repeatable.")
def export_command(cfg, weights, out, width, height, batch, dynamic_batch, opset, heads, nms, fp16, no_fold,
                   data, no_letterbox, layer_outputs):
    """Export CFG with WEIGHTS to the ONNX file OUT."""
    from .cfg import load_cfg
    from .errors import DarkpyError, DataError
    from .network import Network

    try:
        from .export import export_onnx
    except ImportError as e:
        raise DarkpyError(f"export needs onnx: pip install 'darkpy[onnx]' ({e})")
    doc = load_cfg(cfg)
    for key, value in (("width", width), ("height", height)):
        if value is not None:
            doc.set(f"net.{key}", str(value))
    steps = doc.net.get_int("time_steps", 1) if doc.net.has("time_steps") else 1
    net = Network(doc, batch=max(steps, 1))
    net.load_weights(weights)
    names = None
    if data is not None:
        if not os.path.isfile(data):
            raise DataError(f"{data}: no such .data file")
        if data.endswith(".names"):
            from .datasets import read_names
            names = read_names(data)
        else:
            from .datafile import class_names, load_data_config
            names = class_names(load_data_config(data))
    export_onnx(net, out, batch=batch, dynamic_batch=dynamic_batch, opset=opset, heads=heads, nms=nms,
                fp16=fp16, fold=not no_fold, names=names, letterbox=False if no_letterbox else None,
                layers=layer_outputs)
    click.echo(f"{out}: {net.file} exported ({'nms' if nms else heads} heads, input "
               f"{'x'.join(map(str, net.input_shape))})")
