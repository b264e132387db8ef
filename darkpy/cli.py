"""The `darkpy` command line: parse arguments, call one library function, print, map errors to exits.

Every error a user can cause is a `DarkpyError`; it is printed as one line (`error: ...`) and the
command exits with status 1, without a traceback unless `--debug` is given. The trainer, the data
loader and the images module are imported inside the commands that use them, and building a network
runs no kernel, so `--help`, `summary` and the `cfg` commands never compile one.
"""
from __future__ import annotations

import json
import os
import sys
import warnings

import click

from . import __version__
from .errors import DarkpyError
from .cli_export import engine_option

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
#: `cfg get/set` take negative layer indices (`-1.filters`): not options.
KEY_ARGS = {**CONTEXT, "ignore_unknown_options": True}


class DarkpyGroup(click.Group):
    """Turns DarkpyError (and OS errors about files) into one line on stderr and exit status 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except DarkpyError as e:
            self._fail(ctx, str(e), e)
        except OSError as e:
            name = f"{e.filename}: " if getattr(e, "filename", None) else ""
            self._fail(ctx, f"{name}{e.strerror or e}", e)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)

    @staticmethod
    def _fail(ctx: click.Context, message: str, exc: BaseException):
        if ctx.obj and ctx.obj.get("debug"):
            raise exc
        click.echo(f"error: {message}", err=True)
        ctx.exit(1)


@click.group(cls=DarkpyGroup, context_settings=CONTEXT)
@click.option("--debug", is_flag=True, help="Show the full traceback of an error.")
@click.version_option(version=__version__, prog_name="darkpy")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """darkpy: Darknet's config-driven neural networks, in Python.

    \b
    darkpy train cfg/digits.cfg
    darkpy predict cfg/digits.cfg backup/digits_final.weights IMAGE
    darkpy summary cfg/yolov3-tiny.cfg
    darkpy cfg check cfg/x.cfg
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    previous = warnings.showwarning
    warnings.showwarning = _show_warning
    ctx.call_on_close(lambda: setattr(warnings, "showwarning", previous))


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Python warnings (cfg and data problems that do not stop a command) as `warning: ...` lines."""
    click.echo(f"warning: {message}", err=True)


def _settings(**flags):
    from .settings import load_settings
    return load_settings().override(**flags)


# -- train / valid / predict ---------------------------------------------------------------------------

@main.command(context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.option("--data", "data", type=click.Path(dir_okay=False),
              help="The .data file (default: cfg/NAME.cfg -> data/NAME.data).")
@click.option("--weights", type=click.Path(dir_okay=False), help="Start from (resume) these weights.")
@click.option("--clear", is_flag=True, help="With --weights: restart the iteration count at 0.")
@click.option("--seed", type=click.IntRange(min=0), help="RNG seed (default: darkpy.toml, else 0).")
@click.option("--max-batches", type=click.IntRange(min=1), help="Train this many iterations in all.")
@click.option("--backup", type=click.Path(file_okay=False), help="Folder for checkpoints, log and chart.")
@click.option("--threads", type=click.IntRange(min=0), help="numba/BLAS threads (0 = all cores).")
@click.option("--progress", type=click.Choice(["auto", "bar", "lines", "none"]), help="Progress style.")
@click.option("--map", "calc_map", is_flag=True,
              help="Detectors: measure mAP@0.5 on the valid list during training; keep NAME_best.weights.")
@click.option("--map-every", type=click.IntRange(min=1), metavar="N",
              help="With --map: every N iterations (default: max(100, iterations/10)); implies --map.")
def train(cfg, data, weights, clear, seed, max_batches, backup, threads, progress, calc_map, map_every):
    """Train the network of CFG on the `train` list of its .data file.

    Checkpoints go to the backup folder with Darknet's names (NAME_last.weights every 100 iterations,
    NAME_N.weights every 1000, NAME_final.weights at the end), with a .state file beside each for an
    exact resume. Ctrl-C saves NAME_last.weights and exits 0. Detectors with random=1 on the last
    layer train at sizes changing every 10 iterations; --map measures mAP during training and at the end.
    """
    from .progress import Progress
    from .train import train as run_training

    if clear and weights is None:
        raise click.UsageError("--clear needs --weights (it restarts the iteration count of loaded weights)")
    settings = _settings(seed=seed, threads=threads, progress=progress)
    reporter = Progress(settings.progress)
    result = run_training(cfg, data=data, weights=weights, clear=clear, seed=seed, max_batches=max_batches,
                          backup=backup, settings=settings, progress=reporter,
                          calc_map=calc_map or map_every is not None, map_every=map_every)
    if result.interrupted:
        click.echo(f"Interrupted at iteration {result.iteration}: saved {result.weights}; resume with "
                   f"`darkpy train {cfg} --weights {result.weights}`")
        return
    click.echo(f"Done: {result.iteration} iterations in {result.seconds:.1f} s; saved {result.weights}; "
               f"loss chart {result.chart}")
    if result.accuracy is not None:
        click.echo(result.accuracy.format())
    if result.map is not None:
        click.echo(f"mAP@0.5 of the final weights: {100 * result.map.map:.2f} % (best {100 * result.best_map:.2f} %"
                   + (f", saved {result.best})" if result.best else ")"))


@main.command(context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.argument("weights", type=click.Path(dir_okay=False))
@click.option("--data", "data", type=click.Path(dir_okay=False), help="The .data file (default: by convention).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--threads", type=click.IntRange(min=0), help="numba/BLAS threads (0 = all cores).")
@engine_option
def valid(cfg, weights, data, as_json, threads, engine):
    """Top-1 and top-k accuracy of WEIGHTS on the `valid` list, and the confusion matrix."""
    from .train import configure_threads, validate

    configure_threads(_settings(threads=threads).threads)
    r = validate(cfg, weights, data=data, engine=engine)
    if as_json:
        click.echo(json.dumps({"top1": r.top1, "topk": r.topk, "k": r.k, "images": r.n, "list": r.list_file,
                               "names": r.names, "confusion": r.confusion.tolist()}))
        return
    click.echo(r.format())
    click.echo(r.confusion_text())


@main.command(context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.argument("weights", type=click.Path(dir_okay=False))
@click.argument("images", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--data", "data", type=click.Path(dir_okay=False), help="The .data file (for class names).")
@click.option("--top", "-t", type=click.IntRange(min=1), help="How many classes to show (default: .data top, else 5).")
@click.option("--json", "as_json", is_flag=True, help="Print the predictions as JSON.")
@engine_option
def predict(cfg, weights, images, data, top, as_json, engine):
    """The top classes of each IMAGE, with probabilities."""
    from .train import configure_threads, predict as run_predict

    configure_threads(_settings().threads)
    preds = run_predict(cfg, weights, images, data=data, top=top,
                        notify=lambda message: click.echo(message, err=True), engine=engine)
    if as_json:
        click.echo(json.dumps([p.as_dict() for p in preds], indent=1))
        return
    for p in preds:
        click.echo(f"{p.image}:")
        for _i, name, prob in p.top:
            click.echo(f"{prob * 100:6.2f}%: {name}")


# -- summary ------------------------------------------------------------------------------------------

@main.command(context_settings=CONTEXT)
@click.argument("cfg", type=click.Path(dir_okay=False))
@click.option("--width", type=click.IntRange(min=1), help="Input width (default: the cfg's).")
@click.option("--height", type=click.IntRange(min=1), help="Input height (default: the cfg's).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Sequences per pass for the buffer-memory total (times the cfg's time_steps).")
def summary(cfg, width, height, batch):
    """Darknet's layer table for CFG, with parameters, BFLOPs and buffer memory."""
    from .cfg import CfgWarning, load_cfg
    from .network import Network

    doc = load_cfg(cfg)
    for key, value in (("width", width), ("height", height)):
        if value is not None:
            doc.set(f"net.{key}", str(value))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CfgWarning)
        steps = doc.net.get_int("time_steps", 1) if doc.net.has("time_steps") else 1
        net = Network(doc, batch=batch * max(steps, 1))
    click.echo(net.summary())


