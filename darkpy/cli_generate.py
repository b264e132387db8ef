"""The sequence-model commands, `darkpy generate` and `darkpy textscore`; `cli.py` adds them with
`register(main)`. They parse arguments and call `generate.py`."""
from __future__ import annotations

import sys

import click

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def register(group: click.Group) -> None:
    group.add_command(generate_command)
    group.add_command(textscore_command)


def _threads(threads: int | None) -> None:
    from .runtime import configure_threads
    from .settings import load_settings

    configure_threads(load_settings().override(threads=threads).threads)


@click.command("generate", context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.argument("weights", type=click.Path(dir_okay=False))
@click.option("--seed-text", default="\n", show_default=repr("\n"), help="Text the network is primed with.")
@click.option("--len", "length", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Bytes to sample.")
@click.option("--temp", type=click.FloatRange(0, min_open=True), default=0.7, show_default=True,
              help="Softmax temperature (lower: more conservative).")
@click.option("--srand", type=int, default=0, show_default=True, help="Seed of the sampler (same seed, same text).")
@click.option("--threads", type=click.IntRange(min=0), help="numba/BLAS threads (0 = all cores).")
def generate_command(cfg, weights, seed_text, length, temp, srand, threads):
    """Sample text from a char-RNN or a Transformer (Darknet's `rnn generate`): prime with the seed
    text, then sample one byte at a time at temperature TEMP."""
    from .generate import generate, open_generator

    _threads(threads)
    net = open_generator(cfg, weights)
    seed = seed_text.encode("utf-8", "surrogateescape")
    out = generate(net, seed, length, temp, srand)
    sys.stdout.buffer.write(seed + out + b"\n")
    sys.stdout.flush()


@click.command("textscore", context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.argument("weights", type=click.Path(dir_okay=False))
@click.option("--data", "data", type=click.Path(dir_okay=False), help="The .data file (default: by the cfg's name).")
@click.option("--streams", type=click.IntRange(min=1), default=16, show_default=True,
              help="Parallel segments the held-out text is read as.")
@click.option("--stride", type=click.IntRange(min=1),
              help="A Transformer's window step: each byte is scored after at least time_steps - stride "
                   "bytes of context (default time_steps/2; time_steps = non-overlapping windows). "
                   "Recurrent networks carry their state instead.")
@click.option("--threads", type=click.IntRange(min=0), help="numba/BLAS threads (0 = all cores).")
def textscore_command(cfg, weights, data, streams, stride, threads):
    """Score WEIGHTS on the .data file's `valid` text: bits per character, and for a `sequences=lines`
    task the exact-match rate (every answer byte the most likely one)."""
    from .datafile import load_data_config, resolve_data_file
    from .generate import exact_match, text_bpc, valid_text_file

    _threads(threads)
    dc = load_data_config(resolve_data_file(cfg, data))
    if dc.raw.get("sequences") == "lines":
        rate, n = exact_match(cfg, weights, data)
        click.echo(f"exact match: {100 * rate:.2f} % of {n} held-out lines")
        return
    bpc, n = text_bpc(cfg, weights, valid_text_file(cfg, data), streams, stride=stride)
    click.echo(f"bits per character: {bpc:.4f} on {n} held-out bytes")
