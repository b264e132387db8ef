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

    def resolve_command(self, ctx: click.Context, args):
        from .cli_darknet import check_darknet_order
        check_darknet_order(args, self.commands.get(args[0]) if args else None)   # `darkpy train obj.data x.cfg`
        return super().resolve_command(ctx, args)

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
@click.option("--upto", type=click.IntRange(min=1), metavar="N",
              help="With --weights: load only layers 0..N-1 (a pretrained backbone; the rest keep their "
                   "random start) and start the count at 0. Implied by a NAME.conv.N weights file.")
@click.option("--seed", type=click.IntRange(min=0), help="RNG seed (default: darkpy.toml, else 0).")
@click.option("--max-batches", type=click.IntRange(min=1), help="Train this many iterations in all.")
@click.option("--backup", type=click.Path(file_okay=False), help="Folder for checkpoints, log and chart.")
@click.option("--threads", type=click.IntRange(min=0), help="numba/BLAS threads (0 = all cores).")
@click.option("--progress", type=click.Choice(["auto", "bar", "lines", "none"]), help="Progress style.")
@click.option("--map", "calc_map", is_flag=True,
              help="Detectors: measure mAP@0.5 on the valid list during training; keep NAME_best.weights.")
@click.option("--map-every", type=click.IntRange(min=1), metavar="N",
              help="With --map: every N iterations (default: max(100, iterations/10)); implies --map.")
@click.option("--strict", is_flag=True, default=None, help="Every cfg or data warning is an error.")
@click.option("--procs", type=click.IntRange(min=1), metavar="N",
              help="Train on N processes of this host (runs this environment's mpiexec; see README).")
@click.pass_context
def train(ctx, cfg, data, weights, clear, upto, seed, max_batches, backup, threads, progress, calc_map, map_every,
          strict, procs):
    """Train the network of CFG on the `train` list of its .data file.

    Checkpoints go to the backup folder with Darknet's names (NAME_last.weights every 100 iterations,
    NAME_N.weights every 1000, NAME_final.weights at the end), with a .state file beside each for an
    exact resume. Ctrl-C saves NAME_last.weights and exits 0. Detectors with random=1 on the last
    layer train at sizes changing every 10 iterations; --map measures mAP during training and at the end.
    `mpiexec -n N darkpy train ...` (or --procs N) trains one model on N processes.
    """
    from .cli_mpi import end_of_job, launch_ranks, rank_context
    from .progress import Progress
    from .train import train as run_training

    if clear and weights is None:
        raise click.UsageError("--clear needs --weights (it restarts the iteration count of loaded weights)")
    if upto is not None and weights is None:
        raise click.UsageError("--upto needs --weights (it loads the first N layers of a weights file)")
    if procs is not None and procs > 1:
        ctx.exit(launch_ranks(ctx, procs))
    from .errors import strict_warnings

    with rank_context(ctx) as comm:        # under MPI: rank 0 prints; an error on any rank ends the job
        settings = _settings(seed=seed, threads=threads, progress=progress, strict=strict)
        reporter = Progress(settings.progress)
        with strict_warnings(settings.strict):
            result = run_training(cfg, data=data, weights=weights, clear=clear, upto=upto, seed=seed,
                                  max_batches=max_batches, backup=backup, settings=settings, progress=reporter,
                                  calc_map=calc_map or map_every is not None, map_every=map_every, comm=comm)
    ctx.call_on_close(lambda: end_of_job(comm))
    if comm.rank != 0:
        return
    if result.interrupted:
        from .cli_darknet import resume_command
        click.echo(f"Interrupted at iteration {result.iteration}: saved {result.weights}; resume with "
                   f"`{resume_command(click.get_current_context(), result.weights)}`")
        return
    ran = result.iteration - result.start_iteration
    count = (f"{result.iteration} iterations" if not result.start_iteration else
             f"{result.iteration} iterations in all, {ran} in this run (resumed at {result.start_iteration})")
    click.echo(f"Done: {count} in {result.seconds:.1f} s; saved {result.weights}; loss chart {result.chart}")
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
    """Top-1 and top-k accuracy of WEIGHTS on the `valid` list, and the confusion matrix; for a
    detector, the COCO results JSON and VOC comp4 files (darkpy/cli_eval.py)."""
    from .cli_eval import cfg_is_detector, valid_detector
    from .evaluate import validate
    from .runtime import configure_threads

    configure_threads(_settings(threads=threads).threads)
    if cfg_is_detector(cfg):
        if engine != "darkpy":
            raise click.UsageError("--engine applies to classifiers in `valid`; for a detector's mAP use "
                                   "`darkpy map --engine onnxruntime`")
        return valid_detector(cfg, weights, data, as_json)
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
    from .evaluate import predict as run_predict
    from .runtime import configure_threads

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
        net = Network(doc, batch=batch * max(steps, 1), shapes_only=True)    # allocates nothing
    click.echo(net.summary())