# -- cfg ----------------------------------------------------------------------------------------------

@main.group(context_settings=CONTEXT)
def cfg():
    """Check, read, edit and convert network files (.cfg or .yaml)."""


@cfg.command("check", context_settings=CONTEXT)
@click.argument("path", type=click.Path(dir_okay=False))
def cfg_check(path):
    """Print every problem in PATH (file:line [section] key: what), exit 1 if there is any."""
    from .network import check_cfg

    problems = check_cfg(path)
    for p in problems:
        click.echo(p)
    if problems:
        click.echo(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} in {path}", err=True)
        sys.exit(1)
    click.echo(f"{path}: ok")


@cfg.command("get", context_settings=KEY_ARGS)
@click.argument("path", type=click.Path(dir_okay=False))
@click.argument("keys", nargs=-1, required=True)
def cfg_get(path, keys):
    """Print the value of each KEY (SECTION.KEY: net.batch, 3.filters, -1.classes), one per line."""
    from .cfg import load_cfg

    doc = load_cfg(path)
    for key in keys:
        click.echo(doc.require(key))


@cfg.command("set", context_settings=KEY_ARGS)
@click.argument("path", type=click.Path(dir_okay=False))
@click.argument("assignments", nargs=-1)
@click.option("--unset", "unset", multiple=True, metavar="SECTION.KEY", help="Remove a key (repeatable).")
@click.option("--dry-run", is_flag=True, help="Show the diff, write nothing.")
def cfg_set(path, assignments, unset, dry_run):
    """Set SECTION.KEY=VALUE in PATH, in place: comments and layout are kept, and the result is
    checked before it is written.

    \b
    darkpy cfg set cfg/x.cfg net.batch=64 -1.filters=255
    """
    from .cfg import diff_text, load_cfg, parse_cfg
    from .network import cfg_problems

    if not assignments and not unset:
        raise click.UsageError("nothing to set: give SECTION.KEY=VALUE arguments or --unset SECTION.KEY")
    doc = load_cfg(path)
    if path.endswith((".yaml", ".yml")):
        with open(path, encoding="utf-8") as f:
            before = f.read()
    else:
        before = doc.text()
    doc.apply_edits(assignments, unset)
    problems = cfg_problems(parse_cfg(doc.text(), path))
    errors = [m for m, is_error in problems if is_error]
    if errors:
        for m in errors:
            click.echo(m, err=True)
        raise CfgRejected(f"{path}: not changed: the edited network has {len(errors)} "
                          f"error{'s' if len(errors) != 1 else ''} (listed above)")
    for m, is_error in problems:
        if not is_error:
            click.echo(f"warning: {m}", err=True)
    if dry_run:
        click.echo(diff_text(before, doc.serialize(path), path), nl=False)
        return
    doc.write(path)
    n = len(assignments) + len(unset)
    click.echo(f"{path}: set {n} key{'s' if n != 1 else ''}")


class CfgRejected(DarkpyError):
    """`cfg set` refused to write an edit that breaks the network."""


@cfg.command("convert", context_settings=CONTEXT)
@click.argument("src", type=click.Path(dir_okay=False))
@click.argument("dst", type=click.Path(dir_okay=False))
@click.option("--force", "-f", is_flag=True, help="Overwrite DST if it exists.")
def cfg_convert(src, dst, force):
    """Convert a network file between .cfg and .yaml (by the extensions of SRC and DST)."""
    from .cfg import load_cfg

    exts = (".cfg", ".yaml", ".yml")
    for p in (src, dst):
        if not p.endswith(exts):
            raise click.BadParameter(f"{p}: expected a .cfg, .yaml or .yml file name")
    if os.path.exists(dst) and not force:
        raise CfgRejected(f"{dst}: exists; pass --force to overwrite it")
    load_cfg(src).write(dst)
    click.echo(f"wrote {dst}")


def _register_extensions() -> None:
    """Commands that live in their own modules: `detect` and `map` (darkpy/cli_detect.py)."""
    from .cli_detect import register
    register(main)
    from .cli_export import register as register_export
    register_export(main)


_register_extensions()

if __name__ == "__main__":  # pragma: no cover
    main()