# -- cfg ----------------------------------------------------------------------------------------------

@main.group(context_settings=CONTEXT)
def cfg():
    """Check, read, edit and convert network files (.cfg or .yaml)."""


@cfg.command("check", context_settings=CONTEXT)
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--strict", is_flag=True, help="Count every warning as an error (exit 1).")
def cfg_check(path, strict):
    """Print every problem in PATH (file:line [section] key: what). Exit 1 if any is an error
    (with --strict: if there is any problem); warnings alone exit 0."""
    from .cfgcheck import check_cfg_problems

    problems = check_cfg_problems(path)
    for message, _is_error in problems:
        click.echo(message)
    errors = sum(1 for _m, is_error in problems if is_error or strict)
    if problems:
        n = len(problems)
        click.echo(f"{n} problem{'s' if n != 1 else ''} in {path} ({errors} error{'s' if errors != 1 else ''}, "
                   f"{n - errors} warning{'s' if n - errors != 1 else ''})", err=True)
    if errors:
        sys.exit(1)
    click.echo(f"{path}: ok" + (f" ({len(problems)} warning{'s' if len(problems) != 1 else ''})" if problems else ""))


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
    from .cfg import CfgWarning, diff_text, load_cfg, parse_cfg
    from .cfgcheck import cfg_problems

    if not assignments and not unset:
        raise click.UsageError("nothing to set: give SECTION.KEY=VALUE arguments or --unset SECTION.KEY")
    with warnings.catch_warnings():     # listed once, below, with the edited file's problems
        warnings.simplefilter("ignore", CfgWarning)
        doc = load_cfg(path)
    if path.endswith((".yaml", ".yml")):
        with open(path, encoding="utf-8") as f:
            before = f.read()
    else:
        before = doc.text()
    doc.apply_edits(assignments, unset)
    with warnings.catch_warnings():     # the reparse's own warnings are listed by cfg_problems
        warnings.simplefilter("ignore", CfgWarning)
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
    """Commands that live in their own modules: `detect` and `map` (darkpy/cli_detect.py), `partial`
    and Darknet's command forms `detector ...`, `classifier ...` (darkpy/cli_darknet.py), `generate`
    and `textscore` (darkpy/cli_generate.py), `recall` (darkpy/cli_eval.py), `anchors`, `labels`,
    `augment-preview` (darkpy/cli_dataset.py), `export` (darkpy/cli_export.py). (`train --procs` and
    the ranks' side of MPI runs: darkpy/cli_mpi.py.)"""
    from . import cli_darknet, cli_dataset, cli_detect, cli_eval, cli_export, cli_generate
    cli_detect.register(main)
    cli_darknet.register(main)
    cli_generate.register(main)
    cli_eval.register(main)
    cli_dataset.register(main)
    cli_export.register(main)


_register_extensions()


def entry() -> None:
    """The `darkpy` command: its own process settings first (before numpy loads; see
    darkpy/process.py), then the command line."""
    from .process import set_command_environment

    set_command_environment()
    main()


if __name__ == "__main__":  # pragma: no cover
    entry()
